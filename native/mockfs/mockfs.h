/*
 * libmockfs.so: an LD_PRELOAD shim that shows a process a mock tree in place
 * of a few host paths (PCI and InfiniBand sysfs, /dev/infiniband).
 *
 * The shim's parts, one file each:
 *   config.c   reads the environment once (pthread_once) into static buffers
 *              and resolves the real libc functions with dlsym(RTLD_NEXT);
 *   rewrite.c  decides whether a path is redirected and builds the new path
 *              (string work on stack buffers: no allocation, so a hook can
 *              run before the allocator is ready);
 *   confine.c  resolves a '..' of a redirected path inside the mock root,
 *              so no spelling climbs out of it;
 *   hooks_*.c  the interposed libc entry points, each a thin wrapper that
 *              rewrites its path argument and calls the real function.
 *
 * It fails closed: a path that should be redirected but cannot be (the
 * prefixed path would exceed PATH_MAX, the root is unusable) fails with an
 * errno; it never falls through to the host path.
 */
#ifndef MOCKFS_H
#define MOCKFS_H

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/types.h>

/* Hooks are the only symbols the library exports (built -fvisibility=hidden). */
#define MOCKFS_EXPORT __attribute__((visibility("default")))

/* Bounds of the static configuration: generous for sysfs prefixes, and
 * fixed so parsing the environment never allocates. */
#define MOCKFS_MAX_RULES 32
#define MOCKFS_PREFIX_MAX 256

/* A mock root and how it maps paths.  MOKKA_MOCKFS_ROOT stands for "/" (a
 * path keeps all its components); MOCK_PCI_ROOT stands for "/sys" (the first
 * component, "sys", is dropped before prefixing). */
struct mockfs_view {
    const char *env_name;        /* variable it came from, for messages */
    char root[PATH_MAX];         /* the root as given, without trailing '/' */
    size_t root_len;
    char canon[PATH_MAX];        /* realpath of the root at start-up (for realpath()) */
    size_t canon_len;
    unsigned strip_components;   /* leading path components replaced by the root */
    const char *view_prefix;     /* what the stripped components spell: "" or "/sys" */
    int unusable_errno;          /* non-zero: every redirect through this view fails so */
};

struct mockfs_rule {
    char pattern[MOCKFS_PREFIX_MAX]; /* absolute, '*'/'?' glob per component */
    const struct mockfs_view *view;
};

struct mockfs_config {
    struct mockfs_view mokka;
    struct mockfs_view pci;
    struct mockfs_rule rules[MOCKFS_MAX_RULES];
    unsigned n_rules;
    int debug;                   /* MOKKA_MOCKFS_DEBUG=1: one stderr line per redirect */
};

/* The real libc functions, resolved once by mockfs_init(). */
struct mockfs_real {
    int (*open)(const char *, int, ...);
    int (*open64)(const char *, int, ...);
    int (*openat)(int, const char *, int, ...);
    int (*openat64)(int, const char *, int, ...);
    int (*open_2)(const char *, int);
    int (*open64_2)(const char *, int);
    int (*openat_2)(int, const char *, int);
    int (*openat64_2)(int, const char *, int);
    FILE *(*fopen)(const char *, const char *);
    FILE *(*fopen64)(const char *, const char *);
    DIR *(*opendir)(const char *);
    int (*scandir)(const char *, struct dirent ***, int (*)(const struct dirent *),
                   int (*)(const struct dirent **, const struct dirent **));
    int (*scandir64)(const char *, struct dirent64 ***, int (*)(const struct dirent64 *),
                     int (*)(const struct dirent64 **, const struct dirent64 **));
    int (*stat)(const char *, struct stat *);
    int (*lstat)(const char *, struct stat *);
    int (*fstatat)(int, const char *, struct stat *, int);
    int (*stat64)(const char *, struct stat64 *);
    int (*lstat64)(const char *, struct stat64 *);
    int (*fstatat64)(int, const char *, struct stat64 *, int);
    int (*statx)(int, const char *, int, unsigned int, struct statx *);
    int (*xstat)(int, const char *, struct stat *);
    int (*lxstat)(int, const char *, struct stat *);
    int (*fxstatat)(int, int, const char *, struct stat *, int);
    int (*xstat64)(int, const char *, struct stat64 *);
    int (*lxstat64)(int, const char *, struct stat64 *);
    int (*fxstatat64)(int, int, const char *, struct stat64 *, int);
    int (*access)(const char *, int);
    int (*faccessat)(int, const char *, int, int);
    ssize_t (*readlink)(const char *, char *, size_t);
    ssize_t (*readlinkat)(int, const char *, char *, size_t);
    ssize_t (*readlink_chk)(const char *, char *, size_t, size_t);
    ssize_t (*readlinkat_chk)(int, const char *, char *, size_t, size_t);
    int (*chdir)(const char *);
    char *(*realpath)(const char *, char *);
    char *(*realpath_chk)(const char *, char *, size_t);
    int (*ioperm)(unsigned long, unsigned long, int);
    int (*iopl)(int);
};

/* Read the environment and resolve the real functions (once, thread-safe). */
void mockfs_init(void);
const struct mockfs_config *mockfs_config(void);
const struct mockfs_real *mockfs_real(void);

/* Outcome of mockfs_rewrite(). */
enum mockfs_route {
    MOCKFS_PASS = 0,     /* not under a mocked prefix: use the path unchanged */
    MOCKFS_REDIRECT = 1, /* use `out` instead */
    MOCKFS_FAIL = -1,    /* under a mocked prefix but not redirectable: errno is set */
};

