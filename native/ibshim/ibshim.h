/*
 * libibshim.so: answers libibverbs' device and query calls from the mock
 * InfiniBand tree, for processes that preload it (see docs/ib.md).
 *
 *   tree.c     reads the mock tree (sysfs files under $MOKKA_MOCKFS_ROOT)
 *   verbs.c    the interposed device entry points (list, open, close) and
 *              the calls with no data path
 *   queries.c  the interposed query entry points (device, port, GID, P_Key)
 *
 * The shim is active when MOKKA_MOCKFS_ROOT is an absolute path (the same
 * variable libmockfs.so reads: the directory standing for "/"); otherwise
 * every entry point forwards to the real libibverbs, found with
 * dlsym(RTLD_NEXT).  Active, it never calls the real library's device
 * functions, so no host HCA (found through netlink or the real sysfs) can
 * appear beside the mock ones.
 */
#ifndef MOKKA_IBSHIM_H
#define MOKKA_IBSHIM_H

#include <limits.h>
#include <stdint.h>

#include "ibshim_abi.h"

#define IBSHIM_EXPORT __attribute__((visibility("default")))

/* The most HCAs one device list holds (the compiler allows 256). */
#define IBSHIM_MAX_DEVICES 256
/* The host-view class directories, as libibverbs names them. */
#define IBSHIM_IB_CLASS "/sys/class/infiniband"
#define IBSHIM_VERBS_CLASS "/sys/class/infiniband_verbs"

/* A device the shim handed out: the public struct first, so a
 * struct ibv_device * and a struct ibshim_device * are the same pointer. */
struct ibshim_device {
    struct ibv_device dev;
    /* one for the device list it came in, one per open context */
    int refs;
};

struct ibshim_context {
    struct ibv_context ctx;
};

/* The mock root ("" when the shim is inert), set once. */
const char *ibshim_root(void);
int ibshim_active(void);

/* Read `<root><IBSHIM_IB_CLASS>/<ibdev>/<attr>` into buf (NUL-terminated,
 * trailing newline removed).  Returns the length, or -1 with errno set. */
int ibshim_read_attr(const char *ibdev, const char *attr, char *buf, size_t size);
/* The same, parsed as an unsigned number (decimal, or 0x-hex); the leading
 * number of "4: ACTIVE" or "400 Gb/sec (4X NDR)" counts.  -1 on failure. */
long long ibshim_read_number(const char *ibdev, const char *attr);
/* "a088:c203:0012:3456" -> the GUID in network byte order; 0 on failure. */
uint64_t ibshim_parse_guid_be(const char *text);
/* Parse a "%pI6"-style GID ("fe80:0000:...") into raw bytes; -1 if malformed. */
int ibshim_parse_gid(const char *text, union ibv_gid *gid);

/* Fill `out` (capacity `max`) with the mock devices sorted by uverbs
 * number; returns how many, or -1 with errno set (ENOSYS: the tree has no
 * infiniband_verbs class, as libibverbs reports a kernel without verbs). */
int ibshim_scan_devices(struct ibshim_device **out, int max);
/* Numbered entries in `<ibdev>/<dir>` (ports, gids, pkeys); 0 when none. */
int ibshim_count_entries(const char *ibdev, const char *dir);

/* The real function of our own name, for the inert case (dlsym(RTLD_NEXT));
 * NULL with errno ENOSYS when the process has no libibverbs.  Looked up on
 * each use: only inert processes pay, and only for these rare calls. */
void *ibshim_real_symbol(const char *name);
#define REAL(fn) ((__typeof__(&fn))ibshim_real_symbol(#fn))

/* The shim's device behind a context it opened. */
static inline struct ibshim_device *device_of(struct ibv_context *context)
{
    return (struct ibshim_device *)context->device;
}

#endif
