/*
 * NVLink links, the GPU fabric identity, and the addressing mode.
 *
 * The engine config lists each device's links with their far end
 * (`nvlink.link.<l>.remote_type` = switch | gpu and, where the far end is
 * a PCI function on this node, `remote_bus_id`).  The fabric identity is
 * the profile's, with this node's ComputeDomain clique already folded in
 * by the daemon; state `auto` follows the fabric manager's readiness
 * marker, so GPUs report IN_PROGRESS until the fabric manager is up.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "mock.h"

unsigned mock_link_count(const struct mock_config *cfg, unsigned pos)
{
    unsigned n = 0;
    mock_dev_uint(cfg, pos, "nvlink.link_count", &n);
    return n > NVML_NVLINK_MAX_LINKS ? NVML_NVLINK_MAX_LINKS : n;
}

unsigned mock_nvswitch_link_count(const struct mock_config *cfg, unsigned pos)
{
    unsigned n = 0, links = mock_link_count(cfg, pos);
    for (unsigned l = 0; l < links; l++) {
        char field[64];
        snprintf(field, sizeof field, "nvlink.link.%u.remote_type", l);
        n += mock_dev_is(cfg, pos, field, "switch");
    }
    return n;
}

/* Starts a call on one link: INVALID_ARGUMENT beyond NVML's link range,
 * NOT_SUPPORTED for a link the board does not have. */
