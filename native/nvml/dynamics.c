/*
 * The readings that move, derived in one place (docs/workloads.md).
 *
 * A device's utilization, memory used, power draw, GPU temperature, current
 * SM/graphics clock and clocks event reasons at time t come from, strongest
 * first:
 *
 *   1. a `mokka ctl` override: the daemon lists the fields an override set
 *      under `pinned.<field>`, and a pinned field reads the profile's value;
 *   2. a `dynamics.<metric>` pattern (steady, ramp, burst, noise);
 *   3. the pods holding the GPU (workload.c): each holder adds its share of
 *      the memory and its utilization;
 *   4. the profile's own (idle) value.
 *
 * Power, temperature and clocks follow the utilization u (0..1) unless a
 * pattern or an override sets them: power = idle + (limit - idle) x u,
 * clamped to the enforced limit (SW power cap when it reaches it);
 * temperature = idle + span x u, with span taking a fully busy board to
 * just under its maximum operating temperature, averaged over the last
 * four steps of a pattern so it lags the load as a heat sink does; clocks
 * boost to the maximum while busy and drop to a supported clock well below
 * it while a power or thermal limit holds them (with the matching reasons).
 * Every value stays within the board's limits: power within the enforced
 * limit, temperature below shutdown, clocks within the supported set.
 *
 * Time is CLOCK_REALTIME, which every process shares, and the noise is a
 * hash of (seed, device, floor(t / step)), so two processes reading the
 * same GPU at the same instant agree.  MOCK_NVML_CLOCK_OVERRIDE (seconds
 * since the epoch; for tests) pins the clock.  A device with no holders
 * and no pattern is not active: every reading is exactly the profile's, as
 * before workloads existed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "mock.h"

/* Set when MOCK_NVML_CLOCK_OVERRIDE was in the environment at load: only
 * then is the variable read at each reading (a test sweeping instants in
 * one process changes it), so a node never pays for the lookup. */
static int g_clock_pinned;

__attribute__((constructor)) static void dynamics_start(void)
{
    g_clock_pinned = getenv("MOCK_NVML_CLOCK_OVERRIDE") != NULL;
}

