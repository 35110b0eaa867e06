/*
 * MIG: MIG device handles (docs/mig.md): found by index, their GPU and
 * compute instance ids, attributes, UUID and name.
 *
 * A MIG device is a compute instance as a device: a handle of its own
 * table (so the full-GPU getters never mistake it for a GPU), found by
 * index over the layout's GPU instances and their compute instances, and
 * checked against the layout on every use.  devices.c answers a MIG
 * device's UUID and name through mock_mig_uuid and mock_mig_name; the
 * getters that answer a MIG device for its own instance (memory,
 * utilization, processes) ask mock_mig_info what it stands for, and
 * mock_mig_by_uuid finds one by its MIG- UUID.  A process sees the MIG
 * devices whose capability nodes it has, as it sees GPUs by their nodes
 * (mig_visibility).
 */
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "mig.h"

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

/* ------------------------------------------------------------- visibility */

/* Whether this process has the capability node of `minor` (0: none named). */
static int cap_present(unsigned minor)
{
    char name[48];
    snprintf(name, sizeof name, "nvidia-caps/nvidia-cap%u", minor);
    return minor != 0 && mock_dev_node_present(name);
}

/* Which of the layout's MIG devices this process sees, in NVML's order
 * (shown[n] for the n-th): the GPU rule of devices.c, by capability nodes.
 * A container given one MIG device has its GPU's node and that device's
 * two capability nodes; when some but not all of the GPU's MIG devices
 * have both, only those are enumerated (numbered from 0), and when all or
 * none do (the host, whose /dev holds no nvidia-caps), every one is. */
static void mig_visibility(const struct layout *l, unsigned char shown[MAX_GI * MAX_CI])
{
    /* one stat for the host's usual case: no capability nodes at all */
    int any = mock_dev_node_present("nvidia-caps");
    unsigned n = 0, npresent = 0;
    for (unsigned i = 0; i < l->ngi; i++) {
        for (unsigned j = 0; j < l->gi[i].nci; j++, n++) {
            shown[n] = any && cap_present(l->gi[i].cap_minor) &&
                       cap_present(l->gi[i].ci[j].cap_minor);
            npresent += shown[n];
        }
    }
    if (npresent == 0 || npresent == n)
        memset(shown, 1, n);
}

/* The place of compute instance `ci` of GPU instance `gi` (the layout's own
 * pointers) among the MIG devices this process sees. */
static unsigned visible_index(const struct layout *l, const struct gi_state *gi,
                              const struct ci_state *ci)
{
    unsigned char shown[MAX_GI * MAX_CI];
    mig_visibility(l, shown);
    unsigned flat = (unsigned)(ci - gi->ci), index = 0;
    for (const struct gi_state *g = l->gi; g < gi; g++)
        flat += g->nci;
    for (unsigned n = 0; n < flat; n++)
        index += shown[n];
    return index;
}

/* 1 when `device` is a MIG device handle, with its GPU's position and in
 * *r whether its compute instance is in the layout now (v). */
static int resolve_mig(nvmlDevice_t device, unsigned *pos, struct mig_view *v, nvmlReturn_t *r)
{
    unsigned gi_id, ci_id;
    if (!mock_mig_device(device, pos, &gi_id, &ci_id))
        return 0;
    *r = mock_mig_resolve_ci(mock_mig_ci_handle(*pos, gi_id, ci_id), v);
    return 1;
}

int mock_mig_info(nvmlDevice_t device, struct mock_mig_info *out, nvmlReturn_t *r)
{
    unsigned pos;
    struct mig_view v;
    if (!resolve_mig(device, &pos, &v, r))
        return 0;
    if (*r != NVML_SUCCESS)
        return 1;
    /* The index nvmlDeviceGetMigDeviceHandleByIndex hands this handle out
     * at: its place among the MIG devices this process sees. */
    *out = (struct mock_mig_info){
        .pos = pos, .index = visible_index(&v.l, v.gi, v.ci), .gi = v.gi->id, .ci = v.ci->id,
        .gi_slices = v.p.slices, .ci_slices = v.ci->slices, .memory_slices = v.p.size,
        .memory_bytes = v.p.memory_mib << 20,
    };
    return 1;
}

/* What the getters that describe only MIG devices share: an answer to
 * write (`out`), and a full GPU's handle is NOT_SUPPORTED. */
static nvmlReturn_t mig_only(nvmlDevice_t device, const void *out, struct mig_view *v)
{
    unsigned pos;
    nvmlReturn_t r;
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (mock_handle_pos(device, &pos))
        return NVML_ERROR_NOT_SUPPORTED; /* a full GPU */
    return resolve_mig(device, &pos, v, &r) ? r : NVML_ERROR_INVALID_ARGUMENT;
}

/* ---------------------------------------------------------------- handles */

