/*
 * PCI identity, bus type, PCIe link state and top speed, and the topology
 * derived from the profile's root complexes.
 *
 * Topology levels follow what a real host reports for the same layout:
 * the same GPU is INTERNAL; two GPUs under one root complex meet at its
 * host bridge (HOSTBRIDGE, "PHB"); different root complexes on one NUMA
 * node meet in the CPU (NODE); different NUMA nodes cross the socket
 * interconnect (SYSTEM).  Which CPUs and NUMA nodes are close to a GPU
 * is affinity.c's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mock.h"

/* NVML packs device and vendor ids into one word: 0x233010DE. */
static unsigned packed_id(const struct mock_config *cfg, unsigned pos, const char *vendor_field,
                          const char *device_field)
{
    unsigned v = 0, d = 0;
    mock_dev_uint(cfg, pos, vendor_field, &v);
    mock_dev_uint(cfg, pos, device_field, &d);
    return (d << 16) | (v & 0xffff);
}

unsigned mock_pci_device_id(const struct mock_config *cfg, unsigned pos)
{
    return packed_id(cfg, pos, "pci.vendor_id", "pci.device_id");
}

/* Fills a whole current (68-byte) nvmlPciInfo_t, which the caller zeroed.
 * Seven lookups and two copies of text: the board (board.c) runs it
 * once per snapshot and device, and the getters copy its answer. */
void mock_pci_fill(const struct mock_config *cfg, unsigned pos, nvmlPciInfo_t *pci)
{
    mock_dev_uint(cfg, pos, "pci.domain", &pci->domain);
    mock_dev_uint(cfg, pos, "pci.bus", &pci->bus);
    mock_dev_uint(cfg, pos, "pci.slot", &pci->device);
    pci->pciDeviceId = mock_pci_device_id(cfg, pos);
    pci->pciSubSystemId =
        packed_id(cfg, pos, "pci.subsystem_vendor_id", "pci.subsystem_device_id");
    const char *legacy = mock_dev_get(cfg, pos, "pci.bus_id_legacy");
    mock_truncate_copy(legacy ? legacy : "", pci->busIdLegacy, sizeof pci->busIdLegacy);
    const char *bus_id = mock_dev_get(cfg, pos, "pci.bus_id");
    mock_truncate_copy(bus_id ? bus_id : "", pci->busId, sizeof pci->busId);
}

/* The PCI info of a device into a local current record: every version
 * is copied out of it, so each entry point writes exactly its own size.
 * The record is the one resolved for the snapshot (it changes only with
 * the config): a call copies 68 bytes and formats nothing. */
static nvmlReturn_t pci_info(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    /* A MIG device is a function of its GPU: it answers its GPU's record
     * (a range check for any other handle). */
    struct mock_mig_info mig;
    nvmlReturn_t r;
    if (mock_mig_info(device, &mig, &r)) {
        if (r != NVML_SUCCESS)
            return r;
        device = mock_handle(mig.pos);
    }
    struct mock_call c;
    r = mock_begin(&c, device, MOCK_IDENTITY);
    if (r != NVML_SUCCESS)
        return r;
    const nvmlPciInfo_t *resolved = mock_board_pci(c.cfg, c.pos);
    if (resolved != NULL) {
        *pci = *resolved;
    } else {
        memset(pci, 0, sizeof *pci);
        mock_pci_fill(c.cfg, c.pos, pci);
    }
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    if (pci == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlPciInfo_t full;
    nvmlReturn_t r = pci_info(device, &full);
    if (r == NVML_SUCCESS)
        *pci = full;
    return r;
}

/* The pre-v3 entry points fill the 52-byte record (mock_pci_info_v2_t);
 * the header still declares them with today's type, so the parameter is
 * only an address. */
static nvmlReturn_t pci_info_v2(nvmlDevice_t device, void *out)
{
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlPciInfo_t full;
    nvmlReturn_t r = pci_info(device, &full);
    if (r != NVML_SUCCESS)
        return r;
    mock_pci_info_v2_t old;
    memset(&old, 0, sizeof old);
    memcpy(old.busId, full.busIdLegacy, sizeof old.busId);
    old.domain = full.domain;
    old.bus = full.bus;
    old.device = full.device;
    old.pciDeviceId = full.pciDeviceId;
    old.pciSubSystemId = full.pciSubSystemId;
    memcpy(out, &old, sizeof old);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return pci_info_v2(device, pci);
}

MOCK_API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return pci_info_v2(device, pci);
}

