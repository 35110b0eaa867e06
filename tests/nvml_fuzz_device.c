/*
 * The per-device sweep of the mock NVML fuzz driver: every implemented
 * getter of one device, with good and bad arguments, checked against
 * NVML's contract (see tests/nvml_fuzz_driver.c).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvml_fuzz_driver.h"

/* ------------------------------------------------------------------ strings */

typedef nvmlReturn_t (*string_getter)(nvmlDevice_t, char *, unsigned int);

static void check_string(const char *what, nvmlDevice_t dev, string_getter fn)
{
    static const unsigned lengths[] = {0, 1, 8, 16, 32, 80, 96, 4097};
    for (size_t i = 0; i < sizeof lengths / sizeof *lengths; i++) {
        unsigned len = lengths[i];
        char *buf = malloc(len ? len : 1);
        memset(buf, 0x5a, len ? len : 1);
        nvmlReturn_t r = rc(what, fn(dev, buf, len));
        if (r == NVML_SUCCESS && memchr(buf, '\0', len) == NULL)
            violation("%s: success without a terminator in %u bytes", what, len);
        free(buf);
    }
    rc(what, fn(dev, NULL, 64));
}

static nvmlReturn_t inforom_oem(nvmlDevice_t d, char *b, unsigned l)
{
    return nvmlDeviceGetInforomVersion(d, NVML_INFOROM_OEM, b, l);
}
static nvmlReturn_t inforom_ecc(nvmlDevice_t d, char *b, unsigned l)
{
    return nvmlDeviceGetInforomVersion(d, NVML_INFOROM_ECC, b, l);
}
static nvmlReturn_t inforom_power(nvmlDevice_t d, char *b, unsigned l)
{
    return nvmlDeviceGetInforomVersion(d, NVML_INFOROM_POWER, b, l);
}
static nvmlReturn_t inforom_bad(nvmlDevice_t d, char *b, unsigned l)
{
    return nvmlDeviceGetInforomVersion(d, NVML_INFOROM_COUNT, b, l);
}

static const struct {
    const char *name;
    string_getter fn;
} STRING_GETTERS[] = {
    {"name", nvmlDeviceGetName},
    {"uuid", nvmlDeviceGetUUID},
    {"serial", nvmlDeviceGetSerial},
    {"board_part_number", nvmlDeviceGetBoardPartNumber},
    {"vbios", nvmlDeviceGetVbiosVersion},
    {"inforom_image", nvmlDeviceGetInforomImageVersion},
    {"inforom_oem", inforom_oem},
    {"inforom_ecc", inforom_ecc},
    {"inforom_power", inforom_power},
    {"inforom_bad", inforom_bad},
};

void check_strings(nvmlDevice_t dev)
{
    for (size_t s = 0; s < sizeof STRING_GETTERS / sizeof *STRING_GETTERS; s++)
        check_string(STRING_GETTERS[s].name, dev, STRING_GETTERS[s].fn);
}

/* --------------------------------------------------------------- scalars */

static const struct {
    const char *name;
    uint_getter fn;
} UINT_GETTERS[] = {
    {"minor", nvmlDeviceGetMinorNumber},
    {"board_id", nvmlDeviceGetBoardId},
    {"module_id", nvmlDeviceGetModuleId},
    {"cores", nvmlDeviceGetNumGpuCores},
    {"bus_width", nvmlDeviceGetMemoryBusWidth},
    {"index", nvmlDeviceGetIndex},
    {"multi_gpu", nvmlDeviceGetMultiGpuBoard},
    {"accounting_buffer", nvmlDeviceGetAccountingBufferSize},
    {"is_mig", nvmlDeviceIsMigDeviceHandle},
    {"max_link_gen", nvmlDeviceGetMaxPcieLinkGeneration},
    {"gpu_max_link_gen", nvmlDeviceGetGpuMaxPcieLinkGeneration},
    {"link_gen", nvmlDeviceGetCurrPcieLinkGeneration},
    {"max_link_width", nvmlDeviceGetMaxPcieLinkWidth},
    {"link_width", nvmlDeviceGetCurrPcieLinkWidth},
    {"replay", nvmlDeviceGetPcieReplayCounter},
    {"pcie_speed", nvmlDeviceGetPcieSpeed},
    {"numa", nvmlDeviceGetNumaNodeId},
    {"power", nvmlDeviceGetPowerUsage},
    {"power_limit", nvmlDeviceGetPowerManagementLimit},
    {"enforced_limit", nvmlDeviceGetEnforcedPowerLimit},
    {"default_limit", nvmlDeviceGetPowerManagementDefaultLimit},
    {"fans", nvmlDeviceGetNumFans},
    {"fan_speed", nvmlDeviceGetFanSpeed},
    {"mig_max", nvmlDeviceGetMaxMigDeviceCount},
};

