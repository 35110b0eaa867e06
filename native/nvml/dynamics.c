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
 * This file owns the formula alone: how a board's readings at time t
 * derive from its resolved inputs (struct mock_board, resolved once per
 * snapshot by board.c) and its holders.  When the formula runs is
 * readings.c's: it keeps the answer for every call of the same clock tick,
 * and serves it as profile fields; the energy counter that integrates the
 * draw is energy.c's.  A device with no holders and no pattern is not
 * active: every reading is exactly the profile's, as before workloads
 * existed, unless the engine config asks for the idle signature
 * (idle_signature.c), whose idle bases a busy board starts from.
 */
#include <math.h>

#include "dynamics.h"

/* The largest supported clock at or below `mhz` (the smallest one when none
 * is); `mhz` itself when the profile lists no clocks. */
double mock_snap_clock(const struct mock_board *b, double mhz)
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
    if (b->pins & PIN_POWER) {
        /* a draw pinned at or over the enforced limit is the SW power cap,
         * as when the formula's draw reaches it */
        power = b->power;
        capped = b->has_limit && power >= b->limit;
    } else if (b->p_power.kind != PATTERN_NONE)
        power = mock_draw_mw(b->base_power, b->limit, b->has_limit, 1,
                             mock_pattern_value(&b->p_power, pos, t, b->step), &capped);
    else
        power = mock_draw_mw(b->base_power, b->limit, b->has_limit, 0, util, &capped);
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
                                                                       : b->base_temperature + 40;
        double span = clamp(hot - b->base_temperature, 0, 40), heat = u;
        if (b->p_util.kind != PATTERN_NONE && !(b->pins & PIN_UTIL)) {
            heat = 0;
            for (int i = 0; i < 4; i++)
                heat += clamp(mock_util_at(b, &load, pos, t - i * b->step) / 100, 0, 1) / 4;
        }
        temp = b->base_temperature + span * heat;
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
        clock = mock_snap_clock(b, clamp(mock_pattern_value(&b->p_clocks, pos, t, b->step), 0,
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
