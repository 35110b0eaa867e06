/*
 * Device handles, visibility, identity and operating modes.
 *
 * A handle is the address of a slot in a static table, one slot per
 * position in the engine config, so handles stay valid across config
 * re-reads and need no allocation.  Visibility follows the /dev/nvidia<minor>
 * nodes the process can see, the way a pod given one GPU sees one: when some
 * but not all are present, only those devices are enumerated (and numbered
 * from 0); when all or none are present, nothing is filtered.
 * MOCK_NVML_DEV_DIR points the check at another directory (tests).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "mock.h"

static struct nvmlDevice_st g_handles[MOCK_MAX_DEVICES];

nvmlDevice_t mock_handle(unsigned pos)
{
    return pos < MOCK_MAX_DEVICES ? &g_handles[pos] : NULL;
}

int mock_handle_pos(nvmlDevice_t device, unsigned *pos)
{
    uintptr_t base = (uintptr_t)g_handles, p = (uintptr_t)device;
    if (device == NULL || p < base || p >= base + sizeof g_handles)
        return 0;
    *pos = (unsigned)(device - g_handles);
    return 1;
}

void mock_compute_visibility(struct mock_config *cfg)
{
    const char *dir = getenv("MOCK_NVML_DEV_DIR");
    if (dir == NULL || *dir == '\0')
        dir = "/dev";
    int present[MOCK_MAX_DEVICES] = {0};
    unsigned npresent = 0;
    for (unsigned pos = 0; pos < cfg->device_count; pos++) {
        unsigned minor = pos;
        mock_dev_uint(cfg, pos, "minor", &minor);
        char path[4200];
        struct stat st;
        int n = snprintf(path, sizeof path, "%s/nvidia%u", dir, minor);
        if (n > 0 && (size_t)n < sizeof path && stat(path, &st) == 0) {
            present[pos] = 1;
            npresent++;
        }
    }
    int filter = npresent > 0 && npresent < cfg->device_count;
    cfg->visible_count = 0;
    for (unsigned pos = 0; pos < MOCK_MAX_DEVICES; pos++)
        cfg->ordinal[pos] = -1;
    for (unsigned pos = 0; pos < cfg->device_count; pos++) {
        if (filter && !present[pos])
            continue;
        cfg->ordinal[pos] = (int)cfg->visible_count;
        cfg->visible[cfg->visible_count++] = pos;
    }
}

nvmlReturn_t mock_begin(struct mock_call *call, nvmlDevice_t device, enum mock_guard guard)
{
    call->cfg = mock_acquire();
    if (call->cfg == NULL)
        return NVML_ERROR_UNINITIALIZED;
    if (!mock_handle_pos(device, &call->pos) || call->pos >= call->cfg->device_count) {
        mock_end(call);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (guard == MOCK_GUARDED) {
        nvmlReturn_t r = mock_failure_check(call->cfg, call->pos);
        if (r != NVML_SUCCESS) {
            mock_end(call);
            return r;
        }
    }
    return NVML_SUCCESS;
}

void mock_end(struct mock_call *call)
{
    mock_release(call->cfg);
    call->cfg = NULL;
}

int mock_find_bus_id(const struct mock_config *cfg, const char *bus_id, unsigned *pos)
{
    unsigned domain, bus, slot, function = 0;
    /* Accept "DDDDDDDD:BB:SS.F", "DDDD:BB:SS.F" and "BB:SS.F", any case. */
    if (sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &slot, &function) < 3) {
        domain = 0;
        if (sscanf(bus_id, "%x:%x.%x", &bus, &slot, &function) < 2)
            return 0;
    }
    for (unsigned i = 0; i < cfg->visible_count; i++) {
        unsigned p = cfg->visible[i], d, b, s, f;
        if (mock_dev_uint(cfg, p, "pci.domain", &d) && mock_dev_uint(cfg, p, "pci.bus", &b) &&
            mock_dev_uint(cfg, p, "pci.slot", &s) && mock_dev_uint(cfg, p, "pci.function", &f) &&
            d == domain && b == bus && s == slot && f == function) {
            *pos = p;
            return 1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------ enumeration */

MOCK_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    if (deviceCount == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_config *cfg = mock_acquire();
    if (cfg == NULL)
        return NVML_ERROR_UNINITIALIZED;
    *deviceCount = cfg->visible_count;
    mock_release(cfg);
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

MOCK_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_config *cfg = mock_acquire();
    if (cfg == NULL)
        return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t r = NVML_ERROR_INVALID_ARGUMENT;
    if (index < cfg->visible_count) {
        *device = mock_handle(cfg->visible[index]);
        r = NVML_SUCCESS;
    }
    mock_release(cfg);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

MOCK_API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (uuid == NULL || device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_config *cfg = mock_acquire();
    if (cfg == NULL)
        return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t r = NVML_ERROR_NOT_FOUND;
    for (unsigned i = 0; i < cfg->visible_count; i++) {
        const char *value = mock_dev_get(cfg, cfg->visible[i], "uuid");
        if (value != NULL && strcasecmp(value, uuid) == 0) {
            *device = mock_handle(cfg->visible[i]);
            r = NVML_SUCCESS;
            break;
        }
    }
    mock_release(cfg);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetHandleByUUIDV(const nvmlUUID_t *uuid, nvmlDevice_t *device)
{
    if (uuid == NULL || uuid->type != NVML_UUID_TYPE_ASCII)
        return uuid == NULL ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED;
    char text[sizeof uuid->value.str + 1];
    memcpy(text, uuid->value.str, sizeof uuid->value.str);
    text[sizeof uuid->value.str] = '\0';
    return nvmlDeviceGetHandleByUUID(text, device);
}

MOCK_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    if (pciBusId == NULL || device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_config *cfg = mock_acquire();
    if (cfg == NULL)
        return NVML_ERROR_UNINITIALIZED;
    unsigned pos;
    nvmlReturn_t r = NVML_ERROR_NOT_FOUND;
    if (mock_find_bus_id(cfg, pciBusId, &pos)) {
        *device = mock_handle(pos);
        r = NVML_SUCCESS;
    }
    mock_release(cfg);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

MOCK_API nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *device)
{
    if (serial == NULL || device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_config *cfg = mock_acquire();
    if (cfg == NULL)
        return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t r = NVML_ERROR_NOT_FOUND;
    for (unsigned i = 0; i < cfg->visible_count; i++) {
        const char *value = mock_dev_get(cfg, cfg->visible[i], "serial");
        if (value != NULL && strcmp(value, serial) == 0) {
            *device = mock_handle(cfg->visible[i]);
            r = NVML_SUCCESS;
            break;
        }
    }
    mock_release(cfg);
    return r;
}

/* ---------------------------------------------------------------- identity */

/* A device string field copied out NVML style. */
static nvmlReturn_t string_field(nvmlDevice_t device, enum mock_guard guard, const char *field,
                                 char *buf, unsigned int length)
{
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, guard);
    if (r != NVML_SUCCESS)
        return r;
    r = mock_copy_out(mock_dev_get(c.cfg, c.pos, field), buf, length);
    mock_end(&c);
    return r;
}

/* A device unsigned field; NOT_SUPPORTED when the config has none. */
static nvmlReturn_t uint_field(nvmlDevice_t device, enum mock_guard guard, const char *field,
                               unsigned int *out)
{
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, guard);
    if (r != NVML_SUCCESS)
        return r;
    if (!mock_dev_uint(c.cfg, c.pos, field, out))
        r = NVML_ERROR_NOT_SUPPORTED;
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    return string_field(device, MOCK_IDENTITY, "name", name, length);
}

MOCK_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    return string_field(device, MOCK_IDENTITY, "uuid", uuid, length);
}

MOCK_API nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    return string_field(device, MOCK_IDENTITY, "serial", serial, length);
}

MOCK_API nvmlReturn_t nvmlDeviceGetBoardPartNumber(nvmlDevice_t device, char *partNumber,
                                                   unsigned int length)
{
    return string_field(device, MOCK_GUARDED, "board_part_number", partNumber, length);
}

MOCK_API nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char *version,
                                                unsigned int length)
{
    return string_field(device, MOCK_GUARDED, "vbios_version", version, length);
}

