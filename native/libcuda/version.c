/*
 * The CUDA version cuDriverGetVersion reports: the engine config's
 * `system.cuda_driver_version`, the value the mock NVML library answers
 * nvmlSystemGetCudaDriverVersion with (docs/engine-config.md), so libcuda
 * and NVML never disagree about the driver's CUDA version.
 *
 * The file is found as the NVML library finds it (native/nvml/locate.c):
 * MOCK_NVML_CONFIG, else <driver root>/config/config.yaml for a library at
 * <driver root>/usr/lib64.  A stub has no snapshot to keep, so it reads the
 * file at each call (clients ask once) and only for two keys: `format`,
 * which must be 1, and the version.  No NVML over the node daemon's socket:
 * a container whose spec another tool wrote has no config beside the
 * library, and there the version is unknown (0).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stub.h"

#define VERSION_KEY "system.cuda_driver_version: "
#define FORMAT_LINE "format: 1"
/* The engine config's lines are at most a 200-byte key and a 4096-byte
 * value; a longer line is none of the two this file reads. */
#define MAX_LINE 4400

static int locate(char *path, size_t size)
{
    const char *env = getenv("MOCK_NVML_CONFIG");
    if (env != NULL && *env != '\0') {
        int n = snprintf(path, size, "%s", env);
        return n > 0 && (size_t)n < size;
    }
    Dl_info info;
    if (dladdr((void *)&locate, &info) == 0 || info.dli_fname == NULL ||
        strchr(info.dli_fname, '/') == NULL)
        return 0;
    char dir[PATH_MAX], root[PATH_MAX];
    if (strlen(info.dli_fname) >= sizeof dir)
        return 0;
    strcpy(dir, info.dli_fname);
    *strrchr(dir, '/') = '\0';
    /* The directory, not the file: libcuda.so.1 -> libcuda.so.<version>
     * stays in usr/lib64, a link through another directory must not move us. */
    if (realpath(dir[0] ? dir : "/", root) == NULL)
        return 0;
    for (int i = 0; i < 2; i++) { /* strip usr/lib64 */
        char *slash = strrchr(root, '/');
        if (slash == NULL)
            return 0;
        *slash = '\0';
    }
    int n = snprintf(path, size, "%s/config/config.yaml", root);
    return n > 0 && (size_t)n < size;
}

/* Digits only, at most INT_MAX: the writer's integer form, nothing looser. */
static int parse_version(const char *text, int *out)
{
    long long v = 0;
    const char *p = text;
    if (*p < '0' || *p > '9')
        return 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        v = v * 10 + (*p - '0');
        if (v > INT_MAX)
            return 0;
    }
    if (*p != '\0')
        return 0;
    *out = (int)v;
    return 1;
}

int cuda_stub_version(void)
{
    char path[PATH_MAX];
    if (!locate(path, sizeof path))
        return 0;
    FILE *file = fopen(path, "re");
    if (file == NULL)
        return 0;
    char line[MAX_LINE];
    int format_ok = 0, version = 0;
    while (fgets(line, sizeof line, file) != NULL) {
        size_t len = strlen(line);
        if (len > 0 && line[len - 1] == '\n')
            line[--len] = '\0';
        else if (!feof(file)) {
            /* Longer than any line of ours: skip to its end. */
            int c;
            while ((c = fgetc(file)) != EOF && c != '\n')
                ;
            continue;
        }
        if (strcmp(line, FORMAT_LINE) == 0)
            format_ok = 1;
        else if (strncmp(line, VERSION_KEY, strlen(VERSION_KEY)) == 0) {
            /* The later line wins, as in the NVML library's reader. */
            int v;
            version = parse_version(line + strlen(VERSION_KEY), &v) ? v : 0;
        }
    }
    fclose(file);
    return format_ok ? version : 0;
}
