/*
 * The default summary table, laid out as the nvidia-smi of the driver the
 * node claims: one three-line block per GPU, then the processes table.
 *
 * Three layouts, told apart by the driver's major version (what each real
 * tool prints is kept in tests/data/nvidia-smi/, with its source):
 *
 *   < 550   535's: 89 columns, a 22-column Bus-Id/Memory cell; a power
 *           reading longer than 11 characters or a memory reading longer
 *           than 15 is cut to its head and "...".
 *   550..   the wide table: 91 columns, a 24-column Bus-Id/Memory cell, the
 *           power limit in 4 digits and the memory total in 6, nothing cut.
 *   570..   the processes table's PID column is 6 characters wider.
 *   580..   the rule under the banner is drawn with '+' corners, and the
 *           line between the two tables is empty instead of 89 spaces.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "smi.h"

struct layout {
    int wide;           /* 91 columns (550 and later) rather than 89 */
    int plus_rule;      /* '+' corners on the rule under the banner (580 and later) */
    int empty_spacer;   /* an empty line between the tables, not 89 spaces (580 and later) */
    int pid_width;      /* the processes table's PID column */
    int name_width;     /* ... and its process name column */
    int power_max;      /* longest power reading shown whole; 0: no limit */
    int memory_max;     /* longest memory reading shown whole; 0: no limit */
    const char *limit_format;  /* the power limit's digits */
    const char *total_format;  /* the memory total's digits */
};

static const struct layout LAYOUT_535 = {
    .pid_width = 10, .name_width = 39, .power_max = 11, .memory_max = 15,
    .limit_format = "%3u", .total_format = "%5llu",
};
static const struct layout LAYOUT_550 = {
    .wide = 1, .pid_width = 10, .name_width = 41,
    .limit_format = "%4u", .total_format = "%6llu",
};
static const struct layout LAYOUT_570 = {
    .wide = 1, .pid_width = 16, .name_width = 35,
    .limit_format = "%4u", .total_format = "%6llu",
};
static const struct layout LAYOUT_580 = {
    .wide = 1, .plus_rule = 1, .empty_spacer = 1, .pid_width = 16, .name_width = 35,
    .limit_format = "%4u", .total_format = "%6llu",
};

/* The layout of the driver `version` names ("580.105.08"); a driver NVML does
 * not name ("N/A") gets 535's, the layout this fallback started from. */
static const struct layout *layout_for(const char *version)
{
    int major = atoi(version);
    if (major >= 580)
        return &LAYOUT_580;
    if (major >= 570)
        return &LAYOUT_570;
    if (major >= 550)
        return &LAYOUT_550;
    return &LAYOUT_535;
}

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

/* Cuts `text` to its first max-3 characters and "..." when it is longer
 * than `max` (0: never), as 535 does in its narrow cells. */
static void clip(char *text, size_t size, int max)
{
    if (max > 0 && strlen(text) > (size_t)max && (size_t)max < size)
        strcpy(text + max - 3, "...");
}

/* The real table moves an "ERR!" one column left of where the value it
 * replaces would stand (persistence, Disp.A, fan, perf), so the rows below
 * use a second format for that case. */
static void row_one(const struct layout *l, const struct gpu *g)
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
    printf(failed(g->r_persistence) ? " %4s |" : "  %-3s |", persistence);
    /* The wide layout right-aligns the bus id in two more columns. */
    printf(l->wide ? "   " : " ");
    printf(failed(g->r_display_active) ? "%-16s%4s |" : "%-16s %3s |", g->pci.busId, disp);
    printf(" %20s |\n", ecc);
}

/* "<n>W / <limit>W"; a value NVML did not give reads N/A (or ERR!) with
 * a space in place of its unit, in the limit's own width. */
static void power_text(const struct layout *l, const struct gpu *g, char *out, size_t size)
{
    char draw[16], cap[16];
    if (g->r_power == NVML_SUCCESS)
        snprintf(draw, sizeof draw, "%uW", g->power_mw / 1000);
    else
        snprintf(draw, sizeof draw, "%s%s", cell(g->r_power, ""), l->wide ? " " : "");
    if (g->r_limit == NVML_SUCCESS) {
        char digits[12];
        snprintf(digits, sizeof digits, l->limit_format, g->limit_mw / 1000);
        snprintf(cap, sizeof cap, "%sW", digits);
    } else {
        snprintf(cap, sizeof cap, l->wide ? "%4s " : "%s", cell(g->r_limit, ""));
    }
    snprintf(out, size, "%s / %s", draw, cap);
    clip(out, size, l->power_max);
}

