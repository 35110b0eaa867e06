/*
 * What the files of the moving readings share (docs/workloads.md).
 *
 * One derivation of a board's readings is spread over six files, each with
 * one job, so none of them has to be read to change another:
 *
 *   patterns.c   a `dynamics.<metric>` pattern: parsed from the config, and
 *                its value at time t
 *   board.c      a device's reading inputs resolved once per snapshot
 *                (struct mock_board), and the per-snapshot records the
 *                polling getters read from it
 *   idle_signature.c  the idle signature (docs/nvml.md, "Idle readings"):
 *                where an idle board sits within its idle range, and its
 *                readings at time t
 *   dynamics.c   the board model's formula: a board's readings at time t
 *                from its inputs and the holders
 *   readings.c   the clock readings are for, the per-tick memo that keeps a
 *                board's readings (and its idle signature's) for every call
 *                of the same tick, the readings as profile fields, and what
 *                follows from them (performance state, clocks event reasons)
 *   energy.c     the total energy counter, the integral of the power draw
 *
 * This header is theirs alone (mock.h is the library's): the structs they
 * pass between them, and the helpers the hot path needs inline in more
 * than one of them (the board lookup, the clock, the memo's read).
 */
#ifndef MOCK_NVML_DYNAMICS_H
#define MOCK_NVML_DYNAMICS_H

#include <stdlib.h>
#include <string.h>

#include "mock.h"

#define MOCK_HIDDEN __attribute__((visibility("hidden")))

