/*
 * Engine config parser (format: docs/engine-config.md).
 *
 * The file is a flat YAML subset: one `key: value` a line, `#` comments,
 * values either bare (numbers, booleans, words) or double-quoted strings
 * whose only escapes are \" and \\.  Parsing makes one owned copy of the
 * text and splits it in place, so a snapshot is two allocations plus the
 * entry table and the lookup tables over it (lookup.c).  Every length is
 * checked, and anything malformed rejects the whole file (the library then
 * keeps the previous good snapshot, or fails nvmlInit when there is none).
 * A file that is no regular file (a FIFO, a directory), or that changed
 * size while it was read, is malformed too.  Bytes that are not UTF-8
 * become '?' before the text is split: every string the library returns
 * comes from this text, and a client decoding it as UTF-8 (as NVIDIA's
 * Python binding does) must never meet a byte no driver would return.
 *
 * This file owns the text: reading the file, splitting it into sorted,
 * unique entries and freeing a snapshot.  Finding a key in the entries is
 * lookup.c's, and what a value means (numbers, booleans, words) is
 * values.c's: the parser runs once per file, they run at every call.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mock.h"

struct sort_item {
    struct mock_entry entry;
    size_t line; /* original order: the later duplicate wins, as in YAML loaders */
};

static int compare_items(const void *a, const void *b)
{
    const struct sort_item *x = a, *y = b;
    int c = strcmp(x->entry.key, y->entry.key);
    if (c != 0)
        return c;
    return x->line < y->line ? -1 : x->line > y->line;
}

static int valid_key_char(char c)
{
    return isalnum((unsigned char)c) || c == '_' || c == '.' || c == '-';
}

/* Unquotes a double-quoted value in place.  Returns 0 on malformed input. */
static int unquote(char *value)
{
    char *src = value + 1, *dst = value;
    while (*src && *src != '"') {
        if (*src == '\\') {
            src++;
            if (*src != '\\' && *src != '"')
                return 0;
        }
        *dst++ = *src++;
    }
    if (*src != '"')
        return 0;
    src++;
    while (*src == ' ' || *src == '\t')
        src++;
    if (*src != '\0' && *src != '#')
        return 0;
    *dst = '\0';
    return 1;
}

/* Splits one line into key and value.  Returns 1 for an entry, 0 for a
 * blank or comment line, -1 (with err) for a malformed line. */
static int parse_line(char *line, size_t lineno, struct mock_entry *out, char *err,
                      size_t errlen)
{
    size_t len = strlen(line);
    while (len > 0 && (line[len - 1] == '\r' || line[len - 1] == ' ' || line[len - 1] == '\t'))
        line[--len] = '\0';
    if (len == 0 || line[0] == '#')
        return 0;
    if (len > MOCK_MAX_LINE) {
        snprintf(err, errlen, "line %zu: longer than %d bytes", lineno, MOCK_MAX_LINE);
        return -1;
    }
    char *sep = strstr(line, ": ");
    if (sep == NULL && line[len - 1] == ':')
        sep = line + len - 1; /* `key:` with an empty value */
    if (sep == NULL) {
        snprintf(err, errlen, "line %zu: expected `key: value`", lineno);
        return -1;
    }
    size_t keylen = (size_t)(sep - line);
    if (keylen == 0 || keylen > MOCK_MAX_KEY) {
        snprintf(err, errlen, "line %zu: key length %zu not in 1..%d", lineno, keylen,
                 MOCK_MAX_KEY);
        return -1;
    }
    for (size_t i = 0; i < keylen; i++) {
        if (!valid_key_char(line[i])) {
            snprintf(err, errlen, "line %zu: invalid character in key", lineno);
            return -1;
        }
    }
    *sep = '\0';
    char *value = sep[1] == '\0' ? sep + 1 : sep + 2;
    while (*value == ' ')
        value++;
    if (*value == '"') {
        if (!unquote(value)) {
            snprintf(err, errlen, "line %zu (%s): malformed quoted string", lineno, line);
            return -1;
        }
    } else {
        char *comment = strstr(value, " #");
        if (comment != NULL)
            *comment = '\0';
        size_t vlen = strlen(value);
        while (vlen > 0 && value[vlen - 1] == ' ')
            value[--vlen] = '\0';
    }
    if (strlen(value) > MOCK_MAX_VALUE) {
        snprintf(err, errlen, "line %zu (%s): value longer than %d bytes", lineno, line,
                 MOCK_MAX_VALUE);
        return -1;
    }
    out->key = line;
    out->value = value;
    return 1;
}

/* The length of the well-formed UTF-8 sequence at `p` (at most `left`
 * bytes long), or 0: a stray continuation byte, a truncated sequence, an
 * overlong spelling, a surrogate or a code point past U+10FFFF. */
static size_t utf8_sequence(const unsigned char *p, size_t left)
{
    unsigned char c = p[0];
    size_t n;
    unsigned char lo = 0x80, hi = 0xbf; /* the second byte's range */
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2;
    else if (c >= 0xe0 && c <= 0xef)
        n = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
    else if (c >= 0xf0 && c <= 0xf4)
        n = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
    else
        return 0;
    if (n > left || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xbf)
            return 0;
    return n;
}

/* Replaces every byte that is not part of well-formed UTF-8 with '?', in
 * place.  The length stays: nothing a parse depends on moves. */
static void sanitise_utf8(char *text, size_t len)
{
    unsigned char *p = (unsigned char *)text;
    for (size_t i = 0; i < len;) {
        size_t n = utf8_sequence(p + i, len - i);
        if (n == 0) {
            p[i++] = '?';
            continue;
        }
        i += n;
    }
}

