/*
 * Failure injection.
 *
 * Each device may carry a failure spec in the engine config:
 *   failure.mode          healthy | lost | fallen_off_bus | ecc_uncorrectable
 *   failure.after_calls   the first N guarded calls succeed, then it trips
 *   failure.probability   each guarded call trips it with this probability
 *   failure.seed          seeds that draw, so a run is reproducible
 *
 * lost / fallen_off_bus are per process: guarded calls return
 * NVML_ERROR_GPU_IS_LOST.  Neither trigger: the failure is active at once.
 * Once tripped it stays tripped for the life of the process ("sticky"),
 * like a GPU that fell off the bus.  A changed spec (e.g. `mokka ctl
 * reset`) starts over, so a runtime override can both break and heal a GPU
 * in running processes.  fallen_off_bus also raises Xid 79, as the driver
 * logs it for such a GPU, unless the spec names a Xid of its own
 * (failure.xid, delivered through the Xid list): events.c delivers it to
 * each event set registered before the fall, from the moment the failure
 * is active (mock_failure_fell_off).  `lost` stands for a GPU that is gone
 * without a word, and raises nothing.
 *
 * ecc_uncorrectable is node state, not a process's: while the config lists
 * it, the device has had one uncorrectable (double-bit) error in its
 * memory, which every process reads alike (memory.c: the counters, the
 * retired page or the remapped row) and which events.c delivers as one
 * double-bit ECC event to each set registered before it
 * (mock_failure_ecc_injection).  Calls keep working, and the triggers,
 * which count a process's calls, do not apply: two processes reading at
 * the same instant must agree.  So the injection is identified by its mode
 * alone: a trigger changed under it is no new error; a reset heals the
 * device, and a later injection is a new one.
 *
 * The spec is read once per snapshot (mock_failure_prepare), so a call on a
 * device with no per-call failure tests one byte (mock_failure_armed).  A
 * call on an armed one counts and draws with atomics, no lock: only a
 * changed spec takes the lock, to start the device's state over.  A call
 * racing that restart may still count under the old spec, which only
 * shifts `after_calls` by the calls in flight at the moment of the change.
 */
#include <pthread.h>
#include <string.h>

#include "mock.h"

struct failure_state {
    unsigned long long spec;       /* id of the spec this state counts for; 0: none */
    unsigned long long calls;      /* guarded calls seen under this spec */
    unsigned long long rng;        /* xorshift64 state for `probability` */
    int tripped;
};

/* Every field is accessed atomically; the lock only orders restarts. */
static pthread_mutex_t g_failure_lock = PTHREAD_MUTEX_INITIALIZER;
static struct failure_state g_failures[MOCK_MAX_DEVICES];

/* FNV-1a over the spec's words: equal text, equal id; never 0. */
static unsigned long long spec_id(const char *const words[], size_t n)
{
    unsigned long long h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) {
        for (const char *p = words[i] ? words[i] : ""; *p; p++)
            h = (h ^ (unsigned char)*p) * 0x100000001b3ULL;
        h = (h ^ '|') * 0x100000001b3ULL;
    }
    return h ? h : 1;
}

void mock_failure_prepare(struct mock_config *cfg)
{
    for (unsigned pos = 0; pos < cfg->device_count && pos < MOCK_MAX_DEVICES; pos++) {
        struct mock_failure_spec *f = &cfg->failure[pos];
        memset(f, 0, sizeof *f);
        const char *mode = mock_dev_get(cfg, pos, "failure.mode");
        if (mode == NULL || strcmp(mode, "healthy") == 0)
            continue;
        if (strcmp(mode, "lost") == 0 || strcmp(mode, "fallen_off_bus") == 0)
            f->mode = MOCK_FAILURE_LOST;
        else if (strcmp(mode, "ecc_uncorrectable") == 0)
            f->mode = MOCK_FAILURE_ECC;
        else
            continue; /* a mode this library does not know has no effect */
        const char *words[] = {mode, mock_dev_get(cfg, pos, "failure.after_calls"),
                               mock_dev_get(cfg, pos, "failure.probability"),
                               mock_dev_get(cfg, pos, "failure.seed")};
        /* an ECC injection takes no trigger: its mode alone identifies it */
        f->id = spec_id(words, f->mode == MOCK_FAILURE_ECC ? 1 : MOCK_COUNT(words));
        f->raises_xid = strcmp(mode, "fallen_off_bus") == 0 &&
                        mock_dev_get(cfg, pos, "failure.xid.code") == NULL;
        f->has_after = mock_parse_u64(words[1], &f->after);
        f->has_probability = mock_dev_double(cfg, pos, "failure.probability", &f->probability);
        mock_parse_u64(words[3], &f->seed);
    }
}