static inline double clamp(double v, double lo, double hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* A device field as a number, or `fallback` when it is absent or no number. */
static inline double mock_dev_double_or(const struct mock_config *cfg, unsigned pos,
                                        const char *field, double fallback)
{
    double v;
    return mock_dev_double(cfg, pos, field, &v) ? v : fallback;
}

/* ------------------------------------------------------------ patterns.c */

enum pattern_kind { PATTERN_NONE, PATTERN_STEADY, PATTERN_RAMP, PATTERN_BURST, PATTERN_NOISE };

struct pattern {
    enum pattern_kind kind;
    double a, b; /* steady: value; ramp: from, to; burst: low, high; noise: mean, amplitude */
    double period, duty; /* ramp and burst */
    unsigned long long seed;
};

/* The device's pattern for `metric` ("utilization", ...): 1 and *p, or 0
 * (and p->kind PATTERN_NONE) when it has none or a broken one. */
int mock_pattern_of(const struct mock_config *cfg, unsigned pos, const char *metric,
                    struct pattern *p);
/* The pattern's value at time t (seconds); noise holds each value `step` s. */
double mock_pattern_value(const struct pattern *p, unsigned pos, double t, double step);

/* ------------------------------------------------------------ readings.c */

/* Set at load from MOCK_NVML_CLOCK_OVERRIDE and MOCK_NVML_READING_CACHE=0
 * (readings.c): whether the clock is pinned, and whether the memos are off. */
extern int mock_clock_pinned MOCK_HIDDEN;
extern int mock_cache_off MOCK_HIDDEN;

/* The instant readings are for: a key that tells any two instants apart
 * (the memos' tick), and its time when the clock is pinned.  Its time in
 * seconds (instant_seconds) is worked out only by a reading that derives:
 * a division costs more than the rest of a memo's hit. */
struct instant {
    unsigned long long key;
    double pinned; /* MOCK_NVML_CLOCK_OVERRIDE's seconds, or -1 */
};

/* CLOCK_REALTIME_COARSE moves once per kernel timer tick (clock_getres
 * says how long: 4 ms on a HZ=250 kernel): every process reading at the
 * same instant gets the same value, so they derive from the same quantised
 * time, and it costs a fraction of the precise clock.  Its tick is the
 * quantum readings are cached for (docs/workloads.md). */
static inline void instant_now(struct instant *now)
{
    double t;
    if (__builtin_expect(mock_clock_pinned, 0) &&
        mock_parse_double(getenv("MOCK_NVML_CLOCK_OVERRIDE"), &t) && t >= 0) {
        now->pinned = t;
        memcpy(&now->key, &t, sizeof t); /* a pinned instant is a tick of its own */
        return;
    }
    now->pinned = -1;
    now->key = mock_call_clock(); /* the call's clock (snapshot.c): one read serves the call */
}

/* Seconds since the epoch. */
static inline double instant_seconds(const struct instant *now)
{
    if (now->pinned >= 0)
        return now->pinned;
    return (double)(now->key / 1000000000ULL) + (double)(now->key % 1000000000ULL) / 1e9;
}

/* An answer kept for every call of the same tick: a sequence lock (seq is
 * odd while a thread writes, 0 before the first write), so a hit takes no
 * lock and copies a few words.  What the answer derives from besides the
 * instant and the workload file in force (both in the key) is `owner`'s:
 * a board's readings live in the board itself (owner 0); the energy
 * counter's memo names the board by its serial.  A thread that finds
 * another one writing derives its own answer and leaves the memo alone. */
struct tick_memo {
    unsigned seq;
    unsigned generation;        /* mock_load.generation */
    unsigned long long key;     /* struct instant's key */
    unsigned long long owner;
};

/* The memo's words when it holds the answer for (key, generation, owner):
 * copied word by word straight into `out` (a copy through a buffer would
 * load 16 bytes from two 8-byte stores, which the CPU cannot forward). */
__attribute__((always_inline)) static inline int
memo_get(const struct tick_memo *m, const unsigned long long *words, size_t n,
         unsigned long long key, unsigned generation, unsigned long long owner, void *out)
{
    unsigned seq = __atomic_load_n(&m->seq, __ATOMIC_ACQUIRE);
    if (seq == 0 || (seq & 1) || __atomic_load_n(&m->key, __ATOMIC_RELAXED) != key ||
        __atomic_load_n(&m->generation, __ATOMIC_RELAXED) != generation ||
        __atomic_load_n(&m->owner, __ATOMIC_RELAXED) != owner)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned long long word = __atomic_load_n(&words[i], __ATOMIC_RELAXED);
        memcpy((char *)out + 8 * i, &word, 8);
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return __atomic_load_n(&m->seq, __ATOMIC_RELAXED) == seq; /* else a writer came by */
}

/* Stores `n` words of `answer` for (key, generation, owner), unless another
 * thread is writing the memo. */
void mock_memo_put(struct tick_memo *m, unsigned long long *words, size_t n,
                   unsigned long long key, unsigned generation, unsigned long long owner,
                   const void *answer);

/* --------------------------------------- board.c, idle_signature.c, dynamics.c */

/* Which readings an override pinned (`pinned.<field>` in the config). */
enum pin {
    PIN_UTIL = 1 << 0,
    PIN_UTIL_MEMORY = 1 << 1,
    PIN_MEMORY = 1 << 2,
    PIN_POWER = 1 << 3,
    PIN_TEMPERATURE = 1 << 4,
    PIN_CLOCK = 1 << 5,
    PIN_MEMORY_TEMPERATURE = 1 << 6,
    PIN_PCIE_TX = 1 << 7,
    PIN_PCIE_RX = 1 << 8,
    PIN_FAN = 1 << 9,
};

/* Every clocks event reason a board reports, by its profile field; the
 * ones in MOCK_READING_REASONS follow the readings, the others are the
 * profile's (board.c). */
struct mock_reason_field {
    const char *field;
    unsigned long long bit;
};
#define MOCK_REASON_FIELD_COUNT 9
extern const struct mock_reason_field mock_reason_fields[MOCK_REASON_FIELD_COUNT] MOCK_HIDDEN;

#define READING_WORDS (sizeof(struct mock_readings) / 8)
_Static_assert(sizeof(struct mock_readings) % 8 == 0, "readings are whole words");
/* A board's readings at its last tick. */
struct reading_cache {
    struct tick_memo memo;
    unsigned long long words[READING_WORDS];
};

/* The idle signature's readings of one device at one instant: what an idle
 * board reports in place of the profile's single figures (idle_signature.c). */
struct mock_idle {
    long long tlimit_c;         /* T.Limit, which shrinks as the board warms */
    unsigned power_mw;
    int temperature_c;
    int memory_c;               /* the memory's temperature */
    unsigned tx_kbps, rx_kbps;  /* PCIe throughput */
    unsigned fan_percent;
};
#define IDLE_WORDS (sizeof(struct mock_idle) / 8)
_Static_assert(sizeof(struct mock_idle) % 8 == 0, "idle readings are whole words");
struct idle_cache {
    struct tick_memo memo;
    unsigned long long words[IDLE_WORDS];
};

/* Where a device's idle signature sits: its stable place within its
 * board's idle range and the phases of its slow drift, drawn from its
 * identity (node name and UUID) when the snapshot is resolved. */
struct idle_signature {
    int on;                        /* the engine config asks for it (idle_signature) */
    unsigned long long seed;       /* the device's identity, hashed */
    double temperature_c, power_w; /* half-widths of the board's idle ranges */
    double pcie_lo, pcie_hi;       /* KB/s, the board's idle PCIe traffic */
    double place[4];               /* -1..1: temperature, power, PCIe TX, PCIe RX */
    double period[2], phase[2];    /* the slow drift's two waves (s, rad) */
    int has_memory, has_fan, has_pcie, has_power, has_temperature;
    double memory_c, tx_kbps, rx_kbps, fan; /* the profile's figures */
};

/* Everything a device's readings derive from that the engine config holds:
 * its profile values, limits, patterns and pins.  Resolved once per config
 * snapshot and device (the snapshot is immutable), so a reading formats and
 * looks up no key: only the workload's holders and the clock are read per
 * call. */
struct mock_board {
    int dynamic; /* a pattern is set */
    double util, util_memory, total, usable, used, power, limit, temperature;
    double slowdown, shutdown, gpu_max, clock, clock_max, throttle_clock, step;
    int has_limit, has_slowdown, has_shutdown, has_gpu_max, has_tlimit;
    long long tlimit;
    unsigned pins;
    unsigned long long pinned_reasons; /* reasons an override set */
    struct pattern p_util, p_memory, p_power, p_temperature, p_clocks;
    unsigned clock_count;
    double *clocks; /* the supported graphics clocks (first memory clock) */
    int pstate_pinned;                  /* `mokka ctl pstate` set the performance state */
    unsigned long long profile_reasons; /* the clocks event reasons the profile sets */
    int has_energy;                     /* the board reports its energy */
    double energy_base;                 /* mJ, the profile's counter at the origin */
    unsigned long long serial;          /* tells boards apart, however memory is reused */
    /* the idle bases the formula and the energy counter start from: the
     * profile's draw and temperature, moved to the device's place in its
     * board's idle range when the idle signature is on */
    double base_power, base_temperature;
    struct idle_signature idle;
    /* the PCI record nvmlDeviceGetPciInfo* copy (pci.c fills it): it
     * changes only with the config, so no call formats it */
    nvmlPciInfo_t pci;
    /* the figures, ECC counters and remapped rows the polling getters
     * read (mock.h): resolved here for the same reason */
    struct {
        unsigned long long u64;
        unsigned char has_u64;
    } figures[MOCK_FIGURE_COUNT];
    struct mock_ecc_counts ecc;
    struct mock_remapped_rows rows;
    int has_rows;
    /* the links the NVLink getters read (nvlink.c fills them) */
    struct mock_nvlink nvlink;
    struct reading_cache cache;         /* mutable: see struct reading_cache */
    struct idle_cache idle_cache;       /* mutable: the idle readings of the last tick */
};

/* The device's board, resolved by the first reader of this snapshot; a
 * racing second reader's copy is dropped.  NULL only without memory. */
__attribute__((noinline, cold)) const struct mock_board *mock_first_board(
    const struct mock_config *cfg, unsigned pos);

static inline const struct mock_board *board_of(const struct mock_config *cfg, unsigned pos)
{
    const struct mock_board *b = __atomic_load_n(&cfg->boards[pos], __ATOMIC_ACQUIRE);
    return b != NULL ? b : mock_first_board(cfg, pos);
}

/* Resolves the device's idle signature into b->idle and moves the board's
 * idle bases to its place (idle_signature.c); b->power and b->temperature
 * are resolved already. */
void mock_idle_resolve(const struct mock_config *cfg, unsigned pos, struct mock_board *b);
/* The largest supported clock at or below `mhz` (the smallest one when none
 * is); `mhz` itself when the profile lists no clocks (dynamics.c). */
double mock_snap_clock(const struct mock_board *b, double mhz);

/* The power draw (mW) at `x`: a power pattern's watts, or a utilization in
 * percent that takes the board from its idle draw to its enforced limit;
 * never above that limit (*capped: it is at it) nor below 0.  The one
 * formula of the draw: readings and the energy counter both use it. */
double mock_draw_mw(double idle, double limit, int has_limit, int watts, double x, int *capped);
/* The utilization (percent) at time t: pattern, then holders, then idle. */
double mock_util_at(const struct mock_board *b, const struct mock_load *load, unsigned pos,
                    double t);
/* The readings of an active board at time t: the formula (the cache only
 * keeps what it answers).  `out` is zeroed, its holders set. */
void mock_derive(const struct mock_board *b, const struct mock_load *loaded, unsigned pos,
                 double t, struct mock_readings *out);
/* The idle signature's readings at time t (b->idle.on). */
void mock_idle_at(const struct mock_board *b, double t, struct mock_idle *out);
/* The idle draw (mW) at time t: the signature's, or the profile's. */
double mock_idle_power_mw(const struct mock_board *b, double t);

#endif
