/*
 * One NVML call on one device, and the whole getters built on it.
 *
 * Every per-device call is a mock_begin/mock_end pair: the snapshot is
 * acquired, the handle validated and failure injection applied once, in
 * mock_begin, so no getter can forget a step.  Most getters answer a
 * single profile field; the typed getters here (mock_uint_field,
 * mock_enum_field, ...) own that whole pattern, so each exported function
 * names only the field it reads and a fix to the pattern lands everywhere.
 * They all run through read_call, the one place a call is begun and ended
 * around a read.  NVML's caller-sized array contract lives here too, for
 * the same reason.
 */
#include "mock.h"

/* Runs `read` under one call; its 0 (the profile lacks the values) is
 * NOT_SUPPORTED.  Only `read` writes, and it leaves a caller's output
 * untouched when it returns 0, so a failed call changes nothing, as
 * NVML's do. */
__attribute__((always_inline)) static inline nvmlReturn_t
read_call(nvmlDevice_t device, enum mock_guard guard, mock_reader read, void *arg)
{
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, guard);
    if (r != NVML_SUCCESS)
        return r;
    if (!read(c.cfg, c.pos, arg))
        r = NVML_ERROR_NOT_SUPPORTED;
    mock_end(&c);
    return r;
}

nvmlReturn_t mock_read(nvmlDevice_t device, mock_reader read, void *out)
{
    return read_call(device, MOCK_GUARDED, read, out);
}

/* ------------------------------------------------------ one-field getters */

/* What a typed getter reads and where the answer goes; each reader below
 * uses the members its type needs. */
struct field_read {
    const char *field;
    enum mock_key key; /* the *_key getters */
    void *out;
    const struct mock_enum_name *table; /* enums */
    size_t count;
    long long fallback;
    unsigned long long value; /* constants */
};

static int read_uint(const struct mock_config *cfg, unsigned pos, void *arg)
{
    const struct field_read *f = arg;
    return mock_dev_uint(cfg, pos, f->field, f->out);
}

static int read_u64(const struct mock_config *cfg, unsigned pos, void *arg)
{
    const struct field_read *f = arg;
    return mock_dev_u64(cfg, pos, f->field, f->out);
}

static int read_int(const struct mock_config *cfg, unsigned pos, void *arg)
{
    const struct field_read *f = arg;
    return mock_dev_int(cfg, pos, f->field, f->out);
}

static int read_uint_key(const struct mock_config *cfg, unsigned pos, void *arg)
{
    const struct field_read *f = arg;
    return mock_key_uint(cfg, pos, f->key, f->out);
}

static int read_int_key(const struct mock_config *cfg, unsigned pos, void *arg)
{
    const struct field_read *f = arg;
    return mock_key_int(cfg, pos, f->key, f->out);
}

static int read_enable(const struct mock_config *cfg, unsigned pos, void *arg)
{
    const struct field_read *f = arg;
    int on;
    if (!mock_dev_bool(cfg, pos, f->field, &on))
        return 0;
    *(nvmlEnableState_t *)f->out = mock_enable_state(on);
    return 1;
}

static int read_enum(const struct mock_config *cfg, unsigned pos, void *arg)
{
    const struct field_read *f = arg;
    unsigned value;
    if (mock_enum_lookup(mock_dev_get(cfg, pos, f->field), f->table, f->count, &value))
        *(unsigned *)f->out = value;
    else if (f->fallback != MOCK_ENUM_REQUIRED)
        *(unsigned *)f->out = (unsigned)f->fallback;
    else
        return 0;
    return 1;
}

static int read_constant_uint(const struct mock_config *cfg, unsigned pos, void *arg)
{
    (void)cfg;
    (void)pos;
    const struct field_read *f = arg;
    *(unsigned *)f->out = (unsigned)f->value;
    return 1;
}

static int read_constant_u64(const struct mock_config *cfg, unsigned pos, void *arg)
{
    (void)cfg;
    (void)pos;
    const struct field_read *f = arg;
    *(unsigned long long *)f->out = f->value;
    return 1;
}

/* The shared front of the typed getters: NVML rejects a NULL output
 * before it looks at the handle. */
