/*
 * MIG: the mode setter, the board's profile tables, GPU and compute
 * instances and MIG device handles (docs/mig.md).
 *
 * The table is the board's, rendered by the daemon into the engine config
 * as `device.<n>.mig.gi.<k>.*` from the guide's data (mokka/state/
 * mig_profiles.py); a board without it is not MIG capable.  The mode is
 * node state like the other setters (setters.c): the daemon decides
 * whether the change is in force at once or pending until a reset, and
 * the activation status here reads the answer back.  The layout of GPU
 * and compute instances is node state too: a create or destroy is a
 * setter (the daemon checks it against the table and records it), and
 * the getters read the layout back from the engine config.  The library
 * picks the placement (the first free one, as the driver does) so it
 * knows the new instance's id without another round trip.
 */
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mock.h"

/* ------------------------------------------------------------------- mode */

MOCK_API nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode,
                                           nvmlReturn_t *activationStatus)
{
    if (activationStatus == NULL ||
        (mode != NVML_DEVICE_MIG_ENABLE && mode != NVML_DEVICE_MIG_DISABLE))
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned current, pending;
    nvmlReturn_t r = nvmlDeviceGetMigMode(device, &current, &pending);
    if (r != NVML_SUCCESS)
        return r;
    r = mock_set_device(device, "mig_mode",
                        mode == NVML_DEVICE_MIG_ENABLE ? "enabled" : "disabled");
    if (r != NVML_SUCCESS)
        return r;
    r = nvmlDeviceGetMigMode(device, &current, &pending);
    if (r != NVML_SUCCESS)
        return r;
    if (current == mode) {
        *activationStatus = NVML_SUCCESS;
    } else {
        /* Pending: the board waits for a reset (Ampere), or a process
         * holds the GPU so the driver could not reset it itself. */
        struct mock_call c;
        int needs_reset = 0;
        if (mock_begin(&c, device, MOCK_GUARDED) == NVML_SUCCESS) {
            mock_dev_bool(c.cfg, c.pos, "mig.reset_for_mode", &needs_reset);
            mock_end(&c);
        }
        *activationStatus = needs_reset ? NVML_ERROR_RESET_REQUIRED : NVML_ERROR_IN_USE;
    }
    return NVML_SUCCESS;
}

/* ---------------------------------------------------------- profile table */

struct gi_profile {
    unsigned nvml_id, smi_id, slices, instances, multiprocessors, decoders, jpegs, ofas, size;
    unsigned long long memory_mib;
    char name[32];
    unsigned starts[8], nstarts;
};

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

/* The profile whose NVML id (`by_smi_id` 0) or nvidia-smi id (1) is `id`:
 * NOT_SUPPORTED when the board is not MIG capable or has no such profile. */
