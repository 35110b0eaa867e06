/*
 * The current snapshot and its lifecycle: publishing a new one, the
 * references that keep the old ones alive, and the hot path every call
 * runs (mock_acquire / mock_release).  When to look for a newer config is
 * refresh.c's and notice.c's; init and shutdown are library.c's.
 *
 * The hot path takes no lock.  The current snapshot is a pointer read with
 * an acquire load; what keeps it alive is a reference each thread holds on
 * the snapshot it last used (a thread-local cache).  A call whose snapshot
 * is still current touches nothing shared but that pointer; a thread that
 * meets a newer one takes mock_lock once to move its reference over.  So a
 * reload never frees a snapshot another thread is reading: that thread
 * still holds it.  The price is bounded: an idle thread keeps the snapshot
 * it last used (one per thread) until its next call or its exit.  Calls
 * nested in a call (a getter built on another) keep the outer call's
 * snapshot, so one NVML call sees one config.
 *
 * A call's test for a change is inline here (library.h): the notice's
 * counter (read from its file in the first calls of a clock tick) against
 * the value the snapshot was loaded at, and the stat schedule.  Only a
 * call that finds either moved leaves the hot path (acquire_slow).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>

#include "library.h"

/* One thread's reference on the snapshot it last used (see above).  The
 * thread-local is initial-exec: every call reads it, and the general model
 * costs a __tls_get_addr call each time.  A library loaded with dlopen
 * takes the few bytes from the static TLS surplus glibc keeps for that. */
struct thread_cache {
    struct mock_config *cfg;    /* holds one reference, or NULL */
    unsigned depth;             /* mock_acquire calls not yet released */
    unsigned long long now;     /* coarse_ns() when the outermost call began */
    int registered;             /* linked into g_caches, key value set */
    struct thread_cache *prev, *next;
};

/* What every call reads (library.h says what each is).  The notice's and
 * the schedule's variables are notice.c's and refresh.c's to change, but
 * are defined here, beside the snapshot's, so the hot path's state stays
 * together in memory as it was when one file held it all (the bench
 * bench/nvml_calls.py tells the difference on a busy board). */
struct mock_config *mock_current;
unsigned long long mock_loaded_notice;
unsigned long long mock_notice_value;
unsigned long long mock_notice_tick;
unsigned mock_notice_reads;
unsigned long long mock_due_ns;
unsigned long long mock_recheck_ns = MOCK_RECHECK_INTERVAL_NS;

static __thread struct thread_cache t_cache __attribute__((tls_model("initial-exec")));
static struct thread_cache *g_caches;     /* every registered thread's cache (mock_lock) */
static pthread_key_t g_cache_key;         /* runs forget_thread at thread exit */
static int g_cache_key_made;

void mock_drop_ref(struct mock_config *cfg)
{
    if (cfg != NULL && __atomic_sub_fetch(&cfg->refs, 1, __ATOMIC_ACQ_REL) == 0)
        mock_config_free(cfg);
}

/* Called with mock_lock held: the newest snapshot becomes current, loaded
 * at counter value `seen`.  The pointer is published before the value, so
 * a call that reads the value (acquire) and then the pointer never pairs
 * the new value with the old snapshot. */
void mock_publish(struct mock_config *cfg, unsigned long long seen)
{
    struct mock_config *old = mock_current;
    __atomic_store_n(&mock_current, cfg, __ATOMIC_RELEASE);
    __atomic_store_n(&mock_loaded_notice, seen, __ATOMIC_RELEASE);
    mock_drop_ref(old); /* threads still using it hold references of their own */
}

/* Called with mock_lock held: unlink a thread's cache and drop its reference. */
static void forget_cache(struct thread_cache *tc)
{
    if (tc->registered) {
        if (tc->prev != NULL)
            tc->prev->next = tc->next;
        else
            g_caches = tc->next;
        if (tc->next != NULL)
            tc->next->prev = tc->prev;
        tc->prev = tc->next = NULL;
        tc->registered = 0;
    }
    mock_drop_ref(tc->cfg);
    tc->cfg = NULL;
}