static int build_table(struct mock_config *cfg, char *err, size_t errlen)
{
    size_t lines = 1;
    for (const char *p = cfg->text; *p; p++)
        lines += *p == '\n';
    struct sort_item *items = calloc(lines, sizeof *items);
    if (items == NULL) {
        snprintf(err, errlen, "out of memory");
        return 0;
    }
    size_t n = 0, lineno = 0;
    char *line = cfg->text;
    while (line != NULL) {
        char *next = strchr(line, '\n');
        if (next != NULL)
            *next++ = '\0';
        lineno++;
        int r = parse_line(line, lineno, &items[n].entry, err, errlen);
        if (r < 0) {
            free(items);
            return 0;
        }
        if (r > 0)
            items[n++].line = lineno;
        line = next;
    }
    qsort(items, n, sizeof *items, compare_items);
    cfg->entries = calloc(n ? n : 1, sizeof *cfg->entries);
    if (cfg->entries == NULL) {
        free(items);
        snprintf(err, errlen, "out of memory");
        return 0;
    }
    size_t out = 0;
    for (size_t i = 0; i < n; i++) {
        if (i + 1 < n && strcmp(items[i].entry.key, items[i + 1].entry.key) == 0)
            continue; /* a later line has the same key */
        cfg->entries[out++] = items[i].entry;
    }
    cfg->count = out;
    free(items);
    return 1;
}

struct mock_config *mock_config_parse(const char *text, size_t len, const char *dir, char *err,
                                      size_t errlen)
{
    if (len > MOCK_MAX_CONFIG_BYTES) {
        snprintf(err, errlen, "file larger than %u bytes", MOCK_MAX_CONFIG_BYTES);
        return NULL;
    }
    if (memchr(text, '\0', len) != NULL) {
        snprintf(err, errlen, "file contains a NUL byte");
        return NULL;
    }
    struct mock_config *cfg = calloc(1, sizeof *cfg);
    if (cfg == NULL || (cfg->text = malloc(len + 1)) == NULL) {
        free(cfg);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    memcpy(cfg->text, text, len);
    cfg->text[len] = '\0';
    sanitise_utf8(cfg->text, len);
    if (strlen(dir) >= sizeof cfg->dir) {
        snprintf(err, errlen, "config directory path too long");
        mock_config_free(cfg);
        return NULL;
    }
    strcpy(cfg->dir, dir);
    if (!build_table(cfg, err, errlen)) {
        mock_config_free(cfg);
        return NULL;
    }
    const char *format = mock_cfg_get(cfg, "format");
    if (format == NULL || strcmp(format, MOCK_CONFIG_FORMAT) != 0) {
        snprintf(err, errlen, "format: got %s, expected %s", format ? format : "(missing)",
                 MOCK_CONFIG_FORMAT);
        mock_config_free(cfg);
        return NULL;
    }
    unsigned long long count;
    if (!mock_cfg_u64(cfg, "device_count", &count) || count > MOCK_MAX_DEVICES) {
        snprintf(err, errlen, "device_count: missing or not in 0..%d", MOCK_MAX_DEVICES);
        mock_config_free(cfg);
        return NULL;
    }
    cfg->device_count = (unsigned)count;
    if (!mock_config_index(cfg)) {
        snprintf(err, errlen, "out of memory");
        mock_config_free(cfg);
        return NULL;
    }
    cfg->refs = 1;
    return cfg;
}

void mock_config_free(struct mock_config *cfg)
{
    if (cfg == NULL)
        return;
    for (unsigned pos = 0; pos < MOCK_MAX_DEVICES; pos++)
        mock_board_free(cfg->boards[pos]);
    free(cfg->values);
    free(cfg->slots);
    free(cfg->entries);
    free(cfg->text);
    free(cfg);
}

int mock_same_file(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
           a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

struct mock_config *mock_config_load(const char *path, int *missing, char *err, size_t errlen)
{
    *missing = 0;
    struct stat st;
    int fd = mock_open_regular(path, &st);
    if (fd < 0) {
        *missing = errno == ENOENT || errno == ENOTDIR;
        if (errno == EINVAL || errno == EISDIR)
            snprintf(err, errlen, "not a regular file");
        else
            snprintf(err, errlen, "cannot open: %s", strerror(errno));
        return NULL;
    }
    if (st.st_size > MOCK_MAX_CONFIG_BYTES) {
        snprintf(err, errlen, "not a regular file of at most %u bytes", MOCK_MAX_CONFIG_BYTES);
        close(fd);
        return NULL;
    }
    size_t len = (size_t)st.st_size, got = 0;
    char *text = malloc(len + 1);
    if (text == NULL) {
        snprintf(err, errlen, "out of memory");
        close(fd);
        return NULL;
    }
    while (got < len) {
        ssize_t r = read(fd, text + got, len - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (got != len) {
        /* cut short (or failing) while being read: a prefix of a file is
         * not the file, and would parse as one with keys missing */
        snprintf(err, errlen, "read %zu of its %zu bytes: changed while being read", got, len);
        free(text);
        return NULL;
    }
    char dir[4096];
    const char *slash = strrchr(path, '/');
    size_t dirlen = slash == NULL ? 0 : (slash == path ? 1 : (size_t)(slash - path));
    if (dirlen >= sizeof dir) {
        free(text);
        snprintf(err, errlen, "directory path too long");
        return NULL;
    }
    memcpy(dir, slash == NULL ? "." : path, slash == NULL ? 1 : dirlen);
    dir[slash == NULL ? 1 : dirlen] = '\0';
    struct mock_config *cfg = mock_config_parse(text, got, dir, err, errlen);
    free(text);
    return cfg;
}
