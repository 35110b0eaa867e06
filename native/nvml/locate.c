/*
 * Where the library's files are, and how often it looks at them: the
 * engine config (MOCK_NVML_CONFIG, else beside the library itself, else
 * over the node daemon's socket: remote.c), its change notice, and the
 * stat schedule's interval.
 *
 * A library at <driver root>/usr/lib64/ reads <driver root>/config/
 * config.yaml, so a process that mounts only the driver root (the DRA
 * kubelet plugin) still finds it.  Apart from the library's state
 * (library.c, snapshot.c, notice.c, refresh.c) because this is the
 * environment's and the file system's say, read once at nvmlInit: those
 * keep the state (snapshots, the lock, the hot path, the change notice,
 * re-reading) and ask here only where to look.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mock.h"

/* The change notice's name beside the config (docs/engine-config.md). */
#define NOTICE_FILE "generation"

/* Where the engine config is: MOCK_NVML_CONFIG, else <lib>/../../config/config.yaml.
 * Which of the two answered matters: only a library with no file beside it
 * asks the node daemon's socket (remote.c), never one told where to look. */
int mock_locate_config(char *path, size_t size)
{
    const char *env = getenv("MOCK_NVML_CONFIG");
    if (env != NULL && *env != '\0') {
        if (strlen(env) >= size) {
            mock_debug("MOCK_NVML_CONFIG is longer than %zu bytes", size - 1);
            return 0;
        }
        strcpy(path, env);
        return MOCK_FROM_ENV;
    }
    Dl_info info;
    if (dladdr((void *)&mock_locate_config, &info) == 0 || info.dli_fname == NULL ||
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
    return n > 0 && (size_t)n < size ? MOCK_BESIDE : 0;
}

/* The stat schedule's interval: MOCK_NVML_RECHECK_INTERVAL_MS, else once a
 * second.  0 stats at every call (tests of the fallback; a node whose
 * daemon has no change notice and needs changes seen at once). */
unsigned long long mock_recheck_interval_ns(void)
{
    const char *env = getenv("MOCK_NVML_RECHECK_INTERVAL_MS");
    unsigned long long ms;
    if (env == NULL || *env == '\0')
        return MOCK_RECHECK_INTERVAL_NS;
    if (!mock_parse_u64(env, &ms) || ms > 86400000ULL) {
        mock_debug("MOCK_NVML_RECHECK_INTERVAL_MS=%s: expected milliseconds in 0..86400000; "
                   "using 1000", env);
        return MOCK_RECHECK_INTERVAL_NS;
    }
    return ms * 1000000ULL;
}

/* The change notice's path: NOTICE_FILE in the config's directory. */
void mock_locate_notice(const char *config, char *path, size_t size)
{
    const char *slash = strrchr(config, '/');
    int dirlen = slash == NULL ? 1 : (slash == config ? 1 : (int)(slash - config));
    int n = snprintf(path, size, "%.*s/%s", dirlen, slash == NULL ? "." : config, NOTICE_FILE);
    if (n < 0 || (size_t)n >= size)
        path[0] = '\0';
}
