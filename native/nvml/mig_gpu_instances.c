/*
 * MIG: GPU instances (docs/mig.md): create, destroy, list, info and the
 * remaining capacity of a profile.
 *
 * A create or destroy is a setter: the daemon checks it against the
 * board's table and records the new layout (mig.c reads it back).  The
 * library picks the placement (the first free one, as the driver does)
 * so it knows the new instance's id without another round trip.
 */
#include <stdio.h>
#include <string.h>

#include "mig.h"

/* Whether a GPU instance of `p` fits at `start` beside the layout's. */
static int gi_fits(nvmlDevice_t device, const struct layout *l, const struct gi_profile *p,
                   unsigned start)
{
    unsigned same = 0, slices = p->slices;
    for (unsigned i = 0; i < l->ngi; i++) {
        struct gi_profile q;
        if (mock_mig_profile(device, l->gi[i].profile, 1, &q) != NVML_SUCCESS)
            continue;
        same += q.smi_id == p->smi_id;
        slices += q.slices;
        if (mock_mig_overlaps(l->gi[i].start, q.size, start, p->size) ||
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

/* The layout for a call whose answer goes to `out` (NULL: INVALID_ARGUMENT). */
static nvmlReturn_t layout_for(nvmlDevice_t device, const void *out, unsigned *pos,
                               struct layout *l)
{
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return mock_mig_layout(device, pos, l);
}

/* ----------------------------------------------------- create and destroy */

static nvmlReturn_t create_gi(nvmlDevice_t device, unsigned profileId, const unsigned *want,
                              nvmlGpuInstance_t *gpuInstance)
{
    struct layout l;
    unsigned pos;
    nvmlReturn_t r = layout_for(device, gpuInstance, &pos, &l);
    if (r != NVML_SUCCESS)
        return r;
    struct gi_profile p;
    r = mock_mig_profile_arg(device, profileId, gpuInstance, &p);
    if (r != NVML_SUCCESS)
        return r;
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
        *gpuInstance = mock_mig_gi_handle(pos, gi_id_of(p.size, start));
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
    nvmlReturn_t r = mock_mig_profile(device, profileId, 1, &p);
    if (r == NVML_SUCCESS && placement->size != p.size)
        return NVML_ERROR_INVALID_ARGUMENT;
    return create_gi(device, profileId, &placement->start, gpuInstance);
}

MOCK_API nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance)
{
    struct mig_view v;
    nvmlReturn_t r = mock_mig_resolve_gi(gpuInstance, &v);
    if (r != NVML_SUCCESS)
        return r;
    if (v.gi->nci > 0)
        return NVML_ERROR_IN_USE;
    char value[16];
    snprintf(value, sizeof value, "%u", v.gi->id);
    return mock_set_device(mock_handle(gpuInstance->pos), "mig_gi_destroy", value);
}

/* ------------------------------------------------------------ the getters */

MOCK_API nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                               nvmlGpuInstance_t *gpuInstances,
                                               unsigned int *count)
{
    struct layout l;
    unsigned pos;
    nvmlReturn_t r = layout_for(device, count, &pos, &l);
    if (r != NVML_SUCCESS)
        return r;
    struct gi_profile p;
    if (mock_mig_profile(device, profileId, 1, &p) != NVML_SUCCESS)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* NVML's contract: room for the profile's instanceCount handles. */
    unsigned n = 0;
    for (unsigned i = 0; i < l.ngi; i++) {
        if (l.gi[i].profile != profileId)
            continue;
        if (gpuInstances != NULL)
            gpuInstances[n] = mock_mig_gi_handle(pos, l.gi[i].id);
        n++;
    }
    *count = n;
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                                  nvmlGpuInstance_t *gpuInstance)
{
    struct layout l;
    unsigned pos;
    nvmlReturn_t r = layout_for(device, gpuInstance, &pos, &l);
    if (r != NVML_SUCCESS)
        return r;
    if (mock_mig_instance(&l, id) == NULL)
        return NVML_ERROR_NOT_FOUND;
    *gpuInstance = mock_mig_gi_handle(pos, id);
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance,
                                            nvmlGpuInstanceInfo_t *info)
{
    struct mig_view v;
    nvmlReturn_t r = mock_mig_gi_for(gpuInstance, info, &v);
    if (r != NVML_SUCCESS)
        return r;
    info->device = mock_handle(gpuInstance->pos);
    info->id = v.gi->id;
    info->profileId = v.gi->profile;
    info->placement.start = v.gi->start;
    info->placement.size = v.p.size;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------ remaining capacity */

/* Remaining capacity counts the layout: the table's count less what exists,
 * 0 when no placement is left. */
static unsigned gi_remaining(nvmlDevice_t device, const struct gi_profile *p)
{
    struct layout l;
    unsigned pos;
    if (mock_mig_layout(device, &pos, &l) != NVML_SUCCESS)
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

MOCK_API nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device,
                                                               unsigned int profileId,
                                                               unsigned int *count)
{
    struct gi_profile p;
    nvmlReturn_t r = mock_mig_profile_arg(device, profileId, count, &p);
    if (r != NVML_SUCCESS)
        return r;
    *count = gi_remaining(device, &p);
    return NVML_SUCCESS;
}
