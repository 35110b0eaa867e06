/*
 * Event sets, and the delivery of Xids and double-bit ECC errors.
 *
 * Injected Xids are listed in the engine config (`xid.<i>.id`, `.gpu`,
 * `.code`).  As in NVML, every event set registered for XID_CRITICAL_ERROR
 * on a device gets its own copy of each Xid on that device that happens
 * after the registration; one that happened before is not recorded
 * (nvml.h, nvmlDeviceRegisterEvents).  A program that restarts its health
 * loop depends on that: the old loop's set, still inside its wait, must not
 * take the Xid from the new loop's.
 *
 * The config says which Xids exist, not when they happened, so each set
 * remembers the ones it has accounted for: at registration, every Xid then
 * listed for the device (they happened before); at a wait, each one it
 * delivers.  Any other listed Xid is new to the set: delivered to it once,
 * whatever other sets did with it, and across config re-reads and
 * re-initialization.  A set keeps a 64-bit hash of each (device, id),
 * sorted, and forgets the ones the config no longer lists (a reset), so its
 * memory follows the Xids listed now and never exceeds XID_SEEN_MAX of
 * them: past that, a new Xid is dropped, as a full event queue drops it.
 *
 * A GPU that falls off the bus logs Xid 79 on a real node.  A device whose
 * failure mode is `fallen_off_bus` with no Xid of its own (`failure.xid`)
 * raises that Xid 79 here once its failure is active in this process
 * (failure.c: at once, or when its trigger trips), so a health loop that
 * only waits for events sees the GPU go; the fall is identified by its
 * failure spec, so a set hears of it once, and a set registered after it
 * does not.
 *
 * An injected uncorrectable ECC error (`ecc_uncorrectable`, failure.c) is
 * one double-bit ECC event, delivered the same way to each set registered
 * for double-bit errors on the device before the injection, once, in
 * every process (the injection's id is the config's, not the process's),
 * with eventData 0 as nvml.h gives it for every event but a Xid.
 *
 * A health loop polls (a zero timeout) in every round, and on a quiet node
 * nothing is new: a set remembers the snapshot whose whole scan found
 * nothing new for it (mock_snapshot_serial), and a poll of the same
 * snapshot answers TIMEOUT without scanning again, reading no clock.  What
 * a scan finds changes only with the snapshot, the set's registrations and
 * deliveries, and a fall off the bus; a set listening to a device whose
 * spec can raise one always scans.
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
/* Most Xids one set accounts for (16 bytes each): far above what a node
 * lists, small enough that a damaged config cannot grow a set without bound. */
#define XID_SEEN_MAX 4096
/* Longest single sleep inside a wait; bounds Xid delivery latency. */
#define WAIT_SLICE_NS 50000000ULL
/* The Xid a GPU that falls off the bus logs. */
#define XID_FALLEN_OFF_BUS 79

static const unsigned long long SUPPORTED_EVENTS =
    nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypePState |
    nvmlEventTypeXidCriticalError | nvmlEventTypeClock;

struct xid_seen {
    unsigned long long key; /* event_key: the device and the event's identity */
    int listed;             /* the snapshot being scanned lists it */
};

struct nvmlEventSet_st {
    unsigned magic;
    pthread_mutex_t lock; /* guards everything below */
    unsigned long long mask[MOCK_MAX_DEVICES];
    struct xid_seen *seen; /* sorted by key */
    size_t seen_count, seen_capacity;
    unsigned long long quiet; /* snapshot serial whose scan found nothing new; 0: none */
};

/* The events a set accounts for one by one: those the config lists. */
#define NODE_EVENTS (nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError)

/* One event of a snapshot, on a device this process sees. */
struct node_event {
    unsigned pos;
    unsigned long long type;         /* nvmlEventType: a Xid or a double-bit error */
    unsigned long long key, data;    /* data: the Xid's code; 0 for other events */
};

static int set_valid(nvmlEventSet_t set)
{
    return set != NULL && set->magic == EVENT_SET_MAGIC;
}

/* FNV-1a over the device, a tag and the event's identity: equal events,
 * equal keys, and a listed Xid's id never meets a fall's or an ECC
 * injection's key. */
