/*
 * Event sets and Xid delivery.
 *
 * Injected Xids are listed in the engine config (`xid.<i>.id`, `.gpu`,
 * `.code`).  nvmlEventSetWait hands each one out exactly once per process,
 * to a set registered for XID_CRITICAL_ERROR on that device: the ids
 * already delivered are remembered process-wide, so a Xid survives config
 * re-reads and re-initialization without repeating.
 *
 * The wait really blocks for its timeout when nothing is pending.  The
 * device plugin's health loop calls it with 5000 ms in a tight loop; an
 * immediate return would spin a CPU (nvidia-smi was measured calling it
 * 740,218 times in 2 s against a non-blocking mock).  The wait sleeps in
 * short slices, re-reading the config (at most once a second) so a Xid
 * injected meanwhile is delivered promptly.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mock.h"

#define EVENT_SET_MAGIC 0x45564e54u /* "EVNT" */
#define XID_ID_MAX 128
/* Longest single sleep inside a wait; bounds Xid delivery latency. */
#define WAIT_SLICE_NS 50000000ULL

static const unsigned long long SUPPORTED_EVENTS =
    nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypePState |
    nvmlEventTypeXidCriticalError | nvmlEventTypeClock;

struct nvmlEventSet_st {
    unsigned magic;
    pthread_mutex_t lock; /* guards mask */
    unsigned long long mask[MOCK_MAX_DEVICES];
};

/* Ids of the Xids this process has delivered (grows; a few per test). */
static pthread_mutex_t g_xid_lock = PTHREAD_MUTEX_INITIALIZER;
static char (*g_delivered)[XID_ID_MAX];
static size_t g_delivered_count, g_delivered_capacity;

static int set_valid(nvmlEventSet_t set)
{
    return set != NULL && set->magic == EVENT_SET_MAGIC;
}

MOCK_API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    if (set == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = mock_require_init();
    if (r != NVML_SUCCESS)
        return r;
    struct nvmlEventSet_st *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NVML_ERROR_MEMORY;
    s->magic = EVENT_SET_MAGIC;
    pthread_mutex_init(&s->lock, NULL);
    *set = s;
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    if (!set_valid(set))
        return NVML_ERROR_INVALID_ARGUMENT;
    set->magic = 0;
    pthread_mutex_destroy(&set->lock);
    free(set);
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                                       unsigned long long *eventTypes)
{
    return mock_constant_u64(device, MOCK_GUARDED, SUPPORTED_EVENTS, eventTypes);
}

MOCK_API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                               nvmlEventSet_t set)
{
    if (!set_valid(set))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (eventTypes & ~SUPPORTED_EVENTS)
        return NVML_ERROR_NOT_SUPPORTED;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    pthread_mutex_lock(&set->lock);
    set->mask[c.pos] |= eventTypes;
    pthread_mutex_unlock(&set->lock);
    mock_end(&c);
    return r;
}

/* Called with g_xid_lock held. */
static int already_delivered(const char *id)
{
    for (size_t i = 0; i < g_delivered_count; i++)
        if (strcmp(g_delivered[i], id) == 0)
            return 1;
    return 0;
}

/* Called with g_xid_lock held.  Returns 0 when out of memory. */
static int remember_delivered(const char *id)
{
    if (g_delivered_count == g_delivered_capacity) {
        size_t capacity = g_delivered_capacity ? 2 * g_delivered_capacity : 16;
        void *grown = realloc(g_delivered, capacity * sizeof *g_delivered);
        if (grown == NULL)
            return 0;
        g_delivered = grown;
        g_delivered_capacity = capacity;
    }
    strcpy(g_delivered[g_delivered_count++], id);
    return 1;
}

/* Takes the first pending Xid for a device this set listens to. */
static int take_xid(const struct mock_config *cfg, nvmlEventSet_t set, nvmlEventData_t *out)
{
    unsigned count = 0;
    mock_cfg_list_len(cfg, "xid_count", "xid.", &count);
    int taken = 0;
    pthread_mutex_lock(&set->lock);
    pthread_mutex_lock(&g_xid_lock);
    for (unsigned i = 0; i < count && !taken; i++) {
        char key[64];
        unsigned long long gpu, code;
        snprintf(key, sizeof key, "xid.%u.id", i);
        const char *id = mock_cfg_get(cfg, key);
        snprintf(key, sizeof key, "xid.%u.gpu", i);
        int has_gpu = mock_cfg_u64(cfg, key, &gpu);
        snprintf(key, sizeof key, "xid.%u.code", i);
        if (id == NULL || strlen(id) >= XID_ID_MAX || !has_gpu || !mock_cfg_u64(cfg, key, &code))
            continue;
        if (gpu >= cfg->device_count || cfg->ordinal[gpu] < 0)
            continue; /* a GPU this process cannot see */
        if (!(set->mask[gpu] & nvmlEventTypeXidCriticalError) || already_delivered(id))
            continue;
        if (!remember_delivered(id))
            break;
        out->device = mock_handle((unsigned)gpu);
        out->eventType = nvmlEventTypeXidCriticalError;
        out->eventData = code;
        out->gpuInstanceId = 0xFFFFFFFFu; /* not a MIG device */
        out->computeInstanceId = 0xFFFFFFFFu;
        taken = 1;
    }
    pthread_mutex_unlock(&g_xid_lock);
    pthread_mutex_unlock(&set->lock);
    return taken;
}

static void sleep_ns(unsigned long long ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ULL),
                          .tv_nsec = (long)(ns % 1000000000ULL)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

MOCK_API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                          unsigned int timeoutms)
{
    if (!set_valid(set) || data == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long deadline = mock_now_ns() + (unsigned long long)timeoutms * 1000000ULL;
    for (;;) {
        struct mock_config *cfg = mock_acquire();
        if (cfg == NULL)
            return NVML_ERROR_UNINITIALIZED;
        nvmlEventData_t event;
        memset(&event, 0, sizeof event);
        int taken = take_xid(cfg, set, &event);
        mock_release(cfg);
        if (taken) {
            *data = event;
            return NVML_SUCCESS;
        }
        unsigned long long now = mock_now_ns();
        if (now >= deadline)
            return NVML_ERROR_TIMEOUT;
        unsigned long long left = deadline - now;
        sleep_ns(left < WAIT_SLICE_NS ? left : WAIT_SLICE_NS);
    }
}

MOCK_API nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data,
                                       unsigned int timeoutms)
{
    /* The v1 record ends after eventData: do not write the instance ids. */
    if (data == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlEventData_t event;
    nvmlReturn_t r = nvmlEventSetWait_v2(set, &event, timeoutms);
    if (r == NVML_SUCCESS) {
        data->device = event.device;
        data->eventType = event.eventType;
        data->eventData = event.eventData;
    }
    return r;
}

void mock_events_cleanup(void)
{
    pthread_mutex_lock(&g_xid_lock);
    free(g_delivered);
    g_delivered = NULL;
    g_delivered_count = g_delivered_capacity = 0;
    pthread_mutex_unlock(&g_xid_lock);
}
