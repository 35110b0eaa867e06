/*
 * MIG: the board's GPU-instance profile table (docs/mig.md).
 *
 * The table is the board's, rendered by the daemon into the engine config
 * as `device.<n>.mig.gi.<k>.*` from the guide's data (mokka/state/
 * mig_profiles.py); a board without it is not MIG capable.  This file
 * reads it (for the other MIG files too, mock_mig_profile) and answers
 * the getters that are the table alone: profile info and the possible
 * placements of a GPU instance.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mig.h"

/* Entry `k` of the board's table; 0 when it is not there. */
static int read_gi(const struct mock_config *cfg, unsigned pos, unsigned k,
                   struct gi_profile *out)
{
    char field[64];
#define GI_UINT(name, dest)                                                     \
    (snprintf(field, sizeof field, "mig.gi.%u." name, k),                       \
     mock_dev_uint(cfg, pos, field, dest))
    memset(out, 0, sizeof *out);
    if (!GI_UINT("nvml_id", &out->nvml_id) || !GI_UINT("smi_id", &out->smi_id) ||
        !GI_UINT("slices", &out->slices) || !GI_UINT("instances", &out->instances) ||
        !GI_UINT("size", &out->size))
        return 0;
    GI_UINT("multiprocessors", &out->multiprocessors);
    GI_UINT("decoders", &out->decoders);
    GI_UINT("jpegs", &out->jpegs);
    GI_UINT("ofas", &out->ofas);
#undef GI_UINT
    snprintf(field, sizeof field, "mig.gi.%u.memory_mib", k);
    mock_dev_u64(cfg, pos, field, &out->memory_mib);
    snprintf(field, sizeof field, "mig.gi.%u.name", k);
    const char *name = mock_dev_get(cfg, pos, field);
    snprintf(out->name, sizeof out->name, "%.31s", name != NULL ? name : "");
    snprintf(field, sizeof field, "mig.gi.%u.starts", k);
    const char *starts = mock_dev_get(cfg, pos, field);
    for (const char *p = starts; p != NULL && *p != '\0' && out->nstarts < 8;) {
        char *end;
        unsigned long v = strtoul(p, &end, 10);
        if (end == p)
            break;
        out->starts[out->nstarts++] = (unsigned)v;
        p = *end == ',' ? end + 1 : end;
    }
    return 1;
}

nvmlReturn_t mock_mig_profile(nvmlDevice_t device, unsigned id, int by_smi_id,
                              struct gi_profile *out)
{
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    unsigned count = 0;
    r = NVML_ERROR_NOT_SUPPORTED;
    if (mock_dev_uint(c.cfg, c.pos, "mig.gi_count", &count)) {
        for (unsigned k = 0; k < count; k++) {
            if (read_gi(c.cfg, c.pos, k, out) && (by_smi_id ? out->smi_id : out->nvml_id) == id) {
                r = NVML_SUCCESS;
                break;
            }
        }
    }
    mock_end(&c);
    return r;
}

/* ------------------------------------------------------------ profile info */

/* The profile an NVML profile id names, for a getter whose answer is `info`. */
static nvmlReturn_t profile_of(nvmlDevice_t device, unsigned profile, const void *info,
                               struct gi_profile *p)
{
    if (info == NULL || profile >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    return mock_mig_profile(device, profile, 0, p);
}

#define GI_FILL(info, p)                                                        \
    do {                                                                        \
        (info)->id = (p).smi_id;                                                \
        (info)->sliceCount = (p).slices;                                        \
        (info)->instanceCount = (p).instances;                                  \
        (info)->multiprocessorCount = (p).multiprocessors;                      \
        (info)->copyEngineCount = (p).slices;                                   \
        (info)->decoderCount = (p).decoders;                                    \
        (info)->encoderCount = 0;                                               \
        (info)->jpegCount = (p).jpegs;                                          \
        (info)->ofaCount = (p).ofas;                                            \
        (info)->memorySizeMB = (p).memory_mib;                                  \
    } while (0)

MOCK_API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                         nvmlGpuInstanceProfileInfo_t *info)
{
    struct gi_profile p;
    nvmlReturn_t r = profile_of(device, profile, info, &p);
    if (r != NVML_SUCCESS)
        return r;
    GI_FILL(info, p);
    info->isP2pSupported = 0;
    return NVML_SUCCESS;
}

/* v2 and v3 share the layout up to the name; v3's capabilities take v2's
 * isP2pSupported place (0 either way: no P2P, no graphics). */
static nvmlReturn_t fill_v(nvmlGpuInstanceProfileInfo_v2_t *info, const struct gi_profile *p)
{
    if (info->version != nvmlGpuInstanceProfileInfo_v2 &&
        info->version != nvmlGpuInstanceProfileInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    GI_FILL(info, *p);
    info->isP2pSupported = 0;
    snprintf(info->name, sizeof info->name, "MIG %s%s", p->name,
             p->nvml_id == NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 ? "+me" : "");
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                          nvmlGpuInstanceProfileInfo_v2_t *info)
{
    struct gi_profile p;
    nvmlReturn_t r = profile_of(device, profile, info, &p);
    return r != NVML_SUCCESS ? r : fill_v(info, &p);
}

MOCK_API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoByIdV(nvmlDevice_t device,
                                                              unsigned int profileId,
                                                              nvmlGpuInstanceProfileInfo_v2_t *info)
{
    struct gi_profile p;
    nvmlReturn_t r = mock_mig_profile_arg(device, profileId, info, &p);
    return r != NVML_SUCCESS ? r : fill_v(info, &p);
}

/* ------------------------------------------------------------- placements */

MOCK_API nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    nvmlDevice_t device, unsigned int profileId, nvmlGpuInstancePlacement_t *placements,
    unsigned int *count)
{
    struct gi_profile p;
    nvmlReturn_t r = mock_mig_profile_arg(device, profileId, count, &p);
    if (r != NVML_SUCCESS)
        return r;
    unsigned room = mock_list_room(placements, count);
    for (unsigned i = 0; i < p.nstarts && i < room; i++) {
        placements[i].start = p.starts[i];
        placements[i].size = p.size;
    }
    return mock_list_result(placements, count, p.nstarts);
}