static unsigned long long event_key(unsigned pos, char tag, const void *id, size_t len)
{
    unsigned long long h = 0xcbf29ce484222325ULL;
    const unsigned char *bytes[] = {(const unsigned char *)&pos, (const unsigned char *)&tag, id};
    const size_t lens[] = {sizeof pos, 1, len};
    for (size_t part = 0; part < MOCK_COUNT(lens); part++)
        for (size_t i = 0; i < lens[part]; i++)
            h = (h ^ bytes[part][i]) * 0x100000001b3ULL;
    return h;
}

/* Entries 0..count-1 of node_event: the config's listed Xids, then one
 * slot per device for a fall off the bus, then one per device for an ECC
 * injection. */
static unsigned event_slots(const struct mock_config *cfg, unsigned *listed)
{
    *listed = 0;
    mock_cfg_list_len(cfg, "xid_count", "xid.", listed);
    return *listed + 2 * cfg->device_count;
}

/* Slot `i`: 1 and *out when it holds an event on a device this process sees. */
static int node_event(const struct mock_config *cfg, unsigned listed, unsigned i,
                      struct node_event *out)
{
    if (i >= listed + cfg->device_count) {
        unsigned pos = i - listed - cfg->device_count;
        unsigned long long id;
        if (pos >= MOCK_MAX_DEVICES || cfg->ordinal[pos] < 0 ||
            !mock_failure_ecc_injection(cfg, pos, &id))
            return 0;
        *out = (struct node_event){pos, nvmlEventTypeDoubleBitEccError,
                                   event_key(pos, 'e', &id, sizeof id), 0};
        return 1;
    }
    if (i >= listed) {
        unsigned pos = i - listed;
        unsigned long long spec;
        if (pos >= MOCK_MAX_DEVICES || !mock_failure_fell_off(cfg, pos, &spec))
            return 0;
        *out = (struct node_event){pos, nvmlEventTypeXidCriticalError,
                                   event_key(pos, 'f', &spec, sizeof spec), XID_FALLEN_OFF_BUS};
        return 1;
    }
    char key[64];
    unsigned long long gpu, code;
    snprintf(key, sizeof key, "xid.%u.id", i);
    const char *id = mock_cfg_get(cfg, key);
    snprintf(key, sizeof key, "xid.%u.gpu", i);
    int has_gpu = mock_cfg_u64(cfg, key, &gpu);
    snprintf(key, sizeof key, "xid.%u.code", i);
    if (id == NULL || !has_gpu || !mock_cfg_u64(cfg, key, &code))
        return 0;
    if (gpu >= cfg->device_count || gpu >= MOCK_MAX_DEVICES || cfg->ordinal[gpu] < 0)
        return 0; /* a GPU this process cannot see */
    *out = (struct node_event){(unsigned)gpu, nvmlEventTypeXidCriticalError,
                               event_key((unsigned)gpu, 'x', id, strlen(id)), code};
    return 1;
}

