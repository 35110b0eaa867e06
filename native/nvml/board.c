/*
 * The board: everything a device's readings derive from that the engine
 * config holds, resolved once per config snapshot and device (struct
 * mock_board, dynamics.h), and the per-snapshot records the polling
 * getters read from it (PCI record, figures, ECC counters, remapped rows,
 * links).
 *
 * Apart from the formula (dynamics.c) because resolving is looking up keys
 * once per snapshot, while the formula runs per clock tick on what this
 * file resolved: a change to which profile fields a board reads touches
 * only this file, a change to how readings move only the other.  The
 * tables of profile fields (pins, figures, clocks event reasons) live here
 * with the lookups that read them.
 */
#include <stdio.h>
#include <stdlib.h>

#include "dynamics.h"

/* The clocks event reasons, by profile field (declared in dynamics.h: the
 * readings as fields, readings.c, look them up too). */
const struct mock_reason_field mock_reason_fields[] = {
    {"clocks_throttle_reasons.gpu_idle", nvmlClocksEventReasonGpuIdle},
    {"clocks_throttle_reasons.applications_clocks_setting",
     nvmlClocksEventReasonApplicationsClocksSetting},
    {"clocks_throttle_reasons.sw_power_cap", nvmlClocksEventReasonSwPowerCap},
    {"clocks_throttle_reasons.hw_slowdown", nvmlClocksThrottleReasonHwSlowdown},
    {"clocks_throttle_reasons.sync_boost", nvmlClocksEventReasonSyncBoost},
    {"clocks_throttle_reasons.sw_thermal_slowdown", nvmlClocksEventReasonSwThermalSlowdown},
    {"clocks_throttle_reasons.hw_thermal_slowdown", nvmlClocksThrottleReasonHwThermalSlowdown},
    {"clocks_throttle_reasons.hw_power_brake_slowdown",
     nvmlClocksThrottleReasonHwPowerBrakeSlowdown},
    {"clocks_throttle_reasons.display_clocks_setting", nvmlClocksEventReasonDisplayClockSetting},
};

static const struct {
    const char *field;
    enum pin pin;
} PINS[] = {
    {"utilization.gpu", PIN_UTIL},
    {"utilization.memory", PIN_UTIL_MEMORY},
    {"memory.used_bytes", PIN_MEMORY},
    {"power.current_draw_mw", PIN_POWER},
    {"thermal.temperature_gpu_c", PIN_TEMPERATURE},
    {"clocks.sm_current", PIN_CLOCK},
    {"clocks.graphics_current", PIN_CLOCK},
    {"thermal.temperature_memory_c", PIN_MEMORY_TEMPERATURE},
    {"pcie.tx_throughput_kbps", PIN_PCIE_TX},
    {"pcie.rx_throughput_kbps", PIN_PCIE_RX},
    {"fan.speed_percent", PIN_FAN},
};

/* The figures of enum mock_figure, by profile field; `signature`: the idle
 * signature moves it (readings.c's quantities the signature alone moves),
 * so under the signature it is read as a reading. */
static const struct {
    const char *field;
    int signature;
} FIGURES[MOCK_FIGURE_COUNT] = {
    [MOCK_FIGURE_POWER_ENFORCED_LIMIT] = {"power.enforced_limit_mw", 0},
    [MOCK_FIGURE_POWER_MIN_LIMIT] = {"power.min_limit_mw", 0},
    [MOCK_FIGURE_POWER_MAX_LIMIT] = {"power.max_limit_mw", 0},
    [MOCK_FIGURE_POWER_DEFAULT_LIMIT] = {"power.default_limit_mw", 0},
    [MOCK_FIGURE_MODULE_DRAW] = {"module_power.current_draw_mw", 0},
    [MOCK_FIGURE_MODULE_ENFORCED_LIMIT] = {"module_power.enforced_limit_mw", 0},
    [MOCK_FIGURE_MODULE_MIN_LIMIT] = {"module_power.min_limit_mw", 0},
    [MOCK_FIGURE_MODULE_MAX_LIMIT] = {"module_power.max_limit_mw", 0},
    [MOCK_FIGURE_MODULE_DEFAULT_LIMIT] = {"module_power.default_limit_mw", 0},
    [MOCK_FIGURE_MEMORY_TEMPERATURE] = {"thermal.temperature_memory_c", 1},
    [MOCK_FIGURE_PCIE_TX] = {"pcie.tx_throughput_kbps", 1},
    [MOCK_FIGURE_PCIE_RX] = {"pcie.rx_throughput_kbps", 1},
};

