/*
 * The re-read schedule and change detection: when the library looks at its
 * files, how it tells whether the config changed, and loading the changed
 * one into a snapshot, from the file or over the node daemon's socket.
 * Publishing the snapshot is snapshot.c's; the counter that announces a
 * change, notice.c's.
 *
 * Beside the change notice, the config is stat'ed at most once a second
 * (on the stat schedule, MOCK_RECHECK_INTERVAL_NS unless locate.c's
 * setting says otherwise; the calls' coarse clock decides when): that is
 * all an old daemon without the counter gets, and it is how a counter file
 * that was replaced (a new stage after a discard) is noticed and opened
 * again.  A broken rewrite keeps the last good snapshot.  A library with no
 * config beside it asks the node daemon's socket (remote.c) on the same
 * schedule instead, every MOCK_REMOTE_INTERVAL_NS.
 *
 * Everything mutable here that is not marked atomic is guarded by mock_lock.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "library.h"

/* mock_due_ns and mock_recheck_ns, which every call reads, are defined in
 * snapshot.c with the rest of the hot path's state. */
char mock_config_path[PATH_MAX];
struct stat mock_config_stamp;
/* How many times the files were looked at (atomic): workload.c looks at
 * its file when this moved, so a reading needs no clock of its own. */
unsigned long long mock_checks; /* read through mock_check_count (mock.h) */

/* Over the node daemon's socket (remote.c): mock_remote_on is set when
 * nvmlInit found no config beside the library and the socket at
 * mock_remote_socket answered.  The files then come from there, asked for
 * on the schedule (every MOCK_REMOTE_INTERVAL_NS, longer after failures)
 * with the token of the files in force, g_token; there is no change
 * notice. */
int mock_remote_on;
char mock_remote_socket[PATH_MAX];
static char g_token[MOCK_REMOTE_TOKEN + 1];
static unsigned g_remote_failures;        /* exchanges failed in a row */

/* Reads and parses the config at `path` (mock_config_load) into a snapshot
 * ready to serve, or NULL with *missing set when there is no file.  The
 * stamp is taken first: should the file be replaced in between, the next
 * check sees a new stamp and reads it again, never the reverse. */
struct mock_config *mock_load_config(const char *path, struct stat *stamp, int *missing)
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

/* Called with mock_lock held: the snapshot an answer of the socket makes,
 * or NULL when its config does not parse (the last good one stays).  Its
 * workload goes to workload.c with it.  Frees the answer's text. */
static struct mock_config *remote_load(struct mock_remote_reply *reply)
{
    char err[512];
    struct mock_config *cfg = mock_config_parse(reply->text, reply->config_len,
                                                MOCK_REMOTE_DIR, err, sizeof err);
    if (cfg == NULL) {
        mock_debug("invalid engine config from %s: %s", mock_remote_socket, err);
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
            mock_debug("workload file from %s ignored (every GPU idle): %s", mock_remote_socket,
                       err);
    }
    mock_workload_adopt(MOCK_REMOTE_DIR, wl);
    free(reply->text);
    return cfg;
}

/* Called with mock_lock held, when the schedule is due: ask the socket
 * whether the files changed.  The next time is set before the exchange,
 * so other threads' calls go on serving the current snapshot meanwhile;
 * a failed exchange asks again later and later (up to
 * MOCK_REMOTE_BACKOFF_NS), so a server that hangs costs a bounded share
 * of the calls' time, and one that comes back is heard within seconds. */
static void refresh_remote(unsigned long long now)
{
    __atomic_store_n(&mock_due_ns, now + MOCK_REMOTE_INTERVAL_NS, __ATOMIC_RELAXED);
    struct mock_remote_reply reply;
    int r = mock_remote_fetch(mock_remote_socket, g_token, &reply);
    if (r < 0) {
        unsigned shift = g_remote_failures < 3 ? g_remote_failures : 3;
        unsigned long long wait = MOCK_REMOTE_INTERVAL_NS << shift;
        g_remote_failures++;
        __atomic_store_n(&mock_due_ns, coarse_ns() + (wait < MOCK_REMOTE_BACKOFF_NS ? wait
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
    mock_debug("engine config from %s changed; re-read it (%u devices)", mock_remote_socket,
               cfg->device_count);
    mock_publish(cfg, mock_loaded_notice);
}

/* Called with mock_lock held by nvmlInit, when no config is beside the
 * library: the first snapshot from the node daemon's socket, or NULL. */
struct mock_config *mock_remote_first(void)
{
    g_token[0] = '\0';
    g_remote_failures = 0;
    if (!mock_remote_locate(mock_remote_socket, sizeof mock_remote_socket))
        return NULL;
    struct mock_remote_reply reply;
    if (mock_remote_fetch(mock_remote_socket, NULL, &reply) != 1)
        return NULL;
    strcpy(g_token, reply.token);
    return remote_load(&reply);
}

/* Called with mock_lock held: re-read what changed, if anything did.  The
 * counter is read before the files: a bump that lands while they are read
 * differs from `seen` and brings the next call back here. */
void mock_refresh_locked(void)
{
    if (mock_init_refs == 0 || mock_current == NULL)
        return;
    unsigned long long now = coarse_ns();
    int scheduled = mock_schedule_due(now);
    if (mock_remote_on) {
        if (scheduled)
            refresh_remote(now);
        return;
    }
    if (scheduled) {
        __atomic_store_n(&mock_due_ns, now + mock_recheck_ns, __ATOMIC_RELAXED);
        mock_notice_track();
    }
    mock_notice_read();
    unsigned long long seen = mock_notice_now();
    if (!scheduled && seen == mock_loaded_notice)
        return; /* another thread got here first */
    __atomic_add_fetch(&mock_checks, 1, __ATOMIC_RELEASE);
    struct stat stamp;
    if (stat(mock_config_path, &stamp) != 0) {
        /* a moment between unlink and rename, or removed: keep serving */
        __atomic_store_n(&mock_loaded_notice, seen, __ATOMIC_RELEASE);
        return;
    }
    if (mock_same_file(&stamp, &mock_config_stamp)) {
        /* the bump was for the workload file (workload.c follows it) */
        __atomic_store_n(&mock_loaded_notice, seen, __ATOMIC_RELEASE);
        return;
    }
    int missing;
    struct mock_config *cfg = mock_load_config(mock_config_path, &stamp, &missing);
    mock_config_stamp = stamp; /* do not re-parse a broken file every second */
    if (cfg == NULL) {
        __atomic_store_n(&mock_loaded_notice, seen, __ATOMIC_RELEASE);
        return;
    }
    mock_debug("engine config %s changed; re-read it (%u devices)", mock_config_path,
               cfg->device_count);
    mock_publish(cfg, seen);
}

/* A setter's change is in force (setters.c): the next call looks at the
 * files at once, as the next query of a real board answers the new value. */
void mock_recheck_now(void)
{
    __atomic_store_n(&mock_due_ns, 0, __ATOMIC_RELAXED);
}
