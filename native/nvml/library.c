/*
 * Library state: initialization reference count, the current config
 * snapshot, and re-reading the config when it changes.
 *
 * NVML counts nvmlInit/nvmlShutdown pairs; the library stays usable until
 * the last shutdown.  The engine config is found through MOCK_NVML_CONFIG,
 * else next to the library itself (locate.c), else, when no file is there,
 * over the node daemon's socket (remote.c, refresh_remote).  A broken
 * rewrite keeps the last good snapshot.  The error strings are errors.c's.
 *
 * Noticing a change (docs/engine-config.md, "Change notice"): the daemon
 * bumps an 8-byte counter, `generation` beside the config, after it has
 * renamed a new config or workload file into place.  The library keeps the
 * file open from init and reads the counter with pread: a call compares it
 * with the value the current snapshot was loaded at.  Not a mapping: a
 * mapped page past the end of a file that was truncated faults (SIGBUS) in
 * the client, and pread of a damaged file only comes back short, which
 * keeps the last value read.  The read is a system call, so a process reads
 * the counter in the first NOTICE_READS_PER_TICK calls of each tick of
 * CLOCK_REALTIME_COARSE (the clock every call reads anyway) and later calls
 * of that tick compare the value read last: a client making a few calls
 * sees a change at its very next call, one spinning on calls within a tick,
 * and the spinning one pays a few reads a tick, not one a call.  The config
 * is also stat'ed at most once a second (the same clock decides when): that
 * is all an old daemon without the counter gets, and it is how a counter
 * file that was replaced (a new stage after a discard) is noticed and
 * opened again.
 *
 * Every file is opened O_NONBLOCK and must be a regular file (fstat), so
 * a FIFO, a device or a directory put in a file's place is refused at once
 * instead of blocking the client in open() or read().
 *
 * The hot path takes no lock.  The current snapshot is a pointer read with
 * an acquire load; what keeps it alive is a reference each thread holds on
 * the snapshot it last used (a thread-local cache).  A call whose snapshot
 * is still current touches nothing shared but that pointer; a thread that
 * meets a newer one takes g_lock once to move its reference over.  So a
 * reload never frees a snapshot another thread is reading: that thread
 * still holds it.  The price is bounded: an idle thread keeps the snapshot
 * it last used (one per thread) until its next call or its exit.  Calls
 * nested in a call (a getter built on another) keep the outer call's
 * snapshot, so one NVML call sees one config.
 *
 * Everything else mutable here is guarded by g_lock.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mock.h"

/* The change notice's size (its name: locate.c). */
#define NOTICE_BYTES 8
/* Calls of one coarse clock tick (4 ms at most) that read the counter; the
 * rest of the tick's calls compare the value read last.  A reading costs
 * a pread (a fraction of a microsecond): 64 of them a tick cost a spinning
 * client under 1 % and let any client making fewer calls than that see a
 * bump at its next call. */
#define NOTICE_READS_PER_TICK 64

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

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned g_init_refs;              /* nvmlInit calls not yet shut down */
static struct mock_config *g_current;     /* newest good snapshot, or NULL (atomic) */
static char g_path[PATH_MAX];             /* config file in use */
static struct stat g_stamp;               /* identity of the file g_current came from */
static unsigned long long g_due_ns;       /* coarse_ns() of the next stat (atomic) */
static unsigned long long g_recheck_ns = MOCK_RECHECK_INTERVAL_NS; /* atomic: read by every call */
/* How many times the files were looked at (atomic): workload.c looks at
 * its file when this moved, so a reading needs no clock of its own. */
unsigned long long mock_checks; /* read through mock_check_count (mock.h) */

