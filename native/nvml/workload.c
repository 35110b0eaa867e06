/*
 * The workload file: which GPUs the kubelet gave to pods (docs/workloads.md).
 *
 * The node daemon's workload simulator writes <config dir>/workload.yaml in
 * the engine config's format: per device position `process_count` and
 * `process.<k>.pid` / `.name`, plus the memory share and utilization each
 * holder adds.  It sits beside the engine config and is re-read on the same
 * schedule: at the next call after the change notice's counter moves,
 * else stat'ed at most once a second (refresh.c decides, and counts its
 * checks: mock_check_count).  A missing file means every
 * GPU is idle; a damaged one is ignored (idle too) with a MOCK_NVML_DEBUG
 * message: a workload never fails nvmlInit or a call.  A library that
 * reads its config over the node daemon's socket (remote.c) gets the
 * workload in the same answer and hands it over (mock_workload_adopt).
 *
 * Snapshots are mock_config's, reference counted, so a call keeps one
 * consistent view while the file is swapped.  What the hot calls need of a
 * snapshot (each device's holder count, shares and holder PIDs) is copied
 * into static tables when it is loaded and read without a lock, so a
 * reading or a process list on a held GPU costs no more than on an idle
 * one; names (nvmlSystemGetProcessName, nvidia-smi's process table) are
 * read from the snapshot itself, under the lock.
 */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "mock.h"

#define WORKLOAD_FILE "workload.yaml"

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct mock_config *g_workload;  /* NULL: idle */
static char g_dir[PATH_MAX];            /* the engine config directory it is beside */
static char g_path[PATH_MAX];           /* the file g_workload came from */
static struct stat g_stat;              /* its identity when last read */
static int g_have_stat;
static int g_checked;                   /* the file was looked at for g_dir */

/* What readings need of g_workload, resolved once per file, and read on
 * every reading without the lock (a sequence lock: g_seq is odd while a
 * writer, holding g_lock, changes them; a reader that sees it change or
 * odd takes the lock instead).  g_seen is the engine config snapshot they
 * were last checked for, g_seen_check the library's check count then
 * (mock_check_count): while both hold, nothing needs a look at the file,
 * and a reading costs no clock and no system call. */
static struct mock_load g_load[MOCK_MAX_DEVICES];
/* The PIDs of each device's first HELD_PIDS holders, under the same
 * sequence lock; a device with more holders is listed under g_lock. */
#define HELD_PIDS 64
static unsigned g_pids[MOCK_MAX_DEVICES][HELD_PIDS];
static unsigned g_seq;
static const struct mock_config *g_seen;
static unsigned long long g_seen_check;

static unsigned process_count(const struct mock_config *wl, unsigned pos);
static unsigned holder_pid(const struct mock_config *wl, unsigned pos, unsigned i);
static double global_double(const struct mock_config *wl, const char *key, double lo, double hi);

static void replace(struct mock_config *next)
{
    if (g_workload != NULL)
        mock_release(g_workload);
    g_workload = next;
    double share = global_double(next, "workload.memory_share_per_holder", 0, 1);
    double util = global_double(next, "workload.utilization_per_holder", 0, 100);
    __atomic_store_n(&g_seq, g_seq + 1, __ATOMIC_RELAXED); /* odd: changing */
    __atomic_thread_fence(__ATOMIC_RELEASE);
    for (unsigned pos = 0; pos < MOCK_MAX_DEVICES; pos++) {
        unsigned holders = process_count(next, pos);
        __atomic_store_n(&g_load[pos].holders, holders, __ATOMIC_RELAXED);
        __atomic_store(&g_load[pos].memory_share, &share, __ATOMIC_RELAXED);
        __atomic_store(&g_load[pos].utilization, &util, __ATOMIC_RELAXED);
        for (unsigned i = 0; i < holders && i < HELD_PIDS; i++)
            __atomic_store_n(&g_pids[pos][i], holder_pid(next, pos, i), __ATOMIC_RELAXED);
    }
    __atomic_store_n(&g_seq, g_seq + 1, __ATOMIC_RELEASE); /* even: stable */
}

/* Called with g_lock held. */
static void refresh(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        if (g_workload != NULL)
            mock_debug("workload file %s is gone; every GPU is idle", path);
        replace(NULL);
        g_have_stat = 0;
        return;
    }
    if (g_have_stat && mock_same_file(&st, &g_stat))
        return;
    g_stat = st;
    g_have_stat = 1; /* a damaged file is not re-parsed every second */
    int missing;
    char err[512];
    struct mock_config *wl = mock_config_load(path, &missing, err, sizeof err);
    if (wl == NULL)
        mock_debug("workload file %s ignored (every GPU idle): %s", path, err);
    else
        mock_debug("workload file %s read", path);
    replace(wl);
}

