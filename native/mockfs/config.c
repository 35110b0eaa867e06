/*
 * Configuration from the environment, read once.
 *
 *   MOKKA_MOCKFS_ROOT      directory standing for "/" (e.g.
 *                          <node root>/var/lib/nvml-mock, so /sys/bus/pci
 *                          becomes <that>/sys/bus/pci).
 *   MOKKA_MOCKFS_PREFIXES  colon-separated absolute prefixes redirected
 *                          through MOKKA_MOCKFS_ROOT; unset means the
 *                          defaults below, set but empty means none.
 *   MOCK_PCI_ROOT          the older convention: a directory standing for
 *                          "/sys" (i.e. <...>/sys).  It redirects the PCI
 *                          prefixes only, after the MOKKA_MOCKFS_ROOT rules
 *                          (the first matching rule wins).
 *   MOKKA_MOCKFS_DEBUG     "1": one stderr line per redirect.
 *
 * Neither root set: the shim is inert and every call passes through.
 *
 * Initialisation runs under pthread_once from whichever hook is called
 * first (possibly before main, from another library's constructor) and from
 * our own constructor; it only copies strings into static buffers and calls
 * dlsym, so it allocates nothing of its own.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mockfs.h"

/* What the shim covers when MOKKA_MOCKFS_PREFIXES is unset: the PCI sysfs
 * tree (the bus view and the device hierarchy it links into), procfs's PCI
 * view (libpci falls back to it when sysfs fails: redirected, it finds
 * nothing rather than the host's devices), the system's DMI identity (the
 * class view and the virtual device it links to), and the InfiniBand sysfs
 * classes and device nodes. */
static const char *const default_prefixes[] = {
    "/sys/bus/pci",
    "/sys/devices/pci*",
    "/proc/bus/pci",
    "/sys/class/dmi",
    "/sys/devices/virtual/dmi",
    "/sys/class/infiniband",
    "/sys/class/infiniband_mad",
    "/sys/class/infiniband_verbs",
    "/dev/infiniband",
};

/* The prefixes MOCK_PCI_ROOT has always covered. */
static const char *const pci_prefixes[] = {
    "/sys/bus/pci",
    "/sys/devices/pci*",
};

/* Under MOCK_PCI_ROOT (which stands for /sys only) procfs's PCI view has
 * nowhere to go: it is hidden (ENOENT) so libpci's fallback cannot show
 * the host's devices. */
static struct mockfs_view hidden = {
    .env_name = "MOCK_PCI_ROOT",
    .view_prefix = "",
    .unusable_errno = ENOENT,
};

static struct mockfs_config config;
static struct mockfs_real real;
static pthread_once_t once = PTHREAD_ONCE_INIT;

void mockfs_warn(const char *a, const char *b, const char *c)
{
    const char *parts[] = {"libmockfs: ", a, b, c, "\n"};
    int saved = errno;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (parts[i] != NULL && parts[i][0] != '\0') {
            ssize_t ignored = write(2, parts[i], strlen(parts[i]));
            (void)ignored;
        }
    }
    errno = saved;
}

/* Fill `view` from the variable `name`; returns 1 when it is set. */
static int load_view(struct mockfs_view *view, const char *name, unsigned strip,
                     const char *view_prefix)
{
    const char *value = getenv(name);
    view->env_name = name;
    view->strip_components = strip;
    view->view_prefix = view_prefix;
    if (value == NULL || value[0] == '\0')
        return 0;
    size_t len = strlen(value);
    while (len > 1 && value[len - 1] == '/')
        len--;
    if (value[0] != '/') {
        /* A relative root would follow the working directory around:
         * refuse it rather than guess. */
        mockfs_warn(name, " is not an absolute path; redirected paths fail with EINVAL", "");
        view->unusable_errno = EINVAL;
        return 1;
    }
    if (len >= PATH_MAX) {
        view->unusable_errno = ENAMETOOLONG;
        return 1;
    }
    memcpy(view->root, value, len);
    view->root[len] = '\0';
    if (len == 1)
        len = 0; /* root "/": prefixing adds nothing */
    view->root[len] = '\0';
    view->root_len = len;
    /* realpath() results are compared with the canonical root: the root
     * itself may sit behind a symlink (/tmp -> /private/tmp, /host/...). */
    if (len > 0 && real.realpath != NULL && real.realpath(view->root, view->canon) != NULL) {
        view->canon_len = strlen(view->canon);
    } else {
        memcpy(view->canon, view->root, len + 1);
        view->canon_len = len;
    }
    return 1;
}

