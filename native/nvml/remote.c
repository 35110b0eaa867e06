/*
 * The engine config over the node daemon's socket, for a library that has
 * no config beside it (docs/engine-config.md, "Over the socket").
 *
 * A container whose CDI spec another tool wrote (`nvidia-ctk cdi
 * generate`, the device plugin's or the DRA driver's own specs) gets the
 * library, nvidia-smi and the device nodes, but no config directory.  What
 * those tools do mount, when it exists under the driver root, is
 * nvidia-persistenced's socket at /run/nvidia-persistenced/socket: the
 * node daemon serves one there, and this file asks it for the engine
 * config and the workload file.
 *
 * One request per connection, a line: `MOKKA-NVML 1 GET <token>\n`, where
 * the token names the files the client has (`-`: none).  The answer is a
 * line, `MOKKA-NVML 1 UNCHANGED <token>\n` or `MOKKA-NVML 1 OK <token>
 * <config bytes> <workload bytes>\n` followed by the two files' bytes, or
 * `MOKKA-NVML 1 ERROR <reason>\n`.
 *
 * Whoever listens there is not trusted: the daemon may be gone, slow, or
 * not the daemon at all (a real nvidia-persistenced, anything bound at the
 * path).  So every step waits in poll() against one deadline for the whole
 * exchange, every size is checked against the file reader's limits before
 * anything is allocated, and any deviation is a failure that leaves the
 * caller's last good snapshot in force.  No signal either: MSG_NOSIGNAL on
 * the send (a client's SIGPIPE handler is its own business).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "mock.h"

#define PROTOCOL "MOKKA-NVML 1"
/* The answer's first line: the protocol, a word, a token and two lengths
 * fit in far less; a longer line is no answer of ours. */
#define MAX_HEADER 160

/* Where nvidia-persistenced's socket is in a container (the toolkit's IPC
 * discoverer searches /run, then /var/run, under the driver root and
 * mounts what it finds at the same path). */
static const char *const SOCKET_PATHS[] = {
    "/run/nvidia-persistenced/socket",
    "/var/run/nvidia-persistenced/socket",
};

int mock_remote_locate(char *path, size_t size)
{
    const char *env = getenv("MOCK_NVML_SOCKET");
    if (env != NULL && *env != '\0') {
        if (strlen(env) >= size)
            return 0;
        strcpy(path, env);
        return 1;
    }
    for (size_t i = 0; i < MOCK_COUNT(SOCKET_PATHS); i++) {
        struct stat st;
        if (stat(SOCKET_PATHS[i], &st) == 0 && S_ISSOCK(st.st_mode) &&
            strlen(SOCKET_PATHS[i]) < size) {
            strcpy(path, SOCKET_PATHS[i]);
            return 1;
        }
    }
    return 0;
}

static long long remaining_ms(const struct timespec *deadline)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)(deadline->tv_sec - now.tv_sec) * 1000 +
           (deadline->tv_nsec - now.tv_nsec) / 1000000;
}

/* Waits until `fd` is ready for `events`, or the deadline passes (0). */
static int wait_for(int fd, short events, const struct timespec *deadline)
{
    for (;;) {
        long long left = remaining_ms(deadline);
        if (left <= 0)
            return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, (int)left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return 0;
        return (p.revents & (events | POLLHUP | POLLERR)) != 0;
    }
}

static int connect_to(const char *path, const struct timespec *deadline)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    int dirfd = -1;
    if (strlen(path) >= sizeof addr.sun_path) {
        /* A driver root deeper than sun_path's 108 bytes (a node root in a
         * temporary directory): connect through the directory's descriptor,
         * as the daemon binds there. */
        const char *slash = strrchr(path, '/');
        char dir[PATH_MAX];
        if (slash == NULL || (size_t)(slash - path) >= sizeof dir)
            return -1;
        memcpy(dir, path, (size_t)(slash - path));
        dir[slash - path] = '\0';
        dirfd = open(dir[0] ? dir : "/", O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (dirfd < 0)
            return -1;
        int n = snprintf(addr.sun_path, sizeof addr.sun_path, "/proc/self/fd/%d%s", dirfd, slash);
        if (n <= 0 || (size_t)n >= sizeof addr.sun_path) {
            close(dirfd);
            return -1;
        }
    } else {
        strcpy(addr.sun_path, path);
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        if (dirfd >= 0)
            close(dirfd);
        return -1;
    }
    int connected = connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0;
    int saved = errno;
    if (dirfd >= 0)
        close(dirfd); /* connect() has resolved the path */
    errno = saved;
    if (connected)
        return fd;
    if (errno == EINPROGRESS || errno == EINTR) {
        int err = 0;
        socklen_t len = sizeof err;
        if (wait_for(fd, POLLOUT, deadline) &&
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0)
            return fd;
    }
    /* EAGAIN: the listener's backlog is full; anything else: nobody there */
    close(fd);
    return -1;
}

