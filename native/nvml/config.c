/*
 * Engine config parser (format: docs/engine-config.md).
 *
 * The file is a flat YAML subset: one `key: value` a line, `#` comments,
 * values either bare (numbers, booleans, words) or double-quoted strings
 * whose only escapes are \" and \\.  Parsing makes one owned copy of the
 * text and splits it in place, so a snapshot is two allocations plus the
 * entry table; lookups are a binary search.  Every length is checked, and
 * anything malformed rejects the whole file (the library then keeps the
 * previous good snapshot, or fails nvmlInit when there is none).
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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

static int compare_key(const void *key, const void *entry)
{
    return strcmp((const char *)key, ((const struct mock_entry *)entry)->key);
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
    cfg->refs = 1;
    return cfg;
}

void mock_config_free(struct mock_config *cfg)
{
    if (cfg == NULL)
        return;
    free(cfg->entries);
    free(cfg->text);
    free(cfg);
}

const char *mock_cfg_get(const struct mock_config *cfg, const char *key)
{
    const struct mock_entry *e =
        bsearch(key, cfg->entries, cfg->count, sizeof *cfg->entries, compare_key);
    return e ? e->value : NULL;
}

const char *mock_dev_get(const struct mock_config *cfg, unsigned pos, const char *field)
{
    char key[MOCK_MAX_KEY + 1];
    int n = snprintf(key, sizeof key, "device.%u.%s", pos, field);
    if (n < 0 || (size_t)n >= sizeof key)
        return NULL;
    return mock_cfg_get(cfg, key);
}

/* Number of entries whose key starts with `prefix`.  Keys are sorted and
 * cutting keys to a prefix's length keeps their order, so the entries
 * sharing it are one run, found with two binary searches. */
static size_t prefix_count(const struct mock_config *cfg, const char *prefix)
{
    size_t len = strlen(prefix), lo = 0, hi = cfg->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strncmp(cfg->entries[mid].key, prefix, len) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t first = lo;
    hi = cfg->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strncmp(cfg->entries[mid].key, prefix, len) <= 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo - first;
}

int mock_cfg_list_len(const struct mock_config *cfg, const char *count_key,
                      const char *items_prefix, unsigned *out)
{
    unsigned long long count;
    if (!mock_cfg_u64(cfg, count_key, &count))
        return 0;
    size_t items = prefix_count(cfg, items_prefix);
    if (items > 0 && strncmp(count_key, items_prefix, strlen(items_prefix)) == 0)
        items--; /* the count itself is no item */
    if (count > items)
        count = items;
    *out = count > 0xffffffffULL ? 0xffffffffu : (unsigned)count;
    return 1;
}

int mock_dev_list_len(const struct mock_config *cfg, unsigned pos, const char *list,
                      unsigned *out)
{
    char count_key[MOCK_MAX_KEY + 1], items_prefix[MOCK_MAX_KEY + 1];
    int n = snprintf(count_key, sizeof count_key, "device.%u.%s.count", pos, list);
    int m = snprintf(items_prefix, sizeof items_prefix, "device.%u.%s.", pos, list);
    if (n < 0 || (size_t)n >= sizeof count_key || m < 0 || (size_t)m >= sizeof items_prefix)
        return 0;
    return mock_cfg_list_len(cfg, count_key, items_prefix, out);
}

int mock_parse_u64(const char *value, unsigned long long *out)
{
    /* Digits only, or 0x and hex digits: strtoull alone would also take
     * leading blanks and a sign, and read " -1" as 2^64 - 1. */
    if (value == NULL || !isdigit((unsigned char)value[0]))
        return 0;
    int base = (value[0] == '0' && (value[1] == 'x' || value[1] == 'X')) ? 16 : 10;
    if (base == 16 && !isxdigit((unsigned char)value[2]))
        return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(value, &end, base);
    if (errno != 0 || *end != '\0')
        return 0;
    *out = v;
    return 1;
}

int mock_parse_i64(const char *value, long long *out)
{
    /* An optional minus, then digits: no blanks, no plus (as above). */
    if (value == NULL || !isdigit((unsigned char)(value[0] == '-' ? value[1] : value[0])))
        return 0;
    char *end;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    if (errno != 0 || *end != '\0')
        return 0;
    *out = v;
    return 1;
}

int mock_parse_bool(const char *value, int *out)
{
    static const char *const yes[] = {"true", "enabled", "yes", "on", "1"};
    static const char *const no[] = {"false", "disabled", "no", "off", "0"};
    if (value == NULL)
        return 0;
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) {
        if (strcasecmp(value, yes[i]) == 0) {
            *out = 1;
            return 1;
        }
        if (strcasecmp(value, no[i]) == 0) {
            *out = 0;
            return 1;
        }
    }
    return 0;
}

int mock_cfg_u64(const struct mock_config *cfg, const char *key, unsigned long long *out)
{
    return mock_parse_u64(mock_cfg_get(cfg, key), out);
}

int mock_dev_u64(const struct mock_config *cfg, unsigned pos, const char *field,
                 unsigned long long *out)
{
    return mock_parse_u64(mock_dev_get(cfg, pos, field), out);
}

int mock_dev_uint(const struct mock_config *cfg, unsigned pos, const char *field, unsigned *out)
{
    unsigned long long v;
    if (!mock_dev_u64(cfg, pos, field, &v) || v > 0xffffffffULL)
        return 0;
    *out = (unsigned)v;
    return 1;
}

int mock_dev_int(const struct mock_config *cfg, unsigned pos, const char *field, int *out)
{
    long long v;
    if (!mock_parse_i64(mock_dev_get(cfg, pos, field), &v) || v < -2147483647LL - 1 ||
        v > 2147483647LL)
        return 0;
    *out = (int)v;
    return 1;
}

int mock_dev_bool(const struct mock_config *cfg, unsigned pos, const char *field, int *out)
{
    return mock_parse_bool(mock_dev_get(cfg, pos, field), out);
}

int mock_dev_double(const struct mock_config *cfg, unsigned pos, const char *field, double *out)
{
    const char *value = mock_dev_get(cfg, pos, field);
    if (value == NULL || *value == '\0')
        return 0;
    char *end;
    errno = 0;
    double v = strtod(value, &end);
    if (errno != 0 || *end != '\0')
        return 0;
    *out = v;
    return 1;
}

int mock_dev_is(const struct mock_config *cfg, unsigned pos, const char *field,
                const char *expected)
{
    const char *value = mock_dev_get(cfg, pos, field);
    return value != NULL && strcasecmp(value, expected) == 0;
}

int mock_enum_lookup(const char *value, const struct mock_enum_name *table, size_t n,
                     unsigned *out)
{
    for (size_t i = 0; value != NULL && i < n; i++) {
        if (strcasecmp(value, table[i].name) == 0) {
            *out = table[i].value;
            return 1;
        }
    }
    return 0;
}

nvmlReturn_t mock_copy_out(const char *value, char *buf, unsigned int length)
{
    if (buf == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (value == NULL)
        return NVML_ERROR_NOT_SUPPORTED;
    size_t len = strlen(value);
    if (len + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, value, len + 1);
    return NVML_SUCCESS;
}
