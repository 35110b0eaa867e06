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

/* A cell's text: the value when `r` succeeded, "N/A" when the GPU lacks
 * it, and "ERR!" for any other failure (a lost GPU), as the real table. */
static int failed(nvmlReturn_t r)
{
    return r != NVML_SUCCESS && r != NVML_ERROR_NOT_SUPPORTED;
}

static const char *cell(nvmlReturn_t r, const char *value)
{
    return r == NVML_SUCCESS ? value : failed(r) ? "ERR!" : "N/A";
}

/* The real table moves an "ERR!" one column left of where the value it
 * replaces would stand (persistence, Disp.A, fan, perf), so the rows below
 * use a second format for that case. */
static void row_one(const struct gpu *g)
{
    const char *persistence =
        cell(g->r_persistence, g->persistence == NVML_FEATURE_ENABLED ? "On" : "Off");
    const char *disp =
        cell(g->r_display_active, g->display_active == NVML_FEATURE_ENABLED ? "On" : "Off");
    char errors[24];
    const char *ecc;
    if (g->r_ecc == NVML_SUCCESS && g->ecc_current == NVML_FEATURE_ENABLED) {
        snprintf(errors, sizeof errors, "%llu", g->ecc_uncorrected);
        ecc = cell(g->r_ecc_errors, errors);
    } else {
        ecc = cell(g->r_ecc, "Off");
    }
    printf("| %3u  %-28.28s ", g->index, g->name);
    printf(failed(g->r_persistence) ? " %4s |" : "%4s  |", persistence);
    printf(failed(g->r_display_active) ? " %-16s%4s |" : " %-16s %3s |", g->pci.busId, disp);
    printf(" %20s |\n", ecc);
}

static void row_two(const struct gpu *g)
{
    char fan[16], temp[16], perf[16], draw[16], cap[16], power[48], memory[48], util[16];
    snprintf(fan, sizeof fan, "%u%%", g->fan);
    snprintf(temp, sizeof temp, "%uC", g->temp);
    snprintf(perf, sizeof perf, "P%d", (int)g->pstate);
    snprintf(draw, sizeof draw, "%uW", g->power_mw / 1000);
    snprintf(cap, sizeof cap, "%uW", g->limit_mw / 1000);
    snprintf(power, sizeof power, "%s / %s", cell(g->r_power, draw), cell(g->r_limit, cap));
    snprintf(util, sizeof util, "%u%%", g->util.gpu);
    nvmlReturn_t r_perf = smi_pstate_result(g);
    printf(failed(g->r_fan) ? "|%4s" : "| %3s", cell(g->r_fan, fan));
    printf(" %5s", cell(g->r_temp, temp));
    printf(failed(r_perf) ? " %4s%25s |" : "    %-2s%24s |", cell(r_perf, perf), power);
    if (g->r_memory == NVML_SUCCESS) {
        snprintf(memory, sizeof memory, "%lluMiB / %lluMiB", g->memory.used >> 20,
                 g->memory.total >> 20);
        printf(" %20s |", memory);
    } else {
        /* The memory cell spells the error out, left-aligned. */
        printf(failed(g->r_memory) ? " %-20s |" : " %20s |", smi_failure(g->r_memory));
    }
    const char *mode = cell(g->r_compute_mode, smi_compute_mode(g->compute_mode));
    printf("%8s%13s |\n", cell(g->r_util, util), mode);
}

static void row_three(const struct gpu *g)
{
    const char *mig = cell(g->r_mig, g->mig_current == NVML_DEVICE_MIG_ENABLE ? "Enabled"
                                                                               : "Disabled");
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
