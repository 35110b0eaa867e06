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
 * Each meter counts on the clock its readers need.  NVLink traffic is on
 * CLOCK_MONOTONIC (mock_now_ns), exact to the nanosecond: GPM samples take
 * its instant as theirs and divide by the time between two samples.  The
 * violation times are on the call's clock (mock_call_clock:
 * CLOCK_REALTIME_COARSE as the NVML call began, read once per call
 * anyway), so they cost no clock read of their own: they advance once a
 * kernel tick (clock_getres(CLOCK_REALTIME_COARSE): 1-4 ms, 4 ms at
 * HZ=250), and two reads within one tick answer the same time.  A real
 * board's violation counters are read from the GPU and move in steps far
 * coarser than a nanosecond, and pollers sample them every 100 ms-1 s.
 * A tick counts whole: the first line starts a tick before the load.  The
 * instant is the wall clock: nvmlDeviceGetViolationStatus gives it as its
 * referenceTime with no second read.  A meter never runs back: a step
 * back of the wall clock holds it until the clock is past its line's start
 * again; a step forward counts as time throttled.
 */
#include <sched.h>
#include <string.h>
#include <time.h>

#include "mock.h"

/* Which clock a meter counts on (see above). */
enum meter_clock { METER_CLOCK_PRECISE, METER_CLOCK_CALL, METER_CLOCK_COUNT };

/* The library's load on each clock: where a meter's first line starts. */
static unsigned long long g_loaded[METER_CLOCK_COUNT];

static enum meter_clock clock_of(enum mock_meter meter)
{
    return meter == MOCK_METER_NVLINK_KIB ? METER_CLOCK_PRECISE : METER_CLOCK_CALL;
}

static unsigned long long clock_now(enum meter_clock clock)
{
    return clock == METER_CLOCK_PRECISE ? mock_now_ns() : mock_call_clock();
}

/* Every word is read and written atomically (the doubles as their bits);
 * `seq` is odd while a writer moves the line, 0 before the first read. */
struct meter {
    unsigned seq;
    unsigned long long since;      /* the instant (meter's clock) the rate took over */
    unsigned long long total_bits; /* double: the total at `since` */
    unsigned long long rate_bits;  /* double: per second, from `since` on */
};
static struct meter g_meters[MOCK_METER_COUNT][MOCK_MAX_DEVICES];

__attribute__((constructor)) static void meters_start(void)
{
    g_loaded[METER_CLOCK_PRECISE] = mock_now_ns();
    /* The call clock counts whole ticks: the tick the library loaded in
     * counts whole, so a board held down from the start has time to show
     * at its very first read (a reading of 0 is what `nvidia-smi dmon`
     * takes for a counter with no history). */
    struct timespec tick = {0, 0};
    clock_getres(CLOCK_REALTIME_COARSE, &tick);
    g_loaded[METER_CLOCK_CALL] = mock_call_clock() - /* outside a call: now */
                                 ((unsigned long long)tick.tv_sec * 1000000000ULL +
                                  (unsigned long long)tick.tv_nsec);
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
    /* rate per ns first: a violation meter (1e9 ns per second) counts whole
     * nanoseconds exactly, so its growth is the clock's to the nanosecond */
    return now > since && rate > 0 ? total + rate / 1e9 * (double)(now - since) : total;
}

/* Closes the line at the writer's own instant and starts one at `rate`
 * (seq is the even value the writer found); 0 when another writer got
 * there first.  The new line starts no earlier than the one it closes (a
 * call's instant on the call clock may be a tick older than a line another
 * thread started), so lines follow each other in time. */
static int move_line(struct meter *m, enum meter_clock clock, unsigned seq, double rate,
                     double *total, unsigned long long *now)
{
    if (!__atomic_compare_exchange_n(&m->seq, &seq, seq + 1, 0, __ATOMIC_ACQUIRE,
                                     __ATOMIC_RELAXED))
        return 0;
    __atomic_thread_fence(__ATOMIC_RELEASE);
    /* the clock is read inside the write (on the precise clock, that orders
     * lines by itself) */
    *now = clock_now(clock);
    unsigned long long start = *now;
    if (seq == 0) { /* the first read: its rate since the library loaded */
        *total = line_at(g_loaded[clock], 0, rate, *now);
    } else {
        unsigned long long since = __atomic_load_n(&m->since, __ATOMIC_RELAXED);
        *total = line_at(since, double_of(__atomic_load_n(&m->total_bits, __ATOMIC_RELAXED)),
                         double_of(__atomic_load_n(&m->rate_bits, __ATOMIC_RELAXED)), *now);
        if (start < since)
            start = since;
    }
    __atomic_store_n(&m->since, start, __ATOMIC_RELAXED);
    __atomic_store_n(&m->total_bits, bits_of(*total), __ATOMIC_RELAXED);
    __atomic_store_n(&m->rate_bits, bits_of(rate), __ATOMIC_RELAXED);
    __atomic_store_n(&m->seq, seq + 2, __ATOMIC_RELEASE);
    return 1;
}

double mock_meter_read(enum mock_meter meter, unsigned pos, double rate_per_second,
                       unsigned long long *at)
{
    enum meter_clock clock = clock_of(meter);
    if ((unsigned)meter >= MOCK_METER_COUNT || pos >= MOCK_MAX_DEVICES) {
        if (at != NULL)
            *at = clock_now(clock);
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
            if (move_line(m, clock, seq, rate_per_second, &total, &now))
                break;
            continue;
        }
        /* the clock is read inside the read, so no line starts after it */
        now = clock_now(clock);
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
