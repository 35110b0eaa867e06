/*
 * --query-gpu=<fields> --format=csv[,noheader][,nounits]
 *
 * Field names, aliases, header spellings and value formats follow
 * nvidia-smi 535 (header: canonical name plus " [unit]"; nounits drops the
 * unit from values only; a value NVML cannot give prints "[N/A]").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "smi.h"

enum field_id {
    F_TIMESTAMP, F_DRIVER, F_COUNT, F_NAME, F_SERIAL, F_UUID, F_BUS_ID, F_DOMAIN, F_BUS,
    F_DEVICE, F_DEVICE_ID, F_SUB_DEVICE_ID, F_INDEX, F_VBIOS, F_INFOROM, F_DISPLAY_MODE,
    F_DISPLAY_ACTIVE, F_PERSISTENCE, F_GEN, F_GEN_MAX, F_WIDTH, F_WIDTH_MAX, F_FAN, F_PSTATE,
    F_MEM_TOTAL, F_MEM_RESERVED, F_MEM_USED, F_MEM_FREE, F_COMPUTE_MODE, F_COMPUTE_CAP,
    F_UTIL_GPU, F_UTIL_MEM, F_ECC_CUR, F_ECC_PEND, F_TEMP, F_MEM_TEMP, F_POWER_DRAW,
    F_POWER_LIMIT, F_ENFORCED, F_DEFAULT_LIMIT, F_MIN_LIMIT, F_MAX_LIMIT, F_CLK_GR, F_CLK_SM,
    F_CLK_MEM, F_CLK_VIDEO, F_MAX_GR, F_MAX_SM, F_MAX_MEM, F_MIG_CUR, F_MIG_PEND,
};

struct field {
    const char *names[3]; /* the canonical name first, then aliases */
    const char *unit;     /* shown in the header and (unless nounits) after values */
    enum field_id id;
};

static const struct field FIELDS[] = {
    {{"timestamp"}, NULL, F_TIMESTAMP},
    {{"driver_version"}, NULL, F_DRIVER},
    {{"count"}, NULL, F_COUNT},
    {{"name", "gpu_name"}, NULL, F_NAME},
    {{"serial", "gpu_serial"}, NULL, F_SERIAL},
    {{"uuid", "gpu_uuid"}, NULL, F_UUID},
    {{"pci.bus_id", "gpu_bus_id"}, NULL, F_BUS_ID},
    {{"pci.domain"}, NULL, F_DOMAIN},
    {{"pci.bus"}, NULL, F_BUS},
    {{"pci.device"}, NULL, F_DEVICE},
    {{"pci.device_id"}, NULL, F_DEVICE_ID},
    {{"pci.sub_device_id"}, NULL, F_SUB_DEVICE_ID},
    {{"index"}, NULL, F_INDEX},
    {{"vbios_version"}, NULL, F_VBIOS},
    {{"inforom.img", "inforom.image"}, NULL, F_INFOROM},
    {{"display_mode"}, NULL, F_DISPLAY_MODE},
    {{"display_active"}, NULL, F_DISPLAY_ACTIVE},
    {{"persistence_mode"}, NULL, F_PERSISTENCE},
    {{"pcie.link.gen.current"}, NULL, F_GEN},
    {{"pcie.link.gen.max"}, NULL, F_GEN_MAX},
    {{"pcie.link.width.current"}, NULL, F_WIDTH},
    {{"pcie.link.width.max"}, NULL, F_WIDTH_MAX},
    {{"fan.speed"}, "%", F_FAN},
    {{"pstate"}, NULL, F_PSTATE},
    {{"memory.total"}, "MiB", F_MEM_TOTAL},
    {{"memory.reserved"}, "MiB", F_MEM_RESERVED},
    {{"memory.used"}, "MiB", F_MEM_USED},
    {{"memory.free"}, "MiB", F_MEM_FREE},
    {{"compute_mode"}, NULL, F_COMPUTE_MODE},
    {{"compute_cap"}, NULL, F_COMPUTE_CAP},
    {{"utilization.gpu"}, "%", F_UTIL_GPU},
    {{"utilization.memory"}, "%", F_UTIL_MEM},
    {{"ecc.mode.current"}, NULL, F_ECC_CUR},
    {{"ecc.mode.pending"}, NULL, F_ECC_PEND},
    {{"temperature.gpu"}, NULL, F_TEMP},
    {{"temperature.memory"}, NULL, F_MEM_TEMP},
    {{"power.draw"}, "W", F_POWER_DRAW},
    {{"power.limit"}, "W", F_POWER_LIMIT},
    {{"enforced.power.limit"}, "W", F_ENFORCED},
    {{"power.default_limit"}, "W", F_DEFAULT_LIMIT},
    {{"power.min_limit"}, "W", F_MIN_LIMIT},
    {{"power.max_limit"}, "W", F_MAX_LIMIT},
    {{"clocks.current.graphics", "clocks.gr"}, "MHz", F_CLK_GR},
    {{"clocks.current.sm", "clocks.sm"}, "MHz", F_CLK_SM},
    {{"clocks.current.memory", "clocks.mem"}, "MHz", F_CLK_MEM},
    {{"clocks.current.video", "clocks.video"}, "MHz", F_CLK_VIDEO},
    {{"clocks.max.graphics", "clocks.max.gr"}, "MHz", F_MAX_GR},
    {{"clocks.max.sm"}, "MHz", F_MAX_SM},
    {{"clocks.max.memory", "clocks.max.mem"}, "MHz", F_MAX_MEM},
    {{"mig.mode.current"}, NULL, F_MIG_CUR},
    {{"mig.mode.pending"}, NULL, F_MIG_PEND},
};