/* Moves exactly `len` bytes over `fd`: sends them from `out`, or, when
 * `out` is NULL, receives them into `in`.  A socket that is not ready is
 * waited for until the deadline; 0: the peer closed early, failed or was
 * too slow. */
static int transfer_all(int fd, const char *out, char *in, size_t len,
                        const struct timespec *deadline)
{
    short events = out != NULL ? POLLOUT : POLLIN;
    size_t done = 0;
    while (done < len) {
        ssize_t n = out != NULL ? send(fd, out + done, len - done, MSG_NOSIGNAL)
                                : recv(fd, in + done, len - done, 0);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && wait_for(fd, events, deadline))
            continue;
        return 0;
    }
    return 1;
}

static int send_all(int fd, const char *buf, size_t len, const struct timespec *deadline)
{
    return transfer_all(fd, buf, NULL, len, deadline);
}

/* Reads exactly `len` bytes (0: the peer closed early, failed or was too slow). */
static int recv_all(int fd, char *buf, size_t len, const struct timespec *deadline)
{
    return transfer_all(fd, NULL, buf, len, deadline);
}

/* Reads one line of at most MAX_HEADER bytes a byte at a time up to its
 * newline, so what follows it is never read into `line`; NUL-terminates
 * it in place of the newline.  0: no line by the deadline. */
static int recv_line(int fd, char line[MAX_HEADER + 1], const struct timespec *deadline)
{
    size_t got = 0;
    for (;;) {
        if (got == MAX_HEADER || !recv_all(fd, line + got, 1, deadline))
            return 0;
        if (line[got] == '\n')
            break;
        got++;
    }
    line[got] = '\0';
    return 1;
}

static int valid_token(const char *token)
{
    size_t n = strlen(token);
    if (n == 0 || n > MOCK_REMOTE_TOKEN)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((token[i] >= '0' && token[i] <= '9') || (token[i] >= 'a' && token[i] <= 'f')))
            return 0;
    return 1;
}

/* A length in the header: digits only, at most the file reader's limit. */
static int parse_length(const char *word, size_t *out)
{
    unsigned long long v;
    for (const char *p = word; *p; p++)
        if (*p < '0' || *p > '9')
            return 0; /* no 0x, no sign: what the daemon writes */
    if (!mock_parse_u64(word, &v) || v > MOCK_MAX_CONFIG_BYTES)
        return 0;
    *out = (size_t)v;
    return 1;
}

/* Parses the answer's first line; 1 for OK (lengths set), 0 for UNCHANGED,
 * -1 for anything else. */
static int parse_header(char *line, char *token, size_t *config_len, size_t *workload_len)
{
    char *words[6];
    int n = 0;
    for (char *save = NULL, *w = strtok_r(line, " ", &save); w != NULL;
         w = strtok_r(NULL, " ", &save)) {
        if (n == (int)MOCK_COUNT(words))
            return -1;
        words[n++] = w;
    }
    if (n < 4 || strcmp(words[0], "MOKKA-NVML") != 0 || strcmp(words[1], "1") != 0 ||
        !valid_token(words[3]))
        return -1;
    if (strcmp(words[2], "UNCHANGED") == 0 && n == 4) {
        strcpy(token, words[3]);
        return 0;
    }
    if (strcmp(words[2], "OK") == 0 && n == 6 && parse_length(words[4], config_len) &&
        parse_length(words[5], workload_len)) {
        strcpy(token, words[3]);
        return 1;
    }
    return -1;
}