/* A thread's exit: its reference goes with it. */
static void forget_thread(void *value)
{
    pthread_mutex_lock(&mock_lock);
    forget_cache(value);
    pthread_mutex_unlock(&mock_lock);
}

/* Called with mock_lock held: the thread's cache is listed (so the
 * library's unload still reaches it) and dropped at the thread's exit. */
static void register_cache(struct thread_cache *tc)
{
    if (tc->registered)
        return;
    if (!g_cache_key_made) {
        if (pthread_key_create(&g_cache_key, forget_thread) != 0)
            return; /* no destructor: the reference stays listed until unload */
        g_cache_key_made = 1;
    }
    pthread_setspecific(g_cache_key, tc);
    tc->registered = 1;
    tc->prev = NULL;
    tc->next = g_caches;
    if (g_caches != NULL)
        g_caches->prev = tc;
    g_caches = tc;
}

/* The slow path of mock_acquire: re-read what changed, then move this
 * thread's reference to the current snapshot. */
__attribute__((noinline, cold)) static struct mock_config *acquire_slow(struct thread_cache *tc,
                                                                       int stale)
{
    pthread_mutex_lock(&mock_lock);
    if (stale)
        mock_refresh_locked();
    struct mock_config *cur = mock_current;
    if (cur != tc->cfg) {
        if (cur != NULL)
            __atomic_add_fetch(&cur->refs, 1, __ATOMIC_ACQ_REL);
        mock_drop_ref(tc->cfg);
        tc->cfg = cur;
        if (cur != NULL)
            register_cache(tc);
    }
    pthread_mutex_unlock(&mock_lock);
    return cur;
}

/* noinline: whole, as every call enters it; otherwise GCC may split it
 * (partial inlining) and the outermost call pays a jump to the rest. */
__attribute__((noinline)) struct mock_config *mock_acquire(void)
{
    struct thread_cache *tc = &t_cache;
    if (tc->depth > 0) {
        /* a call inside a call: the outer call's snapshot */
        tc->depth++;
        return tc->cfg;
    }
    /* The order matters: the value the snapshot was loaded at, then the
     * counter (read from its file first, when due), then the snapshot (see
     * mock_publish). */
    tc->now = coarse_ns();
    if (__builtin_expect(mock_notice_due(tc->now), 0))
        mock_notice_read();
    unsigned long long loaded = __atomic_load_n(&mock_loaded_notice, __ATOMIC_ACQUIRE);
    int stale = mock_notice_now() != loaded || mock_schedule_due(tc->now);
    struct mock_config *cur = __atomic_load_n(&mock_current, __ATOMIC_ACQUIRE);
    if (__builtin_expect(stale || (cur != tc->cfg && cur != NULL), 0))
        cur = acquire_slow(tc, stale);
    if (cur == NULL)
        return NULL;
    tc->depth = 1;
    return cur;
}

unsigned long long mock_call_clock(void)
{
    const struct thread_cache *tc = &t_cache;
    return tc->depth > 0 ? tc->now : coarse_ns();
}

void mock_release(struct mock_config *cfg)
{
    struct thread_cache *tc = &t_cache;
    if (cfg != NULL && cfg == tc->cfg && tc->depth > 0) {
        tc->depth--; /* the thread keeps its reference for its next call */
        return;
    }
    mock_drop_ref(cfg); /* a workload snapshot */
}

nvmlReturn_t mock_require_init(void)
{
    /* Acquiring also re-reads a changed config, as every call does. */
    struct mock_config *cfg = mock_acquire();
    if (cfg == NULL)
        return NVML_ERROR_UNINITIALIZED;
    mock_release(cfg);
    return NVML_SUCCESS;
}

/* The unloading thread is in no call, so its cache goes too; other
 * threads' stay listed (a thread still running may be mid-call). */
void mock_snapshot_cleanup(void)
{
    if (t_cache.depth == 0)
        forget_cache(&t_cache);
    if (g_cache_key_made) {
        /* the destructor's code may be unmapped before other threads exit */
        pthread_key_delete(g_cache_key);
        g_cache_key_made = 0;
    }
}