MOCK_API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                          nvmlDevice_t *migDevice)
{
    if (migDevice == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct layout l;
    unsigned pos;
    nvmlReturn_t r = mock_mig_layout(device, &pos, &l);
    /* MIG off: no MIG devices, NOT_FOUND is what consumers iterate until. */
    if (r == NVML_ERROR_NOT_SUPPORTED)
        return NVML_ERROR_NOT_FOUND;
    if (r != NVML_SUCCESS)
        return r;
    unsigned char shown[MAX_GI * MAX_CI];
    mig_visibility(&l, shown);
    unsigned n = 0, seen = 0;
    for (unsigned i = 0; i < l.ngi; i++) {
        for (unsigned j = 0; j < l.gi[i].nci; j++, n++) {
            if (shown[n] && seen++ == index) {
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

/* ------------------------------------------------------ ids and attributes */

MOCK_API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    struct mig_view v;
    nvmlReturn_t r = mig_only(device, id, &v);
    if (r == NVML_SUCCESS)
        *id = v.gi->id;
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    struct mig_view v;
    nvmlReturn_t r = mig_only(device, id, &v);
    if (r == NVML_SUCCESS)
        *id = v.ci->id;
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device,
                                                nvmlDeviceAttributes_t *attributes)
{
    struct mig_view v;
    nvmlReturn_t r = mig_only(device, attributes, &v); /* only MIG devices are described */
    if (r != NVML_SUCCESS)
        return r;
    attributes->multiprocessorCount = v.p.multiprocessors * v.ci->slices / v.p.slices;
    attributes->sharedCopyEngineCount = v.p.slices;
    attributes->sharedDecoderCount = v.p.decoders;
    attributes->sharedEncoderCount = 0;
    attributes->sharedJpegCount = v.p.jpegs;
    attributes->sharedOfaCount = v.p.ofas;
    attributes->gpuInstanceSliceCount = v.p.slices;
    attributes->computeInstanceSliceCount = v.ci->slices;
    attributes->memorySizeMB = v.p.memory_mib;
    return NVML_SUCCESS;
}

/* ----------------------------------------------------------- UUID and name */

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
    unsigned pos;
    struct mig_view v;
    if (!resolve_mig(device, &pos, &v, r))
        return 0;
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
    unsigned long long a = mig_hash(parent, v.gi->id, v.ci->id, 0);
    unsigned long long b = mig_hash(parent, v.gi->id, v.ci->id, 0x9e3779b97f4a7c15ULL);
    char text[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    snprintf(text, sizeof text, "MIG-%08llx-%04llx-%04llx-%04llx-%012llx", a >> 32,
             (a >> 16) & 0xffff, (a & 0x0fff) | 0x4000, ((b >> 48) & 0x3fff) | 0x8000,
             b & 0xffffffffffffULL);
    *r = mock_copy_out(text, uuid, length);
    return 1;
}

int mock_mig_by_uuid(const char *uuid, nvmlDevice_t *device, nvmlReturn_t *r)
{
    if (uuid == NULL || strncasecmp(uuid, "MIG-", 4) != 0)
        return 0;
    *r = NVML_ERROR_INVALID_ARGUMENT;
    if (device == NULL)
        return 1;
    unsigned count = 0;
    *r = nvmlDeviceGetCount_v2(&count); /* UNINITIALIZED before nvmlInit */
    if (*r != NVML_SUCCESS)
        return 1;
    *r = NVML_ERROR_NOT_FOUND;
    /* Every MIG device of the node, by index: a handful per GPU at most. */
    for (unsigned i = 0; i < count && *r == NVML_ERROR_NOT_FOUND; i++) {
        nvmlDevice_t gpu, mig;
        if (nvmlDeviceGetHandleByIndex_v2(i, &gpu) != NVML_SUCCESS)
            continue;
        for (unsigned m = 0; nvmlDeviceGetMigDeviceHandleByIndex(gpu, m, &mig) == NVML_SUCCESS;
             m++) {
            char text[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
            nvmlReturn_t found;
            if (mock_mig_uuid(mig, text, sizeof text, &found) && found == NVML_SUCCESS &&
                strcasecmp(text, uuid) == 0) {
                *device = mig;
                *r = NVML_SUCCESS;
                break;
            }
        }
    }
    return 1;
}

int mock_mig_name(nvmlDevice_t device, char *name, unsigned int length, nvmlReturn_t *r)
{
    unsigned pos;
    struct mig_view v;
    if (!resolve_mig(device, &pos, &v, r))
        return 0;
    if (*r != NVML_SUCCESS)
        return 1;
    char parent[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    *r = nvmlDeviceGetName(mock_handle(pos), parent, sizeof parent);
    if (*r != NVML_SUCCESS)
        return 1;
    char text[NVML_DEVICE_NAME_V2_BUFFER_SIZE + 48];
    snprintf(text, sizeof text, "%s MIG %s", parent, v.p.name);
    *r = mock_copy_out(text, name, length);
    return 1;
}
