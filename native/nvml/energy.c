/*
 * The total energy counter (nvmlDeviceGetTotalEnergyConsumption, field
 * values 83 and 191; docs/workloads.md, "Energy").
 *
 * Apart from the board model (dynamics.c) because it is no reading at an
 * instant but a running total a process keeps: it integrates the model's
 * draw (mock_draw_mw, the one formula of it) in closed form, keeps each
 * device's offset under its own lock, and its last answer in a tick memo
 * as the readings do (readings.c).
 *
 * The counter (mJ) is the profile's `total_energy_consumption_mj`
 * plus the integral of the power draw since the driver loaded, as NVML
 * documents it ("since the driver was last reloaded"): from the node's boot
 * time (`btime` of /proc/stat, firmware.c's mock_boot_time), as if the
 * board had drawn what it draws now all along.  That integral is
 * F(t) - F(origin), F the closed form of the integral from the epoch of the
 * shared clock, which every draw has: a constant (an idle or a held board,
 * an override) times t; a steady, ramp or burst pattern whole periods (they
 * start at the epoch, so they keep their phase whatever the origin) plus the
 * part of the current one, integrated exactly (the draw is linear between
 * known points); a noise pattern at the draw's mean over its values (the
 * mean rate: a meter averages noise out).  So every process reading at the
 * same instant agrees, and the counter climbs at the draw's rate.
 *
 * The origin is the boot time when /proc/stat has one and it is not after
 * the instant read; else the epoch (t = 0): only a clock pinned before the
 * boot (MOCK_NVML_CLOCK_OVERRIDE; the boot time stays the real one, as the
 * black box's flush has it) or a /proc/stat without `btime` gets there.
 * Either way the origin is a function of the instant and the node alone,
 * not of when a process started, so every process agrees; and it is part
 * of the model, so a process whose pinned clock crosses the boot time
 * carries its counter on as at any other change of model (below).
 *
 * When the draw's model changes (holders come or go, a reload changes the
 * power, the pattern or the profile's counter, a pinned clock crosses the
 * boot time), the new closed form would jump.  A running process instead
 * carries its counter on from where the old model had it at that read, at
 * the new rate: it never goes backwards (nor jumps), and never does within
 * a process whatever the clock does.  Such a process then differs from one
 * started later by a constant; with no change of model (a pattern running,
 * a reload of other fields) every process agrees.
 */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "dynamics.h"

/* What a board's draw is a function of: a constant, or a pattern (of the
 * power itself, in W, or of the utilization) through mock_draw_mw.  Zeroed
 * before it is filled, so two models compare with memcmp. */
struct draw_model {
    struct pattern p;   /* PATTERN_NONE: constant_mw */
    int watts;          /* p is the power's, else the utilization's */
    int has_limit;
    double constant_mw, idle_mw, limit_mw, base_mj;
    double origin;      /* s since the epoch the counter counts from (energy_origin) */
};

/* Where the counter counts from at time t: the node's boot time (the driver
 * loads at boot), or the epoch when the boot time is unknown or after t (a
 * clock pinned before the boot).  The same for every process at t. */
static double energy_origin(double t)
{
    double boot = (double)mock_boot_time();
    return boot > 0 && boot <= t ? boot : 0;
}

static void draw_model_of(const struct mock_board *b, const struct mock_load *load,
                          struct draw_model *m)
{
    memset(m, 0, sizeof *m);
    m->idle_mw = b->base_power; /* the idle signature's place, or the profile's */
    m->limit_mw = b->limit;
    m->has_limit = b->has_limit;
    m->base_mj = b->energy_base;
    int capped, active = mock_board_driven(b, load);
    if (b->pins & PIN_POWER) {
        m->constant_mw = fmax(b->power, 0); /* what the board reports */
    } else if (!active) {
        /* an idle board's draw; under the idle signature its mean (the
         * drift and the jitter average out, as a meter averages noise) */
        m->constant_mw = fmax(b->base_power, 0);
    } else if (b->p_power.kind != PATTERN_NONE) {
        m->p = b->p_power;
        m->watts = 1;
    } else if (b->p_util.kind != PATTERN_NONE && !(b->pins & PIN_UTIL)) {
        m->p = b->p_util;
    } else {
        double util = b->pins & PIN_UTIL ? b->util : mock_util_at(b, load, 0, 0);
        m->constant_mw = mock_draw_mw(b->base_power, b->limit, b->has_limit, 0, util, &capped);
    }
}

static double model_draw(const struct draw_model *m, double x)
{
    int capped;
    return mock_draw_mw(m->idle_mw, m->limit_mw, m->has_limit, m->watts, x, &capped);
}

/* The integral of the draw over x0..x1 (mW x the pattern's unit).  draw_mw
 * is linear but at 0 and at the utilization's 100 % or the power's limit,
 * so the trapezoid rule on each piece between them is exact. */
