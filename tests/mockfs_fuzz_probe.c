/*
 * Probe for tests/test_mockfs_fuzz.py: calls the path hooks of
 * libmockfs.so on every path of a list and prints what each call answered,
 * so the test can compare a run under the shim with a plain run on the
 * paths the shim should have used.
 *
 * usage: mockfs_fuzz_probe [-C DIR] PATHS_FILE
 *   -C DIR      chdir(DIR) first (through the shim when it is preloaded)
 *   PATHS_FILE  paths separated by NUL bytes; the entry "\001NULL" stands
 *               for a NULL pointer (only realpath's contract allows one)
 *
 * Output, one line per call: "<index> <call> ok <detail>" or
 * "<index> <call> err <errno>".  Details: dev:ino of what a stat or open
 * reached, the hex of a link target or resolved path, an entry count.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static void print_ok_stat(size_t i, const char *call, const struct stat *st)
{
    printf("%zu %s ok %llu:%llu\n", i, call, (unsigned long long)st->st_dev,
           (unsigned long long)st->st_ino);
}

static void print_err(size_t i, const char *call)
{
    printf("%zu %s err %d\n", i, call, errno);
}

static void print_ok_hex(size_t i, const char *call, const char *text, size_t len)
{
    printf("%zu %s ok ", i, call);
    for (size_t k = 0; k < len; k++)
        printf("%02x", (unsigned char)text[k]);
    printf("\n");
}

static void print_fd(size_t i, const char *call, int fd)
{
    struct stat st;
    if (fd < 0) {
        print_err(i, call);
        return;
    }
    if (fstat(fd, &st) == 0)
        print_ok_stat(i, call, &st);
    else
        print_err(i, call);
    close(fd);
}

/* realpath is the one hook whose libc contract allows a NULL path (glibc
 * declares every other one nonnull): it must fail with EINVAL. */
static void probe_null(size_t i)
{
    char resolved[PATH_MAX];
    const char *volatile p = NULL; /* volatile: no warning about the NULL */
    if (realpath(p, resolved) != NULL)
        print_ok_hex(i, "realpath", resolved, strlen(resolved));
    else
        print_err(i, "realpath");
}

/* Every path hook on one path. */
static void probe(size_t i, const char *p)
{
    struct stat st;
    char buf[8192];

    if (stat(p, &st) == 0)
        print_ok_stat(i, "stat", &st);
    else
        print_err(i, "stat");
    if (lstat(p, &st) == 0)
        print_ok_stat(i, "lstat", &st);
    else
        print_err(i, "lstat");
    if (fstatat(AT_FDCWD, p, &st, AT_SYMLINK_NOFOLLOW) == 0)
        print_ok_stat(i, "fstatat", &st);
    else
        print_err(i, "fstatat");
    struct statx stx;
    if (statx(AT_FDCWD, p, AT_SYMLINK_NOFOLLOW, STATX_INO, &stx) == 0) {
        struct stat from_statx = {.st_dev = makedev(stx.stx_dev_major, stx.stx_dev_minor),
                                  .st_ino = stx.stx_ino};
        print_ok_stat(i, "statx", &from_statx);
    } else {
        print_err(i, "statx");
    }
    print_fd(i, "open", open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK));
    print_fd(i, "openat", openat(AT_FDCWD, p, O_RDONLY | O_CLOEXEC | O_NONBLOCK));
    print_fd(i, "open-nofollow", open(p, O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (access(p, F_OK) == 0)
        printf("%zu access ok\n", i);
    else
        print_err(i, "access");
    if (faccessat(AT_FDCWD, p, F_OK, 0) == 0)
        printf("%zu faccessat ok\n", i);
    else
        print_err(i, "faccessat");
    ssize_t n = readlink(p, buf, sizeof buf);
    if (n >= 0)
        print_ok_hex(i, "readlink", buf, (size_t)n);
    else
        print_err(i, "readlink");
    n = readlinkat(AT_FDCWD, p, buf, sizeof buf);
    if (n >= 0)
        print_ok_hex(i, "readlinkat", buf, (size_t)n);
    else
        print_err(i, "readlinkat");
    char resolved[PATH_MAX];
    if (realpath(p, resolved) != NULL)
        print_ok_hex(i, "realpath", resolved, strlen(resolved));
    else
        print_err(i, "realpath");
    int here = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (chdir(p) == 0) {
        printf("%zu chdir ok\n", i);
        if (fchdir(here) != 0)
            abort();
    } else {
        print_err(i, "chdir");
    }
    close(here);
    DIR *dir = opendir(p);
    if (dir != NULL) {
        long entries = 0;
        while (readdir(dir) != NULL)
            entries++;
        closedir(dir);
        printf("%zu opendir ok %ld\n", i, entries);
    } else {
        print_err(i, "opendir");
    }
    FILE *f = fopen(p, "re");
    if (f != NULL) {
        print_fd(i, "fopen", dup(fileno(f)));
        fclose(f);
    } else {
        print_err(i, "fopen");
    }
}

int main(int argc, char **argv)
{
    int arg = 1;
    if (argc > 3 && strcmp(argv[1], "-C") == 0) {
        if (chdir(argv[2]) != 0) {
            perror("chdir");
            return 2;
        }
        arg = 3;
    }
    if (arg >= argc) {
        fprintf(stderr, "usage: mockfs_fuzz_probe [-C DIR] PATHS_FILE\n");
        return 2;
    }
    FILE *list = fopen(argv[arg], "rb");
    if (list == NULL) {
        perror(argv[arg]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOFBF, 1 << 16);
    char *entry = NULL;
    size_t size = 0;
    ssize_t len;
    for (size_t i = 0; (len = getdelim(&entry, &size, '\0', list)) > 0; i++) {
        if (strcmp(entry, "\001NULL") == 0)
            probe_null(i);
        else
            probe(i, entry);
    }
    free(entry);
    fclose(list);
    return 0;
}
