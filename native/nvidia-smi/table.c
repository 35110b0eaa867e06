/*
 * The default summary table, laid out like nvidia-smi 535's: the same
 * borders, column widths and wording, one three-line block per GPU, then
 * the processes table.
 */
#include <stdio.h>
#include <string.h>

#include "smi.h"

#define RULE "+-----------------------------------------+----------------------+----------------------+"
#define WIDE_RULE "+---------------------------------------------------------------------------------------+"

static void row_one(const struct gpu *g)
{
    char persistence[8] = "N/A", disp[8] = "N/A", ecc[24] = "N/A";
    if (g->r_persistence == NVML_SUCCESS)
        snprintf(persistence, sizeof persistence, "%s",
                 g->persistence == NVML_FEATURE_ENABLED ? "On" : "Off");
    if (g->r_display_active == NVML_SUCCESS)
        snprintf(disp, sizeof disp, "%s",
                 g->display_active == NVML_FEATURE_ENABLED ? "On" : "Off");
    if (g->r_ecc == NVML_SUCCESS && g->ecc_current == NVML_FEATURE_ENABLED &&
        g->r_ecc_errors == NVML_SUCCESS)
        snprintf(ecc, sizeof ecc, "%llu", g->ecc_uncorrected);
    else if (g->r_ecc == NVML_SUCCESS)
        snprintf(ecc, sizeof ecc, "Off");
    printf("| %3u  %-28.28s %4s  | %-16s %3s | %20s |\n", g->index, g->name, persistence,
           g->pci.busId, disp, ecc);
}

static void row_two(const struct gpu *g)
{
    char fan[16] = "N/A", temp[16] = "N/A", perf[16] = "N/A", power[48], memory[48], util[16] = "N/A";
    char draw[16] = "N/A", cap[16] = "N/A";
    if (g->r_fan == NVML_SUCCESS)
        snprintf(fan, sizeof fan, "%u%%", g->fan);
    if (g->r_temp == NVML_SUCCESS)
        snprintf(temp, sizeof temp, "%uC", g->temp);
    if (g->r_pstate == NVML_SUCCESS && g->pstate != NVML_PSTATE_UNKNOWN)
        snprintf(perf, sizeof perf, "P%d", (int)g->pstate);
    if (g->r_power == NVML_SUCCESS)
        snprintf(draw, sizeof draw, "%uW", g->power_mw / 1000);
    if (g->r_limit == NVML_SUCCESS)
        snprintf(cap, sizeof cap, "%uW", g->limit_mw / 1000);
    snprintf(power, sizeof power, "%s / %s", draw, cap);
    if (g->r_memory == NVML_SUCCESS)
        snprintf(memory, sizeof memory, "%lluMiB / %lluMiB", g->memory.used >> 20,
                 g->memory.total >> 20);
    else
        snprintf(memory, sizeof memory, "N/A");
    if (g->r_util == NVML_SUCCESS)
        snprintf(util, sizeof util, "%u%%", g->util.gpu);
    const char *mode = g->r_compute_mode == NVML_SUCCESS ? smi_compute_mode(g->compute_mode)
                                                         : "N/A";
    printf("| %3s %5s    %-2s%24s | %20s |%8s%13s |\n", fan, temp, perf, power, memory, util,
           mode);
}

static void row_three(const struct gpu *g)
{
    const char *mig = "N/A";
    if (g->r_mig == NVML_SUCCESS)
        mig = g->mig_current == NVML_DEVICE_MIG_ENABLE ? "Enabled" : "Disabled";
    printf("| %39s | %20s | %20s |\n", "", "", mig);
}

/* Lists compute and graphics processes of every GPU, or says there are none. */
static void processes(const unsigned *indices, int count)
{
    printf("%89s\n", "");
    printf(WIDE_RULE "\n");
    printf("| Processes:%76s|\n", "");
    printf("|  GPU   GI   CI        PID   Type   Process name                            GPU Memory |\n");
    printf("|        ID   ID                                                             Usage      |\n");
    printf("|=======================================================================================|\n");
    int any = 0;
    for (int i = 0; i < count; i++) {
        nvmlDevice_t h;
        if (nvmlDeviceGetHandleByIndex(indices[i], &h) != NVML_SUCCESS)
            continue;
        nvmlProcessInfo_t infos[64];
        unsigned n = sizeof infos / sizeof *infos;
        if (nvmlDeviceGetComputeRunningProcesses(h, &n, infos) != NVML_SUCCESS)
            continue;
        for (unsigned k = 0; k < n; k++) {
            char name[64] = "";
            char usage[24];
            nvmlSystemGetProcessName(infos[k].pid, name, sizeof name);
            snprintf(usage, sizeof usage, "%lluMiB", infos[k].usedGpuMemory >> 20);
            printf("|  %3u   N/A  N/A  %9u      C   %-39.39s %10s |\n", indices[i], infos[k].pid,
                   name, usage);
            any = 1;
        }
    }
    if (!any)
        printf("|  No running processes found%59s|\n", "");
    printf(WIDE_RULE "\n");
}

int smi_table(void)
{
    unsigned indices[64];
    int count = smi_select(NULL, indices, 64);
    if (count < 0)
        return SMI_EXIT_USAGE;
    struct smi_header h;
    smi_load_header(&h);
    /* The fallback ships with the driver it simulates: it carries its version. */
    printf("%s       \n", h.stamp);
    printf(WIDE_RULE "\n");
    printf("| NVIDIA-SMI %-23sDriver Version: %-13sCUDA Version: %-9s|\n", h.driver, h.driver,
           h.cuda);
    printf("|-----------------------------------------+----------------------+----------------------+\n");
    printf("| GPU  Name                 Persistence-M | Bus-Id        Disp.A | Volatile Uncorr. ECC |\n");
    printf("| Fan  Temp   Perf          Pwr:Usage/Cap |         Memory-Usage | GPU-Util  Compute M. |\n");
    printf("|                                         |                      |               MIG M. |\n");
    printf("|=========================================+======================+======================|\n");
    for (int i = 0; i < count; i++) {
        struct gpu g;
        if (smi_load_gpu(indices[i], &g) != NVML_SUCCESS)
            continue;
        row_one(&g);
        row_two(&g);
        row_three(&g);
        printf(RULE "\n");
    }
    processes(indices, count);
    return 0;
}
