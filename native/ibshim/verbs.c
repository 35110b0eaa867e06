/*
 * The interposed libibverbs entry points.
 *
 * With the shim active (MOKKA_MOCKFS_ROOT set), these answer from the mock
 * tree: the device list and opening a device (the query calls ibv_devinfo,
 * ibv_devices and topology probes make are in queries.c).  Calls
 * that would create hardware objects (protection domains, completion
 * queues, channels, async events, importing a device) fail with
 * EOPNOTSUPP: the mock has no data path.  Inert, each one forwards to the
 * real function.
 *
 * Why this is enough for unmodified binaries: the inline helpers in
 * <infiniband/verbs.h> (ibv_query_port, ibv_query_device_ex, every "_ex"
 * verb) look for an extended context first (abi_compat == UINTPTR_MAX) and,
 * finding a plain one, fall back to the exported calls (here and in
 * queries.c); the fast-path ops in the context are only reached through
 * objects the shim never creates, and each slot holds a stub that fails
 * anyway.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "ibshim.h"

/* Prototypes of the exported functions (their declarations live in
 * rdma-core's headers, which the build does not use). */
IBSHIM_EXPORT struct ibv_device **ibv_get_device_list(int *num_devices);
IBSHIM_EXPORT void ibv_free_device_list(struct ibv_device **list);
IBSHIM_EXPORT const char *ibv_get_device_name(struct ibv_device *device);
IBSHIM_EXPORT uint64_t ibv_get_device_guid(struct ibv_device *device);
IBSHIM_EXPORT int ibv_get_device_index(struct ibv_device *device);
IBSHIM_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device);
IBSHIM_EXPORT int ibv_close_device(struct ibv_context *context);
IBSHIM_EXPORT void *ibv_alloc_pd(struct ibv_context *context);
IBSHIM_EXPORT void *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
                                  void *channel, int comp_vector);
IBSHIM_EXPORT void *ibv_create_comp_channel(struct ibv_context *context);
IBSHIM_EXPORT int ibv_get_async_event(struct ibv_context *context, void *event);
IBSHIM_EXPORT struct ibv_context *ibv_import_device(int cmd_fd);

void *ibshim_real_symbol(const char *name)
{
    void *fn = dlsym(RTLD_NEXT, name);
    if (fn == NULL)
        errno = ENOSYS; /* the process has no libibverbs to forward to */
    return fn;
}

static void *unsupported(void)
{
    errno = EOPNOTSUPP;
    return NULL;
}

static void release(struct ibshim_device *device)
{
    if (__atomic_sub_fetch(&device->refs, 1, __ATOMIC_ACQ_REL) == 0)
        free(device);
}

/* ---- devices ------------------------------------------------------------ */

struct ibv_device **ibv_get_device_list(int *num_devices)
{
    if (!ibshim_active()) {
        __typeof__(&ibv_get_device_list) real = REAL(ibv_get_device_list);
        return real != NULL ? real(num_devices) : NULL;
    }
    if (num_devices != NULL)
        *num_devices = 0;
    struct ibshim_device **found = calloc(IBSHIM_MAX_DEVICES + 1, sizeof *found);
    if (found == NULL)
        return NULL;
    int count = ibshim_scan_devices(found, IBSHIM_MAX_DEVICES);
    if (count < 0) {
        int saved = errno;
        free(found);
        errno = saved;
        return NULL;
    }
    if (num_devices != NULL)
        *num_devices = count;
    /* The list is NULL-terminated; found[count] is already NULL. */
    return (struct ibv_device **)found;
}

void ibv_free_device_list(struct ibv_device **list)
{
    if (!ibshim_active()) {
        __typeof__(&ibv_free_device_list) real = REAL(ibv_free_device_list);
        if (real != NULL)
            real(list);
        return;
    }
    if (list == NULL)
        return;
    for (struct ibv_device **p = list; *p != NULL; p++)
        release((struct ibshim_device *)*p);
    free(list);
}

