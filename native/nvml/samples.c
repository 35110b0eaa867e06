/*
 * The driver's sample buffers: nvmlDeviceGetSamples (power, utilization
 * and clock samples, which `nvidia-smi -q` summarizes as "... Samples")
 * and per-process utilization.
 *
 * A real driver samples each quantity every 1/6 s into a ring buffer.  The
 * mock's buffer is always full and every sample holds the reading of now
 * (dynamics.c: profile, workload, pattern, `mokka ctl` overrides), so a
 * reader's figures follow the board within a second.
 * Sample times are aligned to the sampling period, so two reads in the same
 * period return the same samples and `lastSeenTimeStamp` works as on a
 * real board: only samples newer than it are returned.  Under the idle
 * signature (dynamics.c) an idle board's power samples are each the draw at
 * its own time, so their minimum, maximum and average differ as a real
 * board's do, and the newest is the draw a reading answers.
 */
#include <stdio.h>
#include <sys/time.h>

#include "mock.h"

/* The driver's sampling period and how many samples its buffer keeps. */
#define SAMPLE_PERIOD_US 166667ULL
#define SAMPLE_BUFFER 120u

/* CPU time of the newest sample, in microseconds (wall clock, as NVML's
 * timestamps are). */
static unsigned long long newest_sample_us(void)
{
    struct timeval now;
    gettimeofday(&now, NULL);
    unsigned long long us = (unsigned long long)now.tv_sec * 1000000ULL + (unsigned)now.tv_usec;
    return us - us % SAMPLE_PERIOD_US;
}

/* Where each sample type's value lives; a second field is the fallback
 * (SM and graphics share one clock domain). */
static const struct {
    nvmlSamplingType_t type;
    const char *field, *fallback;
} SAMPLE_SOURCES[] = {
    {NVML_TOTAL_POWER_SAMPLES, "power.current_draw_mw", NULL},
    {NVML_GPU_UTILIZATION_SAMPLES, "utilization.gpu", NULL},
    {NVML_MEMORY_UTILIZATION_SAMPLES, "utilization.memory", NULL},
    {NVML_ENC_UTILIZATION_SAMPLES, "utilization.encoder", NULL},
    {NVML_DEC_UTILIZATION_SAMPLES, "utilization.decoder", NULL},
    {NVML_PROCESSOR_CLK_SAMPLES, "clocks.sm_current", "clocks.graphics_current"},
    {NVML_MEMORY_CLK_SAMPLES, "clocks.memory_current", NULL},
    /* Grace superchips only: the module's draw (profile `module_power`). */
    {NVML_MODULE_POWER_SAMPLES, "module_power.current_draw_mw", NULL},
    {NVML_JPG_UTILIZATION_SAMPLES, "utilization.jpeg", NULL},
    {NVML_OFA_UTILIZATION_SAMPLES, "utilization.ofa", NULL},
};

/* The value every sample of `type` holds; 0 when the board has none. */
static int sample_value(const struct mock_config *cfg, unsigned pos, nvmlSamplingType_t type,
                        unsigned *value)
{
    for (size_t i = 0; i < MOCK_COUNT(SAMPLE_SOURCES); i++) {
        if (SAMPLE_SOURCES[i].type != type)
            continue;
        return mock_dev_uint(cfg, pos, SAMPLE_SOURCES[i].field, value) ||
               (SAMPLE_SOURCES[i].fallback != NULL &&
                mock_dev_uint(cfg, pos, SAMPLE_SOURCES[i].fallback, value));
    }
    return 0;
}