static void add_rule(const char *pattern, size_t len, const struct mockfs_view *view)
{
    while (len > 1 && pattern[len - 1] == '/')
        len--;
    if (len == 0)
        return;
    if (pattern[0] != '/') {
        mockfs_warn("ignoring relative prefix in MOKKA_MOCKFS_PREFIXES (prefixes are absolute)", "",
                    "");
        return;
    }
    if (len >= MOCKFS_PREFIX_MAX || config.n_rules >= MOCKFS_MAX_RULES) {
        mockfs_warn("ignoring a prefix: too long or too many (limits: 255 bytes, 32 prefixes)", "",
                    "");
        return;
    }
    struct mockfs_rule *rule = &config.rules[config.n_rules++];
    memcpy(rule->pattern, pattern, len);
    rule->pattern[len] = '\0';
    rule->view = view;
}

#define RESOLVE(field, symbol) real.field = (__typeof__(real.field))dlsym(RTLD_NEXT, symbol)

static void resolve_real(void)
{
    RESOLVE(open, "open");
    RESOLVE(open64, "open64");
    RESOLVE(openat, "openat");
    RESOLVE(openat64, "openat64");
    RESOLVE(open_2, "__open_2");
    RESOLVE(open64_2, "__open64_2");
    RESOLVE(openat_2, "__openat_2");
    RESOLVE(openat64_2, "__openat64_2");
    RESOLVE(fopen, "fopen");
    RESOLVE(fopen64, "fopen64");
    RESOLVE(opendir, "opendir");
    RESOLVE(scandir, "scandir");
    RESOLVE(scandir64, "scandir64");
    RESOLVE(stat, "stat");
    RESOLVE(lstat, "lstat");
    RESOLVE(fstatat, "fstatat");
    RESOLVE(stat64, "stat64");
    RESOLVE(lstat64, "lstat64");
    RESOLVE(fstatat64, "fstatat64");
    RESOLVE(statx, "statx");
    RESOLVE(xstat, "__xstat");
    RESOLVE(lxstat, "__lxstat");
    RESOLVE(fxstatat, "__fxstatat");
    RESOLVE(xstat64, "__xstat64");
    RESOLVE(lxstat64, "__lxstat64");
    RESOLVE(fxstatat64, "__fxstatat64");
    RESOLVE(access, "access");
    RESOLVE(faccessat, "faccessat");
    RESOLVE(readlink, "readlink");
    RESOLVE(readlinkat, "readlinkat");
    RESOLVE(readlink_chk, "__readlink_chk");
    RESOLVE(readlinkat_chk, "__readlinkat_chk");
    RESOLVE(chdir, "chdir");
    RESOLVE(realpath, "realpath");
    RESOLVE(realpath_chk, "__realpath_chk");
    RESOLVE(ioperm, "ioperm");
    RESOLVE(iopl, "iopl");
}

static void init_once(void)
{
    int saved = errno;
    resolve_real();
    const char *debug = getenv("MOKKA_MOCKFS_DEBUG");
    config.debug = debug != NULL && strcmp(debug, "1") == 0;

    if (load_view(&config.mokka, "MOKKA_MOCKFS_ROOT", 0, "")) {
        const char *list = getenv("MOKKA_MOCKFS_PREFIXES");
        if (list == NULL) {
            for (size_t i = 0; i < sizeof default_prefixes / sizeof default_prefixes[0]; i++)
                add_rule(default_prefixes[i], strlen(default_prefixes[i]), &config.mokka);
        } else {
            const char *start = list;
            for (const char *p = list;; p++) {
                if (*p == ':' || *p == '\0') {
                    add_rule(start, (size_t)(p - start), &config.mokka);
                    start = p + 1;
                }
                if (*p == '\0')
                    break;
            }
        }
    }
    if (load_view(&config.pci, "MOCK_PCI_ROOT", 1, "/sys")) {
        for (size_t i = 0; i < sizeof pci_prefixes / sizeof pci_prefixes[0]; i++)
            add_rule(pci_prefixes[i], strlen(pci_prefixes[i]), &config.pci);
        add_rule("/proc/bus/pci", strlen("/proc/bus/pci"), &hidden);
    }
    errno = saved;
}

void mockfs_init(void)
{
    pthread_once(&once, init_once);
}

const struct mockfs_config *mockfs_config(void)
{
    mockfs_init();
    return &config;
}

const struct mockfs_real *mockfs_real(void)
{
    mockfs_init();
    return &real;
}

/* Initialise at load time too, so the common case pays nothing per call
 * beyond pthread_once's fast path. */
__attribute__((constructor)) static void mockfs_constructor(void)
{
    mockfs_init();
}