const char *ibv_get_device_name(struct ibv_device *device)
{
    if (!ibshim_active()) {
        __typeof__(&ibv_get_device_name) real = REAL(ibv_get_device_name);
        return real != NULL ? real(device) : NULL;
    }
    return device->name;
}

uint64_t ibv_get_device_guid(struct ibv_device *device)
{
    if (!ibshim_active()) {
        __typeof__(&ibv_get_device_guid) real = REAL(ibv_get_device_guid);
        return real != NULL ? real(device) : 0;
    }
    char text[64];
    if (ibshim_read_attr(device->name, "node_guid", text, sizeof text) < 0)
        return 0;
    return ibshim_parse_guid_be(text);
}

int ibv_get_device_index(struct ibv_device *device)
{
    if (!ibshim_active()) {
        __typeof__(&ibv_get_device_index) real = REAL(ibv_get_device_index);
        return real != NULL ? real(device) : -1;
    }
    /* The kernel's index; the mock numbers devices like their uverbs nodes. */
    return atoi(device->dev_name + strlen("uverbs"));
}

struct ibv_context *ibv_open_device(struct ibv_device *device)
{
    if (!ibshim_active()) {
        __typeof__(&ibv_open_device) real = REAL(ibv_open_device);
        return real != NULL ? real(device) : NULL;
    }
    if (ibshim_read_number(device->name, "node_type") < 0) {
        errno = ENODEV; /* the HCA left the tree since the list was taken */
        return NULL;
    }
    struct ibshim_context *context = calloc(1, sizeof *context);
    if (context == NULL)
        return NULL;
    struct ibshim_device *owner = (struct ibshim_device *)device;
    __atomic_add_fetch(&owner->refs, 1, __ATOMIC_ACQ_REL);
    context->ctx.device = device;
    for (int i = 0; i < IBSHIM_CONTEXT_OPS; i++)
        context->ctx.ops[i] = unsupported;
    /* No kernel file behind the context: its descriptors are invalid, so a
     * caller polling them gets EBADF rather than another device's events. */
    context->ctx.cmd_fd = -1;
    context->ctx.async_fd = -1;
    context->ctx.num_comp_vectors = 1;
    pthread_mutex_init(&context->ctx.mutex, NULL);
    context->ctx.abi_compat = NULL;
    return &context->ctx;
}

int ibv_close_device(struct ibv_context *context)
{
    if (!ibshim_active()) {
        __typeof__(&ibv_close_device) real = REAL(ibv_close_device);
        return real != NULL ? real(context) : -1;
    }
    struct ibshim_device *device = device_of(context);
    pthread_mutex_destroy(&context->mutex);
    free((struct ibshim_context *)context);
    release(device);
    return 0;
}

/* ---- no data path ------------------------------------------------------- */

void *ibv_alloc_pd(struct ibv_context *context)
{
    if (!ibshim_active()) {
        __typeof__(&ibv_alloc_pd) real = REAL(ibv_alloc_pd);
        return real != NULL ? real(context) : NULL;
    }
    return unsupported();
}

void *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context, void *channel,
                    int comp_vector)
{
    if (!ibshim_active()) {
        __typeof__(&ibv_create_cq) real = REAL(ibv_create_cq);
        return real != NULL ? real(context, cqe, cq_context, channel, comp_vector) : NULL;
    }
    return unsupported();
}

void *ibv_create_comp_channel(struct ibv_context *context)
{
    if (!ibshim_active()) {
        __typeof__(&ibv_create_comp_channel) real = REAL(ibv_create_comp_channel);
        return real != NULL ? real(context) : NULL;
    }
    return unsupported();
}

int ibv_get_async_event(struct ibv_context *context, void *event)
{
    if (!ibshim_active()) {
        __typeof__(&ibv_get_async_event) real = REAL(ibv_get_async_event);
        return real != NULL ? real(context, event) : -1;
    }
    errno = EOPNOTSUPP;
    return -1;
}

struct ibv_context *ibv_import_device(int cmd_fd)
{
    if (!ibshim_active()) {
        __typeof__(&ibv_import_device) real = REAL(ibv_import_device);
        return real != NULL ? real(cmd_fd) : NULL;
    }
    return unsupported();
}