/* Called with set->lock held: where `key` is in set->seen, or where it would go. */
static size_t seen_find(nvmlEventSet_t set, unsigned long long key, int *found)
{
    size_t lo = 0, hi = set->seen_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (set->seen[mid].key < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = lo < set->seen_count && set->seen[lo].key == key;
    return lo;
}

/* Called with set->lock held.  Returns 0 when the set is full or out of memory. */
static int seen_add(nvmlEventSet_t set, unsigned long long key)
{
    int found;
    size_t at = seen_find(set, key, &found);
    if (found) {
        set->seen[at].listed = 1;
        return 1;
    }
    if (set->seen_count >= XID_SEEN_MAX)
        return 0;
    if (set->seen_count == set->seen_capacity) {
        size_t capacity = set->seen_capacity ? 2 * set->seen_capacity : 16;
        void *grown = realloc(set->seen, capacity * sizeof *set->seen);
        if (grown == NULL)
            return 0;
        set->seen = grown;
        set->seen_capacity = capacity;
    }
    memmove(&set->seen[at + 1], &set->seen[at], (set->seen_count - at) * sizeof *set->seen);
    set->seen[at] = (struct xid_seen){key, 1};
    set->seen_count++;
    return 1;
}

/* Called with set->lock held: forget the Xids the scanned snapshot no
 * longer lists (order kept, so the array stays sorted). */
static void seen_prune(nvmlEventSet_t set)
{
    size_t kept = 0;
    for (size_t i = 0; i < set->seen_count; i++)
        if (set->seen[i].listed)
            set->seen[kept++] = set->seen[i];
    set->seen_count = kept;
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
    free(set->seen);
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
    unsigned long long starting = eventTypes & NODE_EVENTS & ~set->mask[c.pos];
    if (starting) {
        /* Recording starts now: the device's events so far are accounted for. */
        unsigned listed, slots = event_slots(c.cfg, &listed), before = 0;
        struct node_event event;
        for (unsigned i = 0; i < slots; i++)
            if (node_event(c.cfg, listed, i, &event) && event.pos == c.pos &&
                (event.type & starting)) {
                seen_add(set, event.key);
                before++;
            }
        /* says when recording starts: an event raised before this is not the set's */
        mock_debug("event set %p records the %s of device %u from now on (%u before)",
                   (void *)set,
                   starting == NODE_EVENTS ? "Xids and double-bit ECC errors"
                   : starting == nvmlEventTypeXidCriticalError ? "Xids"
                                                               : "double-bit ECC errors",
                   c.pos, before);
    }
    set->mask[c.pos] |= eventTypes;
    set->quiet = 0; /* what a scan finds may have changed */
    pthread_mutex_unlock(&set->lock);
    mock_end(&c);
    return r;
}

/* Called with set->lock held: whether a device the set hears Xids of may
 * fall off the bus in this process (no new snapshot tells). */
static int may_fall(const struct mock_config *cfg, nvmlEventSet_t set)
{
    for (unsigned pos = 0; pos < cfg->device_count && pos < MOCK_MAX_DEVICES; pos++)
        if (cfg->failure[pos].raises_xid && (set->mask[pos] & nvmlEventTypeXidCriticalError))
            return 1;
    return 0;
}

/* Takes the first event of the snapshot that is new to this set, of a type
 * it listens to on that device, and forgets the ones the snapshot no
 * longer lists. */
static int take_event(const struct mock_config *cfg, nvmlEventSet_t set, nvmlEventData_t *out)
{
    unsigned long long serial = mock_snapshot_serial(cfg);
    pthread_mutex_lock(&set->lock);
    if (serial != 0 && set->quiet == serial && !may_fall(cfg, set)) {
        pthread_mutex_unlock(&set->lock); /* scanned already: nothing new */
        return 0;
    }
    unsigned listed, slots = event_slots(cfg, &listed);
    struct node_event event, fresh;
    int pending = 0, taken = 0;
    for (size_t i = 0; i < set->seen_count; i++)
        set->seen[i].listed = 0;
    for (unsigned i = 0; i < slots; i++) {
        if (!node_event(cfg, listed, i, &event) || !(set->mask[event.pos] & event.type))
            continue;
        int found;
        size_t at = seen_find(set, event.key, &found);
        if (found)
            set->seen[at].listed = 1;
        else if (!pending) {
            fresh = event;
            pending = 1;
        }
    }
    seen_prune(set);
    if (pending && seen_add(set, fresh.key)) {
        out->device = mock_handle(fresh.pos);
        out->eventType = fresh.type;
        out->eventData = fresh.data;
        out->gpuInstanceId = 0xFFFFFFFFu; /* not a MIG device */
        out->computeInstanceId = 0xFFFFFFFFu;
        taken = 1;
    }
    set->quiet = pending ? 0 : serial; /* a set too full to take one scans again */
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
    /* a poll (no timeout) reads no clock */
    unsigned long long deadline =
        timeoutms ? mock_now_ns() + (unsigned long long)timeoutms * 1000000ULL : 0;
    for (;;) {
        struct mock_config *cfg = mock_acquire();
        if (cfg == NULL)
            return NVML_ERROR_UNINITIALIZED;
        nvmlEventData_t event;
        memset(&event, 0, sizeof event);
        int taken = take_event(cfg, set, &event);
        mock_release(cfg);
        if (taken) {
            *data = event;
            return NVML_SUCCESS;
        }
        if (timeoutms == 0)
            return NVML_ERROR_TIMEOUT;
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
    /* Nothing process-wide: what a set remembers is the set's, and goes
     * with nvmlEventSetFree. */
}
