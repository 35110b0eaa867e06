/*
 * Keeping '..' inside the mock root.
 *
 * A redirected path keeps its spelling (rewrite.c), so a '..' after the
 * prefix would be resolved by the kernel, which knows nothing of the mock
 * root: enough of them climb out of it, to the host's /etc or the host's
 * own /sys/bus/pci.  Such a path is resolved here instead, the way openat2's
 * RESOLVE_IN_ROOT resolves one: component by component below the root,
 * following links (relative ones from where they are; absolute ones from
 * the root when they name something the view stands for, else EXDEV), with
 * '..' at the root staying at the root, as '/..' does on a host.  Only the
 * part up to the last '..' needs it: the rest goes to the kernel as written,
 * and can only go down (or through the tree's own relative links).
 *
 * The kernel's answers are kept: a missing component fails with ENOENT, a
 * file that a '..' follows with ENOTDIR, more than 40 links with ELOOP.
 *
 * Relative paths with a '..' start from the working directory or a dirfd:
 * mockfs_base_dir says where that is, so rewrite.c can keep them inside a
 * mock root they start in.
 *
 * Everything is on PATH_MAX stack buffers and raw system calls: a hook may
 * run before the allocator is ready, and libc's readlink is our own hook.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "mockfs.h"

/* Links followed in one resolution before ELOOP, as the kernel allows. */
#define MAX_LINKS 40

static long raw_readlink(const char *path, char *buf, size_t size)
{
    return syscall(SYS_readlinkat, AT_FDCWD, path, buf, size);
}

int mockfs_has_dotdot(const char *path)
{
    const char *s = path;
    while (*s != '\0') {
        while (*s == '/')
            s++;
        size_t len = strcspn(s, "/");
        if (len == 2 && s[0] == '.' && s[1] == '.')
            return 1;
        s += len;
    }
    return 0;
}

/* Just after the last ".." component of `path` ('/' or the end). */
static const char *after_last_dotdot(const char *path)
{
    const char *s = path, *after = path;
    while (*s != '\0') {
        while (*s == '/')
            s++;
        size_t len = strcspn(s, "/");
        if (len == 2 && s[0] == '.' && s[1] == '.')
            after = s + 2;
        s += len;
    }
    return after;
}

/* Fails with `error`; for the many exits below. */
static int fail(int error)
{
    errno = error;
    return -1;
}

int mockfs_resolve_in_root(const struct mockfs_view *view, const char *root, size_t root_len,
                           const char *tail, char out[PATH_MAX])
{
    const char *rest = after_last_dotdot(tail);
    char pending[PATH_MAX]; /* components still to walk */
    size_t head_len = (size_t)(rest - tail);
    if (root_len >= PATH_MAX || head_len >= sizeof pending)
        return fail(ENAMETOOLONG);
    memcpy(pending, tail, head_len);
    pending[head_len] = '\0';
    memcpy(out, root, root_len);
    size_t len = root_len, pos = 0;
    out[len] = '\0';
    int links = 0;
    while (pending[pos] != '\0') {
        if (pending[pos] == '/') {
            pos++;
            continue;
        }
        const char *c = pending + pos;
        size_t clen = strcspn(c, "/");
        pos += clen;
        if (clen == 1 && c[0] == '.')
            continue;
        if (clen == 2 && c[0] == '.' && c[1] == '.') {
            /* Up one, but never above the root. */
            while (len > root_len && out[len - 1] != '/')
                len--;
            if (len > root_len)
                len--;
            out[len] = '\0';
            continue;
        }
        if (len + 1 + clen + 1 > PATH_MAX)
            return fail(ENAMETOOLONG);
        size_t parent = len;
        out[len++] = '/';
        memcpy(out + len, c, clen);
        len += clen;
        out[len] = '\0';
        char target[PATH_MAX];
        long n = raw_readlink(out, target, sizeof target);
        if (n < 0) {
            if (errno != EINVAL)
                return -1; /* ENOENT, ENOTDIR, EACCES...: the kernel's answer */
            /* Not a link: a '..' follows, so it must be a directory. */
            long fd = syscall(SYS_openat, AT_FDCWD, out,
                              O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (fd < 0)
                return -1;
            close((int)fd);
            continue;
        }
        if ((size_t)n >= sizeof target)
            return fail(ENAMETOOLONG);
        if (++links > MAX_LINKS)
            return fail(ELOOP);
        target[n] = '\0';
        /* The link's target takes the place of its name. */
        len = parent;
        out[len] = '\0';
        const char *t = target;
        if (t[0] == '/') {
            /* An absolute target names a path of the view ("/sys/..." under
             * MOCK_PCI_ROOT): from the root, or nowhere. */
            size_t plen = strlen(view->view_prefix);
            if (strncmp(t, view->view_prefix, plen) != 0 || (t[plen] != '/' && t[plen] != '\0'))
                return fail(EXDEV);
            t += plen;
            len = root_len;
            out[len] = '\0';
        }
        size_t tlen = strlen(t), rlen = strlen(pending + pos);
        if (tlen + 1 + rlen + 1 > sizeof pending)
            return fail(ENAMETOOLONG);
        memmove(pending + tlen + 1, pending + pos, rlen + 1);
        memcpy(pending, t, tlen);
        pending[tlen] = '/';
        pos = 0;
    }
    size_t rlen = strlen(rest);
    if (len + rlen + 1 > PATH_MAX)
        return fail(ENAMETOOLONG);
    memcpy(out + len, rest, rlen + 1);
    if (len + rlen == 0) {
        out[0] = '/';
        out[1] = '\0';
    }
    return 0;
}

int mockfs_base_dir(int dirfd, char out[PATH_MAX])
{
    if (dirfd == AT_FDCWD) {
        /* The system call, not libc's getcwd: it never allocates, and it
         * says "(unreachable)" rather than guess for a directory outside
         * this process's root. */
        long n = syscall(SYS_getcwd, out, PATH_MAX);
        return n > 0 && out[0] == '/' ? 0 : -1;
    }
    if (dirfd < 0)
        return -1;
    char link[32] = "/proc/self/fd/";
    char digits[12];
    size_t nd = 0;
    for (unsigned v = (unsigned)dirfd; nd == 0 || v > 0; v /= 10)
        digits[nd++] = (char)('0' + v % 10);
    size_t at = strlen(link);
    while (nd > 0)
        link[at++] = digits[--nd];
    link[at] = '\0';
    long n = raw_readlink(link, out, PATH_MAX - 1);
    if (n <= 0 || out[0] != '/')
        return -1; /* no /proc, or not a directory of this filesystem tree */
    out[n] = '\0';
    return 0;
}