/* The counter file, open read-only: g_notice_fd is -1 without one (read
 * by every call that reads the counter: atomic).  Once opened, the
 * descriptor's number stays the library's for good (g_notice_held): a
 * replaced file is dup3'ed onto it, so a thread reading it meanwhile reads
 * the old file or the new one, never a descriptor the client opened
 * since.  g_notice_value is the counter as last read (0 without a file),
 * g_loaded_notice its value when the files were last read; every call
 * compares the two (atomic).  g_notice_tick and g_notice_reads count the
 * reads of the current clock tick (atomic, racy by design: a race only
 * costs a read more or less). */
static int g_notice_fd = -1;
static int g_notice_held = -1;
static unsigned long long g_notice_value;
static unsigned long long g_loaded_notice;
static unsigned long long g_notice_tick;
static unsigned g_notice_reads;
static char g_notice_path[PATH_MAX];
static dev_t g_notice_dev;                /* identity of the open file */
static ino_t g_notice_ino;

/* Over the node daemon's socket (remote.c): g_remote is set when nvmlInit
 * found no config beside the library and the socket at g_socket answered.
 * The files then come from there, asked for on the stat schedule (every
 * MOCK_REMOTE_INTERVAL_NS, longer after failures) with the token of the
 * files in force, g_token; there is no change notice.  Guarded by g_lock. */
static int g_remote;
static char g_socket[PATH_MAX];
static char g_token[MOCK_REMOTE_TOKEN + 1];
static unsigned g_remote_failures;        /* exchanges failed in a row */

static __thread struct thread_cache t_cache __attribute__((tls_model("initial-exec")));
static struct thread_cache *g_caches;     /* every registered thread's cache */
static pthread_key_t g_cache_key;         /* runs forget_thread at thread exit */
static int g_cache_key_made;

unsigned long long mock_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}

/* The wall clock at the kernel tick's resolution (a few ms), read once per
 * call (mock_call_clock): enough for the stat schedule, at a fraction of
 * the precise clock's cost, and the instant the readings are for
 * (readings.c), so a call reads one clock.  It is the wall clock for the
 * readings' sake (every process agrees on it); the schedule copes with it
 * being set back (schedule_due). */
static unsigned long long coarse_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}

/* Whether the stat schedule is due at `now`: the due time has come, or the
 * clock was set back past the time the schedule was made. */
static int schedule_due(unsigned long long now)
{
    unsigned long long due = __atomic_load_n(&g_due_ns, __ATOMIC_RELAXED);
    return now >= due || due - now > __atomic_load_n(&g_recheck_ns, __ATOMIC_RELAXED);
}

void mock_debug(const char *fmt, ...)
{
    const char *flag = getenv("MOCK_NVML_DEBUG");
    if (flag == NULL || *flag == '\0' || strcmp(flag, "0") == 0)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "mock-nvml: %s\n", line);
}

int mock_open_regular(const char *path, struct stat *st)
{
    /* O_NONBLOCK: opening a FIFO for reading waits for a writer otherwise */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return -1;
    if (fstat(fd, st) != 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        errno = S_ISDIR(st->st_mode) ? EISDIR : EINVAL;
        return -1;
    }
    return fd;
}

/* Called with g_lock held: open the counter file when it is there and not
 * the one already open (first sight, or replaced by a new stage).  The
 * replacement takes the old descriptor's number (see g_notice_fd). */
static void track_notice(void)
{
    if (g_notice_path[0] == '\0')
        return;
    struct stat st;
    int fd = mock_open_regular(g_notice_path, &st);
    if (fd < 0)
        return; /* none (an older daemon, or torn down), or damaged: the stat schedule alone */
    if (g_notice_fd >= 0 && st.st_dev == g_notice_dev && st.st_ino == g_notice_ino) {
        close(fd);
        return;
    }
    if (g_notice_held < 0) {
        g_notice_held = fd;
    } else {
        int moved = dup3(fd, g_notice_held, O_CLOEXEC);
        close(fd);
        if (moved < 0) {
            mock_debug("cannot open change notice %s: %s", g_notice_path, strerror(errno));
            return;
        }
    }
    g_notice_dev = st.st_dev;
    g_notice_ino = st.st_ino;
    __atomic_store_n(&g_notice_fd, g_notice_held, __ATOMIC_RELEASE);
    mock_debug("change notice %s opened", g_notice_path);
}

