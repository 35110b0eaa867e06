/*
 * --query-gpu=<fields> --format=csv[,noheader][,nounits]
 *
 * Field names, aliases, header spellings and value formats follow
 * nvidia-smi 535 (header: canonical name plus " [unit]"; nounits drops the
 * unit from values only; a value NVML cannot give prints "[N/A]").
 */
#include <stdio.h>
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
    F_CLK_MEM, F_CLK_VIDEO, F_MAX_GR, F_MAX_SM, F_MAX_MEM, F_MAX_VIDEO, F_MIG_CUR, F_MIG_PEND,
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
    {{"clocks.max.video"}, "MHz", F_MAX_VIDEO},
    {{"mig.mode.current"}, NULL, F_MIG_CUR},
    {{"mig.mode.pending"}, NULL, F_MIG_PEND},
};

#define NFIELDS (sizeof FIELDS / sizeof *FIELDS)
#define MAX_SELECTED 128

static const struct field *lookup(const char *name)
{
    for (size_t i = 0; i < NFIELDS; i++)
        for (int k = 0; k < 3 && FIELDS[i].names[k] != NULL; k++)
            if (strcmp(FIELDS[i].names[k], name) == 0)
                return &FIELDS[i];
    return NULL;
}

/* Writes one value; returns 0 when NVML could not provide it. */
static int value(const struct field *f, const struct gpu *g, unsigned count, char *out, size_t n)
{
    const int clock_map[] = {[F_CLK_GR] = NVML_CLOCK_GRAPHICS, [F_CLK_SM] = NVML_CLOCK_SM,
                             [F_CLK_MEM] = NVML_CLOCK_MEM, [F_CLK_VIDEO] = NVML_CLOCK_VIDEO,
                             [F_MAX_GR] = NVML_CLOCK_GRAPHICS, [F_MAX_SM] = NVML_CLOCK_SM,
                             [F_MAX_MEM] = NVML_CLOCK_MEM, [F_MAX_VIDEO] = NVML_CLOCK_VIDEO};
#define PUT(ok, ...) return (ok) ? (snprintf(out, n, __VA_ARGS__), 1) : 0
    switch (f->id) {
    case F_TIMESTAMP: {
        struct timeval tv;
        struct tm tm;
        char date[32];
        gettimeofday(&tv, NULL);
        localtime_r(&tv.tv_sec, &tm);
        strftime(date, sizeof date, "%Y/%m/%d %H:%M:%S", &tm);
        PUT(1, "%s.%03ld", date, (long)(tv.tv_usec / 1000));
    }
    case F_DRIVER: {
        char driver[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
        PUT(nvmlSystemGetDriverVersion(driver, sizeof driver) == NVML_SUCCESS, "%s", driver);
    }
    case F_COUNT: PUT(1, "%u", count);
    case F_NAME: PUT(g->r_name == NVML_SUCCESS, "%s", g->name);
    case F_SERIAL: PUT(g->r_serial == NVML_SUCCESS, "%s", g->serial);
    case F_UUID: PUT(g->r_uuid == NVML_SUCCESS, "%s", g->uuid);
    case F_BUS_ID: PUT(g->r_pci == NVML_SUCCESS, "%s", g->pci.busId);
    case F_DOMAIN: PUT(g->r_pci == NVML_SUCCESS, "0x%04X", g->pci.domain);
    case F_BUS: PUT(g->r_pci == NVML_SUCCESS, "0x%02X", g->pci.bus);
    case F_DEVICE: PUT(g->r_pci == NVML_SUCCESS, "0x%02X", g->pci.device);
    case F_DEVICE_ID: PUT(g->r_pci == NVML_SUCCESS, "0x%08X", g->pci.pciDeviceId);
    case F_SUB_DEVICE_ID: PUT(g->r_pci == NVML_SUCCESS, "0x%08X", g->pci.pciSubSystemId);
    case F_INDEX: PUT(1, "%u", g->index);
    case F_VBIOS: PUT(g->r_vbios == NVML_SUCCESS, "%s", g->vbios);
    case F_INFOROM: PUT(g->r_inforom == NVML_SUCCESS, "%s", g->inforom_img);
    case F_DISPLAY_MODE:
        PUT(g->r_display_mode == NVML_SUCCESS, "%s", smi_enabled(g->display_mode));
    case F_DISPLAY_ACTIVE:
        PUT(g->r_display_active == NVML_SUCCESS, "%s", smi_enabled(g->display_active));
    case F_PERSISTENCE: PUT(g->r_persistence == NVML_SUCCESS, "%s", smi_enabled(g->persistence));
    case F_GEN: PUT(g->r_gen == NVML_SUCCESS, "%u", g->gen);
    case F_GEN_MAX: PUT(g->r_max_gen == NVML_SUCCESS, "%u", g->max_gen);
    case F_WIDTH: PUT(g->r_width == NVML_SUCCESS, "%u", g->width);
    case F_WIDTH_MAX: PUT(g->r_max_width == NVML_SUCCESS, "%u", g->max_width);
    case F_FAN: PUT(g->r_fan == NVML_SUCCESS, "%u", g->fan);
    case F_PSTATE:
        PUT(g->r_pstate == NVML_SUCCESS && g->pstate != NVML_PSTATE_UNKNOWN, "P%d", (int)g->pstate);
    case F_MEM_TOTAL: PUT(g->r_memory == NVML_SUCCESS, "%llu", g->memory.total >> 20);
    case F_MEM_RESERVED: PUT(g->r_memory == NVML_SUCCESS, "%llu", g->memory.reserved >> 20);
    case F_MEM_USED: PUT(g->r_memory == NVML_SUCCESS, "%llu", g->memory.used >> 20);
    case F_MEM_FREE: PUT(g->r_memory == NVML_SUCCESS, "%llu", g->memory.free >> 20);
    case F_COMPUTE_MODE:
        PUT(g->r_compute_mode == NVML_SUCCESS, "%s",
            g->compute_mode == NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
                ? "Exclusive_Process"
                : smi_compute_mode(g->compute_mode));
    case F_COMPUTE_CAP: PUT(g->r_cc == NVML_SUCCESS, "%d.%d", g->cc_major, g->cc_minor);
    case F_UTIL_GPU: PUT(g->r_util == NVML_SUCCESS, "%u", g->util.gpu);
    case F_UTIL_MEM: PUT(g->r_util == NVML_SUCCESS, "%u", g->util.memory);
    case F_ECC_CUR: PUT(g->r_ecc == NVML_SUCCESS, "%s", smi_enabled(g->ecc_current));
    case F_ECC_PEND: PUT(g->r_ecc == NVML_SUCCESS, "%s", smi_enabled(g->ecc_pending));
    case F_TEMP: PUT(g->r_temp == NVML_SUCCESS, "%u", g->temp);
    case F_MEM_TEMP: PUT(g->r_mem_temp == NVML_SUCCESS, "%u", g->mem_temp);
    case F_POWER_DRAW: PUT(g->r_power == NVML_SUCCESS, "%.2f", g->power_mw / 1000.0);
    case F_POWER_LIMIT: PUT(g->r_limit == NVML_SUCCESS, "%.2f", g->limit_mw / 1000.0);
    case F_ENFORCED: PUT(g->r_enforced == NVML_SUCCESS, "%.2f", g->enforced_mw / 1000.0);
    case F_DEFAULT_LIMIT:
        PUT(g->r_default_limit == NVML_SUCCESS, "%.2f", g->default_limit_mw / 1000.0);
    case F_MIN_LIMIT: PUT(g->r_limits == NVML_SUCCESS, "%.2f", g->min_limit_mw / 1000.0);
    case F_MAX_LIMIT: PUT(g->r_limits == NVML_SUCCESS, "%.2f", g->max_limit_mw / 1000.0);
    case F_CLK_GR:
    case F_CLK_SM:
    case F_CLK_MEM:
    case F_CLK_VIDEO: {
        int t = clock_map[f->id];
        PUT(g->r_clock[t] == NVML_SUCCESS, "%u", g->clock[t]);
    }
    case F_MAX_GR:
    case F_MAX_SM:
    case F_MAX_MEM:
    case F_MAX_VIDEO: {
        int t = clock_map[f->id];
        PUT(g->r_max_clock[t] == NVML_SUCCESS, "%u", g->max_clock[t]);
    }
    case F_MIG_CUR:
        PUT(g->r_mig == NVML_SUCCESS, "%s",
            g->mig_current == NVML_DEVICE_MIG_ENABLE ? "Enabled" : "Disabled");
    case F_MIG_PEND:
        PUT(g->r_mig == NVML_SUCCESS, "%s",
            g->mig_pending == NVML_DEVICE_MIG_ENABLE ? "Enabled" : "Disabled");
    }
#undef PUT
    return 0;
}

int smi_query_gpu(const char *fields, const char *format, const char *ids)
{
    int noheader = 0, nounits = 0, csv = 0;
    char buf[1024];
    if (strlen(format) >= sizeof buf || strlen(fields) >= sizeof buf) {
        printf("Format modifier is not recognized.\n");
        return SMI_EXIT_USAGE;
    }
    strcpy(buf, format);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (strcmp(t, "csv") == 0)
            csv = 1;
        else if (strcmp(t, "noheader") == 0)
            noheader = 1;
        else if (strcmp(t, "nounits") == 0)
            nounits = 1;
        else
            csv = -1;
    }
    if (csv != 1) {
        printf("Format modifier is not recognized.\n");
        return SMI_EXIT_USAGE;
    }
    const struct field *selected[MAX_SELECTED];
    size_t nselected = 0;
    strcpy(buf, fields);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        const struct field *f = lookup(t);
        if (f == NULL || nselected == MAX_SELECTED) {
            printf("Field \"%s\" is not a valid field to query.\n\n", t);
            return SMI_EXIT_USAGE;
        }
        selected[nselected++] = f;
    }
    unsigned indices[64], count = 0;
    int n = smi_select(ids, indices, 64);
    if (n < 0)
        return SMI_EXIT_USAGE;
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
        smi_load_gpu(indices[k], &g);
        for (size_t i = 0; i < nselected; i++) {
            char text[256];
            const struct field *f = selected[i];
            if (!value(f, &g, count, text, sizeof text))
                /* nvidia-smi brackets N/A, except for the memory temperature. */
                printf("%s%s", i ? ", " : "", f->id == F_MEM_TEMP ? "N/A" : "[N/A]");
            else if (f->unit != NULL && !nounits)
                printf("%s%s %s", i ? ", " : "", text, f->unit);
            else
                printf("%s%s", i ? ", " : "", text);
        }
        printf("\n");
    }
    return 0;
}
