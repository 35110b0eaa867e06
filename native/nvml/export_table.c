/*
 * nvmlInternalGetExportTable: the private table nvidia-smi asks for.
 *
 * nvidia-smi 535 calls it right after nvmlInitWithFlags with one GUID and
 * exits with "Mismatch in versions between nvidia-smi and NVML" unless it
 * succeeds.  The table is an array of pointer-sized slots; slot 0 holds the
 * table's size in bytes, and nvidia-smi guards every slot it reads with
 * `size > offset` and a NULL check.  A NULL slot prints N/A; a table that
 * is too small prints "Uninitialized" for the fields behind the missing
 * slots.  The smallest table that satisfies every guard nvidia-smi 535
 * evaluates is MOCK_EXPORT_TABLE_BYTES (tests/test_nvidia_smi_real.py proves
 * it by building one slot smaller).  Slots 12 and 75 are how `-i <PCI bus
 * id>` picks a GPU (slot 12 parses the id, slot 75 gives each GPU's domain,
 * bus and device to compare with it); slot 23 is the PCI path between two
 * bus ids (`topo -m`); slot 108 is nvmlDeviceGetEnforcedPowerLimit itself,
 * the only way `--query-gpu=enforced.power.limit` reads it; slots 226, 230,
 * 231, 240, 242 and 243 are the board facts `-q` reads only here (atomic
 * caps, the host side's top PCIe generation, GPU part number, T.Limit
 * temperature, addressing mode, sparse operation mode); slots 213 to 215
 * the processes (the process table); slots 72, 138 and 145 what `dmon` and
 * `pmon` need beyond the public getters (whether a GPU can be monitored,
 * the thermal violation time, per-process engine use); slot 223 the NUMA
 * node of the CPUs nearest a GPU (`topo -C`).
 * Each answers from the same profile field or public getter as that
 * fact's public call, so the two never differ; any other slot stays NULL
 * (nvidia-smi prints N/A, or for `-i` a message of its own).
 *
 * `nvidia-smi -r` resets through slots alone: slot 20 asks whether the GPU
 * is the primary (display) GPU, slot 169 the fabric state, slot 182
 * allocates a group of the devices to reset, 183 and 184 prepare it, and
 * slot 168 resets the group's devices (found as above: a throw-away table
 * whose every slot logged and answered; the message nvidia-smi prints when
 * each of them fails names it).  A datacenter board is headless, never the
 * primary GPU, and no fabric state stands in the way; the reset itself is
 * the daemon's (mock_set_device "reset": refused with IN_USE while
 * processes hold the GPU, pending ECC mode applied).
 *
 * How the slots were found: a throw-away build filled every NULL slot of a
 * larger table with a function that logs its slot number and arguments,
 * the real binary ran each command against it, and gdb/objdump at the
 * call sites showed the argument types and what the caller does with the
 * result.  Slot 26 is nvidia-smi's debug log hook and slot 81 a label for
 * a GPU index (NULL: nvidia-smi prints the index), both left empty.
 * Slots 12, 75 and 108 were read off the selection code nvidia-smi runs for
 * `-i` and the enforced.power.limit column (objdump, then gdb at the calls
 * with the slots filled), and checked against NVIDIA's libnvidia-ml
 * 535.309.01 (Debian's libnvidia-ml1, unpacked for reading only): its table
 * for this GUID holds the sscanf-based parser below in slot 12, a read of
 * the device record's domain, bus and device in slot 75, and a relocation
 * to the exported nvmlDeviceGetEnforcedPowerLimit in slot 108.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "mock.h"

/* Size in bytes nvidia-smi 535 must see: the highest slot it guards is at
 * offset 0x798 (`size > 0x798`), so 0x7a0 bytes is the smallest table that
 * prints no "Uninitialized".  Overridable at build time for that proof. */
