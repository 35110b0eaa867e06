/*
 * Reading the mock InfiniBand tree.
 *
 * Every value the shim reports comes from the files the ib simulator
 * staged (the same ones ibstat reads through libmockfs.so), read at the time
 * of the query, so the shim holds no second copy of the node's state and a
 * converge is visible to the next query.  Paths are built from the root
 * explicitly (not through libmockfs.so), so the shim works alone too.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ibshim.h"

static char root[PATH_MAX];
static pthread_once_t root_once = PTHREAD_ONCE_INIT;

static void load_root(void)
{
    const char *value = getenv("MOKKA_MOCKFS_ROOT");
    /* Relative roots would follow the working directory: inert instead,
     * matching libmockfs.so, which refuses them too. */
    if (value == NULL || value[0] != '/')
        return;
    size_t len = strlen(value);
    while (len > 1 && value[len - 1] == '/')
        len--;
    if (len == 1)
        len = 0; /* "/": the host itself */
    if (len >= sizeof root - 1)
        return;
    memcpy(root, value, len);
    root[len] = '\0';
    if (len == 0) {
        root[0] = '/';
        root[1] = '\0';
    }
}

__attribute__((constructor)) static void ibshim_init(void)
{
    pthread_once(&root_once, load_root);
}

const char *ibshim_root(void)
{
    pthread_once(&root_once, load_root);
    return strcmp(root, "/") == 0 ? "" : root;
}

int ibshim_active(void)
{
    pthread_once(&root_once, load_root);
    return root[0] != '\0';
}

/* "<root><class>/<name>[/<attr>]" into out; -1 (ENAMETOOLONG) if it does not fit. */
static int class_path(char *out, size_t size, const char *class, const char *name,
                      const char *attr)
{
    int n = attr != NULL ? snprintf(out, size, "%s%s/%s/%s", ibshim_root(), class, name, attr)
                         : snprintf(out, size, "%s%s/%s", ibshim_root(), class, name);
    if (n < 0 || (size_t)n >= size) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return 0;
}

/* Reads a sysfs attribute.  Only a regular file counts: a FIFO (or a
 * device) where an attribute should be would block the query, or feed it
 * without end, so it is opened without blocking and refused. */
static int read_file(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        errno = EINVAL;
        return -1;
    }
    ssize_t n;
    do {
        n = read(fd, buf, size - 1);
    } while (n < 0 && errno == EINTR);
    int saved = errno;
    close(fd);
    if (n < 0) {
        errno = saved;
        return -1;
    }
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        n--;
    buf[n] = '\0';
    return (int)n;
}

int ibshim_read_attr(const char *ibdev, const char *attr, char *buf, size_t size)
{
    char path[PATH_MAX];
    if (size == 0 || class_path(path, sizeof path, IBSHIM_IB_CLASS, ibdev, attr) < 0)
        return -1;
    return read_file(path, buf, size);
}

long long ibshim_read_number(const char *ibdev, const char *attr)
{
    char buf[128];
    if (ibshim_read_attr(ibdev, attr, buf, sizeof buf) < 0)
        return -1;
    char *end;
    errno = 0;
    long long value = strtoll(buf, &end, 0);
    if (end == buf || errno != 0 || value < 0) {
        errno = EINVAL;
        return -1;
    }
    return value;
}

uint64_t ibshim_parse_guid_be(const char *text)
{
    uint64_t value = 0;
    int digits = 0;
    for (const char *p = text; *p != '\0'; p++) {
        if (*p == ':')
            continue;
        if (!isxdigit((unsigned char)*p) || ++digits > 16)
            return 0;
        value = (value << 4) | (uint64_t)(isdigit((unsigned char)*p) ? *p - '0'
                                                                      : (tolower(*p) - 'a' + 10));
    }
    return digits == 16 ? __builtin_bswap64(value) : 0;
}

int ibshim_parse_gid(const char *text, union ibv_gid *gid)
{
    unsigned group[8];
    int used = 0;
    if (sscanf(text, "%4x:%4x:%4x:%4x:%4x:%4x:%4x:%4x%n", &group[0], &group[1], &group[2],
               &group[3], &group[4], &group[5], &group[6], &group[7], &used) != 8 ||
        text[used] != '\0')
        return -1;
    for (int i = 0; i < 8; i++) {
        gid->raw[2 * i] = (uint8_t)(group[i] >> 8);
        gid->raw[2 * i + 1] = (uint8_t)group[i];
    }
    return 0;
}