/* Reads the counter into g_notice_value.  A file cut shorter than the
 * counter (damaged: the daemon writes all 8 bytes in place) answers short
 * and the last value read stands; so does a failed read. */
__attribute__((noinline)) static void read_notice(void)
{
    int fd = __atomic_load_n(&g_notice_fd, __ATOMIC_ACQUIRE);
    unsigned char raw[NOTICE_BYTES];
    if (fd < 0 || pread(fd, raw, sizeof raw, 0) != (ssize_t)sizeof raw)
        return;
    unsigned long long value = 0;
    for (size_t i = sizeof raw; i-- > 0;)
        value = value << 8 | raw[i]; /* little-endian, as the daemon writes it */
    __atomic_store_n(&g_notice_value, value, __ATOMIC_RELEASE);
}

/* Whether this call reads the counter: the first NOTICE_READS_PER_TICK
 * calls of the clock tick `now` do. */
static inline int notice_due(unsigned long long now)
{
    if (__atomic_load_n(&g_notice_tick, __ATOMIC_RELAXED) != now) {
        __atomic_store_n(&g_notice_tick, now, __ATOMIC_RELAXED);
        __atomic_store_n(&g_notice_reads, 1, __ATOMIC_RELAXED);
        return 1;
    }
    if (__atomic_load_n(&g_notice_reads, __ATOMIC_RELAXED) >= NOTICE_READS_PER_TICK)
        return 0;
    __atomic_add_fetch(&g_notice_reads, 1, __ATOMIC_RELAXED);
    return 1;
}

/* The counter as last read (0 without a change notice).  Read it before
 * the files it announces (docs/engine-config.md). */
static unsigned long long notice_now(void)
{
    return __atomic_load_n(&g_notice_value, __ATOMIC_ACQUIRE);
}

/* Reads and parses the config at `path` (mock_config_load) into a snapshot
 * ready to serve, or NULL with *missing set when there is no file.  The
 * stamp is taken first: should the file be replaced in between, the next
 * check sees a new stamp and reads it again, never the reverse. */
static struct mock_config *load_config(const char *path, struct stat *stamp, int *missing)
{
    if (stat(path, stamp) != 0)
        memset(stamp, 0, sizeof *stamp);
    char err[512];
    struct mock_config *cfg = mock_config_load(path, missing, err, sizeof err);
    if (cfg == NULL) {
        mock_debug("%s engine config %s: %s", *missing ? "no" : "invalid", path, err);
        return NULL;
    }
    mock_compute_visibility(cfg);
    mock_failure_prepare(cfg);
    return cfg;
}

static void drop_ref(struct mock_config *cfg)
{
    if (cfg != NULL && __atomic_sub_fetch(&cfg->refs, 1, __ATOMIC_ACQ_REL) == 0)
        mock_config_free(cfg);
}

/* Called with g_lock held: the newest snapshot becomes current, loaded at
 * counter value `seen`.  The pointer is published before the value, so a
 * call that reads the value (acquire) and then the pointer never pairs the
 * new value with the old snapshot. */
static void publish(struct mock_config *cfg, unsigned long long seen)
{
    struct mock_config *old = g_current;
    __atomic_store_n(&g_current, cfg, __ATOMIC_RELEASE);
    __atomic_store_n(&g_loaded_notice, seen, __ATOMIC_RELEASE);
    drop_ref(old); /* threads still using it hold references of their own */
}

/* Called with g_lock held: the snapshot an answer of the socket makes, or
 * NULL when its config does not parse (the last good one stays).  Its
 * workload goes to workload.c with it.  Frees the answer's text. */
