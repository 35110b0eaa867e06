/*
 * Meters: quantities that accumulate over time at a rate the engine config
 * sets (NVLink traffic at the current utilization, time spent throttled
 * while a clocks event reason is active).
 *
 * The config holds rates, not totals: a running total in a file would
 * change it on every tick.  Each process integrates the rate at every read
 * instead, from the moment the library was loaded, so a meter only climbs
 * within the reader that differences it (monitoring agents compute rates
 * from two reads) and follows `mokka ctl` changes from the next read on.
 */
#include <pthread.h>

#include "mock.h"

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long g_loaded_ns;
static struct {
    unsigned long long last_ns; /* 0: never read, integrates from g_loaded_ns */
    double total;
} g_meters[MOCK_METER_COUNT][MOCK_MAX_DEVICES];

__attribute__((constructor)) static void meters_start(void)
{
    g_loaded_ns = mock_now_ns();
}

double mock_meter_read(enum mock_meter meter, unsigned pos, double rate_per_second,
                       unsigned long long *at)
{
    if ((unsigned)meter >= MOCK_METER_COUNT || pos >= MOCK_MAX_DEVICES) {
        if (at != NULL)
            *at = mock_now_ns();
        return 0;
    }
    /* The clock is read under the lock, so reads of one meter are ordered
     * in time and no interval is counted twice. */
    pthread_mutex_lock(&g_lock);
    unsigned long long now = mock_now_ns();
    unsigned long long last = g_meters[meter][pos].last_ns ? g_meters[meter][pos].last_ns
                                                           : g_loaded_ns;
    if (now > last && rate_per_second > 0)
        g_meters[meter][pos].total += rate_per_second * (double)(now - last) / 1e9;
    g_meters[meter][pos].last_ns = now;
    double total = g_meters[meter][pos].total;
    pthread_mutex_unlock(&g_lock);
    if (at != NULL)
        *at = now;
    return total;
}
