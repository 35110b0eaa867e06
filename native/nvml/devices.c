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
 *
 * Getters answer through the call helpers of call.c; the enums' words are
 * tables here, looked up by mock_enum_field.
 */
#include <pthread.h>
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

/* The first visible device whose string `field` equals `wanted` under
 * `compare` (strcmp or strcasecmp: the identifiers differ in that). */
static nvmlReturn_t handle_by_string(const char *field, const char *wanted,
                                     int (*compare)(const char *, const char *),
                                     nvmlDevice_t *device)
{
    if (wanted == NULL || device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_config *cfg = mock_acquire();
    if (cfg == NULL)
        return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t r = NVML_ERROR_NOT_FOUND;
    for (unsigned i = 0; i < cfg->visible_count; i++) {
        const char *value = mock_dev_get(cfg, cfg->visible[i], field);
        if (value != NULL && compare(value, wanted) == 0) {
            *device = mock_handle(cfg->visible[i]);
            r = NVML_SUCCESS;
            break;
        }
    }
    mock_release(cfg);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    /* UUIDs are hex: clients spell them in either case. */
    return handle_by_string("uuid", uuid, strcasecmp, device);
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
    return handle_by_string("serial", serial, strcmp, device);
}

/* ---------------------------------------------------------------- identity */

MOCK_API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    return mock_string_field(device, MOCK_IDENTITY, "name", name, length);
}

MOCK_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    return mock_string_field(device, MOCK_IDENTITY, "uuid", uuid, length);
}

MOCK_API nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    return mock_string_field(device, MOCK_IDENTITY, "serial", serial, length);
}

MOCK_API nvmlReturn_t nvmlDeviceGetBoardPartNumber(nvmlDevice_t device, char *partNumber,
                                                   unsigned int length)
{
    return mock_string_field(device, MOCK_GUARDED, "board_part_number", partNumber, length);
}

MOCK_API nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char *version,
                                                unsigned int length)
{
    return mock_string_field(device, MOCK_GUARDED, "vbios_version", version, length);
}

MOCK_API nvmlReturn_t nvmlDeviceGetInforomImageVersion(nvmlDevice_t device, char *version,
                                                       unsigned int length)
{
    return mock_string_field(device, MOCK_GUARDED, "inforom.image_version", version, length);
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

/* The node's boot time (seconds since the epoch, `btime` of /proc/stat):
 * the driver loads at boot, and the black box's flush is timed from there.
 * Read once per process; 0 when /proc/stat has no boot time. */
static unsigned long long g_boot_time;
static pthread_once_t g_boot_time_once = PTHREAD_ONCE_INIT;

static void read_boot_time(void)
{
    FILE *f = fopen("/proc/stat", "re");
    if (f == NULL)
        return;
    char line[256];
    unsigned long long btime;
    while (fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "btime %llu", &btime) == 1) {
            g_boot_time = btime;
            break;
        }
    }
    fclose(f);
}

/* The InfoROM black box (BBX) is flushed once after the driver loads, so
 * real boards report the same instant, hours old, until the next boot (H100
 * and GB200 captures: a few minutes apart per GPU, tens of milliseconds
 * long).  The profile says when, after boot (`inforom.bbx_flush_after_boot_ms`),
 * and how long (`inforom.bbx_flush_duration_us`); a board whose driver
 * answers N/A (A100, B200 captures) has neither: NOT_SUPPORTED.  Before that
 * instant the flush has not happened yet: NOT_READY, as NVML documents.  The
 * timestamp is in microseconds since the epoch, as nvidia-smi prints it. */
struct bbx_flush {
    unsigned long long timestamp_us;
    unsigned long duration_us;
    int ready;
};

static int read_bbx_flush(const struct mock_config *cfg, unsigned pos, void *out)
{
    struct bbx_flush *flush = out;
    unsigned long long after_boot_ms, duration_us;
    if (!mock_dev_u64(cfg, pos, "inforom.bbx_flush_after_boot_ms", &after_boot_ms) ||
        !mock_dev_u64(cfg, pos, "inforom.bbx_flush_duration_us", &duration_us))
        return 0;
    if (after_boot_ms > 0xFFFFFFFFULL || duration_us > 0xFFFFFFFFULL) {
        mock_debug("LastBBXFlushTime: device %u: inforom.bbx_flush_* out of range", pos);
        return 0;
    }
    pthread_once(&g_boot_time_once, read_boot_time);
    if (g_boot_time == 0) {
        mock_debug("LastBBXFlushTime: /proc/stat has no boot time");
        return 0;
    }
    unsigned long long at_ms = g_boot_time * 1000ULL + after_boot_ms;
    flush->ready = mock_reading_time() * 1000.0 >= (double)at_ms;
    flush->timestamp_us = at_ms * 1000ULL;
    flush->duration_us = (unsigned long)duration_us;
    return 1;
}