MOCK_API nvmlReturn_t nvmlDeviceGetPciInfoExt(nvmlDevice_t device, nvmlPciInfoExt_t *pci)
{
    if (pci == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (pci->version != nvmlPciInfoExt_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlPciInfo_t base;
    nvmlReturn_t r = pci_info(device, &base);
    if (r != NVML_SUCCESS)
        return r;
    pci->domain = base.domain;
    pci->bus = base.bus;
    pci->device = base.device;
    pci->pciDeviceId = base.pciDeviceId;
    pci->pciSubSystemId = base.pciSubSystemId;
    pci->baseClass = 0x03; /* display controller */
    pci->subClass = 0x02;  /* 3D controller */
    memcpy(pci->busId, base.busId, sizeof pci->busId);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device,
                                                         unsigned int *maxLinkGen)
{
    return mock_uint_field(device, MOCK_GUARDED, "pcie.max_link_gen", maxLinkGen);
}

/* The GPU's own top generation: pcie.max_device_link_gen where the board
 * outruns its host link (GB200: a Gen 6 GPU on a Gen 5 Grace root port),
 * else the link's pcie.max_link_gen. */
static int read_device_max_gen(const struct mock_config *cfg, unsigned pos, void *out)
{
    return mock_dev_uint(cfg, pos, "pcie.max_device_link_gen", out) ||
           mock_dev_uint(cfg, pos, "pcie.max_link_gen", out);
}

MOCK_API nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(nvmlDevice_t device,
                                                            unsigned int *maxLinkGenDevice)
{
    if (maxLinkGenDevice == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return mock_read(device, read_device_max_gen, maxLinkGenDevice);
}

/* NVML's code for a generation's per-lane rate (NVML_PCIE_LINK_MAX_SPEED_*),
 * indexed by generation; a generation past the table has none. */
static const unsigned MAX_SPEED_CODES[] = {
    NVML_PCIE_LINK_MAX_SPEED_INVALID,   /* no generation 0 */
    NVML_PCIE_LINK_MAX_SPEED_2500MBPS,  /* Gen 1 */
    NVML_PCIE_LINK_MAX_SPEED_5000MBPS,  /* Gen 2 */
    NVML_PCIE_LINK_MAX_SPEED_8000MBPS,  /* Gen 3 */
    NVML_PCIE_LINK_MAX_SPEED_16000MBPS, /* Gen 4 */
    NVML_PCIE_LINK_MAX_SPEED_32000MBPS, /* Gen 5 */
    NVML_PCIE_LINK_MAX_SPEED_64000MBPS, /* Gen 6 */
};

/* The link's top rate, from the generation nvmlDeviceGetMaxPcieLinkGeneration
 * answers (pcie.max_link_gen), so the two never disagree.  The answer is
 * the code (5 for 32000 MB/s), not a number of MB/s: clients such as
 * nvidia-settings map the code to the rate. */
static int read_max_speed(const struct mock_config *cfg, unsigned pos, void *out)
{
    unsigned gen;
    if (!mock_dev_uint(cfg, pos, "pcie.max_link_gen", &gen) || gen == 0 ||
        gen >= MOCK_COUNT(MAX_SPEED_CODES))
        return 0;
    *(unsigned *)out = MAX_SPEED_CODES[gen];
    return 1;
}

MOCK_API nvmlReturn_t nvmlDeviceGetPcieLinkMaxSpeed(nvmlDevice_t device, unsigned int *maxSpeed)
{
    if (maxSpeed == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return mock_read(device, read_max_speed, maxSpeed);
}

/* Every simulated board is a PCI Express device: SXM modules sit on a PCIe
 * link of the baseboard, and a GB200's GPU on its Grace CPU's Gen 5 root
 * port (NVLink-C2C is no bus type NVML has a word for). */
MOCK_API nvmlReturn_t nvmlDeviceGetBusType(nvmlDevice_t device, nvmlBusType_t *type)
{
    return mock_constant_uint(device, MOCK_GUARDED, NVML_BUS_TYPE_PCIE, type);
}

MOCK_API nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device,
                                                          unsigned int *currLinkGen)
{
    return mock_uint_field(device, MOCK_GUARDED, "pcie.current_link_gen", currLinkGen);
}

MOCK_API nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device,
                                                    unsigned int *maxLinkWidth)
{
    return mock_uint_field(device, MOCK_GUARDED, "pcie.max_link_width", maxLinkWidth);
}

MOCK_API nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device,
                                                     unsigned int *currLinkWidth)
{
    return mock_uint_field(device, MOCK_GUARDED, "pcie.current_link_width", currLinkWidth);
}

MOCK_API nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value)
{
    return mock_uint_field(device, MOCK_GUARDED, "pcie.replay_counter", value);
}