void check_scalars(nvmlDevice_t dev)
{
    for (size_t i = 0; i < sizeof UINT_GETTERS / sizeof *UINT_GETTERS; i++) {
        unsigned value;
        rc(UINT_GETTERS[i].name, UINT_GETTERS[i].fn(dev, &value));
        rc(UINT_GETTERS[i].name, UINT_GETTERS[i].fn(dev, NULL));
    }
    nvmlEnableState_t on, pending;
    CALL(nvmlDeviceGetPersistenceMode(dev, &on));
    CALL(nvmlDeviceGetDisplayMode(dev, &on));
    CALL(nvmlDeviceGetDisplayActive(dev, &on));
    CALL(nvmlDeviceGetAccountingMode(dev, &on));
    CALL(nvmlDeviceGetPowerManagementMode(dev, &on));
    CALL(nvmlDeviceGetRetiredPagesPendingStatus(dev, &on));
    CALL(nvmlDeviceGetDefaultEccMode(dev, &on));
    CALL(nvmlDeviceGetEccMode(dev, &on, &pending));
    CALL(nvmlDeviceGetEccMode(dev, NULL, &pending));
    nvmlBrandType_t brand;
    nvmlDeviceArchitecture_t arch;
    nvmlComputeMode_t compute;
    nvmlGpuVirtualizationMode_t virt;
    nvmlGpuOperationMode_t gom, gom_pending;
    CALL(nvmlDeviceGetBrand(dev, &brand));
    CALL(nvmlDeviceGetArchitecture(dev, &arch));
    CALL(nvmlDeviceGetComputeMode(dev, &compute));
    CALL(nvmlDeviceGetVirtualizationMode(dev, &virt));
    CALL(nvmlDeviceGetGpuOperationMode(dev, &gom, &gom_pending));
    int major, minor;
    CALL(nvmlDeviceGetCudaComputeCapability(dev, &major, &minor));
    unsigned enabled, mode, current, pend, u1, u2, u3, u4;
    CALL(nvmlDeviceGetGspFirmwareMode(dev, &enabled, &mode));
    char gsp[0x40];
    CALL(nvmlDeviceGetGspFirmwareVersion(dev, gsp));
    CALL(nvmlDeviceGetMigMode(dev, &current, &pend));
    nvmlDevice_t mig;
    CALL(nvmlDeviceGetMigDeviceHandleByIndex(dev, 0, &mig));
    CALL(nvmlDeviceGetPowerManagementLimitConstraints(dev, &u1, &u2));
    unsigned long long energy;
    CALL(nvmlDeviceGetTotalEnergyConsumption(dev, &energy));
    nvmlPstates_t pstate = NVML_PSTATE_UNKNOWN;
    if (CALL(nvmlDeviceGetPerformanceState(dev, &pstate)) == NVML_SUCCESS &&
        pstate != NVML_PSTATE_UNKNOWN && (unsigned)pstate > 15)
        violation("performance state %u", (unsigned)pstate);
    if (CALL(nvmlDeviceGetPowerState(dev, &pstate)) == NVML_SUCCESS &&
        pstate != NVML_PSTATE_UNKNOWN && (unsigned)pstate > 15)
        violation("power state %u", (unsigned)pstate);
    for (int t = 0; t <= NVML_TEMPERATURE_COUNT; t++)
        CALL(nvmlDeviceGetTemperature(dev, (nvmlTemperatureSensors_t)t, &u1));
    for (int t = 0; t <= NVML_TEMPERATURE_THRESHOLD_COUNT; t++)
        CALL(nvmlDeviceGetTemperatureThreshold(dev, (nvmlTemperatureThresholds_t)t, &u1));
    nvmlTemperature_t temp = {.version = nvmlTemperature_v1, .sensorType = NVML_TEMPERATURE_GPU};
    CALL(nvmlDeviceGetTemperatureV(dev, &temp));
    nvmlMarginTemperature_t margin = {.version = nvmlMarginTemperature_v1};
    CALL(nvmlDeviceGetMarginTemperature(dev, &margin));
    for (unsigned fan = 0; fan < 4; fan++)
        CALL(nvmlDeviceGetFanSpeed_v2(dev, fan, &u1));
    for (int c = 0; c <= NVML_CLOCK_COUNT; c++) {
        CALL(nvmlDeviceGetClockInfo(dev, (nvmlClockType_t)c, &u1));
        CALL(nvmlDeviceGetMaxClockInfo(dev, (nvmlClockType_t)c, &u1));
        CALL(nvmlDeviceGetApplicationsClock(dev, (nvmlClockType_t)c, &u1));
        CALL(nvmlDeviceGetDefaultApplicationsClock(dev, (nvmlClockType_t)c, &u1));
        CALL(nvmlDeviceGetMaxCustomerBoostClock(dev, (nvmlClockType_t)c, &u1));
        for (int id = 0; id <= NVML_CLOCK_ID_COUNT; id++)
            CALL(nvmlDeviceGetClock(dev, (nvmlClockType_t)c, (nvmlClockId_t)id, &u1));
    }
    unsigned long long reasons;
    CALL(nvmlDeviceGetCurrentClocksEventReasons(dev, &reasons));
    CALL(nvmlDeviceGetCurrentClocksThrottleReasons(dev, &reasons));
    CALL(nvmlDeviceGetSupportedClocksEventReasons(dev, &reasons));
    CALL(nvmlDeviceGetSupportedClocksThrottleReasons(dev, &reasons));
    CALL(nvmlDeviceGetSupportedEventTypes(dev, &reasons));
    nvmlUtilization_t util;
    CALL(nvmlDeviceGetUtilizationRates(dev, &util));
    CALL(nvmlDeviceGetEncoderUtilization(dev, &u1, &u2));
    CALL(nvmlDeviceGetDecoderUtilization(dev, &u1, &u2));
    CALL(nvmlDeviceGetJpgUtilization(dev, &u1, &u2));
    CALL(nvmlDeviceGetOfaUtilization(dev, &u1, &u2));
    CALL(nvmlDeviceGetEncoderStats(dev, &u1, &u2, &u3));
    nvmlFBCStats_t fbc;
    CALL(nvmlDeviceGetFBCStats(dev, &fbc));
    CALL(nvmlDeviceGetEncoderSessions(dev, &u1, NULL));
    CALL(nvmlDeviceGetFBCSessions(dev, &u1, NULL));
    CALL(nvmlDeviceGetRemappedRows(dev, &u1, &u2, &u3, &u4));
    nvmlRowRemapperHistogramValues_t histogram;
    CALL(nvmlDeviceGetRowRemapperHistogram(dev, &histogram));
    for (int scope = 0; scope <= 2; scope++) {
        nvmlPlatformInfo_t platform = {.version = nvmlPlatformInfo_v2};
        CALL(nvmlDeviceGetPlatformInfo(dev, &platform));
    }
    nvmlDeviceAddressingMode_t addressing = {.version = nvmlDeviceAddressingMode_v1};
    CALL(nvmlDeviceGetAddressingMode(dev, &addressing));
    nvmlMemory_t cc;
    CALL(nvmlDeviceGetConfComputeProtectedMemoryUsage(dev, &cc));
}

