/*
 * The performance states a board has and the clock range of each
 * (nvmlDeviceGetSupportedPerformanceStates, nvmlDeviceGetMinMaxClockOfPState).
 *
 * A data center board runs in P0 while it works and drops to P8 when idle
 * (the Tesla T4's familiar "P8 9W / 70W"; the P40 lists the same two
 * states, one per memory clock); a state the profile or an override names
 * for the idle board (`performance_state`, `mokka ctl pstate`) is listed
 * too, so nvmlDeviceGetPerformanceState never answers a state this list
 * lacks.  A performance state is a memory clock: P0 runs the board's
 * highest memory clock of the supported clocks table, a lower state its
 * lowest, and the graphics (and SM) clock moves within the graphics clocks
 * that memory clock supports; the video clock between the profile's idle
 * (`clocks.video_current`) and maximum figures.  Apart from power.c, which
 * answers the state the board is in, and clocks.c, which answers the
 * clocks themselves.
 */
#include <stdio.h>

#include "mock.h"

/* The states every simulated board has: busy and idle. */
#define BUSY_PSTATE NVML_PSTATE_0
#define IDLE_PSTATE NVML_PSTATE_8

/* The device's states as a bit set (bit n: Pn). */
static unsigned state_set(const struct mock_config *cfg, unsigned pos)
{
    static const enum mock_key idle_keys[] = {MOCK_KEY_PINNED_PERFORMANCE_STATE,
                                              MOCK_KEY_PERFORMANCE_STATE};
    unsigned set = 1u << BUSY_PSTATE | 1u << IDLE_PSTATE;
    for (size_t i = 0; i < MOCK_COUNT(idle_keys); i++) {
        unsigned state = mock_parse_pstate(mock_key_value(cfg, pos, idle_keys[i])->text);
        if (state != NVML_PSTATE_UNKNOWN)
            set |= 1u << state;
    }
    return set;
}

MOCK_API nvmlReturn_t nvmlDeviceGetSupportedPerformanceStates(nvmlDevice_t device,
                                                              nvmlPstates_t *pstates,
                                                              unsigned int size)
{
    if (pstates == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    unsigned set = state_set(c.cfg, c.pos);
    /* `size` is in bytes; the list never exceeds NVML_MAX_GPU_PERF_PSTATES */
    unsigned room = size / sizeof *pstates;
    if (room > NVML_MAX_GPU_PERF_PSTATES)
        room = NVML_MAX_GPU_PERF_PSTATES;
    if ((unsigned)__builtin_popcount(set) > room) {
        r = NVML_ERROR_INSUFFICIENT_SIZE;
    } else {
        /* highest performance first, the unused entries NVML_PSTATE_UNKNOWN */
        unsigned n = 0;
        for (unsigned state = 0; state <= NVML_PSTATE_15; state++)
            if (set & (1u << state))
                pstates[n++] = (nvmlPstates_t)state;
        while (n < room)
            pstates[n++] = NVML_PSTATE_UNKNOWN;
    }
    mock_end(&c);
    return r;
}

/* The supported clocks table's entry a state runs at: the highest memory
 * clock for P0, the lowest for any other state; -1 without a table. */
static int memory_entry(const struct mock_config *cfg, unsigned pos, unsigned state,
                        unsigned *freq)
{
    unsigned n = 0;
    int best = -1;
    mock_dev_list_len(cfg, pos, "supported_clocks.memory_clocks", &n);
    for (unsigned i = 0; i < n; i++) {
        char field[96];
        unsigned f;
        snprintf(field, sizeof field, "supported_clocks.memory_clocks.%u.freq_mhz", i);
        if (!mock_dev_uint(cfg, pos, field, &f))
            continue;
        if (best < 0 || (state == BUSY_PSTATE ? f > *freq : f < *freq)) {
            best = (int)i;
            *freq = f;
        }
    }
    return best;
}

/* The lowest and highest graphics clock of a memory clock's entry. */
static int graphics_range(const struct mock_config *cfg, unsigned pos, int entry, unsigned *lo,
                          unsigned *hi)
{
    char base[96];
    unsigned n = 0;
    snprintf(base, sizeof base, "supported_clocks.memory_clocks.%d.graphics_clocks", entry);
    if (entry < 0 || !mock_dev_list_len(cfg, pos, base, &n) || n == 0)
        return 0;
    *lo = ~0u;
    *hi = 0;
    for (unsigned i = 0; i < n; i++) {
        char field[128];
        unsigned f;
        snprintf(field, sizeof field, "%s.%u", base, i);
        if (!mock_dev_uint(cfg, pos, field, &f))
            continue;
        if (f < *lo)
            *lo = f;
        if (f > *hi)
            *hi = f;
    }
    return *hi != 0;
}

/* The range of one clock in one state: 1 with *lo and *hi, 0 when the
 * profile lacks the figures. */
static int clock_range(const struct mock_config *cfg, unsigned pos, nvmlClockType_t type,
                       unsigned state, unsigned *lo, unsigned *hi)
{
    unsigned memory = 0;
    int entry = memory_entry(cfg, pos, state, &memory);
    switch (type) {
    case NVML_CLOCK_GRAPHICS:
    case NVML_CLOCK_SM: /* one clock domain with graphics on these boards */
        return graphics_range(cfg, pos, entry, lo, hi);
    case NVML_CLOCK_MEM:
        *lo = *hi = memory;
        return entry >= 0;
    case NVML_CLOCK_VIDEO:
        return mock_dev_uint(cfg, pos, "clocks.video_current", lo) &&
               mock_dev_uint(cfg, pos, "clocks.video_max", hi) && *lo <= *hi;
    default: return 0;
    }
}

MOCK_API nvmlReturn_t nvmlDeviceGetMinMaxClockOfPState(nvmlDevice_t device, nvmlClockType_t type,
                                                       nvmlPstates_t pstate,
                                                       unsigned int *minClockMHz,
                                                       unsigned int *maxClockMHz)
{
    if ((minClockMHz == NULL && maxClockMHz == NULL) || (unsigned)type >= NVML_CLOCK_COUNT ||
        (unsigned)pstate > NVML_PSTATE_15)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    unsigned lo, hi;
    if (!(state_set(c.cfg, c.pos) & (1u << pstate)) ||
        !clock_range(c.cfg, c.pos, type, (unsigned)pstate, &lo, &hi)) {
        r = NVML_ERROR_NOT_SUPPORTED; /* a state the board does not have */
    } else {
        if (minClockMHz != NULL)
            *minClockMHz = lo;
        if (maxClockMHz != NULL)
            *maxClockMHz = hi;
    }
    mock_end(&c);
    return r;
}
