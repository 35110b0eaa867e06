/*
 * libumadshim.so: carries libibumad's management datagrams to the node's
 * mock-ib daemon instead of a kernel umad device.
 *
 * What it hooks, and why nothing else needs hooking:
 *
 * - open("/dev/infiniband/umad<N>") (and the open64/openat/__open_2
 *   spellings) returns a connected AF_UNIX SOCK_SEQPACKET socket to the
 *   daemon's socket, after a HELLO naming <N>.  A kernel umad file reads
 *   and writes one `struct ib_user_mad` (64-byte header + MAD) per call;
 *   a SEQPACKET socket keeps exactly those boundaries, so libibumad's own
 *   read(), write() and poll() work on it unchanged.
 * - ioctl() with the umad magic (0x1b) on such a socket: REGISTER_AGENT and
 *   UNREGISTER_AGENT become control frames answered by the daemon (which
 *   hands out the agent ids and routes unsolicited MADs by them);
 *   ENABLE_PKEY succeeds locally (the daemon always uses the 64-byte header
 *   with pkey_index, the "new" umad API); REGISTER_AGENT2 fails with EINVAL
 *   so libibumad falls back to the first form, as on kernels without it.
 *
 * Control frames are shorter than the 64-byte umad header, which is how the
 * daemon tells them from MAD frames (every MAD frame is at least a header).
 * They are synchronous: the daemon answers each before it sends anything else
 * on the connection that could concern the new agent.
 *
 * Where the daemon listens: $MOKKA_IB_UMAD_SOCKET, else
 * $MOKKA_MOCKFS_ROOT/run/mock-ib/umad.sock (the wrappers set
 * MOKKA_MOCKFS_ROOT to the mock IB tree).  sun_path holds 108 bytes and
 * node roots can be deeper than that, so the socket is reached through
 * /proc/self/fd/<fd of its directory>/umad.sock.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define UMADSHIM_EXPORT __attribute__((visibility("default")))

#define UMAD_PREFIX "/dev/infiniband/umad"
#define DEFAULT_SOCKET_TAIL "/run/mock-ib/umad.sock"

/* The umad ioctls (include/uapi/rdma/ib_user_mad.h): magic 0x1b. */
#define IB_IOCTL_MAGIC 0x1b
#define NR_REGISTER_AGENT 1
#define NR_UNREGISTER_AGENT 2
#define NR_ENABLE_PKEY 3
#define NR_REGISTER_AGENT2 4

/* struct ib_user_mad_reg_req: 27 bytes of fields, padded to 28. */
struct reg_req {
    uint32_t id;
    uint32_t method_mask[4];
    uint8_t qpn;
    uint8_t mgmt_class;
    uint8_t mgmt_class_version;
    uint8_t oui[3];
    uint8_t rmpp_version;
};

/* Control frames (see docs/ib.md, "shim protocol"). */
#define CTL_MAGIC "MKIB"
enum { CTL_HELLO = 1, CTL_REGISTER = 2, CTL_UNREGISTER = 3 };

struct ctl_request {
    char magic[4];
    uint32_t op;
    uint32_t arg;
    struct reg_req reg;
};

struct ctl_reply {
    char magic[4];
    uint32_t op;
    int32_t result; /* 0 or -errno */
    uint32_t value; /* the agent id for CTL_REGISTER */
};

/* Bound on the wait for a control reply: the daemon answers at once, so
 * only a wedged daemon makes this expire. */
#define CTL_TIMEOUT_MS 5000

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);
typedef int (*open2_fn)(const char *, int);
typedef int (*ioctl_fn)(int, unsigned long, ...);

static void *next_symbol(const char *name)
{
    return dlsym(RTLD_NEXT, name);
}

/* close(fd) for a failure path: the caller's errno, not close's, is what it reports. */
static int close_failed(int fd)
{
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
}

/* <N> of "/dev/infiniband/umad<N>", or -1 for any other path. */
static int umad_index(const char *path)
{
    if (path == NULL || strncmp(path, UMAD_PREFIX, sizeof(UMAD_PREFIX) - 1) != 0)
        return -1;
    const char *digits = path + sizeof(UMAD_PREFIX) - 1;
    if (*digits == '\0')
        return -1;
    long value = 0;
    for (const char *p = digits; *p; p++) {
        if (*p < '0' || *p > '9' || value > 100000)
            return -1;
        value = value * 10 + (*p - '0');
    }
    return (int)value;
}