static unsigned long long xorshift64(unsigned long long x)
{
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
}

/* A uniform draw in [0, 1) from the device's generator, lock-free. */
static double draw(struct failure_state *st)
{
    unsigned long long old = __atomic_load_n(&st->rng, __ATOMIC_RELAXED), next;
    do
        next = xorshift64(old);
    while (!__atomic_compare_exchange_n(&st->rng, &old, next, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED));
    return (double)(next >> 11) / 9007199254740992.0;
}

/* A spec the device's state was not counting for: start over. */
static void start_over(struct failure_state *st, const struct mock_failure_spec *f,
                       unsigned pos)
{
    pthread_mutex_lock(&g_failure_lock);
    if (__atomic_load_n(&st->spec, __ATOMIC_ACQUIRE) != f->id) {
        /* xorshift must not start at 0; mix the position in so devices
         * sharing a seed still draw independently. */
        unsigned long long rng = (f->seed ^ 0x9E3779B97F4A7C15ULL) + pos * 0x100000001B3ULL;
        __atomic_store_n(&st->rng, rng ? rng : 1, __ATOMIC_RELAXED);
        __atomic_store_n(&st->calls, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&st->tripped, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&st->spec, f->id, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_failure_lock);
}

nvmlReturn_t mock_failure_check(const struct mock_config *cfg, unsigned pos)
{
    if (pos >= MOCK_MAX_DEVICES || !mock_failure_armed(cfg, pos))
        return NVML_SUCCESS;
    const struct mock_failure_spec *f = &cfg->failure[pos];
    struct failure_state *st = &g_failures[pos];
    if (__atomic_load_n(&st->spec, __ATOMIC_ACQUIRE) != f->id)
        start_over(st, f, pos);
    if (!__atomic_load_n(&st->tripped, __ATOMIC_ACQUIRE)) {
        unsigned long long calls = __atomic_add_fetch(&st->calls, 1, __ATOMIC_RELAXED);
        int trip = !f->has_after && !f->has_probability;
        if (f->has_after && calls > f->after)
            trip = 1;
        if (f->has_probability && draw(st) < f->probability)
            trip = 1;
        if (!trip)
            return NVML_SUCCESS;
        __atomic_store_n(&st->tripped, 1, __ATOMIC_RELEASE);
    }
    return NVML_ERROR_GPU_IS_LOST; /* only a per-call failure is armed */
}

int mock_failure_ecc_injection(const struct mock_config *cfg, unsigned pos,
                               unsigned long long *id)
{
    if (pos >= MOCK_MAX_DEVICES || pos >= cfg->device_count ||
        cfg->failure[pos].mode != MOCK_FAILURE_ECC)
        return 0;
    if (id != NULL)
        *id = cfg->failure[pos].id;
    return 1;
}

int mock_failure_fell_off(const struct mock_config *cfg, unsigned pos, unsigned long long *spec)
{
    if (pos >= MOCK_MAX_DEVICES || pos >= cfg->device_count || !cfg->failure[pos].raises_xid)
        return 0;
    const struct mock_failure_spec *f = &cfg->failure[pos];
    /* No trigger: active at once, before any call trips it. */
    int active = !f->has_after && !f->has_probability;
    if (!active) {
        /* tripped is read after spec: start_over clears it before it
         * publishes the spec, so this is the trip of this spec */
        const struct failure_state *st = &g_failures[pos];
        active = __atomic_load_n(&st->spec, __ATOMIC_ACQUIRE) == f->id &&
                 __atomic_load_n(&st->tripped, __ATOMIC_ACQUIRE);
    }
    if (active)
        *spec = f->id;
    return active;
}

void mock_failure_cleanup(void)
{
    pthread_mutex_lock(&g_failure_lock);
    for (unsigned pos = 0; pos < MOCK_MAX_DEVICES; pos++)
        __atomic_store_n(&g_failures[pos].spec, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_failure_lock);
}
