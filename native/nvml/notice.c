/*
 * The change notice (docs/engine-config.md, "Change notice"): the counter
 * file beside the config, how it is opened and followed from one stage to
 * the next, and how often a call reads it.  What a moved counter leads to
 * (re-reading the files) is refresh.c's; where the file is, locate.c's.
 *
 * The daemon bumps an 8-byte counter, `generation` beside the config,
 * after it has renamed a new config or workload file into place.  The
 * library keeps the file open from init and reads the counter with pread:
 * a call compares it with the value the current snapshot was loaded at
 * (snapshot.c).  Not a mapping: a mapped page past the end of a file that
 * was truncated faults (SIGBUS) in the client, and pread of a damaged file
 * only comes back short, which keeps the last value read.  The read is a
 * system call, so a process reads the counter in the first
 * MOCK_NOTICE_READS_PER_TICK calls of each tick of CLOCK_REALTIME_COARSE
 * (the clock every call reads anyway) and later calls of that tick compare
 * the value read last: a client making a few calls sees a change at its
 * very next call, one spinning on calls within a tick, and the spinning one
 * pays a few reads a tick, not one a call.  A counter file that was
 * replaced (a new stage after a discard) is noticed on the stat schedule
 * (refresh.c) and opened again.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "library.h"

/* The change notice's size (its name: locate.c). */
#define NOTICE_BYTES 8

/* The counter file, open read-only: g_notice_fd is -1 without one (read
 * by every call that reads the counter: atomic).  Once opened, the
 * descriptor's number stays the library's for good (g_notice_held): a
 * replaced file is dup3'ed onto it, so a thread reading it meanwhile reads
 * the old file or the new one, never a descriptor the client opened
 * since.  mock_notice_value is the counter as last read (0 without a
 * file), mock_loaded_notice (snapshot.c) its value when the files were
 * last read; every call compares the two (atomic).  mock_notice_tick and
 * mock_notice_reads count the reads of the current clock tick (atomic,
 * racy by design: a race only costs a read more or less); these three
 * are defined in snapshot.c with the rest of the hot path's state.  The
 * rest is guarded by mock_lock. */
static int g_notice_fd = -1;
static int g_notice_held = -1;
static char g_notice_path[PATH_MAX];
static dev_t g_notice_dev;                /* identity of the open file */
static ino_t g_notice_ino;

/* Called with mock_lock held: open the counter file when it is there and
 * not the one already open (first sight, or replaced by a new stage).  The
 * replacement takes the old descriptor's number (see g_notice_fd). */
void mock_notice_track(void)
{
    if (g_notice_path[0] == '\0')
        return;
    struct stat st;
    int fd = mock_open_regular(g_notice_path, &st);
    if (fd < 0)
        return; /* none (an older daemon, or torn down), or damaged: the stat schedule alone */
    if (g_notice_fd >= 0 && st.st_dev == g_notice_dev && st.st_ino == g_notice_ino) {
        close(fd);
        return;
    }
    if (g_notice_held < 0) {
        g_notice_held = fd;
    } else {
        int moved = dup3(fd, g_notice_held, O_CLOEXEC);
        close(fd);
        if (moved < 0) {
            mock_debug("cannot open change notice %s: %s", g_notice_path, strerror(errno));
            return;
        }
    }
    g_notice_dev = st.st_dev;
    g_notice_ino = st.st_ino;
    __atomic_store_n(&g_notice_fd, g_notice_held, __ATOMIC_RELEASE);
    mock_debug("change notice %s opened", g_notice_path);
}

/* Reads the counter into mock_notice_value.  A file cut shorter than the
 * counter (damaged: the daemon writes all 8 bytes in place) answers short
 * and the last value read stands; so does a failed read. */
__attribute__((noinline)) void mock_notice_read(void)
{
    int fd = __atomic_load_n(&g_notice_fd, __ATOMIC_ACQUIRE);
    unsigned char raw[NOTICE_BYTES];
    if (fd < 0 || pread(fd, raw, sizeof raw, 0) != (ssize_t)sizeof raw)
        return;
    unsigned long long value = 0;
    for (size_t i = sizeof raw; i-- > 0;)
        value = value << 8 | raw[i]; /* little-endian, as the daemon writes it */
    __atomic_store_n(&mock_notice_value, value, __ATOMIC_RELEASE);
}

void mock_notice_follow(const char *config)
{
    char notice_path[PATH_MAX];
    mock_locate_notice(config, notice_path, sizeof notice_path);
    if (strcmp(notice_path, g_notice_path) != 0) {
        /* another config (tests load several): its own counter, if any */
        strcpy(g_notice_path, notice_path);
        __atomic_store_n(&g_notice_fd, -1, __ATOMIC_RELEASE);
        __atomic_store_n(&mock_notice_value, 0, __ATOMIC_RELEASE);
    }
    mock_notice_track();
    mock_notice_read();
}

void mock_notice_forget(void)
{
    g_notice_path[0] = '\0';
    __atomic_store_n(&g_notice_fd, -1, __ATOMIC_RELEASE);
    __atomic_store_n(&mock_notice_value, 0, __ATOMIC_RELEASE);
}

void mock_notice_close(void)
{
    __atomic_store_n(&g_notice_fd, -1, __ATOMIC_RELEASE);
    if (g_notice_held >= 0)
        close(g_notice_held);
    g_notice_held = -1;
    g_notice_dev = 0;
    g_notice_ino = 0;
}
