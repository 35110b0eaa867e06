/*
 * The fallback nvidia-smi: staged when the image carries no real one.
 *
 * It links only the mock NVML library and prints what it supports in the
 * real tool's wording and layout, so scripts and humans reading `-L`,
 * `--query-gpu` and the summary table see the same shape either way.
 *
 *   main.c    argument parsing, -L, --version, help and errors
 *   gpu.c     one snapshot of a GPU's values, read through NVML
 *   table.c   the default summary table
 *   query.c   --query-gpu ... --format=csv[,noheader][,nounits]
 *   report.c  -q, the basic sections of the long report
 */
#ifndef MOKKA_SMI_H
#define MOKKA_SMI_H

#include <stddef.h>

#include "nvml.h"

/* Exit codes of the real tool. */
#define SMI_EXIT_USAGE 2
#define SMI_EXIT_BAD_OPTION 255
#define SMI_EXIT_NOT_FOUND 6 /* "No devices were found" */

/* One GPU's values.  Each r_* holds the NVML result that produced the
 * fields after it, so a formatter can print N/A for what failed. */
struct gpu {
    unsigned index;
    nvmlDevice_t handle;
    nvmlReturn_t r_name, r_uuid, r_serial, r_vbios, r_pci, r_minor, r_board, r_arch, r_brand;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char serial[NVML_DEVICE_SERIAL_BUFFER_SIZE];
    char vbios[NVML_DEVICE_VBIOS_VERSION_BUFFER_SIZE];
    char inforom_img[NVML_DEVICE_INFOROM_VERSION_BUFFER_SIZE];
    nvmlReturn_t r_inforom;
    nvmlPciInfo_t pci;
    unsigned minor, board_id;
    nvmlDeviceArchitecture_t arch;
    nvmlBrandType_t brand;
    nvmlReturn_t r_persistence, r_display_mode, r_display_active, r_ecc, r_mig, r_compute_mode;
    nvmlEnableState_t persistence, display_mode, display_active, ecc_current, ecc_pending;
    unsigned mig_current, mig_pending;
    nvmlComputeMode_t compute_mode;
    nvmlReturn_t r_memory, r_bar1, r_util, r_temp, r_mem_temp, r_power, r_limit, r_default_limit,
        r_limits, r_enforced, r_pstate, r_fan, r_cc, r_ecc_errors;
    nvmlMemory_v2_t memory;
    nvmlBAR1Memory_t bar1;
    nvmlUtilization_t util;
    unsigned temp, mem_temp, power_mw, limit_mw, default_limit_mw, min_limit_mw, max_limit_mw,
        enforced_mw, fan;
    nvmlPstates_t pstate;
    int cc_major, cc_minor;
    unsigned long long ecc_uncorrected;
    nvmlReturn_t r_clock[NVML_CLOCK_COUNT], r_max_clock[NVML_CLOCK_COUNT];
    unsigned clock[NVML_CLOCK_COUNT], max_clock[NVML_CLOCK_COUNT];
    nvmlReturn_t r_gen, r_max_gen, r_width, r_max_width;
    unsigned gen, max_gen, width, max_width;
    nvmlReturn_t r_fabric;
    nvmlGpuFabricInfoV_t fabric;
};

/* Reads every value of the GPU at NVML index `index`. */
nvmlReturn_t smi_load_gpu(unsigned index, struct gpu *gpu);

/* The GPUs selected by -i (comma-separated indices, UUIDs or bus ids; NULL
 * for all), each once, in NVML order.  Returns the count, or -1 (after
 * printing "No devices were found" when no id matched a GPU). */
int smi_select(const char *ids, unsigned *indices, unsigned capacity);

/* The result behind the P-state: an unknown state is not shown (N/A). */
nvmlReturn_t smi_pstate_result(const struct gpu *g);
/* What a view prints for a value NVML did not give: "N/A" when the GPU
 * lacks it (NOT_SUPPORTED), else NVML's error ("GPU is lost"). */
const char *smi_failure(nvmlReturn_t r);

/* Helpers shared by the formatters. */
const char *smi_enabled(nvmlEnableState_t state);
const char *smi_compute_mode(nvmlComputeMode_t mode);
const char *smi_architecture(nvmlDeviceArchitecture_t arch);
const char *smi_brand(nvmlBrandType_t brand);

/* What the views print at their top, read the one way the real tool does:
 * the driver version reads "N/A" when NVML has none. */
struct smi_header {
    char stamp[64]; /* local time, as the table's and -q's first line */
    char driver[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    char cuda[16];
};
void smi_load_header(struct smi_header *h);

int smi_table(void);
int smi_query_gpu(const char *fields, const char *format, const char *ids);
int smi_report(const char *ids);

#endif
