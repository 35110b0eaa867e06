/*
 * NVLink links, their traffic and error counters, and their field values.
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
 * odd number of GPUs leaves without a peer.  Traffic is simulated: each
 * link carries `utilization.gpu` percent of its bandwidth in each
 * direction, a meter (meters.c), so
 * counters only climb and monitoring agents see a rate that follows
 * `mokka ctl util`.  Errors are the ones `mokka ctl nvlink-error` adds
 * (`nvlink_errors.<link>`).  The GPU's fabric identity, which the fabric
 * manager registers over these links, is fabric.c's.
 *
 * What the link getters a poller calls read (how many links, which are up,
 * what each one reaches, the speed and generation) is resolved once per
 * config snapshot with the device's board (struct mock_nvlink); only the
 * remote PCI info and field 146 still walk the wiring per call.
 */
#include <limits.h>
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

/* ----------------------------------------------------------------- traffic */

/* KiB per second one link carries per direction at full utilization. */
static double link_kib_per_second(const struct mock_config *cfg)
{
    unsigned long long mbps = 0;
    mock_cfg_u64(cfg, "nvlink.bandwidth_per_link_mbps", &mbps);
    return (double)mbps * 1e6 / 1024.0;
}

unsigned long long mock_nvlink_data_kib(const struct mock_config *cfg, unsigned pos,
                                        unsigned long long *at)
{
    unsigned util = 0;
    mock_dev_uint(cfg, pos, "utilization.gpu", &util);
    double rate = (util > 100 ? 100 : util) / 100.0 * link_kib_per_second(cfg);
    double kib = mock_meter_read(MOCK_METER_NVLINK_KIB, pos, rate, at);
    return (unsigned long long)kib;
}

