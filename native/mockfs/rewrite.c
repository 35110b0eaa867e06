/*
 * Path routing: is this path under a mocked prefix, and where does it go?
 *
 * Matching is lexical and component-wise: "/sys/bus/pci" matches
 * "/sys/bus/pci" and "/sys/bus/pci/devices/x" but not "/sys/bus/pcie";
 * repeated slashes and "." components are ignored, and a pattern component
 * may use '*' and '?' ("/sys/devices/pci*").  A redirected path keeps its
 * spelling after the prefix, so the kernel follows the mock tree's relative
 * links as on a real host; a '..' after the prefix is resolved inside the
 * mock root instead (confine.c), so "/sys/bus/pci/devices/<bdf>/.." is
 * still the parent bridge but no number of '..' leads out of the root.
 * A path that matches only once its '..' are resolved lexically
 * ("/sys/class/../bus/pci", "/tmp/../sys/bus/pci") is decided, and
 * redirected, in that normalised spelling, so no spelling slips past the
 * shim to the host's tree.
 *
 * Relative paths without '..' pass: they stay below the directory they
 * start in (the working directory, which chdir() redirected, or a dirfd
 * opened through a redirected path).  With a '..' they are taken from that
 * directory: inside a mock root they stay inside it, outside they are
 * routed as the absolute path they name.
 *
 * Everything works on caller-provided PATH_MAX buffers; nothing allocates.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <string.h>

#include "mockfs.h"

int mockfs_glob_component(const char *pattern, size_t plen, const char *text, size_t tlen)
{
    size_t p = 0, t = 0, star_p = 0, star_t = 0;
    int have_star = 0;
    while (t < tlen) {
        if (p < plen && (pattern[p] == '?' || pattern[p] == text[t])) {
            p++;
            t++;
        } else if (p < plen && pattern[p] == '*') {
            have_star = 1;
            star_p = p++;
            star_t = t;
        } else if (have_star) {
            /* Let the last '*' swallow one more character and retry. */
            p = star_p + 1;
            t = ++star_t;
        } else {
            return 0;
        }
    }
    while (p < plen && pattern[p] == '*')
        p++;
    return p == plen;
}

/* Advance *s past separators and "." components; return the next
 * component's length (0 at the end) and leave *s at its start. */
static size_t next_component(const char **s)
{
    for (;;) {
        while (**s == '/')
            (*s)++;
        if (**s == '\0')
            return 0;
        size_t len = strcspn(*s, "/");
        if (len == 1 && (*s)[0] == '.') {
            *s += 1;
            continue;
        }
        return len;
    }
}

/* 1 when the pattern's components lead `path`, none of them a ".." (which
 * only the normalised spelling can decide). */
static int match_rule(const char *pattern, const char *path)
{
    const char *p = pattern, *s = path;
    for (;;) {
        size_t plen = next_component(&p);
        if (plen == 0)
            return 1;
        size_t slen = next_component(&s);
        if (slen == 0 || (slen == 2 && s[0] == '.' && s[1] == '.'))
            return 0;
        if (!mockfs_glob_component(p, plen, s, slen))
            return 0;
        p += plen;
        s += slen;
    }
}

/* Lexical normalisation ("a//./b/../c" -> "/a/c"), used only to decide. */
static int normalise(const char *path, char out[PATH_MAX])
{
    size_t len = 0;
    const char *s = path;
    for (;;) {
        size_t clen = next_component(&s);
        if (clen == 0)
            break;
        if (clen == 2 && s[0] == '.' && s[1] == '.') {
            while (len > 0 && out[len - 1] != '/')
                len--;
            if (len > 0)
                len--; /* drop the separator too */
        } else {
            if (len + 1 + clen + 1 > PATH_MAX)
                return -1;
            out[len++] = '/';
            memcpy(out + len, s, clen);
            len += clen;
        }
        s += clen;
    }
    if (len == 0)
        out[len++] = '/';
    out[len] = '\0';
    return 0;
}

/* The part of `path` after its first `n` components (keeps its leading '/'). */
static const char *skip_components(const char *path, unsigned n)
{
    const char *s = path;
    while (n-- > 0) {
        size_t len = next_component(&s);
        s += len;
    }
    return s;
}

static const struct mockfs_rule *find_rule(const struct mockfs_config *cfg, const char *path)
{
    for (unsigned i = 0; i < cfg->n_rules; i++)
        if (match_rule(cfg->rules[i].pattern, path))
            return &cfg->rules[i];
    return NULL;
}

static int under(const char *resolved, const char *root, size_t len)
{
    return strncmp(resolved, root, len) == 0 && (resolved[len] == '/' || resolved[len] == '\0');
}

/* Writes root + tail into out, resolving a '..' in tail inside the root. */
static enum mockfs_route place(const struct mockfs_view *v, const char *root, size_t root_len,
                               const char *tail, char out[PATH_MAX])
{
    if (mockfs_has_dotdot(tail))
        return mockfs_resolve_in_root(v, root, root_len, tail, out) == 0 ? MOCKFS_REDIRECT
                                                                         : MOCKFS_FAIL;
    size_t tail_len = strlen(tail);
    if (root_len + tail_len + 1 > PATH_MAX) {
        /* Fail closed: never hand the host path to the real call. */
        errno = ENAMETOOLONG;
        return MOCKFS_FAIL;
    }
    memcpy(out, root, root_len);
    memcpy(out + root_len, tail, tail_len + 1);
    if (root_len + tail_len == 0) {
        out[0] = '/';
        out[1] = '\0';
    }
    return MOCKFS_REDIRECT;
}