double mock_reading_time(void)
{
    double t;
    if (g_clock_pinned && mock_parse_double(getenv("MOCK_NVML_CLOCK_OVERRIDE"), &t) && t >= 0)
        return t;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---------------------------------------------------------------- patterns */

enum pattern_kind { PATTERN_NONE, PATTERN_STEADY, PATTERN_RAMP, PATTERN_BURST, PATTERN_NOISE };

struct pattern {
    enum pattern_kind kind;
    double a, b; /* steady: value; ramp: from, to; burst: low, high; noise: mean, amplitude */
    double period, duty; /* ramp and burst */
    unsigned long long seed;
};

static double raw_double(const struct mock_config *cfg, unsigned pos, const char *field,
                         double fallback)
{
    double v;
    return mock_parse_double(mock_dev_get(cfg, pos, field), &v) ? v : fallback;
}

static double param(const struct mock_config *cfg, unsigned pos, const char *metric,
                    const char *name, double fallback)
{
    char field[128];
    snprintf(field, sizeof field, "dynamics.%s.%s", metric, name);
    return raw_double(cfg, pos, field, fallback);
}

/* The profile validated the block (mokka/state/device_checks.py); a hand
 * edit that breaks it reads as no pattern, never as a wild value. */
static int pattern_of(const struct mock_config *cfg, unsigned pos, const char *metric,
                      struct pattern *p)
{
    char field[128];
    snprintf(field, sizeof field, "dynamics.%s.pattern", metric);
    const char *name = mock_dev_get(cfg, pos, field);
    memset(p, 0, sizeof *p);
    if (name == NULL)
        return 0;
    if (strcasecmp(name, "steady") == 0) {
        p->kind = PATTERN_STEADY;
        p->a = param(cfg, pos, metric, "value", NAN);
    } else if (strcasecmp(name, "ramp") == 0) {
        p->kind = PATTERN_RAMP;
        p->a = param(cfg, pos, metric, "from", NAN);
        p->b = param(cfg, pos, metric, "to", NAN);
        p->period = param(cfg, pos, metric, "period_s", NAN);
    } else if (strcasecmp(name, "burst") == 0) {
        p->kind = PATTERN_BURST;
        p->a = param(cfg, pos, metric, "low", NAN);
        p->b = param(cfg, pos, metric, "high", NAN);
        p->period = param(cfg, pos, metric, "period_s", NAN);
        p->duty = param(cfg, pos, metric, "duty", 0.5);
    } else if (strcasecmp(name, "noise") == 0) {
        p->kind = PATTERN_NOISE;
        p->a = param(cfg, pos, metric, "mean", NAN);
        p->b = param(cfg, pos, metric, "amplitude", 0);
        char seed[128];
        snprintf(seed, sizeof seed, "dynamics.%s.seed", metric);
        if (!mock_parse_u64(mock_dev_get(cfg, pos, seed), &p->seed))
            p->seed = 0;
    } else {
        return 0;
    }
    int periodic = p->kind == PATTERN_RAMP || p->kind == PATTERN_BURST;
    if (!isfinite(p->a) || !isfinite(p->b) || (periodic && !(p->period > 0))) {
        p->kind = PATTERN_NONE;
        return 0;
    }
    return 1;
}

/* splitmix64: a good 64-bit mix, the same in every process. */
static unsigned long long mix(unsigned long long x)
{
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

static double pattern_value(const struct pattern *p, unsigned pos, double t, double step)
{
    double phase = p->period > 0 ? fmod(t, p->period) / p->period : 0;
    switch (p->kind) {
    case PATTERN_STEADY: return p->a;
    case PATTERN_RAMP: return p->a + (p->b - p->a) * phase;
    case PATTERN_BURST: return phase < p->duty ? p->b : p->a;
    case PATTERN_NOISE: {
        long long bucket = (long long)floor(t / step);
        unsigned long long h = mix(p->seed ^ mix((unsigned long long)pos ^
                                                 mix((unsigned long long)bucket)));
        double unit = (double)(h >> 11) / 9007199254740992.0; /* [0, 1) */
        return p->a + p->b * (2 * unit - 1);
    }
    default: return 0;
    }
}

static double clamp(double v, double lo, double hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* --------------------------------------------------------------- readings */

/* Which readings an override pinned (`pinned.<field>` in the config). */
enum pin {
    PIN_UTIL = 1 << 0,
    PIN_UTIL_MEMORY = 1 << 1,
    PIN_MEMORY = 1 << 2,
    PIN_POWER = 1 << 3,
    PIN_TEMPERATURE = 1 << 4,
    PIN_CLOCK = 1 << 5,
};

/* Everything a device's readings derive from that the engine config holds:
 * its profile values, limits, patterns and pins.  Resolved once per config
 * snapshot and device (the snapshot is immutable), so a reading formats and
 * looks up no key: only the workload's holders and the clock are read per
 * call. */
struct mock_board {
    int dynamic; /* a pattern is set */
    double util, util_memory, total, usable, used, power, limit, temperature;
    double slowdown, shutdown, gpu_max, clock, clock_max, throttle_clock, step;
    int has_limit, has_slowdown, has_shutdown, has_gpu_max, has_tlimit;
    long long tlimit;
    unsigned pins;
    unsigned long long pinned_reasons; /* reasons an override set */
    struct pattern p_util, p_memory, p_power, p_temperature, p_clocks;
    unsigned clock_count;
    double *clocks; /* the supported graphics clocks (first memory clock) */
};

void mock_board_free(struct mock_board *board)
{
    if (board != NULL)
        free(board->clocks);
    free(board);
}

static int pinned(const struct mock_config *cfg, unsigned pos, const char *field)
{
    char key[128];
    int on = 0;
    snprintf(key, sizeof key, "pinned.%s", field);
    return mock_parse_bool(mock_dev_get(cfg, pos, key), &on) && on;
}

static int has_field(const struct mock_config *cfg, unsigned pos, const char *field, double *out)
{
    return mock_parse_double(mock_dev_get(cfg, pos, field), out);
}

/* The largest supported clock at or below `mhz` (the smallest one when none
 * is); `mhz` itself when the profile lists no clocks. */
static double snap_clock(const struct mock_board *b, double mhz)
{
    double below = -1, lowest = -1;
    for (unsigned i = 0; i < b->clock_count; i++) {
        double c = b->clocks[i];
        if (c <= mhz && c > below)
            below = c;
        if (lowest < 0 || c < lowest)
            lowest = c;
    }
    return below >= 0 ? below : lowest >= 0 ? lowest : mhz;
}

/* The clocks event reasons readings set, by their profile field. */
static const struct {
    const char *field;
    unsigned long long bit;
} REASONS[] = {
    {"clocks_throttle_reasons.gpu_idle", nvmlClocksEventReasonGpuIdle},
    {"clocks_throttle_reasons.sw_power_cap", nvmlClocksEventReasonSwPowerCap},
    {"clocks_throttle_reasons.hw_slowdown", nvmlClocksThrottleReasonHwSlowdown},
    {"clocks_throttle_reasons.sw_thermal_slowdown", nvmlClocksEventReasonSwThermalSlowdown},
    {"clocks_throttle_reasons.hw_thermal_slowdown", nvmlClocksThrottleReasonHwThermalSlowdown},
};

static const struct {
    const char *field;
    enum pin pin;
} PINS[] = {
    {"utilization.gpu", PIN_UTIL},
    {"utilization.memory", PIN_UTIL_MEMORY},
    {"memory.used_bytes", PIN_MEMORY},
    {"power.current_draw_mw", PIN_POWER},
    {"thermal.temperature_gpu_c", PIN_TEMPERATURE},
    {"clocks.sm_current", PIN_CLOCK},
    {"clocks.graphics_current", PIN_CLOCK},
};

static void resolve(const struct mock_config *cfg, unsigned pos, struct mock_board *b)
{
    b->dynamic = pattern_of(cfg, pos, "utilization", &b->p_util) |
                 pattern_of(cfg, pos, "memory", &b->p_memory) |
                 pattern_of(cfg, pos, "power", &b->p_power) |
                 pattern_of(cfg, pos, "temperature", &b->p_temperature) |
                 pattern_of(cfg, pos, "clocks", &b->p_clocks);
    b->util = raw_double(cfg, pos, "utilization.gpu", 0);
    b->util_memory = raw_double(cfg, pos, "utilization.memory", 0);
    b->total = raw_double(cfg, pos, "memory.total_bytes", 0);
    b->usable = b->total - raw_double(cfg, pos, "memory.reserved_bytes", 0);
    b->used = raw_double(cfg, pos, "memory.used_bytes", 0);
    b->power = raw_double(cfg, pos, "power.current_draw_mw", 0);
    b->has_limit = has_field(cfg, pos, "power.enforced_limit_mw", &b->limit) ||
                   has_field(cfg, pos, "power.max_limit_mw", &b->limit);
    b->temperature = raw_double(cfg, pos, "thermal.temperature_gpu_c", 0);
    b->has_slowdown = has_field(cfg, pos, "thermal.slowdown_threshold_c", &b->slowdown);
    b->has_shutdown = has_field(cfg, pos, "thermal.shutdown_threshold_c", &b->shutdown);
    b->has_gpu_max = has_field(cfg, pos, "thermal.max_operating_c", &b->gpu_max);
    b->has_tlimit = mock_parse_i64(mock_dev_get(cfg, pos, "thermal.tlimit_c"), &b->tlimit);
    if (!has_field(cfg, pos, "clocks.sm_current", &b->clock))
        b->clock = raw_double(cfg, pos, "clocks.graphics_current", 0);
    if (!has_field(cfg, pos, "clocks.sm_max", &b->clock_max))
        b->clock_max = raw_double(cfg, pos, "clocks.graphics_max", b->clock);
    b->step = raw_double(cfg, pos, "dynamics.step_s", 1);
    if (!(b->step > 0))
        b->step = 1;
    for (size_t i = 0; i < MOCK_COUNT(PINS); i++)
        if (pinned(cfg, pos, PINS[i].field))
            b->pins |= PINS[i].pin;
    for (size_t i = 0; i < MOCK_COUNT(REASONS); i++)
        if (pinned(cfg, pos, REASONS[i].field))
            b->pinned_reasons |= REASONS[i].bit;

    unsigned n = 0;
    mock_dev_list_len(cfg, pos, "supported_clocks.memory_clocks.0.graphics_clocks", &n);
    b->clocks = n ? calloc(n, sizeof *b->clocks) : NULL;
    for (unsigned i = 0; b->clocks != NULL && i < n; i++) {
        char field[96];
        snprintf(field, sizeof field, "supported_clocks.memory_clocks.0.graphics_clocks.%u", i);
        if (has_field(cfg, pos, field, &b->clocks[b->clock_count]))
            b->clock_count++;
    }
    /* where a power or thermal limit holds the clocks: well below boost */
    b->throttle_clock = snap_clock(b, 0.85 * b->clock_max);
}

/* The device's board, resolved by the first reader of this snapshot; a
 * racing second reader's copy is dropped.  NULL only without memory. */
static const struct mock_board *board_of(const struct mock_config *cfg, unsigned pos)
{
    struct mock_config *shared = (struct mock_config *)cfg; /* only the cache changes */
    struct mock_board *b = __atomic_load_n(&shared->boards[pos], __ATOMIC_ACQUIRE);
    if (b != NULL)
        return b;
    struct mock_board *fresh = calloc(1, sizeof *fresh);
    if (fresh == NULL)
        return NULL;
    resolve(cfg, pos, fresh);
    struct mock_board *expected = NULL;
    if (__atomic_compare_exchange_n(&shared->boards[pos], &expected, fresh, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
        return fresh;
    mock_board_free(fresh);
    return expected;
}

/* The utilization (percent) at time t: pattern, then holders, then idle. */
static double util_at(const struct mock_board *b, const struct mock_load *load, unsigned pos,
                      double t)
{
    if (b->p_util.kind != PATTERN_NONE)
        return clamp(pattern_value(&b->p_util, pos, t, b->step), 0, 100);
    if (load->holders > 0)
        return clamp(fmax(b->util, load->holders * load->utilization), 0, 100);
    return b->util;
}

void mock_readings_at(const struct mock_config *cfg, unsigned pos, double t,
                      struct mock_readings *out)
{
    memset(out, 0, sizeof *out);
    if (pos >= cfg->device_count || pos >= MOCK_MAX_DEVICES)
        return;
    const struct mock_board *b = board_of(cfg, pos);
    struct mock_load load;
    mock_workload_load(cfg, pos, &load);
    out->holders = load.holders;
    if (b == NULL || (load.holders == 0 && !b->dynamic))
        return; /* not active: the profile's values stand */
    out->active = 1;
    if (t == MOCK_READING_NOW)
        t = mock_reading_time(); /* only now: an idle board never reads the clock */
    out->pinned_reasons = b->pinned_reasons;

    /* utilization */
    double util = b->pins & PIN_UTIL ? b->util : util_at(b, &load, pos, t);
    double u = clamp(util / 100, 0, 1);
    out->util_gpu = (unsigned)lround(clamp(util, 0, 100));
    out->util_memory = b->pins & PIN_UTIL_MEMORY
                           ? (unsigned)b->util_memory
                           : (unsigned)lround(clamp(b->util_memory + (100 - b->util_memory) * u / 2,
                                                    0, 100));

    /* memory used, within what the driver leaves usable */
    double used;
    if (b->pins & PIN_MEMORY)
        used = b->used;
    else if (b->p_memory.kind != PATTERN_NONE)
        used = clamp(pattern_value(&b->p_memory, pos, t, b->step), 0, 1) * b->total;
    else
        used = b->used + load.holders * load.memory_share * b->total;
    out->memory_used = (unsigned long long)clamp(used, 0, b->usable > 0 ? b->usable : 0);

    unsigned long long reasons = 0;

    /* power */
    double power;
    if (b->pins & PIN_POWER)
        power = b->power;
    else if (b->p_power.kind != PATTERN_NONE)
        power = pattern_value(&b->p_power, pos, t, b->step) * 1000;
    else
        power = b->has_limit ? b->power + (b->limit - b->power) * u : b->power;
    if (b->has_limit && power >= b->limit && !(b->pins & PIN_POWER)) {
        power = b->limit;
        reasons |= nvmlClocksEventReasonSwPowerCap;
    }
    out->power_mw = (unsigned)lround(fmax(power, 0));

    /* temperature: toward idle + span x u; a pattern's load averaged over
     * its last four steps, as a heat sink lags the load */
    double temp;
    if (b->pins & PIN_TEMPERATURE) {
        temp = b->temperature;
    } else if (b->p_temperature.kind != PATTERN_NONE) {
        temp = pattern_value(&b->p_temperature, pos, t, b->step);
    } else {
        double hot = b->has_gpu_max ? b->gpu_max - 2 : b->has_slowdown ? b->slowdown - 7
                                                                       : b->temperature + 40;
        double span = clamp(hot - b->temperature, 0, 40), heat = u;
        if (b->p_util.kind != PATTERN_NONE && !(b->pins & PIN_UTIL)) {
            heat = 0;
            for (int i = 0; i < 4; i++)
                heat += clamp(util_at(b, &load, pos, t - i * b->step) / 100, 0, 1) / 4;
        }
        temp = b->temperature + span * heat;
    }
    if (b->has_shutdown && temp > b->shutdown - 1)
        temp = b->shutdown - 1;
    if (b->has_gpu_max && temp >= b->gpu_max)
        reasons |= nvmlClocksEventReasonSwThermalSlowdown;
    if (b->has_slowdown && temp >= b->slowdown)
        reasons |= nvmlClocksThrottleReasonHwSlowdown | nvmlClocksThrottleReasonHwThermalSlowdown;
    out->temperature_c = (int)lround(temp);
    out->has_tlimit = b->has_tlimit;
    out->tlimit_c = b->tlimit - (out->temperature_c - (long long)lround(b->temperature));

    /* clocks: boost while busy, held down while a limit holds */
    double clock;
    if (b->pins & PIN_CLOCK)
        clock = b->clock;
    else if (b->p_clocks.kind != PATTERN_NONE)
        clock = snap_clock(b, clamp(pattern_value(&b->p_clocks, pos, t, b->step), 0,
                                    b->clock_max));
    else
        clock = util > 0 ? b->clock_max : b->clock;
    if (reasons != 0 && !(b->pins & PIN_CLOCK))
        clock = fmin(clock, b->throttle_clock);
    out->sm_clock_mhz = (unsigned)lround(clock);
    if (util <= 0)
        reasons |= nvmlClocksEventReasonGpuIdle;
    out->reasons = reasons;
}

/* ------------------------------------------------- readings as fields */

enum quantity {
    Q_UTIL, Q_UTIL_MEMORY, Q_MEMORY_USED, Q_POWER, Q_TEMPERATURE, Q_TLIMIT, Q_CLOCK, Q_REASON
};

static const struct {
    const char *field;
    enum quantity q;
} MOVING[] = {
    {"utilization.gpu", Q_UTIL},
    {"utilization.memory", Q_UTIL_MEMORY},
    {"memory.used_bytes", Q_MEMORY_USED},
    {"power.current_draw_mw", Q_POWER},
    {"thermal.temperature_gpu_c", Q_TEMPERATURE},
    /* the margin to the slowdown point shrinks as the board warms */
    {"thermal.tlimit_c", Q_TLIMIT},
    {"clocks.sm_current", Q_CLOCK},
    {"clocks.graphics_current", Q_CLOCK},
};

/* Which moving quantity `field` names (the reasons: which bit, in *bit). */
static int quantity_of(const char *field, enum quantity *q, unsigned long long *bit)
{
    /* Most lookups are of fields that never move: turn them away on their
     * first letters before any string comparison. */
    switch (field[0]) {
    case 'u': case 'm': case 'p': case 't': case 'c': break;
    default: return 0;
    }
    for (size_t i = 0; i < MOCK_COUNT(MOVING); i++) {
        if (MOVING[i].field[1] == field[1] && strcmp(field, MOVING[i].field) == 0) {
            *q = MOVING[i].q;
            return 1;
        }
    }
    if (strncmp(field, "clocks_", 7) != 0)
        return 0;
    for (size_t i = 0; i < MOCK_COUNT(REASONS); i++) {
        if (strcmp(field, REASONS[i].field) == 0) {
            *q = Q_REASON;
            *bit = REASONS[i].bit;
            return 1;
        }
    }
    return 0;
}

int mock_reading_field(const struct mock_config *cfg, unsigned pos, const char *field,
                       long long *out)
{
    enum quantity q;
    unsigned long long bit = 0;
    if (!quantity_of(field, &q, &bit) || pos >= cfg->device_count)
        return 0;
    struct mock_readings r;
    mock_readings_at(cfg, pos, MOCK_READING_NOW, &r);
    /* a reason an override set reads as the override says */
    if (!r.active || (r.pinned_reasons & bit))
        return 0;
    switch (q) {
    case Q_UTIL: *out = r.util_gpu; break;
    case Q_UTIL_MEMORY: *out = r.util_memory; break;
    case Q_MEMORY_USED: *out = (long long)r.memory_used; break;
    case Q_POWER: *out = r.power_mw; break;
    case Q_TEMPERATURE: *out = r.temperature_c; break;
    case Q_TLIMIT:
        if (!r.has_tlimit)
            return 0; /* the board reports no T.Limit */
        *out = r.tlimit_c;
        break;
    case Q_CLOCK: *out = r.sm_clock_mhz; break;
    case Q_REASON: *out = (r.reasons & bit) != 0; break;
    }
    return 1;
}
