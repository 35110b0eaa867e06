/*
 * System-level queries: versions, process names, units, excluded devices,
 * and the platform info of a device (its module id).
 *
 * Versions come from the profile's `system` block: GFD derives its
 * driver and CUDA labels from these, nvidia-smi prints them in its header
 * ("CUDA Version" = cuda_driver_version as major.minor, 12020 -> 12.2).
 */
#include <stdio.h>
#include <string.h>

#include "mock.h"

static nvmlReturn_t system_string(const char *key, char *version, unsigned int length)
{
    struct mock_config *cfg = mock_acquire();
    if (cfg == NULL)
        return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t r = mock_copy_out(mock_cfg_get(cfg, key), version, length);
    mock_release(cfg);
    return r;
}

MOCK_API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    return system_string("system.driver_version", version, length);
}

MOCK_API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    return system_string("system.nvml_version", version, length);
}

MOCK_API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    /* NVML's integer form: major * 1000 + minor * 10. */
    if (cudaDriverVersion == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_config *cfg = mock_acquire();
    if (cfg == NULL)
        return NVML_ERROR_UNINITIALIZED;
    unsigned long long v;
    nvmlReturn_t r = NVML_ERROR_NOT_SUPPORTED;
    if (mock_cfg_u64(cfg, "system.cuda_driver_version", &v) && v <= 0x7fffffff) {
        *cudaDriverVersion = (int)v;
        r = NVML_SUCCESS;
    }
    mock_release(cfg);
    return r;
}

MOCK_API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion_v2(cudaDriverVersion);
}

MOCK_API nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length)
{
    if (name == NULL || length == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_config *cfg = mock_acquire();
    if (cfg == NULL)
        return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t r = NVML_ERROR_NOT_FOUND;
    /* The processes the profile lists, then the pods holding GPUs. */
    for (unsigned pos = 0; pos < cfg->device_count && r == NVML_ERROR_NOT_FOUND; pos++) {
        unsigned count = 0;
        mock_dev_list_len(cfg, pos, "processes", &count);
        for (unsigned i = 0; i < count; i++) {
            char field[64];
            unsigned p;
            snprintf(field, sizeof field, "processes.%u.pid", i);
            if (!mock_dev_uint(cfg, pos, field, &p) || p != pid)
                continue;
            snprintf(field, sizeof field, "processes.%u.name", i);
            const char *value = mock_dev_get(cfg, pos, field);
            /* NVML truncates the name to the buffer rather than failing. */
            mock_truncate_copy(value ? value : "", name, length);
            r = NVML_SUCCESS;
            break;
        }
    }
    /* and the containers pods run on them (workload.c) */
    if (r == NVML_ERROR_NOT_FOUND && mock_workload_process_name(cfg, pid, name, length))
        r = NVML_SUCCESS;
    mock_release(cfg);
    return r;
}

/* A count of hardware a simulated node never has, which NVML still
 * answers only after nvmlInit. */
static nvmlReturn_t none_after_init(unsigned int *count)
{
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = mock_require_init();
    if (r == NVML_SUCCESS)
        *count = 0;
    return r;
}

MOCK_API nvmlReturn_t nvmlSystemGetHicVersion(unsigned int *hwbcCount, nvmlHwbcEntry_t *hwbcEntries)
{
    (void)hwbcEntries;
    return none_after_init(hwbcCount); /* no host interface cards on data center boards */
}

MOCK_API nvmlReturn_t nvmlUnitGetCount(unsigned int *unitCount)
{
    return none_after_init(unitCount); /* S-class units are long gone */
}

MOCK_API nvmlReturn_t nvmlGetExcludedDeviceCount(unsigned int *deviceCount)
{
    if (deviceCount == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = 0;
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlDeviceGetPlatformInfo(nvmlDevice_t device, nvmlPlatformInfo_t *platformInfo)
{
    if (platformInfo == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* v1 (the 535 header's) and v2 share one 44-byte layout; the mock
     * fills neither's rack/chassis bytes, so both are answered alike. */
    if (platformInfo->version != nvmlPlatformInfo_v2 &&
        platformInfo->version != nvmlPlatformInfo_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    unsigned module;
    if (!mock_dev_uint(c.cfg, c.pos, "module_id", &module)) {
        r = NVML_ERROR_NOT_SUPPORTED;
    } else {
        memset((char *)platformInfo + sizeof platformInfo->version, 0,
               sizeof *platformInfo - sizeof platformInfo->version);
        platformInfo->moduleId = (unsigned char)module;
    }
    mock_end(&c);
    return r;
}
