/*
 * The library's lifetime: nvmlInit/nvmlShutdown and their reference count,
 * the lock that guards the state (mock_lock), the cleanup at unload, and
 * the small services every file uses (mock_debug, mock_now_ns,
 * mock_open_regular).  The state itself is spread over the files
 * library.h lists: the current snapshot and the hot path (snapshot.c), the
 * change notice (notice.c), and the re-read schedule with change
 * detection (refresh.c).
 *
 * NVML counts nvmlInit/nvmlShutdown pairs; the library stays usable until
 * the last shutdown.  The engine config is found through MOCK_NVML_CONFIG,
 * else next to the library itself (locate.c), else, when no file is there,
 * over the node daemon's socket (remote.c, refresh.c).  The error strings
 * are errors.c's.
 *
 * Every file is opened O_NONBLOCK and must be a regular file (fstat), so
 * a FIFO, a device or a directory put in a file's place is refused at once
 * instead of blocking the client in open() or read().
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "library.h"

pthread_mutex_t mock_lock = PTHREAD_MUTEX_INITIALIZER;
unsigned mock_init_refs;

unsigned long long mock_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
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

static nvmlReturn_t library_init(void)
{
    pthread_mutex_lock(&mock_lock);
    if (mock_init_refs > 0) {
        mock_init_refs++;
        pthread_mutex_unlock(&mock_lock);
        return NVML_SUCCESS;
    }
    nvmlReturn_t result = NVML_SUCCESS;
    int missing = 0;
    int where = mock_locate_config(mock_config_path, sizeof mock_config_path);
    mock_remote_on = 0;
    if (!where) {
        result = NVML_ERROR_DRIVER_NOT_LOADED;
    } else {
        __atomic_store_n(&mock_recheck_ns, mock_recheck_interval_ns(), __ATOMIC_RELAXED);
        mock_notice_follow(mock_config_path);
        unsigned long long seen = mock_notice_now(); /* before the file: see mock_refresh_locked */
        struct stat stamp;
        struct mock_config *cfg = mock_load_config(mock_config_path, &stamp, &missing);
        if (cfg == NULL && missing && where == MOCK_BESIDE &&
            (cfg = mock_remote_first()) != NULL) {
            /* No file here (a container another tool's CDI spec made): the
             * node daemon's socket serves the files, on its own schedule. */
            mock_remote_on = 1;
            mock_notice_forget();
            seen = 0;
            /* mock_schedule_due takes a due time further off than this as
             * a clock set back: the backoff must not look like one */
            __atomic_store_n(&mock_recheck_ns, MOCK_REMOTE_BACKOFF_NS, __ATOMIC_RELAXED);
            memset(&stamp, 0, sizeof stamp);
        }
        if (cfg == NULL) {
            /* Missing config: no driver on this node.  Present but broken: an
             * error the operator should see, distinct from "no GPUs". */
            result = missing ? NVML_ERROR_DRIVER_NOT_LOADED : NVML_ERROR_UNKNOWN;
        } else {
            mock_config_stamp = stamp;
            __atomic_add_fetch(&mock_checks, 1, __ATOMIC_RELEASE);
            __atomic_store_n(&mock_due_ns, coarse_ns() + (mock_remote_on ? MOCK_REMOTE_INTERVAL_NS
                                                                         : mock_recheck_ns),
                             __ATOMIC_RELAXED);
            mock_publish(cfg, seen);
            mock_init_refs = 1;
            mock_debug("initialized from %s (%u devices, %u visible)",
                       mock_remote_on ? mock_remote_socket : mock_config_path, cfg->device_count,
                       cfg->visible_count);
        }
    }
    pthread_mutex_unlock(&mock_lock);
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
    pthread_mutex_lock(&mock_lock);
    if (mock_init_refs == 0) {
        pthread_mutex_unlock(&mock_lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    if (--mock_init_refs == 0)
        mock_publish(NULL, mock_loaded_notice);
    pthread_mutex_unlock(&mock_lock);
    return NVML_SUCCESS;
}

/* Frees process-wide state when the library is unloaded, so leak checkers
 * see a clean exit even when a client never calls nvmlShutdown. */
__attribute__((destructor)) static void library_cleanup(void)
{
    pthread_mutex_lock(&mock_lock);
    mock_publish(NULL, mock_loaded_notice);
    mock_init_refs = 0;
    mock_snapshot_cleanup();
    mock_notice_close();
    pthread_mutex_unlock(&mock_lock);
    mock_events_cleanup();
    mock_failure_cleanup();
}
