/*
 * Failure injection, per process.
 *
 * Each device may carry a failure spec in the engine config:
 *   failure.mode          healthy | lost | fallen_off_bus | ecc_uncorrectable
 *   failure.after_calls   the first N guarded calls succeed, then it trips
 *   failure.probability   each guarded call trips it with this probability
 *   failure.seed          seeds that draw, so a run is reproducible
 * Neither trigger: the failure is active at once.  Once tripped it stays
 * tripped for the life of the process ("sticky"), like a GPU that fell off
 * the bus.  A changed spec (e.g. `mokka ctl reset`) starts over, so a
 * runtime override can both break and heal a GPU in running processes.
 *
 * lost / fallen_off_bus: guarded calls return NVML_ERROR_GPU_IS_LOST.
 * ecc_uncorrectable: calls still succeed, but every guarded call after the
 * trip adds one uncorrectable (double-bit) ECC error to the counters.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "mock.h"

struct failure_state {
    char spec[160];                /* the spec this state was built for */
    unsigned long long calls;      /* guarded calls seen under this spec */
    unsigned long long ecc_extra;  /* uncorrectable errors added since the trip */
    unsigned long long rng;        /* xorshift64 state for `probability` */
    int tripped;
};

static pthread_mutex_t g_failure_lock = PTHREAD_MUTEX_INITIALIZER;
static struct failure_state g_failures[MOCK_MAX_DEVICES];

static unsigned long long xorshift64(unsigned long long *state)
{
    unsigned long long x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return x;
}

nvmlReturn_t mock_failure_check(const struct mock_config *cfg, unsigned pos)
{
    const char *mode = mock_dev_get(cfg, pos, "failure.mode");
    if (mode == NULL || strcmp(mode, "healthy") == 0 || pos >= MOCK_MAX_DEVICES)
        return NVML_SUCCESS;
    const char *after = mock_dev_get(cfg, pos, "failure.after_calls");
    const char *probability = mock_dev_get(cfg, pos, "failure.probability");
    const char *seed = mock_dev_get(cfg, pos, "failure.seed");
    char spec[sizeof g_failures[0].spec];
    snprintf(spec, sizeof spec, "%.40s|%.30s|%.30s|%.30s", mode, after ? after : "",
             probability ? probability : "", seed ? seed : "");

    pthread_mutex_lock(&g_failure_lock);
    struct failure_state *st = &g_failures[pos];
    if (strcmp(st->spec, spec) != 0) {
        memset(st, 0, sizeof *st);
        strcpy(st->spec, spec);
        unsigned long long s = 0;
        mock_parse_u64(seed, &s);
        /* xorshift must not start at 0; mix the position in so devices
         * sharing a seed still draw independently. */
        st->rng = (s ^ 0x9E3779B97F4A7C15ULL) + pos * 0x100000001B3ULL;
        if (st->rng == 0)
            st->rng = 1;
    }
    if (!st->tripped) {
        st->calls++;
        unsigned long long n;
        double p;
        int has_after = mock_parse_u64(after, &n);
        int has_probability = mock_dev_double(cfg, pos, "failure.probability", &p);
        if (!has_after && !has_probability)
            st->tripped = 1;
        if (has_after && st->calls > n)
            st->tripped = 1;
        if (has_probability) {
            double draw = (double)(xorshift64(&st->rng) >> 11) / 9007199254740992.0;
            if (draw < p)
                st->tripped = 1;
        }
    }
    nvmlReturn_t result = NVML_SUCCESS;
    if (st->tripped) {
        if (strcmp(mode, "lost") == 0 || strcmp(mode, "fallen_off_bus") == 0)
            result = NVML_ERROR_GPU_IS_LOST;
        else if (strcmp(mode, "ecc_uncorrectable") == 0)
            st->ecc_extra++;
    }
    pthread_mutex_unlock(&g_failure_lock);
    return result;
}

unsigned long long mock_failure_ecc_extra(unsigned pos)
{
    if (pos >= MOCK_MAX_DEVICES)
        return 0;
    pthread_mutex_lock(&g_failure_lock);
    unsigned long long extra = g_failures[pos].ecc_extra;
    pthread_mutex_unlock(&g_failure_lock);
    return extra;
}

void mock_failure_cleanup(void)
{
    pthread_mutex_lock(&g_failure_lock);
    memset(g_failures, 0, sizeof g_failures);
    pthread_mutex_unlock(&g_failure_lock);
}
