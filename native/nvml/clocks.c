/*
 * Clocks: current, maximum and application clocks, the supported clock
 * lists, the clocks event reasons, the violation status those reasons
 * drive, and auto boost.
 *
 * Every figure is a profile field (after overrides), so `mokka ctl
 * clocks` changes what running processes read within a second; the SM and
 * graphics clocks and the reasons of a busy board are the readings
 * readings.c serves.  Apart from power.c and thermal.c because the clock
 * figures share one lookup table (CLOCK_KEYS) and the reasons drive the
 * violation meters; nothing else here is shared.
 */
#include <stdio.h>

#include "mock.h"

/* ------------------------------------------------------------------ clocks */

/* Which figure of a clock: clocks.<kind>_<which> in the profile. */
enum clock_which { CLOCK_CURRENT, CLOCK_MAX, CLOCK_APP, CLOCK_APP_DEFAULT, CLOCK_WHICH_COUNT };

/* Every field by key (kind from the clock type, then which figure), so a
 * call looks up none.  SM and graphics share one clock domain on these
 * boards: an SM figure the profile lacks is the graphics one. */
static const enum mock_key CLOCK_KEYS[][CLOCK_WHICH_COUNT] = {
    [NVML_CLOCK_GRAPHICS] = {MOCK_KEY_CLOCK_GRAPHICS_CURRENT, MOCK_KEY_CLOCK_GRAPHICS_MAX,
                             MOCK_KEY_CLOCK_GRAPHICS_APP, MOCK_KEY_CLOCK_GRAPHICS_APP_DEFAULT},
    [NVML_CLOCK_SM] = {MOCK_KEY_CLOCK_SM_CURRENT, MOCK_KEY_CLOCK_SM_MAX, MOCK_KEY_CLOCK_SM_APP,
                       MOCK_KEY_CLOCK_SM_APP_DEFAULT},
    [NVML_CLOCK_MEM] = {MOCK_KEY_CLOCK_MEMORY_CURRENT, MOCK_KEY_CLOCK_MEMORY_MAX,
                        MOCK_KEY_CLOCK_MEMORY_APP, MOCK_KEY_CLOCK_MEMORY_APP_DEFAULT},
    [NVML_CLOCK_VIDEO] = {MOCK_KEY_CLOCK_VIDEO_CURRENT, MOCK_KEY_CLOCK_VIDEO_MAX,
                          MOCK_KEY_CLOCK_VIDEO_APP, MOCK_KEY_CLOCK_VIDEO_APP_DEFAULT},
};

/* One figure of a clock; `removed` names the call when a driver branch
 * removed it (the applications clocks getters, deprecation.c), else
 * MOCK_DEPRECATED_NONE. */
static nvmlReturn_t removable_clock_value(nvmlDevice_t device, nvmlClockType_t type,
                                         enum clock_which which,
                                         enum mock_deprecated_call removed, unsigned int *clock)
{
    if ((unsigned)type >= MOCK_COUNT(CLOCK_KEYS) || clock == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = removed == MOCK_DEPRECATED_NONE
                         ? mock_begin(&c, device, MOCK_GUARDED)
                         : mock_begin_unless_deprecated(&c, device, MOCK_GUARDED, removed);
    if (r != NVML_SUCCESS)
        return r;
    if (!mock_key_uint(c.cfg, c.pos, CLOCK_KEYS[type][which], clock) &&
        (type != NVML_CLOCK_SM ||
         !mock_key_uint(c.cfg, c.pos, CLOCK_KEYS[NVML_CLOCK_GRAPHICS][which], clock)))
        r = NVML_ERROR_NOT_SUPPORTED;
    mock_end(&c);
    return r;
}

static nvmlReturn_t clock_value(nvmlDevice_t device, nvmlClockType_t type,
                                enum clock_which which, unsigned int *clock)
{
    return removable_clock_value(device, type, which, MOCK_DEPRECATED_NONE, clock);
}

MOCK_API nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                             unsigned int *clock)
{
    return clock_value(device, type, CLOCK_CURRENT, clock);
}

MOCK_API nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                                unsigned int *clock)
{
    return clock_value(device, type, CLOCK_MAX, clock);
}

MOCK_API nvmlReturn_t nvmlDeviceGetApplicationsClock(nvmlDevice_t device,
                                                     nvmlClockType_t clockType,
                                                     unsigned int *clockMHz)
{
    return removable_clock_value(device, clockType, CLOCK_APP, MOCK_DEPRECATED_APPLICATIONS_CLOCK,
                                 clockMHz);
}

MOCK_API nvmlReturn_t nvmlDeviceGetDefaultApplicationsClock(nvmlDevice_t device,
                                                            nvmlClockType_t clockType,
                                                            unsigned int *clockMHz)
{
    return removable_clock_value(device, clockType, CLOCK_APP_DEFAULT,
                                 MOCK_DEPRECATED_DEFAULT_APPLICATIONS_CLOCK, clockMHz);
}

