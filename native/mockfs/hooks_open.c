/*
 * Hooks that open things: open/openat (plain, 64-bit and the
 * _FORTIFY_SOURCE __open_2 family libpci uses for `config`), fopen (libpci
 * reads `resource` through stdio), opendir and scandir (libibumad
 * enumerates its class directories with scandir).
 *
 * Each rewrites its path and calls the real function; glibc's own internal
 * calls (fopen opening its file, scandir opening its directory) go to
 * internal symbols, so a path is rewritten exactly once.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>

#include "mockfs.h"

/* open's third argument exists only when the flags create a file. */
#define NEEDS_MODE(flags) (((flags) & O_CREAT) != 0 || ((flags) & O_TMPFILE) == O_TMPFILE)

static mode_t take_mode(int flags, va_list ap)
{
    return NEEDS_MODE(flags) ? (mode_t)va_arg(ap, int) : 0;
}

MOCKFS_EXPORT int open(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = take_mode(flags, ap);
    va_end(ap);
    MOCKFS_ROUTE(-1, open, path, use);
    return mockfs_r_->open(use, flags, mode);
}

MOCKFS_EXPORT int open64(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = take_mode(flags, ap);
    va_end(ap);
    MOCKFS_ROUTE(-1, open64, path, use);
    return mockfs_r_->open64(use, flags, mode);
}

MOCKFS_EXPORT int openat(int dirfd, const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = take_mode(flags, ap);
    va_end(ap);
    MOCKFS_ROUTE_AT(-1, openat, dirfd, path, use);
    return mockfs_r_->openat(dirfd, use, flags, mode);
}

MOCKFS_EXPORT int openat64(int dirfd, const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = take_mode(flags, ap);
    va_end(ap);
    MOCKFS_ROUTE_AT(-1, openat64, dirfd, path, use);
    return mockfs_r_->openat64(dirfd, use, flags, mode);
}

MOCKFS_EXPORT int __open_2(const char *path, int flags)
{
    MOCKFS_ROUTE(-1, open_2, path, use);
    return mockfs_r_->open_2(use, flags);
}

MOCKFS_EXPORT int __open64_2(const char *path, int flags)
{
    MOCKFS_ROUTE(-1, open64_2, path, use);
    return mockfs_r_->open64_2(use, flags);
}

MOCKFS_EXPORT int __openat_2(int dirfd, const char *path, int flags)
{
    MOCKFS_ROUTE_AT(-1, openat_2, dirfd, path, use);
    return mockfs_r_->openat_2(dirfd, use, flags);
}

MOCKFS_EXPORT int __openat64_2(int dirfd, const char *path, int flags)
{
    MOCKFS_ROUTE_AT(-1, openat64_2, dirfd, path, use);
    return mockfs_r_->openat64_2(dirfd, use, flags);
}

MOCKFS_EXPORT FILE *fopen(const char *path, const char *mode)
{
    MOCKFS_ROUTE(NULL, fopen, path, use);
    return mockfs_r_->fopen(use, mode);
}

MOCKFS_EXPORT FILE *fopen64(const char *path, const char *mode)
{
    MOCKFS_ROUTE(NULL, fopen64, path, use);
    return mockfs_r_->fopen64(use, mode);
}

MOCKFS_EXPORT DIR *opendir(const char *path)
{
    MOCKFS_ROUTE(NULL, opendir, path, use);
    return mockfs_r_->opendir(use);
}

MOCKFS_EXPORT int scandir(const char *path, struct dirent ***namelist,
                          int (*filter)(const struct dirent *),
                          int (*compar)(const struct dirent **, const struct dirent **))
{
    MOCKFS_ROUTE(-1, scandir, path, use);
    return mockfs_r_->scandir(use, namelist, filter, compar);
}

MOCKFS_EXPORT int scandir64(const char *path, struct dirent64 ***namelist,
                            int (*filter)(const struct dirent64 *),
                            int (*compar)(const struct dirent64 **, const struct dirent64 **))
{
    MOCKFS_ROUTE(-1, scandir64, path, use);
    return mockfs_r_->scandir64(use, namelist, filter, compar);
}