/* Called with g_lock held: follow the engine config's directory, and
 * look at the file whenever the library looked at its files (the change
 * notice moved, or the once-a-second schedule came due): the library read
 * the counter before that, so the file is read after it
 * (docs/engine-config.md). */
static void track(const struct mock_config *cfg)
{
    unsigned long long check = mock_check_count();
    if (strcmp(cfg->dir, g_dir) != 0) {
        /* another engine config (tests load several): start over */
        int n = snprintf(g_path, sizeof g_path, "%s/%s", cfg->dir, WORKLOAD_FILE);
        if (n < 0 || (size_t)n >= sizeof g_path)
            g_path[0] = '\0';
        strcpy(g_dir, cfg->dir);
        g_have_stat = 0;
        replace(NULL);
        g_checked = 0;
    }
    if (g_path[0] != '\0' && (!g_checked || check != g_seen_check)) {
        g_checked = 1;
        refresh(g_path);
    }
    __atomic_store_n(&g_seen, cfg, __ATOMIC_RELAXED);
    __atomic_store_n(&g_seen_check, check, __ATOMIC_RELAXED);
}

void mock_workload_adopt(const char *dir, struct mock_config *wl)
{
    pthread_mutex_lock(&g_lock);
    /* No file on this side: track() keeps to g_dir and looks at nothing,
     * and the snapshot changes only here, when the library read new files
     * over the socket. */
    if (strlen(dir) < sizeof g_dir)
        strcpy(g_dir, dir);
    g_path[0] = '\0';
    g_have_stat = 0;
    g_checked = 1;
    replace(wl);
    pthread_mutex_unlock(&g_lock);
}

