/*
 * Meters: quantities that accumulate over time at a rate the engine config
 * sets (NVLink traffic at the current utilization, time spent throttled
 * while a clocks event reason is active).
 *
 * The config holds rates, not totals: a running total in a file would
 * change it on every tick.  Each process integrates the rate instead, from
 * the moment the library was loaded, so a meter only climbs within the
 * reader that differences it (monitoring agents compute rates from two
 * reads) and follows `mokka ctl` changes from the next read on.
 *
 * A meter is a line in time: the total accumulated up to an instant
 * (`since`) and the rate in force from then on.  A read whose rate is the
 * one in force only evaluates the line: it takes no lock and writes
 * nothing (a sequence lock tells it when a writer moved the line under
 * it).  Only a read that brings another rate (the reason came or went,
 * `mokka ctl util` moved the traffic) closes the line at its instant and
 * starts a new one.  The very first read of a meter starts its line at the
 * library's load, at its own rate.
 *
 * The clock is CLOCK_MONOTONIC (mock_now_ns), exact to the nanosecond: a
 * monitoring agent reads two meters microseconds apart and expects the
 * second ahead of the first, and nvmlDeviceGetViolationStatus gives the
 * read's instant as its referenceTime, which a consumer compares with its
 * own clock.  The coarse clock every call already reads (mock_call_clock)
 * would save the read, about two thirds of that call, but it moves once a
 * kernel tick (4 ms at HZ=250): two reads within a tick would answer the
 * same violation time, and the referenceTime would trail the call by up to
 * a tick, where a real board's stamp is the call's microsecond.
 */
#include <sched.h>
#include <string.h>

#include "mock.h"

static unsigned long long g_loaded_ns;

/* Every word is read and written atomically (the doubles as their bits);
 * `seq` is odd while a writer moves the line, 0 before the first read. */
struct meter {
    unsigned seq;
    unsigned long long since;      /* mock_now_ns() the rate took over */
    unsigned long long total_bits; /* double: the total at `since` */
    unsigned long long rate_bits;  /* double: per second, from `since` on */
};
static struct meter g_meters[MOCK_METER_COUNT][MOCK_MAX_DEVICES];

__attribute__((constructor)) static void meters_start(void)
{
    g_loaded_ns = mock_now_ns();
}

static unsigned long long bits_of(double v)
{
    unsigned long long bits;
    memcpy(&bits, &v, sizeof bits);
    return bits;
}

static double double_of(unsigned long long bits)
{
    double v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* The line's total at `now`; an instant before its start (a reader whose
 * clock read came before a writer's) is its start. */
static double line_at(unsigned long long since, double total, double rate, unsigned long long now)
{
    return now > since && rate > 0 ? total + rate * (double)(now - since) / 1e9 : total;
}

/* Closes the line at the writer's own instant and starts one at `rate`
 * (seq is the even value the writer found); 0 when another writer got
 * there first. */
static int move_line(struct meter *m, unsigned seq, double rate, double *total,
                     unsigned long long *now)
{
    if (!__atomic_compare_exchange_n(&m->seq, &seq, seq + 1, 0, __ATOMIC_ACQUIRE,
                                     __ATOMIC_RELAXED))
        return 0;
    __atomic_thread_fence(__ATOMIC_RELEASE);
    /* the clock is read inside the write, so lines follow each other in time */
    *now = mock_now_ns();
    if (seq == 0) { /* the first read: its rate since the library loaded */
        *total = line_at(g_loaded_ns, 0, rate, *now);
    } else {
        *total = line_at(__atomic_load_n(&m->since, __ATOMIC_RELAXED),
                         double_of(__atomic_load_n(&m->total_bits, __ATOMIC_RELAXED)),
                         double_of(__atomic_load_n(&m->rate_bits, __ATOMIC_RELAXED)), *now);
    }
    __atomic_store_n(&m->since, *now, __ATOMIC_RELAXED);
    __atomic_store_n(&m->total_bits, bits_of(*total), __ATOMIC_RELAXED);
    __atomic_store_n(&m->rate_bits, bits_of(rate), __ATOMIC_RELAXED);
    __atomic_store_n(&m->seq, seq + 2, __ATOMIC_RELEASE);
    return 1;
}

double mock_meter_read(enum mock_meter meter, unsigned pos, double rate_per_second,
                       unsigned long long *at)
{
    if ((unsigned)meter >= MOCK_METER_COUNT || pos >= MOCK_MAX_DEVICES) {
        if (at != NULL)
            *at = mock_now_ns();
        return 0;
    }
    struct meter *m = &g_meters[meter][pos];
    double total;
    unsigned long long now;
    for (unsigned tries = 1;; tries++) {
        unsigned seq = __atomic_load_n(&m->seq, __ATOMIC_ACQUIRE);
        if (seq & 1) { /* a writer is moving the line: a few instructions */
            if (tries % 64 == 0)
                sched_yield();
            continue;
        }
        unsigned long long since = __atomic_load_n(&m->since, __ATOMIC_RELAXED);
        double rate = double_of(__atomic_load_n(&m->rate_bits, __ATOMIC_RELAXED));
        double base = double_of(__atomic_load_n(&m->total_bits, __ATOMIC_RELAXED));
        if (seq == 0 || rate != rate_per_second) {
            if (move_line(m, seq, rate_per_second, &total, &now))
                break;
            continue;
        }
        /* the clock is read inside the read, so no line starts after it */
        now = mock_now_ns();
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&m->seq, __ATOMIC_RELAXED) == seq) {
            total = line_at(since, base, rate, now);
            break;
        }
    }
    if (at != NULL)
        *at = now;
    return total;
}
