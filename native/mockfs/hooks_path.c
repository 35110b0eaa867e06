/*
 * Hooks about names rather than contents: access, readlink, chdir and
 * realpath.
 *
 * readlink needs no result rewriting: every link in the mock tree is
 * relative, so its target reads the same as on a real host.  realpath does:
 * the real call resolves inside the mock root, and its result is mapped back
 * to the path the process asked about (/sys/devices/pci0000:00/...), so
 * libpci's parent lookup and any "is this under /sys" check behave as on a
 * host.  A result that a link led out of the mock tree is returned as is:
 * that path is real.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mockfs.h"

MOCKFS_EXPORT int access(const char *path, int mode)
{
    MOCKFS_ROUTE(-1, access, path, use);
    return mockfs_r_->access(use, mode);
}

MOCKFS_EXPORT int faccessat(int dirfd, const char *path, int mode, int flags)
{
    MOCKFS_ROUTE_AT(-1, faccessat, dirfd, path, use);
    return mockfs_r_->faccessat(dirfd, use, mode, flags);
}

MOCKFS_EXPORT ssize_t readlink(const char *path, char *buf, size_t len)
{
    MOCKFS_ROUTE(-1, readlink, path, use);
    return mockfs_r_->readlink(use, buf, len);
}

MOCKFS_EXPORT ssize_t readlinkat(int dirfd, const char *path, char *buf, size_t len)
{
    MOCKFS_ROUTE_AT(-1, readlinkat, dirfd, path, use);
    return mockfs_r_->readlinkat(dirfd, use, buf, len);
}

MOCKFS_EXPORT ssize_t __readlink_chk(const char *path, char *buf, size_t len, size_t buflen)
{
    MOCKFS_ROUTE(-1, readlink_chk, path, use);
    return mockfs_r_->readlink_chk(use, buf, len, buflen);
}

MOCKFS_EXPORT ssize_t __readlinkat_chk(int dirfd, const char *path, char *buf, size_t len,
                                       size_t buflen)
{
    MOCKFS_ROUTE_AT(-1, readlinkat_chk, dirfd, path, use);
    return mockfs_r_->readlinkat_chk(dirfd, use, buf, len, buflen);
}

MOCKFS_EXPORT int chdir(const char *path)
{
    MOCKFS_ROUTE(-1, chdir, path, use);
    return mockfs_r_->chdir(use);
}

MOCKFS_EXPORT char *realpath(const char *path, char *resolved)
{
    const struct mockfs_real *r = mockfs_real();
    if (r->realpath == NULL) {
        errno = ENOSYS;
        return NULL;
    }
    char routed[PATH_MAX];
    const struct mockfs_view *view = NULL;
    switch (mockfs_rewrite(mockfs_config(), path, routed, &view)) {
    case MOCKFS_PASS:
        return r->realpath(path, resolved);
    case MOCKFS_FAIL:
        return NULL;
    case MOCKFS_REDIRECT:
        break;
    }
    char inside[PATH_MAX];
    if (r->realpath(routed, inside) == NULL)
        return NULL;
    char outside[PATH_MAX];
    int mapped = mockfs_unprefix(view, inside, outside);
    if (mapped < 0)
        return NULL;
    const char *result = mapped ? outside : inside;
    size_t len = strlen(result) + 1;
    if (resolved == NULL) {
        /* The caller asked realpath to allocate: the allocator is up. */
        resolved = malloc(len);
        if (resolved == NULL) {
            errno = ENOMEM;
            return NULL;
        }
    }
    memcpy(resolved, result, len); /* len <= PATH_MAX, realpath's contract */
    return resolved;
}

MOCKFS_EXPORT char *__realpath_chk(const char *path, char *resolved, size_t resolvedlen)
{
    const struct mockfs_real *r = mockfs_real();
    if (resolved != NULL && resolvedlen < PATH_MAX && r->realpath_chk != NULL) {
        /* glibc aborts such a call (__chk_fail): let it, with a path that
         * is ours to pass. */
        char routed[PATH_MAX];
        const char *use = "/";
        if (mockfs_route_path(AT_FDCWD, path, routed, &use) != 0)
            use = "/";
        return r->realpath_chk(use, resolved, resolvedlen);
    }
    return realpath(path, resolved);
}

/* glibc's canonicalize_file_name calls its internal realpath, so it needs
 * its own hook to get the same mapping. */
MOCKFS_EXPORT char *canonicalize_file_name(const char *path)
{
    return realpath(path, NULL);
}
