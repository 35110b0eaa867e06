/*
 * Frame buffer and BAR1 memory, ECC, retired pages and remapped rows.
 *
 * Memory figures come from the profile's `memory` block.  NVML has two
 * views of the same numbers: the old nvmlDeviceGetMemoryInfo counts the
 * driver's reservation as used, _v2 reports it separately; both are
 * derived here from one set of fields so they always agree.  The
 * processes using that memory are processes.c's.  A MIG device answers
 * for its GPU instance: its memory, its share of BAR1, no ECC errors yet.
 *
 * An injected uncorrectable ECC error (`ecc_uncorrectable`, failure.c) is
 * node state: the error counters of device memory count it, and the board
 * deals with it as its generation does, a Turing board by retiring the
 * page (a double-bit retirement, pending until the GPU resets), an Ampere
 * or later one by remapping the row (an uncorrectable remap, pending until
 * the reset, so the bank histogram does not move yet).  Every figure here
 * is a function of the config alone, so every process answers the same.
 */
#include <stdio.h>
#include <string.h>

#include "mock.h"

struct fb_usage {
    unsigned long long total, reserved, used, free;
};

/* A mock_reader: 0 when the profile has no memory size. */
static int fb_usage(const struct mock_config *cfg, unsigned pos, void *out)
{
    struct fb_usage *fb = out;
    memset(fb, 0, sizeof *fb);
    if (!mock_key_u64(cfg, pos, MOCK_KEY_MEMORY_TOTAL, &fb->total))
        return 0;
    mock_key_u64(cfg, pos, MOCK_KEY_MEMORY_RESERVED, &fb->reserved);
    mock_key_u64(cfg, pos, MOCK_KEY_MEMORY_USED, &fb->used);
    if (fb->reserved > fb->total)
        fb->reserved = fb->total;
    if (fb->used > fb->total - fb->reserved)
        fb->used = fb->total - fb->reserved;
    fb->free = fb->total - fb->reserved - fb->used;
    return 1;
}

/* The frame buffer of a GPU or of a MIG device: a MIG device has its GPU
 * instance's memory, all of it free (nothing runs in it). */