/* Errors `mokka ctl nvlink-error` put on one link. */
unsigned long long mock_nvlink_errors(const struct mock_config *cfg, unsigned pos, unsigned link)
{
    char field[64];
    unsigned long long n = 0;
    snprintf(field, sizeof field, "nvlink_errors.%u", link);
    mock_dev_u64(cfg, pos, field, &n);
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

/* The device's links as resolved for this snapshot, or (no memory for its
 * board) as resolved into `own` now. */
static const struct mock_nvlink *links_of(const struct mock_config *cfg, unsigned pos,
                                          struct mock_nvlink *own)
{
    const struct mock_nvlink *links = mock_board_nvlink(cfg, pos);
    if (__builtin_expect(links != NULL, 1))
        return links;
    memset(own, 0, sizeof *own);
    mock_nvlink_fill(cfg, pos, own);
    return own;
}

/* Starts a call on one link: INVALID_ARGUMENT beyond NVML's link range,
 * NOT_SUPPORTED for a link the board does not have; *links the device's
 * links (the snapshot's, so valid until mock_end; else `own`). */
static nvmlReturn_t begin_link(struct mock_call *c, nvmlDevice_t device, unsigned link,
                               struct mock_nvlink *own, const struct mock_nvlink **links)
{
    if (link >= NVML_NVLINK_MAX_LINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = mock_begin(c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    *links = links_of(c->cfg, c->pos, own);
    if (link >= (*links)->link_count) {
        mock_end(c);
        return NVML_ERROR_NOT_SUPPORTED;
    }
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                               nvmlEnableState_t *isActive)
{
    if (isActive == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    struct mock_nvlink own;
    const struct mock_nvlink *links;
    nvmlReturn_t r = begin_link(&c, device, link, &own, &links);
    if (r != NVML_SUCCESS)
        return r;
    *isActive = links->up_mask >> link & 1 ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link,
                                                 unsigned int *version)
{
    if (version == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    struct mock_nvlink own;
    const struct mock_nvlink *links;
    nvmlReturn_t r = begin_link(&c, device, link, &own, &links);
    if (r != NVML_SUCCESS)
        return r;
    /* The NVLink generation, as the 535 driver reports it (4 on Hopper). */
    if (!links->has_version)
        r = NVML_ERROR_NOT_SUPPORTED;
    *version = (unsigned)links->version;
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
    struct mock_nvlink own;
    const struct mock_nvlink *links;
    nvmlReturn_t r = begin_link(&c, device, link, &own, &links);
    if (r != NVML_SUCCESS)
        return r;
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
    mock_end(&c);
    return r;
}

/* Fills the PCI info of a link's far end; NOT_SUPPORTED when it has none
 * on this node.  The wiring (nvlink_wiring.c) names it: a switch port's
 * switch, or a mesh link's peer GPU; a switch outside this node (NVL72
 * trays) and a link a mesh leaves unwired have none. */
static nvmlReturn_t remote_pci(nvmlDevice_t device, unsigned link, nvmlPciInfo_t *pci, int full)
{
    if (pci == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    struct mock_nvlink own;
    const struct mock_nvlink *links;
    nvmlReturn_t r = begin_link(&c, device, link, &own, &links);
    if (r != NVML_SUCCESS)
        return r;
    char field[64];
    const char *bus_id = NULL;
    unsigned sw, port, peer_link, peer;
    int to_switch = mock_nvlink_wired_switch(c.cfg, c.pos, link, &sw, &port);
    if (to_switch) {
        snprintf(field, sizeof field, "nvlink.switch.%u.bus_id", sw);
        bus_id = mock_cfg_get(c.cfg, field);
    } else if (mock_nvlink_wired_gpu(c.cfg, c.pos, link, &peer, &peer_link)) {
        bus_id = mock_dev_get(c.cfg, peer, "pci.bus_id");
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
            pci->pciDeviceId = pci->pciSubSystemId = mock_nvswitch_pci_id(c.cfg, sw);
        } else if (mock_find_bus_id(c.cfg, bus_id, &peer)) {
            unsigned vendor = 0, id = 0;
            pci->pciDeviceId = mock_pci_device_id(c.cfg, peer);
            mock_dev_uint(c.cfg, peer, "pci.subsystem_vendor_id", &vendor);
            mock_dev_uint(c.cfg, peer, "pci.subsystem_device_id", &id);
            pci->pciSubSystemId = id << 16 | (vendor & 0xffff);
        } else {
            pci->pciDeviceId = NVIDIA_VENDOR; /* a GPU this process does not see */
        }
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
    struct mock_nvlink own;
    const struct mock_nvlink *links;
    nvmlReturn_t r = begin_link(&c, device, link, &own, &links);
    if (r != NVML_SUCCESS)
        return r;
    *pNvLinkDeviceType = (nvmlIntNvLinkDeviceType_t)links->remote_type[link];
    mock_end(&c);
    return r;
}

/* One error counter of a link.  An injected error is a flit that failed
 * its CRC check, which the link then replays: both counters carry it.
 * Recoveries and data CRC/ECC errors never happen on simulated links. */
static unsigned long long link_error_count(const struct mock_config *cfg, unsigned pos,
                                           unsigned link, nvmlNvLinkErrorCounter_t counter)
{
    if (counter != NVML_NVLINK_ERROR_DL_CRC_FLIT && counter != NVML_NVLINK_ERROR_DL_REPLAY)
        return 0;
    return mock_nvlink_errors(cfg, pos, link);
}

MOCK_API nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                                      nvmlNvLinkErrorCounter_t counter,
                                                      unsigned long long *counterValue)
{
    if (counterValue == NULL || (unsigned)counter >= NVML_NVLINK_ERROR_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    struct mock_nvlink own;
    const struct mock_nvlink *links;
    nvmlReturn_t r = begin_link(&c, device, link, &own, &links);
    if (r != NVML_SUCCESS)
        return r;
    *counterValue = link_error_count(c.cfg, c.pos, link, counter);
    mock_end(&c);
    return r;
}

/* --------------------------------------------------------- field values */

/* Legacy per-link error fields: links 0-5, their total, then links 6-11. */
static const struct {
    unsigned first, total, first_high;
    nvmlNvLinkErrorCounter_t counter;
} LINK_ERROR_FIELDS[] = {
    {NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
     NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L6, NVML_NVLINK_ERROR_DL_CRC_FLIT},
    {NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
     NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6, NVML_NVLINK_ERROR_DL_CRC_DATA},
    {NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
     NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L6, NVML_NVLINK_ERROR_DL_REPLAY},
    {NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
     NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L6, NVML_NVLINK_ERROR_DL_RECOVERY},
    {NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL,
     NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_L6, NVML_NVLINK_ERROR_DL_ECC_DATA},
};

/* The link a legacy per-link field names (-1: all links, its total);
 * 0 when the field is not one of them. */
static int link_error_field(unsigned field, int *link, nvmlNvLinkErrorCounter_t *counter)
{
    for (size_t i = 0; i < MOCK_COUNT(LINK_ERROR_FIELDS); i++) {
        unsigned first = LINK_ERROR_FIELDS[i].first, high = LINK_ERROR_FIELDS[i].first_high;
        *counter = LINK_ERROR_FIELDS[i].counter;
        if (field >= first && field < LINK_ERROR_FIELDS[i].total)
            *link = (int)(field - first);
        else if (field == LINK_ERROR_FIELDS[i].total)
            *link = -1;
        /* ECC data fields run L0..L11 in one block before their total. */
        else if (high != LINK_ERROR_FIELDS[i].first && field >= high && field < high + 6)
            *link = (int)(field - high) + 6;
        else
            continue;
        return 1;
    }
    return 0;
}

/* Per-link NVLink speed fields: links 0-5, then 6-11. */
static int nvlink_speed_link(unsigned field)
{
    if (field >= NVML_FI_DEV_NVLINK_SPEED_MBPS_L0 && field <= NVML_FI_DEV_NVLINK_SPEED_MBPS_L5)
        return (int)(field - NVML_FI_DEV_NVLINK_SPEED_MBPS_L0);
    if (field >= NVML_FI_DEV_NVLINK_SPEED_MBPS_L6 && field <= NVML_FI_DEV_NVLINK_SPEED_MBPS_L11)
        return (int)(field - NVML_FI_DEV_NVLINK_SPEED_MBPS_L6) + 6;
    return -1;
}

/* The links a field with a link scope covers: one link, or (UINT_MAX)
 * all of them; 0 for a link the board does not have. */
static int scope_links(unsigned scope, unsigned links, unsigned *first, unsigned *count)
{
    if (scope == UINT_MAX) {
        *first = 0;
        *count = links;
        return links > 0;
    }
    *first = scope;
    *count = 1;
    return scope < links;
}

int mock_nvlink_field(const struct mock_config *cfg, unsigned pos, nvmlFieldValue_t *v)
{
    struct mock_nvlink own;
    const struct mock_nvlink *resolved = links_of(cfg, pos, &own);
    unsigned links = resolved->link_count, first, count;
    unsigned long long n = 0, speed = resolved->bandwidth_mbps;
    int link, found, has_speed = resolved->has_bandwidth, nvlink5 = resolved->nvlink5;
    nvmlNvLinkErrorCounter_t counter;

    if ((link = nvlink_speed_link(v->fieldId)) >= 0) {
        mock_field_uint(v, (unsigned)link < links && has_speed, speed);
        return 1;
    }
    if (link_error_field(v->fieldId, &link, &counter)) {
        /* A total counts every link; per-link fields name theirs. */
        found = link < 0 ? links > 0 : (unsigned)link < links;
        for (unsigned l = 0; found && l < links; l++)
            if (link < 0 || (unsigned)link == l)
                n += link_error_count(cfg, pos, l, counter);
        mock_field_ull(v, found, n);
        return 1;
    }
    switch (v->fieldId) {
    case NVML_FI_DEV_NVLINK_LINK_COUNT:
        mock_field_uint(v, 1, links);
        return 1;
    case NVML_FI_DEV_NVSWITCH_CONNECTED_LINK_COUNT:
        mock_field_uint(v, 1, resolved->switch_links);
        return 1;
    case NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON:
        mock_field_uint(v, links > 0 && has_speed, speed);
        return 1;
    case NVML_FI_DEV_NVLINK_GET_SPEED:
        mock_field_uint(v, v->scopeId < links && has_speed, speed);
        return 1;
    case NVML_FI_DEV_NVLINK_GET_STATE:
        found = v->scopeId < links;
        mock_field_uint(v, found,
                        found && resolved->up_mask >> v->scopeId & 1 ? NVML_FEATURE_ENABLED
                                                                     : NVML_FEATURE_DISABLED);
        return 1;
    case NVML_FI_DEV_NVLINK_GET_VERSION:
        mock_field_uint(v, v->scopeId < links && resolved->has_version, resolved->version);
        return 1;
    case NVML_FI_DEV_NVLINK_GET_POWER_STATE:
        mock_field_uint(v, v->scopeId < links, NVML_NVLINK_POWER_STATE_HIGH_SPEED);
        return 1;
    case NVML_FI_DEV_NVLINK_REMOTE_NVLINK_ID: {
        /* A wired switch link ends at its port of the switch, a mesh link
         * at its link of the peer GPU; a link to a switch outside this node
         * at the same link number of it. */
        unsigned sw, port = v->scopeId, peer;
        found = v->scopeId < links;
        if (found && !mock_nvlink_wired_switch(cfg, pos, v->scopeId, &sw, &port) &&
            !mock_nvlink_wired_gpu(cfg, pos, v->scopeId, &peer, &port))
            found = resolved->up_mask >> v->scopeId & 1;
        mock_field_uint(v, found, port);
        return 1;
    }
    case NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY:
    case NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY:
    case NVML_FI_DEV_NVLINK_ERROR_DL_CRC: {
        static const nvmlNvLinkErrorCounter_t kinds[] = {
            NVML_NVLINK_ERROR_DL_REPLAY, NVML_NVLINK_ERROR_DL_RECOVERY,
            NVML_NVLINK_ERROR_DL_CRC_FLIT};
        found = v->scopeId < links;
        n = found ? link_error_count(cfg, pos, v->scopeId,
                                     kinds[v->fieldId - NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY])
                  : 0;
        mock_field_ull(v, found, n);
        return 1;
    }
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
    case NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX:
    case NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX: {
        /* KiB; symmetric traffic, so TX equals RX.  Raw adds the flit
         * headers: one 16-byte header per 256-byte payload. */
        found = scope_links(v->scopeId, links, &first, &count);
        n = found ? mock_nvlink_data_kib(cfg, pos, NULL) : 0;
        if (v->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX ||
            v->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX)
            n += n / 16;
        mock_field_ull(v, found, n * count);
        return 1;
    }
    case NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES:
    case NVML_FI_DEV_NVLINK_COUNT_RCV_BYTES:
    case NVML_FI_DEV_NVLINK_COUNT_XMIT_PACKETS:
    case NVML_FI_DEV_NVLINK_COUNT_RCV_PACKETS: {
        /* NVLink 5 counters, in bytes and 256-byte packets. */
        found = nvlink5 && scope_links(v->scopeId, links, &first, &count);
        n = found ? mock_nvlink_data_kib(cfg, pos, NULL) * 1024ULL * count : 0;
        if (v->fieldId == NVML_FI_DEV_NVLINK_COUNT_XMIT_PACKETS ||
            v->fieldId == NVML_FI_DEV_NVLINK_COUNT_RCV_PACKETS)
            n /= 256;
        mock_field_ull(v, found, n);
        return 1;
    }
    case NVML_FI_DEV_NVLINK_COUNT_RCV_ERRORS:
    case NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS:
    case NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS:
        /* NVLink 5 reports an injected error as a received bad packet. */
        found = nvlink5 && scope_links(v->scopeId, links, &first, &count);
        for (unsigned l = first; found && l < first + count; l++)
            n += mock_nvlink_errors(cfg, pos, l);
        mock_field_ull(v, found, n);
        return 1;
    case NVML_FI_DEV_NVLINK_COUNT_MALFORMED_PACKET_ERRORS:
    case NVML_FI_DEV_NVLINK_COUNT_BUFFER_OVERRUN_ERRORS:
    case NVML_FI_DEV_NVLINK_COUNT_RCV_REMOTE_ERRORS:
    case NVML_FI_DEV_NVLINK_COUNT_RCV_GENERAL_ERRORS:
    case NVML_FI_DEV_NVLINK_COUNT_LOCAL_LINK_INTEGRITY_ERRORS:
    case NVML_FI_DEV_NVLINK_COUNT_XMIT_DISCARDS:
    case NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS:
    case NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS:
    case NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS:
        found = nvlink5 && scope_links(v->scopeId, links, &first, &count);
        mock_field_ull(v, found, 0);
        return 1;
    default:
        return 0;
    }
}