int mock_remote_fetch(const char *path, const char *have, struct mock_remote_reply *out)
{
    memset(out, 0, sizeof *out);
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_nsec += (long)MOCK_REMOTE_BUDGET_MS * 1000000L;
    deadline.tv_sec += deadline.tv_nsec / 1000000000L;
    deadline.tv_nsec %= 1000000000L;

    int fd = connect_to(path, &deadline);
    if (fd < 0) {
        mock_debug("engine config socket %s: cannot connect", path);
        return -1;
    }
    char request[64 + MOCK_REMOTE_TOKEN];
    int len = snprintf(request, sizeof request, PROTOCOL " GET %s\n",
                       have != NULL && valid_token(have) ? have : "-");
    /* The header is read a byte at a time up to its newline, so the body
     * that follows is never read into the header's buffer (a few dozen
     * system calls, four times a second at most). */
    char header[MAX_HEADER + 1];
    int result = -1;
    if (!send_all(fd, request, (size_t)len, &deadline) || !recv_line(fd, header, &deadline))
        goto out;
    size_t config_len = 0, workload_len = 0;
    char token[MOCK_REMOTE_TOKEN + 1];
    int kind = parse_header(header, token, &config_len, &workload_len);
    if (kind < 0)
        goto out;
    strcpy(out->token, token);
    if (kind == 0) {
        result = 0;
        goto out;
    }
    char *text = malloc(config_len + workload_len + 1);
    if (text == NULL)
        goto out;
    if (!recv_all(fd, text, config_len + workload_len, &deadline)) {
        free(text);
        goto out;
    }
    out->text = text;
    out->config_len = config_len;
    out->workload_len = workload_len;
    result = 1;
out:
    if (result < 0)
        mock_debug("engine config socket %s: no usable answer", path);
    close(fd);
    return result;
}

/* The answer to a SET: `MOKKA-NVML 1 OK` or `MOKKA-NVML 1 ERROR <code>
 * <reason>`, where the code is an NVML return code the daemon chose. */
static nvmlReturn_t parse_set_answer(const char *line)
{
    if (strcmp(line, PROTOCOL " OK") == 0)
        return NVML_SUCCESS;
    const char *prefix = PROTOCOL " ERROR ";
    if (strncmp(line, prefix, strlen(prefix)) != 0)
        return NVML_ERROR_UNKNOWN;
    char *end = NULL;
    errno = 0;
    long code = strtol(line + strlen(prefix), &end, 10);
    if (errno != 0 || end == line + strlen(prefix) || code <= 0 || code > NVML_ERROR_UNKNOWN ||
        (*end != ' ' && *end != '\0'))
        return NVML_ERROR_UNKNOWN;
    mock_debug("the node daemon refused the change: %s", line);
    return (nvmlReturn_t)code;
}

nvmlReturn_t mock_remote_set(const char *path, const char *uuid, const char *key,
                             const char *value)
{
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += MOCK_REMOTE_SET_BUDGET_MS / 1000;
    deadline.tv_nsec += (long)(MOCK_REMOTE_SET_BUDGET_MS % 1000) * 1000000L;
    deadline.tv_sec += deadline.tv_nsec / 1000000000L;
    deadline.tv_nsec %= 1000000000L;

    char request[MAX_HEADER + 1];
    int len = snprintf(request, sizeof request, PROTOCOL " SET %s %s %s\n", uuid, key, value);
    if (len <= 0 || (size_t)len >= sizeof request)
        return NVML_ERROR_INVALID_ARGUMENT;
    int fd = connect_to(path, &deadline);
    if (fd < 0) {
        mock_debug("node daemon socket %s: cannot connect", path);
        return NVML_ERROR_UNKNOWN;
    }
    nvmlReturn_t result = NVML_ERROR_UNKNOWN;
    char line[MAX_HEADER + 1];
    if (!send_all(fd, request, (size_t)len, &deadline) || !recv_line(fd, line, &deadline))
        goto out;
    result = parse_set_answer(line);
out:
    close(fd);
    return result;
}
