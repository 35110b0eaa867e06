/*
 * The setters that change the node: persistence, power limit, compute
 * mode, clocks, ECC, accounting, the GPU reset and the drain state
 * (docs/nvml.md, "Setters").
 *
 * A setter changes what every process on the node reads, so it cannot
 * write the engine config itself (a container's driver root is read-only,
 * and the daemon re-renders that file from its own inputs): it asks the
 * node daemon over the socket the library already reads through
 * (remote.c), and the daemon records the change in the node's runtime
 * state and answers once the engine config holds it.  As on a real board
 * only root may: any other caller gets NVML_ERROR_NO_PERMISSION without a
 * word to the daemon (which checks the peer's uid again).  The daemon
 * owns the rules (bounds, pending modes, a busy GPU); the checks here are
 * the ones NVML makes before it reaches the driver (bad enum values, out
 * of range power limits) so a caller hears them without a round trip.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mock.h"

/* The node daemon's socket: MOCK_NVML_SOCKET, else beside the driver root
 * the library's config is under (a host process), else where a container
 * has nvidia-persistenced's socket (remote.c). */
static int locate_socket(char *path, size_t size)
{
    const char *env = getenv("MOCK_NVML_SOCKET");
    if (env == NULL || *env == '\0') {
        char config[PATH_MAX];
        if (mock_locate_config(config, sizeof config)) {
            /* <driver root>/config/config.yaml -> <driver root>/run/... */
            for (int i = 0; i < 2; i++) {
                char *slash = strrchr(config, '/');
                if (slash == NULL)
                    break;
                *slash = '\0';
            }
            struct stat st;
            int n = snprintf(path, size, "%s/run/nvidia-persistenced/socket", config);
            if (n > 0 && (size_t)n < size && stat(path, &st) == 0 && S_ISSOCK(st.st_mode))
                return 1;
        }
    }
    return mock_remote_locate(path, size);
}

nvmlReturn_t mock_set_device(nvmlDevice_t device, const char *key, const char *value)
{
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    const char *found = mock_dev_get(c.cfg, c.pos, "uuid");
    int have_uuid = found != NULL && strlen(found) < sizeof uuid;
    if (have_uuid)
        strcpy(uuid, found);
    mock_end(&c);
    if (!have_uuid)
        return NVML_ERROR_UNKNOWN;
    if (geteuid() != 0)
        return NVML_ERROR_NO_PERMISSION;
    char path[PATH_MAX];
    if (!locate_socket(path, sizeof path)) {
        mock_debug("no node daemon socket to send %s to", key);
        return NVML_ERROR_UNKNOWN;
    }
    r = mock_remote_set(path, uuid, key, value);
    if (r == NVML_SUCCESS)
        mock_recheck_now();
    return r;
}

static const char *enable_word(nvmlEnableState_t mode)
{
    return mode == NVML_FEATURE_ENABLED ? "enabled" : mode == NVML_FEATURE_DISABLED ? "disabled"
                                                                                   : NULL;
}

static nvmlReturn_t set_enable(nvmlDevice_t device, const char *key, nvmlEnableState_t mode)
{
    const char *word = enable_word(mode);
    return word == NULL ? NVML_ERROR_INVALID_ARGUMENT : mock_set_device(device, key, word);
}

static nvmlReturn_t set_pair(nvmlDevice_t device, const char *key, unsigned a, unsigned b)
{
    char value[32];
    snprintf(value, sizeof value, "%u,%u", a, b);
    return mock_set_device(device, key, value);
}

MOCK_API nvmlReturn_t nvmlDeviceSetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t mode)
{
    return set_enable(device, "persistence_mode", mode);
}

MOCK_API nvmlReturn_t nvmlDeviceSetAccountingMode(nvmlDevice_t device, nvmlEnableState_t mode)
{
    return set_enable(device, "accounting_mode", mode);
}

MOCK_API nvmlReturn_t nvmlDeviceClearAccountingPids(nvmlDevice_t device)
{
    return mock_set_device(device, "accounting_pids", "clear");
}

MOCK_API nvmlReturn_t nvmlDeviceSetEccMode(nvmlDevice_t device, nvmlEnableState_t ecc)
{
    return set_enable(device, "ecc_mode", ecc);
}

MOCK_API nvmlReturn_t nvmlDeviceClearEccErrorCounts(nvmlDevice_t device,
                                                    nvmlEccCounterType_t counterType)
{
    if (counterType != NVML_VOLATILE_ECC && counterType != NVML_AGGREGATE_ECC)
        return NVML_ERROR_INVALID_ARGUMENT;
    return mock_set_device(device, "ecc_counts",
                      counterType == NVML_VOLATILE_ECC ? "volatile" : "aggregate");
}

static const char *const COMPUTE_WORDS[] = {
    [NVML_COMPUTEMODE_DEFAULT] = "default",
    [NVML_COMPUTEMODE_EXCLUSIVE_THREAD] = "exclusive_thread",
    [NVML_COMPUTEMODE_PROHIBITED] = "prohibited",
    [NVML_COMPUTEMODE_EXCLUSIVE_PROCESS] = "exclusive_process",
};

