/*
 * Power, temperature, fans, clocks, clock event reasons, performance state
 * and utilization: the telemetry a monitoring agent polls.
 *
 * Every value is a profile field (after overrides), so `mokka ctl temp`,
 * `power`, `clocks`, `util` and `pstate` change what running processes
 * read within a second.  A field the profile leaves out reads as
 * NOT_SUPPORTED, which nvidia-smi prints as N/A.
 */
#include <stdio.h>
#include <string.h>
#include <sys/time.h>

#include "mock.h"

/* ------------------------------------------------------------------- power */

MOCK_API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    return mock_uint_field(device, MOCK_GUARDED, "power.current_draw_mw", power);
}

MOCK_API nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    return mock_uint_field(device, MOCK_GUARDED, "power.enforced_limit_mw", limit);
}

MOCK_API nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    return mock_uint_field(device, MOCK_GUARDED, "power.enforced_limit_mw", limit);
}

MOCK_API nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device,
                                                               unsigned int *defaultLimit)
{
    return mock_uint_field(device, MOCK_GUARDED, "power.default_limit_mw", defaultLimit);
}

MOCK_API nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device,
                                                                   unsigned int *minLimit,
                                                                   unsigned int *maxLimit)
{
    if (minLimit == NULL || maxLimit == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    if (!mock_dev_uint(c.cfg, c.pos, "power.min_limit_mw", minLimit) ||
        !mock_dev_uint(c.cfg, c.pos, "power.max_limit_mw", maxLimit))
        r = NVML_ERROR_NOT_SUPPORTED;
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetPowerManagementMode(nvmlDevice_t device,
                                                       nvmlEnableState_t *mode)
{
    if (mode == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    int on = 1;
    if (!mock_dev_bool(c.cfg, c.pos, "power.management_mode", &on))
        mock_dev_bool(c.cfg, c.pos, "power.management_supported", &on);
    *mode = mock_enable_state(on);
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device,
                                                          unsigned long long *energy)
{
    return mock_u64_field(device, MOCK_GUARDED, "power.total_energy_consumption_mj", energy);
}

/* "P0".."P15" -> 0..15; NVML_PSTATE_UNKNOWN otherwise. */
static nvmlPstates_t parse_pstate(const char *value)
{
    unsigned n;
    if (value != NULL && (value[0] == 'P' || value[0] == 'p') && sscanf(value + 1, "%u", &n) == 1 &&
        n <= 15)
        return (nvmlPstates_t)n;
    return NVML_PSTATE_UNKNOWN;
}

static nvmlReturn_t pstate(nvmlDevice_t device, const char *field, nvmlPstates_t *out)
{
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    const char *value = mock_dev_get(c.cfg, c.pos, field);
    if (value == NULL)
        value = mock_dev_get(c.cfg, c.pos, "performance_state");
    *out = parse_pstate(value);
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, nvmlPstates_t *pState)
{
    return pstate(device, "performance_state", pState);
}

MOCK_API nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t device, nvmlPstates_t *pState)
{
    return pstate(device, "power.power_state", pState);
}

/* ------------------------------------------------------------- temperature */

MOCK_API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device,
                                               nvmlTemperatureSensors_t sensorType,
                                               unsigned int *temp)
{
    if (sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    return mock_uint_field(device, MOCK_GUARDED, "thermal.temperature_gpu_c", temp);
}

MOCK_API nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature)
{
    if (temperature == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (temperature->version != nvmlTemperature_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (temperature->sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    return mock_int_field(device, MOCK_GUARDED, "thermal.temperature_gpu_c",
                          &temperature->temperature);
}

/* The profile's key for each temperature threshold NVML names. */
static const char *const THRESHOLD_FIELDS[NVML_TEMPERATURE_THRESHOLD_COUNT] = {
    [NVML_TEMPERATURE_THRESHOLD_SHUTDOWN] = "thermal.shutdown_threshold_c",
    [NVML_TEMPERATURE_THRESHOLD_SLOWDOWN] = "thermal.slowdown_threshold_c",
    [NVML_TEMPERATURE_THRESHOLD_MEM_MAX] = "thermal.max_memory_operating_c",
    [NVML_TEMPERATURE_THRESHOLD_GPU_MAX] = "thermal.max_operating_c",
    [NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MIN] = "thermal.acoustic_min_c",
    /* The acoustic target nvidia-smi prints as "GPU Target Temperature". */
    [NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR] = "thermal.target_temperature_c",
    [NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MAX] = "thermal.acoustic_max_c",
    [NVML_TEMPERATURE_THRESHOLD_GPS_CURR] = "thermal.gps_current_c",
};

MOCK_API nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device,
                                                        nvmlTemperatureThresholds_t thresholdType,
                                                        unsigned int *temp)
{
    if ((unsigned)thresholdType >= MOCK_COUNT(THRESHOLD_FIELDS))
        return NVML_ERROR_INVALID_ARGUMENT; /* no such threshold */
    return mock_uint_field(device, MOCK_GUARDED, THRESHOLD_FIELDS[thresholdType], temp);
}

/* One more sensor of the board: reading TEMP, its limit the profile's LIMIT_FIELD (0 without). */
static void add_sensor(nvmlGpuThermalSettings_t *all, const struct mock_config *cfg, unsigned pos,
                       int temp, const char *limit_field, nvmlThermalTarget_t target)
{
    int max = 0;
    mock_dev_int(cfg, pos, limit_field, &max);
    all->sensor[all->count].controller = NVML_THERMAL_CONTROLLER_GPU_INTERNAL;
    all->sensor[all->count].defaultMinTemp = 0;
    all->sensor[all->count].defaultMaxTemp = max;
    all->sensor[all->count].currentTemp = temp;
    all->sensor[all->count].target = target;
    all->count++;
}

/* The board's thermal sensors: the GPU's own, and the memory's where the
 * profile reports a memory temperature.  Limits are the shutdown and the
 * memory's maximum operating temperature. */
static int thermal_sensors(const struct mock_config *cfg, unsigned pos, void *out)
{
    nvmlGpuThermalSettings_t all;
    int temp;
    memset(&all, 0, sizeof all);
    if (!mock_dev_int(cfg, pos, "thermal.temperature_gpu_c", &temp))
        return 0;
    add_sensor(&all, cfg, pos, temp, "thermal.shutdown_threshold_c", NVML_THERMAL_TARGET_GPU);
    if (mock_dev_int(cfg, pos, "thermal.temperature_memory_c", &temp))
        add_sensor(&all, cfg, pos, temp, "thermal.max_memory_operating_c",
                   NVML_THERMAL_TARGET_MEMORY);
    memcpy(out, &all, sizeof all);
    return 1;
}

MOCK_API nvmlReturn_t nvmlDeviceGetThermalSettings(nvmlDevice_t device, unsigned int sensorIndex,
                                                   nvmlGpuThermalSettings_t *pThermalSettings)
{
    if (pThermalSettings == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlGpuThermalSettings_t all;
    nvmlReturn_t r = mock_read(device, thermal_sensors, &all);
    if (r != NVML_SUCCESS)
        return r;
    if (sensorIndex == NVML_THERMAL_TARGET_ALL) {
        *pThermalSettings = all;
    } else if (sensorIndex < all.count) {
        /* One sensor, alone in the record. */
        memset(pThermalSettings, 0, sizeof *pThermalSettings);
        pThermalSettings->count = 1;
        pThermalSettings->sensor[0] = all.sensor[sensorIndex];
    } else {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlDeviceGetMarginTemperature(nvmlDevice_t device,
                                                     nvmlMarginTemperature_t *marginTempInfo)
{
    if (marginTempInfo == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (marginTempInfo->version != nvmlMarginTemperature_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    /* The distance to the slowdown threshold ("T.Limit" in nvidia-smi). */
    return mock_int_field(device, MOCK_GUARDED, "thermal.tlimit_c",
                          &marginTempInfo->marginTemperature);
}

/* -------------------------------------------------------------------- fans */

MOCK_API nvmlReturn_t nvmlDeviceGetNumFans(nvmlDevice_t device, unsigned int *numFans)
{
    if (numFans == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    if (!mock_dev_uint(c.cfg, c.pos, "fan.count", numFans))
        *numFans = 0; /* SXM boards are cooled by the chassis */
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t device, unsigned int fan,
                                               unsigned int *speed)
{
    if (speed == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    unsigned fans = 0;
    mock_dev_uint(c.cfg, c.pos, "fan.count", &fans);
    if (fans == 0)
        r = NVML_ERROR_NOT_SUPPORTED;
    else if (fan >= fans)
        r = NVML_ERROR_INVALID_ARGUMENT;
    else if (!mock_dev_uint(c.cfg, c.pos, "fan.speed_percent", speed))
        r = NVML_ERROR_NOT_SUPPORTED;
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed)
{
    return nvmlDeviceGetFanSpeed_v2(device, 0, speed);
}

/* ------------------------------------------------------------------ clocks */

/* Which figure of a clock: clocks.<kind>_<which> in the profile. */
enum clock_which { CLOCK_CURRENT, CLOCK_MAX, CLOCK_APP, CLOCK_APP_DEFAULT, CLOCK_WHICH_COUNT };

/* Every key spelled out (kind from the clock type, then which figure), so
 * a call formats none.  SM and graphics share one clock domain on these
 * boards: an SM figure the profile lacks is the graphics one. */
static const char *const CLOCK_FIELDS[][CLOCK_WHICH_COUNT] = {
    [NVML_CLOCK_GRAPHICS] = {"clocks.graphics_current", "clocks.graphics_max",
                             "clocks.graphics_app", "clocks.graphics_app_default"},
    [NVML_CLOCK_SM] = {"clocks.sm_current", "clocks.sm_max", "clocks.sm_app",
                       "clocks.sm_app_default"},
    [NVML_CLOCK_MEM] = {"clocks.memory_current", "clocks.memory_max", "clocks.memory_app",
                        "clocks.memory_app_default"},
    [NVML_CLOCK_VIDEO] = {"clocks.video_current", "clocks.video_max", "clocks.video_app",
                          "clocks.video_app_default"},
};

static nvmlReturn_t clock_value(nvmlDevice_t device, nvmlClockType_t type,
                                enum clock_which which, unsigned int *clock)
{
    if ((unsigned)type >= MOCK_COUNT(CLOCK_FIELDS) || clock == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    if (!mock_dev_uint(c.cfg, c.pos, CLOCK_FIELDS[type][which], clock) &&
        (type != NVML_CLOCK_SM ||
         !mock_dev_uint(c.cfg, c.pos, CLOCK_FIELDS[NVML_CLOCK_GRAPHICS][which], clock)))
        r = NVML_ERROR_NOT_SUPPORTED;
    mock_end(&c);
    return r;
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
    return clock_value(device, clockType, CLOCK_APP, clockMHz);
}

MOCK_API nvmlReturn_t nvmlDeviceGetDefaultApplicationsClock(nvmlDevice_t device,
                                                            nvmlClockType_t clockType,
                                                            unsigned int *clockMHz)
{
    return clock_value(device, clockType, CLOCK_APP_DEFAULT, clockMHz);
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

/* Spelled out whole: formatting each key on every call would cost more
 * than the rest of the call. */
static const struct {
    const char *field;
    unsigned long long bit;
} g_reasons[] = {
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

/* The clocks event reasons active now: the profile's, with the ones
 * readings move (idle, power cap, slowdowns) as dynamics.c derives them,
 * unless an override set them.  One reading for all of them. */
static unsigned long long active_reasons(const struct mock_config *cfg, unsigned pos)
{
    struct mock_readings now;
    mock_readings_at(cfg, pos, MOCK_READING_NOW, &now);
    unsigned long long derived = now.active ? MOCK_READING_REASONS & ~now.pinned_reasons : 0;
    unsigned long long reasons = now.reasons & derived;
    for (size_t i = 0; i < MOCK_COUNT(g_reasons); i++) {
        int on = 0;
        if (!(g_reasons[i].bit & derived) &&
            mock_parse_bool(mock_dev_get(cfg, pos, g_reasons[i].field), &on) && on)
            reasons |= g_reasons[i].bit;
    }
    return reasons;
}

MOCK_API nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                             unsigned long long *reasons)
{
    if (reasons == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    *reasons = active_reasons(c.cfg, c.pos);
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
    unsigned long long all = 0;
    for (size_t i = 0; i < MOCK_COUNT(g_reasons); i++)
        all |= g_reasons[i].bit;
    return mock_constant_u64(device, MOCK_GUARDED, all, reasons);
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

MOCK_API nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t device,
                                                   nvmlPerfPolicyType_t perfPolicyType,
                                                   nvmlViolationTime_t *violTime)
{
    if (violTime == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    size_t p = 0;
    while (p < MOCK_COUNT(g_policies) && g_policies[p].policy != perfPolicyType)
        p++;
    if (p == MOCK_COUNT(g_policies))
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    /* ns per second while one of the policy's reasons is active */
    double rate = (active_reasons(c.cfg, c.pos) & g_policies[p].reasons) ? 1e9 : 0;
    violTime->violationTime =
        (unsigned long long)mock_meter_read(g_policies[p].meter, c.pos, rate, NULL);
    struct timeval now;
    gettimeofday(&now, NULL);
    violTime->referenceTime = (unsigned long long)now.tv_sec * 1000000ULL + (unsigned)now.tv_usec;
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

/* ------------------------------------------------------------- utilization */

MOCK_API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                    nvmlUtilization_t *utilization)
{
    if (utilization == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    utilization->gpu = 0;
    utilization->memory = 0;
    if (!mock_dev_uint(c.cfg, c.pos, "utilization.gpu", &utilization->gpu))
        r = NVML_ERROR_NOT_SUPPORTED;
    mock_dev_uint(c.cfg, c.pos, "utilization.memory", &utilization->memory);
    mock_end(&c);
    return r;
}

/* Encoder/decoder/JPEG/OFA utilization with NVML's sampling period. */
static nvmlReturn_t engine_utilization(nvmlDevice_t device, const char *field,
                                       unsigned int *utilization,
                                       unsigned int *samplingPeriodUs)
{
    if (samplingPeriodUs == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = mock_uint_field(device, MOCK_GUARDED, field, utilization);
    if (r == NVML_SUCCESS)
        *samplingPeriodUs = 167000; /* what the driver reports on idle boards */
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device,
                                                      unsigned int *utilization,
                                                      unsigned int *samplingPeriodUs)
{
    return engine_utilization(device, "utilization.encoder", utilization, samplingPeriodUs);
}

MOCK_API nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device,
                                                      unsigned int *utilization,
                                                      unsigned int *samplingPeriodUs)
{
    return engine_utilization(device, "utilization.decoder", utilization, samplingPeriodUs);
}

MOCK_API nvmlReturn_t nvmlDeviceGetJpgUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                  unsigned int *samplingPeriodUs)
{
    return engine_utilization(device, "utilization.jpeg", utilization, samplingPeriodUs);
}

MOCK_API nvmlReturn_t nvmlDeviceGetOfaUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                  unsigned int *samplingPeriodUs)
{
    return engine_utilization(device, "utilization.ofa", utilization, samplingPeriodUs);
}

/* Session statistics of the encoder (`encoder_stats`) or frame buffer
 * capture (`fbc_stats`) blocks. */
static nvmlReturn_t session_stats(nvmlDevice_t device, const char *block, unsigned int *sessions,
                                  unsigned int *fps, unsigned int *latency)
{
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    char field[64];
    *sessions = *fps = *latency = 0;
    snprintf(field, sizeof field, "%s.session_count", block);
    if (!mock_dev_uint(c.cfg, c.pos, field, sessions))
        r = NVML_ERROR_NOT_SUPPORTED;
    snprintf(field, sizeof field, "%s.average_fps", block);
    mock_dev_uint(c.cfg, c.pos, field, fps);
    snprintf(field, sizeof field, "%s.average_latency_us", block);
    mock_dev_uint(c.cfg, c.pos, field, latency);
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetEncoderStats(nvmlDevice_t device, unsigned int *sessionCount,
                                                unsigned int *averageFps,
                                                unsigned int *averageLatency)
{
    if (sessionCount == NULL || averageFps == NULL || averageLatency == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return session_stats(device, "encoder_stats", sessionCount, averageFps, averageLatency);
}

MOCK_API nvmlReturn_t nvmlDeviceGetEncoderSessions(nvmlDevice_t device, unsigned int *sessionCount,
                                                   nvmlEncoderSessionInfo_t *sessionInfos)
{
    (void)sessionInfos;
    /* No encoder sessions on a simulated GPU. */
    return mock_constant_uint(device, MOCK_GUARDED, 0, sessionCount);
}

MOCK_API nvmlReturn_t nvmlDeviceGetFBCStats(nvmlDevice_t device, nvmlFBCStats_t *fbcStats)
{
    if (fbcStats == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return session_stats(device, "fbc_stats", &fbcStats->sessionsCount, &fbcStats->averageFPS,
                         &fbcStats->averageLatency);
}

MOCK_API nvmlReturn_t nvmlDeviceGetFBCSessions(nvmlDevice_t device, unsigned int *sessionCount,
                                               nvmlFBCSessionInfo_t *sessionInfo)
{
    (void)sessionInfo;
    /* No frame buffer capture sessions either. */
    return mock_constant_uint(device, MOCK_GUARDED, 0, sessionCount);
}