#ifndef MOCK_EXPORT_TABLE_BYTES
#define MOCK_EXPORT_TABLE_BYTES 0x7a0
#endif
#define EXPORT_TABLE_SLOTS (MOCK_EXPORT_TABLE_BYTES / sizeof(void *))
#define SLOT_PARSE_BUS_ID 12
#define SLOT_TOPOLOGY_LEVEL 23
#define SLOT_GPU_PCI_LOCATION 75
#define SLOT_ENFORCED_POWER_LIMIT 108
#define SLOT_MONITORING_SUPPORTED 72
#define SLOT_THERMAL_VIOLATION 138
#define SLOT_PROCESS_ENGINE_SAMPLES 145
#define SLOT_PCIE_ATOMIC_CAPS 226
#define SLOT_PCIE_MAX_HOST_LINK_GEN 230
#define SLOT_GPU_PART_NUMBER 231
#define SLOT_TLIMIT_TEMPERATURE 240
#define SLOT_ADDRESSING_MODE 242
#define SLOT_SPARSE_OPERATION_MODE 243
#define SLOT_COMPUTE_PROCESSES 213
#define SLOT_GRAPHICS_PROCESSES 214
#define SLOT_MPS_PROCESSES 215
#define SLOT_IS_PRIMARY_GPU 20
#define SLOT_FABRIC_STATE 169
#define SLOT_RESET_GROUP_ALLOC 182
#define SLOT_RESET_GROUP_PREPARE 183
#define SLOT_RESET_GROUP_CHECK 184
#define SLOT_RESET_DEVICES 168
#define SLOT_CPU_NUMA_AFFINITY 223

/* The GUID nvidia-smi passes: 6c3efec4-8fc9-4e6c-a327-ee696e12f7c4, in
 * the byte order of a Windows-style GUID struct (first three groups
 * little-endian), which is how NVIDIA lays out its export table ids. */
static const unsigned char SMI_TABLE_GUID[16] = {
    0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e,
    0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4,
};

/* Slot 12: (busId, &domain, &bus, &device, &function) -> SUCCESS, or
 * INVALID_ARGUMENT for a string that is no PCI bus id.  `-i` hands every id
 * with a ':' to it; a failure prints "Invalid PCI bus id format. Try format
 * [domain:]bus:device.function".  The parser is the one every bus id
 * lookup uses (mock_parse_bus_id: NVIDIA's three formats).  Whether a GPU
 * sits there is slot 75's part: an id no GPU has is no format error. */
