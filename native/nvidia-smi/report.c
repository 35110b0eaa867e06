/*
 * -q: the basic sections of nvidia-smi's long report, in its layout
 * (key column 42 wide, four spaces per level, "N/A" for what NVML cannot
 * give).  Sections the fallback does not know are left out rather than
 * printed empty.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "smi.h"

#define KEY_WIDTH 42

static void section(int depth, const char *title)
{
    printf("%*s%s\n", 4 * depth, "", title);
}

/* One `key : value` line; NULL format prints N/A. */
static void kv(int depth, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void kv(int depth, const char *key, const char *fmt, ...)
{
    char value[256] = "N/A";
    if (fmt != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(value, sizeof value, fmt, ap);
        va_end(ap);
    }
    int indent = 4 * depth;
    printf("%*s%-*s: %s\n", indent, "", KEY_WIDTH - indent, key, value);
}

/* One `key : value` line from the NVML result `r` behind the value: the
 * value on success, else what the real tool prints instead (smi_failure). */
#define KV_IF(depth, key, r, ...)                                                                \
    do {                                                                                         \
        nvmlReturn_t kv_r = (r);                                                                 \
        if (kv_r == NVML_SUCCESS)                                                                \
            kv(depth, key, __VA_ARGS__);                                                         \
        else                                                                                     \
            kv(depth, key, "%s", smi_failure(kv_r));                                             \
    } while (0)

static const char *fabric_state(unsigned state)
{
    switch (state) {
    case NVML_GPU_FABRIC_STATE_NOT_STARTED: return "Not Started";
    case NVML_GPU_FABRIC_STATE_IN_PROGRESS: return "In Progress";
    case NVML_GPU_FABRIC_STATE_COMPLETED: return "Completed";
    default: return "N/A";
    }
}

static void identity(const struct gpu *g)
{
    KV_IF(1, "Product Name", g->r_name, "%s", g->name);
    KV_IF(1, "Product Brand", g->r_brand, "%s", smi_brand(g->brand));
    KV_IF(1, "Product Architecture", g->r_arch, "%s", smi_architecture(g->arch));
    KV_IF(1, "Display Mode", g->r_display_mode, "%s", smi_enabled(g->display_mode));
    KV_IF(1, "Display Active", g->r_display_active, "%s", smi_enabled(g->display_active));
    KV_IF(1, "Persistence Mode", g->r_persistence, "%s", smi_enabled(g->persistence));
    section(1, "MIG Mode");
    KV_IF(2, "Current", g->r_mig, "%s",
          g->mig_current == NVML_DEVICE_MIG_ENABLE ? "Enabled" : "Disabled");
    KV_IF(2, "Pending", g->r_mig, "%s",
          g->mig_pending == NVML_DEVICE_MIG_ENABLE ? "Enabled" : "Disabled");
    KV_IF(1, "Serial Number", g->r_serial, "%s", g->serial);
    KV_IF(1, "GPU UUID", g->r_uuid, "%s", g->uuid);
    KV_IF(1, "Minor Number", g->r_minor, "%u", g->minor);
    KV_IF(1, "VBIOS Version", g->r_vbios, "%s", g->vbios);
    KV_IF(1, "Board ID", g->r_board, "0x%x", g->board_id);
    section(1, "Inforom Version");
    KV_IF(2, "Image Version", g->r_inforom, "%s", g->inforom_img);
}

static void pci(const struct gpu *g)
{
    section(1, "PCI");
    nvmlReturn_t r = g->r_pci;
    KV_IF(2, "Bus", r, "0x%02X", g->pci.bus);
    KV_IF(2, "Device", r, "0x%02X", g->pci.device);
    KV_IF(2, "Domain", r, "0x%04X", g->pci.domain);
    KV_IF(2, "Device Id", r, "0x%08X", g->pci.pciDeviceId);
    KV_IF(2, "Bus Id", r, "%s", g->pci.busId);
    KV_IF(2, "Sub System Id", r, "0x%08X", g->pci.pciSubSystemId);
    section(2, "GPU Link Info");
    section(3, "PCIe Generation");
    KV_IF(4, "Max", g->r_max_gen, "%u", g->max_gen);
    KV_IF(4, "Current", g->r_gen, "%u", g->gen);
    section(3, "Link Width");
    KV_IF(4, "Max", g->r_max_width, "%ux", g->max_width);
    KV_IF(4, "Current", g->r_width, "%ux", g->width);
}

static void memory(const struct gpu *g)
{
    section(1, "FB Memory Usage");
    nvmlReturn_t r = g->r_memory;
    KV_IF(2, "Total", r, "%llu MiB", g->memory.total >> 20);
    KV_IF(2, "Reserved", r, "%llu MiB", g->memory.reserved >> 20);
    KV_IF(2, "Used", r, "%llu MiB", g->memory.used >> 20);
    KV_IF(2, "Free", r, "%llu MiB", g->memory.free >> 20);
    section(1, "BAR1 Memory Usage");
    r = g->r_bar1;
    KV_IF(2, "Total", r, "%llu MiB", g->bar1.bar1Total >> 20);
    KV_IF(2, "Used", r, "%llu MiB", g->bar1.bar1Used >> 20);
    KV_IF(2, "Free", r, "%llu MiB", g->bar1.bar1Free >> 20);
    KV_IF(1, "Compute Mode", g->r_compute_mode, "%s",
          g->compute_mode == NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
              ? "Exclusive_Process"
              : smi_compute_mode(g->compute_mode));
    section(1, "Utilization");
    KV_IF(2, "Gpu", g->r_util, "%u %%", g->util.gpu);
    KV_IF(2, "Memory", g->r_util, "%u %%", g->util.memory);
    section(1, "ECC Mode");
    KV_IF(2, "Current", g->r_ecc, "%s", smi_enabled(g->ecc_current));
    KV_IF(2, "Pending", g->r_ecc, "%s", smi_enabled(g->ecc_pending));
}

static void telemetry(const struct gpu *g)
{
    section(1, "Temperature");
    KV_IF(2, "GPU Current Temp", g->r_temp, "%u C", g->temp);
    KV_IF(2, "Memory Current Temp", g->r_mem_temp, "%u C", g->mem_temp);
    section(1, "GPU Power Readings");
    KV_IF(2, "Power Draw", g->r_power, "%.2f W", g->power_mw / 1000.0);
    KV_IF(2, "Current Power Limit", g->r_limit, "%.2f W", g->limit_mw / 1000.0);
    KV_IF(2, "Default Power Limit", g->r_default_limit, "%.2f W",
          g->default_limit_mw / 1000.0);
    KV_IF(2, "Min Power Limit", g->r_limits, "%.2f W", g->min_limit_mw / 1000.0);
    KV_IF(2, "Max Power Limit", g->r_limits, "%.2f W", g->max_limit_mw / 1000.0);
    static const char *const names[] = {"Graphics", "SM", "Memory", "Video"};
    section(1, "Clocks");
    for (int t = 0; t < NVML_CLOCK_COUNT; t++)
        KV_IF(2, names[t], g->r_clock[t], "%u MHz", g->clock[t]);
    section(1, "Max Clocks");
    for (int t = 0; t < NVML_CLOCK_COUNT; t++)
        KV_IF(2, names[t], g->r_max_clock[t], "%u MHz", g->max_clock[t]);
    section(1, "Fabric");
    if (g->r_fabric == NVML_SUCCESS) {
        kv(2, "State", "%s", fabric_state(g->fabric.state));
        if (g->fabric.state == NVML_GPU_FABRIC_STATE_COMPLETED)
            kv(2, "Status", "%s", g->fabric.status == NVML_SUCCESS ? "Success" : "Failure");
        else
            kv(2, "Status", NULL);
    } else {
        kv(2, "State", "%s", smi_failure(g->r_fabric));
        kv(2, "Status", "%s", smi_failure(g->r_fabric));
    }
}

int smi_report(const char *ids)
{
    unsigned indices[64], count = 0;
    int n = smi_select(ids, indices, 64);
    if (n < 0)
        return SMI_EXIT_NOT_FOUND;
    nvmlDeviceGetCount(&count);
    struct smi_header h;
    smi_load_header(&h);
    printf("\n==============NVSMI LOG==============\n\n");
    kv(0, "Timestamp", "%s", h.stamp);
    kv(0, "Driver Version", "%s", h.driver);
    kv(0, "CUDA Version", "%s", h.cuda);
    printf("\n");
    kv(0, "Attached GPUs", "%u", count);
    for (int i = 0; i < n; i++) {
        struct gpu g;
        if (smi_load_gpu(indices[i], &g) != NVML_SUCCESS)
            continue;
        printf("GPU %s\n", g.pci.busId);
        identity(&g);
        pci(&g);
        KV_IF(1, "Fan Speed", g.r_fan, "%u %%", g.fan);
        KV_IF(1, "Performance State", smi_pstate_result(&g), "P%d", (int)g.pstate);
        memory(&g);
        telemetry(&g);
        kv(1, "Processes", "%s", "None");
        printf("\n");
    }
    return 0;
}
