/*
 * Port I/O: the one way to the host's PCI devices that no path names.
 *
 * When sysfs and procfs fail, libpci tries its intel-conf1/conf2 methods:
 * ioperm()/iopl() on ports 0xcf8-0xcff, then raw config cycles.  A
 * privileged process (CAP_SYS_RAWIO, e.g. a privileged pod) would then list
 * the host's real devices.  While the shim redirects anything, both calls
 * fail with EPERM, as they do for an unprivileged process, so the fallback
 * ends there.  An inert shim (no root configured) passes them through.
 */
#define _GNU_SOURCE
#include <errno.h>

#include "mockfs.h"

MOCKFS_EXPORT int ioperm(unsigned long from, unsigned long num, int turn_on)
{
    const struct mockfs_real *r = mockfs_real();
    if (mockfs_config()->n_rules > 0) {
        errno = EPERM;
        return -1;
    }
    if (r->ioperm == NULL) {
        errno = ENOSYS;
        return -1;
    }
    return r->ioperm(from, num, turn_on);
}

MOCKFS_EXPORT int iopl(int level)
{
    const struct mockfs_real *r = mockfs_real();
    if (mockfs_config()->n_rules > 0) {
        errno = EPERM;
        return -1;
    }
    if (r->iopl == NULL) {
        errno = ENOSYS;
        return -1;
    }
    return r->iopl(level);
}