#define NFIELDS (sizeof FIELDS / sizeof *FIELDS)

static const struct field *lookup(const char *name)
{
    for (size_t i = 0; i < NFIELDS; i++)
        for (int k = 0; k < 3 && FIELDS[i].names[k] != NULL; k++)
            if (strcmp(FIELDS[i].names[k], name) == 0)
                return &FIELDS[i];
    return NULL;
}

/* Writes one value; returns NVML_SUCCESS, or the result of the call that
 * could not provide it (a value NVML has but the tool does not show, like
 * an unknown P-state, is NOT_SUPPORTED). */
static nvmlReturn_t value(const struct field *f, const struct gpu *g, unsigned count, char *out,
                          size_t n)
{
    const int clock_map[] = {[F_CLK_GR] = NVML_CLOCK_GRAPHICS, [F_CLK_SM] = NVML_CLOCK_SM,
                             [F_CLK_MEM] = NVML_CLOCK_MEM, [F_CLK_VIDEO] = NVML_CLOCK_VIDEO,
                             [F_MAX_GR] = NVML_CLOCK_GRAPHICS, [F_MAX_SM] = NVML_CLOCK_SM,
                             [F_MAX_MEM] = NVML_CLOCK_MEM};
#define PUT(result, ...)                                                                         \
    do {                                                                                         \
        nvmlReturn_t put_r = (result);                                                           \
        if (put_r == NVML_SUCCESS)                                                               \
            snprintf(out, n, __VA_ARGS__);                                                       \
        return put_r;                                                                            \
    } while (0)
    switch (f->id) {
    case F_TIMESTAMP: {
        struct timeval tv;
        struct tm tm;
        char date[32];
        gettimeofday(&tv, NULL);
        localtime_r(&tv.tv_sec, &tm);
        strftime(date, sizeof date, "%Y/%m/%d %H:%M:%S", &tm);
        PUT(NVML_SUCCESS, "%s.%03ld", date, (long)(tv.tv_usec / 1000));
    }
    case F_DRIVER: {
        char driver[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
        PUT(nvmlSystemGetDriverVersion(driver, sizeof driver), "%s", driver);
    }
    case F_COUNT: PUT(NVML_SUCCESS, "%u", count);
    case F_NAME: PUT(g->r_name, "%s", g->name);
    case F_SERIAL: PUT(g->r_serial, "%s", g->serial);
    case F_UUID: PUT(g->r_uuid, "%s", g->uuid);
    case F_BUS_ID: PUT(g->r_pci, "%s", g->pci.busId);
    case F_DOMAIN: PUT(g->r_pci, "0x%04X", g->pci.domain);
    case F_BUS: PUT(g->r_pci, "0x%02X", g->pci.bus);
    case F_DEVICE: PUT(g->r_pci, "0x%02X", g->pci.device);
    case F_DEVICE_ID: PUT(g->r_pci, "0x%08X", g->pci.pciDeviceId);
    case F_SUB_DEVICE_ID: PUT(g->r_pci, "0x%08X", g->pci.pciSubSystemId);
    case F_INDEX: PUT(NVML_SUCCESS, "%u", g->index);
    case F_VBIOS: PUT(g->r_vbios, "%s", g->vbios);
    case F_INFOROM: PUT(g->r_inforom, "%s", g->inforom_img);
    case F_DISPLAY_MODE:
        PUT(g->r_display_mode, "%s", smi_enabled(g->display_mode));
    case F_DISPLAY_ACTIVE:
        PUT(g->r_display_active, "%s", smi_enabled(g->display_active));
    case F_PERSISTENCE: PUT(g->r_persistence, "%s", smi_enabled(g->persistence));
    case F_GEN: PUT(g->r_gen, "%u", g->gen);
    case F_GEN_MAX: PUT(g->r_max_gen, "%u", g->max_gen);
    case F_WIDTH: PUT(g->r_width, "%u", g->width);
    case F_WIDTH_MAX: PUT(g->r_max_width, "%u", g->max_width);
    case F_FAN: PUT(g->r_fan, "%u", g->fan);
    case F_PSTATE:
        PUT(smi_pstate_result(g), "P%d", (int)g->pstate);
    case F_MEM_TOTAL: PUT(g->r_memory, "%llu", g->memory.total >> 20);
    case F_MEM_RESERVED: PUT(g->r_memory, "%llu", g->memory.reserved >> 20);
    case F_MEM_USED: PUT(g->r_memory, "%llu", g->memory.used >> 20);
    case F_MEM_FREE: PUT(g->r_memory, "%llu", g->memory.free >> 20);
    case F_COMPUTE_MODE:
        PUT(g->r_compute_mode, "%s",
            g->compute_mode == NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
                ? "Exclusive_Process"
                : smi_compute_mode(g->compute_mode));
    case F_COMPUTE_CAP: PUT(g->r_cc, "%d.%d", g->cc_major, g->cc_minor);
    case F_UTIL_GPU: PUT(g->r_util, "%u", g->util.gpu);
    case F_UTIL_MEM: PUT(g->r_util, "%u", g->util.memory);
    case F_ECC_CUR: PUT(g->r_ecc, "%s", smi_enabled(g->ecc_current));
    case F_ECC_PEND: PUT(g->r_ecc, "%s", smi_enabled(g->ecc_pending));
    case F_TEMP: PUT(g->r_temp, "%u", g->temp);
    case F_MEM_TEMP: PUT(g->r_mem_temp, "%u", g->mem_temp);
    case F_POWER_DRAW: PUT(g->r_power, "%.2f", g->power_mw / 1000.0);
    case F_POWER_LIMIT: PUT(g->r_limit, "%.2f", g->limit_mw / 1000.0);
    case F_ENFORCED: PUT(g->r_enforced, "%.2f", g->enforced_mw / 1000.0);
    case F_DEFAULT_LIMIT:
        PUT(g->r_default_limit, "%.2f", g->default_limit_mw / 1000.0);
    case F_MIN_LIMIT: PUT(g->r_limits, "%.2f", g->min_limit_mw / 1000.0);
    case F_MAX_LIMIT: PUT(g->r_limits, "%.2f", g->max_limit_mw / 1000.0);
    case F_CLK_GR:
    case F_CLK_SM:
    case F_CLK_MEM:
    case F_CLK_VIDEO: {
        int t = clock_map[f->id];
        PUT(g->r_clock[t], "%u", g->clock[t]);
    }
    case F_MAX_GR:
    case F_MAX_SM:
    case F_MAX_MEM: {
        int t = clock_map[f->id];
        PUT(g->r_max_clock[t], "%u", g->max_clock[t]);
    }
    case F_MIG_CUR:
        PUT(g->r_mig, "%s",
            g->mig_current == NVML_DEVICE_MIG_ENABLE ? "Enabled" : "Disabled");
    case F_MIG_PEND:
        PUT(g->r_mig, "%s",
            g->mig_pending == NVML_DEVICE_MIG_ENABLE ? "Enabled" : "Disabled");
    }
#undef PUT
    return NVML_ERROR_NOT_SUPPORTED;
}

/* Splits a copy of `text` at commas (empty items dropped, as strtok does);
 * the caller frees *copy and the returned array.  NULL when out of memory. */
static char **split(const char *text, char **copy, size_t *count)
{
    size_t most = 1;
    for (const char *p = text; *p; p++)
        most += *p == ',';
    *copy = strdup(text);
    char **items = malloc(most * sizeof *items);
    if (*copy == NULL || items == NULL) {
        free(*copy);
        free(items);
        return NULL;
    }
    *count = 0;
    for (char *save = NULL, *t = strtok_r(*copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
        items[(*count)++] = t;
    return items;
}

/* How a value the tool could not read prints: "[N/A]" when the GPU lacks
 * it, else the error in brackets ("[GPU is lost]"), as nvidia-smi does. */
static void print_failure(const struct field *f, nvmlReturn_t r)
{
    if (r == NVML_ERROR_NOT_SUPPORTED)
        /* nvidia-smi brackets N/A, except for the memory temperature. */
        printf("%s", f->id == F_MEM_TEMP ? "N/A" : "[N/A]");
    else
        printf("[%s]", smi_failure(r));
}

static int query(const struct field **selected, size_t nselected, int noheader, int nounits,
                 const char *ids)
{
    unsigned indices[64], count = 0;
    int n = smi_select(ids, indices, 64);
    if (n < 0)
        return SMI_EXIT_NOT_FOUND;
    nvmlDeviceGetCount(&count);
    if (!noheader) {
        for (size_t i = 0; i < nselected; i++) {
            const struct field *f = selected[i];
            printf("%s%s", i ? ", " : "", f->names[0]);
            if (f->unit != NULL)
                printf(" [%s]", f->unit);
        }
        printf("\n");
    }
    for (int k = 0; k < n; k++) {
        struct gpu g;
        if (smi_load_gpu(indices[k], &g) != NVML_SUCCESS)
            continue;
        for (size_t i = 0; i < nselected; i++) {
            char text[256];
            const struct field *f = selected[i];
            nvmlReturn_t r = value(f, &g, count, text, sizeof text);
            printf("%s", i ? ", " : "");
            if (r != NVML_SUCCESS)
                print_failure(f, r);
            else if (f->unit != NULL && !nounits)
                printf("%s %s", text, f->unit);
            else
                printf("%s", text);
        }
        printf("\n");
    }
    return 0;
}

int smi_query_gpu(const char *fields, const char *format, const char *ids)
{
    /* No limit on the number of fields or the length of either list: the
     * real tool takes every field it knows in one argument. */
    int noheader = 0, nounits = 0, csv = 0;
    char *format_copy, *fields_copy;
    size_t nformat, nfields;
    char **modifiers = split(format, &format_copy, &nformat);
    if (modifiers == NULL)
        return SMI_EXIT_USAGE;
    for (size_t i = 0; i < nformat; i++) {
        if (strcmp(modifiers[i], "csv") == 0)
            csv = csv < 0 ? csv : 1;
        else if (strcmp(modifiers[i], "noheader") == 0)
            noheader = 1;
        else if (strcmp(modifiers[i], "nounits") == 0)
            nounits = 1;
        else
            csv = -1;
    }
    free(modifiers);
    free(format_copy);
    if (csv < 0) {
        printf("Format modifier is not recognized.\n");
        return SMI_EXIT_USAGE;
    }
    if (csv == 0) {
        printf("Format modifier --format=csv is mandatory.\n");
        return SMI_EXIT_USAGE;
    }
    char **names = split(fields, &fields_copy, &nfields);
    if (names == NULL)
        return SMI_EXIT_USAGE;
    const struct field **selected = malloc((nfields ? nfields : 1) * sizeof *selected);
    int rc = selected == NULL ? SMI_EXIT_USAGE : 0;
    for (size_t i = 0; rc == 0 && i < nfields; i++) {
        selected[i] = lookup(names[i]);
        if (selected[i] == NULL) {
            printf("Field \"%s\" is not a valid field to query.\n\n", names[i]);
            rc = SMI_EXIT_USAGE;
        }
    }
    if (rc == 0)
        rc = query(selected, nfields, noheader, nounits, ids);
    free(selected);
    free(names);
    free(fields_copy);
    return rc;
}