MOCK_API nvmlReturn_t nvmlDeviceGetLastBBXFlushTime(nvmlDevice_t device,
                                                    unsigned long long *timestamp,
                                                    unsigned long *durationUs)
{
    if (timestamp == NULL || durationUs == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct bbx_flush flush;
    nvmlReturn_t r = mock_read(device, read_bbx_flush, &flush);
    if (r != NVML_SUCCESS)
        return r;
    if (!flush.ready)
        return NVML_ERROR_NOT_READY;
    *timestamp = flush.timestamp_us;
    *durationUs = flush.duration_us;
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlDeviceGetGspFirmwareVersion(nvmlDevice_t device, char *version)
{
    /* NVIDIA documents the buffer as NVML_GSP_FIRMWARE_VERSION_BUF_SIZE (0x40). */
    return mock_string_field(device, MOCK_GUARDED, "gsp_firmware.version", version, 0x40);
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
    return mock_uint_field(device, MOCK_IDENTITY, "minor", minorNumber);
}

MOCK_API nvmlReturn_t nvmlDeviceGetBoardId(nvmlDevice_t device, unsigned int *boardId)
{
    return mock_uint_field(device, MOCK_GUARDED, "board_id", boardId);
}

MOCK_API nvmlReturn_t nvmlDeviceGetModuleId(nvmlDevice_t device, unsigned int *moduleId)
{
    return mock_uint_field(device, MOCK_GUARDED, "module_id", moduleId);
}

MOCK_API nvmlReturn_t nvmlDeviceGetNumGpuCores(nvmlDevice_t device, unsigned int *numCores)
{
    return mock_uint_field(device, MOCK_GUARDED, "num_gpu_cores", numCores);
}

MOCK_API nvmlReturn_t nvmlDeviceGetMemoryBusWidth(nvmlDevice_t device, unsigned int *busWidth)
{
    return mock_uint_field(device, MOCK_GUARDED, "memory.memory_bus_width", busWidth);
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

/* The enum outputs below are written through `unsigned *` (see
 * struct mock_enum_name); these hold that for the types involved. */
_Static_assert(sizeof(nvmlBrandType_t) == sizeof(unsigned), "brand is not unsigned-sized");
_Static_assert(sizeof(nvmlComputeMode_t) == sizeof(unsigned), "compute mode size");
_Static_assert(sizeof(nvmlGpuVirtualizationMode_t) == sizeof(unsigned), "virt. mode size");
_Static_assert(sizeof(nvmlGpuOperationMode_t) == sizeof(unsigned), "GOM size");

static const struct mock_enum_name BRANDS[] = {
    {"nvidia", NVML_BRAND_NVIDIA},         {"tesla", NVML_BRAND_TESLA},
    {"quadro", NVML_BRAND_QUADRO},         {"geforce", NVML_BRAND_GEFORCE},
    {"titan", NVML_BRAND_TITAN},           {"nvidia_rtx", NVML_BRAND_NVIDIA_RTX},
    {"quadro_rtx", NVML_BRAND_QUADRO_RTX}, {"geforce_rtx", NVML_BRAND_GEFORCE_RTX},
    {"titan_rtx", NVML_BRAND_TITAN_RTX},   {"grid", NVML_BRAND_GRID},
    {"nvs", NVML_BRAND_NVS},
};

MOCK_API nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t *type)
{
    return mock_enum_field(device, MOCK_IDENTITY, "brand", BRANDS, MOCK_COUNT(BRANDS),
                           NVML_BRAND_UNKNOWN, (unsigned *)type);
}

static const struct mock_enum_name ARCHITECTURES[] = {
    {"kepler", NVML_DEVICE_ARCH_KEPLER}, {"maxwell", NVML_DEVICE_ARCH_MAXWELL},
    {"pascal", NVML_DEVICE_ARCH_PASCAL}, {"volta", NVML_DEVICE_ARCH_VOLTA},
    {"turing", NVML_DEVICE_ARCH_TURING}, {"ampere", NVML_DEVICE_ARCH_AMPERE},
    {"ada", NVML_DEVICE_ARCH_ADA},       {"hopper", NVML_DEVICE_ARCH_HOPPER},
    {"blackwell", NVML_DEVICE_ARCH_BLACKWELL},
};

MOCK_API nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch)
{
    return mock_enum_field(device, MOCK_IDENTITY, "architecture", ARCHITECTURES,
                           MOCK_COUNT(ARCHITECTURES), NVML_DEVICE_ARCH_UNKNOWN, arch);
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
    return mock_constant_uint(device, MOCK_GUARDED, 0, multiGpuBool);
}

/* ------------------------------------------------------------------- modes */

MOCK_API nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    return mock_enable_field(device, MOCK_GUARDED, "persistence_mode", mode);
}

MOCK_API nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t device, nvmlEnableState_t *display)
{
    return mock_enable_field(device, MOCK_GUARDED, "display.mode", display);
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
        /* MIG partitions are not simulated: report what the profile says
         * for the mode, but never hand out MIG device handles. */
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
    return mock_constant_uint(device, MOCK_IDENTITY, 0, isMigDevice);
}
