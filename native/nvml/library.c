/*
 * Library state: initialization reference count, the current config
 * snapshot, and re-reading the config when it changes.
 *
 * NVML counts nvmlInit/nvmlShutdown pairs; the library stays usable until
 * the last shutdown.  The engine config is found through MOCK_NVML_CONFIG,
 * else next to the library itself: a library at <driver root>/usr/lib64/
 * reads <driver root>/config/config.yaml, so a process that mounts only the
 * driver root (the DRA kubelet plugin) still finds it.  The file is stat'ed
 * at most once a second; a changed file is parsed into a new snapshot and
 * swapped in, so runtime overrides and injected Xids reach running
 * processes.  A broken rewrite keeps the last good snapshot.
 *
 * All mutable state here is guarded by g_lock; snapshots themselves are
 * immutable and reference counted (atomic), so calls hold the lock only
 * for the pointer copy.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
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

/* How often (at most) the config file is stat'ed for changes. */
#define RECHECK_INTERVAL_NS 1000000000ULL

struct file_stamp {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
    struct timespec ctime;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned g_init_refs;              /* nvmlInit calls not yet shut down */
static struct mock_config *g_current;     /* newest good snapshot, or NULL */
static char g_path[PATH_MAX];             /* config file in use */
static struct file_stamp g_stamp;         /* identity of the file g_current came from */
static unsigned long long g_last_check;   /* mock_now_ns() of the last stat */

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

/* Where the engine config is: MOCK_NVML_CONFIG, else <lib>/../../config/config.yaml. */
static int locate_config(char *path, size_t size)
{
    const char *env = getenv("MOCK_NVML_CONFIG");
    if (env != NULL && *env != '\0') {
        if (strlen(env) >= size) {
            mock_debug("MOCK_NVML_CONFIG is longer than %zu bytes", size - 1);
            return 0;
        }
        strcpy(path, env);
        return 1;
    }
    Dl_info info;
    if (dladdr((void *)&locate_config, &info) == 0 || info.dli_fname == NULL ||
        strchr(info.dli_fname, '/') == NULL) {
        mock_debug("cannot tell where the library was loaded from; set MOCK_NVML_CONFIG");
        return 0;
    }
    char dir[PATH_MAX], root[PATH_MAX];
    if (strlen(info.dli_fname) >= sizeof dir)
        return 0;
    strcpy(dir, info.dli_fname);
    *strrchr(dir, '/') = '\0';
    /* The loader may report <root>/usr/bin/../lib64/... (nvidia-smi's RPATH
     * is $ORIGIN/../lib64): resolve the directory, not the file, so a
     * libnvidia-ml.so.1 -> .so.<version> link does not move us. */
    if (realpath(dir[0] ? dir : "/", root) == NULL)
        strcpy(root, dir);
    /* Strip usr/lib64 (two directories). */
    for (int i = 0; i < 2; i++) {
        char *slash = strrchr(root, '/');
        if (slash == NULL) {
            root[0] = '\0';
            break;
        }
        *slash = '\0';
    }
    int n = snprintf(path, size, "%s/config/config.yaml", root);
    return n > 0 && (size_t)n < size;
}

static void stamp_of(const struct stat *st, struct file_stamp *stamp)
{
    stamp->dev = st->st_dev;
    stamp->ino = st->st_ino;
    stamp->size = st->st_size;
    stamp->mtime = st->st_mtim;
    stamp->ctime = st->st_ctim;
}

static int same_stamp(const struct file_stamp *a, const struct file_stamp *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec &&
           a->ctime.tv_sec == b->ctime.tv_sec && a->ctime.tv_nsec == b->ctime.tv_nsec;
}

/* Reads and parses the config at `path`.  Returns the snapshot or NULL,
 * with *missing set when the file does not exist. */
static struct mock_config *load_config(const char *path, struct file_stamp *stamp, int *missing)
{
    *missing = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        *missing = errno == ENOENT || errno == ENOTDIR;
        mock_debug("cannot open engine config %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > MOCK_MAX_CONFIG_BYTES) {
        mock_debug("engine config %s is not a regular file of at most %u bytes", path,
                   MOCK_MAX_CONFIG_BYTES);
        close(fd);
        return NULL;
    }
    size_t len = (size_t)st.st_size;
    char *text = malloc(len + 1);
    if (text == NULL) {
        close(fd);
        return NULL;
    }
    size_t got = 0;
    while (got < len) {
        ssize_t r = read(fd, text + got, len - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    char dir[PATH_MAX];
    strcpy(dir, path);
    char *slash = strrchr(dir, '/');
    if (slash == NULL)
        strcpy(dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    char err[512];
    struct mock_config *cfg = mock_config_parse(text, got, dir, err, sizeof err);
    free(text);
    if (cfg == NULL) {
        mock_debug("invalid engine config %s: %s", path, err);
        return NULL;
    }
    mock_compute_visibility(cfg);
    stamp_of(&st, stamp);
    return cfg;
}

static void drop_ref(struct mock_config *cfg)
{
    if (cfg != NULL && __atomic_sub_fetch(&cfg->refs, 1, __ATOMIC_ACQ_REL) == 0)
        mock_config_free(cfg);
}

/* Called with g_lock held: swap in a newer config if the file changed. */
static void maybe_reload(void)
{
    unsigned long long now = mock_now_ns();
    if (now - g_last_check < RECHECK_INTERVAL_NS)
        return;
    g_last_check = now;
    struct stat st;
    if (stat(g_path, &st) != 0)
        return; /* a moment between unlink and rename, or removed: keep serving */
    struct file_stamp stamp;
    stamp_of(&st, &stamp);
    if (same_stamp(&stamp, &g_stamp))
        return;
    int missing;
    struct mock_config *cfg = load_config(g_path, &stamp, &missing);
    g_stamp = stamp; /* do not re-parse a broken file every second */
    if (cfg == NULL)
        return;
    mock_debug("engine config %s changed; re-read it (%u devices)", g_path, cfg->device_count);
    drop_ref(g_current);
    g_current = cfg;
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
    if (!locate_config(g_path, sizeof g_path)) {
        result = NVML_ERROR_DRIVER_NOT_LOADED;
    } else {
        struct file_stamp stamp;
        struct mock_config *cfg = load_config(g_path, &stamp, &missing);
        if (cfg == NULL) {
            /* Missing config: no driver on this node.  Present but broken: an
             * error the operator should see, distinct from "no GPUs". */
            result = missing ? NVML_ERROR_DRIVER_NOT_LOADED : NVML_ERROR_UNKNOWN;
        } else {
            drop_ref(g_current);
            g_current = cfg;
            g_stamp = stamp;
            g_last_check = mock_now_ns();
            g_init_refs = 1;
            mock_debug("initialized from %s (%u devices, %u visible)", g_path,
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
    if (--g_init_refs == 0) {
        drop_ref(g_current);
        g_current = NULL;
    }
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

struct mock_config *mock_acquire(void)
{
    pthread_mutex_lock(&g_lock);
    if (g_init_refs == 0 || g_current == NULL) {
        pthread_mutex_unlock(&g_lock);
        return NULL;
    }
    maybe_reload();
    struct mock_config *cfg = g_current;
    __atomic_add_fetch(&cfg->refs, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_unlock(&g_lock);
    return cfg;
}

void mock_release(struct mock_config *cfg)
{
    drop_ref(cfg);
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
 * see a clean exit even when a client never calls nvmlShutdown. */
__attribute__((destructor)) static void library_cleanup(void)
{
    pthread_mutex_lock(&g_lock);
    drop_ref(g_current);
    g_current = NULL;
    g_init_refs = 0;
    pthread_mutex_unlock(&g_lock);
    mock_events_cleanup();
    mock_failure_cleanup();
}

MOCK_API const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED:
        return "The requested vgpu operation is not available on target device, becasue ECC is "
               "enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Ran out of critical resources, other than memory";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "The requested frequency is not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not Ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    default: return "Unknown Error";
    }
}
