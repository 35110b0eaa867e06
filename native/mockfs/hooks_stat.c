/*
 * The stat family: the glibc >= 2.33 symbols (stat, lstat, fstatat and their
 * 64-bit twins), statx, and the legacy __xstat entry points that binaries
 * linked against older glibc still call.  fstatat/statx with a relative
 * path (including AT_EMPTY_PATH's "") pass through, as their dirfd already
 * names the right tree, unless a '..' could climb out of it (rewrite.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>

#include "mockfs.h"

MOCKFS_EXPORT int stat(const char *path, struct stat *buf)
{
    MOCKFS_ROUTE(-1, stat, path, use);
    return mockfs_r_->stat(use, buf);
}

MOCKFS_EXPORT int lstat(const char *path, struct stat *buf)
{
    MOCKFS_ROUTE(-1, lstat, path, use);
    return mockfs_r_->lstat(use, buf);
}

MOCKFS_EXPORT int fstatat(int dirfd, const char *path, struct stat *buf, int flags)
{
    MOCKFS_ROUTE_AT(-1, fstatat, dirfd, path, use);
    return mockfs_r_->fstatat(dirfd, use, buf, flags);
}

MOCKFS_EXPORT int stat64(const char *path, struct stat64 *buf)
{
    MOCKFS_ROUTE(-1, stat64, path, use);
    return mockfs_r_->stat64(use, buf);
}

MOCKFS_EXPORT int lstat64(const char *path, struct stat64 *buf)
{
    MOCKFS_ROUTE(-1, lstat64, path, use);
    return mockfs_r_->lstat64(use, buf);
}

MOCKFS_EXPORT int fstatat64(int dirfd, const char *path, struct stat64 *buf, int flags)
{
    MOCKFS_ROUTE_AT(-1, fstatat64, dirfd, path, use);
    return mockfs_r_->fstatat64(dirfd, use, buf, flags);
}

MOCKFS_EXPORT int statx(int dirfd, const char *path, int flags, unsigned int mask,
                        struct statx *buf)
{
    MOCKFS_ROUTE_AT(-1, statx, dirfd, path, use);
    return mockfs_r_->statx(dirfd, use, flags, mask, buf);
}

MOCKFS_EXPORT int __xstat(int ver, const char *path, struct stat *buf)
{
    MOCKFS_ROUTE(-1, xstat, path, use);
    return mockfs_r_->xstat(ver, use, buf);
}

MOCKFS_EXPORT int __lxstat(int ver, const char *path, struct stat *buf)
{
    MOCKFS_ROUTE(-1, lxstat, path, use);
    return mockfs_r_->lxstat(ver, use, buf);
}

MOCKFS_EXPORT int __fxstatat(int ver, int dirfd, const char *path, struct stat *buf, int flags)
{
    MOCKFS_ROUTE_AT(-1, fxstatat, dirfd, path, use);
    return mockfs_r_->fxstatat(ver, dirfd, use, buf, flags);
}

MOCKFS_EXPORT int __xstat64(int ver, const char *path, struct stat64 *buf)
{
    MOCKFS_ROUTE(-1, xstat64, path, use);
    return mockfs_r_->xstat64(ver, use, buf);
}

MOCKFS_EXPORT int __lxstat64(int ver, const char *path, struct stat64 *buf)
{
    MOCKFS_ROUTE(-1, lxstat64, path, use);
    return mockfs_r_->lxstat64(ver, use, buf);
}

MOCKFS_EXPORT int __fxstatat64(int ver, int dirfd, const char *path, struct stat64 *buf,
                               int flags)
{
    MOCKFS_ROUTE_AT(-1, fxstatat64, dirfd, path, use);
    return mockfs_r_->fxstatat64(ver, dirfd, use, buf, flags);
}