MOCK_API nvmlReturn_t nvmlDeviceGetMaxCustomerBoostClock(nvmlDevice_t device,
                                                         nvmlClockType_t clockType,
                                                         unsigned int *clockMHz)
{
    return clock_value(device, clockType, CLOCK_MAX, clockMHz);
}

MOCK_API nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t device, nvmlClockType_t clockType,
                                         nvmlClockId_t clockId, unsigned int *clockMHz)
{
    switch (clockId) {
    case NVML_CLOCK_ID_CURRENT: return clock_value(device, clockType, CLOCK_CURRENT, clockMHz);
    case NVML_CLOCK_ID_APP_CLOCK_TARGET: return clock_value(device, clockType, CLOCK_APP, clockMHz);
    case NVML_CLOCK_ID_APP_CLOCK_DEFAULT:
        return clock_value(device, clockType, CLOCK_APP_DEFAULT, clockMHz);
    case NVML_CLOCK_ID_CUSTOMER_BOOST_MAX:
        return clock_value(device, clockType, CLOCK_MAX, clockMHz);
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

/* Copies a config list (<base>.count, <base>.<i>) of clocks out NVML style. */
static nvmlReturn_t clock_list(const struct mock_config *cfg, unsigned pos, const char *base,
                               unsigned int *count, unsigned int *out)
{
    char field[160];
    unsigned n;
    if (!mock_dev_list_len(cfg, pos, base, &n))
        return NVML_ERROR_NOT_SUPPORTED;
    if (out == NULL || *count < n) {
        *count = n;
        return out == NULL && n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) {
        snprintf(field, sizeof field, "%s.%u", base, i);
        out[i] = 0;
        mock_dev_uint(cfg, pos, field, &out[i]);
    }
    *count = n;
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlDeviceGetSupportedMemoryClocks(nvmlDevice_t device, unsigned int *count,
                                                         unsigned int *clocksMHz)
{
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    unsigned n;
    if (!mock_dev_list_len(c.cfg, c.pos, "supported_clocks.memory_clocks", &n)) {
        r = NVML_ERROR_NOT_SUPPORTED;
    } else if (clocksMHz == NULL || *count < n) {
        *count = n;
        r = NVML_ERROR_INSUFFICIENT_SIZE;
    } else {
        for (unsigned i = 0; i < n; i++) {
            char field[96];
            snprintf(field, sizeof field, "supported_clocks.memory_clocks.%u.freq_mhz", i);
            clocksMHz[i] = 0;
            mock_dev_uint(c.cfg, c.pos, field, &clocksMHz[i]);
        }
        *count = n;
    }
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetSupportedGraphicsClocks(nvmlDevice_t device,
                                                           unsigned int memoryClockMHz,
                                                           unsigned int *count,
                                                           unsigned int *clocksMHz)
{
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    unsigned n = 0;
    r = NVML_ERROR_NOT_SUPPORTED;
    mock_dev_list_len(c.cfg, c.pos, "supported_clocks.memory_clocks", &n);
    for (unsigned i = 0; i < n; i++) {
        char field[96];
        unsigned freq;
        snprintf(field, sizeof field, "supported_clocks.memory_clocks.%u.freq_mhz", i);
        if (mock_dev_uint(c.cfg, c.pos, field, &freq) && freq == memoryClockMHz) {
            snprintf(field, sizeof field, "supported_clocks.memory_clocks.%u.graphics_clocks", i);
            r = clock_list(c.cfg, c.pos, field, count, clocksMHz);
            break;
        }
        r = NVML_ERROR_INVALID_ARGUMENT; /* a memory clock the board does not have */
    }
    mock_end(&c);
    return r;
}

/* ----------------------------------------------------- clock event reasons */

/* The profile's reasons, with the ones readings move as dynamics.c derives
 * them (mock_reasons_now). */
MOCK_API nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                             unsigned long long *reasons)
{
    if (reasons == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    *reasons = mock_reasons_now(c.cfg, c.pos);
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                                unsigned long long *reasons)
{
    return nvmlDeviceGetCurrentClocksEventReasons(device, reasons);
}

MOCK_API nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t device,
                                                               unsigned long long *reasons)
{
    return mock_constant_u64(device, MOCK_GUARDED, mock_reasons_supported(), reasons);
}

MOCK_API nvmlReturn_t nvmlDeviceGetSupportedClocksThrottleReasons(nvmlDevice_t device,
                                                                  unsigned long long *reasons)
{
    return nvmlDeviceGetSupportedClocksEventReasons(device, reasons);
}

/* ------------------------------------------------------- violation status */

/* The clocks event reasons that hold the clocks down for each policy; the
 * time a policy has been violated grows while one of them is active (a
 * meter, see meters.c). */
static const struct {
    nvmlPerfPolicyType_t policy;
    enum mock_meter meter;
    unsigned long long reasons;
} g_policies[] = {
    {NVML_PERF_POLICY_POWER, MOCK_METER_VIOLATION_POWER, nvmlClocksEventReasonSwPowerCap},
    {NVML_PERF_POLICY_THERMAL, MOCK_METER_VIOLATION_THERMAL,
     nvmlClocksEventReasonSwThermalSlowdown | nvmlClocksThrottleReasonHwThermalSlowdown},
    {NVML_PERF_POLICY_SYNC_BOOST, MOCK_METER_VIOLATION_SYNC_BOOST, nvmlClocksEventReasonSyncBoost},
    {NVML_PERF_POLICY_BOARD_LIMIT, MOCK_METER_VIOLATION_BOARD_LIMIT,
     nvmlClocksThrottleReasonHwSlowdown | nvmlClocksThrottleReasonHwPowerBrakeSlowdown},
    {NVML_PERF_POLICY_LOW_UTILIZATION, MOCK_METER_VIOLATION_LOW_UTILIZATION,
     nvmlClocksEventReasonGpuIdle},
    {NVML_PERF_POLICY_RELIABILITY, MOCK_METER_VIOLATION_RELIABILITY, 0},
    {NVML_PERF_POLICY_TOTAL_APP_CLOCKS, MOCK_METER_VIOLATION_TOTAL_APP_CLOCKS,
     nvmlClocksEventReasonSwPowerCap | nvmlClocksEventReasonSwThermalSlowdown |
         nvmlClocksThrottleReasonHwThermalSlowdown | nvmlClocksEventReasonSyncBoost |
         nvmlClocksThrottleReasonHwSlowdown | nvmlClocksThrottleReasonHwPowerBrakeSlowdown |
         nvmlClocksEventReasonGpuIdle},
    {NVML_PERF_POLICY_TOTAL_BASE_CLOCKS, MOCK_METER_VIOLATION_TOTAL_BASE_CLOCKS,
     nvmlClocksEventReasonSwPowerCap | nvmlClocksEventReasonSwThermalSlowdown |
         nvmlClocksThrottleReasonHwThermalSlowdown | nvmlClocksThrottleReasonHwSlowdown |
         nvmlClocksThrottleReasonHwPowerBrakeSlowdown},
};

/* The policy's row of g_policies; MOCK_COUNT(g_policies) for none. */
static size_t policy_row(nvmlPerfPolicyType_t policy)
{
    size_t p = 0;
    while (p < MOCK_COUNT(g_policies) && g_policies[p].policy != policy)
        p++;
    return p;
}

/* The violation time and the instant it is for (*at): the call's clock
 * (mock_call_clock, wall-clock ns), which the violation meters count on. */
static int violation_at(const struct mock_config *cfg, unsigned pos, nvmlPerfPolicyType_t policy,
                        unsigned long long *ns, unsigned long long *at)
{
    size_t p = policy_row(policy);
    if (p == MOCK_COUNT(g_policies))
        return 0;
    /* ns per second while one of the policy's reasons is active */
    double rate = (mock_reasons_now(cfg, pos) & g_policies[p].reasons) ? 1e9 : 0;
    *ns = (unsigned long long)mock_meter_read(g_policies[p].meter, pos, rate, at);
    return 1;
}

int mock_violation_ns(const struct mock_config *cfg, unsigned pos, nvmlPerfPolicyType_t policy,
                      unsigned long long *ns)
{
    return violation_at(cfg, pos, policy, ns, NULL);
}

MOCK_API nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t device,
                                                   nvmlPerfPolicyType_t perfPolicyType,
                                                   nvmlViolationTime_t *violTime)
{
    if (violTime == NULL || policy_row(perfPolicyType) == MOCK_COUNT(g_policies))
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    unsigned long long at;
    violation_at(c.cfg, c.pos, perfPolicyType, &violTime->violationTime, &at);
    violTime->referenceTime = at / 1000ULL; /* microseconds since the epoch */
    mock_end(&c);
    return r;
}

/* --------------------------------------------------------------- boosting */

MOCK_API nvmlReturn_t nvmlDeviceGetAutoBoostedClocksEnabled(nvmlDevice_t device,
                                                            nvmlEnableState_t *isEnabled,
                                                            nvmlEnableState_t *defaultIsEnabled)
{
    /* Data center boards have no auto boost (nvidia-smi prints N/A); a
     * profile of a board that has it says so in `clocks.auto_boost`. */
    if (isEnabled == NULL || defaultIsEnabled == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    int on, default_on;
    if (!mock_dev_bool(c.cfg, c.pos, "clocks.auto_boost", &on)) {
        r = NVML_ERROR_NOT_SUPPORTED;
    } else {
        if (!mock_dev_bool(c.cfg, c.pos, "clocks.auto_boost_default", &default_on))
            default_on = on;
        *isEnabled = mock_enable_state(on);
        *defaultIsEnabled = mock_enable_state(default_on);
    }
    mock_end(&c);
    return r;
}
