/*
 * When the board model runs, and how its readings reach the getters
 * (docs/workloads.md, "Cost and the clock quantum").
 *
 * Time is CLOCK_REALTIME_COARSE: the wall clock as of the kernel's last
 * timer tick, one value the kernel keeps for every process; readings are a
 * function of it alone (patterns.c), so two processes reading the same GPU
 * at the same instant agree.  MOCK_NVML_CLOCK_OVERRIDE (seconds since the
 * epoch; for tests) pins the clock.
 *
 * The readings of an active device are derived (dynamics.c) once per tick
 * of that clock (and per config snapshot and workload file) and kept in its
 * board: every getter of the same tick copies them (see struct
 * reading_cache), so a busy board's call costs about what an idle one's
 * does.  The energy counter (energy.c) keeps its last answer in the same
 * kind of memo.
 *
 * Apart from the model because this is the hot path: every getter of a
 * moving field comes through here (mock_reading_key, mock_reading_field),
 * and the memo's hit, the board lookup and the clock are inline in it.  The
 * same place answers what follows from the readings: the performance state
 * (P0 while busy) and the clocks event reasons.
 *
 * The idle signature's readings (dynamics.c) are kept the same way, in a
 * memo of their own: they answer an idle board's draw, temperatures, fan
 * and PCIe traffic, and a busy board's memory temperature, fan and PCIe
 * traffic (the workload drives the rest).
 *
 * Overrides that agree with each other (docs/nvml.md, "Linked readings"):
 * the model runs (the board is driven, board_driven) for a pattern, for
 * holders, and also for an override that loads the board as a workload
 * would: a pinned utilization above 0 takes the clocks, the draw, the
 * temperature and the performance state with it, and a draw pinned at or
 * over the enforced limit is the SW power cap holding the clocks
 * (mock_derive).  A pinned reading itself always reads as pinned.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dynamics.h"

/* Set when MOCK_NVML_CLOCK_OVERRIDE was in the environment at load: only
 * then is the variable read at each reading (a test sweeping instants in
 * one process changes it), so a node never pays for the lookup. */
int mock_clock_pinned;
/* MOCK_NVML_READING_CACHE=0 at load: every reading is derived afresh (tests
 * compare the cached readings with the formula's). */
int mock_cache_off;

__attribute__((constructor)) static void readings_start(void)
{
    mock_clock_pinned = getenv("MOCK_NVML_CLOCK_OVERRIDE") != NULL;
    const char *cache = getenv("MOCK_NVML_READING_CACHE");
    mock_cache_off = cache != NULL && strcmp(cache, "0") == 0;
}

/* ------------------------------------------------------------------ clock */

double mock_reading_time(void)
{
    struct instant now;
    instant_now(&now);
    return instant_seconds(&now);
}

/* ------------------------------------------------------------- the memos */

void mock_memo_put(struct tick_memo *m, unsigned long long *words, size_t n,
                   unsigned long long key, unsigned generation, unsigned long long owner,
                   const void *answer)
{
    unsigned seq = __atomic_load_n(&m->seq, __ATOMIC_RELAXED);
    if ((seq & 1) || !__atomic_compare_exchange_n(&m->seq, &seq, seq + 1, 0, __ATOMIC_ACQUIRE,
                                                  __ATOMIC_RELAXED))
        return; /* another thread is writing */
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&m->key, key, __ATOMIC_RELAXED);
    __atomic_store_n(&m->generation, generation, __ATOMIC_RELAXED);
    __atomic_store_n(&m->owner, owner, __ATOMIC_RELAXED);
    for (size_t i = 0; i < n; i++) {
        unsigned long long word;
        memcpy(&word, (const char *)answer + 8 * i, 8);
        __atomic_store_n(&words[i], word, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&m->seq, seq + 2, __ATOMIC_RELEASE);
}

static int cache_get(const struct mock_board *b, unsigned long long key, unsigned generation,
                     struct mock_readings *out)
{
    return memo_get(&b->cache.memo, b->cache.words, READING_WORDS, key, generation, 0, out);
}

static void cache_put(const struct mock_board *b, unsigned long long key, unsigned generation,
                      const struct mock_readings *r)
{
    struct reading_cache *c = (struct reading_cache *)&b->cache; /* the board's mutable part */
    mock_memo_put(&c->memo, c->words, READING_WORDS, key, generation, 0, r);
}

