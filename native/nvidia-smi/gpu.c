/*
 * Reading a GPU through NVML, once per invocation, plus the small
 * formatting helpers every view shares.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "smi.h"

nvmlReturn_t smi_load_gpu(unsigned index, struct gpu *g)
{
    memset(g, 0, sizeof *g);
    g->index = index;
    nvmlReturn_t r = nvmlDeviceGetHandleByIndex(index, &g->handle);
    if (r != NVML_SUCCESS)
        return r;
    nvmlDevice_t h = g->handle;
    g->r_name = nvmlDeviceGetName(h, g->name, sizeof g->name);
    g->r_uuid = nvmlDeviceGetUUID(h, g->uuid, sizeof g->uuid);
    g->r_serial = nvmlDeviceGetSerial(h, g->serial, sizeof g->serial);
    g->r_vbios = nvmlDeviceGetVbiosVersion(h, g->vbios, sizeof g->vbios);
    g->r_inforom = nvmlDeviceGetInforomImageVersion(h, g->inforom_img, sizeof g->inforom_img);
    g->r_pci = nvmlDeviceGetPciInfo(h, &g->pci);
    g->r_minor = nvmlDeviceGetMinorNumber(h, &g->minor);
    g->r_board = nvmlDeviceGetBoardId(h, &g->board_id);
    g->r_arch = nvmlDeviceGetArchitecture(h, &g->arch);
    g->r_brand = nvmlDeviceGetBrand(h, &g->brand);
    g->r_persistence = nvmlDeviceGetPersistenceMode(h, &g->persistence);
    g->r_display_mode = nvmlDeviceGetDisplayMode(h, &g->display_mode);
    g->r_display_active = nvmlDeviceGetDisplayActive(h, &g->display_active);
    g->r_ecc = nvmlDeviceGetEccMode(h, &g->ecc_current, &g->ecc_pending);
    g->r_mig = nvmlDeviceGetMigMode(h, &g->mig_current, &g->mig_pending);
    g->r_compute_mode = nvmlDeviceGetComputeMode(h, &g->compute_mode);
    g->memory.version = nvmlMemory_v2;
    g->r_memory = nvmlDeviceGetMemoryInfo_v2(h, &g->memory);
    g->r_bar1 = nvmlDeviceGetBAR1MemoryInfo(h, &g->bar1);
    g->r_util = nvmlDeviceGetUtilizationRates(h, &g->util);
    g->r_temp = nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU, &g->temp);
    nvmlFieldValue_t field = {.fieldId = NVML_FI_DEV_MEMORY_TEMP};
    g->r_mem_temp = nvmlDeviceGetFieldValues(h, 1, &field);
    if (g->r_mem_temp == NVML_SUCCESS)
        g->r_mem_temp = field.nvmlReturn;
    g->mem_temp = field.value.uiVal;
    g->r_power = nvmlDeviceGetPowerUsage(h, &g->power_mw);
    g->r_limit = nvmlDeviceGetPowerManagementLimit(h, &g->limit_mw);
    g->r_default_limit = nvmlDeviceGetPowerManagementDefaultLimit(h, &g->default_limit_mw);
    g->r_limits =
        nvmlDeviceGetPowerManagementLimitConstraints(h, &g->min_limit_mw, &g->max_limit_mw);
    g->r_enforced = nvmlDeviceGetEnforcedPowerLimit(h, &g->enforced_mw);
    g->r_pstate = nvmlDeviceGetPerformanceState(h, &g->pstate);
    g->r_fan = nvmlDeviceGetFanSpeed(h, &g->fan);
    g->r_cc = nvmlDeviceGetCudaComputeCapability(h, &g->cc_major, &g->cc_minor);
    g->r_ecc_errors = nvmlDeviceGetTotalEccErrors(h, NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                  NVML_VOLATILE_ECC, &g->ecc_uncorrected);
    for (int t = 0; t < NVML_CLOCK_COUNT; t++) {
        g->r_clock[t] = nvmlDeviceGetClockInfo(h, (nvmlClockType_t)t, &g->clock[t]);
        g->r_max_clock[t] = nvmlDeviceGetMaxClockInfo(h, (nvmlClockType_t)t, &g->max_clock[t]);
    }
    g->r_gen = nvmlDeviceGetCurrPcieLinkGeneration(h, &g->gen);
    g->r_max_gen = nvmlDeviceGetMaxPcieLinkGeneration(h, &g->max_gen);
    g->r_width = nvmlDeviceGetCurrPcieLinkWidth(h, &g->width);
    g->r_max_width = nvmlDeviceGetMaxPcieLinkWidth(h, &g->max_width);
    g->fabric.version = nvmlGpuFabricInfo_v3;
    g->r_fabric = nvmlDeviceGetGpuFabricInfoV(h, &g->fabric);
    return NVML_SUCCESS;
}

/* Does `id` name the GPU at `index` (index, UUID or PCI bus id)? */
static int matches(const char *id, unsigned index)
{
    char *end;
    unsigned long n = strtoul(id, &end, 10);
    if (*id != '\0' && *end == '\0')
        return n == index;
    nvmlDevice_t h;
    if (nvmlDeviceGetHandleByIndex(index, &h) != NVML_SUCCESS)
        return 0;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    if (nvmlDeviceGetUUID(h, uuid, sizeof uuid) == NVML_SUCCESS && strcasecmp(uuid, id) == 0)
        return 1;
    nvmlDevice_t by_bus;
    return nvmlDeviceGetHandleByPciBusId(id, &by_bus) == NVML_SUCCESS && by_bus == h;
}