static int socket_path(char *out, size_t size)
{
    const char *explicit_path = getenv("MOKKA_IB_UMAD_SOCKET");
    int n;
    if (explicit_path != NULL && *explicit_path)
        n = snprintf(out, size, "%s", explicit_path);
    else {
        const char *root = getenv("MOKKA_MOCKFS_ROOT");
        if (root == NULL || *root == '\0')
            return -1;
        n = snprintf(out, size, "%s%s", root, DEFAULT_SOCKET_TAIL);
    }
    return n > 0 && (size_t)n < size ? 0 : -1;
}

static int wait_reply(int fd, struct ctl_reply *reply, uint32_t op)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int ready = poll(&pfd, 1, CTL_TIMEOUT_MS);
    if (ready <= 0) {
        errno = ready == 0 ? ETIMEDOUT : errno;
        return -1;
    }
    ssize_t n = recv(fd, reply, sizeof(*reply), 0);
    if (n != (ssize_t)sizeof(*reply) || memcmp(reply->magic, CTL_MAGIC, 4) != 0 ||
        reply->op != op) {
        errno = EPROTO;
        return -1;
    }
    return 0;
}

/* Send one control frame and wait for its reply; -1 with errno on failure. */
static int control(int fd, struct ctl_request *request, size_t length, struct ctl_reply *reply)
{
    memcpy(request->magic, CTL_MAGIC, 4);
    ssize_t sent = send(fd, request, length, MSG_NOSIGNAL);
    if (sent != (ssize_t)length) {
        errno = sent < 0 ? errno : EPROTO;
        return -1;
    }
    if (wait_reply(fd, reply, request->op) < 0)
        return -1;
    if (reply->result < 0) {
        errno = -reply->result;
        return -1;
    }
    return 0;
}

static int connect_daemon(int fd, const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) < sizeof(addr.sun_path)) {
        strcpy(addr.sun_path, path);
        return connect(fd, (struct sockaddr *)&addr, sizeof(addr));
    }
    /* Too long for sun_path: go through the directory's descriptor. */
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == NULL) {
        errno = ENAMETOOLONG;
        return -1;
    }
    *slash = '\0';
    open_fn real_open = (open_fn)next_symbol("open");
    int dirfd = real_open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0)
        return -1;
    int n = snprintf(addr.sun_path, sizeof(addr.sun_path), "/proc/self/fd/%d/%s", dirfd,
                     slash + 1);
    int rc = -1;
    if (n > 0 && (size_t)n < sizeof(addr.sun_path))
        rc = connect(fd, (struct sockaddr *)&addr, sizeof(addr));
    else
        errno = ENAMETOOLONG;
    if (rc < 0)
        return close_failed(dirfd);
    close(dirfd);
    return rc;
}

/* The socket standing in for umad<index>, or -1 with errno. */
static int open_umad(int index, int flags)
{
    char path[4096];
    if (socket_path(path, sizeof(path)) < 0) {
        fprintf(stderr, "umadshim: MOKKA_MOCKFS_ROOT is not set, so there is no mock-ib daemon "
                        "to carry /dev/infiniband/umad%d\n", index);
        errno = ENODEV;
        return -1;
    }
    int type = SOCK_SEQPACKET | ((flags & O_CLOEXEC) ? SOCK_CLOEXEC : 0);
    int fd = socket(AF_UNIX, type, 0);
    if (fd < 0)
        return -1;
    if (connect_daemon(fd, path) < 0) {
        int saved = errno;
        fprintf(stderr, "umadshim: no mock-ib daemon answers at %s (%s)\n", path,
                strerror(saved));
        close(fd);
        errno = saved == ENOENT || saved == ECONNREFUSED ? ENODEV : saved;
        return -1;
    }
    struct ctl_request hello = {.op = CTL_HELLO, .arg = (uint32_t)index};
    struct ctl_reply reply;
    if (control(fd, &hello, offsetof(struct ctl_request, reg), &reply) < 0)
        return close_failed(fd);
    /* Non-blocking last: the HELLO exchange above waits with poll anyway. */
    if ((flags & O_NONBLOCK) && fcntl(fd, F_SETFL, O_NONBLOCK) < 0)
        return close_failed(fd);
    return fd;
}

