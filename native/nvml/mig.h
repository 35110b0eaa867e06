/*
 * What the MIG files share (docs/mig.md).
 *
 * MIG is spread over five files, each with one job:
 *
 *   mig.c                    the mode setter, and the layout of GPU and
 *                            compute instances as node state has it: read
 *                            from the engine config, the instance handles
 *                            and what a handle stands for now
 *   mig_profiles.c           the board's GPU-instance profile table and its
 *                            getters (profile info, possible placements)
 *   mig_gpu_instances.c      GPU instances: create, destroy, list, info and
 *                            remaining capacity
 *   mig_compute_instances.c  compute instances: their profiles, create,
 *                            destroy, list, info and remaining capacity
 *   mig_devices.c            MIG device handles: by index, ids, attributes,
 *                            UUID and name
 *
 * This header is theirs alone (mock.h is the library's): the profile and
 * layout structs they pass between them and the lookups more than one of
 * them needs.
 */
#ifndef MOCK_NVML_MIG_H
#define MOCK_NVML_MIG_H

#include "mock.h"

/* ------------------------------------------------------ mig_profiles.c */

/* One entry of the board's table, `device.<n>.mig.gi.<k>.*`. */
struct gi_profile {
    unsigned nvml_id, smi_id, slices, instances, multiprocessors, decoders, jpegs, ofas, size;
    unsigned long long memory_mib;
    char name[32];
    unsigned starts[8], nstarts;
};

/* The profile whose NVML id (`by_smi_id` 0) or nvidia-smi id (1) is `id`:
 * NOT_SUPPORTED when the board is not MIG capable or has no such profile. */
nvmlReturn_t mock_mig_profile(nvmlDevice_t device, unsigned id, int by_smi_id,
                              struct gi_profile *out);

/* The same by nvidia-smi id for a call that names the profile and answers
 * to `out`: a NULL `out` or a profile the board lacks is the caller's
 * INVALID_ARGUMENT. */
static inline nvmlReturn_t mock_mig_profile_arg(nvmlDevice_t device, unsigned id,
                                                const void *out, struct gi_profile *p)
{
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = mock_mig_profile(device, id, 1, p);
    return r == NVML_ERROR_NOT_SUPPORTED ? NVML_ERROR_INVALID_ARGUMENT : r;
}

/* --------------------------------------------------------------- mig.c */

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

/* cap_minor: the minor of the instance's /dev/nvidia-caps node, as the
 * daemon renders it (`mig.caps.gi<I>[.ci<C>].access`, mig_caps.py's
 * numbering); 0 when the config names none. */
struct ci_state {
    unsigned id, slices, start, cap_minor;
};
struct gi_state {
    unsigned id, profile, start, nci, cap_minor;
    struct ci_state ci[MAX_CI];
};
struct layout {
    unsigned ngi;
    struct gi_state gi[MAX_GI];
};

/* What a GPU or compute instance handle stands for now: the layout, the
 * GPU instance in it and its profile, and (mock_mig_resolve_ci) the
 * compute instance.  gi and ci point into l. */
struct mig_view {
    struct layout l;
    struct gi_state *gi;
    struct gi_profile p;
    struct ci_state *ci;
};

/* The device's layout and whether MIG mode is on (NOT_SUPPORTED if not). */
nvmlReturn_t mock_mig_layout(nvmlDevice_t device, unsigned *pos, struct layout *out);
/* The layout's GPU instance `id`; NULL when there is none. */
struct gi_state *mock_mig_instance(struct layout *l, unsigned id);
/* The handle of a GPU instance and of a compute instance. */
nvmlGpuInstance_t mock_mig_gi_handle(unsigned pos, unsigned id);
nvmlComputeInstance_t mock_mig_ci_handle(unsigned pos, unsigned gi, unsigned id);
/* The GPU instance behind a handle, as the layout has it now (v's l, gi
 * and p); INVALID_ARGUMENT when it is no such handle or names no instance. */
nvmlReturn_t mock_mig_resolve_gi(nvmlGpuInstance_t handle, struct mig_view *v);
/* The same for a compute instance handle, and v->ci. */
nvmlReturn_t mock_mig_resolve_ci(nvmlComputeInstance_t handle, struct mig_view *v);

/* The same for a getter whose answer goes to `out`: NULL is INVALID_ARGUMENT. */
static inline nvmlReturn_t mock_mig_gi_for(nvmlGpuInstance_t handle, const void *out,
                                           struct mig_view *v)
{
    return out == NULL ? NVML_ERROR_INVALID_ARGUMENT : mock_mig_resolve_gi(handle, v);
}

static inline nvmlReturn_t mock_mig_ci_for(nvmlComputeInstance_t handle, const void *out,
                                           struct mig_view *v)
{
    return out == NULL ? NVML_ERROR_INVALID_ARGUMENT : mock_mig_resolve_ci(handle, v);
}

/* ----------------------------------------------------------- devices.c */

/* Whether the device node `name` (relative to /dev, or to
 * MOCK_NVML_DEV_DIR) exists for this process: what decides which GPUs and
 * MIG devices it may see. */
int mock_dev_node_present(const char *name);

/* Whether the ranges [a, a + a_size) and [b, b + b_size) meet. */
static inline int mock_mig_overlaps(unsigned a, unsigned a_size, unsigned b, unsigned b_size)
{
    return a < b + b_size && b < a + a_size;
}

#endif