static void row_two(const struct layout *l, const struct gpu *g)
{
    char fan[16], temp[16], perf[16], power[48], memory[64], util[16];
    int memory_width = l->wide ? 22 : 20;
    snprintf(fan, sizeof fan, "%u%%", g->fan);
    snprintf(temp, sizeof temp, "%uC", g->temp);
    snprintf(perf, sizeof perf, "P%d", (int)g->pstate);
    power_text(l, g, power, sizeof power);
    snprintf(util, sizeof util, "%u%%", g->util.gpu);
    nvmlReturn_t r_perf = smi_pstate_result(g);
    printf(failed(g->r_fan) ? "|%4s" : "| %3s", cell(g->r_fan, fan));
    printf(" %5s", cell(g->r_temp, temp));
    printf(failed(r_perf) ? " %4s%25s |" : "    %-2s%24s |", cell(r_perf, perf), power);
    if (g->r_memory == NVML_SUCCESS) {
        char total[24];
        snprintf(total, sizeof total, l->total_format, g->memory.total >> 20);
        snprintf(memory, sizeof memory, "%lluMiB / %sMiB", g->memory.used >> 20, total);
        clip(memory, sizeof memory, l->memory_max);
        printf(" %*s |", memory_width, memory);
    } else {
        /* The memory cell spells the error out, left-aligned. */
        printf(failed(g->r_memory) ? " %-*s |" : " %*s |", memory_width,
               smi_failure(g->r_memory));
    }
    const char *mode = cell(g->r_compute_mode, smi_compute_mode(g->compute_mode));
    printf("%8s%13s |\n", cell(g->r_util, util), mode);
}

static void row_three(const struct layout *l, const struct gpu *g)
{
    const char *mig = cell(g->r_mig, g->mig_current == NVML_DEVICE_MIG_ENABLE ? "Enabled"
                                                                               : "Disabled");
    printf("| %39s | %*s | %20s |\n", "", l->wide ? 22 : 20, "", mig);
}

/* A rule across the whole table, '+' at both ends. */
static void full_rule(const struct layout *l)
{
    printf("+%.*s+\n", l->wide ? 89 : 87,
           "-----------------------------------------------------------------------------------------");
}

/* A rule along the cell borders: `first` and `last` at the ends, `fill`
 * across each cell, '+' between cells. */
static void cell_rule(const struct layout *l, char first, char fill, char last)
{
    char middle[32];
    int width = l->wide ? 24 : 22;
    memset(middle, fill, (size_t)width);
    middle[width] = '\0';
    char left[42], right[23];
    memset(left, fill, 41);
    left[41] = '\0';
    memset(right, fill, 22);
    right[22] = '\0';
    printf("%c%s+%s+%s%c\n", first, left, middle, right, last);
}

/* A process name longer than its column keeps its tail, after "...". */
static void process_name(const struct layout *l, const char *name, char *out, size_t size)
{
    size_t len = strlen(name);
    if (len > (size_t)l->name_width)
        snprintf(out, size, "...%s", name + len - (size_t)(l->name_width - 3));
    else
        snprintf(out, size, "%s", name);
}

/* Lists compute processes of every GPU, or says there are none. */
static void processes(const struct layout *l, const unsigned *indices, int count)
{
    int inner = l->wide ? 89 : 87; /* columns between the borders */
    if (l->empty_spacer)
        printf("\n");
    else
        printf("%89s\n", "");
    full_rule(l);
    printf("| Processes:%*s|\n", inner - 11, "");
    printf("|  GPU   GI   CI%*s   Type   %-*sGPU Memory |\n", l->pid_width + 1, "PID",
           l->name_width + 1, "Process name");
    printf("|        ID   ID%*sUsage      |\n", inner - 26, "");
    printf("|%.*s|\n", inner,
           "=========================================================================================");
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
            char name[256] = "", shown[256], usage[24];
            nvmlSystemGetProcessName(infos[k].pid, name, sizeof name);
            process_name(l, name, shown, sizeof shown);
            snprintf(usage, sizeof usage, "%lluMiB", infos[k].usedGpuMemory >> 20);
            printf("|  %3u   N/A  N/A%*u      C   %-*s %10s |\n", indices[i], l->pid_width,
                   infos[k].pid, l->name_width, shown, usage);
            any = 1;
        }
    }
    if (!any)
        printf("|  No running processes found%*s|\n", inner - 28, "");
    full_rule(l);
}

int smi_table(void)
{
    unsigned indices[64];
    int count = smi_select(NULL, indices, 64);
    if (count < 0)
        return SMI_EXIT_USAGE;
    struct smi_header h;
    smi_load_header(&h);
    const struct layout *l = layout_for(h.driver);
    /* The fallback ships with the driver it simulates: it carries its version. */
    printf("%s       \n", h.stamp);
    full_rule(l);
    printf("| NVIDIA-SMI %-23sDriver Version: %-*sCUDA Version: %-9s|\n", h.driver,
           l->wide ? 15 : 13, h.driver, h.cuda);
    cell_rule(l, l->plus_rule ? '+' : '|', '-', '+');
    if (l->wide) {
        printf("| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |\n");
        printf("| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |\n");
        printf("|                                         |                        |               MIG M. |\n");
    } else {
        printf("| GPU  Name                 Persistence-M | Bus-Id        Disp.A | Volatile Uncorr. ECC |\n");
        printf("| Fan  Temp   Perf          Pwr:Usage/Cap |         Memory-Usage | GPU-Util  Compute M. |\n");
        printf("|                                         |                      |               MIG M. |\n");
    }
    cell_rule(l, '|', '=', '|');
    for (int i = 0; i < count; i++) {
        struct gpu g;
        if (smi_load_gpu(indices[i], &g) != NVML_SUCCESS)
            continue;
        row_one(l, &g);
        row_two(l, &g);
        row_three(l, &g);
        cell_rule(l, '+', '-', '+');
    }
    processes(l, indices, count);
    return 0;
}