MOCK_API nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t device, nvmlComputeMode_t mode)
{
    if ((unsigned)mode >= MOCK_COUNT(COMPUTE_WORDS))
        return NVML_ERROR_INVALID_ARGUMENT;
    return mock_set_device(device, "compute_mode", COMPUTE_WORDS[mode]);
}

/* The board's power limit range, checked here as NVML checks it before the
 * driver sees the value (the daemon checks again against its own state). */
static nvmlReturn_t set_power_limit(nvmlDevice_t device, unsigned limit)
{
    unsigned lo, hi;
    nvmlReturn_t r = nvmlDeviceGetPowerManagementLimitConstraints(device, &lo, &hi);
    if (r != NVML_SUCCESS)
        return r;
    if (limit < lo || limit > hi)
        return NVML_ERROR_INVALID_ARGUMENT;
    char value[16];
    snprintf(value, sizeof value, "%u", limit);
    return mock_set_device(device, "power_limit_mw", value);
}

MOCK_API nvmlReturn_t nvmlDeviceSetPowerManagementLimit(nvmlDevice_t device, unsigned int limit)
{
    return set_power_limit(device, limit);
}

MOCK_API nvmlReturn_t nvmlDeviceSetPowerManagementLimit_v2(nvmlDevice_t device,
                                                           nvmlPowerValue_v2_t *powerValue)
{
    if (powerValue == NULL || powerValue->version != nvmlPowerValue_v2 ||
        powerValue->powerScope != NVML_POWER_SCOPE_GPU)
        return powerValue != NULL && powerValue->version != nvmlPowerValue_v2
                   ? NVML_ERROR_ARGUMENT_VERSION_MISMATCH
                   : NVML_ERROR_INVALID_ARGUMENT;
    return set_power_limit(device, powerValue->powerValueMw);
}

MOCK_API nvmlReturn_t nvmlDeviceSetApplicationsClocks(nvmlDevice_t device,
                                                      unsigned int memClockMHz,
                                                      unsigned int graphicsClockMHz)
{
    return set_pair(device, "applications_clocks", memClockMHz, graphicsClockMHz);
}

MOCK_API nvmlReturn_t nvmlDeviceResetApplicationsClocks(nvmlDevice_t device)
{
    return mock_set_device(device, "applications_clocks", "default");
}

MOCK_API nvmlReturn_t nvmlDeviceSetGpuLockedClocks(nvmlDevice_t device, unsigned int minGpuClockMHz,
                                                   unsigned int maxGpuClockMHz)
{
    return set_pair(device, "locked_gpu_clocks", minGpuClockMHz, maxGpuClockMHz);
}

MOCK_API nvmlReturn_t nvmlDeviceResetGpuLockedClocks(nvmlDevice_t device)
{
    return mock_set_device(device, "locked_gpu_clocks", "default");
}

MOCK_API nvmlReturn_t nvmlDeviceSetMemoryLockedClocks(nvmlDevice_t device,
                                                      unsigned int minMemClockMHz,
                                                      unsigned int maxMemClockMHz)
{
    return set_pair(device, "locked_memory_clocks", minMemClockMHz, maxMemClockMHz);
}

MOCK_API nvmlReturn_t nvmlDeviceResetMemoryLockedClocks(nvmlDevice_t device)
{
    return mock_set_device(device, "locked_memory_clocks", "default");
}

/* ---------------------------------------------------------------- drain */

/* The GPU a drain call names by its PCI address: the bus id, else the
 * legacy one, else the numbers (nvidia-smi fills them all). */
static nvmlReturn_t drained_device(const nvmlPciInfo_t *pci, nvmlDevice_t *device)
{
    if (pci == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    char bus_id[sizeof pci->busId + 1];
    if (pci->busId[0] != '\0')
        snprintf(bus_id, sizeof bus_id, "%.*s", (int)sizeof pci->busId, pci->busId);
    else if (pci->busIdLegacy[0] != '\0')
        snprintf(bus_id, sizeof bus_id, "%.*s", (int)sizeof pci->busIdLegacy, pci->busIdLegacy);
    else
        snprintf(bus_id, sizeof bus_id, "%08x:%02x:%02x.0", pci->domain, pci->bus, pci->device);
    return nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

/* Drain state: a drained GPU takes no new clients (nvml.h), so schedulers
 * and the device plugin's health checks can take it out of service.  Node
 * state like the other setters: every process sees it, teardown forgets it. */
MOCK_API nvmlReturn_t nvmlDeviceModifyDrainState(nvmlPciInfo_t *pciInfo,
                                                 nvmlEnableState_t newState)
{
    nvmlDevice_t device;
    nvmlReturn_t r = drained_device(pciInfo, &device);
    return r != NVML_SUCCESS ? r : set_enable(device, "drain_state", newState);
}

MOCK_API nvmlReturn_t nvmlDeviceQueryDrainState(nvmlPciInfo_t *pciInfo,
                                                nvmlEnableState_t *currentState)
{
    if (currentState == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlDevice_t device;
    nvmlReturn_t r = drained_device(pciInfo, &device);
    if (r != NVML_SUCCESS)
        return r;
    struct mock_call c;
    r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    int on = 0; /* never drained unless someone drained it */
    mock_dev_bool(c.cfg, c.pos, "drain_state", &on);
    *currentState = mock_enable_state(on);
    mock_end(&c);
    return NVML_SUCCESS;
}
