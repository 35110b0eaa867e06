/*
 * CPU and memory affinity: which CPUs and NUMA nodes are close to a GPU.
 *
 * A device's CPU affinity is its root complex's CPU list (the engine
 * config's `cpu_affinity`, written in the kernel's spelling), else every
 * online CPU, as a host whose firmware gives no locality reports; a CPU's
 * GPU set (nvmlSystemGetTopologyGpuSet) is the GPUs whose affinity holds
 * it: both read one list per device (affinity_list).  The NUMA node near
 * a GPU (its memory affinity, the nearest CPU's node `topo -C` prints) is
 * the profile's `numa_node`; the GPU's own NUMA node
 * (nvmlDeviceGetNumaNodeId) exists only where its memory is one (Grace
 * with C2C).  Apart from pci.c,
 * which answers the PCI address, link and topology questions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "mock.h"

/* ------------------------------------------------------------ CPU affinity */

/* The next range of a cpulist such as "0-55,112-167": 1 with *lo..*hi and
 * *p moved past it (and its comma); 0 at the end of the list or at a piece
 * that is not a number, which ends it. */
static int next_cpu_range(const char **p, unsigned long *lo, unsigned long *hi)
{
    const char *s = *p;
    char *end;
    if (s == NULL || *s == '\0')
        return 0;
    *lo = *hi = strtoul(s, &end, 10);
    if (end == s)
        return 0;
    if (*end == '-') {
        s = end + 1;
        *hi = strtoul(s, &end, 10);
        if (end == s)
            return 0;
    }
    *p = *end == ',' ? end + 1 : NULL; /* anything else ends the list */
    return 1;
}

/* Sets the bits of a cpulist into an unsigned long mask of `words` words. */
static void set_cpulist(const char *list, unsigned long *set, unsigned int words)
{
    const size_t bits = 8 * sizeof(unsigned long);
    unsigned long lo, hi;
    while (next_cpu_range(&list, &lo, &hi))
        for (unsigned long cpu = lo; cpu <= hi && cpu / bits < words; cpu++)
            set[cpu / bits] |= 1UL << (cpu % bits);
}

/* Whether a cpulist names `cpu`. */
static int cpulist_has(const char *list, unsigned long cpu)
{
    unsigned long lo, hi;
    while (next_cpu_range(&list, &lo, &hi))
        if (lo <= cpu && cpu <= hi)
            return 1;
    return 0;
}

/* Raises *highest to the highest CPU a cpulist names; 1 when it names any. */
static int cpulist_highest(const char *list, unsigned long *highest)
{
    unsigned long lo, hi;
    int any = 0;
    while (next_cpu_range(&list, &lo, &hi)) {
        if (lo > hi)
            continue;
        if (hi > *highest)
            *highest = hi;
        any = 1;
    }
    return any;
}

/* Every online CPU of this machine, as a cpulist written into `buf`. */
static const char *online_cpus(char *buf, size_t size)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(buf, size, "0-%ld", n > 0 ? n - 1 : 0);
    return buf;
}

/* The CPUs close to a device, as a cpulist: the profile's `cpu_affinity`,
 * else every online CPU of this machine, as a host whose firmware gives no
 * locality reports.  What nvmlDeviceGetCpuAffinity and
 * nvmlSystemGetTopologyGpuSet both read. */
static const char *affinity_list(const struct mock_config *cfg, unsigned pos, char *buf,
                                 size_t size)
{
    const char *list = mock_dev_get(cfg, pos, "cpu_affinity");
    return list != NULL ? list : online_cpus(buf, size);
}

/* Whether `cpu` is one of the node's CPUs: at most the highest CPU any
 * device's affinity names (a CPU below it that no device names is a CPU
 * far from every GPU; one past it is no CPU of the node). */
static int node_has_cpu(const struct mock_config *cfg, unsigned long cpu)
{
    char buf[32];
    unsigned long highest = 0;
    int any = 0;
    for (unsigned pos = 0; pos < cfg->device_count; pos++)
        any |= cpulist_highest(affinity_list(cfg, pos, buf, sizeof buf), &highest);
    if (!any) /* no device names a CPU: this machine's */
        cpulist_highest(online_cpus(buf, sizeof buf), &highest);
    return cpu <= highest;
}

/* The visible GPUs whose CPU affinity (nvmlDeviceGetCpuAffinity's) holds
 * `cpuNumber`.  nvml.h's contract: *count zero asks for the number of
 * them; non-zero fills deviceArray with up to *count handles and sets
 * *count to how many it wrote (no INSUFFICIENT_SIZE: the header documents
 * none).  A CPU the node does not have, a NULL count, or a NULL array with
 * a non-zero count is INVALID_ARGUMENT.  A system call: no device's
 * failure injection applies. */
