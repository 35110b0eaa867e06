/*
 * MIG: compute instances (docs/mig.md): the compute-instance profiles a
 * GPU instance offers, create, destroy, list, info, placements and the
 * remaining capacity.
 *
 * A compute instance's profile follows from its GPU instance's (its
 * slices, shared engines and memory); its id is its start.  A create or
 * destroy is a setter, as for GPU instances (mig_gpu_instances.c).
 */
#include <stdio.h>
#include <string.h>

#include "mig.h"

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

/* The GPU instance behind a handle (v) and the slices of the compute
 * instance profile `profile`; `refused` when the GPU instance does not
 * offer that profile. */
static nvmlReturn_t ci_offer(nvmlGpuInstance_t gpuInstance, unsigned profile,
                             nvmlReturn_t refused, struct mig_view *v, unsigned *slices)
{
    nvmlReturn_t r = mock_mig_resolve_gi(gpuInstance, v);
    if (r != NVML_SUCCESS)
        return r;
    if (!ci_slices(profile, slices) || !ci_offered(&v->p, *slices))
        return refused;
    return NVML_SUCCESS;
}

/* The aligned starts of a `slices` compute instance that are free. */
static unsigned ci_free_starts(const struct gi_state *gi, const struct gi_profile *p,
                               unsigned slices, unsigned *starts, int only_free)
{
    unsigned n = 0;
    for (unsigned s = 0; s + slices <= p->slices; s += slices) {
        int taken = 0;
        for (unsigned j = 0; j < gi->nci && only_free; j++)
            taken |= mock_mig_overlaps(gi->ci[j].start, gi->ci[j].slices, s, slices);
        if (!taken)
            starts[n++] = s;
    }
    return n;
}

/* What the calls that place a compute instance of profile `profile` share:
 * the GPU instance (v), the profile's slices and its aligned starts (*n of
 * them in starts, the free ones only when `only_free`), for a call whose
 * answer goes to `out` (NULL: INVALID_ARGUMENT, as is a profile the GPU
 * instance does not offer). */
static nvmlReturn_t ci_starts(nvmlGpuInstance_t gpuInstance, unsigned profile, const void *out,
                              int only_free, struct mig_view *v, unsigned *slices,
                              unsigned starts[MAX_CI], unsigned *n)
{
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = ci_offer(gpuInstance, profile, NVML_ERROR_INVALID_ARGUMENT, v, slices);
    if (r == NVML_SUCCESS)
        *n = ci_free_starts(v->gi, &v->p, *slices, starts, only_free);
    return r;
}

