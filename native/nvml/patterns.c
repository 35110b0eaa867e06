/*
 * The patterns a profile makes readings follow (`dynamics.<metric>`,
 * docs/workloads.md): steady, ramp, burst and noise, read from a device's
 * config and evaluated at time t.
 *
 * Apart from the board model (dynamics.c) because a pattern is a function of
 * time alone: it knows nothing of boards, holders or limits, so the model
 * clamps what it answers, and the energy counter (energy.c) integrates the
 * same patterns in closed form.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "dynamics.h"

static double param(const struct mock_config *cfg, unsigned pos, const char *metric,
                    const char *name, double fallback)
{
    char field[128];
    snprintf(field, sizeof field, "dynamics.%s.%s", metric, name);
    return mock_dev_double_or(cfg, pos, field, fallback);
}

/* The profile validated the block (mokka/state/device_checks.py); a hand
 * edit that breaks it reads as no pattern, never as a wild value. */
int mock_pattern_of(const struct mock_config *cfg, unsigned pos, const char *metric,
                    struct pattern *p)
{
    char field[128];
    snprintf(field, sizeof field, "dynamics.%s.pattern", metric);
    const char *name = mock_dev_get(cfg, pos, field);
    memset(p, 0, sizeof *p);
    if (name == NULL)
        return 0;
    if (strcasecmp(name, "steady") == 0) {
        p->kind = PATTERN_STEADY;
        p->a = param(cfg, pos, metric, "value", NAN);
    } else if (strcasecmp(name, "ramp") == 0) {
        p->kind = PATTERN_RAMP;
        p->a = param(cfg, pos, metric, "from", NAN);
        p->b = param(cfg, pos, metric, "to", NAN);
        p->period = param(cfg, pos, metric, "period_s", NAN);
    } else if (strcasecmp(name, "burst") == 0) {
        p->kind = PATTERN_BURST;
        p->a = param(cfg, pos, metric, "low", NAN);
        p->b = param(cfg, pos, metric, "high", NAN);
        p->period = param(cfg, pos, metric, "period_s", NAN);
        p->duty = param(cfg, pos, metric, "duty", 0.5);
    } else if (strcasecmp(name, "noise") == 0) {
        p->kind = PATTERN_NOISE;
        p->a = param(cfg, pos, metric, "mean", NAN);
        p->b = param(cfg, pos, metric, "amplitude", 0);
        char seed[128];
        snprintf(seed, sizeof seed, "dynamics.%s.seed", metric);
        if (!mock_parse_u64(mock_dev_get(cfg, pos, seed), &p->seed))
            p->seed = 0;
    } else {
        return 0;
    }
    int periodic = p->kind == PATTERN_RAMP || p->kind == PATTERN_BURST;
    if (!isfinite(p->a) || !isfinite(p->b) || (periodic && !(p->period > 0))) {
        p->kind = PATTERN_NONE;
        return 0;
    }
    return 1;
}

/* splitmix64: a good 64-bit mix, the same in every process. */
static unsigned long long mix(unsigned long long x)
{
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

double mock_pattern_value(const struct pattern *p, unsigned pos, double t, double step)
{
    double phase = p->period > 0 ? fmod(t, p->period) / p->period : 0;
    switch (p->kind) {
    case PATTERN_STEADY: return p->a;
    case PATTERN_RAMP: return p->a + (p->b - p->a) * phase;
    case PATTERN_BURST: return phase < p->duty ? p->b : p->a;
    case PATTERN_NOISE: {
        long long bucket = (long long)floor(t / step);
        unsigned long long h = mix(p->seed ^ mix((unsigned long long)pos ^
                                                 mix((unsigned long long)bucket)));
        double unit = (double)(h >> 11) / 9007199254740992.0; /* [0, 1) */
        return p->a + p->b * (2 * unit - 1);
    }
    default: return 0;
    }
}