/* The number after `prefix` in a directory entry name ("uverbs12" -> 12),
 * or -1.  Only the kernel's spelling counts: decimal digits without sign,
 * blank or leading zero, at most INT_MAX (device indexes are ints).
 * strtol alone would take "uverbs+0" and "uverbs 1" for entries 0 and 1,
 * and list their HCAs twice. */
static long entry_number(const char *name, const char *prefix)
{
    size_t len = strlen(prefix);
    const char *digits = name + len;
    if (strncmp(name, prefix, len) != 0 || !isdigit((unsigned char)digits[0]) ||
        (digits[0] == '0' && digits[1] != '\0'))
        return -1;
    char *end;
    errno = 0;
    long n = strtol(digits, &end, 10);
    return *end == '\0' && errno == 0 && n <= INT_MAX ? n : -1;
}

int ibshim_count_entries(const char *ibdev, const char *dir)
{
    char path[PATH_MAX];
    if (class_path(path, sizeof path, IBSHIM_IB_CLASS, ibdev, dir) < 0)
        return 0;
    DIR *d = opendir(path);
    if (d == NULL)
        return 0;
    int count = 0;
    struct dirent *entry;
    while ((entry = readdir(d)) != NULL)
        if (entry_number(entry->d_name, "") >= 0)
            count++;
    closedir(d);
    return count;
}

static int compare_long(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* One device from its uverbs entry; NULL (and skipped) when incomplete. */
static struct ibshim_device *load_device(long number)
{
    char uverbs[32], ibdev[IBV_SYSFS_NAME_MAX], path[PATH_MAX];
    snprintf(uverbs, sizeof uverbs, "uverbs%ld", number);
    if (class_path(path, sizeof path, IBSHIM_VERBS_CLASS, uverbs, "ibdev") < 0 ||
        read_file(path, ibdev, sizeof ibdev) <= 0 || strchr(ibdev, '/') != NULL)
        return NULL;
    long long node_type = ibshim_read_number(ibdev, "node_type");
    if (node_type < 0)
        return NULL; /* a verbs entry whose HCA is gone: libibverbs skips it too */
    struct ibshim_device *device = calloc(1, sizeof *device);
    if (device == NULL)
        return NULL;
    struct ibv_device *dev = &device->dev;
    dev->node_type = node_type >= IBV_NODE_CA && node_type <= IBV_NODE_RNIC
                         ? (enum ibv_node_type)node_type
                         : IBV_NODE_UNKNOWN;
    dev->transport_type = dev->node_type == IBV_NODE_RNIC ? IBV_TRANSPORT_IWARP : IBV_TRANSPORT_IB;
    snprintf(dev->name, sizeof dev->name, "%s", ibdev);
    snprintf(dev->dev_name, sizeof dev->dev_name, "%s", uverbs);
    /* Host-view paths, as libibverbs sets them: readers that open them
     * (ibv_read_sysfs_file) reach the tree through libmockfs.so. */
    snprintf(dev->dev_path, sizeof dev->dev_path, "%s/%s", IBSHIM_VERBS_CLASS, uverbs);
    snprintf(dev->ibdev_path, sizeof dev->ibdev_path, "%s/%s", IBSHIM_IB_CLASS, ibdev);
    device->refs = 1;
    return device;
}

int ibshim_scan_devices(struct ibshim_device **out, int max)
{
    char path[PATH_MAX], abi[16];
    if (class_path(path, sizeof path, IBSHIM_VERBS_CLASS, "abi_version", NULL) < 0)
        return -1;
    if (read_file(path, abi, sizeof abi) <= 0) {
        errno = ENOSYS; /* what libibverbs says of a kernel without uverbs */
        return -1;
    }
    if (class_path(path, sizeof path, IBSHIM_VERBS_CLASS, "", NULL) < 0)
        return -1;
    DIR *d = opendir(path);
    if (d == NULL)
        return -1;
    long numbers[IBSHIM_MAX_DEVICES];
    int found = 0;
    struct dirent *entry;
    while ((entry = readdir(d)) != NULL && found < IBSHIM_MAX_DEVICES) {
        long n = entry_number(entry->d_name, "uverbs");
        if (n >= 0)
            numbers[found++] = n;
    }
    closedir(d);
    qsort(numbers, (size_t)found, sizeof numbers[0], compare_long);
    int count = 0;
    for (int i = 0; i < found && count < max; i++) {
        struct ibshim_device *device = load_device(numbers[i]);
        if (device != NULL)
            out[count++] = device;
    }
    return count;
}