/* --------------------------------------------------------- profile info */

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
                               unsigned engProfile, struct mig_view *v, unsigned *slices)
{
    if (profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT ||
        engProfile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        return NVML_ERROR_INVALID_ARGUMENT;
    return ci_offer(gpuInstance, profile, NVML_ERROR_NOT_SUPPORTED, v, slices);
}

MOCK_API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(
    nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,
    nvmlComputeInstanceProfileInfo_t *info)
{
    if (info == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mig_view v;
    unsigned slices;
    nvmlReturn_t r = ci_profile(gpuInstance, profile, engProfile, &v, &slices);
    if (r == NVML_SUCCESS)
        CI_FILL(info, v.p, profile, slices);
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
    struct mig_view v;
    unsigned slices;
    nvmlReturn_t r = ci_profile(gpuInstance, profile, engProfile, &v, &slices);
    if (r == NVML_SUCCESS) {
        CI_FILL(info, v.p, profile, slices);
        ci_name(info->name, sizeof info->name, &v.p, slices);
    }
    return r;
}

/* ------------------------------------------------ capacity and placements */

MOCK_API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
    nvmlGpuInstance_t gpuInstance, unsigned int profileId, unsigned int *count)
{
    struct mig_view v;
    unsigned slices, starts[MAX_CI], n;
    nvmlReturn_t r = ci_starts(gpuInstance, profileId, count, 1, &v, &slices, starts, &n);
    if (r == NVML_SUCCESS)
        *count = n;
    return r;
}

MOCK_API nvmlReturn_t nvmlGpuInstanceGetComputeInstancePossiblePlacements(
    nvmlGpuInstance_t gpuInstance, unsigned int profileId,
    nvmlComputeInstancePlacement_t *placements, unsigned int *count)
{
    struct mig_view v;
    unsigned slices, starts[MAX_CI], n;
    nvmlReturn_t r = ci_starts(gpuInstance, profileId, count, 0, &v, &slices, starts, &n);
    if (r != NVML_SUCCESS)
        return r;
    unsigned room = mock_list_room(placements, count);
    for (unsigned i = 0; i < n && i < room; i++) {
        placements[i].start = starts[i];
        placements[i].size = slices;
    }
    return mock_list_result(placements, count, n);
}

/* ----------------------------------------------------- create and destroy */

static nvmlReturn_t create_ci(nvmlGpuInstance_t gpuInstance, unsigned profileId,
                              const unsigned *want, nvmlComputeInstance_t *computeInstance)
{
    struct mig_view v;
    unsigned slices, starts[MAX_CI], n, start = 0;
    nvmlReturn_t r = ci_starts(gpuInstance, profileId, computeInstance, 1, &v, &slices, starts, &n);
    if (r != NVML_SUCCESS)
        return r;
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
    snprintf(value, sizeof value, "%u,%u,%u", v.gi->id, slices, start);
    r = mock_set_device(mock_handle(gpuInstance->pos), "mig_ci_create", value);
    if (r == NVML_SUCCESS)
        *computeInstance = mock_mig_ci_handle(gpuInstance->pos, v.gi->id, start);
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

MOCK_API nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance)
{
    struct mig_view v;
    nvmlReturn_t r = mock_mig_resolve_ci(computeInstance, &v);
    if (r != NVML_SUCCESS)
        return r;
    char value[32];
    snprintf(value, sizeof value, "%u,%u", v.gi->id, v.ci->id);
    return mock_set_device(mock_handle(computeInstance->pos), "mig_ci_destroy", value);
}

/* ------------------------------------------------------------ the getters */

MOCK_API nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance,
                                                        unsigned int profileId,
                                                        nvmlComputeInstance_t *computeInstances,
                                                        unsigned int *count)
{
    struct mig_view v;
    unsigned slices;
    nvmlReturn_t r = mock_mig_gi_for(gpuInstance, count, &v);
    if (r != NVML_SUCCESS)
        return r;
    if (!ci_slices(profileId, &slices))
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = 0;
    for (unsigned j = 0; j < v.gi->nci; j++) {
        if (v.gi->ci[j].slices != slices)
            continue;
        if (computeInstances != NULL)
            computeInstances[n] = mock_mig_ci_handle(gpuInstance->pos, v.gi->id, v.gi->ci[j].id);
        n++;
    }
    *count = n;
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance,
                                                           unsigned int id,
                                                           nvmlComputeInstance_t *computeInstance)
{
    struct mig_view v;
    nvmlReturn_t r = mock_mig_gi_for(gpuInstance, computeInstance, &v);
    if (r != NVML_SUCCESS)
        return r;
    for (unsigned j = 0; j < v.gi->nci; j++) {
        if (v.gi->ci[j].id == id) {
            *computeInstance = mock_mig_ci_handle(gpuInstance->pos, v.gi->id, id);
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

static nvmlReturn_t ci_info(nvmlComputeInstance_t computeInstance, nvmlComputeInstanceInfo_t *info)
{
    struct mig_view v;
    nvmlReturn_t r = mock_mig_ci_for(computeInstance, info, &v);
    if (r != NVML_SUCCESS)
        return r;
    static const unsigned ids[] = {[1] = 0, [2] = 1, [3] = 2, [4] = 3, [7] = 4};
    info->device = mock_handle(computeInstance->pos);
    info->gpuInstance = mock_mig_gi_handle(computeInstance->pos, v.gi->id);
    info->id = v.ci->id;
    info->profileId = v.ci->slices < MOCK_COUNT(ids) ? ids[v.ci->slices] : 0;
    info->placement.start = v.ci->start;
    info->placement.size = v.ci->slices;
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