/*
 * Decide where `path` goes.  `out` must hold PATH_MAX bytes.  On
 * MOCKFS_REDIRECT, `*view` (when not NULL) names the view that matched, so
 * realpath() can map its result back.  A relative path passes unless it has
 * a '..': then it is taken from the working directory (see rewrite.c).
 */
enum mockfs_route mockfs_rewrite(const struct mockfs_config *cfg, const char *path,
                                 char out[PATH_MAX], const struct mockfs_view **view);

/* Same, for a (dirfd, path) pair: a relative path with a '..' starts at
 * dirfd (AT_FDCWD: the working directory). */
enum mockfs_route mockfs_rewrite_at(const struct mockfs_config *cfg, int dirfd,
                                    const char *path, char out[PATH_MAX],
                                    const struct mockfs_view **view);

/* confine.c.  1 when a component of `path` is "..". */
int mockfs_has_dotdot(const char *path);

/* Writes `root` (root_len bytes, a directory standing for `view`) + `tail`
 * into out, with everything up to the last ".." of tail resolved below the
 * root: links followed, ".." never above the root.  0, or -1 with errno
 * (ENOENT, ENOTDIR, ELOOP, ENAMETOOLONG; EXDEV for an absolute link to
 * something the view does not stand for). */
int mockfs_resolve_in_root(const struct mockfs_view *view, const char *root, size_t root_len,
                           const char *tail, char out[PATH_MAX]);

/* The absolute physical path of dirfd (AT_FDCWD: the working directory);
 * -1 when it cannot be told (no /proc, an unreachable directory). */
int mockfs_base_dir(int dirfd, char out[PATH_MAX]);

/*
 * Map a resolved path inside `view`'s root back to the path the process
 * asked about (realpath() must not reveal the mock root).  Writes into
 * `out` (PATH_MAX bytes) and returns 1, or returns 0 when `resolved` is not
 * inside the root (left for the caller to return unchanged).
 */
int mockfs_unprefix(const struct mockfs_view *view, const char *resolved, char out[PATH_MAX]);

/* Glob match of one path component: '*' and '?' only (fnmatch may allocate). */
int mockfs_glob_component(const char *pattern, size_t plen, const char *text, size_t tlen);

/* Write one diagnostic line to stderr without stdio (safe in any hook). */
void mockfs_warn(const char *a, const char *b, const char *c);

/*
 * Where a hook's path goes: sets *use to `path` itself or to `buf`
 * (redirected) and returns 0, or returns -1 with errno set when the path is
 * under a mocked prefix but cannot be redirected (fail closed).  A NULL
 * `path` passes through (mockfs_rewrite checks it in its own translation
 * unit, where glibc's nonnull attributes cannot fold the check away), so the
 * real call reports EFAULT as usual.
 */
static inline int mockfs_route_path(int dirfd, const char *path, char buf[PATH_MAX],
                                    const char **use)
{
    switch (mockfs_rewrite_at(mockfs_config(), dirfd, path, buf, NULL)) {
    case MOCKFS_REDIRECT:
        *use = buf;
        return 0;
    case MOCKFS_FAIL:
        return -1;
    default:
        *use = path;
        return 0;
    }
}

/* Start of every hook: the path to use (or fail closed), and the real
 * function (ENOSYS when this libc lacks it, e.g. statx before glibc 2.28).
 * The _AT form is for calls that take a dirfd. */
#define MOCKFS_ROUTE_AT(fail, real_fn, dirfd, path, use)                             \
    const struct mockfs_real *mockfs_r_ = mockfs_real();                               \
    char mockfs_buf_[PATH_MAX];                                                        \
    const char *use;                                                                   \
    if (mockfs_route_path((dirfd), (path), mockfs_buf_, &use) != 0)                    \
        return fail;                                                                   \
    if (mockfs_r_->real_fn == NULL) {                                                  \
        errno = ENOSYS;                                                                \
        return fail;                                                                   \
    }
#define MOCKFS_ROUTE(fail, real_fn, path, use) MOCKFS_ROUTE_AT(fail, real_fn, AT_FDCWD, path, use)

/* glibc entry points its headers declare only under _FORTIFY_SOURCE, or no
 * longer at all (the pre-2.33 stat ABI), but which binaries still call. */
int __open_2(const char *path, int flags);
int __open64_2(const char *path, int flags);
int __openat_2(int dirfd, const char *path, int flags);
int __openat64_2(int dirfd, const char *path, int flags);
int __xstat(int ver, const char *path, struct stat *buf);
int __lxstat(int ver, const char *path, struct stat *buf);
int __fxstatat(int ver, int dirfd, const char *path, struct stat *buf, int flags);
int __xstat64(int ver, const char *path, struct stat64 *buf);
int __lxstat64(int ver, const char *path, struct stat64 *buf);
int __fxstatat64(int ver, int dirfd, const char *path, struct stat64 *buf, int flags);
ssize_t __readlink_chk(const char *path, char *buf, size_t len, size_t buflen);
ssize_t __readlinkat_chk(int dirfd, const char *path, char *buf, size_t len, size_t buflen);
char *__realpath_chk(const char *path, char *resolved, size_t resolvedlen);
/* x86 port I/O permission calls (declared in <sys/io.h>, absent elsewhere). */
int ioperm(unsigned long from, unsigned long num, int turn_on);
int iopl(int level);

#endif
