/*
 * The processes running on a GPU (nvmlDevice*RunningProcesses, every
 * record version).
 *
 * Two sources, listed in this order: the profile's own `processes` list
 * (compute or graphics by its `type`), then one compute process per
 * container holding the GPU (workload.c), read without a lock.  Apart from
 * memory.c because listing processes (two sources, NVML's caller-sized
 * array, three record layouts) shares nothing with the memory figures.
 */
#include <stdio.h>

#include "mock.h"

enum process_kind { PROCESS_COMPUTE, PROCESS_GRAPHICS };

/* Where the holders of a GPU go: v1 or v2 records from index `first` on. */
struct held_out {
    nvmlProcessInfo_v1_t *v1;
    nvmlProcessInfo_t *v2;
    unsigned first;
};

static void store_held(void *arg, unsigned i, unsigned pid, unsigned long long used)
{
    struct held_out *out = arg;
    if (out->v1 != NULL) {
        out->v1[out->first + i].pid = pid;
        out->v1[out->first + i].usedGpuMemory = used;
    } else {
        out->v2[out->first + i].pid = pid;
        out->v2[out->first + i].usedGpuMemory = used;
        out->v2[out->first + i].gpuInstanceId = 0xFFFFFFFFu; /* not a MIG device */
        out->v2[out->first + i].computeInstanceId = 0xFFFFFFFFu;
    }
}

/* Lists the configured processes of one kind into v1 or v2 records. */
static nvmlReturn_t running_processes(nvmlDevice_t device, enum process_kind kind,
                                      unsigned int *infoCount, nvmlProcessInfo_v1_t *v1,
                                      nvmlProcessInfo_t *v2)
{
    if (infoCount == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* The processes here run on the full GPU, none in a MIG device. */
    struct mock_mig_info mig;
    nvmlReturn_t r;
    if (mock_mig_info(device, &mig, &r)) {
        if (r == NVML_SUCCESS)
            *infoCount = 0;
        return r;
    }
    struct mock_call c;
    r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    unsigned total = 0, found = 0;
    /* most boards list none: one hashed lookup says so, no key to format */
    unsigned long long listed = 0;
    if (mock_parse_u64(mock_dev_get(c.cfg, c.pos, "processes.count"), &listed) && listed > 0)
        mock_dev_list_len(c.cfg, c.pos, "processes", &total);
    int want_output = (v1 != NULL || v2 != NULL) && *infoCount > 0;
    for (unsigned i = 0; i < total; i++) {
        char field[64];
        snprintf(field, sizeof field, "processes.%u.type", i);
        int graphics = mock_dev_is(c.cfg, c.pos, field, "graphics");
        if (graphics != (kind == PROCESS_GRAPHICS))
            continue;
        unsigned pid = 0;
        unsigned long long used = 0;
        snprintf(field, sizeof field, "processes.%u.pid", i);
        mock_dev_uint(c.cfg, c.pos, field, &pid);
        snprintf(field, sizeof field, "processes.%u.used_memory_bytes", i);
        mock_dev_u64(c.cfg, c.pos, field, &used);
        if (want_output && found < *infoCount) {
            if (v1 != NULL) {
                v1[found].pid = pid;
                v1[found].usedGpuMemory = used;
            } else {
                v2[found].pid = pid;
                v2[found].usedGpuMemory = used;
                v2[found].gpuInstanceId = 0xFFFFFFFFu; /* not a MIG device */
                v2[found].computeInstanceId = 0xFFFFFFFFu;
            }
        }
        found++;
    }
    /* Each container holding the GPU is one compute process (workload.c). */
    if (kind == PROCESS_COMPUTE) {
        struct held_out out = {v1, v2, found};
        unsigned room = want_output && found < *infoCount ? *infoCount - found : 0;
        found += mock_workload_pids(c.cfg, c.pos, room, store_held, &out);
    }
    if (found > *infoCount || (!want_output && found > 0))
        r = NVML_ERROR_INSUFFICIENT_SIZE;
    *infoCount = found;
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                              unsigned int *infoCount,
                                                              nvmlProcessInfo_t *infos)
{
    return running_processes(device, PROCESS_COMPUTE, infoCount, NULL, infos);
}

MOCK_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                              unsigned int *infoCount,
                                                              nvmlProcessInfo_v2_t *infos)
{
    return running_processes(device, PROCESS_COMPUTE, infoCount, NULL, infos);
}

MOCK_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                           unsigned int *infoCount,
                                                           nvmlProcessInfo_v1_t *infos)
{
    return running_processes(device, PROCESS_COMPUTE, infoCount, infos, NULL);
}

MOCK_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device,
                                                               unsigned int *infoCount,
                                                               nvmlProcessInfo_t *infos)
{
    return running_processes(device, PROCESS_GRAPHICS, infoCount, NULL, infos);
}

MOCK_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device,
                                                               unsigned int *infoCount,
                                                               nvmlProcessInfo_v2_t *infos)
{
    return running_processes(device, PROCESS_GRAPHICS, infoCount, NULL, infos);
}

MOCK_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device,
                                                            unsigned int *infoCount,
                                                            nvmlProcessInfo_v1_t *infos)
{
    return running_processes(device, PROCESS_GRAPHICS, infoCount, infos, NULL);
}

MOCK_API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device,
                                                                 unsigned int *infoCount,
                                                                 nvmlProcessInfo_t *infos)
{
    (void)infos;
    /* No MPS server runs on a simulated GPU. */
    return mock_constant_uint(device, MOCK_GUARDED, 0, infoCount);
}