static struct mock_config *remote_load(struct mock_remote_reply *reply)
{
    char err[512];
    struct mock_config *cfg = mock_config_parse(reply->text, reply->config_len,
                                                MOCK_REMOTE_DIR, err, sizeof err);
    if (cfg == NULL) {
        mock_debug("invalid engine config from %s: %s", g_socket, err);
        free(reply->text);
        return NULL;
    }
    mock_compute_visibility(cfg);
    mock_failure_prepare(cfg);
    struct mock_config *wl = NULL;
    if (reply->workload_len > 0) {
        wl = mock_config_parse(reply->text + reply->config_len, reply->workload_len,
                               MOCK_REMOTE_DIR, err, sizeof err);
        if (wl == NULL)
            mock_debug("workload file from %s ignored (every GPU idle): %s", g_socket, err);
    }
    mock_workload_adopt(MOCK_REMOTE_DIR, wl);
    free(reply->text);
    return cfg;
}

/* Called with g_lock held, when the schedule is due: ask the socket
 * whether the files changed.  The next time is set before the exchange,
 * so other threads' calls go on serving the current snapshot meanwhile;
 * a failed exchange asks again later and later (up to
 * MOCK_REMOTE_BACKOFF_NS), so a server that hangs costs a bounded share
 * of the calls' time, and one that comes back is heard within seconds. */
static void refresh_remote(unsigned long long now)
{
    __atomic_store_n(&g_due_ns, now + MOCK_REMOTE_INTERVAL_NS, __ATOMIC_RELAXED);
    struct mock_remote_reply reply;
    int r = mock_remote_fetch(g_socket, g_token, &reply);
    if (r < 0) {
        unsigned shift = g_remote_failures < 3 ? g_remote_failures : 3;
        unsigned long long wait = MOCK_REMOTE_INTERVAL_NS << shift;
        g_remote_failures++;
        __atomic_store_n(&g_due_ns, coarse_ns() + (wait < MOCK_REMOTE_BACKOFF_NS ? wait
                                                   : MOCK_REMOTE_BACKOFF_NS), __ATOMIC_RELAXED);
        return;
    }
    g_remote_failures = 0;
    if (r == 0)
        return;
    /* A broken config is not asked for again until it changes, as a
     * broken file is not re-parsed every second. */
    strcpy(g_token, reply.token);
    struct mock_config *cfg = remote_load(&reply);
    __atomic_add_fetch(&mock_checks, 1, __ATOMIC_RELEASE);
    if (cfg == NULL)
        return;
    mock_debug("engine config from %s changed; re-read it (%u devices)", g_socket,
               cfg->device_count);
    publish(cfg, g_loaded_notice);
}

/* Called with g_lock held by nvmlInit, when no config is beside the
 * library: the first snapshot from the node daemon's socket, or NULL. */
static struct mock_config *remote_first(void)
{
    g_token[0] = '\0';
    g_remote_failures = 0;
    if (!mock_remote_locate(g_socket, sizeof g_socket))
        return NULL;
    struct mock_remote_reply reply;
    if (mock_remote_fetch(g_socket, NULL, &reply) != 1)
        return NULL;
    strcpy(g_token, reply.token);
    return remote_load(&reply);
}

/* Called with g_lock held: re-read what changed, if anything did.  The
 * counter is read before the files: a bump that lands while they are read
 * differs from `seen` and brings the next call back here. */