__attribute__((always_inline)) static inline nvmlReturn_t
typed_call(nvmlDevice_t device, enum mock_guard guard, mock_reader read, struct field_read *f)
{
    if (f->out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return read_call(device, guard, read, f);
}

nvmlReturn_t mock_uint_field(nvmlDevice_t device, enum mock_guard guard, const char *field,
                             unsigned int *out)
{
    return typed_call(device, guard, read_uint, &(struct field_read){.field = field, .out = out});
}

nvmlReturn_t mock_u64_field(nvmlDevice_t device, enum mock_guard guard, const char *field,
                            unsigned long long *out)
{
    return typed_call(device, guard, read_u64, &(struct field_read){.field = field, .out = out});
}

nvmlReturn_t mock_int_field(nvmlDevice_t device, enum mock_guard guard, const char *field,
                            int *out)
{
    return typed_call(device, guard, read_int, &(struct field_read){.field = field, .out = out});
}

nvmlReturn_t mock_uint_key(nvmlDevice_t device, enum mock_guard guard, enum mock_key key,
                           unsigned int *out)
{
    return typed_call(device, guard, read_uint_key, &(struct field_read){.key = key, .out = out});
}

nvmlReturn_t mock_int_key(nvmlDevice_t device, enum mock_guard guard, enum mock_key key, int *out)
{
    return typed_call(device, guard, read_int_key, &(struct field_read){.key = key, .out = out});
}

nvmlReturn_t mock_enable_field(nvmlDevice_t device, enum mock_guard guard, const char *field,
                               nvmlEnableState_t *out)
{
    return typed_call(device, guard, read_enable,
                      &(struct field_read){.field = field, .out = out});
}

nvmlReturn_t mock_enable_field_removable(nvmlDevice_t device, enum mock_deprecated_call removed,
                                         const char *field, nvmlEnableState_t *out)
{
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin_unless_deprecated(&c, device, MOCK_GUARDED, removed);
    if (r != NVML_SUCCESS)
        return r;
    if (!read_enable(c.cfg, c.pos, &(struct field_read){.field = field, .out = out}))
        r = NVML_ERROR_NOT_SUPPORTED;
    mock_end(&c);
    return r;
}

nvmlReturn_t mock_enum_field(nvmlDevice_t device, enum mock_guard guard, const char *field,
                             const struct mock_enum_name *table, size_t n, long long fallback,
                             unsigned *out)
{
    struct field_read f = {
        .field = field, .out = out, .table = table, .count = n, .fallback = fallback};
    return typed_call(device, guard, read_enum, &f);
}

nvmlReturn_t mock_constant_uint(nvmlDevice_t device, enum mock_guard guard, unsigned value,
                                unsigned int *out)
{
    return typed_call(device, guard, read_constant_uint,
                      &(struct field_read){.out = out, .value = value});
}

nvmlReturn_t mock_constant_u64(nvmlDevice_t device, enum mock_guard guard,
                               unsigned long long value, unsigned long long *out)
{
    return typed_call(device, guard, read_constant_u64,
                      &(struct field_read){.out = out, .value = value});
}

/* The string getters' one call: `key` names the field, else `field`.  Not
 * a reader: the copy has its own errors (INSUFFICIENT_SIZE), and it checks
 * buf only after the handle, as the string getters always have. */
static nvmlReturn_t string_call(nvmlDevice_t device, enum mock_guard guard, const char *field,
                                enum mock_key key, char *buf, unsigned int length)
{
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, guard);
    if (r != NVML_SUCCESS)
        return r;
    const char *value = field != NULL           ? mock_dev_get(c.cfg, c.pos, field)
                        : key < MOCK_KEY_COUNT ? mock_key_value(c.cfg, c.pos, key)->text
                                               : NULL;
    r = mock_copy_out(value, buf, length);
    mock_end(&c);
    return r;
}

nvmlReturn_t mock_string_field(nvmlDevice_t device, enum mock_guard guard, const char *field,
                               char *buf, unsigned int length)
{
    return string_call(device, guard, field, MOCK_KEY_COUNT, buf, length);
}

nvmlReturn_t mock_string_key(nvmlDevice_t device, enum mock_guard guard, enum mock_key key,
                             char *buf, unsigned int length)
{
    return string_call(device, guard, NULL, key, buf, length);
}

/* A current/pending pair: the fields to read and the two answers. */
struct mode_pair {
    const char *current_field, *pending_field;
    int *current, *pending;
};

static int read_mode_pair(const struct mock_config *cfg, unsigned pos, void *arg)
{
    const struct mode_pair *m = arg;
    if (!mock_dev_bool(cfg, pos, m->current_field, m->current))
        return 0;
    if (!mock_dev_bool(cfg, pos, m->pending_field, m->pending))
        *m->pending = *m->current;
    return 1;
}

nvmlReturn_t mock_mode_pair(nvmlDevice_t device, const char *current_field,
                            const char *pending_field, int *current, int *pending)
{
    struct mode_pair m = {current_field, pending_field, current, pending};
    return read_call(device, MOCK_GUARDED, read_mode_pair, &m);
}

/* ------------------------------------------------------ caller-sized arrays */

unsigned mock_list_room(const void *array, const unsigned int *count)
{
    return array == NULL ? 0 : *count;
}

nvmlReturn_t mock_list_result(const void *array, unsigned int *count, unsigned total)
{
    /* A size query (room 0) succeeds whatever the total. */
    unsigned room = mock_list_room(array, count);
    *count = total;
    return room > 0 && total > room ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}