int smi_select(const char *ids, unsigned *indices, unsigned capacity)
{
    unsigned count = 0;
    if (nvmlDeviceGetCount(&count) != NVML_SUCCESS)
        return -1;
    if (count > capacity)
        count = capacity;
    if (ids == NULL) {
        for (unsigned i = 0; i < count; i++)
            indices[i] = i;
        return (int)count;
    }
    /* Like the real tool: each GPU once, in NVML order, whatever the order
     * or repetition of the ids; ids that match nothing are passed over, and
     * only a list that matches no GPU at all is an error. */
    char *list = strdup(ids); /* any length, as the real tool takes */
    int *chosen = calloc(count ? count : 1, sizeof *chosen);
    if (list == NULL || chosen == NULL) {
        free(list);
        free(chosen);
        return -1;
    }
    for (char *save = NULL, *id = strtok_r(list, ",", &save); id != NULL;
         id = strtok_r(NULL, ",", &save))
        for (unsigned i = 0; i < count; i++)
            if (!chosen[i] && matches(id, i)) {
                chosen[i] = 1;
                break;
            }
    unsigned n = 0;
    for (unsigned i = 0; i < count; i++)
        if (chosen[i])
            indices[n++] = i;
    free(list);
    free(chosen);
    if (n == 0) {
        printf("No devices were found\n");
        return -1;
    }
    return (int)n;
}

nvmlReturn_t smi_pstate_result(const struct gpu *g)
{
    if (g->r_pstate == NVML_SUCCESS && g->pstate == NVML_PSTATE_UNKNOWN)
        return NVML_ERROR_NOT_SUPPORTED;
    return g->r_pstate;
}

const char *smi_failure(nvmlReturn_t r)
{
    if (r == NVML_ERROR_NOT_SUPPORTED)
        return "N/A";
    /* The tool words a call the driver no longer answers itself, not as
     * nvmlErrorString's "Deprecated". */
    if (r == NVML_ERROR_DEPRECATED)
        return "Requested functionality has been deprecated";
    return nvmlErrorString(r);
}

const char *smi_enabled(nvmlEnableState_t state)
{
    return state == NVML_FEATURE_ENABLED ? "Enabled" : "Disabled";
}

const char *smi_compute_mode(nvmlComputeMode_t mode)
{
    switch (mode) {
    case NVML_COMPUTEMODE_DEFAULT: return "Default";
    case NVML_COMPUTEMODE_EXCLUSIVE_THREAD: return "Exclusive_Thread";
    case NVML_COMPUTEMODE_PROHIBITED: return "Prohibited";
    case NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: return "E. Process";
    default: return "Unknown";
    }
}

const char *smi_architecture(nvmlDeviceArchitecture_t arch)
{
    switch (arch) {
    case NVML_DEVICE_ARCH_KEPLER: return "Kepler";
    case NVML_DEVICE_ARCH_MAXWELL: return "Maxwell";
    case NVML_DEVICE_ARCH_PASCAL: return "Pascal";
    case NVML_DEVICE_ARCH_VOLTA: return "Volta";
    case NVML_DEVICE_ARCH_TURING: return "Turing";
    case NVML_DEVICE_ARCH_AMPERE: return "Ampere";
    case NVML_DEVICE_ARCH_ADA: return "Ada Lovelace";
    case NVML_DEVICE_ARCH_HOPPER: return "Hopper";
    case NVML_DEVICE_ARCH_BLACKWELL: return "Blackwell";
    default: return "N/A";
    }
}

const char *smi_brand(nvmlBrandType_t brand)
{
    switch (brand) {
    case NVML_BRAND_NVIDIA: return "NVIDIA";
    case NVML_BRAND_TESLA: return "Tesla";
    case NVML_BRAND_QUADRO: return "Quadro";
    case NVML_BRAND_GEFORCE: return "GeForce";
    case NVML_BRAND_TITAN: return "Titan";
    case NVML_BRAND_NVIDIA_RTX: return "NVIDIA RTX";
    case NVML_BRAND_QUADRO_RTX: return "Quadro RTX";
    case NVML_BRAND_GEFORCE_RTX: return "GeForce RTX";
    case NVML_BRAND_TITAN_RTX: return "Titan RTX";
    case NVML_BRAND_GRID: return "Grid";
    case NVML_BRAND_NVS: return "NVS";
    default: return "Unknown";
    }
}

static void cuda_version(char *out, size_t size)
{
    int v;
    if (nvmlSystemGetCudaDriverVersion_v2(&v) == NVML_SUCCESS)
        snprintf(out, size, "%d.%d", v / 1000, (v % 1000) / 10);
    else
        snprintf(out, size, "N/A");
}

void smi_load_header(struct smi_header *h)
{
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    if (strftime(h->stamp, sizeof h->stamp, "%a %b %e %H:%M:%S %Y", &tm) == 0)
        h->stamp[0] = '\0';
    /* A failed call leaves the buffer as it was, so this stays on failure. */
    snprintf(h->driver, sizeof h->driver, "N/A");
    nvmlSystemGetDriverVersion(h->driver, sizeof h->driver);
    cuda_version(h->cuda, sizeof h->cuda);
}
