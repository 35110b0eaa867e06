/*
 * The board's operating modes: persistence, display, accounting, compute
 * mode, virtualization, GPU operation mode (GOM) and MIG.
 *
 * Each mode is a profile field (after overrides), read through the call
 * helpers of call.c; the enums' words are tables here, looked up by
 * mock_enum_field.  Apart from devices.c because a mode is configuration,
 * not identity: these calls are guarded (a lost GPU fails them).  The
 * MIG mode is the state's (the profile's, changed by nvmlDeviceSetMigMode);
 * the rest of MIG (instances, MIG device handles) is mig*.c's (mig.h).
 */
#include "mock.h"

/* The enum outputs below are written through `unsigned *` (see
 * struct mock_enum_name); these hold that for the types involved. */
_Static_assert(sizeof(nvmlComputeMode_t) == sizeof(unsigned), "compute mode size");
_Static_assert(sizeof(nvmlGpuVirtualizationMode_t) == sizeof(unsigned), "virt. mode size");
_Static_assert(sizeof(nvmlGpuOperationMode_t) == sizeof(unsigned), "GOM size");

/* ------------------------------------------------------------------- modes */

MOCK_API nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    return mock_enable_field(device, MOCK_GUARDED, "persistence_mode", mode);
}

/* Removed in the 580 drivers (deprecation.c); display active stays. */
MOCK_API nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t device, nvmlEnableState_t *display)
{
    return mock_enable_field_removable(device, MOCK_DEPRECATED_DISPLAY_MODE, "display.mode",
                                       display);
}

MOCK_API nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t device, nvmlEnableState_t *isActive)
{
    return mock_enable_field(device, MOCK_GUARDED, "display.active", isActive);
}

MOCK_API nvmlReturn_t nvmlDeviceGetAccountingMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    return mock_enable_field(device, MOCK_GUARDED, "accounting.mode", mode);
}

MOCK_API nvmlReturn_t nvmlDeviceGetAccountingBufferSize(nvmlDevice_t device,
                                                        unsigned int *bufferSize)
{
    return mock_uint_field(device, MOCK_GUARDED, "accounting.buffer_size", bufferSize);
}

static const struct mock_enum_name COMPUTE_MODES[] = {
    {"default", NVML_COMPUTEMODE_DEFAULT},
    {"exclusive_thread", NVML_COMPUTEMODE_EXCLUSIVE_THREAD},
    {"prohibited", NVML_COMPUTEMODE_PROHIBITED},
    {"exclusive_process", NVML_COMPUTEMODE_EXCLUSIVE_PROCESS},
};

MOCK_API nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode)
{
    return mock_enum_field(device, MOCK_GUARDED, "compute_mode", COMPUTE_MODES,
                           MOCK_COUNT(COMPUTE_MODES), NVML_COMPUTEMODE_DEFAULT, (unsigned *)mode);
}

static const struct mock_enum_name VIRTUALIZATION_MODES[] = {
    {"none", NVML_GPU_VIRTUALIZATION_MODE_NONE},
    {"passthrough", NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH},
    {"pass-through", NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH},
    {"vgpu", NVML_GPU_VIRTUALIZATION_MODE_VGPU},
    {"host_vgpu", NVML_GPU_VIRTUALIZATION_MODE_HOST_VGPU},
    {"host_vsga", NVML_GPU_VIRTUALIZATION_MODE_HOST_VSGA},
};

MOCK_API nvmlReturn_t nvmlDeviceGetVirtualizationMode(nvmlDevice_t device,
                                                      nvmlGpuVirtualizationMode_t *pVirtualMode)
{
    return mock_enum_field(device, MOCK_GUARDED, "virtualization.mode", VIRTUALIZATION_MODES,
                           MOCK_COUNT(VIRTUALIZATION_MODES), NVML_GPU_VIRTUALIZATION_MODE_NONE,
                           (unsigned *)pVirtualMode);
}

MOCK_API nvmlReturn_t nvmlDeviceGetGpuOperationMode(nvmlDevice_t device,
                                                    nvmlGpuOperationMode_t *current,
                                                    nvmlGpuOperationMode_t *pending)
{
    static const struct mock_enum_name modes[] = {
        {"all_on", NVML_GOM_ALL_ON}, {"compute", NVML_GOM_COMPUTE}, {"low_dp", NVML_GOM_LOW_DP}};
    /* NVIDIA's order: the handle and the board's support come first, and
     * either output may be NULL (nvidia-smi asks for one mode at a time,
     * passing NULL for the other); only both NULL is an invalid call. */
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    unsigned cur, pend;
    /* GOM exists only on some boards: no (known) current mode, no GOM. */
    if (!mock_enum_lookup(mock_dev_get(c.cfg, c.pos, "gpu_operation_mode.current"), modes,
                          MOCK_COUNT(modes), &cur)) {
        r = NVML_ERROR_NOT_SUPPORTED;
    } else if (current == NULL && pending == NULL) {
        r = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        if (!mock_enum_lookup(mock_dev_get(c.cfg, c.pos, "gpu_operation_mode.pending"), modes,
                              MOCK_COUNT(modes), &pend))
            pend = cur;
        if (current != NULL)
            *current = (nvmlGpuOperationMode_t)cur;
        if (pending != NULL)
            *pending = (nvmlGpuOperationMode_t)pend;
    }
    mock_end(&c);
    return r;
}

/* --------------------------------------------------------------------- MIG */

MOCK_API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                           unsigned int *pendingMode)
{
    if (currentMode == NULL || pendingMode == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    int current, pending;
    /* No `mig` block: the board is not MIG capable (GFD reads NOT_SUPPORTED so). */
    nvmlReturn_t r = mock_mode_pair(device, "mig.mode_current", "mig.mode_pending", &current,
                                    &pending);
    if (r == NVML_SUCCESS) {
        *currentMode = current ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
        *pendingMode = pending ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    }
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    if (mock_dev_get(c.cfg, c.pos, "mig.mode_current") == NULL)
        r = NVML_ERROR_NOT_SUPPORTED;
    else if (!mock_dev_uint(c.cfg, c.pos, "mig.max_gpu_instances", count))
        *count = 0;
    mock_end(&c);
    return r;
}

/* MIG device handles: mig_devices.c. */