static nvmlReturn_t begin_link(struct mock_call *c, nvmlDevice_t device, unsigned link)
{
    if (link >= NVML_NVLINK_MAX_LINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = mock_begin(c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    if (link >= mock_link_count(c->cfg, c->pos)) {
        mock_end(c);
        return NVML_ERROR_NOT_SUPPORTED;
    }
    return NVML_SUCCESS;
}

/* A whole call for the link queries whose answer is the same for every
 * simulated link: it only checks the device and the link. */
static nvmlReturn_t check_link(nvmlDevice_t device, unsigned link)
{
    struct mock_call c;
    nvmlReturn_t r = begin_link(&c, device, link);
    if (r == NVML_SUCCESS)
        mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                               nvmlEnableState_t *isActive)
{
    if (isActive == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = check_link(device, link);
    if (r == NVML_SUCCESS)
        *isActive = NVML_FEATURE_ENABLED; /* every link the board has is up */
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link,
                                                 unsigned int *version)
{
    if (version == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = begin_link(&c, device, link);
    if (r != NVML_SUCCESS)
        return r;
    /* The NVLink generation, as the 535 driver reports it (4 on Hopper). */
    unsigned long long v = 0;
    if (!mock_cfg_u64(c.cfg, "nvlink.version", &v))
        r = NVML_ERROR_NOT_SUPPORTED;
    *version = (unsigned)v;
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetNvLinkCapability(nvmlDevice_t device, unsigned int link,
                                                    nvmlNvLinkCapability_t capability,
                                                    unsigned int *capResult)
{
    if (capResult == NULL || (unsigned)capability >= NVML_NVLINK_CAP_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = begin_link(&c, device, link);
    if (r != NVML_SUCCESS)
        return r;
    int c2c = 0;
    mock_parse_bool(mock_cfg_get(c.cfg, "nvlink.c2c_enabled"), &c2c);
    switch (capability) {
    case NVML_NVLINK_CAP_P2P_SUPPORTED:
    case NVML_NVLINK_CAP_P2P_ATOMICS:
    case NVML_NVLINK_CAP_VALID:
        *capResult = 1;
        break;
    case NVML_NVLINK_CAP_SYSMEM_ACCESS:
    case NVML_NVLINK_CAP_SYSMEM_ATOMICS:
        *capResult = (unsigned)c2c; /* only Grace-attached GPUs reach host memory this way */
        break;
    default:
        *capResult = 0;
        break;
    }
    mock_end(&c);
    return r;
}

/* Fills the PCI info of a link's far end; NOT_SUPPORTED when it has none
 * on this node. */
static nvmlReturn_t remote_pci(nvmlDevice_t device, unsigned link, nvmlPciInfo_t *pci, int full)
{
    if (pci == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = begin_link(&c, device, link);
    if (r != NVML_SUCCESS)
        return r;
    char field[64];
    snprintf(field, sizeof field, "nvlink.link.%u.remote_bus_id", link);
    const char *bus_id = mock_dev_get(c.cfg, c.pos, field);
    unsigned domain, bus, slot, function;
    if (bus_id == NULL || sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &slot, &function) != 4) {
        r = NVML_ERROR_NOT_SUPPORTED;
    } else {
        memset(pci, 0, full ? sizeof *pci : offsetof(nvmlPciInfo_t, busId));
        pci->domain = domain;
        pci->bus = bus;
        pci->device = slot;
        snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", domain & 0xffff,
                 bus, slot, function);
        if (full)
            snprintf(pci->busId, sizeof pci->busId, "%s", bus_id);
        unsigned peer;
        if (mock_find_bus_id(c.cfg, bus_id, &peer))
            pci->pciDeviceId = mock_pci_device_id(c.cfg, peer);
        else
            pci->pciDeviceId = 0x10de; /* an NVSwitch: NVIDIA's vendor id */
    }
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                          nvmlPciInfo_t *pci)
{
    return remote_pci(device, link, pci, 1);
}

MOCK_API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link,
                                                       nvmlPciInfo_t *pci)
{
    return remote_pci(device, link, pci, 0);
}

MOCK_API nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                          nvmlIntNvLinkDeviceType_t *pNvLinkDeviceType)
{
    if (pNvLinkDeviceType == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = begin_link(&c, device, link);
    if (r != NVML_SUCCESS)
        return r;
    static const struct mock_enum_name types[] = {{"switch", NVML_NVLINK_DEVICE_TYPE_SWITCH},
                                                  {"gpu", NVML_NVLINK_DEVICE_TYPE_GPU}};
    char field[64];
    snprintf(field, sizeof field, "nvlink.link.%u.remote_type", link);
    unsigned type;
    if (!mock_enum_lookup(mock_dev_get(c.cfg, c.pos, field), types, MOCK_COUNT(types), &type))
        type = NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
    *pNvLinkDeviceType = (nvmlIntNvLinkDeviceType_t)type;
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                                      nvmlNvLinkErrorCounter_t counter,
                                                      unsigned long long *counterValue)
{
    if (counterValue == NULL || (unsigned)counter >= NVML_NVLINK_ERROR_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = check_link(device, link);
    if (r == NVML_SUCCESS)
        *counterValue = 0; /* simulated links never see replays or CRC errors */
    return r;
}

/* ------------------------------------------------------------------ fabric */

static int parse_uuid(const char *text, unsigned char out[16])
{
    unsigned n = 0;
    for (const char *p = text; *p && n < 32; p++) {
        if (*p == '-')
            continue;
        unsigned nibble;
        if (*p >= '0' && *p <= '9')
            nibble = (unsigned)(*p - '0');
        else if (*p >= 'a' && *p <= 'f')
            nibble = (unsigned)(*p - 'a' + 10);
        else if (*p >= 'A' && *p <= 'F')
            nibble = (unsigned)(*p - 'A' + 10);
        else
            return 0;
        if (n % 2 == 0)
            out[n / 2] = (unsigned char)(nibble << 4);
        else
            out[n / 2] |= (unsigned char)nibble;
        n++;
    }
    return n == 32;
}

/* The states a profile may pin; `auto` follows the fabric manager. */
static const struct mock_enum_name FABRIC_STATES[] = {
    {"completed", NVML_GPU_FABRIC_STATE_COMPLETED},
    {"in_progress", NVML_GPU_FABRIC_STATE_IN_PROGRESS},
    {"not_started", NVML_GPU_FABRIC_STATE_NOT_STARTED},
};

/* A mock_reader: the device's fabric identity in the v1 record, which
 * every version of the query starts from; 0 (and `out` untouched) when the
 * profile has none. */
static int fabric_of(const struct mock_config *cfg, unsigned pos, void *out)
{
    nvmlGpuFabricInfo_t *f = out;
    const char *state = mock_dev_get(cfg, pos, "fabric.state");
    if (state == NULL)
        return 0;
    /* Field by field, not memset: the record is the caller's (v1), and
     * NVML writes its fields, not its padding. */
    memset(f->clusterUuid, 0, sizeof f->clusterUuid);
    f->status = NVML_SUCCESS;
    f->cliqueId = 0;
    const char *uuid = mock_dev_get(cfg, pos, "fabric.cluster_uuid");
    if (uuid != NULL && !parse_uuid(uuid, f->clusterUuid))
        memset(f->clusterUuid, 0, sizeof f->clusterUuid);
    mock_dev_uint(cfg, pos, "fabric.clique_id", &f->cliqueId);
    unsigned fixed;
    if (mock_enum_lookup(state, FABRIC_STATES, MOCK_COUNT(FABRIC_STATES), &fixed)) {
        f->state = (nvmlGpuFabricState_t)fixed;
    } else if (strcasecmp(state, "auto") == 0) {
        /* Registered once the fabric manager has written its marker. */
        const char *marker = mock_cfg_get(cfg, "paths.fabric_ready_marker");
        char path[8192];
        struct stat st;
        int n = marker == NULL ? -1
                : marker[0] == '/' ? snprintf(path, sizeof path, "%s", marker)
                                   : snprintf(path, sizeof path, "%s/%s", cfg->dir, marker);
        int ready = n > 0 && (size_t)n < sizeof path && stat(path, &st) == 0;
        f->state = ready ? NVML_GPU_FABRIC_STATE_COMPLETED : NVML_GPU_FABRIC_STATE_IN_PROGRESS;
    } else {
        f->state = NVML_GPU_FABRIC_STATE_NOT_SUPPORTED;
    }
    return 1;
}

MOCK_API nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device,
                                                 nvmlGpuFabricInfo_t *gpuFabricInfo)
{
    if (gpuFabricInfo == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return mock_read(device, fabric_of, gpuFabricInfo);
}

MOCK_API nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device,
                                                  nvmlGpuFabricInfoV_t *gpuFabricInfo)
{
    if (gpuFabricInfo == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned version = gpuFabricInfo->version;
    if (version != nvmlGpuFabricInfo_v2 && version != nvmlGpuFabricInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlGpuFabricInfo_t f;
    nvmlReturn_t r = mock_read(device, fabric_of, &f);
    if (r == NVML_SUCCESS) {
        memcpy(gpuFabricInfo->clusterUuid, f.clusterUuid, sizeof f.clusterUuid);
        gpuFabricInfo->status = f.status;
        gpuFabricInfo->cliqueId = f.cliqueId;
        gpuFabricInfo->state = f.state;
        /* A registered fabric is healthy: full bandwidth, no recovery. */
        int done = f.state == NVML_GPU_FABRIC_STATE_COMPLETED;
        gpuFabricInfo->healthMask =
            done ? (NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE
                    << NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW) |
                       (NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_RECOVERY_FALSE
                        << NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY) |
                       (NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_FALSE
                        << NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY) |
                       (NVML_GPU_FABRIC_HEALTH_MASK_ACCESS_TIMEOUT_RECOVERY_FALSE
                        << NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY)
                 : 0;
        if (version == nvmlGpuFabricInfo_v3)
            gpuFabricInfo->healthSummary = done ? NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
                                                : NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED;
    }
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetAddressingMode(nvmlDevice_t device,
                                                  nvmlDeviceAddressingMode_t *mode)
{
    if (mode == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (mode->version != nvmlDeviceAddressingMode_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    static const struct mock_enum_name modes[] = {{"hmm", NVML_DEVICE_ADDRESSING_MODE_HMM},
                                                  {"ats", NVML_DEVICE_ADDRESSING_MODE_ATS},
                                                  {"none", NVML_DEVICE_ADDRESSING_MODE_NONE}};
    /* No (known) mode in the profile: the board predates the query. */
    return mock_enum_field(device, MOCK_GUARDED, "addressing_mode", modes, MOCK_COUNT(modes),
                           MOCK_ENUM_REQUIRED, &mode->value);
}
