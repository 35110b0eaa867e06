/*
 * Thermal: the GPU temperature, the thresholds, the thermal sensors, the
 * margin to the slowdown point (T.Limit) and the fans.
 *
 * Every value is a profile field (after overrides), so `mokka ctl temp`
 * changes what running processes read within a second; the GPU
 * temperature of a busy board is the reading readings.c serves.  A field
 * the profile leaves out reads as NOT_SUPPORTED (nvidia-smi: N/A); the
 * acoustic and GPS targets only exist where the profile has them.
 */
#include <string.h>

#include "mock.h"

/* ------------------------------------------------------------- temperature */

MOCK_API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device,
                                               nvmlTemperatureSensors_t sensorType,
                                               unsigned int *temp)
{
    if (sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    return mock_uint_key(device, MOCK_GUARDED, MOCK_KEY_TEMPERATURE_GPU, temp);
}

MOCK_API nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature)
{
    if (temperature == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (temperature->version != nvmlTemperature_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (temperature->sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    return mock_int_key(device, MOCK_GUARDED, MOCK_KEY_TEMPERATURE_GPU,
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