/* ------------------------------------------------------------ memory, ECC */

void check_memory(nvmlDevice_t dev)
{
    nvmlMemory_t v1;
    if (CALL(nvmlDeviceGetMemoryInfo(dev, &v1)) == NVML_SUCCESS && v1.used + v1.free != v1.total)
        violation("memory v1: used %llu + free %llu != total %llu", v1.used, v1.free, v1.total);
    nvmlMemory_v2_t v2 = {.version = nvmlMemory_v2};
    if (CALL(nvmlDeviceGetMemoryInfo_v2(dev, &v2)) == NVML_SUCCESS &&
        v2.reserved + v2.used + v2.free != v2.total)
        violation("memory v2: reserved + used + free != total %llu", v2.total);
    nvmlBAR1Memory_t bar1;
    if (CALL(nvmlDeviceGetBAR1MemoryInfo(dev, &bar1)) == NVML_SUCCESS &&
        bar1.bar1Used + bar1.bar1Free != bar1.bar1Total)
        violation("bar1: used + free != total %llu", bar1.bar1Total);
    unsigned long long count;
    nvmlEccErrorCounts_t detailed;
    for (int type = 0; type <= NVML_MEMORY_ERROR_TYPE_COUNT; type++) {
        for (int counter = 0; counter <= NVML_ECC_COUNTER_TYPE_COUNT; counter++) {
            CALL(nvmlDeviceGetTotalEccErrors(dev, (nvmlMemoryErrorType_t)type,
                                             (nvmlEccCounterType_t)counter, &count));
            CALL(nvmlDeviceGetDetailedEccErrors(dev, (nvmlMemoryErrorType_t)type,
                                                (nvmlEccCounterType_t)counter, &detailed));
            for (int loc = 0; loc <= NVML_MEMORY_LOCATION_COUNT; loc++)
                CALL(nvmlDeviceGetMemoryErrorCounter(dev, (nvmlMemoryErrorType_t)type,
                                                     (nvmlEccCounterType_t)counter,
                                                     (nvmlMemoryLocation_t)loc, &count));
        }
    }
    nvmlEccSramErrorStatus_t sram = {.version = nvmlEccSramErrorStatus_v1};
    CALL(nvmlDeviceGetSramEccErrorStatus(dev, &sram));
}

