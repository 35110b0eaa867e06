/*
 * Path routing: is this path under a mocked prefix, and where does it go?
 *
 * Matching is lexical and component-wise: "/sys/bus/pci" matches
 * "/sys/bus/pci" and "/sys/bus/pci/devices/x" but not "/sys/bus/pcie";
 * repeated slashes and "." components are ignored, and a pattern component
 * may use '*' and '?' ("/sys/devices/pci*").  A redirected path keeps its
 * spelling after the prefix: a later ".." is resolved by the kernel inside
 * the mock tree, whose links are relative and mirror real sysfs, so
 * "/sys/bus/pci/devices/<bdf>/.." lands on the parent bridge exactly as on a
 * real host.  Only a ".." met *before* the prefix is complete
 * ("/sys/class/../bus/pci") makes the decision fall back to the lexically
 * normalised path, so such spellings cannot slip past the shim to the host.
 *
 * Everything works on caller-provided PATH_MAX buffers; nothing allocates.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>

#include "mockfs.h"

enum match { NO_MATCH, MATCH, NEEDS_NORMALISE };

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

static enum match match_rule(const char *pattern, const char *path)
{
    const char *p = pattern, *s = path;
    for (;;) {
        size_t plen = next_component(&p);
        if (plen == 0)
            return MATCH;
        size_t slen = next_component(&s);
        if (slen == 0)
            return NO_MATCH;
        if (slen == 2 && s[0] == '.' && s[1] == '.')
            return NEEDS_NORMALISE;
        if (!mockfs_glob_component(p, plen, s, slen))
            return NO_MATCH;
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

static const struct mockfs_rule *find_rule(const struct mockfs_config *cfg, const char *path,
                                           int *needs_normalise)
{
    *needs_normalise = 0;
    for (unsigned i = 0; i < cfg->n_rules; i++) {
        enum match m = match_rule(cfg->rules[i].pattern, path);
        if (m == MATCH)
            return &cfg->rules[i];
        if (m == NEEDS_NORMALISE)
            *needs_normalise = 1;
    }
    return NULL;
}

enum mockfs_route mockfs_rewrite(const struct mockfs_config *cfg, const char *path,
                                 char out[PATH_MAX], const struct mockfs_view **view)
{
    if (path == NULL || path[0] != '/' || cfg->n_rules == 0)
        return MOCKFS_PASS;

    int needs_normalise;
    const char *source = path;
    const struct mockfs_rule *rule = find_rule(cfg, path, &needs_normalise);
    char normalised[PATH_MAX];
    if (rule == NULL && needs_normalise) {
        if (normalise(path, normalised) != 0) {
            errno = ENAMETOOLONG;
            return MOCKFS_FAIL;
        }
        source = normalised;
        rule = find_rule(cfg, normalised, &needs_normalise);
    }
    if (rule == NULL)
        return MOCKFS_PASS;

    const struct mockfs_view *v = rule->view;
    if (v->unusable_errno != 0) {
        errno = v->unusable_errno;
        return MOCKFS_FAIL;
    }
    const char *tail = skip_components(source, v->strip_components);
    size_t tail_len = strlen(tail);
    if (v->root_len + tail_len + 1 > PATH_MAX) {
        /* Fail closed: never hand the host path to the real call. */
        errno = ENAMETOOLONG;
        return MOCKFS_FAIL;
    }
    memcpy(out, v->root, v->root_len);
    memcpy(out + v->root_len, tail, tail_len + 1);
    if (v->root_len + tail_len == 0) {
        out[0] = '/';
        out[1] = '\0';
    }
    if (view != NULL)
        *view = v;
    if (cfg->debug)
        mockfs_warn(path, " -> ", out);
    return MOCKFS_REDIRECT;
}

enum mockfs_route mockfs_rewrite_at(const struct mockfs_config *cfg, int dirfd,
                                    const char *path, char out[PATH_MAX],
                                    const struct mockfs_view **view)
{
    /* A relative path is resolved against dirfd, which refers into the mock
     * tree already when it was opened through a redirected path. */
    (void)dirfd;
    return mockfs_rewrite(cfg, path, out, view);
}

static int under(const char *resolved, const char *root, size_t len)
{
    return strncmp(resolved, root, len) == 0 && (resolved[len] == '/' || resolved[len] == '\0');
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