static int parse_bus_id(const char *bus_id, unsigned int *domain, unsigned int *bus,
                        unsigned int *device, unsigned int *function)
{
    nvmlReturn_t r = mock_require_init();
    if (r != NVML_SUCCESS)
        return r;
    if (bus_id == NULL || domain == NULL || bus == NULL || device == NULL || function == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return mock_parse_bus_id(bus_id, domain, bus, device, function) ? NVML_SUCCESS
                                                                     : NVML_ERROR_INVALID_ARGUMENT;
}

/* Slot 75: (index, &domain, &bus, &device), where the GPU of that index
 * (nvmlDeviceGetHandleByIndex's numbering, which `-i` walks) sits on the
 * bus.  nvidia-smi selects the GPU whose three numbers equal slot 12's and
 * only when slot 12's function is 0; no GPU matching prints what an
 * unknown UUID does.  A failure prints "Internal application error"
 * (UNINITIALIZED and NOT_SUPPORTED: the version mismatch message).  The
 * numbers are nvmlDeviceGetPciInfo_v3's, which answers for a lost GPU too,
 * as NVIDIA's slot (a read of the device record) does. */
static int gpu_pci_location(unsigned int index, unsigned int *domain, unsigned int *bus,
                            unsigned int *device)
{
    if (domain == NULL || bus == NULL || device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlDevice_t handle;
    nvmlReturn_t r = nvmlDeviceGetHandleByIndex_v2(index, &handle);
    if (r != NVML_SUCCESS)
        return r;
    nvmlPciInfo_t pci;
    r = nvmlDeviceGetPciInfo_v3(handle, &pci);
    if (r != NVML_SUCCESS)
        return r;
    *domain = pci.domain;
    *bus = pci.bus;
    *device = pci.device;
    return NVML_SUCCESS;
}

/* PCI path levels as `topo -m` numbers them. */
enum smi_level { SMI_PIX = 0, SMI_PXB = 1, SMI_PHB = 2, SMI_NODE = 3, SMI_SYS = 4 };

/* Slot 23: (busIdA, busIdB, &level) -> 0 on success. */
static int topology_level(const char *bus_a, const char *bus_b, unsigned int *level)
{
    if (bus_a == NULL || bus_b == NULL || level == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_config *cfg = mock_acquire();
    if (cfg == NULL)
        return NVML_ERROR_UNINITIALIZED;
    unsigned a, b;
    *level = SMI_SYS;
    if (mock_find_bus_id(cfg, bus_a, &a) && mock_find_bus_id(cfg, bus_b, &b)) {
        switch (mock_topology_level(cfg, a, b)) {
        case NVML_TOPOLOGY_INTERNAL:
        case NVML_TOPOLOGY_SINGLE: *level = SMI_PIX; break;
        case NVML_TOPOLOGY_MULTIPLE: *level = SMI_PXB; break;
        case NVML_TOPOLOGY_HOSTBRIDGE: *level = SMI_PHB; break;
        case NVML_TOPOLOGY_NODE: *level = SMI_NODE; break;
        default: *level = SMI_SYS; break;
        }
    }
    mock_release(cfg);
    return NVML_SUCCESS;
}

/* Slot 72: (device, &supported), asked for every GPU by `dmon` and `pmon`
 * before they sample anything.  A failed call makes both print "Not
 * supported on the device(s)"; supported = 0 leaves that GPU out (and none
 * left prints the same).  Every simulated board is one the monitors
 * support; a lost GPU fails the call, as a real one does.  The samples
 * themselves come from the public getters (power, temperatures,
 * utilization, clocks, processes). */
static int monitoring_supported(nvmlDevice_t device, unsigned int *supported)
{
    return mock_constant_uint(device, MOCK_GUARDED, 1, supported);
}

/* Slot 138: (device, &violation), the time the thermal policy has held the
 * clocks down, as an nvmlViolationTime_t: `dmon -s v` prints tviol 1 for a
 * sample in which violationTime grew (or the GPU is at its slowdown
 * temperature), else 0; a failed call prints "-".  It is
 * nvmlDeviceGetViolationStatus's thermal figure. */
static int thermal_violation(nvmlDevice_t device, nvmlViolationTime_t *violation)
{
    return nvmlDeviceGetViolationStatus(device, NVML_PERF_POLICY_THERMAL, violation);
}

/* Slot 145: (device, lastSeenTimeStamp, &unknown, &count, records), the
 * per-process SM, memory, encoder and decoder use `pmon` prints.  *count
 * is the room in (nvidia-smi passes 100), the records written out;
 * NVML_ERROR_NOT_FOUND (nothing since lastSeen) and NOT_SUPPORTED are
 * accepted, any other error fails pmon.  A record is 328 bytes: a time
 * stamp, then one 80-byte block per engine in the order sm, mem, enc, dec,
 * each starting with the utilization and, 8 bytes further, the pid
 * (0xFFFFFFFF: no process on that engine).  nvidia-smi adds each block's
 * utilization to its pid's total divided by *count, the number of records
 * (records are samples in time).  The mock writes one record per process,
 * from the public nvmlDeviceGetProcessUtilization, with each value times
 * the record count: the averages pmon prints are then exactly the public
 * getter's per-process figures. */
enum { SMI_ENGINES = 4, SMI_NO_PID = 0xFFFFFFFFu, SMI_MAX_RECORDS = 256 };
struct smi_engine_sample {
    unsigned util;
    unsigned reserved0;
    unsigned pid;
    unsigned char reserved[68];
};
struct smi_process_sample {
    unsigned long long timestamp;
    struct smi_engine_sample engine[SMI_ENGINES]; /* sm, mem, enc, dec */
};
_Static_assert(sizeof(struct smi_process_sample) == 328, "nvidia-smi 535's pmon record");

static int process_engine_samples(nvmlDevice_t device, unsigned long long last_seen,
                                  unsigned int *unknown, unsigned int *count,
                                  struct smi_process_sample *records)
{
    (void)unknown; /* an output nvidia-smi 535 never reads */
    if (count == NULL || records == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlProcessUtilizationSample_t samples[SMI_MAX_RECORDS];
    unsigned n = *count < SMI_MAX_RECORDS ? *count : SMI_MAX_RECORDS;
    nvmlReturn_t r = nvmlDeviceGetProcessUtilization(device, samples, &n, last_seen);
    if (r == NVML_ERROR_NOT_FOUND)
        *count = 0;
    if (r != NVML_SUCCESS)
        return r;
    for (unsigned i = 0; i < n; i++) {
        const unsigned util[SMI_ENGINES] = {samples[i].smUtil, samples[i].memUtil,
                                            samples[i].encUtil, samples[i].decUtil};
        memset(&records[i], 0, sizeof records[i]);
        records[i].timestamp = samples[i].timeStamp;
        for (unsigned e = 0; e < SMI_ENGINES; e++) {
            records[i].engine[e].util = util[e] * n;
            records[i].engine[e].pid = samples[i].pid;
        }
    }
    *count = n;
    return NVML_SUCCESS;
}

/* Slot 226: (device, caps[2]) -> caps[0] outbound, caps[1] inbound, as
 * NVML_PCIE_ATOMICS_CAP_* bits (0 prints N/A for that direction). */
static int read_atomic_caps(const struct mock_config *cfg, unsigned pos, void *out)
{
    unsigned *caps = out, outbound = 0, inbound = 0;
    int found = mock_dev_uint(cfg, pos, "pcie.atomics_outbound_mask", &outbound);
    found |= mock_dev_uint(cfg, pos, "pcie.atomics_inbound_mask", &inbound);
    if (found) {
        caps[0] = outbound;
        caps[1] = inbound;
    }
    return found;
}

static int pcie_atomic_caps(nvmlDevice_t device, unsigned int *caps)
{
    if (caps == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return mock_read(device, read_atomic_caps, caps);
}

/* Slot 230: (device, &generation): the host side's top PCIe generation,
 * which `-q` prints as "Host Max" under "GPU Link Info" (`max_host_link_gen`):
 * the profile's pcie.max_host_link_gen; without one NOT_SUPPORTED, which
 * prints N/A, as most real boards do. */
static int pcie_max_host_link_gen(nvmlDevice_t device, unsigned int *generation)
{
    return mock_uint_field(device, MOCK_GUARDED, "pcie.max_host_link_gen", generation);
}

/* Slot 231: (device, buffer, length), the string nvmlDeviceGetBoardPartNumber's
 * sibling would return. */
static int gpu_part_number(nvmlDevice_t device, char *buf, unsigned int length)
{
    return mock_string_field(device, MOCK_GUARDED, "gpu_part_number", buf, length);
}

/* Slot 240: (device, &celsius), nvmlDeviceGetMarginTemperature's value. */
static int tlimit_temperature(nvmlDevice_t device, int *celsius)
{
    if (celsius == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlMarginTemperature_t margin = {.version = nvmlMarginTemperature_v1};
    nvmlReturn_t r = nvmlDeviceGetMarginTemperature(device, &margin);
    if (r == NVML_SUCCESS)
        *celsius = margin.marginTemperature;
    return r;
}

/* Slot 242: (device, &mode), NVML_DEVICE_ADDRESSING_MODE_* as
 * nvmlDeviceGetAddressingMode reports it. */
static int addressing_mode(nvmlDevice_t device, unsigned int *mode)
{
    if (mode == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlDeviceAddressingMode_t info = {.version = nvmlDeviceAddressingMode_v1};
    nvmlReturn_t r = nvmlDeviceGetAddressingMode(device, &info);
    if (r == NVML_SUCCESS)
        *mode = info.value;
    return r;
}

/* Slot 243: (device, &enabled), the profile's sparse_operation_mode. */
static int sparse_operation_mode(nvmlDevice_t device, unsigned int *enabled)
{
    static const struct mock_enum_name modes[] = {{"disabled", 0}, {"enabled", 1}};
    if (enabled == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return mock_enum_field(device, MOCK_GUARDED, "sparse_operation_mode", modes,
                           MOCK_COUNT(modes), MOCK_ENUM_REQUIRED, enabled);
}

/* Slots 213, 214 and 215: (device, &count, records), the compute, the
 * graphics and the MPS processes (the process table, --query-compute-apps, -q -d PIDS);
 * *count is the caller's room in, the process count out.  nvidia-smi 535
 * reads records of 4128 bytes (the second one's pid at offset 4128):
 * nvmlProcessDetail_v1_t's fields, then the process name (4096 bytes, the
 * table and -q print it; --query-compute-apps asks nvmlSystemGetProcessName
 * instead).  The list is the public _v3 getter's and the name the public
 * lookup's, so the views never differ. */
struct smi_process {
    nvmlProcessDetail_v1_t detail;
    char name[4096];
};
_Static_assert(sizeof(struct smi_process) == 4128, "nvidia-smi 535's process record");

typedef nvmlReturn_t (*process_getter)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);

static int smi_processes(process_getter get, nvmlDevice_t device, unsigned int *count,
                         struct smi_process *records)
{
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlProcessInfo_t infos[256];
    unsigned n = records == NULL ? 0 : *count;
    if (n > MOCK_COUNT(infos))
        n = MOCK_COUNT(infos);
    nvmlReturn_t r = get(device, &n, n ? infos : NULL);
    if (r == NVML_SUCCESS) {
        for (unsigned i = 0; i < n; i++) {
            memset(&records[i], 0, sizeof records[i]);
            records[i].detail.pid = infos[i].pid;
            records[i].detail.usedGpuMemory = infos[i].usedGpuMemory;
            records[i].detail.gpuInstanceId = infos[i].gpuInstanceId;
            records[i].detail.computeInstanceId = infos[i].computeInstanceId;
            nvmlSystemGetProcessName(infos[i].pid, records[i].name, sizeof records[i].name);
        }
    }
    if (r == NVML_SUCCESS || r == NVML_ERROR_INSUFFICIENT_SIZE)
        *count = n;
    return r;
}

static int compute_processes(nvmlDevice_t device, unsigned int *count,
                             struct smi_process *records)
{
    return smi_processes(nvmlDeviceGetComputeRunningProcesses_v3, device, count, records);
}

static int graphics_processes(nvmlDevice_t device, unsigned int *count,
                              struct smi_process *records)
{
    return smi_processes(nvmlDeviceGetGraphicsRunningProcesses_v3, device, count, records);
}

static int mps_processes(nvmlDevice_t device, unsigned int *count, struct smi_process *records)
{
    return smi_processes(nvmlDeviceGetMPSComputeRunningProcesses_v3, device, count, records);
}

/* Slot 20: (device, &isPrimary, NULL, size): a datacenter board is headless. */
static int is_primary_gpu(nvmlDevice_t device, unsigned int *is_primary, void *unused,
                          unsigned int size)
{
    (void)unused;
    (void)size;
    if (is_primary == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlPciInfo_t pci;
    nvmlReturn_t r = nvmlDeviceGetPciInfo_v3(device, &pci); /* a handle of ours */
    if (r != NVML_SUCCESS)
        return r;
    *is_primary = 0;
    return NVML_SUCCESS;
}

/* Slot 169: (&state, ...): 0, no fabric operation in progress. */
static int fabric_state(unsigned int *state)
{
    if (state == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *state = 0;
    return NVML_SUCCESS;
}

/* Slot 182: (&group, devices, count, flags); nvidia-smi hands the group
 * back to 183 and 184 only, so any non-NULL token does. */
static int reset_group_alloc(void **group, nvmlDevice_t *devices, unsigned int count,
                             unsigned int flags)
{
    static int token;
    (void)flags;
    if (group == NULL || devices == NULL || count == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *group = &token;
    return NVML_SUCCESS;
}

static int reset_group_step(void *group)
{
    return group == NULL ? NVML_ERROR_INVALID_ARGUMENT : NVML_SUCCESS;
}

/* Slot 168: (count, devices, ...): the reset, by the daemon, GPU by GPU. */
static int reset_devices(unsigned int count, nvmlDevice_t *devices)
{
    if (devices == NULL || count == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < count; i++) {
        nvmlReturn_t r = mock_set_device(devices[i], "reset", "gpu");
        if (r != NVML_SUCCESS)
            return r;
    }
    return NVML_SUCCESS;
}

_Static_assert(EXPORT_TABLE_SLOTS > SLOT_TOPOLOGY_LEVEL, "export table too small for slot 23");
static const void *g_table[EXPORT_TABLE_SLOTS];
static pthread_once_t g_table_once = PTHREAD_ONCE_INIT;

/* A slot past a smaller table (the size proof builds one) is left out. */
static void set_slot(unsigned slot, const void *fn)
{
    if (slot < EXPORT_TABLE_SLOTS)
        g_table[slot] = fn;
}

static void build_table(void)
{
    g_table[0] = (const void *)(uintptr_t)MOCK_EXPORT_TABLE_BYTES;
    g_table[SLOT_PARSE_BUS_ID] = (const void *)(uintptr_t)&parse_bus_id;
    g_table[SLOT_TOPOLOGY_LEVEL] = (const void *)(uintptr_t)&topology_level;
    set_slot(SLOT_GPU_PCI_LOCATION, (const void *)(uintptr_t)&gpu_pci_location);
    /* Slot 108: (device, &milliwatts): the public getter, as in NVIDIA's table. */
    set_slot(SLOT_ENFORCED_POWER_LIMIT, (const void *)(uintptr_t)&nvmlDeviceGetEnforcedPowerLimit);
    set_slot(SLOT_MONITORING_SUPPORTED, (const void *)(uintptr_t)&monitoring_supported);
    set_slot(SLOT_THERMAL_VIOLATION, (const void *)(uintptr_t)&thermal_violation);
    set_slot(SLOT_PROCESS_ENGINE_SAMPLES, (const void *)(uintptr_t)&process_engine_samples);
    set_slot(SLOT_PCIE_ATOMIC_CAPS, (const void *)(uintptr_t)&pcie_atomic_caps);
    set_slot(SLOT_PCIE_MAX_HOST_LINK_GEN, (const void *)(uintptr_t)&pcie_max_host_link_gen);
    set_slot(SLOT_GPU_PART_NUMBER, (const void *)(uintptr_t)&gpu_part_number);
    set_slot(SLOT_TLIMIT_TEMPERATURE, (const void *)(uintptr_t)&tlimit_temperature);
    set_slot(SLOT_ADDRESSING_MODE, (const void *)(uintptr_t)&addressing_mode);
    set_slot(SLOT_SPARSE_OPERATION_MODE, (const void *)(uintptr_t)&sparse_operation_mode);
    set_slot(SLOT_COMPUTE_PROCESSES, (const void *)(uintptr_t)&compute_processes);
    set_slot(SLOT_GRAPHICS_PROCESSES, (const void *)(uintptr_t)&graphics_processes);
    set_slot(SLOT_MPS_PROCESSES, (const void *)(uintptr_t)&mps_processes);
    set_slot(SLOT_IS_PRIMARY_GPU, (const void *)(uintptr_t)&is_primary_gpu);
    set_slot(SLOT_FABRIC_STATE, (const void *)(uintptr_t)&fabric_state);
    set_slot(SLOT_RESET_GROUP_ALLOC, (const void *)(uintptr_t)&reset_group_alloc);
    set_slot(SLOT_RESET_GROUP_PREPARE, (const void *)(uintptr_t)&reset_group_step);
    set_slot(SLOT_RESET_GROUP_CHECK, (const void *)(uintptr_t)&reset_group_step);
    set_slot(SLOT_RESET_DEVICES, (const void *)(uintptr_t)&reset_devices);
    /* Slot 223: (device, words, nodeSet, scope), the NUMA nodes of the CPUs
     * nearest the GPU, which `topo -i <gpu> -C` prints as "NUMA IDs of
     * closest CPU" (a failure: "Failed to display NUMA ID of nearest CPU",
     * exit 255).  nvidia-smi passes 20 words and scope 0 (NVML_AFFINITY_SCOPE_NODE). */
    set_slot(SLOT_CPU_NUMA_AFFINITY, (const void *)(uintptr_t)&mock_cpu_numa_affinity);
}

MOCK_API nvmlReturn_t nvmlInternalGetExportTable(const void **ppExportTable,
                                                 const unsigned char *pExportTableId)
{
    if (ppExportTable == NULL || pExportTableId == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memcmp(pExportTableId, SMI_TABLE_GUID, sizeof SMI_TABLE_GUID) != 0) {
        mock_debug("export table requested for an unknown id");
        return NVML_ERROR_NOT_SUPPORTED;
    }
    pthread_once(&g_table_once, build_table);
    *ppExportTable = g_table;
    return NVML_SUCCESS;
}