static nvmlReturn_t find_gi(nvmlDevice_t device, unsigned id, int by_smi_id,
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
    if (info == NULL || profile >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct gi_profile p;
    nvmlReturn_t r = find_gi(device, profile, 0, &p);
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
    if (info == NULL || profile >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct gi_profile p;
    nvmlReturn_t r = find_gi(device, profile, 0, &p);
    return r != NVML_SUCCESS ? r : fill_v(info, &p);
}

MOCK_API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoByIdV(nvmlDevice_t device,
                                                              unsigned int profileId,
                                                              nvmlGpuInstanceProfileInfo_v2_t *info)
{
    if (info == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct gi_profile p;
    nvmlReturn_t r = find_gi(device, profileId, 1, &p);
    return r == NVML_ERROR_NOT_SUPPORTED ? NVML_ERROR_INVALID_ARGUMENT
           : r != NVML_SUCCESS           ? r
                                         : fill_v(info, &p);
}

MOCK_API nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    nvmlDevice_t device, unsigned int profileId, nvmlGpuInstancePlacement_t *placements,
    unsigned int *count)
{
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct gi_profile p;
    nvmlReturn_t r = find_gi(device, profileId, 1, &p);
    if (r != NVML_SUCCESS)
        return r == NVML_ERROR_NOT_SUPPORTED ? NVML_ERROR_INVALID_ARGUMENT : r;
    unsigned room = mock_list_room(placements, count);
    for (unsigned i = 0; i < p.nstarts && i < room; i++) {
        placements[i].start = p.starts[i];
        placements[i].size = p.size;
    }
    return mock_list_result(placements, count, p.nstarts);
}

/* How many more of the profile fit beside the layout (gi_remaining). */
static unsigned gi_remaining(nvmlDevice_t device, const struct gi_profile *p);

MOCK_API nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device,
                                                               unsigned int profileId,
                                                               unsigned int *count)
{
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct gi_profile p;
    nvmlReturn_t r = find_gi(device, profileId, 1, &p);
    if (r != NVML_SUCCESS)
        return r == NVML_ERROR_NOT_SUPPORTED ? NVML_ERROR_INVALID_ARGUMENT : r;
    *count = gi_remaining(device, &p);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------ GPU instances */

/* The layout is node state (mokka/simulators/gpudriver/mig_layout.py):
 * `device.<n>.mig.instances.<i>.{id,profile,start}` and their
 * `compute.<j>.{id,slices,start}`.  A GPU instance's id follows from its
 * placement (0..13), a compute instance's is its start (0..6), so a
 * handle is a fixed slot per (GPU, id): stable for the process's life,
 * and checked against the layout on every use (a destroyed instance's
 * handle answers INVALID_ARGUMENT). */
#define MAX_GI 14
#define MAX_CI 8

struct nvmlGpuInstance_st {
    unsigned pos, id;
};
struct nvmlComputeInstance_st {
    unsigned pos, gi, id;
};
static struct nvmlGpuInstance_st gi_handles[MOCK_MAX_DEVICES][MAX_GI];
static struct nvmlComputeInstance_st ci_handles[MOCK_MAX_DEVICES][MAX_GI][MAX_CI];

struct ci_state {
    unsigned id, slices, start;
};
struct gi_state {
    unsigned id, profile, start, nci;
    struct ci_state ci[MAX_CI];
};
struct layout {
    unsigned ngi;
    struct gi_state gi[MAX_GI];
};

static void read_layout(const struct mock_config *cfg, unsigned pos, struct layout *out)
{
    char field[80];
    unsigned count = 0;
    memset(out, 0, sizeof *out);
    if (!mock_dev_uint(cfg, pos, "mig.instances.count", &count))
        return;
    for (unsigned i = 0; i < count && out->ngi < MAX_GI; i++) {
        struct gi_state *g = &out->gi[out->ngi];
#define LAYOUT_UINT(dest, ...) \
    (snprintf(field, sizeof field, __VA_ARGS__), mock_dev_uint(cfg, pos, field, dest))
        if (!LAYOUT_UINT(&g->id, "mig.instances.%u.id", i) ||
            !LAYOUT_UINT(&g->profile, "mig.instances.%u.profile", i) ||
            !LAYOUT_UINT(&g->start, "mig.instances.%u.start", i) || g->id >= MAX_GI)
            continue;
        unsigned nci = 0;
        LAYOUT_UINT(&nci, "mig.instances.%u.compute.count", i);
        for (unsigned j = 0; j < nci && g->nci < MAX_CI; j++) {
            struct ci_state *c = &g->ci[g->nci];
            if (LAYOUT_UINT(&c->id, "mig.instances.%u.compute.%u.id", i, j) &&
                LAYOUT_UINT(&c->slices, "mig.instances.%u.compute.%u.slices", i, j) &&
                LAYOUT_UINT(&c->start, "mig.instances.%u.compute.%u.start", i, j) &&
                c->id < MAX_CI)
                g->nci++;
        }
#undef LAYOUT_UINT
        out->ngi++;
    }
}

/* The device's layout and whether MIG mode is on (NOT_SUPPORTED if not). */
static nvmlReturn_t device_layout(nvmlDevice_t device, unsigned *pos, struct layout *out)
{
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    *pos = c.pos;
    if (!mock_dev_is(c.cfg, c.pos, "mig.mode_current", "enabled"))
        r = NVML_ERROR_NOT_SUPPORTED;
    else
        read_layout(c.cfg, c.pos, out);
    mock_end(&c);
    return r;
}

static struct gi_state *find_instance(struct layout *l, unsigned id)
{
    for (unsigned i = 0; i < l->ngi; i++)
        if (l->gi[i].id == id)
            return &l->gi[i];
    return NULL;
}

static nvmlGpuInstance_t gi_handle(unsigned pos, unsigned id)
{
    struct nvmlGpuInstance_st *h = &gi_handles[pos][id];
    h->pos = pos;
    h->id = id;
    return h;
}

static nvmlComputeInstance_t ci_handle(unsigned pos, unsigned gi, unsigned id)
{
    struct nvmlComputeInstance_st *h = &ci_handles[pos][gi][id];
    h->pos = pos;
    h->gi = gi;
    h->id = id;
    return h;
}

/* The GPU instance behind a handle, as the layout has it now. */
static nvmlReturn_t resolve_gi(nvmlGpuInstance_t handle, struct layout *l,
                               struct gi_state **gi, struct gi_profile *profile)
{
    uintptr_t base = (uintptr_t)gi_handles, p = (uintptr_t)handle;
    if (handle == NULL || p - base >= sizeof gi_handles ||
        (p - base) % sizeof(struct nvmlGpuInstance_st) != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned pos;
    nvmlReturn_t r = device_layout(mock_handle(handle->pos), &pos, l);
    if (r != NVML_SUCCESS)
        return r == NVML_ERROR_NOT_SUPPORTED ? NVML_ERROR_INVALID_ARGUMENT : r;
    *gi = find_instance(l, handle->id);
    if (*gi == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    r = find_gi(mock_handle(pos), (*gi)->profile, 1, profile);
    return r == NVML_SUCCESS ? r : NVML_ERROR_INVALID_ARGUMENT;
}

static int overlaps(unsigned a, unsigned a_size, unsigned b, unsigned b_size)
{
    return a < b + b_size && b < a + a_size;
}

/* Whether a GPU instance of `p` fits at `start` beside the layout's. */
static int gi_fits(nvmlDevice_t device, const struct layout *l, const struct gi_profile *p,
                   unsigned start)
{
    unsigned same = 0, slices = p->slices;
    for (unsigned i = 0; i < l->ngi; i++) {
        struct gi_profile q;
        if (find_gi(device, l->gi[i].profile, 1, &q) != NVML_SUCCESS)
            continue;
        same += q.smi_id == p->smi_id;
        slices += q.slices;
        if (overlaps(l->gi[i].start, q.size, start, p->size) ||
            (q.nvml_id == NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 &&
             p->nvml_id == NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1))
            return 0;
    }
    return same < p->instances && slices <= 7;
}

static unsigned gi_id_of(unsigned size, unsigned start)
{
    unsigned first = size == 8 ? 0 : size == 4 ? 1 : size == 2 ? 3 : 7;
    return first + start / size;
}

static nvmlReturn_t create_gi(nvmlDevice_t device, unsigned profileId, const unsigned *want,
                              nvmlGpuInstance_t *gpuInstance)
{
    if (gpuInstance == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct layout l;
    unsigned pos;
    nvmlReturn_t r = device_layout(device, &pos, &l);
    if (r != NVML_SUCCESS)
        return r;
    struct gi_profile p;
    r = find_gi(device, profileId, 1, &p);
    if (r != NVML_SUCCESS)
        return r == NVML_ERROR_NOT_SUPPORTED ? NVML_ERROR_INVALID_ARGUMENT : r;
    unsigned start = 0;
    int found = 0;
    for (unsigned i = 0; i < p.nstarts && !found; i++) {
        if ((want == NULL || p.starts[i] == *want) && gi_fits(device, &l, &p, p.starts[i])) {
            start = p.starts[i];
            found = 1;
        }
    }
    if (!found)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    char value[32];
    snprintf(value, sizeof value, "%u,%u", profileId, start);
    r = mock_set_device(device, "mig_gi_create", value);
    if (r == NVML_SUCCESS)
        *gpuInstance = gi_handle(pos, gi_id_of(p.size, start));
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int profileId,
                                                 nvmlGpuInstance_t *gpuInstance)
{
    return create_gi(device, profileId, NULL, gpuInstance);
}

MOCK_API nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(
    nvmlDevice_t device, unsigned int profileId, const nvmlGpuInstancePlacement_t *placement,
    nvmlGpuInstance_t *gpuInstance)
{
    if (placement == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct gi_profile p;
    nvmlReturn_t r = find_gi(device, profileId, 1, &p);
    if (r == NVML_SUCCESS && placement->size != p.size)
        return NVML_ERROR_INVALID_ARGUMENT;
    return create_gi(device, profileId, &placement->start, gpuInstance);
}

MOCK_API nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance)
{
    struct layout l;
    struct gi_state *gi;
    struct gi_profile p;
    nvmlReturn_t r = resolve_gi(gpuInstance, &l, &gi, &p);
    if (r != NVML_SUCCESS)
        return r;
    if (gi->nci > 0)
        return NVML_ERROR_IN_USE;
    char value[16];
    snprintf(value, sizeof value, "%u", gi->id);
    return mock_set_device(mock_handle(gpuInstance->pos), "mig_gi_destroy", value);
}

MOCK_API nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                               nvmlGpuInstance_t *gpuInstances,
                                               unsigned int *count)
{
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct layout l;
    unsigned pos;
    nvmlReturn_t r = device_layout(device, &pos, &l);
    if (r != NVML_SUCCESS)
        return r;
    struct gi_profile p;
    if (find_gi(device, profileId, 1, &p) != NVML_SUCCESS)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* NVML's contract: room for the profile's instanceCount handles. */
    unsigned n = 0;
    for (unsigned i = 0; i < l.ngi; i++) {
        if (l.gi[i].profile != profileId)
            continue;
        if (gpuInstances != NULL)
            gpuInstances[n] = gi_handle(pos, l.gi[i].id);
        n++;
    }
    *count = n;
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                                  nvmlGpuInstance_t *gpuInstance)
{
    if (gpuInstance == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct layout l;
    unsigned pos;
    nvmlReturn_t r = device_layout(device, &pos, &l);
    if (r != NVML_SUCCESS)
        return r;
    if (find_instance(&l, id) == NULL)
        return NVML_ERROR_NOT_FOUND;
    *gpuInstance = gi_handle(pos, id);
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance,
                                            nvmlGpuInstanceInfo_t *info)
{
    if (info == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct layout l;
    struct gi_state *gi;
    struct gi_profile p;
    nvmlReturn_t r = resolve_gi(gpuInstance, &l, &gi, &p);
    if (r != NVML_SUCCESS)
        return r;
    info->device = mock_handle(gpuInstance->pos);
    info->id = gi->id;
    info->profileId = gi->profile;
    info->placement.start = gi->start;
    info->placement.size = p.size;
    return NVML_SUCCESS;
}

/* Remaining capacity counts the layout: the table's count less what exists,
 * 0 when no placement is left. */
static unsigned gi_remaining(nvmlDevice_t device, const struct gi_profile *p)
{
    struct layout l;
    unsigned pos;
    if (device_layout(device, &pos, &l) != NVML_SUCCESS)
        return p->instances;
    unsigned free = 0;
    struct layout trial = l;
    /* Greedily place as many as fit, as the driver counts them. */
    for (unsigned i = 0; i < p->nstarts && trial.ngi < MAX_GI; i++) {
        if (gi_fits(device, &trial, p, p->starts[i])) {
            struct gi_state *g = &trial.gi[trial.ngi++];
            memset(g, 0, sizeof *g);
            g->profile = p->smi_id;
            g->start = p->starts[i];
            free++;
        }
    }
    return free;
}

/* --------------------------------------------------- compute instances */

/* NVML compute-instance profile ids by compute slices (nvml.h). */
static int ci_slices(unsigned profile, unsigned *slices)
{
    static const unsigned by_id[] = {1, 2, 3, 4, 7};
    if (profile >= MOCK_COUNT(by_id))
        return 0;
    *slices = by_id[profile];
    return 1;
}

static int ci_offered(const struct gi_profile *p, unsigned slices)
{
    if (slices > p->slices)
        return 0;
    return (slices != 3 && slices != 4 && slices != 7) || slices == p->slices || p->slices == 7;
}

static void ci_name(char *out, size_t size, const struct gi_profile *p, unsigned slices)
{
    if (slices == p->slices)
        snprintf(out, size, "MIG %s", p->name);
    else
        snprintf(out, size, "MIG %uc.%s", slices, p->name);
}

#define CI_FILL(info, p, profile, slices)                                       \
    do {                                                                        \
        (info)->id = (profile);                                                 \
        (info)->sliceCount = (slices);                                          \
        (info)->instanceCount = (p).slices / (slices);                          \
        (info)->multiprocessorCount = (p).multiprocessors * (slices) / (p).slices; \
        (info)->sharedCopyEngineCount = (p).slices;                             \
        (info)->sharedDecoderCount = (p).decoders;                              \
        (info)->sharedEncoderCount = 0;                                         \
        (info)->sharedJpegCount = (p).jpegs;                                    \
        (info)->sharedOfaCount = (p).ofas;                                      \
    } while (0)

static nvmlReturn_t ci_profile(nvmlGpuInstance_t gpuInstance, unsigned profile,
                               unsigned engProfile, struct gi_profile *p, unsigned *slices)
{
    if (profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT ||
        engProfile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct layout l;
    struct gi_state *gi;
    nvmlReturn_t r = resolve_gi(gpuInstance, &l, &gi, p);
    if (r != NVML_SUCCESS)
        return r;
    if (!ci_slices(profile, slices) || !ci_offered(p, *slices))
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(
    nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,
    nvmlComputeInstanceProfileInfo_t *info)
{
    if (info == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct gi_profile p;
    unsigned slices;
    nvmlReturn_t r = ci_profile(gpuInstance, profile, engProfile, &p, &slices);
    if (r == NVML_SUCCESS)
        CI_FILL(info, p, profile, slices);
    return r;
}

MOCK_API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,
    nvmlComputeInstanceProfileInfo_v2_t *info)
{
    if (info == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlComputeInstanceProfileInfo_v2 &&
        info->version != nvmlComputeInstanceProfileInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    struct gi_profile p;
    unsigned slices;
    nvmlReturn_t r = ci_profile(gpuInstance, profile, engProfile, &p, &slices);
    if (r == NVML_SUCCESS) {
        CI_FILL(info, p, profile, slices);
        ci_name(info->name, sizeof info->name, &p, slices);
    }
    return r;
}

/* The aligned starts of a `slices` compute instance that are free. */
static unsigned ci_free_starts(const struct gi_state *gi, const struct gi_profile *p,
                               unsigned slices, unsigned *starts, int only_free)
{
    unsigned n = 0;
    for (unsigned s = 0; s + slices <= p->slices; s += slices) {
        int taken = 0;
        for (unsigned j = 0; j < gi->nci && only_free; j++)
            taken |= overlaps(gi->ci[j].start, gi->ci[j].slices, s, slices);
        if (!taken)
            starts[n++] = s;
    }
    return n;
}

MOCK_API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
    nvmlGpuInstance_t gpuInstance, unsigned int profileId, unsigned int *count)
{
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct layout l;
    struct gi_state *gi;
    struct gi_profile p;
    unsigned slices, starts[MAX_CI];
    nvmlReturn_t r = resolve_gi(gpuInstance, &l, &gi, &p);
    if (r != NVML_SUCCESS)
        return r;
    if (!ci_slices(profileId, &slices) || !ci_offered(&p, slices))
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = ci_free_starts(gi, &p, slices, starts, 1);
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlGpuInstanceGetComputeInstancePossiblePlacements(
    nvmlGpuInstance_t gpuInstance, unsigned int profileId,
    nvmlComputeInstancePlacement_t *placements, unsigned int *count)
{
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct layout l;
    struct gi_state *gi;
    struct gi_profile p;
    unsigned slices, starts[MAX_CI];
    nvmlReturn_t r = resolve_gi(gpuInstance, &l, &gi, &p);
    if (r != NVML_SUCCESS)
        return r;
    if (!ci_slices(profileId, &slices) || !ci_offered(&p, slices))
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = ci_free_starts(gi, &p, slices, starts, 0);
    unsigned room = mock_list_room(placements, count);
    for (unsigned i = 0; i < n && i < room; i++) {
        placements[i].start = starts[i];
        placements[i].size = slices;
    }
    return mock_list_result(placements, count, n);
}

static nvmlReturn_t create_ci(nvmlGpuInstance_t gpuInstance, unsigned profileId,
                              const unsigned *want, nvmlComputeInstance_t *computeInstance)
{
    if (computeInstance == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct layout l;
    struct gi_state *gi;
    struct gi_profile p;
    unsigned slices, starts[MAX_CI];
    nvmlReturn_t r = resolve_gi(gpuInstance, &l, &gi, &p);
    if (r != NVML_SUCCESS)
        return r;
    if (!ci_slices(profileId, &slices) || !ci_offered(&p, slices))
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = ci_free_starts(gi, &p, slices, starts, 1), start = 0;
    int found = 0;
    for (unsigned i = 0; i < n && !found; i++) {
        if (want == NULL || starts[i] == *want) {
            start = starts[i];
            found = 1;
        }
    }
    if (!found)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    char value[32];
    snprintf(value, sizeof value, "%u,%u,%u", gi->id, slices, start);
    r = mock_set_device(mock_handle(gpuInstance->pos), "mig_ci_create", value);
    if (r == NVML_SUCCESS)
        *computeInstance = ci_handle(gpuInstance->pos, gi->id, start);
    return r;
}

MOCK_API nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gpuInstance,
                                                          unsigned int profileId,
                                                          nvmlComputeInstance_t *computeInstance)
{
    return create_ci(gpuInstance, profileId, NULL, computeInstance);
}

MOCK_API nvmlReturn_t nvmlGpuInstanceCreateComputeInstanceWithPlacement(
    nvmlGpuInstance_t gpuInstance, unsigned int profileId,
    const nvmlComputeInstancePlacement_t *placement, nvmlComputeInstance_t *computeInstance)
{
    unsigned slices;
    if (placement == NULL || !ci_slices(profileId, &slices) || placement->size != slices)
        return NVML_ERROR_INVALID_ARGUMENT;
    return create_ci(gpuInstance, profileId, &placement->start, computeInstance);
}

MOCK_API nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance,
                                                        unsigned int profileId,
                                                        nvmlComputeInstance_t *computeInstances,
                                                        unsigned int *count)
{
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct layout l;
    struct gi_state *gi;
    struct gi_profile p;
    unsigned slices;
    nvmlReturn_t r = resolve_gi(gpuInstance, &l, &gi, &p);
    if (r != NVML_SUCCESS)
        return r;
    if (!ci_slices(profileId, &slices))
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = 0;
    for (unsigned j = 0; j < gi->nci; j++) {
        if (gi->ci[j].slices != slices)
            continue;
        if (computeInstances != NULL)
            computeInstances[n] = ci_handle(gpuInstance->pos, gi->id, gi->ci[j].id);
        n++;
    }
    *count = n;
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance,
                                                           unsigned int id,
                                                           nvmlComputeInstance_t *computeInstance)
{
    if (computeInstance == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct layout l;
    struct gi_state *gi;
    struct gi_profile p;
    nvmlReturn_t r = resolve_gi(gpuInstance, &l, &gi, &p);
    if (r != NVML_SUCCESS)
        return r;
    for (unsigned j = 0; j < gi->nci; j++) {
        if (gi->ci[j].id == id) {
            *computeInstance = ci_handle(gpuInstance->pos, gi->id, id);
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* The compute instance behind a handle, as the layout has it now. */
static nvmlReturn_t resolve_ci(nvmlComputeInstance_t handle, struct layout *l,
                               struct gi_state **gi, struct gi_profile *p,
                               struct ci_state **ci)
{
    uintptr_t base = (uintptr_t)ci_handles, addr = (uintptr_t)handle;
    if (handle == NULL || addr - base >= sizeof ci_handles ||
        (addr - base) % sizeof(struct nvmlComputeInstance_st) != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = resolve_gi(gi_handle(handle->pos, handle->gi), l, gi, p);
    if (r != NVML_SUCCESS)
        return r;
    for (unsigned j = 0; j < (*gi)->nci; j++) {
        if ((*gi)->ci[j].id == handle->id) {
            *ci = &(*gi)->ci[j];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

MOCK_API nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance)
{
    struct layout l;
    struct gi_state *gi;
    struct gi_profile p;
    struct ci_state *ci;
    nvmlReturn_t r = resolve_ci(computeInstance, &l, &gi, &p, &ci);
    if (r != NVML_SUCCESS)
        return r;
    char value[32];
    snprintf(value, sizeof value, "%u,%u", gi->id, ci->id);
    return mock_set_device(mock_handle(computeInstance->pos), "mig_ci_destroy", value);
}

static nvmlReturn_t ci_info(nvmlComputeInstance_t computeInstance, nvmlComputeInstanceInfo_t *info)
{
    if (info == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct layout l;
    struct gi_state *gi;
    struct gi_profile p;
    struct ci_state *ci;
    nvmlReturn_t r = resolve_ci(computeInstance, &l, &gi, &p, &ci);
    if (r != NVML_SUCCESS)
        return r;
    static const unsigned ids[] = {[1] = 0, [2] = 1, [3] = 2, [4] = 3, [7] = 4};
    info->device = mock_handle(computeInstance->pos);
    info->gpuInstance = gi_handle(computeInstance->pos, gi->id);
    info->id = ci->id;
    info->profileId = ci->slices < MOCK_COUNT(ids) ? ids[ci->slices] : 0;
    info->placement.start = ci->start;
    info->placement.size = ci->slices;
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance,
                                                   nvmlComputeInstanceInfo_t *info)
{
    return ci_info(computeInstance, info);
}

MOCK_API nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t computeInstance,
                                                nvmlComputeInstanceInfo_t *info)
{
    return ci_info(computeInstance, info);
}

/* -------------------------------------------------------- MIG devices */

/* A MIG device is a compute instance as a device: a handle of its own
 * table (so the full-GPU getters never mistake it for a GPU), found by
 * index over the layout's GPU instances and their compute instances. */
static struct nvmlDevice_st mig_devices[MOCK_MAX_DEVICES][MAX_GI][MAX_CI];

int mock_mig_device(nvmlDevice_t device, unsigned *pos, unsigned *gi, unsigned *ci)
{
    uintptr_t base = (uintptr_t)mig_devices, p = (uintptr_t)device;
    if (p - base >= sizeof mig_devices)
        return 0;
    unsigned slot = (unsigned)(p - base) / sizeof(struct nvmlDevice_st);
    *ci = slot % MAX_CI;
    *gi = slot / MAX_CI % MAX_GI;
    *pos = slot / MAX_CI / MAX_GI;
    return 1;
}

/* The MIG device's GPU instance, profile and compute instance now. */
static nvmlReturn_t resolve_mig(nvmlDevice_t device, unsigned *pos, struct layout *l,
                                struct gi_state **gi, struct gi_profile *p, struct ci_state **ci)
{
    unsigned gi_id, ci_id;
    if (!mock_mig_device(device, pos, &gi_id, &ci_id))
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlComputeInstance_t handle = ci_handle(*pos, gi_id, ci_id);
    return resolve_ci(handle, l, gi, p, ci);
}

MOCK_API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                          nvmlDevice_t *migDevice)
{
    if (migDevice == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct layout l;
    unsigned pos;
    nvmlReturn_t r = device_layout(device, &pos, &l);
    /* MIG off: no MIG devices, NOT_FOUND is what consumers iterate until. */
    if (r == NVML_ERROR_NOT_SUPPORTED)
        return NVML_ERROR_NOT_FOUND;
    if (r != NVML_SUCCESS)
        return r;
    unsigned n = 0;
    for (unsigned i = 0; i < l.ngi; i++) {
        for (unsigned j = 0; j < l.gi[i].nci; j++, n++) {
            if (n == index) {
                *migDevice = &mig_devices[pos][l.gi[i].id][l.gi[i].ci[j].id];
                return NVML_SUCCESS;
            }
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

MOCK_API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    unsigned pos, gi, ci;
    if (isMigDevice != NULL && mock_mig_device(device, &pos, &gi, &ci)) {
        *isMigDevice = 1;
        return NVML_SUCCESS;
    }
    return mock_constant_uint(device, MOCK_IDENTITY, 0, isMigDevice);
}

MOCK_API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                                  nvmlDevice_t *device)
{
    unsigned pos, gi, ci;
    if (device == NULL || !mock_mig_device(migDevice, &pos, &gi, &ci))
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = mock_handle(pos);
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    struct layout l;
    struct gi_state *gi;
    struct gi_profile p;
    struct ci_state *ci;
    unsigned pos;
    if (id == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (mock_handle_pos(device, &pos))
        return NVML_ERROR_NOT_SUPPORTED; /* a full GPU */
    nvmlReturn_t r = resolve_mig(device, &pos, &l, &gi, &p, &ci);
    if (r == NVML_SUCCESS)
        *id = gi->id;
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    struct layout l;
    struct gi_state *gi;
    struct gi_profile p;
    struct ci_state *ci;
    unsigned pos;
    if (id == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (mock_handle_pos(device, &pos))
        return NVML_ERROR_NOT_SUPPORTED;
    nvmlReturn_t r = resolve_mig(device, &pos, &l, &gi, &p, &ci);
    if (r == NVML_SUCCESS)
        *id = ci->id;
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device,
                                                nvmlDeviceAttributes_t *attributes)
{
    struct layout l;
    struct gi_state *gi;
    struct gi_profile p;
    struct ci_state *ci;
    unsigned pos;
    if (attributes == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (mock_handle_pos(device, &pos))
        return NVML_ERROR_NOT_SUPPORTED; /* only MIG devices are described */
    nvmlReturn_t r = resolve_mig(device, &pos, &l, &gi, &p, &ci);
    if (r != NVML_SUCCESS)
        return r;
    attributes->multiprocessorCount = p.multiprocessors * ci->slices / p.slices;
    attributes->sharedCopyEngineCount = p.slices;
    attributes->sharedDecoderCount = p.decoders;
    attributes->sharedEncoderCount = 0;
    attributes->sharedJpegCount = p.jpegs;
    attributes->sharedOfaCount = p.ofas;
    attributes->gpuInstanceSliceCount = p.slices;
    attributes->computeInstanceSliceCount = ci->slices;
    attributes->memorySizeMB = p.memory_mib;
    return NVML_SUCCESS;
}

/* FNV-1a over the parent's UUID and the instance ids, then mixed. */
static unsigned long long mig_hash(const char *parent, unsigned gi, unsigned ci,
                                   unsigned long long seed)
{
    unsigned long long h = 1469598103934665603ULL ^ seed;
    for (const char *s = parent; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    h = (h ^ gi) * 1099511628211ULL;
    h = (h ^ ci) * 1099511628211ULL;
    /* splitmix64's finaliser: nearby inputs give unrelated-looking UUIDs */
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
    return h ^ (h >> 31);
}

int mock_mig_uuid(nvmlDevice_t device, char *uuid, unsigned int length, nvmlReturn_t *r)
{
    unsigned pos, gi_id, ci_id;
    if (!mock_mig_device(device, &pos, &gi_id, &ci_id))
        return 0;
    struct layout l;
    struct gi_state *gi;
    struct gi_profile p;
    struct ci_state *ci;
    *r = resolve_mig(device, &pos, &l, &gi, &p, &ci);
    if (*r != NVML_SUCCESS)
        return 1;
    if (uuid == NULL) {
        *r = NVML_ERROR_INVALID_ARGUMENT;
        return 1;
    }
    char parent[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    *r = nvmlDeviceGetUUID(mock_handle(pos), parent, sizeof parent);
    if (*r != NVML_SUCCESS)
        return 1;
    /* Stable: the same parent and placement give the same UUID, so a
     * layout re-created the same way names the same MIG devices. */
    unsigned long long a = mig_hash(parent, gi->id, ci->id, 0);
    unsigned long long b = mig_hash(parent, gi->id, ci->id, 0x9e3779b97f4a7c15ULL);
    char text[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    snprintf(text, sizeof text, "MIG-%08llx-%04llx-%04llx-%04llx-%012llx", a >> 32,
             (a >> 16) & 0xffff, (a & 0x0fff) | 0x4000, ((b >> 48) & 0x3fff) | 0x8000,
             b & 0xffffffffffffULL);
    if (strlen(text) >= length)
        *r = NVML_ERROR_INSUFFICIENT_SIZE;
    else
        strcpy(uuid, text);
    return 1;
}

int mock_mig_name(nvmlDevice_t device, char *name, unsigned int length, nvmlReturn_t *r)
{
    unsigned pos, gi_id, ci_id;
    if (!mock_mig_device(device, &pos, &gi_id, &ci_id))
        return 0;
    struct layout l;
    struct gi_state *gi;
    struct gi_profile p;
    struct ci_state *ci;
    *r = resolve_mig(device, &pos, &l, &gi, &p, &ci);
    if (*r != NVML_SUCCESS)
        return 1;
    char parent[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    *r = nvmlDeviceGetName(mock_handle(pos), parent, sizeof parent);
    if (*r != NVML_SUCCESS)
        return 1;
    char text[NVML_DEVICE_NAME_V2_BUFFER_SIZE + 48];
    snprintf(text, sizeof text, "%s MIG %s", parent, p.name);
    if (name == NULL || strlen(text) >= length)
        *r = name == NULL ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_INSUFFICIENT_SIZE;
    else
        strcpy(name, text);
    return 1;
}