/* ------------------------------------------------------------------ lists */

/* A caller-sized list: ask the size, then fetch into an exact-size array. */
typedef nvmlReturn_t (*list_call)(nvmlDevice_t, unsigned int *, void *, const void *);

static void check_list(const char *what, nvmlDevice_t dev, list_call fn, size_t item,
                       const void *arg)
{
    unsigned count = 0;
    nvmlReturn_t r = rc(what, fn(dev, &count, NULL, arg));
    if (r != NVML_SUCCESS && r != NVML_ERROR_INSUFFICIENT_SIZE)
        return;
    if (count > LIST_LIMIT) {
        violation("%s: %u entries", what, count);
        return;
    }
    unsigned room = count;
    void *array = malloc(room ? room * item : 1);
    r = rc(what, fn(dev, &count, room ? array : NULL, arg));
    if (r == NVML_SUCCESS && room > 0 && count > room)
        violation("%s: %u entries returned into room for %u", what, count, room);
    if (room > 1) {
        /* One short: must say INSUFFICIENT_SIZE and write at most room - 1. */
        unsigned short_count = room - 1;
        void *small = malloc(short_count * item);
        r = rc(what, fn(dev, &short_count, small, arg));
        if (r == NVML_SUCCESS && short_count > room - 1)
            violation("%s: success with %u entries into room for %u", what, short_count,
                      room - 1);
        free(small);
    }
    free(array);
}

static nvmlReturn_t processes_v3(nvmlDevice_t d, unsigned *n, void *a, const void *arg)
{
    return *(const int *)arg ? nvmlDeviceGetGraphicsRunningProcesses_v3(d, n, a)
                             : nvmlDeviceGetComputeRunningProcesses_v3(d, n, a);
}
static nvmlReturn_t processes_v2(nvmlDevice_t d, unsigned *n, void *a, const void *arg)
{
    return *(const int *)arg ? nvmlDeviceGetGraphicsRunningProcesses_v2(d, n, a)
                             : nvmlDeviceGetComputeRunningProcesses_v2(d, n, a);
}
static nvmlReturn_t processes_v1(nvmlDevice_t d, unsigned *n, void *a, const void *arg)
{
    return *(const int *)arg ? nvmlDeviceGetGraphicsRunningProcesses(d, n, a)
                             : nvmlDeviceGetComputeRunningProcesses(d, n, a);
}
static nvmlReturn_t retired_v1(nvmlDevice_t d, unsigned *n, void *a, const void *arg)
{
    return nvmlDeviceGetRetiredPages(d, *(const nvmlPageRetirementCause_t *)arg, n, a);
}
static nvmlReturn_t memory_clocks(nvmlDevice_t d, unsigned *n, void *a, const void *arg)
{
    (void)arg;
    return nvmlDeviceGetSupportedMemoryClocks(d, n, a);
}
static nvmlReturn_t graphics_clocks(nvmlDevice_t d, unsigned *n, void *a, const void *arg)
{
    return nvmlDeviceGetSupportedGraphicsClocks(d, *(const unsigned *)arg, n, a);
}
static nvmlReturn_t nearest(nvmlDevice_t d, unsigned *n, void *a, const void *arg)
{
    return nvmlDeviceGetTopologyNearestGpus(d, *(const nvmlGpuTopologyLevel_t *)arg, n, a);
}

