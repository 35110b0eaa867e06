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

MOCK_API nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device,
                                                        nvmlTemperatureThresholds_t thresholdType,
                                                        unsigned int *temp)
{
    switch (thresholdType) {
    case NVML_TEMPERATURE_THRESHOLD_SHUTDOWN:
        return mock_uint_field(device, MOCK_GUARDED, "thermal.shutdown_threshold_c", temp);
    case NVML_TEMPERATURE_THRESHOLD_SLOWDOWN:
        return mock_uint_field(device, MOCK_GUARDED, "thermal.slowdown_threshold_c", temp);
    case NVML_TEMPERATURE_THRESHOLD_MEM_MAX:
        return mock_uint_field(device, MOCK_GUARDED, "thermal.max_memory_operating_c", temp);
    case NVML_TEMPERATURE_THRESHOLD_GPU_MAX:
        return mock_uint_field(device, MOCK_GUARDED, "thermal.max_operating_c", temp);
    default:
        return mock_uint_field(device, MOCK_GUARDED, "thermal.unsupported_threshold", temp);
    }
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

/* clocks.<kind>_<suffix>, kind from the clock type. */
static const char *clock_kind(nvmlClockType_t type)
{
    switch (type) {
    case NVML_CLOCK_GRAPHICS: return "graphics";
    case NVML_CLOCK_SM: return "sm";
    case NVML_CLOCK_MEM: return "memory";
    case NVML_CLOCK_VIDEO: return "video";
    default: return NULL;
    }
}

static nvmlReturn_t clock_value(nvmlDevice_t device, nvmlClockType_t type, const char *suffix,
                                unsigned int *clock)
{
    const char *kind = clock_kind(type);
    if (kind == NULL || clock == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    char field[64];
    snprintf(field, sizeof field, "clocks.%s_%s", kind, suffix);
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    if (!mock_dev_uint(c.cfg, c.pos, field, clock)) {
        /* SM and graphics share one clock domain on these boards. */
        if (type == NVML_CLOCK_SM) {
            snprintf(field, sizeof field, "clocks.graphics_%s", suffix);
            if (!mock_dev_uint(c.cfg, c.pos, field, clock))
                r = NVML_ERROR_NOT_SUPPORTED;
        } else {
            r = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                             unsigned int *clock)
{
    return clock_value(device, type, "current", clock);
}

MOCK_API nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                                unsigned int *clock)
{
    return clock_value(device, type, "max", clock);
}

MOCK_API nvmlReturn_t nvmlDeviceGetApplicationsClock(nvmlDevice_t device,
                                                     nvmlClockType_t clockType,
                                                     unsigned int *clockMHz)
{
    return clock_value(device, clockType, "app", clockMHz);
}

MOCK_API nvmlReturn_t nvmlDeviceGetDefaultApplicationsClock(nvmlDevice_t device,
                                                            nvmlClockType_t clockType,
                                                            unsigned int *clockMHz)
{
    return clock_value(device, clockType, "app_default", clockMHz);
}

MOCK_API nvmlReturn_t nvmlDeviceGetMaxCustomerBoostClock(nvmlDevice_t device,
                                                         nvmlClockType_t clockType,
                                                         unsigned int *clockMHz)
{
    return clock_value(device, clockType, "max", clockMHz);
}

MOCK_API nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t device, nvmlClockType_t clockType,
                                         nvmlClockId_t clockId, unsigned int *clockMHz)
{
    switch (clockId) {
    case NVML_CLOCK_ID_CURRENT: return clock_value(device, clockType, "current", clockMHz);
    case NVML_CLOCK_ID_APP_CLOCK_TARGET: return clock_value(device, clockType, "app", clockMHz);
    case NVML_CLOCK_ID_APP_CLOCK_DEFAULT:
        return clock_value(device, clockType, "app_default", clockMHz);
    case NVML_CLOCK_ID_CUSTOMER_BOOST_MAX: return clock_value(device, clockType, "max", clockMHz);
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

static const struct {
    const char *field;
    unsigned long long bit;
} g_reasons[] = {
    {"gpu_idle", nvmlClocksEventReasonGpuIdle},
    {"applications_clocks_setting", nvmlClocksEventReasonApplicationsClocksSetting},
    {"sw_power_cap", nvmlClocksEventReasonSwPowerCap},
    {"hw_slowdown", nvmlClocksThrottleReasonHwSlowdown},
    {"sync_boost", nvmlClocksEventReasonSyncBoost},
    {"sw_thermal_slowdown", nvmlClocksEventReasonSwThermalSlowdown},
    {"hw_thermal_slowdown", nvmlClocksThrottleReasonHwThermalSlowdown},
    {"hw_power_brake_slowdown", nvmlClocksThrottleReasonHwPowerBrakeSlowdown},
    {"display_clocks_setting", nvmlClocksEventReasonDisplayClockSetting},
};

MOCK_API nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                             unsigned long long *reasons)
{
    if (reasons == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    *reasons = 0;
    for (size_t i = 0; i < MOCK_COUNT(g_reasons); i++) {
        char field[96];
        int on = 0;
        snprintf(field, sizeof field, "clocks_throttle_reasons.%s", g_reasons[i].field);
        if (mock_dev_bool(c.cfg, c.pos, field, &on) && on)
            *reasons |= g_reasons[i].bit;
    }
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