MOCK_API nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t device, nvmlSamplingType_t type,
                                           unsigned long long lastSeenTimeStamp,
                                           nvmlValueType_t *sampleValType,
                                           unsigned int *sampleCount, nvmlSample_t *samples)
{
    if (sampleValType == NULL || sampleCount == NULL || (samples != NULL && *sampleCount == 0) ||
        (unsigned)type >= NVML_SAMPLINGTYPE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    unsigned value;
    if (!sample_value(c.cfg, c.pos, type, &value)) {
        r = NVML_ERROR_NOT_SUPPORTED;
    } else if (samples == NULL) {
        /* A size query: the buffer the caller needs for everything. */
        *sampleValType = NVML_VALUE_TYPE_UNSIGNED_INT;
        *sampleCount = SAMPLE_BUFFER;
    } else {
        unsigned long long newest = newest_sample_us();
        /* The samples newer than lastSeenTimeStamp, newest last; as many
         * of the most recent as the caller has room for. */
        unsigned fresh = 0;
        while (fresh < SAMPLE_BUFFER && newest - fresh * SAMPLE_PERIOD_US > lastSeenTimeStamp)
            fresh++;
        unsigned n = fresh < *sampleCount ? fresh : *sampleCount;
        for (unsigned i = 0; i < n; i++) {
            samples[i].timeStamp = newest - (unsigned long long)(n - 1 - i) * SAMPLE_PERIOD_US;
            samples[i].sampleValue.ullVal = 0;
            unsigned at = value;
            if (type == NVML_TOTAL_POWER_SAMPLES)
                mock_idle_power_at(c.cfg, c.pos, (double)samples[i].timeStamp / 1e6, &at);
            samples[i].sampleValue.uiVal = at;
        }
        *sampleValType = NVML_VALUE_TYPE_UNSIGNED_INT;
        *sampleCount = n;
        if (n == 0)
            r = NVML_ERROR_NOT_FOUND;
    }
    mock_end(&c);
    return r;
}

/* ------------------------------------------------- per-process utilization */

/* One process's share of the device's utilization.  A process entry may
 * state its own (`sm_util`, `mem_util`, `enc_util`, `dec_util`, `jpg_util`,
 * `ofa_util`); otherwise the device's figure is split evenly among its
 * processes, so the shares add up to what nvmlDeviceGetUtilizationRates
 * reports. */
struct process_util {
    unsigned pid, sm, mem, enc, dec, jpg, ofa;
};

static unsigned share(const struct mock_config *cfg, unsigned pos, unsigned process,
                      unsigned processes, const char *own, const char *device_field)
{
    char field[64];
    unsigned value = 0;
    snprintf(field, sizeof field, "processes.%u.%s", process, own);
    if (mock_dev_uint(cfg, pos, field, &value))
        return value;
    mock_dev_uint(cfg, pos, device_field, &value);
    return processes ? value / processes : 0;
}

static void store_pid(void *arg, unsigned i, unsigned pid, unsigned long long used)
{
    (void)used;
    ((unsigned *)arg)[i] = pid;
}

/* The processes with some utilization (NVML reports no idle ones); their
 * number, at most `room` of them stored in `out`. */
static unsigned busy_processes(const struct mock_config *cfg, unsigned pos,
                               struct process_util *out, unsigned room)
{
    unsigned listed = 0, busy = 0;
    unsigned long long count = 0;
    if (mock_parse_u64(mock_dev_get(cfg, pos, "processes.count"), &count) && count > 0)
        mock_dev_list_len(cfg, pos, "processes", &listed); /* most boards list none */
    /* The containers holding the GPU (workload.c) come after the profile's
     * processes and share the device's utilization with them; as many as
     * the caller can take are named. */
    unsigned held_pids[256];
    unsigned held = mock_workload_pids(cfg, pos, MOCK_COUNT(held_pids), store_pid, held_pids);
    unsigned total = listed + held;
    for (unsigned i = 0; i < total; i++) {
        char field[64];
        struct process_util u = {0};
        if (i < listed) {
            snprintf(field, sizeof field, "processes.%u.pid", i);
            mock_dev_uint(cfg, pos, field, &u.pid);
        } else if (i - listed < MOCK_COUNT(held_pids)) {
            u.pid = held_pids[i - listed];
        }
        /* a holder has no entry of its own: `processes.<i>` past the
         * profile's list is absent, so it takes the even split */
        u.sm = share(cfg, pos, i, total, "sm_util", "utilization.gpu");
        u.mem = share(cfg, pos, i, total, "mem_util", "utilization.memory");
        u.enc = share(cfg, pos, i, total, "enc_util", "utilization.encoder");
        u.dec = share(cfg, pos, i, total, "dec_util", "utilization.decoder");
        u.jpg = share(cfg, pos, i, total, "jpg_util", "utilization.jpeg");
        u.ofa = share(cfg, pos, i, total, "ofa_util", "utilization.ofa");
        if ((u.sm | u.mem | u.enc | u.dec | u.jpg | u.ofa) == 0)
            continue;
        if (busy < room)
            out[busy] = u;
        busy++;
    }
    return busy;
}

/* Shared by both generations of the query: fills up to *count records via
 * `store`, NVML's size-query and NOT_FOUND rules included. */
typedef void (*process_store)(void *array, unsigned i, const struct process_util *u,
                              unsigned long long stamp);

static nvmlReturn_t process_utilization(nvmlDevice_t device, void *array, unsigned int *count,
                                        unsigned long long lastSeenTimeStamp,
                                        process_store store)
{
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    struct process_util found[256];
    unsigned busy = busy_processes(c.cfg, c.pos, found, MOCK_COUNT(found));
    unsigned long long stamp = newest_sample_us();
    if (busy > MOCK_COUNT(found))
        busy = MOCK_COUNT(found);
    if (busy == 0 || stamp <= lastSeenTimeStamp) {
        r = NVML_ERROR_NOT_FOUND; /* nothing ran since the caller last looked */
    } else if (array == NULL || *count < busy) {
        *count = busy;
        r = NVML_ERROR_INSUFFICIENT_SIZE;
    } else {
        for (unsigned i = 0; i < busy; i++)
            store(array, i, &found[i], stamp);
        *count = busy;
    }
    mock_end(&c);
    return r;
}

static void store_sample(void *array, unsigned i, const struct process_util *u,
                         unsigned long long stamp)
{
    nvmlProcessUtilizationSample_t *s = (nvmlProcessUtilizationSample_t *)array + i;
    s->pid = u->pid;
    s->timeStamp = stamp;
    s->smUtil = u->sm;
    s->memUtil = u->mem;
    s->encUtil = u->enc;
    s->decUtil = u->dec;
}

static void store_info_v1(void *array, unsigned i, const struct process_util *u,
                          unsigned long long stamp)
{
    nvmlProcessUtilizationInfo_v1_t *s = (nvmlProcessUtilizationInfo_v1_t *)array + i;
    s->timeStamp = stamp;
    s->pid = u->pid;
    s->smUtil = u->sm;
    s->memUtil = u->mem;
    s->encUtil = u->enc;
    s->decUtil = u->dec;
    s->jpgUtil = u->jpg;
    s->ofaUtil = u->ofa;
}

MOCK_API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                      nvmlProcessUtilizationSample_t *utilization,
                                                      unsigned int *processSamplesCount,
                                                      unsigned long long lastSeenTimeStamp)
{
    if (processSamplesCount == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return process_utilization(device, utilization, processSamplesCount, lastSeenTimeStamp,
                               store_sample);
}

MOCK_API nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(
    nvmlDevice_t device, nvmlProcessesUtilizationInfo_t *procesesUtilInfo)
{
    if (procesesUtilInfo == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (procesesUtilInfo->version != nvmlProcessesUtilizationInfo_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    return process_utilization(device, procesesUtilInfo->procUtilArray,
                               &procesesUtilInfo->processSamplesCount,
                               procesesUtilInfo->lastSeenTimeStamp, store_info_v1);
}
