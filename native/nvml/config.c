/*
 * Engine config parser (format: docs/engine-config.md).
 *
 * The file is a flat YAML subset: one `key: value` a line, `#` comments,
 * values either bare (numbers, booleans, words) or double-quoted strings
 * whose only escapes are \" and \\.  Parsing makes one owned copy of the
 * text and splits it in place, so a snapshot is two allocations plus the
 * entry table and a hash table over the device fields: a device field (what
 * every getter reads) is one hash and, nearly always, one comparison; any
 * other key is a binary search.  Every length is checked, and
 * anything malformed rejects the whole file (the library then keeps the
 * previous good snapshot, or fails nvmlInit when there is none).
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
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

static size_t prefix_run(const struct mock_config *cfg, const char *prefix, size_t *first_out);

/* The hash of a device field: eight bytes at a time (one multiply each),
 * the position folded in, then a final mix.  Cheaper than the binary
 * search's string comparisons it replaces, even for long fields. */
static inline unsigned long long field_hash(const char *field, unsigned pos)
{
    size_t len = strlen(field);
    unsigned long long h = 0x9E3779B97F4A7C15ULL ^ ((unsigned long long)pos << 32) ^ len;
    for (; len >= 8; len -= 8, field += 8) {
        unsigned long long word;
        memcpy(&word, field, 8);
        h = (h ^ word) * 0xff51afd7ed558ccdULL;
    }
    /* the last 0..7 bytes in at most two loads (overlapping: len is in h) */
    unsigned long long tail = 0;
    if (len >= 4) {
        unsigned int lo, hi;
        memcpy(&lo, field, 4);
        memcpy(&hi, field + len - 4, 4);
        tail = (unsigned long long)hi << 32 | lo;
    } else if (len > 0) {
        const unsigned char *p = (const unsigned char *)field;
        tail = (unsigned long long)p[0] << 16 | (unsigned)p[len / 2] << 8 | p[len - 1];
    }
    h ^= tail;
    /* a multiply carries bits upwards only: fold the high half down (fmix64) */
    h = (h ^ (h >> 33)) * 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 33);
}

/* Builds the device-field hash table (at most half full).  Without memory
 * for it, lookups fall back to searching each device's run. */
static void build_slots(struct mock_config *cfg)
{
    size_t keys = 0;
    for (unsigned pos = 0; pos < cfg->device_count; pos++)
        keys += cfg->dev_keys[pos];
    size_t size = 16;
    while (size < 2 * keys)
        size *= 2;
    cfg->slots = calloc(size, sizeof *cfg->slots);
    if (cfg->slots == NULL)
        return;
    cfg->slot_mask = size - 1;
    for (unsigned pos = 0; pos < cfg->device_count; pos++) {
        for (unsigned i = cfg->dev_first[pos]; i < cfg->dev_first[pos] + cfg->dev_keys[pos];
             i++) {
            unsigned long long h = field_hash(cfg->entries[i].key + cfg->dev_prefix[pos], pos);
            size_t at = h & cfg->slot_mask;
            while (cfg->slots[at].index != 0)
                at = (at + 1) & cfg->slot_mask;
            cfg->slots[at].index = i + 1;
            cfg->slots[at].tag = (unsigned)(h >> 32);
        }
    }
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
    for (unsigned pos = 0; pos < cfg->device_count; pos++) {
        char prefix[32];
        size_t first;
        int n = snprintf(prefix, sizeof prefix, "device.%u.", pos);
        cfg->dev_keys[pos] = (unsigned)prefix_run(cfg, prefix, &first);
        cfg->dev_first[pos] = (unsigned)first;
        cfg->dev_prefix[pos] = (unsigned char)n;
    }
    build_slots(cfg);
    cfg->refs = 1;
    return cfg;
}