void check_lists(nvmlDevice_t dev, unsigned *pids, unsigned *npids)
{
    for (int graphics = 0; graphics <= 1; graphics++) {
        check_list("processes_v3", dev, processes_v3, sizeof(nvmlProcessInfo_t), &graphics);
        check_list("processes_v2", dev, processes_v2, sizeof(nvmlProcessInfo_v2_t), &graphics);
        check_list("processes_v1", dev, processes_v1, sizeof(nvmlProcessInfo_v1_t), &graphics);
        unsigned count = 0;
        if (nvmlDeviceGetComputeRunningProcesses_v3(dev, &count, NULL) ==
                NVML_ERROR_INSUFFICIENT_SIZE &&
            count <= LIST_LIMIT) {
            nvmlProcessInfo_t *infos = calloc(count, sizeof *infos);
            if (nvmlDeviceGetComputeRunningProcesses_v3(dev, &count, infos) == NVML_SUCCESS)
                for (unsigned i = 0; i < count && *npids < 64; i++)
                    pids[(*npids)++] = infos[i].pid;
            free(infos);
        }
    }
    for (int cause = 0; cause <= NVML_PAGE_RETIREMENT_CAUSE_COUNT; cause++) {
        nvmlPageRetirementCause_t c = (nvmlPageRetirementCause_t)cause;
        check_list("retired_pages", dev, retired_v1, sizeof(unsigned long long), &c);
        unsigned count = 0;
        if (CALL(nvmlDeviceGetRetiredPages_v2(dev, c, &count, NULL, NULL)) ==
                NVML_ERROR_INSUFFICIENT_SIZE &&
            count > 0 && count <= LIST_LIMIT) {
            unsigned long long *addresses = malloc(count * sizeof *addresses);
            unsigned long long *stamps = malloc(count * sizeof *stamps);
            CALL(nvmlDeviceGetRetiredPages_v2(dev, c, &count, addresses, stamps));
            free(addresses);
            free(stamps);
        }
    }
    check_list("memory_clocks", dev, memory_clocks, sizeof(unsigned), NULL);
    unsigned count = 0;
    nvmlReturn_t r = nvmlDeviceGetSupportedMemoryClocks(dev, &count, NULL);
    if ((r == NVML_ERROR_INSUFFICIENT_SIZE || r == NVML_SUCCESS) && count <= LIST_LIMIT) {
        unsigned *clocks = malloc((count ? count : 1) * sizeof *clocks);
        if (count > 0 && nvmlDeviceGetSupportedMemoryClocks(dev, &count, clocks) == NVML_SUCCESS)
            for (unsigned i = 0; i < count && i < 8; i++)
                check_list("graphics_clocks", dev, graphics_clocks, sizeof(unsigned), &clocks[i]);
        free(clocks);
    }
    unsigned missing = 0xdeadbeef;
    check_list("graphics_clocks_missing", dev, graphics_clocks, sizeof(unsigned), &missing);
    static const nvmlGpuTopologyLevel_t levels[] = {
        NVML_TOPOLOGY_INTERNAL, NVML_TOPOLOGY_SINGLE, NVML_TOPOLOGY_MULTIPLE,
        NVML_TOPOLOGY_HOSTBRIDGE, NVML_TOPOLOGY_NODE, NVML_TOPOLOGY_SYSTEM};
    for (size_t i = 0; i < sizeof levels / sizeof *levels; i++)
        check_list("nearest_gpus", dev, nearest, sizeof(nvmlDevice_t), &levels[i]);
}

/* ------------------------------------------------------- PCI and topology */

