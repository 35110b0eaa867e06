/*
 * Device handles, visibility, enumeration and identity.
 *
 * A handle is the address of a slot in a static table, one slot per
 * position in the engine config, so handles stay valid across config
 * re-reads and need no allocation.  Visibility follows the /dev/nvidia<minor>
 * nodes the process can see, the way a pod given one GPU sees one: when some
 * but not all are present, only those devices are enumerated (and numbered
 * from 0); when all or none are present, nothing is filtered.
 * MOCK_NVML_DEV_DIR points the check at another directory (tests).  A GPU's
 * MIG devices follow the same rule by their capability nodes
 * (mig_devices.c).
 *
 * Identity is what names a board (name, UUID, serial, ids, brand,
 * architecture, compute capability); most of these calls still answer for
 * a lost GPU.  Getters answer through the call helpers of call.c; the enums'
 * words are tables here, looked up by mock_enum_field.  The board's
 * firmware (firmware.c) and its operating modes (modes.c) are files of
 * their own: nothing here is shared with them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "mig.h"

struct nvmlDevice_st mock_handles[MOCK_MAX_DEVICES];

nvmlDevice_t mock_handle(unsigned pos)
{
    return pos < MOCK_MAX_DEVICES ? &mock_handles[pos] : NULL;
}

int mock_dev_node_present(const char *name)
{
    const char *dir = getenv("MOCK_NVML_DEV_DIR");
    if (dir == NULL || *dir == '\0')
        dir = "/dev";
    char path[4200];
    struct stat st;
    int n = snprintf(path, sizeof path, "%s/%s", dir, name);
    return n > 0 && (size_t)n < sizeof path && stat(path, &st) == 0;
}

void mock_compute_visibility(struct mock_config *cfg)
{
    int present[MOCK_MAX_DEVICES] = {0};
    unsigned npresent = 0;
    for (unsigned pos = 0; pos < cfg->device_count; pos++) {
        unsigned minor = pos;
        mock_dev_uint(cfg, pos, "minor", &minor);
        char name[32];
        snprintf(name, sizeof name, "nvidia%u", minor);
        if (mock_dev_node_present(name)) {
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

int mock_parse_bus_id(const char *bus_id, unsigned *domain, unsigned *bus, unsigned *slot,
                      unsigned *function)
{
    /* NVIDIA's three formats (libnvidia-ml 535), each ending in %c so that
     * nothing may follow: "%x:%x:%x.%x", then "%x:%x:%x" (function 0), then
     * "%x:%x.%x" (domain 0).  So 00000000:64:00.0, 0000:64:00.0, 0:64:0.0,
     * 0:64:0 and 64:00.0 parse, any case; 64:00 or a trailing character do not. */
    char trailing;
    if (sscanf(bus_id, "%x:%x:%x.%x%c", domain, bus, slot, function, &trailing) == 4)
        return 1;
    if (sscanf(bus_id, "%x:%x:%x%c", domain, bus, slot, &trailing) == 3) {
        *function = 0;
        return 1;
    }
    if (sscanf(bus_id, "%x:%x.%x%c", bus, slot, function, &trailing) == 3) {
        *domain = 0;
        return 1;
    }
    return 0;
}

int mock_find_bus_id(const struct mock_config *cfg, const char *bus_id, unsigned *pos)
{
    unsigned domain, bus, slot, function;
    if (!mock_parse_bus_id(bus_id, &domain, &bus, &slot, &function))
        return 0;
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
    /* A MIG device's UUID (`MIG-...`) names its handle: nvidia-ctk and
     * nvidia-smi -q look MIG devices up by it. */
    nvmlReturn_t r;
    if (mock_mig_by_uuid(uuid, device, &r))
        return r;
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
    unsigned pos, domain, bus, slot, function;
    nvmlReturn_t r = NVML_ERROR_NOT_FOUND;
    if (!mock_parse_bus_id(pciBusId, &domain, &bus, &slot, &function)) {
        r = NVML_ERROR_INVALID_ARGUMENT; /* no bus id at all, as NVIDIA's parser says */
    } else if (mock_find_bus_id(cfg, pciBusId, &pos)) {
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
    nvmlReturn_t r;
    if (mock_mig_name(device, name, length, &r)) /* a MIG device (mig_devices.c) */
        return r;
    return mock_string_key(device, MOCK_IDENTITY, MOCK_KEY_NAME, name, length);
}

MOCK_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    nvmlReturn_t r;
    if (mock_mig_uuid(device, uuid, length, &r)) /* a MIG device (mig_devices.c) */
        return r;
    return mock_string_key(device, MOCK_IDENTITY, MOCK_KEY_UUID, uuid, length);
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

MOCK_API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    return mock_uint_key(device, MOCK_IDENTITY, MOCK_KEY_MINOR, minorNumber);
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
    /* A MIG device's index is its place under its GPU, as
     * nvmlDeviceGetMigDeviceHandleByIndex numbers it. */
    struct mock_mig_info mig;
    nvmlReturn_t mig_r;
    if (mock_mig_info(device, &mig, &mig_r)) {
        if (mig_r == NVML_SUCCESS)
            *index = mig.index;
        return mig_r;
    }
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

/* The brand is written through `unsigned *` (see struct mock_enum_name);
 * this holds that for its type. */
_Static_assert(sizeof(nvmlBrandType_t) == sizeof(unsigned), "brand is not unsigned-sized");

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