static enum mockfs_route route_absolute(const struct mockfs_config *cfg, const char *path,
                                        char out[PATH_MAX], const struct mockfs_view **view)
{
    const char *source = path;
    const struct mockfs_rule *rule = find_rule(cfg, path);
    char normalised[PATH_MAX];
    if (rule == NULL && mockfs_has_dotdot(path)) {
        if (normalise(path, normalised) != 0) {
            errno = ENAMETOOLONG;
            return MOCKFS_FAIL;
        }
        source = normalised;
        rule = find_rule(cfg, normalised);
    }
    if (rule == NULL)
        return MOCKFS_PASS;

    const struct mockfs_view *v = rule->view;
    if (v->unusable_errno != 0) {
        errno = v->unusable_errno;
        return MOCKFS_FAIL;
    }
    enum mockfs_route route =
        place(v, v->root, v->root_len, skip_components(source, v->strip_components), out);
    if (route == MOCKFS_REDIRECT && view != NULL)
        *view = v;
    return route;
}

/* A relative path with a '..': inside a mock root it stays there; outside
 * it goes where the absolute path it names goes. */
static enum mockfs_route route_relative(const struct mockfs_config *cfg, int dirfd,
                                        const char *path, char out[PATH_MAX],
                                        const struct mockfs_view **view)
{
    char base[PATH_MAX];
    if (mockfs_base_dir(dirfd, base) != 0)
        return MOCKFS_PASS; /* no telling where it starts: as the kernel sees it */
    const struct mockfs_view *views[] = {&cfg->mokka, &cfg->pci};
    for (size_t i = 0; i < sizeof views / sizeof *views; i++) {
        const struct mockfs_view *v = views[i];
        if (v->unusable_errno != 0 || v->root_len == 0)
            continue;
        /* getcwd and /proc name the physical directory: the canonical root. */
        const char *root = under(base, v->canon, v->canon_len) ? v->canon
                           : under(base, v->root, v->root_len) ? v->root
                                                               : NULL;
        if (root == NULL)
            continue;
        size_t root_len = root == v->canon ? v->canon_len : v->root_len;
        char tail[PATH_MAX];
        size_t below = strlen(base + root_len), plen = strlen(path);
        if (below + 1 + plen + 1 > sizeof tail) {
            errno = ENAMETOOLONG;
            return MOCKFS_FAIL;
        }
        memcpy(tail, base + root_len, below);
        tail[below] = '/';
        memcpy(tail + below + 1, path, plen + 1);
        enum mockfs_route route = place(v, root, root_len, tail, out);
        if (route == MOCKFS_REDIRECT && view != NULL)
            *view = v;
        return route;
    }
    char absolute[PATH_MAX];
    size_t blen = strlen(base), plen = strlen(path);
    if (blen + 1 + plen + 1 > sizeof absolute) {
        errno = ENAMETOOLONG; /* cannot tell whether it names a mocked path */
        return MOCKFS_FAIL;
    }
    memcpy(absolute, base, blen);
    absolute[blen] = '/';
    memcpy(absolute + blen + 1, path, plen + 1);
    return route_absolute(cfg, absolute, out, view);
}

enum mockfs_route mockfs_rewrite_at(const struct mockfs_config *cfg, int dirfd,
                                    const char *path, char out[PATH_MAX],
                                    const struct mockfs_view **view)
{
    if (path == NULL || cfg->n_rules == 0)
        return MOCKFS_PASS;
    enum mockfs_route route;
    if (path[0] == '/')
        route = route_absolute(cfg, path, out, view);
    else if (mockfs_has_dotdot(path))
        route = route_relative(cfg, dirfd, path, out, view);
    else
        return MOCKFS_PASS; /* stays below where it starts */
    if (route == MOCKFS_REDIRECT && cfg->debug)
        mockfs_warn(path, " -> ", out);
    return route;
}

enum mockfs_route mockfs_rewrite(const struct mockfs_config *cfg, const char *path,
                                 char out[PATH_MAX], const struct mockfs_view **view)
{
    return mockfs_rewrite_at(cfg, AT_FDCWD, path, out, view);
}

int mockfs_unprefix(const struct mockfs_view *view, const char *resolved, char out[PATH_MAX])
{
    const char *tail;
    if (view->root_len == 0)
        tail = resolved;
    else if (under(resolved, view->canon, view->canon_len))
        tail = resolved + view->canon_len;
    else if (under(resolved, view->root, view->root_len))
        tail = resolved + view->root_len;
    else
        return 0; /* a link led out of the mock tree: that path is real */
    size_t plen = strlen(view->view_prefix), tlen = strlen(tail);
    if (plen + tlen + 1 > PATH_MAX) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(out, view->view_prefix, plen);
    memcpy(out + plen, tail, tlen + 1);
    if (plen + tlen == 0) {
        out[0] = '/';
        out[1] = '\0';
    }
    return 1;
}
