/*
 * MIG: the mode setter and the layout of GPU and compute instances
 * (docs/mig.md); the other MIG files are listed in mig.h.
 *
 * The mode is node state like the other setters (setters.c): the daemon
 * decides whether the change is in force at once or pending until a
 * reset, and the activation status here reads the answer back.  The
 * layout of GPU and compute instances is node state too: a create or
 * destroy is a setter (the daemon checks it against the table and records
 * it), and the getters read the layout back from the engine config, here.
 * The instance handles are fixed slots of this file's tables, checked
 * against the layout on every use.
 */
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include "mig.h"

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

/* ----------------------------------------------------------------- layout */

static struct nvmlGpuInstance_st gi_handles[MOCK_MAX_DEVICES][MAX_GI];
static struct nvmlComputeInstance_st ci_handles[MOCK_MAX_DEVICES][MAX_GI][MAX_CI];

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
        LAYOUT_UINT(&g->cap_minor, "mig.caps.gi%u.access", g->id);
        for (unsigned j = 0; j < nci && g->nci < MAX_CI; j++) {
            struct ci_state *c = &g->ci[g->nci];
            c->cap_minor = 0;
            if (LAYOUT_UINT(&c->id, "mig.instances.%u.compute.%u.id", i, j) &&
                LAYOUT_UINT(&c->slices, "mig.instances.%u.compute.%u.slices", i, j) &&
                LAYOUT_UINT(&c->start, "mig.instances.%u.compute.%u.start", i, j) &&
                c->id < MAX_CI) {
                LAYOUT_UINT(&c->cap_minor, "mig.caps.gi%u.ci%u.access", g->id, c->id);
                g->nci++;
            }
        }
#undef LAYOUT_UINT
        out->ngi++;
    }
}

nvmlReturn_t mock_mig_layout(nvmlDevice_t device, unsigned *pos, struct layout *out)
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

struct gi_state *mock_mig_instance(struct layout *l, unsigned id)
{
    for (unsigned i = 0; i < l->ngi; i++)
        if (l->gi[i].id == id)
            return &l->gi[i];
    return NULL;
}

/* ---------------------------------------------------------------- handles */

nvmlGpuInstance_t mock_mig_gi_handle(unsigned pos, unsigned id)
{
    struct nvmlGpuInstance_st *h = &gi_handles[pos][id];
    h->pos = pos;
    h->id = id;
    return h;
}

nvmlComputeInstance_t mock_mig_ci_handle(unsigned pos, unsigned gi, unsigned id)
{
    struct nvmlComputeInstance_st *h = &ci_handles[pos][gi][id];
    h->pos = pos;
    h->gi = gi;
    h->id = id;
    return h;
}

nvmlReturn_t mock_mig_resolve_gi(nvmlGpuInstance_t handle, struct mig_view *v)
{
    uintptr_t base = (uintptr_t)gi_handles, p = (uintptr_t)handle;
    if (handle == NULL || p - base >= sizeof gi_handles ||
        (p - base) % sizeof(struct nvmlGpuInstance_st) != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned pos;
    nvmlReturn_t r = mock_mig_layout(mock_handle(handle->pos), &pos, &v->l);
    if (r != NVML_SUCCESS)
        return r == NVML_ERROR_NOT_SUPPORTED ? NVML_ERROR_INVALID_ARGUMENT : r;
    v->gi = mock_mig_instance(&v->l, handle->id);
    if (v->gi == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    r = mock_mig_profile(mock_handle(pos), v->gi->profile, 1, &v->p);
    return r == NVML_SUCCESS ? r : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t mock_mig_resolve_ci(nvmlComputeInstance_t handle, struct mig_view *v)
{
    uintptr_t base = (uintptr_t)ci_handles, addr = (uintptr_t)handle;
    if (handle == NULL || addr - base >= sizeof ci_handles ||
        (addr - base) % sizeof(struct nvmlComputeInstance_st) != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = mock_mig_resolve_gi(mock_mig_gi_handle(handle->pos, handle->gi), v);
    if (r != NVML_SUCCESS)
        return r;
    for (unsigned j = 0; j < v->gi->nci; j++) {
        if (v->gi->ci[j].id == handle->id) {
            v->ci = &v->gi->ci[j];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}