void mock_board_free(struct mock_board *board)
{
    if (board != NULL)
        free(board->clocks);
    free(board);
}

static int pinned(const struct mock_config *cfg, unsigned pos, const char *field)
{
    char key[128];
    int on = 0;
    snprintf(key, sizeof key, "pinned.%s", field);
    return mock_parse_bool(mock_dev_get(cfg, pos, key), &on) && on;
}

static void resolve(const struct mock_config *cfg, unsigned pos, struct mock_board *b)
{
    b->dynamic = mock_pattern_of(cfg, pos, "utilization", &b->p_util) |
                 mock_pattern_of(cfg, pos, "memory", &b->p_memory) |
                 mock_pattern_of(cfg, pos, "power", &b->p_power) |
                 mock_pattern_of(cfg, pos, "temperature", &b->p_temperature) |
                 mock_pattern_of(cfg, pos, "clocks", &b->p_clocks);
    b->util = mock_dev_double_or(cfg, pos, "utilization.gpu", 0);
    b->util_memory = mock_dev_double_or(cfg, pos, "utilization.memory", 0);
    b->total = mock_dev_double_or(cfg, pos, "memory.total_bytes", 0);
    b->usable = b->total - mock_dev_double_or(cfg, pos, "memory.reserved_bytes", 0);
    b->used = mock_dev_double_or(cfg, pos, "memory.used_bytes", 0);
    b->power = mock_dev_double_or(cfg, pos, "power.current_draw_mw", 0);
    b->has_limit = mock_dev_double(cfg, pos, "power.enforced_limit_mw", &b->limit) ||
                   mock_dev_double(cfg, pos, "power.max_limit_mw", &b->limit);
    b->temperature = mock_dev_double_or(cfg, pos, "thermal.temperature_gpu_c", 0);
    b->has_slowdown = mock_dev_double(cfg, pos, "thermal.slowdown_threshold_c", &b->slowdown);
    b->has_shutdown = mock_dev_double(cfg, pos, "thermal.shutdown_threshold_c", &b->shutdown);
    b->has_gpu_max = mock_dev_double(cfg, pos, "thermal.max_operating_c", &b->gpu_max);
    b->has_tlimit = mock_parse_i64(mock_dev_get(cfg, pos, "thermal.tlimit_c"), &b->tlimit);
    if (!mock_dev_double(cfg, pos, "clocks.sm_current", &b->clock))
        b->clock = mock_dev_double_or(cfg, pos, "clocks.graphics_current", 0);
    if (!mock_dev_double(cfg, pos, "clocks.sm_max", &b->clock_max))
        b->clock_max = mock_dev_double_or(cfg, pos, "clocks.graphics_max", b->clock);
    b->step = mock_dev_double_or(cfg, pos, "dynamics.step_s", 1);
    if (!(b->step > 0))
        b->step = 1;
    for (size_t i = 0; i < MOCK_COUNT(PINS); i++)
        if (pinned(cfg, pos, PINS[i].field))
            b->pins |= PINS[i].pin;
    for (size_t i = 0; i < MOCK_COUNT(mock_reason_fields); i++) {
        int on = 0;
        if (pinned(cfg, pos, mock_reason_fields[i].field))
            b->pinned_reasons |= mock_reason_fields[i].bit;
        if (mock_parse_bool(mock_dev_get(cfg, pos, mock_reason_fields[i].field), &on) && on)
            b->profile_reasons |= mock_reason_fields[i].bit;
    }
    /* `mokka ctl pstate` sets both states; the power state's block marks it */
    b->pstate_pinned = pinned(cfg, pos, "performance_state") ||
                       pinned(cfg, pos, "power.power_state");
    b->has_energy =
        mock_dev_double(cfg, pos, "power.total_energy_consumption_mj", &b->energy_base);

    unsigned n = 0;
    mock_dev_list_len(cfg, pos, "supported_clocks.memory_clocks.0.graphics_clocks", &n);
    b->clocks = n ? calloc(n, sizeof *b->clocks) : NULL;
    for (unsigned i = 0; b->clocks != NULL && i < n; i++) {
        char field[96];
        snprintf(field, sizeof field, "supported_clocks.memory_clocks.0.graphics_clocks.%u", i);
        if (mock_dev_double(cfg, pos, field, &b->clocks[b->clock_count]))
            b->clock_count++;
    }
    /* where a power or thermal limit holds the clocks: well below boost */
    b->throttle_clock = mock_snap_clock(b, 0.85 * b->clock_max);
    b->base_power = b->power;
    b->base_temperature = b->temperature;
    mock_idle_resolve(cfg, pos, b);
    mock_pci_fill(cfg, pos, &b->pci);
    for (unsigned f = 0; f < MOCK_FIGURE_COUNT; f++)
        b->figures[f].has_u64 =
            (unsigned char)mock_dev_raw_u64(cfg, pos, FIGURES[f].field, &b->figures[f].u64);
    mock_ecc_fill(cfg, pos, &b->ecc);
    b->has_rows = mock_remapped_rows(cfg, pos, &b->rows);
    mock_nvlink_fill(cfg, pos, &b->nvlink);
}