void mock_config_free(struct mock_config *cfg)
{
    if (cfg == NULL)
        return;
    for (unsigned pos = 0; pos < MOCK_MAX_DEVICES; pos++)
        mock_board_free(cfg->boards[pos]);
    free(cfg->slots);
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
    if (pos < cfg->device_count && pos < MOCK_MAX_DEVICES && cfg->slots != NULL) {
        unsigned long long h = field_hash(field, pos);
        size_t skip = cfg->dev_prefix[pos];
        unsigned first = cfg->dev_first[pos], end = first + cfg->dev_keys[pos];
        for (size_t at = h & cfg->slot_mask; cfg->slots[at].index != 0;
             at = (at + 1) & cfg->slot_mask) {
            const struct mock_slot *slot = &cfg->slots[at];
            unsigned i = slot->index - 1;
            /* the tag makes a string comparison rare unless it is the key;
             * the run check keeps another device's equal field out */
            if (slot->tag == (unsigned)(h >> 32) && i >= first && i < end &&
                strcmp(field, cfg->entries[i].key + skip) == 0)
                return cfg->entries[i].value;
        }
        return NULL;
    }
    if (pos < cfg->device_count && pos < MOCK_MAX_DEVICES) {
        /* Search the device's run of keys for the field alone. */
        size_t lo = cfg->dev_first[pos], hi = lo + cfg->dev_keys[pos], skip = cfg->dev_prefix[pos];
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            int c = strcmp(field, cfg->entries[mid].key + skip);
            if (c == 0)
                return cfg->entries[mid].value;
            if (c < 0)
                hi = mid;
            else
                lo = mid + 1;
        }
        return NULL;
    }
    char key[MOCK_MAX_KEY + 1];
    int n = snprintf(key, sizeof key, "device.%u.%s", pos, field);
    if (n < 0 || (size_t)n >= sizeof key)
        return NULL;
    return mock_cfg_get(cfg, key);
}

/* Number of entries whose key starts with `prefix` (and in *first_out,
 * optional, where they start).  Keys are sorted and cutting keys to a
 * prefix's length keeps their order, so the entries sharing it are one
 * run, found with two binary searches. */
static size_t prefix_run(const struct mock_config *cfg, const char *prefix, size_t *first_out)
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
    if (first_out != NULL)
        *first_out = first;
    return lo - first;
}

static size_t prefix_count(const struct mock_config *cfg, const char *prefix)
{
    return prefix_run(cfg, prefix, NULL);
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
    /* Up to 19 digits cannot overflow: the common case, without strtoull. */
    unsigned long long quick = 0;
    size_t digits = 0;
    while (digits < 20 && isdigit((unsigned char)value[digits]))
        quick = quick * 10 + (unsigned)(value[digits++] - '0');
    if (value[digits] == '\0' && digits <= 19) {
        *out = quick;
        return 1;
    }
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

/* Typed lookups of a moving quantity (utilization, power draw, GPU
 * temperature, current SM clock, memory used, clocks event reasons) answer
 * the effective reading of dynamics.c instead of the profile's idle value:
 * every getter, field value, sample, meter and GPM gauge then reads one
 * derivation, and none of them has to know that readings move.  A device
 * with no workload and no pattern reads its profile values unchanged. */
int mock_dev_u64(const struct mock_config *cfg, unsigned pos, const char *field,
                 unsigned long long *out)
{
    long long reading;
    if (mock_reading_field(cfg, pos, field, &reading)) {
        if (reading < 0)
            return 0;
        *out = (unsigned long long)reading;
        return 1;
    }
    return mock_parse_u64(mock_dev_get(cfg, pos, field), out);
}

int mock_dev_raw_u64(const struct mock_config *cfg, unsigned pos, const char *field,
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
    if (mock_reading_field(cfg, pos, field, &v)) {
        *out = (int)v; /* readings are small: temperatures */
        return 1;
    }
    if (!mock_parse_i64(mock_dev_get(cfg, pos, field), &v) || v < -2147483647LL - 1 ||
        v > 2147483647LL)
        return 0;
    *out = (int)v;
    return 1;
}

int mock_dev_bool(const struct mock_config *cfg, unsigned pos, const char *field, int *out)
{
    long long reading;
    if (mock_reading_field(cfg, pos, field, &reading)) {
        *out = reading != 0;
        return 1;
    }
    return mock_parse_bool(mock_dev_get(cfg, pos, field), out);
}

int mock_dev_double(const struct mock_config *cfg, unsigned pos, const char *field, double *out)
{
    return mock_parse_double(mock_dev_get(cfg, pos, field), out);
}

int mock_parse_double(const char *value, double *out)
{
    if (value == NULL || *value == '\0')
        return 0;
    char *end;
    errno = 0;
    double v = strtod(value, &end);
    if (errno != 0 || *end != '\0' || !isfinite(v))
        return 0; /* "nan" and "inf" are no numbers a profile means */
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

int mock_same_file(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
           a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

struct mock_config *mock_config_load(const char *path, int *missing, char *err, size_t errlen)
{
    *missing = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        *missing = errno == ENOENT || errno == ENOTDIR;
        snprintf(err, errlen, "cannot open: %s", strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > MOCK_MAX_CONFIG_BYTES) {
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