static nvmlReturn_t read_fb(nvmlDevice_t device, struct fb_usage *fb)
{
    struct mock_mig_info mig;
    nvmlReturn_t r;
    if (!mock_mig_info(device, &mig, &r))
        return mock_read(device, fb_usage, fb);
    if (r == NVML_SUCCESS)
        *fb = (struct fb_usage){.total = mig.memory_bytes, .free = mig.memory_bytes};
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fb_usage fb;
    nvmlReturn_t r = read_fb(device, &fb);
    if (r == NVML_SUCCESS) {
        /* The old view counts the driver's reservation as used. */
        memory->total = fb.total;
        memory->used = fb.used + fb.reserved;
        memory->free = fb.free;
    }
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    struct fb_usage fb;
    nvmlReturn_t r = read_fb(device, &fb);
    if (r == NVML_SUCCESS) {
        memory->total = fb.total;
        memory->reserved = fb.reserved;
        memory->used = fb.used;
        memory->free = fb.free;
    }
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1Memory)
{
    if (bar1Memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* A MIG device has its memory slices' share (of 8) of its GPU's BAR1. */
    struct mock_mig_info mig;
    nvmlReturn_t r;
    int is_mig = mock_mig_info(device, &mig, &r);
    if (is_mig) {
        if (r != NVML_SUCCESS)
            return r;
        device = mock_handle(mig.pos);
    }
    struct mock_call c;
    r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    unsigned long long total, used = 0;
    if (mock_dev_u64(c.cfg, c.pos, "bar1_memory.total_bytes", &total)) {
        if (is_mig) /* nothing is mapped in an instance: nothing runs there */
            total = total / 8 * mig.memory_slices;
        else
            mock_dev_u64(c.cfg, c.pos, "bar1_memory.used_bytes", &used);
        if (used > total)
            used = total;
        bar1Memory->bar1Total = total;
        bar1Memory->bar1Used = used;
        bar1Memory->bar1Free = total - used;
    } else {
        r = NVML_ERROR_NOT_SUPPORTED;
    }
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetConfComputeProtectedMemoryUsage(nvmlDevice_t device,
                                                                   nvmlMemory_t *memory)
{
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    /* Confidential computing is off on simulated GPUs: no protected region,
     * which is what a real board with CC off reports (0 MiB, not N/A). */
    if (mock_dev_get(c.cfg, c.pos, "memory.total_bytes") == NULL) {
        r = NVML_ERROR_NOT_SUPPORTED;
    } else {
        memory->total = 0;
        memory->used = 0;
        memory->free = 0;
    }
    mock_end(&c);
    return r;
}

/* --------------------------------------------------------------------- ECC */

MOCK_API nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current,
                                           nvmlEnableState_t *pending)
{
    if (current == NULL || pending == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    int on, pending_on;
    nvmlReturn_t r =
        mock_mode_pair(device, "ecc.mode_current", "ecc.mode_pending", &on, &pending_on);
    if (r == NVML_SUCCESS) {
        *current = mock_enable_state(on);
        *pending = mock_enable_state(pending_on);
    }
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetDefaultEccMode(nvmlDevice_t device,
                                                  nvmlEnableState_t *defaultMode)
{
    return mock_enable_field(device, MOCK_GUARDED, "ecc.default_mode", defaultMode);
}

/* Reads one ECC counter.  Profiles spell counters two ways, both accepted:
 *   ecc.errors.<volatile|aggregate>.<single_bit|double_bit>.<location>
 *   ecc.errors.<volatile|aggregate>.<sram|dram>_<correctable|uncorrectable>
 * (the second is how Hopper and later report them).  Device memory and the
 * totals include the error an `ecc_uncorrectable` injection adds.
 * Returns 0 when the board has no ECC at all. */
int mock_ecc_count(const struct mock_config *cfg, unsigned pos, nvmlMemoryErrorType_t type,
                   nvmlEccCounterType_t counter, const char *location, unsigned long long *out)
{
    const char *when = counter == NVML_VOLATILE_ECC ? "volatile" : "aggregate";
    int corrected = type == NVML_MEMORY_ERROR_TYPE_CORRECTED;
    const char *bits = corrected ? "single_bit" : "double_bit";
    const char *kind = corrected ? "correctable" : "uncorrectable";
    if (mock_dev_get(cfg, pos, "ecc.mode_current") == NULL)
        return 0;
    char field[128];
    unsigned long long value = 0, part;
    snprintf(field, sizeof field, "ecc.errors.%s.%s.%s", when, bits, location);
    if (!mock_dev_u64(cfg, pos, field, &value)) {
        int dram = strcmp(location, "device_memory") == 0 || strcmp(location, "total") == 0;
        int sram = strcmp(location, "sram") == 0 || strcmp(location, "total") == 0;
        value = 0;
        snprintf(field, sizeof field, "ecc.errors.%s.dram_%s", when, kind);
        if (dram && mock_dev_u64(cfg, pos, field, &part))
            value += part;
        snprintf(field, sizeof field, "ecc.errors.%s.sram_%s", when, kind);
        if (sram && mock_dev_u64(cfg, pos, field, &part))
            value += part;
    }
    if (!corrected && (strcmp(location, "device_memory") == 0 || strcmp(location, "total") == 0) &&
        mock_failure_ecc_injection(cfg, pos, NULL))
        value += MOCK_ECC_INJECTED_ERRORS;
    *out = value;
    return 1;
}

static int valid_ecc_args(nvmlMemoryErrorType_t type, nvmlEccCounterType_t counter)
{
    return (unsigned)type < NVML_MEMORY_ERROR_TYPE_COUNT &&
           (unsigned)counter < NVML_ECC_COUNTER_TYPE_COUNT;
}

/* One ECC counter in one guarded call, as resolved for the snapshot
 * (mock_ecc_counter); the caller validated the args. */
static nvmlReturn_t ecc_counter(nvmlDevice_t device, nvmlMemoryErrorType_t type,
                                nvmlEccCounterType_t counter, enum mock_ecc_location where,
                                unsigned long long *out)
{
    struct mock_mig_info mig;
    nvmlReturn_t r;
    if (mock_mig_info(device, &mig, &r)) {
        /* A MIG device counts its own errors since it was made: none. */
        if (r == NVML_SUCCESS)
            *out = 0;
        return r;
    }
    struct mock_call c;
    r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    if (!mock_ecc_counter(c.cfg, c.pos, type, counter, where, out))
        r = NVML_ERROR_NOT_SUPPORTED;
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device,
                                                  nvmlMemoryErrorType_t errorType,
                                                  nvmlEccCounterType_t counterType,
                                                  unsigned long long *eccCounts)
{
    if (eccCounts == NULL || !valid_ecc_args(errorType, counterType))
        return NVML_ERROR_INVALID_ARGUMENT;
    return ecc_counter(device, errorType, counterType, MOCK_ECC_TOTAL, eccCounts);
}

MOCK_API nvmlReturn_t nvmlDeviceGetDetailedEccErrors(nvmlDevice_t device,
                                                     nvmlMemoryErrorType_t errorType,
                                                     nvmlEccCounterType_t counterType,
                                                     nvmlEccErrorCounts_t *eccCounts)
{
    if (eccCounts == NULL || !valid_ecc_args(errorType, counterType))
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    if (!mock_ecc_count(c.cfg, c.pos, errorType, counterType, "l1_cache", &eccCounts->l1Cache) ||
        !mock_ecc_count(c.cfg, c.pos, errorType, counterType, "l2_cache", &eccCounts->l2Cache) ||
        !mock_ecc_count(c.cfg, c.pos, errorType, counterType, "device_memory",
                        &eccCounts->deviceMemory) ||
        !mock_ecc_count(c.cfg, c.pos, errorType, counterType, "register_file",
                        &eccCounts->registerFile))
        r = NVML_ERROR_NOT_SUPPORTED;
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t device,
                                                      nvmlMemoryErrorType_t errorType,
                                                      nvmlEccCounterType_t counterType,
                                                      nvmlMemoryLocation_t locationType,
                                                      unsigned long long *count)
{
    static const enum mock_ecc_location locations[] = {
        [NVML_MEMORY_LOCATION_L1_CACHE] = MOCK_ECC_L1_CACHE,
        [NVML_MEMORY_LOCATION_L2_CACHE] = MOCK_ECC_L2_CACHE,
        [NVML_MEMORY_LOCATION_DEVICE_MEMORY] = MOCK_ECC_DEVICE_MEMORY,
        [NVML_MEMORY_LOCATION_REGISTER_FILE] = MOCK_ECC_REGISTER_FILE,
        [NVML_MEMORY_LOCATION_TEXTURE_MEMORY] = MOCK_ECC_TEXTURE_MEMORY,
        [NVML_MEMORY_LOCATION_TEXTURE_SHM] = MOCK_ECC_TEXTURE_SHM,
        [NVML_MEMORY_LOCATION_CBU] = MOCK_ECC_CBU,
        [NVML_MEMORY_LOCATION_SRAM] = MOCK_ECC_SRAM,
    };
    if (count == NULL || !valid_ecc_args(errorType, counterType) ||
        (unsigned)locationType >= MOCK_COUNT(locations))
        return NVML_ERROR_INVALID_ARGUMENT;
    return ecc_counter(device, errorType, counterType, locations[locationType], count);
}

MOCK_API nvmlReturn_t nvmlDeviceGetSramEccErrorStatus(nvmlDevice_t device,
                                                      nvmlEccSramErrorStatus_t *status)
{
    if (status == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (status->version != nvmlEccSramErrorStatus_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    const nvmlMemoryErrorType_t cor = NVML_MEMORY_ERROR_TYPE_CORRECTED;
    const nvmlMemoryErrorType_t unc = NVML_MEMORY_ERROR_TYPE_UNCORRECTED;
    memset((char *)status + sizeof status->version, 0, sizeof *status - sizeof status->version);
    /* SRAM uncorrectable errors are SEC-DED detections on these boards. */
    if (!mock_ecc_count(c.cfg, c.pos, cor, NVML_VOLATILE_ECC, "sram", &status->volatileCor) ||
        !mock_ecc_count(c.cfg, c.pos, unc, NVML_VOLATILE_ECC, "sram", &status->volatileUncSecDed) ||
        !mock_ecc_count(c.cfg, c.pos, cor, NVML_AGGREGATE_ECC, "sram", &status->aggregateCor) ||
        !mock_ecc_count(c.cfg, c.pos, unc, NVML_AGGREGATE_ECC, "sram", &status->aggregateUncSecDed))
        r = NVML_ERROR_NOT_SUPPORTED;
    mock_end(&c);
    return r;
}

/* ------------------------------------------------- retired pages, row remap */

/* Whether the board retires pages (it lists its double-bit retirements):
 * an injected error then retires one, which *page (optional) names, a page
 * of its memory drawn from the injection's id. */
static int injected_retirement(const struct mock_config *cfg, unsigned pos,
                               unsigned long long *page)
{
    unsigned long long id, total = 0;
    unsigned count;
    if (!mock_failure_ecc_injection(cfg, pos, &id) ||
        (!mock_dev_list_len(cfg, pos, "retired_pages.double_bit_retirement.addresses", &count) &&
         !mock_dev_uint(cfg, pos, "retired_pages.double_bit_retirement.count", &count)))
        return 0;
    if (page != NULL) {
        unsigned long long pages = mock_dev_u64(cfg, pos, "memory.total_bytes", &total)
                                       ? total >> 12 : 0;
        *page = pages ? id % pages : id & 0xFFFFF; /* a 4 KiB page's number */
    }
    return 1;
}

static nvmlReturn_t retired_pages(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                  unsigned int *pageCount, unsigned long long *addresses,
                                  unsigned long long *timestamps)
{
    if (pageCount == NULL || (unsigned)cause >= NVML_PAGE_RETIREMENT_CAUSE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    const char *block = cause == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
                            ? "retired_pages.double_bit_retirement"
                            : "retired_pages.single_bit_retirement";
    char field[128];
    unsigned count;
    snprintf(field, sizeof field, "%s.addresses", block);
    if (!mock_dev_list_len(c.cfg, c.pos, field, &count)) {
        snprintf(field, sizeof field, "%s.count", block);
        if (!mock_dev_uint(c.cfg, c.pos, field, &count)) {
            mock_end(&c);
            return NVML_ERROR_NOT_SUPPORTED;
        }
        count = 0; /* a count without addresses lists no pages */
    }
    unsigned long long injected_page;
    int injected = cause == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR &&
                   injected_retirement(c.cfg, c.pos, &injected_page);
    unsigned total = count + (injected ? 1 : 0); /* the injected page comes last */
    unsigned room = mock_list_room(addresses, pageCount);
    for (unsigned i = 0; i < total && i < room; i++) {
        unsigned long long address = injected_page;
        if (i < count) {
            address = 0;
            snprintf(field, sizeof field, "%s.addresses.%u", block, i);
            mock_dev_u64(c.cfg, c.pos, field, &address);
        }
        addresses[i] = address;
        if (timestamps != NULL)
            timestamps[i] = 0;
    }
    r = mock_list_result(addresses, pageCount, total);
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device,
                                                nvmlPageRetirementCause_t cause,
                                                unsigned int *pageCount,
                                                unsigned long long *addresses)
{
    return retired_pages(device, cause, pageCount, addresses, NULL);
}

MOCK_API nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device,
                                                   nvmlPageRetirementCause_t cause,
                                                   unsigned int *pageCount,
                                                   unsigned long long *addresses,
                                                   unsigned long long *timestamps)
{
    return retired_pages(device, cause, pageCount, addresses, timestamps);
}

MOCK_API nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device,
                                                             nvmlEnableState_t *isPending)
{
    if (isPending == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    int pending = 0;
    if (!mock_dev_bool(c.cfg, c.pos, "retired_pages.pending_retirement", &pending))
        r = NVML_ERROR_NOT_SUPPORTED;
    else /* an injected error's page retires when the GPU resets */
        *isPending = mock_enable_state(pending || injected_retirement(c.cfg, c.pos, NULL));
    mock_end(&c);
    return r;
}

int mock_remapped_rows(const struct mock_config *cfg, unsigned pos,
                       struct mock_remapped_rows *out)
{
    int pending = 0, failed = 0;
    unsigned correctable;
    if (!mock_dev_uint(cfg, pos, "remapped_rows.correctable", &correctable))
        return 0;
    out->correctable = correctable;
    out->uncorrectable = 0;
    mock_dev_uint(cfg, pos, "remapped_rows.uncorrectable", &out->uncorrectable);
    mock_dev_bool(cfg, pos, "remapped_rows.pending", &pending);
    mock_dev_bool(cfg, pos, "remapped_rows.failure_occurred", &failed);
    if (mock_failure_ecc_injection(cfg, pos, NULL)) {
        /* the injected error's row, remapped when the GPU resets */
        out->uncorrectable += MOCK_ECC_INJECTED_ERRORS;
        pending = 1;
    }
    out->pending = (unsigned)pending;
    out->failure_occurred = (unsigned)failed;
    return 1;
}

static int read_remapped_rows(const struct mock_config *cfg, unsigned pos, void *out)
{
    return mock_board_remapped_rows(cfg, pos, out); /* resolved once per snapshot */
}

MOCK_API nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                                unsigned int *uncRows, unsigned int *isPending,
                                                unsigned int *failureOccurred)
{
    if (corrRows == NULL || uncRows == NULL || isPending == NULL || failureOccurred == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_remapped_rows rows;
    nvmlReturn_t r = mock_read(device, read_remapped_rows, &rows);
    if (r == NVML_SUCCESS) {
        *corrRows = rows.correctable;
        *uncRows = rows.uncorrectable;
        *isPending = rows.pending;
        *failureOccurred = rows.failure_occurred;
    }
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetRowRemapperHistogram(nvmlDevice_t device,
                                                        nvmlRowRemapperHistogramValues_t *values)
{
    if (values == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    memset(values, 0, sizeof *values);
    if (!mock_dev_uint(c.cfg, c.pos, "remapped_rows.availability_histogram.max", &values->max)) {
        r = NVML_ERROR_NOT_SUPPORTED;
    } else {
        mock_dev_uint(c.cfg, c.pos, "remapped_rows.availability_histogram.high", &values->high);
        mock_dev_uint(c.cfg, c.pos, "remapped_rows.availability_histogram.partial",
                      &values->partial);
        mock_dev_uint(c.cfg, c.pos, "remapped_rows.availability_histogram.low", &values->low);
        mock_dev_uint(c.cfg, c.pos, "remapped_rows.availability_histogram.none", &values->none);
    }
    mock_end(&c);
    return r;
}