void check_pci(nvmlDevice_t dev, unsigned count)
{
    nvmlPciInfo_t pci;
    memset(&pci, 0x5a, sizeof pci);
    if (CALL(nvmlDeviceGetPciInfo_v3(dev, &pci)) == NVML_SUCCESS) {
        if (memchr(pci.busId, '\0', sizeof pci.busId) == NULL ||
            memchr(pci.busIdLegacy, '\0', sizeof pci.busIdLegacy) == NULL)
            violation("pci info: unterminated bus id");
        nvmlDevice_t found;
        unsigned index;
        if (CALL(nvmlDeviceGetHandleByPciBusId_v2(pci.busId, &found)) == NVML_SUCCESS &&
            !handle_index(found, count, &index))
            violation("handle by bus id %s: not a visible device", pci.busId);
    }
    CALL(nvmlDeviceGetPciInfo(dev, &pci));
    nvmlPciInfoExt_t ext = {.version = nvmlPciInfoExt_v1};
    CALL(nvmlDeviceGetPciInfoExt(dev, &ext));
    unsigned value;
    for (int counter = 0; counter <= NVML_PCIE_UTIL_COUNT; counter++)
        CALL(nvmlDeviceGetPcieThroughput(dev, (nvmlPcieUtilCounter_t)counter, &value));
    for (unsigned words = 1; words <= 4; words *= 2) {
        unsigned long *set = malloc(words * sizeof *set);
        CALL(nvmlDeviceGetCpuAffinity(dev, words, set));
        CALL(nvmlDeviceGetCpuAffinityWithinScope(dev, words, set, NVML_AFFINITY_SCOPE_SOCKET));
        CALL(nvmlDeviceGetMemoryAffinity(dev, words, set, NVML_AFFINITY_SCOPE_NODE));
        free(set);
    }
    for (unsigned other = 0; other < count; other++) {
        nvmlGpuTopologyLevel_t level;
        CALL(nvmlDeviceGetTopologyCommonAncestor(dev, g_handles[other], &level));
        for (int p2p = 0; p2p <= NVML_P2P_CAPS_INDEX_UNKNOWN; p2p++) {
            nvmlGpuP2PStatus_t status;
            CALL(nvmlDeviceGetP2PStatus(dev, g_handles[other], (nvmlGpuP2PCapsIndex_t)p2p,
                                        &status));
        }
    }
}

/* -------------------------------------------------------- NVLink, fabric */