static double draw_integral(const struct draw_model *m, double x0, double x1)
{
    double cuts[2] = {0, m->watts ? (m->has_limit ? m->limit_mw / 1000 : 0) : 100};
    if (cuts[1] < cuts[0]) {
        cuts[1] = cuts[0];
        cuts[0] = m->limit_mw / 1000;
    }
    double lo = fmin(x0, x1), hi = fmax(x0, x1), at = lo, sum = 0;
    for (int i = 0; i < 2; i++) {
        if (cuts[i] > at && cuts[i] < hi) {
            sum += (cuts[i] - at) * (model_draw(m, at) + model_draw(m, cuts[i])) / 2;
            at = cuts[i];
        }
    }
    sum += (hi - at) * (model_draw(m, at) + model_draw(m, hi)) / 2;
    return x1 >= x0 ? sum : -sum;
}

/* mJ drawn over the first s seconds of one period of a ramp or a burst. */
static double period_energy(const struct draw_model *m, double s)
{
    const struct pattern *p = &m->p;
    if (p->kind == PATTERN_BURST) {
        double high = clamp(p->duty, 0, 1) * p->period;
        return model_draw(m, p->b) * fmin(s, high) + model_draw(m, p->a) * fmax(0, s - high);
    }
    if (p->b == p->a)
        return model_draw(m, p->a) * s;
    /* x = from + (to - from) s / period, so dt = period / (to - from) dx */
    return p->period / (p->b - p->a) * draw_integral(m, p->a, p->a + (p->b - p->a) * s / p->period);
}

/* mJ drawn from the epoch to t under the model (F, the closed form). */
static double epoch_energy(const struct draw_model *m, double t)
{
    const struct pattern *p = &m->p;
    switch (p->kind) {
    case PATTERN_STEADY: return model_draw(m, p->a) * t;
    case PATTERN_NOISE: {
        double rate = p->b > 0 ? draw_integral(m, p->a - p->b, p->a + p->b) / (2 * p->b)
                               : model_draw(m, p->a);
        return rate * t;
    }
    case PATTERN_RAMP:
    case PATTERN_BURST: {
        /* the phase pattern_value uses, and the whole periods before it */
        double s = fmod(t, p->period), periods = nearbyint((t - s) / p->period);
        return periods * period_energy(m, p->period) + period_energy(m, s);
    }
    default: return m->constant_mw * t;
    }
}

/* The counter's course under the model at t: the profile's base plus what
 * was drawn from the model's origin to t. */
static double draw_energy(const struct draw_model *m, double t)
{
    return m->base_mj + (epoch_energy(m, t) - epoch_energy(m, m->origin));
}

/* Each device's counter in this process: the model it follows, and the
 * offset and last answer that keep it from going backwards. */
static pthread_mutex_t g_energy_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int started;
    struct draw_model model;
    double offset;                /* mJ added to the model's course */
    unsigned long long last;      /* mJ, the last answer */
    double last_t;
} g_energy[MOCK_MAX_DEVICES];

/* The last answer, for the calls of the same tick: the counter's course
 * is a function of the board, the workload file and the instant alone, so
 * while they are the memo's, the answer is the memo's.  Written under
 * g_energy_lock with every answer, so it is always the latest one and a
 * hit never goes back behind another call's answer. */
static struct {
    struct tick_memo memo;
    unsigned long long mj[1];
} g_energy_memo[MOCK_MAX_DEVICES];

int mock_energy_mj(const struct mock_config *cfg, unsigned pos, unsigned long long *out)
{
    if (pos >= cfg->device_count || pos >= MOCK_MAX_DEVICES)
        return 0;
    const struct mock_board *b = board_of(cfg, pos);
    if (b == NULL || !b->has_energy)
        return 0;
    struct mock_load load;
    mock_workload_load(cfg, pos, &load);
    struct instant now;
    instant_now(&now);
    __typeof__(g_energy_memo[0]) *memo = &g_energy_memo[pos];
    if (!mock_cache_off && memo_get(&memo->memo, memo->mj, 1, now.key, load.generation, b->serial,
                                 out))
        return 1;
    struct draw_model m;
    draw_model_of(b, &load, &m);
    double t = instant_seconds(&now);
    m.origin = energy_origin(t);
    double course = draw_energy(&m, t);
    pthread_mutex_lock(&g_energy_lock);
    __typeof__(g_energy[0]) *e = &g_energy[pos];
    if (!e->started) {
        e->started = 1;
        e->offset = 0;
    } else if (memcmp(&e->model, &m, sizeof m) != 0) {
        /* a new model: on from where the old one has the counter now */
        double was = draw_energy(&e->model, fmax(t, e->last_t)) + e->offset;
        e->offset = fmax(was, (double)e->last) - course;
    }
    e->model = m;
    double value = course + e->offset;
    unsigned long long mj = !(value > 0) ? 0 : value >= 1.8e19 ? ULLONG_MAX
                                                                : (unsigned long long)value;
    if (mj < e->last)
        mj = e->last; /* the clock went back */
    e->last = mj;
    e->last_t = fmax(e->last_t, t);
    mock_memo_put(&memo->memo, memo->mj, 1, now.key, load.generation, b->serial, &mj);
    pthread_mutex_unlock(&g_energy_lock);
    *out = mj;
    return 1;
}