MOCK_API nvmlReturn_t nvmlDeviceGetInforomImageVersion(nvmlDevice_t device, char *version,
                                                       unsigned int length)
{
    return string_field(device, MOCK_GUARDED, "inforom.image_version", version, length);
}

MOCK_API nvmlReturn_t nvmlDeviceGetInforomVersion(nvmlDevice_t device, nvmlInforomObject_t object,
                                                  char *version, unsigned int length)
{
    static const char *const fields[] = {
        [NVML_INFOROM_OEM] = "inforom.oem_object",
        [NVML_INFOROM_ECC] = "inforom.ecc_object",
        [NVML_INFOROM_POWER] = "inforom.pwr_object",
    };
    if ((unsigned)object >= sizeof fields / sizeof *fields || fields[object] == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    const char *value = mock_dev_get(c.cfg, c.pos, fields[object]);
    if (value != NULL && strcasecmp(value, "N/A") == 0)
        value = NULL; /* the profile spells "not present" as N/A */
    r = mock_copy_out(value, version, length);
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetGspFirmwareVersion(nvmlDevice_t device, char *version)
{
    /* NVIDIA documents the buffer as NVML_GSP_FIRMWARE_VERSION_BUF_SIZE (0x40). */
    return string_field(device, MOCK_GUARDED, "gsp_firmware.version", version, 0x40);
}

MOCK_API nvmlReturn_t nvmlDeviceGetGspFirmwareMode(nvmlDevice_t device, unsigned int *isEnabled,
                                                   unsigned int *defaultMode)
{
    if (isEnabled == NULL || defaultMode == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    int enabled;
    if (mock_dev_bool(c.cfg, c.pos, "gsp_firmware.mode", &enabled)) {
        *isEnabled = (unsigned)enabled;
        *defaultMode = (unsigned)enabled;
    } else {
        r = NVML_ERROR_NOT_SUPPORTED;
    }
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    return uint_field(device, MOCK_IDENTITY, "minor", minorNumber);
}

MOCK_API nvmlReturn_t nvmlDeviceGetBoardId(nvmlDevice_t device, unsigned int *boardId)
{
    return uint_field(device, MOCK_GUARDED, "board_id", boardId);
}

MOCK_API nvmlReturn_t nvmlDeviceGetModuleId(nvmlDevice_t device, unsigned int *moduleId)
{
    return uint_field(device, MOCK_GUARDED, "module_id", moduleId);
}

MOCK_API nvmlReturn_t nvmlDeviceGetNumGpuCores(nvmlDevice_t device, unsigned int *numCores)
{
    return uint_field(device, MOCK_GUARDED, "num_gpu_cores", numCores);
}

MOCK_API nvmlReturn_t nvmlDeviceGetMemoryBusWidth(nvmlDevice_t device, unsigned int *busWidth)
{
    return uint_field(device, MOCK_GUARDED, "memory.memory_bus_width", busWidth);
}

MOCK_API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    if (index == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_IDENTITY);
    if (r != NVML_SUCCESS)
        return r;
    if (c.cfg->ordinal[c.pos] < 0)
        r = NVML_ERROR_NOT_FOUND;
    else
        *index = (unsigned)c.cfg->ordinal[c.pos];
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t *type)
{
    static const struct {
        const char *name;
        nvmlBrandType_t brand;
    } brands[] = {
        {"nvidia", NVML_BRAND_NVIDIA},   {"tesla", NVML_BRAND_TESLA},
        {"quadro", NVML_BRAND_QUADRO},   {"geforce", NVML_BRAND_GEFORCE},
        {"titan", NVML_BRAND_TITAN},     {"nvidia_rtx", NVML_BRAND_NVIDIA_RTX},
        {"quadro_rtx", NVML_BRAND_QUADRO_RTX}, {"geforce_rtx", NVML_BRAND_GEFORCE_RTX},
        {"titan_rtx", NVML_BRAND_TITAN_RTX},   {"grid", NVML_BRAND_GRID},
        {"nvs", NVML_BRAND_NVS},
    };
    if (type == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_IDENTITY);
    if (r != NVML_SUCCESS)
        return r;
    *type = NVML_BRAND_UNKNOWN;
    const char *value = mock_dev_get(c.cfg, c.pos, "brand");
    for (size_t i = 0; value != NULL && i < sizeof brands / sizeof *brands; i++)
        if (strcasecmp(value, brands[i].name) == 0)
            *type = brands[i].brand;
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch)
{
    static const char *const names[] = {
        [NVML_DEVICE_ARCH_KEPLER] = "kepler", [NVML_DEVICE_ARCH_MAXWELL] = "maxwell",
        [NVML_DEVICE_ARCH_PASCAL] = "pascal", [NVML_DEVICE_ARCH_VOLTA] = "volta",
        [NVML_DEVICE_ARCH_TURING] = "turing", [NVML_DEVICE_ARCH_AMPERE] = "ampere",
        [NVML_DEVICE_ARCH_ADA] = "ada",       [NVML_DEVICE_ARCH_HOPPER] = "hopper",
        [NVML_DEVICE_ARCH_BLACKWELL] = "blackwell",
    };
    if (arch == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_IDENTITY);
    if (r != NVML_SUCCESS)
        return r;
    *arch = NVML_DEVICE_ARCH_UNKNOWN;
    const char *value = mock_dev_get(c.cfg, c.pos, "architecture");
    for (unsigned i = 0; value != NULL && i < sizeof names / sizeof *names; i++)
        if (names[i] != NULL && strcasecmp(value, names[i]) == 0)
            *arch = i;
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major,
                                                         int *minor)
{
    if (major == NULL || minor == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_IDENTITY);
    if (r != NVML_SUCCESS)
        return r;
    if (!mock_dev_int(c.cfg, c.pos, "compute_capability.major", major) ||
        !mock_dev_int(c.cfg, c.pos, "compute_capability.minor", minor))
        r = NVML_ERROR_NOT_SUPPORTED;
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetMultiGpuBoard(nvmlDevice_t device, unsigned int *multiGpuBool)
{
    if (multiGpuBool == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r == NVML_SUCCESS) {
        *multiGpuBool = 0;
        mock_end(&c);
    }
    return r;
}

/* ------------------------------------------------------------------- modes */

/* An enable-state field ("enabled"/"disabled"/true/false). */
static nvmlReturn_t enable_field(nvmlDevice_t device, const char *field, nvmlEnableState_t *out)
{
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    int on;
    if (mock_dev_bool(c.cfg, c.pos, field, &on))
        *out = on ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    else
        r = NVML_ERROR_NOT_SUPPORTED;
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    return enable_field(device, "persistence_mode", mode);
}

MOCK_API nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t device, nvmlEnableState_t *display)
{
    return enable_field(device, "display.mode", display);
}

MOCK_API nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t device, nvmlEnableState_t *isActive)
{
    return enable_field(device, "display.active", isActive);
}

MOCK_API nvmlReturn_t nvmlDeviceGetAccountingMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    return enable_field(device, "accounting.mode", mode);
}