void check_nvlink(nvmlDevice_t dev)
{
    for (unsigned link = 0; link <= NVML_NVLINK_MAX_LINKS; link++) {
        nvmlEnableState_t active;
        unsigned value;
        CALL(nvmlDeviceGetNvLinkState(dev, link, &active));
        CALL(nvmlDeviceGetNvLinkVersion(dev, link, &value));
        for (int cap = 0; cap <= NVML_NVLINK_CAP_COUNT; cap++)
            CALL(nvmlDeviceGetNvLinkCapability(dev, link, (nvmlNvLinkCapability_t)cap, &value));
        nvmlPciInfo_t pci;
        memset(&pci, 0x5a, sizeof pci);
        if (CALL(nvmlDeviceGetNvLinkRemotePciInfo_v2(dev, link, &pci)) == NVML_SUCCESS &&
            (memchr(pci.busId, '\0', sizeof pci.busId) == NULL ||
             memchr(pci.busIdLegacy, '\0', sizeof pci.busIdLegacy) == NULL))
            violation("remote pci info of link %u: unterminated bus id", link);
        CALL(nvmlDeviceGetNvLinkRemotePciInfo(dev, link, &pci));
        nvmlIntNvLinkDeviceType_t type;
        CALL(nvmlDeviceGetNvLinkRemoteDeviceType(dev, link, &type));
        unsigned long long errors;
        for (int counter = 0; counter <= NVML_NVLINK_ERROR_COUNT; counter++)
            CALL(nvmlDeviceGetNvLinkErrorCounter(dev, link, (nvmlNvLinkErrorCounter_t)counter,
                                                 &errors));
    }
    nvmlGpuFabricInfo_t fabric;
    CALL(nvmlDeviceGetGpuFabricInfo(dev, &fabric));
    nvmlGpuFabricInfoV_t v2 = {.version = nvmlGpuFabricInfo_v2};
    CALL(nvmlDeviceGetGpuFabricInfoV(dev, &v2));
    nvmlGpuFabricInfoV_t v3 = {.version = nvmlGpuFabricInfo_v3};
    CALL(nvmlDeviceGetGpuFabricInfoV(dev, &v3));
    /* Every field id, in the two scopes nvidia-smi uses, in one call. */
    nvmlFieldValue_t *values = calloc(2 * (NVML_FI_MAX + 2), sizeof *values);
    int n = 0;
    for (unsigned scope = 0; scope <= 1; scope++) {
        for (unsigned id = 0; id <= NVML_FI_MAX + 1; id++) {
            values[n].fieldId = id;
            values[n].scopeId = scope;
            n++;
        }
    }
    CALL(nvmlDeviceGetFieldValues(dev, n, values));
    for (int i = 0; i < n; i++)
        rc("field value", values[i].nvmlReturn);
    /* A field and the getter of the same quantity agree (scope 0 entries
     * come first, at index = field id). */
    static const struct {
        unsigned field;
        uint_getter getter;
    } same[] = {
        {NVML_FI_DEV_POWER_INSTANT, nvmlDeviceGetPowerUsage},
        {NVML_FI_DEV_POWER_CURRENT_LIMIT, nvmlDeviceGetEnforcedPowerLimit},
        {NVML_FI_DEV_POWER_DEFAULT_LIMIT, nvmlDeviceGetPowerManagementDefaultLimit},
        {NVML_FI_DEV_PCIE_REPLAY_COUNTER, nvmlDeviceGetPcieReplayCounter},
    };
    for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
        const nvmlFieldValue_t *v = &values[same[i].field];
        unsigned direct = 0;
        nvmlReturn_t r = rc("getter", same[i].getter(dev, &direct));
        int field_ok = v->nvmlReturn == NVML_SUCCESS, getter_ok = r == NVML_SUCCESS;
        if ((field_ok && getter_ok && v->value.uiVal != direct) ||
            (field_ok && r == NVML_ERROR_NOT_SUPPORTED) ||
            (getter_ok && v->nvmlReturn == NVML_ERROR_NOT_SUPPORTED))
            violation("field %u (%d, %u) disagrees with its getter (%d, %u)", same[i].field,
                      (int)v->nvmlReturn, v->value.uiVal, (int)r, direct);
    }
    CALL(nvmlDeviceGetFieldValues(dev, -1, values));
    free(values);
}

/* --------------------------------------------------------------- telemetry */

/* Sample buffers, process utilization, violation status, thermal settings
 * and GPM: every size a list may claim is bounded, every version checked. */