MOCK_API nvmlReturn_t nvmlDeviceGetPcieSpeed(nvmlDevice_t device, unsigned int *pcieSpeed)
{
    /* Per-lane transfer rate in MT/s of the current generation. */
    static const unsigned rates[] = {0, 2500, 5000, 8000, 16000, 32000, 64000};
    unsigned gen;
    nvmlReturn_t r = mock_uint_field(device, MOCK_GUARDED, "pcie.current_link_gen", &gen);
    if (r != NVML_SUCCESS)
        return r;
    if (pcieSpeed == NULL || gen >= sizeof rates / sizeof *rates)
        return pcieSpeed == NULL ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED;
    *pcieSpeed = rates[gen];
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device,
                                                  nvmlPcieUtilCounter_t counter,
                                                  unsigned int *value)
{
    if (counter == NVML_PCIE_UTIL_TX_BYTES)
        return mock_uint_figure(device, MOCK_GUARDED, MOCK_FIGURE_PCIE_TX, value);
    if (counter == NVML_PCIE_UTIL_RX_BYTES)
        return mock_uint_figure(device, MOCK_GUARDED, MOCK_FIGURE_PCIE_RX, value);
    return NVML_ERROR_INVALID_ARGUMENT;
}

/* --------------------------------------------------------------- topology */

nvmlGpuTopologyLevel_t mock_topology_level(const struct mock_config *cfg, unsigned a, unsigned b)
{
    if (a == b)
        return NVML_TOPOLOGY_INTERNAL;
    const char *root_a = mock_dev_get(cfg, a, "root_complex");
    const char *root_b = mock_dev_get(cfg, b, "root_complex");
    if (root_a != NULL && root_b != NULL && strcmp(root_a, root_b) == 0)
        return NVML_TOPOLOGY_HOSTBRIDGE;
    int numa_a = 0, numa_b = 0;
    mock_dev_int(cfg, a, "numa_node", &numa_a);
    mock_dev_int(cfg, b, "numa_node", &numa_b);
    return numa_a == numa_b ? NVML_TOPOLOGY_NODE : NVML_TOPOLOGY_SYSTEM;
}

MOCK_API nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1,
                                                          nvmlDevice_t device2,
                                                          nvmlGpuTopologyLevel_t *pathInfo)
{
    if (pathInfo == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device1, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    unsigned other;
    if (!mock_handle_pos(device2, &other) || other >= c.cfg->device_count)
        r = NVML_ERROR_INVALID_ARGUMENT;
    else
        *pathInfo = mock_topology_level(c.cfg, c.pos, other);
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetTopologyNearestGpus(nvmlDevice_t device,
                                                       nvmlGpuTopologyLevel_t level,
                                                       unsigned int *count,
                                                       nvmlDevice_t *deviceArray)
{
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    unsigned found = 0, room = mock_list_room(deviceArray, count);
    for (unsigned i = 0; i < c.cfg->visible_count; i++) {
        unsigned p = c.cfg->visible[i];
        if (p == c.pos || mock_topology_level(c.cfg, c.pos, p) > level)
            continue;
        if (found < room)
            deviceArray[found] = mock_handle(p);
        found++;
    }
    r = mock_list_result(deviceArray, count, found);
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2,
                                             nvmlGpuP2PCapsIndex_t p2pIndex,
                                             nvmlGpuP2PStatus_t *p2pStatus)
{
    if (p2pStatus == NULL || (unsigned)p2pIndex >= NVML_P2P_CAPS_INDEX_UNKNOWN)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device1, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    unsigned other;
    if (!mock_handle_pos(device2, &other) || other >= c.cfg->device_count) {
        r = NVML_ERROR_INVALID_ARGUMENT;
    } else if (p2pIndex == NVML_P2P_CAPS_INDEX_NVLINK) {
        int linked = mock_link_count(c.cfg, c.pos) > 0 && mock_link_count(c.cfg, other) > 0;
        *p2pStatus = linked ? NVML_P2P_STATUS_OK : NVML_P2P_STATUS_NOT_SUPPORTED;
    } else {
        /* Reads, writes, atomics and PCI peer access all work between data
         * center GPUs of one node. */
        *p2pStatus = NVML_P2P_STATUS_OK;
    }
    mock_end(&c);
    return r;
}