MOCK_API nvmlReturn_t nvmlSystemGetTopologyGpuSet(unsigned int cpuNumber, unsigned int *count,
                                                  nvmlDevice_t *deviceArray)
{
    if (count == NULL || (*count != 0 && deviceArray == NULL))
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_config *cfg = mock_acquire();
    if (cfg == NULL)
        return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t r = NVML_SUCCESS;
    if (!node_has_cpu(cfg, cpuNumber)) {
        r = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        char buf[32];
        unsigned room = *count, found = 0;
        for (unsigned i = 0; i < cfg->visible_count; i++) {
            unsigned pos = cfg->visible[i];
            if (!cpulist_has(affinity_list(cfg, pos, buf, sizeof buf), cpuNumber))
                continue;
            if (room == 0)
                found++;
            else if (found < room)
                deviceArray[found++] = mock_handle(pos);
        }
        *count = found;
    }
    mock_release(cfg);
    return r;
}

static nvmlReturn_t cpu_affinity(nvmlDevice_t device, unsigned int cpuSetSize,
                                 unsigned long *cpuSet)
{
    if (cpuSet == NULL || cpuSetSize == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    memset(cpuSet, 0, cpuSetSize * sizeof *cpuSet);
    char buf[32];
    set_cpulist(affinity_list(c.cfg, c.pos, buf, sizeof buf), cpuSet, cpuSetSize);
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize,
                                               unsigned long *cpuSet)
{
    return cpu_affinity(device, cpuSetSize, cpuSet);
}

MOCK_API nvmlReturn_t nvmlDeviceGetCpuAffinityWithinScope(nvmlDevice_t device,
                                                          unsigned int cpuSetSize,
                                                          unsigned long *cpuSet,
                                                          nvmlAffinityScope_t scope)
{
    (void)scope; /* NUMA node and socket coincide in the simulated layouts */
    return cpu_affinity(device, cpuSetSize, cpuSet);
}

/* ------------------------------------------------------------ NUMA nodes */

/* The device's NUMA node (the profile's `numa_node`, 0 without one) as a
 * node mask of `nodeSetSize` words.  On every simulated board the GPU's
 * memory and its nearest CPUs share that node, so the memory affinity and
 * the nearest CPU's node are one answer. */
static nvmlReturn_t numa_affinity(nvmlDevice_t device, unsigned int nodeSetSize,
                                  unsigned long *nodeSet)
{
    if (nodeSet == NULL || nodeSetSize == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    memset(nodeSet, 0, nodeSetSize * sizeof *nodeSet);
    unsigned node = 0;
    mock_dev_uint(c.cfg, c.pos, "numa_node", &node);
    const size_t bits = 8 * sizeof(unsigned long);
    if (node / bits < nodeSetSize)
        nodeSet[node / bits] |= 1UL << (node % bits);
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetMemoryAffinity(nvmlDevice_t device, unsigned int nodeSetSize,
                                                  unsigned long *nodeSet,
                                                  nvmlAffinityScope_t scope)
{
    (void)scope; /* NUMA node and socket coincide in the simulated layouts */
    return numa_affinity(device, nodeSetSize, nodeSet);
}

/* What nvidia-smi's `topo -i <gpu> -C` ("NUMA IDs of closest CPU") asks
 * through its export table (slot 223, export_table.c): the same
 * (device, words, mask, scope) call as the memory affinity. */
nvmlReturn_t mock_cpu_numa_affinity(nvmlDevice_t device, unsigned int nodeSetSize,
                                    unsigned long *nodeSet, nvmlAffinityScope_t scope)
{
    (void)scope;
    return numa_affinity(device, nodeSetSize, nodeSet);
}

/* NUMA nodes the driver gives each GPU whose memory is a node: its memory
 * and the nodes its MIG partitions' memory would come online as. */
#define NODES_PER_GPU 8

/* Whether the device's memory is a NUMA node of the host: a GPU attached
 * to a Grace CPU over coherent C2C, where the driver onlines the GPU's
 * memory as system memory.  The device's addressing mode says so: ATS is
 * what such a GPU reports (the engine config writes `ats` for a profile
 * with C2C and no mode of its own), and x86 hosts report HMM or none. */
static int memory_is_numa_node(const struct mock_config *cfg, unsigned pos)
{
    return mock_dev_is(cfg, pos, "addressing_mode", "ats");
}

/* The GPU's memory node, as a Grace node numbers them: the CPU sockets'
 * nodes first (one past the highest `numa_node` a GPU names), then
 * NODES_PER_GPU per GPU in module order (GB200: 2, 10, 18, 26). */
static unsigned gpu_memory_node(const struct mock_config *cfg, unsigned pos)
{
    unsigned cpu_nodes = 0;
    for (unsigned d = 0; d < cfg->device_count; d++) {
        unsigned node = 0;
        mock_dev_uint(cfg, d, "numa_node", &node);
        if (node + 1 > cpu_nodes)
            cpu_nodes = node + 1;
    }
    return cpu_nodes + NODES_PER_GPU * pos;
}

/* nvml.h: "only applies to platforms where the GPUs are NUMA nodes";
 * elsewhere (every x86 board) real drivers answer NOT_SUPPORTED, and
 * `nvidia-smi topo -m` prints N/A as the GPU NUMA ID.  The CPU's node
 * nearest the GPU is the memory affinity's and slot 223's answer. */
MOCK_API nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node)
{
    if (node == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    if (memory_is_numa_node(c.cfg, c.pos))
        *node = gpu_memory_node(c.cfg, c.pos);
    else
        r = NVML_ERROR_NOT_SUPPORTED;
    mock_end(&c);
    return r;
}