/* The first reader of a snapshot resolves a device's board (board_of in
 * dynamics.h); a racing second reader's copy is dropped. */
const struct mock_board *mock_first_board(const struct mock_config *cfg, unsigned pos)
{
    struct mock_config *shared = (struct mock_config *)cfg; /* only the cache changes */
    struct mock_board *fresh = calloc(1, sizeof *fresh);
    if (fresh == NULL)
        return NULL;
    resolve(cfg, pos, fresh);
    static unsigned long long serials;
    fresh->serial = __atomic_add_fetch(&serials, 1, __ATOMIC_RELAXED);
    struct mock_board *expected = NULL;
    if (__atomic_compare_exchange_n(&shared->boards[pos], &expected, fresh, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
        return fresh;
    mock_board_free(fresh);
    return expected;
}

const nvmlPciInfo_t *mock_board_pci(const struct mock_config *cfg, unsigned pos)
{
    const struct mock_board *b = board_of(cfg, pos);
    return b != NULL ? &b->pci : NULL;
}

const struct mock_nvlink *mock_board_nvlink(const struct mock_config *cfg, unsigned pos)
{
    const struct mock_board *b = board_of(cfg, pos);
    return b != NULL ? &b->nvlink : NULL;
}

int mock_figure_u64(const struct mock_config *cfg, unsigned pos, enum mock_figure figure,
                    unsigned long long *out)
{
    const struct mock_board *b = board_of(cfg, pos);
    if (__builtin_expect(b == NULL, 0)) /* no memory for the board: as looked up */
        return mock_dev_u64(cfg, pos, FIGURES[figure].field, out);
    long long reading; /* under the signature, its reading when it has one */
    if (FIGURES[figure].signature && b->idle.on &&
        mock_reading_field(cfg, pos, FIGURES[figure].field, &reading))
        return mock_reading_u64(reading, out);
    if (b->figures[figure].has_u64)
        *out = b->figures[figure].u64;
    return b->figures[figure].has_u64;
}

int mock_ecc_counter(const struct mock_config *cfg, unsigned pos, nvmlMemoryErrorType_t type,
                     nvmlEccCounterType_t counter, enum mock_ecc_location where,
                     unsigned long long *out)
{
    const struct mock_board *b = board_of(cfg, pos);
    if (__builtin_expect(b == NULL || !b->ecc.resolved, 0))
        return mock_ecc_count(cfg, pos, type, counter, mock_ecc_location_names[where], out);
    if (b->ecc.has_ecc)
        *out = b->ecc.count[counter][type][where];
    return b->ecc.has_ecc;
}

unsigned long long mock_snapshot_serial(const struct mock_config *cfg)
{
    const struct mock_board *b = cfg->device_count > 0 ? board_of(cfg, 0) : NULL;
    return b != NULL ? b->serial : 0;
}

int mock_board_remapped_rows(const struct mock_config *cfg, unsigned pos,
                             struct mock_remapped_rows *out)
{
    const struct mock_board *b = board_of(cfg, pos);
    if (__builtin_expect(b == NULL, 0))
        return mock_remapped_rows(cfg, pos, out);
    if (b->has_rows)
        *out = b->rows;
    return b->has_rows;
}
