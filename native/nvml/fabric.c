/*
 * The GPU fabric identity (nvmlDeviceGetGpuFabricInfo, ...InfoV) and the
 * addressing mode.
 *
 * The fabric identity is the profile's, with this node's ComputeDomain
 * clique already folded in by the daemon; state `auto` follows the fabric
 * manager's readiness marker, so GPUs report IN_PROGRESS until the fabric
 * manager is up.  Once registered, the health (InfoV) is the profile's or
 * an override's `fabric.health.*` words (`mokka ctl fabric-health`), each
 * field defaulting to a healthy GB200's.  Apart from nvlink.c because it
 * is the node's fabric registration, not a link: it reads the marker file,
 * not the link table.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "mock.h"

static int parse_uuid(const char *text, unsigned char out[16])
{
    unsigned n = 0;
    for (const char *p = text; *p && n < 32; p++) {
        if (*p == '-')
            continue;
        unsigned nibble;
        if (*p >= '0' && *p <= '9')
            nibble = (unsigned)(*p - '0');
        else if (*p >= 'a' && *p <= 'f')
            nibble = (unsigned)(*p - 'a' + 10);
        else if (*p >= 'A' && *p <= 'F')
            nibble = (unsigned)(*p - 'A' + 10);
        else
            return 0;
        if (n % 2 == 0)
            out[n / 2] = (unsigned char)(nibble << 4);
        else
            out[n / 2] |= (unsigned char)nibble;
        n++;
    }
    return n == 32;
}

/* The states a profile may pin; `auto` follows the fabric manager. */
static const struct mock_enum_name FABRIC_STATES[] = {
    {"completed", NVML_GPU_FABRIC_STATE_COMPLETED},
    {"in_progress", NVML_GPU_FABRIC_STATE_IN_PROGRESS},
    {"not_started", NVML_GPU_FABRIC_STATE_NOT_STARTED},
};

/* A mock_reader: the device's fabric identity in the v1 record, which
 * every version of the query starts from; 0 (and `out` untouched) when the
 * profile has none. */
static int fabric_of(const struct mock_config *cfg, unsigned pos, void *out)
{
    nvmlGpuFabricInfo_t *f = out;
    const char *state = mock_dev_get(cfg, pos, "fabric.state");
    if (state == NULL)
        return 0;
    /* Field by field, not memset: the record is the caller's (v1), and
     * NVML writes its fields, not its padding. */
    memset(f->clusterUuid, 0, sizeof f->clusterUuid);
    f->status = NVML_SUCCESS;
    f->cliqueId = 0;
    const char *uuid = mock_dev_get(cfg, pos, "fabric.cluster_uuid");
    if (uuid != NULL && !parse_uuid(uuid, f->clusterUuid))
        memset(f->clusterUuid, 0, sizeof f->clusterUuid);
    mock_dev_uint(cfg, pos, "fabric.clique_id", &f->cliqueId);
    unsigned fixed;
    if (mock_enum_lookup(state, FABRIC_STATES, MOCK_COUNT(FABRIC_STATES), &fixed)) {
        f->state = (nvmlGpuFabricState_t)fixed;
    } else if (strcasecmp(state, "auto") == 0) {
        /* Registered once the fabric manager has written its marker. */
        const char *marker = mock_cfg_get(cfg, "paths.fabric_ready_marker");
        char path[8192];
        struct stat st;
        int n = marker == NULL ? -1
                : marker[0] == '/' ? snprintf(path, sizeof path, "%s", marker)
                                   : snprintf(path, sizeof path, "%s/%s", cfg->dir, marker);
        int ready = n > 0 && (size_t)n < sizeof path && stat(path, &st) == 0;
        f->state = ready ? NVML_GPU_FABRIC_STATE_COMPLETED : NVML_GPU_FABRIC_STATE_IN_PROGRESS;
    } else {
        f->state = NVML_GPU_FABRIC_STATE_NOT_SUPPORTED;
    }
    return 1;
}