struct mock_config *mock_workload_acquire(const struct mock_config *cfg)
{
    pthread_mutex_lock(&g_lock);
    track(cfg);
    struct mock_config *wl = g_workload;
    if (wl != NULL)
        __atomic_add_fetch(&wl->refs, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_unlock(&g_lock);
    return wl;
}

/* The lock-free read of the tables: fast_begin says whether they are
 * current for `cfg` with no writer in the way (and the sequence number to
 * check afterwards), fast_done whether nothing changed while they were
 * copied.  Otherwise the caller takes g_lock (and track()s the file). */
static int fast_begin(const struct mock_config *cfg, unsigned *seq)
{
    *seq = __atomic_load_n(&g_seq, __ATOMIC_ACQUIRE);
    return !(*seq & 1) && __atomic_load_n(&g_seen, __ATOMIC_RELAXED) == cfg &&
           mock_check_count() == __atomic_load_n(&g_seen_check, __ATOMIC_RELAXED);
}

static int fast_done(unsigned seq)
{
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return __atomic_load_n(&g_seq, __ATOMIC_RELAXED) == seq;
}

void mock_workload_load(const struct mock_config *cfg, unsigned pos, struct mock_load *out)
{
    if (pos >= MOCK_MAX_DEVICES) {
        memset(out, 0, sizeof *out);
        return;
    }
    /* Fast path: nothing to re-check, and no writer in the way. */
    unsigned seq;
    if (fast_begin(cfg, &seq)) {
        struct mock_load copy;
        copy.holders = __atomic_load_n(&g_load[pos].holders, __ATOMIC_RELAXED);
        __atomic_load(&g_load[pos].memory_share, &copy.memory_share, __ATOMIC_RELAXED);
        __atomic_load(&g_load[pos].utilization, &copy.utilization, __ATOMIC_RELAXED);
        copy.generation = seq;
        if (fast_done(seq)) {
            *out = copy;
            return;
        }
    }
    pthread_mutex_lock(&g_lock);
    track(cfg);
    *out = g_load[pos];
    out->generation = g_seq; /* even: writers hold g_lock */
    pthread_mutex_unlock(&g_lock);
}

/* What each holder of `pos` uses: its share of the board's memory. */
static unsigned long long held_bytes(const struct mock_config *cfg, unsigned pos, double share)
{
    if (pos >= cfg->device_count)
        return 0;
    const struct mock_value *total = mock_key_value(cfg, pos, MOCK_KEY_MEMORY_TOTAL);
    return total->has_u64 ? (unsigned long long)((double)total->u64 * share) : 0;
}

unsigned mock_workload_pids(const struct mock_config *cfg, unsigned pos, unsigned room,
                            mock_pid_sink sink, void *arg)
{
    if (pos >= MOCK_MAX_DEVICES)
        return 0;
    unsigned seq;
    if (fast_begin(cfg, &seq)) {
        unsigned holders = __atomic_load_n(&g_load[pos].holders, __ATOMIC_RELAXED);
        double share;
        __atomic_load(&g_load[pos].memory_share, &share, __ATOMIC_RELAXED);
        unsigned n = holders < room ? holders : room;
        if (n <= HELD_PIDS) {
            unsigned pids[HELD_PIDS];
            for (unsigned i = 0; i < n; i++)
                pids[i] = __atomic_load_n(&g_pids[pos][i], __ATOMIC_RELAXED);
            if (fast_done(seq)) {
                unsigned long long used = n ? held_bytes(cfg, pos, share) : 0;
                for (unsigned i = 0; i < n; i++)
                    sink(arg, i, pids[i], used);
                return holders;
            }
        }
    }
    /* more holders than the table keeps, or a change under way: the snapshot */
    pthread_mutex_lock(&g_lock);
    track(cfg);
    struct mock_config *wl = g_workload;
    unsigned holders = process_count(wl, pos);
    unsigned long long used = held_bytes(cfg, pos, mock_workload_memory_share(wl));
    for (unsigned i = 0; i < holders && i < room; i++)
        sink(arg, i, holder_pid(wl, pos, i), used);
    pthread_mutex_unlock(&g_lock);
    return holders;
}

/* mock_dev_list_len wants `<list>.count`; the file spells it process_count. */
static unsigned process_count(const struct mock_config *wl, unsigned pos)
{
    char key[64], prefix[64];
    unsigned n = 0;
    if (wl == NULL || pos >= wl->device_count)
        return 0;
    snprintf(key, sizeof key, "device.%u.process_count", pos);
    snprintf(prefix, sizeof prefix, "device.%u.process.", pos);
    return mock_cfg_list_len(wl, key, prefix, &n) ? n : 0;
}

static unsigned holder_pid(const struct mock_config *wl, unsigned pos, unsigned i)
{
    char field[64];
    unsigned pid = 0;
    snprintf(field, sizeof field, "process.%u.pid", i);
    mock_dev_uint(wl, pos, field, &pid);
    return pid;
}

unsigned mock_workload_holders(const struct mock_config *wl, unsigned pos)
{
    return process_count(wl, pos);
}

static double global_double(const struct mock_config *wl, const char *key, double lo, double hi)
{
    double v = 0;
    if (wl == NULL || !mock_parse_double(mock_cfg_get(wl, key), &v) || v < lo)
        return 0;
    return v > hi ? hi : v;
}

double mock_workload_memory_share(const struct mock_config *wl)
{
    return global_double(wl, "workload.memory_share_per_holder", 0, 1);
}

double mock_workload_utilization(const struct mock_config *wl)
{
    return global_double(wl, "workload.utilization_per_holder", 0, 100);
}

int mock_workload_process(const struct mock_config *cfg, const struct mock_config *wl,
                          unsigned pos, unsigned i, struct mock_process *out)
{
    if (i >= process_count(wl, pos))
        return 0;
    char field[64];
    out->pid = holder_pid(wl, pos, i);
    snprintf(field, sizeof field, "process.%u.name", i);
    out->name = mock_dev_get(wl, pos, field);
    if (out->name == NULL)
        out->name = "";
    out->used_bytes = held_bytes(cfg, pos, mock_workload_memory_share(wl));
    return 1;
}

int mock_workload_process_name(const struct mock_config *cfg, unsigned pid, char *name,
                               unsigned length)
{
    struct mock_config *wl = mock_workload_acquire(cfg);
    int found = 0;
    for (unsigned pos = 0; wl != NULL && pos < cfg->device_count && !found; pos++) {
        struct mock_process p;
        for (unsigned i = 0; !found && mock_workload_process(cfg, wl, pos, i, &p); i++) {
            if (p.pid == pid) {
                mock_truncate_copy(p.name, name, length);
                found = 1;
            }
        }
    }
    if (wl != NULL)
        mock_release(wl);
    return found;
}

/* Leak checkers see a clean exit. */
__attribute__((destructor)) static void workload_cleanup(void)
{
    pthread_mutex_lock(&g_lock);
    replace(NULL);
    pthread_mutex_unlock(&g_lock);
}
