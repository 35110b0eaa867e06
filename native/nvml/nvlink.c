/*
 * NVLink links: which links a device has, what each one reaches, and the
 * link getters that answer from them.
 *
 * The engine config lists each device's links with the kind of their far
 * end (`nvlink.link.<l>.remote_type` = switch | gpu).  Which switch port
 * or peer link each one reaches is the board's wiring (nvlink_wiring.c):
 * on a board whose profile lists NVSwitches (`nvlink.switch.<i>.bus_id`)
 * each GPU sends a fixed number of its links to each switch and each port
 * has exactly one GPU link at its other end; on a direct mesh (no switch)
 * links join pairs of GPUs, symmetrically.  RemotePciInfo, field 146,
 * `nvidia-smi nvlink -R` and `topo -m` answer from that one wiring.  Every
 * link the board has is up at the profile's speed, except one a mesh of an
 * odd number of GPUs leaves without a peer.  The GPU's fabric identity,
 * which the fabric manager registers over these links, is fabric.c's.
 *
 * What the link getters a poller calls read (how many links, which are up,
 * what each one reaches, the speed and generation) is resolved once per
 * config snapshot with the device's board (struct mock_nvlink); only the
 * remote PCI info and field 146 still walk the wiring per call.  What
 * moves on a link (traffic, errors) and the NVLink field values are
 * nvlink_counters.c's: they change per call, the links only per snapshot.
 */
#include <stdio.h>
#include <string.h>

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

/* Whether a link the board has is up: all are, except one a direct mesh
 * leaves without a peer (an odd number of link ends cannot all pair up). */
static int link_up(const struct mock_config *cfg, unsigned pos, unsigned link,
                   unsigned remote_type)
{
    unsigned peer, peer_link;
    return remote_type != NVML_NVLINK_DEVICE_TYPE_GPU ||
           mock_nvlink_wired_gpu(cfg, pos, link, &peer, &peer_link);
}

/* The kind of a link's far end as the engine config names it
 * (`nvlink.link.<l>.remote_type`); UNKNOWN when it names none. */
static unsigned remote_type(const struct mock_config *cfg, unsigned pos, unsigned link)
{
    static const struct mock_enum_name types[] = {{"switch", NVML_NVLINK_DEVICE_TYPE_SWITCH},
                                                  {"gpu", NVML_NVLINK_DEVICE_TYPE_GPU}};
    char field[64];
    snprintf(field, sizeof field, "nvlink.link.%u.remote_type", link);
    unsigned type;
    if (!mock_enum_lookup(mock_dev_get(cfg, pos, field), types, MOCK_COUNT(types), &type))
        type = NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
    return type;
}

void mock_nvlink_fill(const struct mock_config *cfg, unsigned pos, struct mock_nvlink *links)
{
    links->link_count = mock_link_count(cfg, pos);
    for (unsigned l = 0; l < links->link_count; l++) {
        links->remote_type[l] = (unsigned char)remote_type(cfg, pos, l);
        links->switch_links += links->remote_type[l] == NVML_NVLINK_DEVICE_TYPE_SWITCH;
        if (link_up(cfg, pos, l, links->remote_type[l]))
            links->up_mask |= 1u << l;
    }
    unsigned long long n = 0;
    links->has_bandwidth = mock_cfg_u64(cfg, "nvlink.bandwidth_per_link_mbps", &n);
    links->bandwidth_mbps = n;
    n = 0;
    links->has_version = mock_cfg_u64(cfg, "nvlink.version", &n);
    links->version = n;
    int c2c = 0;
    mock_parse_bool(mock_cfg_get(cfg, "nvlink.c2c_enabled"), &c2c);
    links->c2c = c2c != 0;
    links->nvlink5 = mock_dev_is(cfg, pos, "architecture", "blackwell");
}

const struct mock_nvlink *mock_nvlink_of(const struct mock_config *cfg, unsigned pos,
                                        struct mock_nvlink *own)
{
    const struct mock_nvlink *links = mock_board_nvlink(cfg, pos);
    if (__builtin_expect(links != NULL, 1))
        return links;
    memset(own, 0, sizeof *own);
    mock_nvlink_fill(cfg, pos, own);
    return own;
}

/* What one link getter answers, once its call has begun on a link the
 * board has: NVML_SUCCESS or the call's error, with *out filled.  `arg` is
 * the getter's own argument (a capability, a counter, ...), 0 when none. */
typedef nvmlReturn_t (*link_answer)(const struct mock_call *c, const struct mock_nvlink *links,
                                    unsigned link, unsigned arg, void *out);

/* One call on one link: INVALID_ARGUMENT beyond NVML's link range,
 * NOT_SUPPORTED for a link the board does not have, else `answer`'s, with
 * the device's links (the snapshot's, valid until mock_end; else its own). */