/* What every mode-taking open entry point does: a umad<N> path becomes a
 * socket to the daemon; any other goes on to the next SYMBOL, with DIRFD for
 * the *at variants (AT is non-zero) and without it for the others. */
static int route_open(const char *symbol, int at, int dirfd, const char *path, int flags,
                      mode_t mode)
{
    int index = umad_index(path);
    if (index >= 0)
        return open_umad(index, flags);
    void *next = next_symbol(symbol);
    if (at)
        return ((openat_fn)next)(dirfd, path, flags, mode);
    return ((open_fn)next)(path, flags, mode);
}

/* The fortified __open_2/__open64_2 (no mode: they never create). */
static int route_open2(const char *symbol, const char *path, int flags)
{
    int index = umad_index(path);
    if (index >= 0)
        return open_umad(index, flags);
    return ((open2_fn)next_symbol(symbol))(path, flags);
}

static mode_t take_mode(int flags, va_list ap)
{
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

UMADSHIM_EXPORT int open(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = take_mode(flags, ap);
    va_end(ap);
    return route_open("open", 0, -1, path, flags, mode);
}

UMADSHIM_EXPORT int open64(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = take_mode(flags, ap);
    va_end(ap);
    return route_open("open64", 0, -1, path, flags, mode);
}

UMADSHIM_EXPORT int openat(int dirfd, const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = take_mode(flags, ap);
    va_end(ap);
    return route_open("openat", 1, dirfd, path, flags, mode);
}

UMADSHIM_EXPORT int openat64(int dirfd, const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = take_mode(flags, ap);
    va_end(ap);
    return route_open("openat64", 1, dirfd, path, flags, mode);
}

UMADSHIM_EXPORT int __open_2(const char *path, int flags)
{
    return route_open2("__open_2", path, flags);
}

UMADSHIM_EXPORT int __open64_2(const char *path, int flags)
{
    return route_open2("__open64_2", path, flags);
}

/* Is fd one of the shim's sockets (a umad ioctl on any other fd goes on to
 * the kernel)?  Only an AF_UNIX SOCK_SEQPACKET socket can be. */
static int is_umad_socket(int fd)
{
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode))
        return 0;
    int type = 0;
    socklen_t len = sizeof(type);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0 || type != SOCK_SEQPACKET)
        return 0;
    struct sockaddr_un peer;
    len = sizeof(peer);
    if (getpeername(fd, (struct sockaddr *)&peer, &len) < 0 || peer.sun_family != AF_UNIX)
        return 0;
    return 1;
}

/* Run a control exchange on a non-blocking socket as if it blocked. */
static int umad_ioctl(int fd, unsigned long request, void *arg)
{
    unsigned nr = _IOC_NR(request);
    if (nr == NR_ENABLE_PKEY)
        return 0;
    if (nr == NR_REGISTER_AGENT2) {
        errno = EINVAL;
        return -1;
    }
    struct ctl_request frame = {0};
    struct ctl_reply reply;
    if (nr == NR_REGISTER_AGENT && _IOC_SIZE(request) == sizeof(struct reg_req)) {
        if (arg == NULL) {
            errno = EFAULT;
            return -1;
        }
        frame.op = CTL_REGISTER;
        memcpy(&frame.reg, arg, sizeof(frame.reg));
        if (control(fd, &frame, sizeof(frame), &reply) < 0)
            return -1;
        ((struct reg_req *)arg)->id = reply.value;
        return 0;
    }
    if (nr == NR_UNREGISTER_AGENT) {
        if (arg == NULL) {
            errno = EFAULT;
            return -1;
        }
        frame.op = CTL_UNREGISTER;
        memcpy(&frame.arg, arg, sizeof(frame.arg));
        return control(fd, &frame, offsetof(struct ctl_request, reg), &reply);
    }
    errno = ENOTTY;
    return -1;
}

UMADSHIM_EXPORT int ioctl(int fd, unsigned long request, ...)
{
    va_list ap;
    va_start(ap, request);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    if (_IOC_TYPE(request) == IB_IOCTL_MAGIC && is_umad_socket(fd))
        return umad_ioctl(fd, request, arg);
    return ((ioctl_fn)next_symbol("ioctl"))(fd, request, arg);
}