MOCK_API nvmlReturn_t nvmlDeviceGetAccountingBufferSize(nvmlDevice_t device,
                                                        unsigned int *bufferSize)
{
    return uint_field(device, MOCK_GUARDED, "accounting.buffer_size", bufferSize);
}

MOCK_API nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode)
{
    static const struct {
        const char *name;
        nvmlComputeMode_t mode;
    } modes[] = {
        {"default", NVML_COMPUTEMODE_DEFAULT},
        {"exclusive_thread", NVML_COMPUTEMODE_EXCLUSIVE_THREAD},
        {"prohibited", NVML_COMPUTEMODE_PROHIBITED},
        {"exclusive_process", NVML_COMPUTEMODE_EXCLUSIVE_PROCESS},
    };
    if (mode == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    *mode = NVML_COMPUTEMODE_DEFAULT;
    const char *value = mock_dev_get(c.cfg, c.pos, "compute_mode");
    for (size_t i = 0; value != NULL && i < sizeof modes / sizeof *modes; i++)
        if (strcasecmp(value, modes[i].name) == 0)
            *mode = modes[i].mode;
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetVirtualizationMode(nvmlDevice_t device,
                                                      nvmlGpuVirtualizationMode_t *pVirtualMode)
{
    static const struct {
        const char *name;
        nvmlGpuVirtualizationMode_t mode;
    } modes[] = {
        {"none", NVML_GPU_VIRTUALIZATION_MODE_NONE},
        {"passthrough", NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH},
        {"pass-through", NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH},
        {"vgpu", NVML_GPU_VIRTUALIZATION_MODE_VGPU},
        {"host_vgpu", NVML_GPU_VIRTUALIZATION_MODE_HOST_VGPU},
        {"host_vsga", NVML_GPU_VIRTUALIZATION_MODE_HOST_VSGA},
    };
    if (pVirtualMode == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    *pVirtualMode = NVML_GPU_VIRTUALIZATION_MODE_NONE;
    const char *value = mock_dev_get(c.cfg, c.pos, "virtualization.mode");
    for (size_t i = 0; value != NULL && i < sizeof modes / sizeof *modes; i++)
        if (strcasecmp(value, modes[i].name) == 0)
            *pVirtualMode = modes[i].mode;
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetGpuOperationMode(nvmlDevice_t device,
                                                    nvmlGpuOperationMode_t *current,
                                                    nvmlGpuOperationMode_t *pending)
{
    static const char *const names[] = {[NVML_GOM_ALL_ON] = "all_on",
                                        [NVML_GOM_COMPUTE] = "compute",
                                        [NVML_GOM_LOW_DP] = "low_dp"};
    if (current == NULL || pending == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    const char *cur = mock_dev_get(c.cfg, c.pos, "gpu_operation_mode.current");
    const char *pend = mock_dev_get(c.cfg, c.pos, "gpu_operation_mode.pending");
    int found = 0;
    for (unsigned i = 0; i < sizeof names / sizeof *names; i++) {
        if (cur != NULL && strcasecmp(cur, names[i]) == 0) {
            *current = (nvmlGpuOperationMode_t)i;
            *pending = (nvmlGpuOperationMode_t)i;
            found = 1;
        }
    }
    for (unsigned i = 0; found && i < sizeof names / sizeof *names; i++)
        if (pend != NULL && strcasecmp(pend, names[i]) == 0)
            *pending = (nvmlGpuOperationMode_t)i;
    if (!found)
        r = NVML_ERROR_NOT_SUPPORTED; /* GOM exists only on some boards */
    mock_end(&c);
    return r;
}

/* --------------------------------------------------------------------- MIG */

MOCK_API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                           unsigned int *pendingMode)
{
    if (currentMode == NULL || pendingMode == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    int current, pending;
    /* No `mig` block: the board is not MIG capable (GFD reads NOT_SUPPORTED so). */
    if (!mock_dev_bool(c.cfg, c.pos, "mig.mode_current", &current)) {
        r = NVML_ERROR_NOT_SUPPORTED;
    } else {
        if (!mock_dev_bool(c.cfg, c.pos, "mig.mode_pending", &pending))
            pending = current;
        /* MIG partitions are not simulated: report what the profile says
         * for the mode, but never hand out MIG device handles. */
        *currentMode = current ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
        *pendingMode = pending ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    }
    mock_end(&c);
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

MOCK_API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                          nvmlDevice_t *migDevice)
{
    (void)index;
    if (migDevice == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    mock_end(&c);
    /* No MIG devices exist: NOT_FOUND is what consumers iterate until. */
    return NVML_ERROR_NOT_FOUND;
}

MOCK_API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    if (isMigDevice == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_IDENTITY);
    if (r != NVML_SUCCESS)
        return r;
    *isMigDevice = 0;
    mock_end(&c);
    return r;
}