static nvmlReturn_t link_call(nvmlDevice_t device, unsigned link, unsigned arg,
                              link_answer answer, void *out)
{
    if (link >= NVML_NVLINK_MAX_LINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    struct mock_nvlink own;
    const struct mock_nvlink *links = mock_nvlink_of(c.cfg, c.pos, &own);
    r = link < links->link_count ? answer(&c, links, link, arg, out) : NVML_ERROR_NOT_SUPPORTED;
    mock_end(&c);
    return r;
}

static nvmlReturn_t state_answer(const struct mock_call *c, const struct mock_nvlink *links,
                                 unsigned link, unsigned arg, void *out)
{
    (void)c;
    (void)arg;
    nvmlEnableState_t *isActive = out;
    *isActive = links->up_mask >> link & 1 ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                               nvmlEnableState_t *isActive)
{
    if (isActive == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return link_call(device, link, 0, state_answer, isActive);
}

static nvmlReturn_t version_answer(const struct mock_call *c, const struct mock_nvlink *links,
                                   unsigned link, unsigned arg, void *out)
{
    (void)c;
    (void)link;
    (void)arg;
    unsigned int *version = out;
    /* The NVLink generation, as the 535 driver reports it (4 on Hopper). */
    *version = (unsigned)links->version;
    return links->has_version ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

MOCK_API nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link,
                                                 unsigned int *version)
{
    if (version == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return link_call(device, link, 0, version_answer, version);
}

static nvmlReturn_t capability_answer(const struct mock_call *c, const struct mock_nvlink *links,
                                      unsigned link, unsigned capability, void *out)
{
    (void)c;
    (void)link;
    unsigned int *capResult = out;
    switch (capability) {
    case NVML_NVLINK_CAP_P2P_SUPPORTED:
    case NVML_NVLINK_CAP_P2P_ATOMICS:
    case NVML_NVLINK_CAP_VALID:
        *capResult = 1;
        break;
    case NVML_NVLINK_CAP_SYSMEM_ACCESS:
    case NVML_NVLINK_CAP_SYSMEM_ATOMICS:
        *capResult = links->c2c; /* only Grace-attached GPUs reach host memory this way */
        break;
    default:
        *capResult = 0;
        break;
    }
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlDeviceGetNvLinkCapability(nvmlDevice_t device, unsigned int link,
                                                    nvmlNvLinkCapability_t capability,
                                                    unsigned int *capResult)
{
    if (capResult == NULL || (unsigned)capability >= NVML_NVLINK_CAP_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    return link_call(device, link, (unsigned)capability, capability_answer, capResult);
}

/* Fills the PCI info of a link's far end; NOT_SUPPORTED when it has none
 * on this node.  The wiring (nvlink_wiring.c) names it: a switch port's
 * switch, or a mesh link's peer GPU; a switch outside this node (NVL72
 * trays) and a link a mesh leaves unwired have none.  `full`: the whole
 * current nvmlPciInfo_t, else the fields before busId. */
static nvmlReturn_t remote_pci_answer(const struct mock_call *c, const struct mock_nvlink *links,
                                      unsigned link, unsigned full, void *out)
{
    (void)links;
    nvmlPciInfo_t *pci = out;
    nvmlReturn_t r = NVML_SUCCESS;
    char field[64];
    const char *bus_id = NULL;
    unsigned sw, port, peer_link, peer;
    int to_switch = mock_nvlink_wired_switch(c->cfg, c->pos, link, &sw, &port);
    if (to_switch) {
        snprintf(field, sizeof field, "nvlink.switch.%u.bus_id", sw);
        bus_id = mock_cfg_get(c->cfg, field);
    } else if (mock_nvlink_wired_gpu(c->cfg, c->pos, link, &peer, &peer_link)) {
        bus_id = mock_dev_get(c->cfg, peer, "pci.bus_id");
    }
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
            mock_truncate_copy(bus_id, pci->busId, sizeof pci->busId);
        if (to_switch) {
            pci->pciDeviceId = pci->pciSubSystemId = mock_nvswitch_pci_id(c->cfg, sw);
        } else if (mock_find_bus_id(c->cfg, bus_id, &peer)) {
            unsigned vendor = 0, id = 0;
            pci->pciDeviceId = mock_pci_device_id(c->cfg, peer);
            mock_dev_uint(c->cfg, peer, "pci.subsystem_vendor_id", &vendor);
            mock_dev_uint(c->cfg, peer, "pci.subsystem_device_id", &id);
            pci->pciSubSystemId = id << 16 | (vendor & 0xffff);
        } else {
            pci->pciDeviceId = NVIDIA_VENDOR; /* a GPU this process does not see */
        }
    }
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                          nvmlPciInfo_t *pci)
{
    if (pci == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return link_call(device, link, 1, remote_pci_answer, pci);
}

MOCK_API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link,
                                                       nvmlPciInfo_t *pci)
{
    if (pci == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return link_call(device, link, 0, remote_pci_answer, pci);
}

static nvmlReturn_t remote_type_answer(const struct mock_call *c, const struct mock_nvlink *links,
                                       unsigned link, unsigned arg, void *out)
{
    (void)c;
    (void)arg;
    nvmlIntNvLinkDeviceType_t *pNvLinkDeviceType = out;
    *pNvLinkDeviceType = (nvmlIntNvLinkDeviceType_t)links->remote_type[link];
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                          nvmlIntNvLinkDeviceType_t *pNvLinkDeviceType)
{
    if (pNvLinkDeviceType == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return link_call(device, link, 0, remote_type_answer, pNvLinkDeviceType);
}

static nvmlReturn_t error_counter_answer(const struct mock_call *c,
                                         const struct mock_nvlink *links, unsigned link,
                                         unsigned counter, void *out)
{
    (void)links;
    unsigned long long *counterValue = out;
    *counterValue =
        mock_nvlink_error_count(c->cfg, c->pos, link, (nvmlNvLinkErrorCounter_t)counter);
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                                      nvmlNvLinkErrorCounter_t counter,
                                                      unsigned long long *counterValue)
{
    if (counterValue == NULL || (unsigned)counter >= NVML_NVLINK_ERROR_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    return link_call(device, link, (unsigned)counter, error_counter_answer, counterValue);
}