void check_telemetry(nvmlDevice_t dev)
{
    for (int type = 0; type <= NVML_SAMPLINGTYPE_COUNT; type++) {
        nvmlValueType_t vtype;
        unsigned count = 0;
        nvmlSample_t one;
        if (CALL(nvmlDeviceGetSamples(dev, (nvmlSamplingType_t)type, 0, &vtype, &count, NULL)) !=
            NVML_SUCCESS)
            continue;
        if (count > LIST_LIMIT) {
            violation("samples of type %d: %u to allocate", type, count);
            continue;
        }
        unsigned zero = 0;
        if (CALL(nvmlDeviceGetSamples(dev, (nvmlSamplingType_t)type, 0, &vtype, &zero, &one)) !=
            NVML_ERROR_INVALID_ARGUMENT)
            violation("samples of type %d: a zero-sized buffer is no invalid argument", type);
        nvmlSample_t *samples = calloc(count ? count : 1, sizeof *samples);
        unsigned room = count;
        if (CALL(nvmlDeviceGetSamples(dev, (nvmlSamplingType_t)type, 0, &vtype, &room,
                                      samples)) == NVML_SUCCESS &&
            room > count)
            violation("samples of type %d: %u written into %u", type, room, count);
        free(samples);
    }
    unsigned procs = 0;
    if (CALL(nvmlDeviceGetProcessUtilization(dev, NULL, &procs, 0)) ==
            NVML_ERROR_INSUFFICIENT_SIZE &&
        procs <= LIST_LIMIT) {
        nvmlProcessUtilizationSample_t *util = calloc(procs ? procs : 1, sizeof *util);
        unsigned room = procs;
        if (CALL(nvmlDeviceGetProcessUtilization(dev, util, &room, 0)) == NVML_SUCCESS &&
            room > procs)
            violation("process utilization: %u written into %u", room, procs);
        free(util);
    } else if (procs > LIST_LIMIT) {
        violation("process utilization: %u to allocate", procs);
    }
    nvmlProcessesUtilizationInfo_t info = {.version = nvmlProcessesUtilizationInfo_v1};
    CALL(nvmlDeviceGetProcessesUtilizationInfo(dev, &info));
    info.version = 0;
    if (CALL(nvmlDeviceGetProcessesUtilizationInfo(dev, &info)) !=
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        violation("processes utilization info: version 0 accepted");
    for (int policy = 0; policy <= NVML_PERF_POLICY_COUNT; policy++) {
        nvmlViolationTime_t time;
        CALL(nvmlDeviceGetViolationStatus(dev, (nvmlPerfPolicyType_t)policy, &time));
    }
    static const unsigned sensors[] = {0, 1, 2, 3, NVML_THERMAL_TARGET_ALL, 16, 0xffffffffu};
    for (size_t i = 0; i < sizeof sensors / sizeof *sensors; i++) {
        nvmlGpuThermalSettings_t settings;
        memset(&settings, 0x5a, sizeof settings);
        if (CALL(nvmlDeviceGetThermalSettings(dev, sensors[i], &settings)) == NVML_SUCCESS &&
            settings.count > NVML_MAX_THERMAL_SENSORS_PER_GPU)
            violation("thermal settings: %u sensors", settings.count);
    }
    for (int kind = 0; kind <= NVML_TEMPERATURE_THRESHOLD_COUNT; kind++) {
        unsigned temp;
        CALL(nvmlDeviceGetTemperatureThreshold(dev, (nvmlTemperatureThresholds_t)kind, &temp));
    }
    nvmlEnableState_t on, default_on;
    CALL(nvmlDeviceGetAutoBoostedClocksEnabled(dev, &on, &default_on));
    /* NVLink fields with a link scope: every link, all links, past the last. */
    static const unsigned scopes[] = {0, 17, 18, 0xffffffffu};
    nvmlFieldValue_t values[sizeof scopes / sizeof *scopes * 100];
    int n = 0;
    for (size_t s = 0; s < sizeof scopes / sizeof *scopes; s++)
        for (unsigned id = 138; id < 238; id++)
            values[n++] = (nvmlFieldValue_t){.fieldId = id, .scopeId = scopes[s]};
    CALL(nvmlDeviceGetFieldValues(dev, n, values));
    for (int i = 0; i < n; i++)
        rc("field value", values[i].nvmlReturn);
    /* GPM: two samples and every metric between them. */
    nvmlGpmSupport_t support = {.version = NVML_GPM_SUPPORT_VERSION};
    CALL(nvmlGpmQueryDeviceSupport(dev, &support));
    nvmlGpmSample_t first = NULL, second = NULL;
    if (CALL(nvmlGpmSampleAlloc(&first)) != NVML_SUCCESS)
        return;
    if (CALL(nvmlGpmSampleAlloc(&second)) == NVML_SUCCESS) {
        nvmlGpmMetricsGet_t *get = calloc(1, sizeof *get);
        get->version = NVML_GPM_METRICS_GET_VERSION;
        get->sample1 = first;
        get->sample2 = second;
        get->numMetrics = NVML_GPM_METRIC_MAX;
        for (unsigned m = 0; m < NVML_GPM_METRIC_MAX; m++)
            get->metrics[m].metricId = m;
        /* before any sample was taken: an invalid argument, not garbage */
        CALL(nvmlGpmMetricsGet(get));
        if (CALL(nvmlGpmSampleGet(dev, first)) == NVML_SUCCESS &&
            CALL(nvmlGpmSampleGet(dev, second)) == NVML_SUCCESS &&
            CALL(nvmlGpmMetricsGet(get)) == NVML_SUCCESS)
            for (unsigned m = 0; m < NVML_GPM_METRIC_MAX; m++)
                rc("gpm metric", get->metrics[m].nvmlReturn);
        get->numMetrics = NVML_GPM_METRIC_MAX + 1;
        if (CALL(nvmlGpmMetricsGet(get)) != NVML_ERROR_INVALID_ARGUMENT)
            violation("gpm: %u metrics accepted", get->numMetrics);
        free(get);
        CALL(nvmlGpmSampleFree(second));
    }
    CALL(nvmlGpmSampleFree(first));
}
