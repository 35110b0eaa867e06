/*
 * The board model: the readings that move, derived in one place
 * (docs/workloads.md).
 *
 * A device's utilization, memory used, power draw, GPU temperature, current
 * SM/graphics clock and clocks event reasons at time t come from, strongest
 * first:
 *
 *   1. a `mokka ctl` override: the daemon lists the fields an override set
 *      under `pinned.<field>`, and a pinned field reads the profile's value;
 *   2. a `dynamics.<metric>` pattern (steady, ramp, burst, noise; patterns.c);
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
 * This file owns the model alone: what a board's readings derive from
 * (struct mock_board, resolved once per snapshot) and the formula.  When
 * the formula runs is readings.c's: it keeps the answer for every call of
 * the same clock tick, and serves it as profile fields; the energy counter
 * that integrates the draw is energy.c's.  A device with no holders and no
 * pattern is not active: every reading is exactly the profile's, as before
 * workloads existed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "dynamics.h"

/* The clocks event reasons, by profile field (declared in dynamics.h: the
 * readings as fields, readings.c, look them up too). */
const struct mock_reason_field mock_reason_fields[] = {
    {"clocks_throttle_reasons.gpu_idle", nvmlClocksEventReasonGpuIdle},
    {"clocks_throttle_reasons.applications_clocks_setting",
     nvmlClocksEventReasonApplicationsClocksSetting},
    {"clocks_throttle_reasons.sw_power_cap", nvmlClocksEventReasonSwPowerCap},
    {"clocks_throttle_reasons.hw_slowdown", nvmlClocksThrottleReasonHwSlowdown},
    {"clocks_throttle_reasons.sync_boost", nvmlClocksEventReasonSyncBoost},
    {"clocks_throttle_reasons.sw_thermal_slowdown", nvmlClocksEventReasonSwThermalSlowdown},
    {"clocks_throttle_reasons.hw_thermal_slowdown", nvmlClocksThrottleReasonHwThermalSlowdown},
    {"clocks_throttle_reasons.hw_power_brake_slowdown",
     nvmlClocksThrottleReasonHwPowerBrakeSlowdown},
    {"clocks_throttle_reasons.display_clocks_setting", nvmlClocksEventReasonDisplayClockSetting},
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

static void resolve(const struct mock_config *cfg, unsigned pos, struct mock_board *b)
{
    b->dynamic = mock_pattern_of(cfg, pos, "utilization", &b->p_util) |
                 mock_pattern_of(cfg, pos, "memory", &b->p_memory) |
                 mock_pattern_of(cfg, pos, "power", &b->p_power) |
                 mock_pattern_of(cfg, pos, "temperature", &b->p_temperature) |
                 mock_pattern_of(cfg, pos, "clocks", &b->p_clocks);
    b->util = mock_dev_double_or(cfg, pos, "utilization.gpu", 0);
    b->util_memory = mock_dev_double_or(cfg, pos, "utilization.memory", 0);
    b->total = mock_dev_double_or(cfg, pos, "memory.total_bytes", 0);
    b->usable = b->total - mock_dev_double_or(cfg, pos, "memory.reserved_bytes", 0);
    b->used = mock_dev_double_or(cfg, pos, "memory.used_bytes", 0);
    b->power = mock_dev_double_or(cfg, pos, "power.current_draw_mw", 0);
    b->has_limit = mock_dev_double(cfg, pos, "power.enforced_limit_mw", &b->limit) ||
                   mock_dev_double(cfg, pos, "power.max_limit_mw", &b->limit);
    b->temperature = mock_dev_double_or(cfg, pos, "thermal.temperature_gpu_c", 0);
    b->has_slowdown = mock_dev_double(cfg, pos, "thermal.slowdown_threshold_c", &b->slowdown);
    b->has_shutdown = mock_dev_double(cfg, pos, "thermal.shutdown_threshold_c", &b->shutdown);
    b->has_gpu_max = mock_dev_double(cfg, pos, "thermal.max_operating_c", &b->gpu_max);
    b->has_tlimit = mock_parse_i64(mock_dev_get(cfg, pos, "thermal.tlimit_c"), &b->tlimit);
    if (!mock_dev_double(cfg, pos, "clocks.sm_current", &b->clock))
        b->clock = mock_dev_double_or(cfg, pos, "clocks.graphics_current", 0);
    if (!mock_dev_double(cfg, pos, "clocks.sm_max", &b->clock_max))
        b->clock_max = mock_dev_double_or(cfg, pos, "clocks.graphics_max", b->clock);
    b->step = mock_dev_double_or(cfg, pos, "dynamics.step_s", 1);
    if (!(b->step > 0))
        b->step = 1;
    for (size_t i = 0; i < MOCK_COUNT(PINS); i++)
        if (pinned(cfg, pos, PINS[i].field))
            b->pins |= PINS[i].pin;
    for (size_t i = 0; i < MOCK_COUNT(mock_reason_fields); i++) {
        int on = 0;
        if (pinned(cfg, pos, mock_reason_fields[i].field))
            b->pinned_reasons |= mock_reason_fields[i].bit;
        if (mock_parse_bool(mock_dev_get(cfg, pos, mock_reason_fields[i].field), &on) && on)
            b->profile_reasons |= mock_reason_fields[i].bit;
    }
    /* `mokka ctl pstate` sets both states; the power state's block marks it */
    b->pstate_pinned = pinned(cfg, pos, "performance_state") ||
                       pinned(cfg, pos, "power.power_state");
    b->has_energy =
        mock_dev_double(cfg, pos, "power.total_energy_consumption_mj", &b->energy_base);

    unsigned n = 0;
    mock_dev_list_len(cfg, pos, "supported_clocks.memory_clocks.0.graphics_clocks", &n);
    b->clocks = n ? calloc(n, sizeof *b->clocks) : NULL;
    for (unsigned i = 0; b->clocks != NULL && i < n; i++) {
        char field[96];
        snprintf(field, sizeof field, "supported_clocks.memory_clocks.0.graphics_clocks.%u", i);
        if (mock_dev_double(cfg, pos, field, &b->clocks[b->clock_count]))
            b->clock_count++;
    }
    /* where a power or thermal limit holds the clocks: well below boost */
    b->throttle_clock = snap_clock(b, 0.85 * b->clock_max);
}

/* The first reader of a snapshot resolves a device's board (board_of in
 * dynamics.h); a racing second reader's copy is dropped. */
const struct mock_board *mock_first_board(const struct mock_config *cfg, unsigned pos)
{
    struct mock_config *shared = (struct mock_config *)cfg; /* only the cache changes */
    struct mock_board *fresh = calloc(1, sizeof *fresh);
    if (fresh == NULL)
        return NULL;
    resolve(cfg, pos, fresh);
    static unsigned long long serials;
    fresh->serial = __atomic_add_fetch(&serials, 1, __ATOMIC_RELAXED);
    struct mock_board *expected = NULL;
    if (__atomic_compare_exchange_n(&shared->boards[pos], &expected, fresh, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
        return fresh;
    mock_board_free(fresh);
    return expected;
}

/* The power draw (mW) at `x`: a power pattern's watts, or a utilization in
 * percent that takes the board from its idle draw to its enforced limit;
 * never above that limit (*capped: it is at it) nor below 0.  The one
 * formula of the draw: readings and the energy counter both use it. */
double mock_draw_mw(double idle, double limit, int has_limit, int watts, double x, int *capped)
{
    double p = watts ? x * 1000 : has_limit ? idle + (limit - idle) * clamp(x / 100, 0, 1) : idle;
    *capped = has_limit && p >= limit;
    return fmax(*capped ? limit : p, 0);
}

/* The utilization (percent) at time t: pattern, then holders, then idle. */
double mock_util_at(const struct mock_board *b, const struct mock_load *load, unsigned pos,
                    double t)
{
    if (b->p_util.kind != PATTERN_NONE)
        return clamp(mock_pattern_value(&b->p_util, pos, t, b->step), 0, 100);
    if (load->holders > 0)
        return clamp(fmax(b->util, load->holders * load->utilization), 0, 100);
    return b->util;
}

/* The readings of an active board at time t: the formula (the cache only
 * keeps what it answers).  `out` is zeroed, its holders set. */
void mock_derive(const struct mock_board *b, const struct mock_load *loaded, unsigned pos,
                 double t, struct mock_readings *out)
{
    const struct mock_load load = *loaded;
    out->active = 1;
    out->pinned_reasons = b->pinned_reasons;

    /* utilization */
    double util = b->pins & PIN_UTIL ? b->util : mock_util_at(b, &load, pos, t);
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
        used = clamp(mock_pattern_value(&b->p_memory, pos, t, b->step), 0, 1) * b->total;
    else
        used = b->used + load.holders * load.memory_share * b->total;
    out->memory_used = (unsigned long long)clamp(used, 0, b->usable > 0 ? b->usable : 0);

    unsigned long long reasons = 0;

    /* power */
    double power;
    int capped = 0;
    if (b->pins & PIN_POWER)
        power = b->power;
    else if (b->p_power.kind != PATTERN_NONE)
        power = mock_draw_mw(b->power, b->limit, b->has_limit, 1,
                             mock_pattern_value(&b->p_power, pos, t, b->step), &capped);
    else
        power = mock_draw_mw(b->power, b->limit, b->has_limit, 0, util, &capped);
    if (capped)
        reasons |= nvmlClocksEventReasonSwPowerCap;
    out->power_mw = (unsigned)lround(fmax(power, 0));

    /* temperature: toward idle + span x u; a pattern's load averaged over
     * its last four steps, as a heat sink lags the load */
    double temp;
    if (b->pins & PIN_TEMPERATURE) {
        temp = b->temperature;
    } else if (b->p_temperature.kind != PATTERN_NONE) {
        temp = mock_pattern_value(&b->p_temperature, pos, t, b->step);
    } else {
        double hot = b->has_gpu_max ? b->gpu_max - 2 : b->has_slowdown ? b->slowdown - 7
                                                                       : b->temperature + 40;
        double span = clamp(hot - b->temperature, 0, 40), heat = u;
        if (b->p_util.kind != PATTERN_NONE && !(b->pins & PIN_UTIL)) {
            heat = 0;
            for (int i = 0; i < 4; i++)
                heat += clamp(mock_util_at(b, &load, pos, t - i * b->step) / 100, 0, 1) / 4;
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
        clock = snap_clock(b, clamp(mock_pattern_value(&b->p_clocks, pos, t, b->step), 0,
                                    b->clock_max));
    else
        /* the P-state's threshold (mock_reading_pstate): a board in its idle
         * state runs its idle clock, never boost */
        clock = util > MOCK_BUSY_UTILIZATION ? b->clock_max : b->clock;
    if (reasons != 0 && !(b->pins & PIN_CLOCK))
        clock = fmin(clock, b->throttle_clock);
    out->sm_clock_mhz = (unsigned)lround(clock);
    if (util <= 0)
        reasons |= nvmlClocksEventReasonGpuIdle;
    out->reasons = reasons;
}
