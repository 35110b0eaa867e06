/*
 * The board model: the readings that move, derived in one place
 * (docs/workloads.md).
 *
 * A device's utilization, memory used, power draw, GPU temperature, current
 * SM/graphics clock and clocks event reasons at time t come from, strongest
 * first:
 *
 *   1. a `mokka ctl` override: the daemon lists the fields an override set
 *      under `pinned.<field>`, and a pinned field reads the profile's value;
 *   2. a `dynamics.<metric>` pattern (steady, ramp, burst, noise; patterns.c);
 *   3. the pods holding the GPU (workload.c): each holder adds its share of
 *      the memory and its utilization;
 *   4. the profile's own (idle) value.
 *
 * Power, temperature and clocks follow the utilization u (0..1) unless a
 * pattern or an override sets them: power = idle + (limit - idle) x u,
 * clamped to the enforced limit (SW power cap when it reaches it);
 * temperature = idle + span x u, with span taking a fully busy board to
 * just under its maximum operating temperature, averaged over the last
 * four steps of a pattern so it lags the load as a heat sink does; clocks
 * boost to the maximum while busy and drop to a supported clock well below
 * it while a power or thermal limit holds them (with the matching reasons).
 * Every value stays within the board's limits: power within the enforced
 * limit, temperature below shutdown, clocks within the supported set.
 *
 * This file owns the model alone: what a board's readings derive from
 * (struct mock_board, resolved once per snapshot) and the formula.  When
 * the formula runs is readings.c's: it keeps the answer for every call of
 * the same clock tick, and serves it as profile fields; the energy counter
 * that integrates the draw is energy.c's.  A device with no holders and no
 * pattern is not active: every reading is exactly the profile's, as before
 * workloads existed, unless the engine config asks for the idle signature.
 *
 * The idle signature (`idle_signature: true` in the engine config;
 * docs/nvml.md, "Idle readings") gives each GPU of a fleet its own idle
 * readings, as real idle boards show: its temperature, draw, memory
 * temperature, fan and PCIe traffic sit at a place within the board's idle
 * range drawn from its identity (node name and UUID), drift slowly (two
 * waves of minutes) and the draw and the PCIe traffic jitter from one
 * driver sample (1/6 s) to the next.  Every term is a function of the
 * identity and the shared clock alone, with no state of the process, so two
 * processes reading at the same instant agree.  An override of a reading
 * (`pinned.<field>`) reads the profile's figure; a pattern or a workload
 * drives a busy board from the signature's idle bases, as from the
 * profile's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* ------------------------------------------------------- idle signature */

/* How far idle boards of one kind spread, around the profile's idle
 * figures (which come from one board's capture), from public nvidia-smi
 * outputs of idle nodes:
 *
 *   H100 SXM: NVIDIA/nccl#1264 (eight H100 80GB HBM3, driver 550.54.15,
 *     idle in P0): 28-31 C and 83-88 W across the eight GPUs;
 *   A100 SXM: allenai/PeerRead#40 (eight A100-SXM4-80GB, driver 525.85.12,
 *     idle): 26-28 C and 59-62 W.
 *
 * The half-widths below cover those spreads and the slow drift of one GPU
 * over the day.  The other boards (B200, GB200, GB300, L40S, T4) take the
 * last row, the wider of the two: no public idle output of a whole node of
 * them was at hand.  PCIe traffic of an idle board is the driver's own
 * housekeeping: ollama/ollama#10393 (an idle board in P8, `nvidia-smi -q`)
 * shows TX 2900 KB/s and RX 100 KB/s; nvidia-smi samples it over 20 ms, so
 * it jumps from one query to the next. */
static const struct idle_range {
    const char *name;     /* a word of the board's name; NULL: any board */
    double temperature_c; /* half-width around the profile's idle temperature */
    double power_share;   /* half-width, a share of the profile's idle draw */
    double pcie_lo, pcie_hi; /* KB/s, each direction */
} IDLE_RANGES[] = {
    {"H100", 3, 0.06, 100, 1500},
    {"A100", 2, 0.04, 100, 1500},
    {NULL, 3, 0.06, 100, 1500},
};

/* The draw's jitter from one driver sample to the next: a share of the
 * idle draw, either way. */
#define IDLE_POWER_JITTER 0.015
/* A driver sample's period (samples.c's), in microseconds: the draw and
 * the PCIe traffic hold one value per sample, so a reading is the newest
 * sample's. */
