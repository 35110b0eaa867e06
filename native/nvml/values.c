/*
 * What a config value means: numbers, booleans and enum words, the typed
 * lookups of a device field built on them, and NVML's string copy-out.
 *
 * Typed lookups of a moving quantity answer its reading (readings.c), so
 * every getter that asks for a field by name sees the board as it is now.
 * Apart from the parser (config.c) and the lookups (lookup.c) because the
 * rules for a value (no blanks, no sign on an unsigned number, no "nan")
 * are one concern that every getter depends on, whatever found the value.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "mock.h"

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
    if (mock_reading_field(cfg, pos, field, &reading))
        return mock_reading_u64(reading, out);
    return mock_parse_u64(mock_dev_get(cfg, pos, field), out);
}

int mock_dev_raw_u64(const struct mock_config *cfg, unsigned pos, const char *field,
                     unsigned long long *out)
{
    return mock_parse_u64(mock_dev_get(cfg, pos, field), out);
}

int mock_dev_uint(const struct mock_config *cfg, unsigned pos, const char *field, unsigned *out)
{
    unsigned long long v = 0;
    int ok = mock_dev_u64(cfg, pos, field, &v); /* before v is read */
    return mock_narrow_uint(ok, v, out);
}

int mock_dev_int(const struct mock_config *cfg, unsigned pos, const char *field, int *out)
{
    long long v = 0;
    if (mock_reading_field(cfg, pos, field, &v)) {
        *out = (int)v; /* readings are small: temperatures */
        return 1;
    }
    int ok = mock_parse_i64(mock_dev_get(cfg, pos, field), &v); /* before v is read */
    return mock_narrow_int(ok, v, out);
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

void mock_truncate_copy(const char *value, char *buf, unsigned int length)
{
    if (buf == NULL || length == 0)
        return;
    size_t len = strlen(value);
    if (len >= length) {
        len = length - 1;
        /* back off to a character's first byte, so no sequence is cut */
        while (len > 0 && ((unsigned char)value[len] & 0xc0) == 0x80)
            len--;
    }
    memcpy(buf, value, len);
    buf[len] = '\0';
}

nvmlReturn_t mock_uint_figure(nvmlDevice_t device, enum mock_guard guard, enum mock_figure figure,
                              unsigned int *out)
{
    /* mock_uint_field's contract: a NULL output first, then the handle */
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, guard);
    if (r != NVML_SUCCESS)
        return r;
    unsigned long long v = 0;
    int ok = mock_figure_u64(c.cfg, c.pos, figure, &v); /* before v is read */
    if (!mock_narrow_uint(ok, v, out))
        r = NVML_ERROR_NOT_SUPPORTED;
    mock_end(&c);
    return r;
}
