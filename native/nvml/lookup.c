/*
 * Finding a key in a snapshot (config.c parsed its entries, sorted by key).
 *
 * Any key is a binary search.  A device field (what every getter reads) is
 * one hash and, nearly always, one comparison: each device's keys are one
 * run of the sorted entries, and a hash table over (position, field) finds
 * a field in its device's run with no key to format.  The fields the
 * per-call getters read (MOCK_KEYS in mock.h) are looked up and parsed
 * once per snapshot into a per-device table, so such a getter looks up
 * nothing at all.
 *
 * Apart from the parser because this is the hot path's half of the config:
 * the parser runs once per file, these lookups at every call; the hash
 * that builds the table and the one that probes it are one inline function
 * here, so they cannot disagree.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mock.h"

/* ----------------------------------------------------------------- any key */

static int compare_key(const void *key, const void *entry)
{
    return strcmp((const char *)key, ((const struct mock_entry *)entry)->key);
}

const char *mock_cfg_get(const struct mock_config *cfg, const char *key)
{
    const struct mock_entry *e =
        bsearch(key, cfg->entries, cfg->count, sizeof *cfg->entries, compare_key);
    return e ? e->value : NULL;
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

/* ----------------------------------------------------------- device fields */

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

/* ----------------------------------------------------------- the key table */

static const char *const KEY_FIELDS[MOCK_KEY_COUNT] = {
#define MOCK_KEY_FIELD(id, field) [MOCK_KEY_##id] = field,
    MOCK_KEYS(MOCK_KEY_FIELD)
#undef MOCK_KEY_FIELD
};

const char *mock_key_field(enum mock_key key)
{
    return KEY_FIELDS[key];
}

/* Every device's MOCK_KEYS fields, looked up and parsed once: the snapshot
 * is immutable, so they stay what a lookup would answer. */
static int resolve_keys(struct mock_config *cfg)
{
    cfg->values = calloc(cfg->device_count ? cfg->device_count : 1, sizeof *cfg->values);
    if (cfg->values == NULL)
        return 0;
    for (unsigned pos = 0; pos < cfg->device_count; pos++) {
        for (unsigned key = 0; key < MOCK_KEY_COUNT; key++) {
            struct mock_value *v = &cfg->values[pos][key];
            v->text = mock_dev_get(cfg, pos, KEY_FIELDS[key]);
            v->has_u64 = (unsigned char)mock_parse_u64(v->text, &v->u64);
            v->has_i64 = (unsigned char)mock_parse_i64(v->text, &v->i64);
            v->moves = (unsigned char)mock_key_moves(key);
        }
    }
    return 1;
}

int mock_config_index(struct mock_config *cfg)
{
    for (unsigned pos = 0; pos < cfg->device_count; pos++) {
        char prefix[32];
        size_t first;
        int n = snprintf(prefix, sizeof prefix, "device.%u.", pos);
        cfg->dev_keys[pos] = (unsigned)prefix_run(cfg, prefix, &first);
        cfg->dev_first[pos] = (unsigned)first;
        cfg->dev_prefix[pos] = (unsigned char)n;
    }
    build_slots(cfg);
    return resolve_keys(cfg);
}

/* ------------------------------------------------------- ECC counters */

const char *const mock_ecc_location_names[MOCK_ECC_LOCATION_COUNT] = {
    [MOCK_ECC_TOTAL] = "total",
    [MOCK_ECC_L1_CACHE] = "l1_cache",
    [MOCK_ECC_L2_CACHE] = "l2_cache",
    [MOCK_ECC_DEVICE_MEMORY] = "device_memory",
    [MOCK_ECC_REGISTER_FILE] = "register_file",
    [MOCK_ECC_TEXTURE_MEMORY] = "texture_memory",
    [MOCK_ECC_TEXTURE_SHM] = "texture_shm",
    [MOCK_ECC_CBU] = "cbu",
    [MOCK_ECC_SRAM] = "sram",
};

/* Every counter asked of mock_ecc_count once (it spells the keys two ways
 * and formats them, too much for a polling loop's every call).  Its answer
 * is the snapshot's alone, an injected error included (node state). */
void mock_ecc_fill(const struct mock_config *cfg, unsigned pos, struct mock_ecc_counts *ecc)
{
    memset(ecc, 0, sizeof *ecc);
    ecc->resolved = 1;
    for (unsigned counter = 0; counter < NVML_ECC_COUNTER_TYPE_COUNT; counter++)
        for (unsigned type = 0; type < NVML_MEMORY_ERROR_TYPE_COUNT; type++)
            for (unsigned where = 0; where < MOCK_ECC_LOCATION_COUNT; where++)
                ecc->has_ecc = (unsigned char)mock_ecc_count(
                    cfg, pos, (nvmlMemoryErrorType_t)type, (nvmlEccCounterType_t)counter,
                    mock_ecc_location_names[where], &ecc->count[counter][type][where]);
}