static void refresh_locked(void)
{
    if (g_init_refs == 0 || g_current == NULL)
        return;
    unsigned long long now = coarse_ns();
    int scheduled = schedule_due(now);
    if (g_remote) {
        if (scheduled)
            refresh_remote(now);
        return;
    }
    if (scheduled) {
        __atomic_store_n(&g_due_ns, now + g_recheck_ns, __ATOMIC_RELAXED);
        track_notice();
    }
    read_notice();
    unsigned long long seen = notice_now();
    if (!scheduled && seen == g_loaded_notice)
        return; /* another thread got here first */
    __atomic_add_fetch(&mock_checks, 1, __ATOMIC_RELEASE);
    struct stat stamp;
    if (stat(g_path, &stamp) != 0) {
        /* a moment between unlink and rename, or removed: keep serving */
        __atomic_store_n(&g_loaded_notice, seen, __ATOMIC_RELEASE);
        return;
    }
    if (mock_same_file(&stamp, &g_stamp)) {
        /* the bump was for the workload file (workload.c follows it) */
        __atomic_store_n(&g_loaded_notice, seen, __ATOMIC_RELEASE);
        return;
    }
    int missing;
    struct mock_config *cfg = load_config(g_path, &stamp, &missing);
    g_stamp = stamp; /* do not re-parse a broken file every second */
    if (cfg == NULL) {
        __atomic_store_n(&g_loaded_notice, seen, __ATOMIC_RELEASE);
        return;
    }
    mock_debug("engine config %s changed; re-read it (%u devices)", g_path, cfg->device_count);
    publish(cfg, seen);
}

/* A setter's change is in force (setters.c): the next call looks at the
 * files at once, as the next query of a real board answers the new value. */
void mock_recheck_now(void)
{
    __atomic_store_n(&g_due_ns, 0, __ATOMIC_RELAXED);
}

static nvmlReturn_t library_init(void)
{
    pthread_mutex_lock(&g_lock);
    if (g_init_refs > 0) {
        g_init_refs++;
        pthread_mutex_unlock(&g_lock);
        return NVML_SUCCESS;
    }
    nvmlReturn_t result = NVML_SUCCESS;
    int missing = 0;
    int where = mock_locate_config(g_path, sizeof g_path);
    g_remote = 0;
    if (!where) {
        result = NVML_ERROR_DRIVER_NOT_LOADED;
    } else {
        __atomic_store_n(&g_recheck_ns, mock_recheck_interval_ns(), __ATOMIC_RELAXED);
        char notice_path[PATH_MAX];
        mock_locate_notice(g_path, notice_path, sizeof notice_path);
        if (strcmp(notice_path, g_notice_path) != 0) {
            /* another config (tests load several): its own counter, if any */
            strcpy(g_notice_path, notice_path);
            __atomic_store_n(&g_notice_fd, -1, __ATOMIC_RELEASE);
            __atomic_store_n(&g_notice_value, 0, __ATOMIC_RELEASE);
        }
        track_notice();
        read_notice();
        unsigned long long seen = notice_now(); /* before the file: see refresh_locked */
        struct stat stamp;
        struct mock_config *cfg = load_config(g_path, &stamp, &missing);
        if (cfg == NULL && missing && where == MOCK_BESIDE &&
            (cfg = remote_first()) != NULL) {
            /* No file here (a container another tool's CDI spec made): the
             * node daemon's socket serves the files, on its own schedule. */
            g_remote = 1;
            g_notice_path[0] = '\0';
            __atomic_store_n(&g_notice_fd, -1, __ATOMIC_RELEASE);
            __atomic_store_n(&g_notice_value, 0, __ATOMIC_RELEASE);
            seen = 0;
            /* schedule_due takes a due time further off than this as a
             * clock set back: the backoff must not look like one */
            __atomic_store_n(&g_recheck_ns, MOCK_REMOTE_BACKOFF_NS, __ATOMIC_RELAXED);
            memset(&stamp, 0, sizeof stamp);
        }
        if (cfg == NULL) {
            /* Missing config: no driver on this node.  Present but broken: an
             * error the operator should see, distinct from "no GPUs". */
            result = missing ? NVML_ERROR_DRIVER_NOT_LOADED : NVML_ERROR_UNKNOWN;
        } else {
            g_stamp = stamp;
            __atomic_add_fetch(&mock_checks, 1, __ATOMIC_RELEASE);
            __atomic_store_n(&g_due_ns, coarse_ns() + (g_remote ? MOCK_REMOTE_INTERVAL_NS
                                                                : g_recheck_ns),
                             __ATOMIC_RELAXED);
            publish(cfg, seen);
            g_init_refs = 1;
            mock_debug("initialized from %s (%u devices, %u visible)", g_remote ? g_socket : g_path,
                       cfg->device_count, cfg->visible_count);
        }
    }
    pthread_mutex_unlock(&g_lock);
    return result;
}

