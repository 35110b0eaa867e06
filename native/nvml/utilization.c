/*
 * Utilization: the GPU and memory utilization rates, the media engines'
 * utilization, and the encoder and frame buffer capture statistics.
 *
 * Every value is a profile field (after overrides), so `mokka ctl util`
 * changes what running processes read within a second; a busy board's
 * rates are the readings readings.c serves, read together in one call.
 * No sessions exist on a simulated GPU.  A MIG device reports no
 * utilization, as a real one does not (NOT_SUPPORTED).
 */
#include <stdio.h>

#include "mock.h"

/* ------------------------------------------------------------- utilization */

/* One reading for both figures: a busy board's derived ones, else the
 * profile's (what mock_dev_uint would answer for each, at half the cost). */
static int read_utilization(const struct mock_config *cfg, unsigned pos, void *out)
{
    nvmlUtilization_t *utilization = out;
    struct mock_readings now;
    mock_readings_at(cfg, pos, MOCK_READING_NOW, &now);
    if (now.active) {
        utilization->gpu = now.util_gpu;
        utilization->memory = now.util_memory;
        return 1;
    }
    const struct mock_value *gpu = mock_key_value(cfg, pos, MOCK_KEY_UTIL_GPU);
    const struct mock_value *memory = mock_key_value(cfg, pos, MOCK_KEY_UTIL_MEMORY);
    if (!gpu->has_u64 || gpu->u64 > 0xffffffffULL)
        return 0;
    utilization->gpu = (unsigned)gpu->u64;
    utilization->memory =
        memory->has_u64 && memory->u64 <= 0xffffffffULL ? (unsigned)memory->u64 : 0;
    return 1;
}

/* 1 for a MIG device handle, with *r its answer: a real MIG device reports
 * no utilization (NOT_SUPPORTED; dcgm's profiling metrics are the way), or
 * INVALID_ARGUMENT once its compute instance is gone. */
static int mig_device(nvmlDevice_t device, nvmlReturn_t *r)
{
    struct mock_mig_info mig;
    if (!mock_mig_info(device, &mig, r))
        return 0;
    if (*r == NVML_SUCCESS)
        *r = NVML_ERROR_NOT_SUPPORTED;
    return 1;
}

MOCK_API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                    nvmlUtilization_t *utilization)
{
    nvmlReturn_t r;
    if (utilization == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (mig_device(device, &r))
        return r;
    return mock_read(device, read_utilization, utilization);
}

/* Encoder/decoder/JPEG/OFA utilization with NVML's sampling period. */
static nvmlReturn_t engine_utilization(nvmlDevice_t device, const char *field,
                                       unsigned int *utilization,
                                       unsigned int *samplingPeriodUs)
{
    nvmlReturn_t r;
    if (samplingPeriodUs == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (mig_device(device, &r))
        return r;
    r = mock_uint_field(device, MOCK_GUARDED, field, utilization);
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
