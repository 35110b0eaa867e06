/*
 * What the files of the library's state share.
 *
 * The library's state (the current snapshot, how a change is noticed, and
 * re-reading the files) is spread over four files, each with one job:
 *
 *   library.c    nvmlInit/nvmlShutdown and their reference count, the lock
 *                (mock_lock), the unload cleanup, and small services every
 *                file uses (mock_debug, mock_now_ns, mock_open_regular)
 *   snapshot.c   the current snapshot and its lifecycle: publishing a new
 *                one, the per-thread references, and the lock-free hot
 *                path every call runs (mock_acquire / mock_release)
 *   notice.c     the change notice: the counter file beside the config,
 *                opened and followed across stages, and read with a budget
 *                per clock tick
 *   refresh.c    the re-read schedule and change detection: when the files
 *                are looked at (stat schedule, socket schedule), and
 *                loading a changed config from the file or the socket
 *
 * This header is theirs alone (mock.h is the library's): the state they
 * pass between them, and the helpers the hot path needs inline (the clock,
 * the schedule's test, the notice's read budget).  The shared variables are
 * hidden, so every file reads them as directly as one static of its own;
 * each is listed under the file that changes it, but those every call
 * reads are all defined in snapshot.c, together in memory.
 * Everything mutable here that is not marked atomic is guarded by mock_lock.
 */
#ifndef MOCK_NVML_LIBRARY_H
#define MOCK_NVML_LIBRARY_H

#include <limits.h>
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>

#include "mock.h"

#define MOCK_HIDDEN __attribute__((visibility("hidden")))

/* ----------------------------------------------------------- library.c */

extern pthread_mutex_t mock_lock MOCK_HIDDEN;
extern unsigned mock_init_refs MOCK_HIDDEN; /* nvmlInit calls not yet shut down */

/* ---------------------------------------------------------- snapshot.c */

extern struct mock_config *mock_current MOCK_HIDDEN; /* newest good snapshot, or NULL (atomic) */
/* The change notice's value when the files were last read; every call
 * compares it with the counter as last read (atomic). */
extern unsigned long long mock_loaded_notice MOCK_HIDDEN;

/* Drops one reference on a snapshot, freeing it with the last. */
void mock_drop_ref(struct mock_config *cfg) MOCK_HIDDEN;
/* Called with mock_lock held: the newest snapshot becomes current, loaded
 * at counter value `seen` (NULL: none, at shutdown). */
void mock_publish(struct mock_config *cfg, unsigned long long seen) MOCK_HIDDEN;
/* Called with mock_lock held at unload: the unloading thread's reference
 * goes, and the thread-exit key with it. */
void mock_snapshot_cleanup(void) MOCK_HIDDEN;

/* ------------------------------------------------------------ notice.c */

/* The counter as last read (0 without a change notice) and the reads of
 * the current clock tick (atomic; the tick's count racy by design: a race
 * only costs a read more or less). */
extern unsigned long long mock_notice_value MOCK_HIDDEN;
extern unsigned long long mock_notice_tick MOCK_HIDDEN;
extern unsigned mock_notice_reads MOCK_HIDDEN;

/* Calls of one coarse clock tick (4 ms at most) that read the counter; the
 * rest of the tick's calls compare the value read last.  A reading costs
 * a pread (a fraction of a microsecond): 64 of them a tick cost a spinning
 * client under 1 % and let any client making fewer calls than that see a
 * bump at its next call. */
#define MOCK_NOTICE_READS_PER_TICK 64

/* Called with mock_lock held: open the counter file when it is there and
 * not the one already open (first sight, or replaced by a new stage). */
void mock_notice_track(void) MOCK_HIDDEN;
/* Reads the counter into mock_notice_value (no lock: any call may). */
void mock_notice_read(void) MOCK_HIDDEN;
/* Called with mock_lock held by nvmlInit: follow the change notice beside
 * `config` (another config's starts over at 0), open it and read it. */
void mock_notice_follow(const char *config) MOCK_HIDDEN;
/* Called with mock_lock held: no change notice (the socket serves). */
void mock_notice_forget(void) MOCK_HIDDEN;
/* Called with mock_lock held at unload: closes the counter file. */
void mock_notice_close(void) MOCK_HIDDEN;

/* Whether this call reads the counter: the first MOCK_NOTICE_READS_PER_TICK
 * calls of the clock tick `now` do. */
static inline int mock_notice_due(unsigned long long now)
{
    if (__atomic_load_n(&mock_notice_tick, __ATOMIC_RELAXED) != now) {
        __atomic_store_n(&mock_notice_tick, now, __ATOMIC_RELAXED);
        __atomic_store_n(&mock_notice_reads, 1, __ATOMIC_RELAXED);
        return 1;
    }
    if (__atomic_load_n(&mock_notice_reads, __ATOMIC_RELAXED) >= MOCK_NOTICE_READS_PER_TICK)
        return 0;
    __atomic_add_fetch(&mock_notice_reads, 1, __ATOMIC_RELAXED);
    return 1;
}

/* The counter as last read (0 without a change notice).  Read it before
 * the files it announces (docs/engine-config.md). */
static inline unsigned long long mock_notice_now(void)
{
    return __atomic_load_n(&mock_notice_value, __ATOMIC_ACQUIRE);
}

/* ----------------------------------------------------------- refresh.c */

extern char mock_config_path[PATH_MAX] MOCK_HIDDEN; /* config file in use */
extern struct stat mock_config_stamp MOCK_HIDDEN; /* identity of the file mock_current came from */
extern unsigned long long mock_due_ns MOCK_HIDDEN; /* coarse_ns() of the next look (atomic) */
extern unsigned long long mock_recheck_ns MOCK_HIDDEN; /* the stat schedule's interval (atomic) */
/* How many times the files were looked at (atomic; mock.h's mock_check_count). */
extern unsigned long long mock_checks MOCK_HIDDEN;
/* Over the node daemon's socket: set when nvmlInit found no config beside
 * the library and the socket at mock_remote_socket answered. */
extern int mock_remote_on MOCK_HIDDEN;
extern char mock_remote_socket[PATH_MAX] MOCK_HIDDEN;

/* Reads and parses the config at `path` into a snapshot ready to serve, or
 * NULL with *missing set when there is no file; *stamp is its identity. */
struct mock_config *mock_load_config(const char *path, struct stat *stamp, int *missing)
    MOCK_HIDDEN;
/* Called with mock_lock held by nvmlInit, when no config is beside the
 * library: the first snapshot from the node daemon's socket, or NULL. */
struct mock_config *mock_remote_first(void) MOCK_HIDDEN;
/* Called with mock_lock held: re-read what changed, if anything did. */
void mock_refresh_locked(void) MOCK_HIDDEN;

/* The wall clock at the kernel tick's resolution (a few ms), read once per
 * call (mock_call_clock): enough for the stat schedule, at a fraction of
 * the precise clock's cost, and the instant the readings are for
 * (readings.c), so a call reads one clock.  It is the wall clock for the
 * readings' sake (every process agrees on it); the schedule copes with it
 * being set back (mock_schedule_due). */
static inline unsigned long long coarse_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}

/* Whether the stat schedule is due at `now`: the due time has come, or the
 * clock was set back past the time the schedule was made. */
static inline int mock_schedule_due(unsigned long long now)
{
    unsigned long long due = __atomic_load_n(&mock_due_ns, __ATOMIC_RELAXED);
    return now >= due || due - now > __atomic_load_n(&mock_recheck_ns, __ATOMIC_RELAXED);
}

#endif