/* The idle signature's readings now: 1, or 0 when the config has none. */
static int idle_now(const struct mock_board *b, struct mock_idle *out)
{
    if (!b->idle.on)
        return 0;
    struct instant now;
    instant_now(&now);
    struct idle_cache *c = (struct idle_cache *)&b->idle_cache; /* the board's mutable part */
    if (!mock_cache_off && memo_get(&c->memo, c->words, IDLE_WORDS, now.key, 0, 0, out))
        return 1;
    mock_idle_at(b, instant_seconds(&now), out);
    if (!mock_cache_off)
        mock_memo_put(&c->memo, c->words, IDLE_WORDS, now.key, 0, 0, out);
    return 1;
}

/* ------------------------------------------------- which boards are driven */

/* A draw pinned at or over the enforced limit: the limit holds the board,
 * as when the formula's draw reaches it (mock_draw_mw's cap). */
static inline int pinned_over_limit(const struct mock_board *b)
{
    return (b->pins & PIN_POWER) && b->has_limit && b->power >= b->limit;
}

/* Whether the board model derives the device's readings (1), or every
 * reading is the profile's or the idle signature's (0): a pattern, a
 * holder, or an override that loads the board (a pinned utilization above
 * 0, a draw pinned at or over the limit). */
__attribute__((always_inline)) static inline int board_driven(const struct mock_board *b,
                                                              const struct mock_load *load)
{
    return load->holders > 0 || b->dynamic || ((b->pins & PIN_UTIL) && b->util > 0) ||
           pinned_over_limit(b);
}

int mock_board_driven(const struct mock_board *b, const struct mock_load *load)
{
    return board_driven(b, load);
}


int mock_idle_power_at(const struct mock_config *cfg, unsigned pos, double t, unsigned *mw)
{
    if (pos >= cfg->device_count || pos >= MOCK_MAX_DEVICES)
        return 0;
    const struct mock_board *b = board_of(cfg, pos);
    if (b == NULL || !b->idle.on || !b->idle.has_power || (b->pins & PIN_POWER))
        return 0;
    struct mock_load load;
    mock_workload_load(cfg, pos, &load);
    if (board_driven(b, &load))
        return 0;
    *mw = (unsigned)lround(mock_idle_power_mw(b, t));
    return 1;
}

/* Readings with nothing derived yet: the profile's, and who holds the board. */
static void blank(struct mock_readings *out, unsigned holders)
{
    memset(out, 0, sizeof *out);
    out->holders = holders;
}

/* The readings now, when the board is active (1); else 0 with `out` left
 * as it was and *holders set: the profile's values stand. */
__attribute__((always_inline)) static inline int
readings_now(const struct mock_config *cfg, unsigned pos, struct mock_readings *out,
             unsigned *holders)
{
    const struct mock_board *b = board_of(cfg, pos);
    struct mock_load load;
    mock_workload_load(cfg, pos, &load);
    *holders = load.holders;
    if (b == NULL || !board_driven(b, &load))
        return 0; /* not active: no clock is read */
    struct instant now;
    instant_now(&now);
    if (!mock_cache_off && cache_get(b, now.key, load.generation, out))
        return 1;
    blank(out, load.holders);
    mock_derive(b, &load, pos, instant_seconds(&now), out);
    if (!mock_cache_off)
        cache_put(b, now.key, load.generation, out);
    return 1;
}

void mock_readings_at(const struct mock_config *cfg, unsigned pos, double t,
                      struct mock_readings *out)
{
    unsigned holders = 0;
    if (pos >= cfg->device_count || pos >= MOCK_MAX_DEVICES) {
        blank(out, 0);
    } else if (t == MOCK_READING_NOW) {
        if (!readings_now(cfg, pos, out, &holders))
            blank(out, holders);
    } else {
        const struct mock_board *b = board_of(cfg, pos);
        struct mock_load load;
        mock_workload_load(cfg, pos, &load);
        blank(out, load.holders);
        if (b != NULL && board_driven(b, &load))
            mock_derive(b, &load, pos, t, out);
    }
}

/* ------------------------------------------------- readings as fields */