#define IDLE_SAMPLE_US 166667ULL
/* The share of a half-width a GPU's place takes; the drift takes the rest. */
#define IDLE_PLACE 0.7

static unsigned long long splitmix(unsigned long long x)
{
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

static unsigned long long text_hash(const char *text)
{
    unsigned long long h = 0xcbf29ce484222325ULL; /* FNV-1a */
    for (; text != NULL && *text; text++)
        h = (h ^ (unsigned char)*text) * 0x100000001b3ULL;
    return h;
}

/* A number in [0, 1) drawn from the seed and `what`: the same for every
 * process. */
static double draw(unsigned long long seed, unsigned long long what)
{
    return (double)(splitmix(seed ^ splitmix(what)) >> 11) * 0x1.0p-53;
}

static void resolve_idle(const struct mock_config *cfg, unsigned pos, struct mock_board *b)
{
    struct idle_signature *s = &b->idle;
    int on = 0;
    s->on = mock_parse_bool(mock_cfg_get(cfg, "idle_signature"), &on) && on;
    if (!s->on)
        return;
    const char *name = mock_dev_get(cfg, pos, "name");
    const struct idle_range *range = &IDLE_RANGES[MOCK_COUNT(IDLE_RANGES) - 1];
    for (size_t i = 0; name != NULL && IDLE_RANGES[i].name != NULL; i++) {
        if (strstr(name, IDLE_RANGES[i].name) != NULL) {
            range = &IDLE_RANGES[i];
            break;
        }
    }
    s->seed = splitmix(text_hash(mock_cfg_get(cfg, "node_name")) ^
                       splitmix(text_hash(mock_dev_get(cfg, pos, "uuid"))));
    s->temperature_c = range->temperature_c;
    s->power_w = range->power_share * b->power / 1000;
    s->pcie_lo = range->pcie_lo;
    s->pcie_hi = range->pcie_hi;
    for (int i = 0; i < 4; i++)
        s->place[i] = 2 * draw(s->seed, (unsigned long long)i) - 1;
    /* two waves: one of 7 to 11 minutes, one of 25 to 40 */
    s->period[0] = 420 + 240 * draw(s->seed, 10);
    s->period[1] = 1500 + 900 * draw(s->seed, 11);
    s->phase[0] = 2 * M_PI * draw(s->seed, 12);
    s->phase[1] = 2 * M_PI * draw(s->seed, 13);
    double v;
    s->has_power = mock_dev_double(cfg, pos, "power.current_draw_mw", &v);
    s->has_temperature = mock_dev_double(cfg, pos, "thermal.temperature_gpu_c", &v);
    s->has_memory = mock_dev_double(cfg, pos, "thermal.temperature_memory_c", &s->memory_c);
    s->has_pcie = mock_dev_double(cfg, pos, "pcie.tx_throughput_kbps", &s->tx_kbps) &&
                  mock_dev_double(cfg, pos, "pcie.rx_throughput_kbps", &s->rx_kbps);
    unsigned fans = 0;
    s->has_fan = mock_dev_uint(cfg, pos, "fan.count", &fans) && fans > 0 &&
                 mock_dev_double(cfg, pos, "fan.speed_percent", &s->fan);
    /* a busy board starts from the GPU's own idle place, without the drift */
    b->base_power = b->power + IDLE_PLACE * s->place[1] * s->power_w * 1000;
    b->base_temperature = b->temperature + IDLE_PLACE * s->place[0] * s->temperature_c;
}

/* The slow drift at t, -1..1; `shift` (s) moves it along for a quantity
 * that drifts apart from the others. */
static double drift(const struct idle_signature *s, double t, double shift)
{
    double w = 0;
    for (int i = 0; i < 2; i++)
        w += (i == 0 ? 0.6 : 0.4) *
             sin(2 * M_PI * fmod(t + shift, s->period[i]) / s->period[i] + s->phase[i]);
    return w;
}

/* The draw's and the PCIe traffic's jitter in the driver sample holding
 * t, -1..1 (`what` tells the quantities apart). */
static double jitter(const struct idle_signature *s, double t, unsigned long long what)
{
    unsigned long long sample = (unsigned long long)(fmax(t, 0) * 1e6) / IDLE_SAMPLE_US;
    return 2 * draw(s->seed ^ splitmix(sample), what) - 1;
}

/* -1..1: where a quantity stands at t within its half-width. */
static double offset(const struct idle_signature *s, unsigned which, double t, double shift)
{
    return IDLE_PLACE * s->place[which] + (1 - IDLE_PLACE) * drift(s, t, shift);
}

double mock_idle_power_mw(const struct mock_board *b, double t)
{
    const struct idle_signature *s = &b->idle;
    if (!s->on)
        return b->power;
    double w = b->power / 1000 + s->power_w * offset(s, 1, t, 0) +
               IDLE_POWER_JITTER * b->power / 1000 * jitter(s, t, 100);
    double mw = fmax(w * 1000, 0);
    return b->has_limit ? fmin(mw, b->limit) : mw;
}

/* One direction's PCIe traffic: within the board's idle range, above the
 * profile's own figure. */
static double pcie_kbps(const struct idle_signature *s, unsigned which, double t, double base)
{
    double mid = (s->pcie_lo + s->pcie_hi) / 2, half = (s->pcie_hi - s->pcie_lo) / 2;
    double x = mid + half * (0.5 * offset(s, which, t, 97) + 0.5 * jitter(s, t, 100 + which));
    return base + clamp(x, s->pcie_lo, s->pcie_hi);
}

void mock_idle_at(const struct mock_board *b, double t, struct mock_idle *out)
{
    const struct idle_signature *s = &b->idle;
    memset(out, 0, sizeof *out);
    double heat = s->temperature_c * offset(s, 0, t, 0);
    out->temperature_c = (int)lround(b->temperature + heat);
    if (b->has_shutdown && out->temperature_c > b->shutdown - 1)
        out->temperature_c = (int)(b->shutdown - 1);
    out->tlimit_c = b->tlimit - (out->temperature_c - (long long)lround(b->temperature));
    out->memory_c = (int)lround(s->memory_c + heat); /* the memory sits beside the die */
    out->power_mw = (unsigned)lround(mock_idle_power_mw(b, t));
    out->tx_kbps = (unsigned)lround(pcie_kbps(s, 2, t, s->tx_kbps));
    out->rx_kbps = (unsigned)lround(pcie_kbps(s, 3, t, s->rx_kbps));
    /* a fan follows the board's warmth, a few percent either way */
    out->fan_percent = (unsigned)lround(clamp(s->fan + 3 * heat / s->temperature_c, 0, 100));
}

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

/* The largest supported clock at or below `mhz` (the smallest one when none
 * is); `mhz` itself when the profile lists no clocks. */
static double snap_clock(const struct mock_board *b, double mhz)
{
    double below = -1, lowest = -1;
    for (unsigned i = 0; i < b->clock_count; i++) {
        double c = b->clocks[i];
        if (c <= mhz && c > below)
            below = c;
        if (lowest < 0 || c < lowest)
            lowest = c;
    }
    return below >= 0 ? below : lowest >= 0 ? lowest : mhz;
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
    b->throttle_clock = snap_clock(b, 0.85 * b->clock_max);
    b->base_power = b->power;
    b->base_temperature = b->temperature;
    resolve_idle(cfg, pos, b);
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

/* The power draw (mW) at `x`: a power pattern's watts, or a utilization in
 * percent that takes the board from its idle draw to its enforced limit;
 * never above that limit (*capped: it is at it) nor below 0.  The one
 * formula of the draw: readings and the energy counter both use it. */
double mock_draw_mw(double idle, double limit, int has_limit, int watts, double x, int *capped)
{
    double p = watts ? x * 1000 : has_limit ? idle + (limit - idle) * clamp(x / 100, 0, 1) : idle;
    *capped = has_limit && p >= limit;
    return fmax(*capped ? limit : p, 0);
}

/* The utilization (percent) at time t: pattern, then holders, then idle. */
double mock_util_at(const struct mock_board *b, const struct mock_load *load, unsigned pos,
                    double t)
{
    if (b->p_util.kind != PATTERN_NONE)
        return clamp(mock_pattern_value(&b->p_util, pos, t, b->step), 0, 100);
    if (load->holders > 0)
        return clamp(fmax(b->util, load->holders * load->utilization), 0, 100);
    return b->util;
}

/* The readings of an active board at time t: the formula (the cache only
 * keeps what it answers).  `out` is zeroed, its holders set. */
void mock_derive(const struct mock_board *b, const struct mock_load *loaded, unsigned pos,
                 double t, struct mock_readings *out)
{
    const struct mock_load load = *loaded;
    out->active = 1;
    out->pinned_reasons = b->pinned_reasons;

    /* utilization */
    double util = b->pins & PIN_UTIL ? b->util : mock_util_at(b, &load, pos, t);
    double u = clamp(util / 100, 0, 1);
    out->util_gpu = (unsigned)lround(clamp(util, 0, 100));
    out->util_memory = b->pins & PIN_UTIL_MEMORY
                           ? (unsigned)b->util_memory
                           : (unsigned)lround(clamp(b->util_memory + (100 - b->util_memory) * u / 2,
                                                    0, 100));

    /* memory used, within what the driver leaves usable */
    double used;
    if (b->pins & PIN_MEMORY)
        used = b->used;
    else if (b->p_memory.kind != PATTERN_NONE)
        used = clamp(mock_pattern_value(&b->p_memory, pos, t, b->step), 0, 1) * b->total;
    else
        used = b->used + load.holders * load.memory_share * b->total;
    out->memory_used = (unsigned long long)clamp(used, 0, b->usable > 0 ? b->usable : 0);

    unsigned long long reasons = 0;

    /* power */
    double power;
    int capped = 0;
    if (b->pins & PIN_POWER) {
        /* a draw pinned at or over the enforced limit is the SW power cap,
         * as when the formula's draw reaches it */
        power = b->power;
        capped = b->has_limit && power >= b->limit;
    } else if (b->p_power.kind != PATTERN_NONE)
        power = mock_draw_mw(b->base_power, b->limit, b->has_limit, 1,
                             mock_pattern_value(&b->p_power, pos, t, b->step), &capped);
    else
        power = mock_draw_mw(b->base_power, b->limit, b->has_limit, 0, util, &capped);
    if (capped)
        reasons |= nvmlClocksEventReasonSwPowerCap;
    out->power_mw = (unsigned)lround(fmax(power, 0));

    /* temperature: toward idle + span x u; a pattern's load averaged over
     * its last four steps, as a heat sink lags the load */
    double temp;
    if (b->pins & PIN_TEMPERATURE) {
        temp = b->temperature;
    } else if (b->p_temperature.kind != PATTERN_NONE) {
        temp = mock_pattern_value(&b->p_temperature, pos, t, b->step);
    } else {
        double hot = b->has_gpu_max ? b->gpu_max - 2 : b->has_slowdown ? b->slowdown - 7
                                                                       : b->base_temperature + 40;
        double span = clamp(hot - b->base_temperature, 0, 40), heat = u;
        if (b->p_util.kind != PATTERN_NONE && !(b->pins & PIN_UTIL)) {
            heat = 0;
            for (int i = 0; i < 4; i++)
                heat += clamp(mock_util_at(b, &load, pos, t - i * b->step) / 100, 0, 1) / 4;
        }
        temp = b->base_temperature + span * heat;
    }
    if (b->has_shutdown && temp > b->shutdown - 1)
        temp = b->shutdown - 1;
    if (b->has_gpu_max && temp >= b->gpu_max)
        reasons |= nvmlClocksEventReasonSwThermalSlowdown;
    if (b->has_slowdown && temp >= b->slowdown)
        reasons |= nvmlClocksThrottleReasonHwSlowdown | nvmlClocksThrottleReasonHwThermalSlowdown;
    out->temperature_c = (int)lround(temp);
    out->has_tlimit = b->has_tlimit;
    out->tlimit_c = b->tlimit - (out->temperature_c - (long long)lround(b->temperature));

    /* clocks: boost while busy, held down while a limit holds */
    double clock;
    if (b->pins & PIN_CLOCK)
        clock = b->clock;
    else if (b->p_clocks.kind != PATTERN_NONE)
        clock = snap_clock(b, clamp(mock_pattern_value(&b->p_clocks, pos, t, b->step), 0,
                                    b->clock_max));
    else
        /* the P-state's threshold (mock_reading_pstate): a board in its idle
         * state runs its idle clock, never boost */
        clock = util > MOCK_BUSY_UTILIZATION ? b->clock_max : b->clock;
    if (reasons != 0 && !(b->pins & PIN_CLOCK))
        clock = fmin(clock, b->throttle_clock);
    out->sm_clock_mhz = (unsigned)lround(clock);
    if (util <= 0)
        reasons |= nvmlClocksEventReasonGpuIdle;
    out->reasons = reasons;
}