MOCK_API nvmlReturn_t nvmlInit_v2(void)
{
    return library_init();
}

MOCK_API nvmlReturn_t nvmlInit(void)
{
    return library_init();
}

MOCK_API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    /* NO_GPUS and NO_ATTACH change nothing here: init never fails for want
     * of GPUs, and there is nothing to attach. */
    (void)flags;
    return library_init();
}

MOCK_API nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&g_lock);
    if (g_init_refs == 0) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    if (--g_init_refs == 0)
        publish(NULL, g_loaded_notice);
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

/* Called with g_lock held: unlink a thread's cache and drop its reference. */
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
    drop_ref(tc->cfg);
    tc->cfg = NULL;
}

/* A thread's exit: its reference goes with it. */
static void forget_thread(void *value)
{
    pthread_mutex_lock(&g_lock);
    forget_cache(value);
    pthread_mutex_unlock(&g_lock);
}

/* Called with g_lock held: the thread's cache is listed (so the library's
 * unload still reaches it) and dropped at the thread's exit. */
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
    pthread_mutex_lock(&g_lock);
    if (stale)
        refresh_locked();
    struct mock_config *cur = g_current;
    if (cur != tc->cfg) {
        if (cur != NULL)
            __atomic_add_fetch(&cur->refs, 1, __ATOMIC_ACQ_REL);
        drop_ref(tc->cfg);
        tc->cfg = cur;
        if (cur != NULL)
            register_cache(tc);
    }
    pthread_mutex_unlock(&g_lock);
    return cur;
}

struct mock_config *mock_acquire(void)
{
    struct thread_cache *tc = &t_cache;
    if (tc->depth > 0) {
        /* a call inside a call: the outer call's snapshot */
        tc->depth++;
        return tc->cfg;
    }
    /* The order matters: the value the snapshot was loaded at, then the
     * counter (read from its file first, when due), then the snapshot (see
     * publish). */
    tc->now = coarse_ns();
    if (__builtin_expect(notice_due(tc->now), 0))
        read_notice();
    unsigned long long loaded = __atomic_load_n(&g_loaded_notice, __ATOMIC_ACQUIRE);
    int stale = notice_now() != loaded || schedule_due(tc->now);
    struct mock_config *cur = __atomic_load_n(&g_current, __ATOMIC_ACQUIRE);
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
    drop_ref(cfg); /* a workload snapshot */
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

/* Frees process-wide state when the library is unloaded, so leak checkers
 * see a clean exit even when a client never calls nvmlShutdown.  The
 * unloading thread is in no call, so its cache goes too; other threads'
 * stay listed (a thread still running may be mid-call). */
__attribute__((destructor)) static void library_cleanup(void)
{
    pthread_mutex_lock(&g_lock);
    publish(NULL, g_loaded_notice);
    g_init_refs = 0;
    if (t_cache.depth == 0)
        forget_cache(&t_cache);
    if (g_cache_key_made) {
        /* the destructor's code may be unmapped before other threads exit */
        pthread_key_delete(g_cache_key);
        g_cache_key_made = 0;
    }
    __atomic_store_n(&g_notice_fd, -1, __ATOMIC_RELEASE);
    if (g_notice_held >= 0)
        close(g_notice_held);
    g_notice_held = -1;
    g_notice_dev = 0;
    g_notice_ino = 0;
    pthread_mutex_unlock(&g_lock);
    mock_events_cleanup();
    mock_failure_cleanup();
}