enum quantity {
    Q_UTIL, Q_UTIL_MEMORY, Q_MEMORY_USED, Q_POWER, Q_TEMPERATURE, Q_TLIMIT, Q_CLOCK, Q_REASON,
    /* the idle signature's alone: no workload or pattern moves them */
    Q_MEMORY_TEMPERATURE, Q_PCIE_TX, Q_PCIE_RX, Q_FAN
};

static const struct {
    const char *field;
    enum quantity q;
} MOVING[] = {
    {"utilization.gpu", Q_UTIL},
    {"utilization.memory", Q_UTIL_MEMORY},
    {"memory.used_bytes", Q_MEMORY_USED},
    {"power.current_draw_mw", Q_POWER},
    {"thermal.temperature_gpu_c", Q_TEMPERATURE},
    /* the margin to the slowdown point shrinks as the board warms */
    {"thermal.tlimit_c", Q_TLIMIT},
    {"clocks.sm_current", Q_CLOCK},
    {"clocks.graphics_current", Q_CLOCK},
    {"thermal.temperature_memory_c", Q_MEMORY_TEMPERATURE},
    {"pcie.tx_throughput_kbps", Q_PCIE_TX},
    {"pcie.rx_throughput_kbps", Q_PCIE_RX},
    {"fan.speed_percent", Q_FAN},
};

/* Which moving quantity `field` names (the reasons: which bit, in *bit). */
static int quantity_of(const char *field, enum quantity *q, unsigned long long *bit)
{
    /* Most lookups are of fields that never move: turn them away on their
     * first letters before any string comparison. */
    switch (field[0]) {
    case 'u': case 'm': case 'p': case 't': case 'c': case 'f': break;
    default: return 0;
    }
    for (size_t i = 0; i < MOCK_COUNT(MOVING); i++) {
        if (MOVING[i].field[1] == field[1] && strcmp(field, MOVING[i].field) == 0) {
            *q = MOVING[i].q;
            return 1;
        }
    }
    if (strncmp(field, "clocks_", 7) != 0)
        return 0;
    for (size_t i = 0; i < MOCK_COUNT(mock_reason_fields); i++) {
        if ((mock_reason_fields[i].bit & MOCK_READING_REASONS) &&
            strcmp(field, mock_reason_fields[i].field) == 0) {
            *q = Q_REASON;
            *bit = mock_reason_fields[i].bit;
            return 1;
        }
    }
    return 0;
}

/* A quantity under the idle signature: 1 and *out when the signature
 * answers it (on, and the reading not pinned); `busy` boards take only the
 * quantities no workload moves. */
static int idle_reading(const struct mock_config *cfg, unsigned pos, enum quantity q, int busy,
                        long long *out)
{
    const struct mock_board *b = board_of(cfg, pos);
    const struct idle_signature *s = b != NULL ? &b->idle : NULL;
    if (s == NULL || !s->on)
        return 0;
    int ok;
    switch (q) {
    case Q_POWER: ok = !busy && s->has_power && !(b->pins & PIN_POWER); break;
    case Q_TEMPERATURE: ok = !busy && s->has_temperature && !(b->pins & PIN_TEMPERATURE); break;
    case Q_TLIMIT: ok = !busy && b->has_tlimit && !(b->pins & PIN_TEMPERATURE); break;
    case Q_MEMORY_TEMPERATURE: ok = s->has_memory && !(b->pins & PIN_MEMORY_TEMPERATURE); break;
    case Q_PCIE_TX: ok = s->has_pcie && !(b->pins & PIN_PCIE_TX); break;
    case Q_PCIE_RX: ok = s->has_pcie && !(b->pins & PIN_PCIE_RX); break;
    case Q_FAN: ok = s->has_fan && !(b->pins & PIN_FAN); break;
    default: ok = 0; break;
    }
    struct mock_idle idle;
    if (!ok || !idle_now(b, &idle))
        return 0;
    switch (q) {
    case Q_POWER: *out = idle.power_mw; break;
    case Q_TEMPERATURE: *out = idle.temperature_c; break;
    case Q_TLIMIT: *out = idle.tlimit_c; break;
    case Q_MEMORY_TEMPERATURE: *out = idle.memory_c; break;
    case Q_PCIE_TX: *out = idle.tx_kbps; break;
    case Q_PCIE_RX: *out = idle.rx_kbps; break;
    case Q_FAN: *out = idle.fan_percent; break;
    default: return 0;
    }
    return 1;
}