MOCK_API nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device,
                                                 nvmlGpuFabricInfo_t *gpuFabricInfo)
{
    if (gpuFabricInfo == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return mock_read(device, fabric_of, gpuFabricInfo);
}

/* ------------------------------------------------------------------ health */

/* What `fabric.health.<field>` may say (docs/nvml.md, Fabric): "n/a" is
 * the field's NOT_SUPPORTED (0, what H100 boards report for every field).
 * Anything else, or no key, leaves the field at its default. */
static const struct mock_enum_name HEALTH_SUMMARIES[] = {
    {"n/a", NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED},
    {"healthy", NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY},
    {"unhealthy", NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY},
    {"limited_capacity", NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY},
};
static const struct mock_enum_name HEALTH_BANDWIDTHS[] = {
    {"n/a", NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_NOT_SUPPORTED},
    {"degraded", NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE},
    {"full", NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE},
};
/* `true` is a configuration found wrong: the first reason nvml.h lists. */
static const struct mock_enum_name HEALTH_CONFIGURATIONS[] = {
    {"n/a", NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NOT_SUPPORTED},
    {"false", NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NONE},
    {"true", NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INCORRECT_SYSGUID},
    {"incorrect_sysguid", NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INCORRECT_SYSGUID},
    {"incorrect_chassis_sn",
     NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INCORRECT_CHASSIS_SN},
    {"no_partition", NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NO_PARTITION},
    {"insufficient_nvlinks",
     NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INSUFFICIENT_NVLINKS},
};
/* The three yes/no flags share one spelling: true (1), false (2), n/a (0). */
static const struct mock_enum_name HEALTH_FLAGS[] = {
    {"n/a", 0}, {"true", 1}, {"false", 2},
};

/* One field of the health: the engine config's word for it, else `fallback`. */
static unsigned health_word(const struct mock_config *cfg, unsigned pos, const char *field,
                            const struct mock_enum_name *table, size_t n, unsigned fallback)
{
    char key[64];
    snprintf(key, sizeof key, "fabric.health.%s", field);
    const char *word = mock_dev_get(cfg, pos, key);
    unsigned value;
    return word != NULL && mock_enum_lookup(word, table, n, &value) ? value : fallback;
}

struct fabric_v {
    nvmlGpuFabricInfo_t f;
    unsigned mask, summary;
};

/* A mock_reader: the identity (fabric_of), and once the fabric is
 * registered its health: the profile's or an override's words
 * (`mokka ctl fabric-health`), else healthy at full bandwidth with no
 * recovery, as a registered GB200 reports.  Before registration every
 * field is NOT_SUPPORTED, whatever the words say. */
static int fabric_v_of(const struct mock_config *cfg, unsigned pos, void *out)
{
    struct fabric_v *v = out;
    if (!fabric_of(cfg, pos, &v->f))
        return 0;
    v->mask = 0;
    v->summary = NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED;
    if (v->f.state != NVML_GPU_FABRIC_STATE_COMPLETED)
        return 1;
    const unsigned no = 2; /* every flag's _FALSE */
    v->mask = health_word(cfg, pos, "bandwidth", HEALTH_BANDWIDTHS,
                          MOCK_COUNT(HEALTH_BANDWIDTHS),
                          NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE)
                  << NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW |
              health_word(cfg, pos, "route_recovery_in_progress", HEALTH_FLAGS,
                          MOCK_COUNT(HEALTH_FLAGS), no)
                  << NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY |
              health_word(cfg, pos, "route_unhealthy", HEALTH_FLAGS, MOCK_COUNT(HEALTH_FLAGS), no)
                  << NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY |
              health_word(cfg, pos, "access_timeout_recovery", HEALTH_FLAGS,
                          MOCK_COUNT(HEALTH_FLAGS), no)
                  << NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY |
              health_word(cfg, pos, "incorrect_configuration", HEALTH_CONFIGURATIONS,
                          MOCK_COUNT(HEALTH_CONFIGURATIONS),
                          NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NOT_SUPPORTED)
                  << NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION;
    v->summary = health_word(cfg, pos, "summary", HEALTH_SUMMARIES, MOCK_COUNT(HEALTH_SUMMARIES),
                             NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY);
    return 1;
}

MOCK_API nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device,
                                                  nvmlGpuFabricInfoV_t *gpuFabricInfo)
{
    if (gpuFabricInfo == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned version = gpuFabricInfo->version;
    if (version != nvmlGpuFabricInfo_v2 && version != nvmlGpuFabricInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    struct fabric_v v;
    nvmlReturn_t r = mock_read(device, fabric_v_of, &v);
    if (r == NVML_SUCCESS) {
        memcpy(gpuFabricInfo->clusterUuid, v.f.clusterUuid, sizeof v.f.clusterUuid);
        gpuFabricInfo->status = v.f.status;
        gpuFabricInfo->cliqueId = v.f.cliqueId;
        gpuFabricInfo->state = v.f.state;
        gpuFabricInfo->healthMask = v.mask;
        if (version == nvmlGpuFabricInfo_v3)
            gpuFabricInfo->healthSummary = v.summary;
    }
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetAddressingMode(nvmlDevice_t device,
                                                  nvmlDeviceAddressingMode_t *mode)
{
    if (mode == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (mode->version != nvmlDeviceAddressingMode_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    static const struct mock_enum_name modes[] = {{"hmm", NVML_DEVICE_ADDRESSING_MODE_HMM},
                                                  {"ats", NVML_DEVICE_ADDRESSING_MODE_ATS},
                                                  {"none", NVML_DEVICE_ADDRESSING_MODE_NONE}};
    /* No (known) mode in the profile: the board predates the query. */
    return mock_enum_field(device, MOCK_GUARDED, "addressing_mode", modes, MOCK_COUNT(modes),
                           MOCK_ENUM_REQUIRED, &mode->value);
}