/* A moving quantity's effective value (mock_reading_field's answer). */
__attribute__((always_inline)) static inline int
reading_of(const struct mock_config *cfg, unsigned pos, enum quantity q, unsigned long long bit,
           long long *out)
{
    struct mock_readings r;
    unsigned holders;
    if (pos >= cfg->device_count || pos >= MOCK_MAX_DEVICES)
        return 0;
    if (!readings_now(cfg, pos, &r, &holders))
        return idle_reading(cfg, pos, q, 0, out); /* else the profile's */
    /* a reason an override set reads as the override says */
    if (r.pinned_reasons & bit)
        return 0;
    switch (q) {
    case Q_UTIL: *out = r.util_gpu; break;
    case Q_UTIL_MEMORY: *out = r.util_memory; break;
    case Q_MEMORY_USED: *out = (long long)r.memory_used; break;
    case Q_POWER: *out = r.power_mw; break;
    case Q_TEMPERATURE: *out = r.temperature_c; break;
    case Q_TLIMIT:
        if (!r.has_tlimit)
            return 0; /* the board reports no T.Limit */
        *out = r.tlimit_c;
        break;
    case Q_CLOCK: *out = r.sm_clock_mhz; break;
    case Q_REASON: *out = (r.reasons & bit) != 0; break;
    default: return idle_reading(cfg, pos, q, 1, out);
    }
    return 1;
}

int mock_reading_field(const struct mock_config *cfg, unsigned pos, const char *field,
                       long long *out)
{
    enum quantity q;
    unsigned long long bit = 0;
    return quantity_of(field, &q, &bit) && reading_of(cfg, pos, q, bit, out);
}

/* Which quantity each key's field is, by quantity_of itself (at load): a
 * key moves exactly when its field does. */
static struct {
    int moves;
    enum quantity q;
    unsigned long long bit;
} g_key_quantity[MOCK_KEY_COUNT];

__attribute__((constructor)) static void key_quantities(void)
{
    for (unsigned key = 0; key < MOCK_KEY_COUNT; key++)
        g_key_quantity[key].moves = quantity_of(mock_key_field(key), &g_key_quantity[key].q,
                                                &g_key_quantity[key].bit);
}

int mock_key_moves(enum mock_key key)
{
    return g_key_quantity[key].moves;
}

int mock_reading_key(const struct mock_config *cfg, unsigned pos, enum mock_key key,
                     long long *out)
{
    return g_key_quantity[key].moves &&
           reading_of(cfg, pos, g_key_quantity[key].q, g_key_quantity[key].bit, out);
}

/* ------------------------------------------------ what follows from them */

unsigned long long mock_reasons_supported(void)
{
    unsigned long long all = 0;
    for (size_t i = 0; i < MOCK_COUNT(mock_reason_fields); i++)
        all |= mock_reason_fields[i].bit;
    return all;
}

unsigned long long mock_reasons_now(const struct mock_config *cfg, unsigned pos)
{
    if (pos >= cfg->device_count || pos >= MOCK_MAX_DEVICES)
        return 0;
    const struct mock_board *b = board_of(cfg, pos);
    if (b == NULL)
        return 0;
    struct mock_readings now;
    mock_readings_at(cfg, pos, MOCK_READING_NOW, &now);
    /* the reasons readings move, unless an override set them */
    unsigned long long derived = now.active ? MOCK_READING_REASONS & ~now.pinned_reasons : 0;
    return (now.reasons & derived) | (b->profile_reasons & ~derived);
}

unsigned mock_reading_pstate(const struct mock_config *cfg, unsigned pos, unsigned idle)
{
    if (idle == NVML_PSTATE_UNKNOWN || pos >= cfg->device_count || pos >= MOCK_MAX_DEVICES)
        return idle;
    const struct mock_board *b = board_of(cfg, pos);
    if (b == NULL || b->pstate_pinned)
        return idle; /* `mokka ctl pstate` wins */
    struct mock_readings now;
    mock_readings_at(cfg, pos, MOCK_READING_NOW, &now);
    double util = now.active ? now.util_gpu : b->util;
    return util > MOCK_BUSY_UTILIZATION ? NVML_PSTATE_0 : idle;
}
