/*
 * Internal interfaces of the mock NVML library.
 *
 * The library answers NVML calls from one engine config file that the node
 * daemon compiles (docs/engine-config.md).  The pieces:
 *
 *   config.c      read and parse the engine config into an immutable snapshot
 *   lookup.c      find a key in a snapshot: the device-field hash table and
 *                 the per-snapshot key table (MOCK_KEYS) the hot getters read
 *   values.c      what a value means (numbers, booleans, enum words) and the
 *                 typed lookups of a device field built on them
 *   library.c,    the library's state (their shared internals are in
 *   snapshot.c,   library.h): init/shutdown reference count and the lock;
 *   notice.c,     the current snapshot, its references and the lock-free
 *   refresh.c     hot path; the change notice; the re-read schedule,
 *                 change detection and re-reading
 *   remote.c      the engine config and workload file over the node
 *                 daemon's socket, for a library with no config beside it
 *   locate.c      where the config and its change notice are, how often
 *                 the config is stat'ed
 *   errors.c      nvmlErrorString
 *   call.c        one call on a device (begin/end) and the typed getters
 *                 built on it, so each NVML getter names only its field
 *   devices.c     device handles, visibility, enumeration and identity
 *   firmware.c    VBIOS, InfoROM (and its black box flush), GSP firmware
 *   modes.c       operating modes (persistence, compute, GOM, ...) and MIG mode
 *   mig.c,        MIG: the mode setter and the instance layout (mig.c),
 *   mig_*.c       the profile table (mig_profiles.c), GPU and compute
 *                 instances (mig_gpu_instances.c, mig_compute_instances.c)
 *                 and MIG device handles (mig_devices.c); their shared
 *                 internals are in mig.h
 *   failure.c     per-process failure injection (lost GPUs, ECC storms)
 *   pci.c         PCI identity, bus type, link state, topology and affinity
 *   memory.c      frame buffer, BAR1, ECC, retired pages, remapped rows
 *   processes.c   the processes running on a GPU (profile's and holders)
 *   power.c       power draw and limits, total energy, performance state
 *   thermal.c     temperature, thresholds, thermal sensors, fans
 *   clocks.c      clocks, supported clocks, clocks event reasons,
 *                 violation status, auto boost
 *   utilization.c utilization rates, media engines, encoder and FBC stats
 *   nvlink.c,     NVLink links and the link getters (nvlink.c); traffic
 *   nvlink_counters.c  and error counters and NVLink field values
 *   fabric.c      GPU fabric info, addressing mode
 *   meters.c      quantities integrated over time (NVLink traffic, throttled time)
 *   samples.c     sample buffers (nvmlDeviceGetSamples), per-process utilization
 *   gpm.c         GPU performance monitoring (Hopper and later)
 *   fields.c      nvmlDeviceGetFieldValues
 *   workload.c    the workload file: which GPUs pods hold, as processes
 *   patterns.c,   the readings that move (utilization, memory used, power,
 *   board.c,      temperature, clocks, clocks event reasons): patterns, a
 *   idle_signature.c  device's inputs resolved per snapshot (board.c), the
 *   dynamics.c,   idle signature, the board model that derives them in one
 *   readings.c,   place from overrides, patterns, holders and the profile,
 *   energy.c      the cache that keeps them per clock tick, and what
 *                 follows from them (performance state, total energy
 *                 counter); their shared internals are in dynamics.h
 *   events.c      event sets and Xid delivery
 *   export_table.c  nvmlInternalGetExportTable for nvidia-smi
 *   system.c      system-level queries (versions, process names, units)
 *   stubs.c       generated: every other function NVIDIA's header declares
 *
 * Snapshots are immutable and reference counted, so a call works on one
 * consistent config even while another thread swaps in a newer one; the
 * library notices a new config through the change notice (notice.c) and
 * serves the current one without a lock.
 */
#ifndef MOCK_NVML_MOCK_H
#define MOCK_NVML_MOCK_H

#include <stddef.h>
#include <stdint.h>

#include "nvml.h"

/* Marks a definition as part of the library's exported ABI.  Everything
 * else is hidden (-fvisibility=hidden), so only NVML names are exported.
 * The export generator scans for this marker to know what is implemented. */
#define MOCK_API __attribute__((visibility("default")))

/* Size of the device table; the Python writer enforces the same limit. */
#define MOCK_MAX_DEVICES 64
/* Limits the C parser enforces (the Python writer checks them first). */
#define MOCK_MAX_KEY 200
#define MOCK_MAX_VALUE 4096
#define MOCK_MAX_LINE (MOCK_MAX_KEY + 2 * MOCK_MAX_VALUE + 16)
#define MOCK_MAX_CONFIG_BYTES (16u << 20)
/* The only engine config format this library understands. */
#define MOCK_CONFIG_FORMAT "1"

/* Number of elements of a true array (not a pointer). */
#define MOCK_COUNT(array) (sizeof(array) / sizeof *(array))

/* ---------------------------------------- config.c, lookup.c, values.c */

struct mock_entry {
    const char *key;   /* points into mock_config.text */
    const char *value; /* unquoted, NUL-terminated */
};

/* A device's failure spec, read once per snapshot (failure.c). */
enum mock_failure_mode {
    MOCK_FAILURE_NONE = 0, /* healthy, or a mode this library does not know */
    MOCK_FAILURE_LOST,     /* lost, fallen_off_bus */
    MOCK_FAILURE_ECC,      /* ecc_uncorrectable: node state, arms no call */
};
struct mock_failure_spec {
    unsigned char mode;          /* enum mock_failure_mode */
    unsigned char has_after, has_probability;
    unsigned long long after, seed;
    double probability;
    unsigned long long id;       /* identifies the spec's text: a changed spec starts over */
    unsigned char raises_xid;    /* fallen_off_bus with no failure.xid: raises Xid 79 (events.c) */
};

/* The device fields the per-call getters read, resolved once per snapshot
 * (lookup.c): such a getter reads its field by index, with no key to hash
 * or compare and no number to parse.  A field's value is the profile's; a
 * moving one (utilization, power draw, ...) is read through readings.c as
 * every other lookup of it is (mock_key_u64). */
#define MOCK_KEYS(X)                                                   \
    X(NAME, "name")                                                    \
    X(UUID, "uuid")                                                    \
    X(MINOR, "minor")                                                  \
    X(POWER_DRAW, "power.current_draw_mw")                             \
    X(TEMPERATURE_GPU, "thermal.temperature_gpu_c")                    \
    X(UTIL_GPU, "utilization.gpu")                                     \
    X(UTIL_MEMORY, "utilization.memory")                               \
    X(MEMORY_TOTAL, "memory.total_bytes")                              \
    X(MEMORY_RESERVED, "memory.reserved_bytes")                        \
    X(MEMORY_USED, "memory.used_bytes")                                \
    X(PERFORMANCE_STATE, "performance_state")                          \
    X(POWER_STATE, "power.power_state")                                \
    X(PINNED_PERFORMANCE_STATE, "pinned.performance_state")            \
    X(PINNED_POWER_STATE, "pinned.power.power_state")                  \
    X(CLOCK_GRAPHICS_CURRENT, "clocks.graphics_current")               \
    X(CLOCK_GRAPHICS_MAX, "clocks.graphics_max")                       \
    X(CLOCK_GRAPHICS_APP, "clocks.graphics_app")                       \
    X(CLOCK_GRAPHICS_APP_DEFAULT, "clocks.graphics_app_default")       \
    X(CLOCK_SM_CURRENT, "clocks.sm_current")                           \
    X(CLOCK_SM_MAX, "clocks.sm_max")                                   \
    X(CLOCK_SM_APP, "clocks.sm_app")                                   \
    X(CLOCK_SM_APP_DEFAULT, "clocks.sm_app_default")                   \
    X(CLOCK_MEMORY_CURRENT, "clocks.memory_current")                   \
    X(CLOCK_MEMORY_MAX, "clocks.memory_max")                           \
    X(CLOCK_MEMORY_APP, "clocks.memory_app")                           \
    X(CLOCK_MEMORY_APP_DEFAULT, "clocks.memory_app_default")           \
    X(CLOCK_VIDEO_CURRENT, "clocks.video_current")                     \
    X(CLOCK_VIDEO_MAX, "clocks.video_max")                             \
    X(CLOCK_VIDEO_APP, "clocks.video_app")                             \
    X(CLOCK_VIDEO_APP_DEFAULT, "clocks.video_app_default")

enum mock_key {
#define MOCK_KEY_ENUM(id, field) MOCK_KEY_##id,
    MOCK_KEYS(MOCK_KEY_ENUM)
#undef MOCK_KEY_ENUM
    MOCK_KEY_COUNT
};

/* One resolved field: its text and the numbers it parses as. */
struct mock_value {
    const char *text;           /* points into mock_config.text; NULL: no such field */
    unsigned long long u64;     /* mock_parse_u64's answer, when has_u64 */
    long long i64;              /* mock_parse_i64's answer, when has_i64 */
    unsigned char has_u64, has_i64;
    unsigned char moves;        /* a moving quantity: its reading may stand in (readings.c) */
};

/* One slot of the device-field hash table: entry index + 1 (0: empty) and
 * the hash's high bits, so a probe compares strings only on a likely hit. */
struct mock_slot {
    unsigned index;
    unsigned tag;
};

struct mock_config {
    /* atomic; the library's current pointer holds one, and so does each
     * thread that last used this snapshot (snapshot.c) */
    int refs;
    char *text;                  /* owned copy of the file, split in place */
    struct mock_entry *entries;  /* sorted by key, unique keys */
    size_t count;
    char dir[4096];              /* directory of the config file (for relative paths) */
    unsigned device_count;
    /* Devices this process may see (see devices.c, visibility). */
    unsigned visible_count;
    unsigned visible[MOCK_MAX_DEVICES];  /* ordinal -> position */
    int ordinal[MOCK_MAX_DEVICES];       /* position -> ordinal, -1 if hidden */
    /* Where each device's keys are in `entries` (lookup.c), and a hash
     * table over them by (position, field): a device lookup hashes the
     * field alone, with no key to format and no search. */
    unsigned dev_first[MOCK_MAX_DEVICES], dev_keys[MOCK_MAX_DEVICES];
    unsigned char dev_prefix[MOCK_MAX_DEVICES]; /* strlen("device.<pos>.") */
    struct mock_slot *slots;     /* a power of two of them; NULL: search the runs */
    size_t slot_mask;
    /* Each device's MOCK_KEYS fields, resolved at parse: values[pos][key]. */
    struct mock_value (*values)[MOCK_KEY_COUNT];
    /* Each device's reading inputs, resolved on first use (board.c). */
    struct mock_board *boards[MOCK_MAX_DEVICES];
    /* Each device's failure spec (engine configs; zero: none). */
    struct mock_failure_spec failure[MOCK_MAX_DEVICES];
};

/* Parses `len` bytes of config text.  On error returns NULL and writes a
 * one-line reason into err. */
struct mock_config *mock_config_parse(const char *text, size_t len, const char *dir,
                                      char *err, size_t errlen);
void mock_config_free(struct mock_config *cfg);
/* Builds a freshly parsed snapshot's lookup tables (lookup.c): each
 * device's run of keys, the device-field hash table and the resolved
 * MOCK_KEYS fields.  0 without memory for the key table. */
int mock_config_index(struct mock_config *cfg);

const char *mock_cfg_get(const struct mock_config *cfg, const char *key);
/* Looks up "device.<pos>.<field>". */
const char *mock_dev_get(const struct mock_config *cfg, unsigned pos, const char *field);
/* Typed lookups: return 1 when the key exists and parses, else 0. */
int mock_parse_u64(const char *value, unsigned long long *out);
int mock_parse_i64(const char *value, long long *out);
int mock_parse_bool(const char *value, int *out);
int mock_cfg_u64(const struct mock_config *cfg, const char *key, unsigned long long *out);
int mock_dev_u64(const struct mock_config *cfg, unsigned pos, const char *field,
                 unsigned long long *out);
int mock_dev_uint(const struct mock_config *cfg, unsigned pos, const char *field,
                  unsigned int *out);
int mock_dev_int(const struct mock_config *cfg, unsigned pos, const char *field, int *out);
int mock_dev_bool(const struct mock_config *cfg, unsigned pos, const char *field, int *out);
int mock_dev_double(const struct mock_config *cfg, unsigned pos, const char *field,
                    double *out);
int mock_parse_double(const char *value, double *out);
/* The profile field a key names ("power.current_draw_mw"). */
const char *mock_key_field(enum mock_key key);
/* The resolved field: what mock_dev_get and the parsers answer for it. */
static inline const struct mock_value *mock_key_value(const struct mock_config *cfg, unsigned pos,
                                                      enum mock_key key)
{
    return &cfg->values[pos][key];
}

/* What the typed lookups share: a reading's or a parsed value's range
 * checks (`ok`: there is a value `v` at all). */
static inline int mock_reading_u64(long long reading, unsigned long long *out)
{
    if (reading < 0)
        return 0;
    *out = (unsigned long long)reading;
    return 1;
}

static inline int mock_narrow_uint(int ok, unsigned long long v, unsigned *out)
{
    if (!ok || v > 0xffffffffULL)
        return 0;
    *out = (unsigned)v;
    return 1;
}

static inline int mock_narrow_int(int ok, long long v, int *out)
{
    if (!ok || v < -2147483647LL - 1 || v > 2147483647LL)
        return 0;
    *out = (int)v;
    return 1;
}

/* The raw profile value of a device field, with no reading derived from it
 * (typed lookups of a moving quantity answer mock_reading's value). */
int mock_dev_raw_u64(const struct mock_config *cfg, unsigned pos, const char *field,
                     unsigned long long *out);
/* Reads a whole file of at most MOCK_MAX_CONFIG_BYTES and parses it (the
 * engine config's format).  NULL with *missing set when there is no file,
 * NULL with a reason in err when it is damaged. */
struct mock_config *mock_config_load(const char *path, int *missing, char *err, size_t errlen);
/* Whether two stats are of the same, unchanged file (device, inode, size,
 * mtime, ctime): how the config and workload files are watched. */
struct stat;
int mock_same_file(const struct stat *a, const struct stat *b);
/* Opens one of the library's files for reading (library.c): a descriptor
 * and *st, or -1 with errno.  Non-blocking and for regular files only, so
 * a FIFO, device or directory put in the file's place never blocks a
 * client: refused with EINVAL (EISDIR for a directory). */
int mock_open_regular(const char *path, struct stat *st);
/* The length of a list, spelled `<list>.count` plus `<list>.<i>...` items:
 * 1 and *out when the count parses, cut to the entries the file has under
 * the items' prefix.  Every item has at least one key, so a larger count is
 * damage that must not drive a loop (or a client's allocation) to 2^32. */
int mock_cfg_list_len(const struct mock_config *cfg, const char *count_key,
                      const char *items_prefix, unsigned *out);
/* The same for a device's list: `device.<pos>.<list>.count` and `.<list>.`. */
int mock_dev_list_len(const struct mock_config *cfg, unsigned pos, const char *list,
                      unsigned *out);
/* 1 when the device field equals `expected` (case-insensitive). */
int mock_dev_is(const struct mock_config *cfg, unsigned pos, const char *field,
                const char *expected);

/* One word a profile may spell an NVML enum value with.  Values are
 * unsigned: NVML's enums have no negative members (GCC gives them the type
 * unsigned int) and some "enums" are plain unsigned typedefs. */
struct mock_enum_name {
    const char *name;
    unsigned value;
};

/* Looks `value` up in `table` (case-insensitive); 1 and *out when found,
 * 0 for NULL or a word the table does not list. */
int mock_enum_lookup(const char *value, const struct mock_enum_name *table, size_t n,
                     unsigned *out);

/* Copies a config string to a caller buffer of `length` bytes, NVML style:
 * NULL buf -> INVALID_ARGUMENT, missing value -> NOT_SUPPORTED, too small ->
 * INSUFFICIENT_SIZE. */
nvmlReturn_t mock_copy_out(const char *value, char *buf, unsigned int length);
/* Copies `value` into `length` bytes as NVML does where it truncates (a
 * process name) rather than fails: cut at a character's boundary, so the
 * copy stays well-formed UTF-8 as the value is (config.c). */
void mock_truncate_copy(const char *value, char *buf, unsigned int length);

/* ------------------------------------------------ refresh.c, locate.c */

/* How often (at most) the config file is stat'ed for changes, unless
 * MOCK_NVML_RECHECK_INTERVAL_MS says otherwise (0: at every call). */
#define MOCK_RECHECK_INTERVAL_NS 1000000000ULL
/* Where the engine config is (locate.c): MOCK_NVML_CONFIG (returns
 * MOCK_FROM_ENV), else <lib>/../../config/config.yaml (MOCK_BESIDE); 0
 * when neither can be told. */
#define MOCK_FROM_ENV 1
#define MOCK_BESIDE 2
int mock_locate_config(char *path, size_t size);
/* The change notice's path beside `config` (empty when it does not fit). */
void mock_locate_notice(const char *config, char *path, size_t size);
/* The stat schedule's interval: MOCK_NVML_RECHECK_INTERVAL_MS, else
 * MOCK_RECHECK_INTERVAL_NS. */
unsigned long long mock_recheck_interval_ns(void);

/* ------------------------------------------------------------ remote.c */

/* How often (at most) a library without a config beside it asks the node
 * daemon's socket whether the files changed: a `mokka ctl` change reaches
 * a container within a second (the daemon's pass, then this). */
#define MOCK_REMOTE_INTERVAL_NS 250000000ULL
/* The whole exchange (connect, request, answer) must finish within this;
 * a failed one is retried later, at most every MOCK_REMOTE_BACKOFF_NS. */
#define MOCK_REMOTE_BUDGET_MS 200
#define MOCK_REMOTE_BACKOFF_NS 2000000000ULL
/* The longest token the daemon hands out (hex digits). */
#define MOCK_REMOTE_TOKEN 32
/* The directory a snapshot read over the socket names: none (no file of
 * it is on this side, so nothing is looked up relative to it). */
#define MOCK_REMOTE_DIR "(socket)"

/* One answer: the token names the files; `text` (malloc'ed) holds the
 * engine config's config_len bytes, then the workload file's. */
struct mock_remote_reply {
    char token[MOCK_REMOTE_TOKEN + 1];
    char *text;
    size_t config_len, workload_len;
};
/* The socket to ask: MOCK_NVML_SOCKET, else /run/nvidia-persistenced/socket,
 * else /var/run/nvidia-persistenced/socket (the first that is a socket);
 * 0 when none is there. */
int mock_remote_locate(char *path, size_t size);
/* Asks the socket at `path` for the files, saying which the caller has
 * (`have`: a token, or NULL).  1: new files in *out (free out->text);
 * 0: unchanged; -1: no usable answer (nothing to free). */
int mock_remote_fetch(const char *path, const char *have, struct mock_remote_reply *out);

/* The longest a SET exchange waits: the daemon answers once the change is
 * in the engine config every process reads, a reconcile pass away. */
#define MOCK_REMOTE_SET_BUDGET_MS 10000
/* Asks the daemon at `path` to set `key` to `value` on the GPU `uuid`
 * (`MOKKA-NVML 1 SET <uuid> <key> <value>`): NVML_SUCCESS, the daemon's
 * NVML error code, or NVML_ERROR_UNKNOWN when no usable answer came. */
nvmlReturn_t mock_remote_set(const char *path, const char *uuid, const char *key,
                             const char *value);

/* ---------------------------------------------------------- setters.c */

/* Sends one change of `device` to the node daemon (`key` to `value`, the
 * words of docs/nvml.md "Setters"): NO_PERMISSION for a caller that is not
 * root, without asking; else the daemon's answer. */
nvmlReturn_t mock_set_device(nvmlDevice_t device, const char *key, const char *value);
/* Makes the next call re-read the engine config (refresh.c): a setter's
 * change shows in the caller's own next query. */
void mock_recheck_now(void);

/* The current snapshot, NULL when not initialized.  No lock and no
 * reference count on the way: the calling thread's own reference keeps it
 * alive until its next call (snapshot.c).  Release it with mock_release, on
 * the same thread; a call made inside a call gets the outer call's. */
struct mock_config *mock_acquire(void);
/* Ends mock_acquire's use, or drops a reference (a workload snapshot). */
void mock_release(struct mock_config *cfg);
/* NVML_SUCCESS when initialized, else UNINITIALIZED: for calls that answer
 * a constant but must still fail before nvmlInit, as NVIDIA's do. */
nvmlReturn_t mock_require_init(void);
void mock_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Monotonic clock in nanoseconds. */
unsigned long long mock_now_ns(void);
/* CLOCK_REALTIME_COARSE in nanoseconds as of the start of the calling
 * thread's current NVML call (read once per call), or now outside one. */
unsigned long long mock_call_clock(void);
/* How many times the library has looked at its files for a change (the
 * change notice moved, or the stat schedule came due): workload.c looks at
 * its own file when this moves.  Read inside a call, after mock_acquire. */
static inline unsigned long long mock_check_count(void)
{
    extern unsigned long long mock_checks __attribute__((visibility("hidden")));
    return __atomic_load_n(&mock_checks, __ATOMIC_ACQUIRE);
}

/* ----------------------------------------------------------- devices.c */

struct nvmlDevice_st {
    unsigned char unused; /* handles are addresses in a static table */
};

/* The handles: addresses in this table, one per device position. */
extern struct nvmlDevice_st mock_handles[MOCK_MAX_DEVICES] __attribute__((visibility("hidden")));

nvmlDevice_t mock_handle(unsigned pos);
/* MIG devices (mig_devices.c): whether `device` is a MIG device handle (its GPU's
 * position, GPU and compute instance ids), and its UUID and name, which
 * devices.c's getters answer through (1: it was one, *r the answer). */
int mock_mig_device(nvmlDevice_t device, unsigned *pos, unsigned *gi, unsigned *ci);
int mock_mig_uuid(nvmlDevice_t device, char *uuid, unsigned int length, nvmlReturn_t *r);
int mock_mig_name(nvmlDevice_t device, char *name, unsigned int length, nvmlReturn_t *r);
/* The position a handle stands for; 0 for anything but one of ours. */
static inline int mock_handle_pos(nvmlDevice_t device, unsigned *pos)
{
    uintptr_t base = (uintptr_t)mock_handles, p = (uintptr_t)device;
    if (p - base >= sizeof mock_handles) /* NULL and below the table wrap around */
        return 0;
    *pos = (unsigned)(p - base) / sizeof *mock_handles;
    return 1;
}
/* Computes the visible device list of a fresh snapshot. */
void mock_compute_visibility(struct mock_config *cfg);

/* The state of one device call: a snapshot and the device's position. */
struct mock_call {
    struct mock_config *cfg;
    unsigned pos;
};

enum mock_guard {
    MOCK_IDENTITY = 0, /* answers even for a lost GPU (handles, UUID, PCI) */
    MOCK_GUARDED = 1,  /* subject to failure injection */
};

/* ---------------------------------------------------------- firmware.c */

/* The node's boot time, seconds since the epoch (`btime` of /proc/stat,
 * read once per process; the real one even under a pinned clock), or 0
 * when /proc/stat has none.  The driver loads at boot: the black box's
 * flush and the energy counter (energy.c) count from it. */
unsigned long long mock_boot_time(void);

/* -------------------------------------------------------------- call.c */

/* Starts a device call: checks init, validates the handle, applies failure
 * injection.  On success the caller must call mock_end.  Both are inline
 * (defined at the end of this header): every device call runs them. */
static inline nvmlReturn_t mock_begin(struct mock_call *call, nvmlDevice_t device,
                                      enum mock_guard guard);
static inline void mock_end(struct mock_call *call);

/* Whole calls that answer one device field, so each getter states only
 * which field it reads.  All follow NVML's contract: a NULL output ->
 * INVALID_ARGUMENT (before anything else), then mock_begin's errors, then
 * NOT_SUPPORTED when the profile lacks the field (outputs left untouched). */
nvmlReturn_t mock_string_field(nvmlDevice_t device, enum mock_guard guard, const char *field,
                               char *buf, unsigned int length);
nvmlReturn_t mock_uint_field(nvmlDevice_t device, enum mock_guard guard, const char *field,
                             unsigned int *out);
nvmlReturn_t mock_u64_field(nvmlDevice_t device, enum mock_guard guard, const char *field,
                            unsigned long long *out);
nvmlReturn_t mock_int_field(nvmlDevice_t device, enum mock_guard guard, const char *field,
                            int *out);
/* The same for a MOCK_KEYS field, read by key (the hot getters). */
nvmlReturn_t mock_string_key(nvmlDevice_t device, enum mock_guard guard, enum mock_key key,
                             char *buf, unsigned int length);
nvmlReturn_t mock_uint_key(nvmlDevice_t device, enum mock_guard guard, enum mock_key key,
                           unsigned int *out);
nvmlReturn_t mock_int_key(nvmlDevice_t device, enum mock_guard guard, enum mock_key key, int *out);
/* A boolean field ("enabled"/"disabled"/true/false...) as an enable state. */
nvmlReturn_t mock_enable_field(nvmlDevice_t device, enum mock_guard guard, const char *field,
                               nvmlEnableState_t *out);

/* `fallback` for mock_enum_field: no fallback, NOT_SUPPORTED instead. */
#define MOCK_ENUM_REQUIRED (-1LL)
/* A word-valued field mapped through `table`; an absent field or unknown
 * word answers `fallback`, or NOT_SUPPORTED when it is MOCK_ENUM_REQUIRED.
 * Enum outputs are passed as `(unsigned *)`: see struct mock_enum_name. */
nvmlReturn_t mock_enum_field(nvmlDevice_t device, enum mock_guard guard, const char *field,
                             const struct mock_enum_name *table, size_t n, long long fallback,
                             unsigned *out);

/* A current/pending pair of boolean modes: NOT_SUPPORTED without the
 * current one; a missing pending one equals the current (nothing pending). */
nvmlReturn_t mock_mode_pair(nvmlDevice_t device, const char *current_field,
                            const char *pending_field, int *current, int *pending);

/* Calls whose answer is fixed for a simulated GPU (no sessions, no MIG
 * devices...) but which still validate the handle and inject failures. */
nvmlReturn_t mock_constant_uint(nvmlDevice_t device, enum mock_guard guard, unsigned value,
                                unsigned int *out);
nvmlReturn_t mock_constant_u64(nvmlDevice_t device, enum mock_guard guard,
                               unsigned long long value, unsigned long long *out);

/* Reads a group of related fields in one guarded call: `read` fills `out`
 * from the snapshot and returns 0 when the profile lacks the group, which
 * the call reports as NOT_SUPPORTED.  A reader that returns 0 must leave a
 * caller-owned `out` untouched. */
typedef int (*mock_reader)(const struct mock_config *cfg, unsigned pos, void *out);
nvmlReturn_t mock_read(nvmlDevice_t device, mock_reader read, void *out);

/* NVML's contract for caller-sized arrays: a NULL array or a zero *count
 * only asks for the size.  mock_list_room says how many entries the caller
 * has room for (0 for a size query); mock_list_result then stores the
 * total in *count and returns INSUFFICIENT_SIZE when it did not fit. */
unsigned mock_list_room(const void *array, const unsigned int *count);
nvmlReturn_t mock_list_result(const void *array, unsigned int *count, unsigned total);

/* NVML's answer for an enable-state output. */
static inline nvmlEnableState_t mock_enable_state(int on)
{
    return on ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
}
/* 1 with the parts of a PCI bus id in one of NVIDIA's spellings
 * (DDDDDDDD:BB:SS.F, DDDD:BB:SS.F, D:B:S with function 0, BB:SS.F with
 * domain 0; nothing may follow), else 0. */
int mock_parse_bus_id(const char *bus_id, unsigned *domain, unsigned *bus, unsigned *slot,
                      unsigned *function);
/* Position of the device whose NVML bus id matches (mock_parse_bus_id's
 * spellings); returns 1 when found. */
int mock_find_bus_id(const struct mock_config *cfg, const char *bus_id, unsigned *pos);

/* ----------------------------------------------------------- failure.c */

/* Reads every device's failure spec into a fresh engine snapshot. */
void mock_failure_prepare(struct mock_config *cfg);
/* Whether the device's guarded calls may fail in this process (lost,
 * fallen_off_bus): the one test a guarded call on a healthy device pays.
 * An ECC injection is node state and arms nothing. */
static inline int mock_failure_armed(const struct mock_config *cfg, unsigned pos)
{
    return cfg->failure[pos].mode == MOCK_FAILURE_LOST;
}
/* Applies the device's failure spec to one guarded call. */
nvmlReturn_t mock_failure_check(const struct mock_config *cfg, unsigned pos);
/* Uncorrectable (double-bit) errors in device memory one injection
 * (`ecc_uncorrectable`) adds to the board's counts. */
#define MOCK_ECC_INJECTED_ERRORS 1
/* 1 when the config injects an uncorrectable ECC error into the device,
 * and *id (optional), the injection's id, the same in every process. */
int mock_failure_ecc_injection(const struct mock_config *cfg, unsigned pos,
                               unsigned long long *id);
/* 1 when the device fell off the bus in this process under a spec that
 * raises its own Xid 79 (active at once, or tripped), and *spec, the spec's
 * id, which tells this fall from a later one. */
int mock_failure_fell_off(const struct mock_config *cfg, unsigned pos, unsigned long long *spec);
void mock_failure_cleanup(void);

/* ----------------------------------------------------------- memory.c */

/* One ECC counter; location is a profile name ("total", "device_memory",
 * "sram", "l1_cache", ...).  Returns 0 when the board has no ECC. */
int mock_ecc_count(const struct mock_config *cfg, unsigned pos, nvmlMemoryErrorType_t type,
                   nvmlEccCounterType_t counter, const char *location, unsigned long long *out);

/* The remapped rows of a device (nvmlDeviceGetRemappedRows and field
 * values 142-145): 0 when the board reports none (no
 * `remapped_rows.correctable`), out untouched. */
struct mock_remapped_rows {
    unsigned correctable, uncorrectable, pending, failure_occurred;
};
int mock_remapped_rows(const struct mock_config *cfg, unsigned pos,
                       struct mock_remapped_rows *out);

/* ----------------------------------------------------------- clocks.c */

/* The time (ns) a perf policy has held the clocks down, as
 * nvmlDeviceGetViolationStatus and field values 74-81 answer it (one meter
 * per device and policy); 0 for a policy the library does not know. */
int mock_violation_ns(const struct mock_config *cfg, unsigned pos, nvmlPerfPolicyType_t policy,
                      unsigned long long *ns);

/* -------------------------------------------------------------- pci.c */

/* nvmlPciInfo_t as NVIDIA's headers declared it before the 68-byte layout
 * (pciSubSystemId arrived in NVML 2.285, busIdLegacy/busId[32] with
 * nvmlDeviceGetPciInfo_v3): the record nvmlDeviceGetPciInfo and _v2 fill.
 * A caller built against those headers passes 52 bytes, so nothing past
 * them may be written; busId here holds what busIdLegacy holds now. */
typedef struct {
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    unsigned int reserved[4];
} mock_pci_info_v2_t;
_Static_assert(sizeof(mock_pci_info_v2_t) == 52, "the pre-v3 nvmlPciInfo_t is 52 bytes");
_Static_assert(offsetof(mock_pci_info_v2_t, domain) == offsetof(nvmlPciInfo_t, domain),
               "the pre-v3 record shares its leading fields with nvmlPciInfo_t");

nvmlGpuTopologyLevel_t mock_topology_level(const struct mock_config *cfg, unsigned a,
                                           unsigned b);
/* NVML's packed PCI id of a device: device id high, vendor id low
 * (0x233010DE); 0 parts for ids the profile lacks. */
unsigned mock_pci_device_id(const struct mock_config *cfg, unsigned pos);

/* ------------------------------------------------------------ meters.c */

/* Quantities a process integrates over time (see meters.c). */
enum mock_meter {
    MOCK_METER_NVLINK_KIB,        /* per link and direction */
    MOCK_METER_VIOLATION_POWER,   /* ns throttled, per nvmlPerfPolicyType_t */
    MOCK_METER_VIOLATION_THERMAL,
    MOCK_METER_VIOLATION_SYNC_BOOST,
    MOCK_METER_VIOLATION_BOARD_LIMIT,
    MOCK_METER_VIOLATION_LOW_UTILIZATION,
    MOCK_METER_VIOLATION_RELIABILITY,
    MOCK_METER_VIOLATION_TOTAL_APP_CLOCKS,
    MOCK_METER_VIOLATION_TOTAL_BASE_CLOCKS,
    MOCK_METER_COUNT
};
/* Adds rate x the time since the previous read (or since the library was
 * loaded) to the device's meter and returns its total; `at` (optional)
 * receives the instant on the meter's own clock the total is for
 * (mock_now_ns() for NVLink traffic, mock_call_clock() for the violation
 * meters). */
double mock_meter_read(enum mock_meter meter, unsigned pos, double rate_per_second,
                       unsigned long long *at);

/* ---------------------------------------------------------- workload.c */

/* Who holds the GPUs (the workload file beside the engine config), as an
 * immutable snapshot; NULL when no file (every GPU idle).  Release with
 * mock_release. */
struct mock_config *mock_workload_acquire(const struct mock_config *cfg);
/* The workload snapshot read over the socket (remote.c) becomes the one
 * in force for configs of directory `dir` (MOCK_REMOTE_DIR); NULL: idle.
 * Takes the caller's reference. */
void mock_workload_adopt(const char *dir, struct mock_config *wl);
/* Containers holding device `pos`, and the per-holder shares. */
unsigned mock_workload_holders(const struct mock_config *wl, unsigned pos);
/* The same for the readings' hot path: resolved once per workload file. */
struct mock_load {
    unsigned holders;
    double memory_share; /* of the memory, per holder */
    double utilization;  /* percent, per holder */
    unsigned generation; /* changes whenever the file in force does (this process only) */
};
void mock_workload_load(const struct mock_config *cfg, unsigned pos, struct mock_load *out);
double mock_workload_memory_share(const struct mock_config *wl);
double mock_workload_utilization(const struct mock_config *wl);
/* One holding container as a compute process. */
struct mock_process {
    unsigned pid;
    const char *name; /* points into the workload snapshot */
    unsigned long long used_bytes;
};
/* The i-th holder of device `pos` (0 when there is none). */
int mock_workload_process(const struct mock_config *cfg, const struct mock_config *wl,
                          unsigned pos, unsigned i, struct mock_process *out);
/* The holders of device `pos` as compute processes, without a lock:
 * calls sink(arg, i, pid, used_bytes) for each of the first `room` of them
 * (i = 0, 1, ...) and returns how many hold the device. */
typedef void (*mock_pid_sink)(void *arg, unsigned i, unsigned pid, unsigned long long used_bytes);
unsigned mock_workload_pids(const struct mock_config *cfg, unsigned pos, unsigned room,
                            mock_pid_sink sink, void *arg);
/* The name of a holder's PID on any device, NVML style (truncated). */
int mock_workload_process_name(const struct mock_config *cfg, unsigned pid, char *name,
                               unsigned length);

/* ---- patterns.c, board.c, idle_signature.c, dynamics.c, readings.c, energy.c */

struct mock_board;
void mock_board_free(struct mock_board *board);

/* The effective readings of one device at one instant. */
struct mock_readings {
    /* eight words, no padding: a busy board's call copies them (readings.c) */
    unsigned long long memory_used;
    long long tlimit_c;         /* T.Limit: the margin to the slowdown point */
    unsigned long long reasons; /* nvmlClocksEventReason* bits */
    unsigned long long pinned_reasons; /* the reasons an override set */
    int active;                /* 0: nothing moves, every reading is the profile's */
    unsigned util_gpu, util_memory;
    unsigned power_mw;
    int temperature_c;
    int has_tlimit;
    unsigned sm_clock_mhz;
    unsigned holders;
};
/* The clocks event reasons readings set (the others are the profile's). */
#define MOCK_READING_REASONS                                                          \
    (nvmlClocksEventReasonGpuIdle | nvmlClocksEventReasonSwPowerCap |                 \
     nvmlClocksThrottleReasonHwSlowdown | nvmlClocksEventReasonSwThermalSlowdown |    \
     nvmlClocksThrottleReasonHwThermalSlowdown)
/* Seconds since the epoch the readings are for: CLOCK_REALTIME_COARSE (one
 * kernel tick is the readings' quantum), shared by every process, or
 * MOCK_NVML_CLOCK_OVERRIDE (tests pin it). */
double mock_reading_time(void);
/* `t` for mock_readings_at: the current mock_reading_time(), read only when
 * the device is active. */
#define MOCK_READING_NOW (-1.0)
/* Whether the board model derives a device's readings now: a pattern, a
 * holder, or an override that loads the board (a pinned utilization above
 * 0, a draw pinned at or over the enforced limit); else they are the
 * profile's (readings.c). */
int mock_board_driven(const struct mock_board *b, const struct mock_load *load);
void mock_readings_at(const struct mock_config *cfg, unsigned pos, double t,
                      struct mock_readings *out);
/* A moving quantity's effective value, by its profile field name: 1 and
 * *out when `field` is one (utilization.gpu, power.current_draw_mw, ...)
 * and the device is active, else 0 (the caller reads the profile). */
int mock_reading_field(const struct mock_config *cfg, unsigned pos, const char *field,
                       long long *out);
/* The same for a key whose field moves (mock_key_moves). */
int mock_reading_key(const struct mock_config *cfg, unsigned pos, enum mock_key key,
                     long long *out);
/* Whether a key's field is a moving quantity (mock_reading_field knows it). */
int mock_key_moves(enum mock_key key);

/* Typed reads of a key, as mock_dev_u64 / mock_dev_uint / mock_dev_int read
 * its field: the value resolved at parse, or the reading when the field
 * moves.  `pos` is a device of the snapshot (the caller's mock_begin
 * checked it).  Inline: a field that does not move costs two loads. */
static inline int mock_key_u64(const struct mock_config *cfg, unsigned pos, enum mock_key key,
                               unsigned long long *out)
{
    const struct mock_value *v = mock_key_value(cfg, pos, key);
    long long reading;
    if (v->moves && mock_reading_key(cfg, pos, key, &reading))
        return mock_reading_u64(reading, out);
    if (v->has_u64)
        *out = v->u64;
    return v->has_u64;
}

static inline int mock_key_uint(const struct mock_config *cfg, unsigned pos, enum mock_key key,
                                unsigned *out)
{
    unsigned long long v = 0;
    int ok = mock_key_u64(cfg, pos, key, &v); /* before v is read */
    return mock_narrow_uint(ok, v, out);
}

static inline int mock_key_int(const struct mock_config *cfg, unsigned pos, enum mock_key key,
                               int *out)
{
    const struct mock_value *v = mock_key_value(cfg, pos, key);
    long long reading;
    if (v->moves && mock_reading_key(cfg, pos, key, &reading)) {
        *out = (int)reading; /* readings are small: temperatures */
        return 1;
    }
    return mock_narrow_int(v->has_i64, v->i64, out);
}

/* Utilization (percent) above which a board is busy: it runs in P0. */
#define MOCK_BUSY_UTILIZATION 5
/* The performance state now: P0 while the board is busy, else `idle` (the
 * profile's state, NVML_PSTATE_UNKNOWN when it has none); an override of
 * the state (`mokka ctl pstate`) wins. */
unsigned mock_reading_pstate(const struct mock_config *cfg, unsigned pos, unsigned idle);
/* The clocks event reasons active now: the profile's, with the ones
 * readings move as they move (unless an override set them). */
unsigned long long mock_reasons_now(const struct mock_config *cfg, unsigned pos);
/* Every reason the boards report (nvmlDeviceGetSupportedClocksEventReasons). */
unsigned long long mock_reasons_supported(void);
/* The total energy counter (mJ): 1 and *out, or 0 when the board reports
 * none.  Never decreases within a process (energy.c). */
int mock_energy_mj(const struct mock_config *cfg, unsigned pos, unsigned long long *out);

/* ----------------------------------------------------------- events.c */

void mock_events_cleanup(void);

/* ----------------------------------------------- nvlink.c, nvlink_counters.c */

/* Number of the device's links whose far end is an NVSwitch. */
unsigned mock_nvswitch_link_count(const struct mock_config *cfg, unsigned pos);
unsigned mock_link_count(const struct mock_config *cfg, unsigned pos);
/* KiB each link of the device has carried per direction (it grows with
 * `utilization.gpu`) as of *at (optional, mock_now_ns() time), and the
 * errors injected on one link. */
unsigned long long mock_nvlink_data_kib(const struct mock_config *cfg, unsigned pos,
                                        unsigned long long *at);
unsigned long long mock_nvlink_errors(const struct mock_config *cfg, unsigned pos, unsigned link);
/* One error counter of a link, as nvmlDeviceGetNvLinkErrorCounter answers it. */
unsigned long long mock_nvlink_error_count(const struct mock_config *cfg, unsigned pos,
                                           unsigned link, nvmlNvLinkErrorCounter_t counter);
/* Fills an NVLink field value (scopeId = link); 0 when `v` is no NVLink field. */
int mock_nvlink_field(const struct mock_config *cfg, unsigned pos, nvmlFieldValue_t *v);
/* A device's links as the engine config and the board's wiring make them,
 * resolved with its board once per config snapshot (board.c), so the
 * link getters a poller calls (state, capability, remote device type, the
 * link fields) format and look up no key. */
struct mock_nvlink {
    unsigned link_count;   /* mock_link_count */
    unsigned switch_links; /* mock_nvswitch_link_count */
    unsigned up_mask;      /* bit l: link l is up */
    unsigned char remote_type[NVML_NVLINK_MAX_LINKS]; /* nvmlIntNvLinkDeviceType_t */
    unsigned char has_bandwidth, has_version, c2c, nvlink5;
    unsigned long long bandwidth_mbps; /* nvlink.bandwidth_per_link_mbps */
    unsigned long long version;        /* nvlink.version */
};
_Static_assert(NVML_NVLINK_MAX_LINKS <= 32, "the up mask holds every link");
/* Resolves `links` (zeroed by the caller) from the engine config. */
void mock_nvlink_fill(const struct mock_config *cfg, unsigned pos, struct mock_nvlink *links);
/* The device's links as resolved for this snapshot; NULL only without
 * memory (the caller fills its own). */
const struct mock_nvlink *mock_board_nvlink(const struct mock_config *cfg, unsigned pos);
/* The device's links as resolved for this snapshot, or (no memory for its
 * board) as resolved into `own` now. */
const struct mock_nvlink *mock_nvlink_of(const struct mock_config *cfg, unsigned pos,
                                        struct mock_nvlink *own);

/* ----------------------------------------------------- nvlink_wiring.c */

/* PCI vendor id of NVIDIA (the low half of NVML's packed ids). */
#define NVIDIA_VENDOR 0x10deu

/* 1 with the switch index (*sw, the engine config's nvlink.switch.<i>) and
 * port a device's link lands on; 0 when it reaches none of the listed switches. */
int mock_nvlink_wired_switch(const struct mock_config *cfg, unsigned pos, unsigned link,
                             unsigned *sw, unsigned *port);
/* NVML's packed PCI id of the node's NVSwitches, from the engine config's
 * `nvlink.switch.<i>.pci_device_id`; 0 when absent. */
unsigned mock_nvswitch_pci_id(const struct mock_config *cfg, unsigned sw);
/* On a direct GPU mesh (no NVSwitch): 1 with the position of the GPU a
 * device's link reaches (*peer) and the link of it that it lands on; 0 for
 * any other link and for one the mesh leaves unwired. */
int mock_nvlink_wired_gpu(const struct mock_config *cfg, unsigned pos, unsigned link,
                          unsigned *peer, unsigned *peer_link);
/* How many NVLinks join GPUs `a` and `b` directly on a mesh; 0 on any other board. */
unsigned mock_nvlink_links_between(const struct mock_config *cfg, unsigned a, unsigned b);

/* ------------------------------------------------------------ fields.c */

/* Stores a field value's answer: NOT_SUPPORTED unless `found`; a 32-bit
 * answer past 32 bits is no answer either. */
void mock_field_uint(nvmlFieldValue_t *v, int found, unsigned long long value);
void mock_field_ull(nvmlFieldValue_t *v, int found, unsigned long long value);

/* ------------------------------------ mig_devices.c: MIG devices on the getters */

/* What a MIG device handle stands for, for the getters that answer a MIG
 * device as well as a full GPU (memory, utilization, processes, the index):
 * its GPU's position, its index under that GPU (the one
 * nvmlDeviceGetMigDeviceHandleByIndex takes), its GPU and compute instance
 * ids, their slices, and the GPU instance's memory slices (of 8) and bytes. */
struct mock_mig_info {
    unsigned pos, index, gi, ci;
    unsigned gi_slices, ci_slices, memory_slices;
    unsigned long long memory_bytes;
};
/* 1 when `device` is a MIG device handle, with *r NVML_SUCCESS and *out
 * while its compute instance exists, else *r the error (INVALID_ARGUMENT
 * once it is destroyed); 0 for any other handle, *r and *out untouched. */
int mock_mig_info(nvmlDevice_t device, struct mock_mig_info *out, nvmlReturn_t *r);
/* 1 when `uuid` is a MIG device's (`MIG-...`), with *r NVML_SUCCESS and
 * *device its handle, or NOT_FOUND when no MIG device of the node has it;
 * 0 for any other string: what nvmlDeviceGetHandleByUUID answers a MIG
 * device's UUID with. */
int mock_mig_by_uuid(const char *uuid, nvmlDevice_t *device, nvmlReturn_t *r);

/* ------------------------------------------------- a call's fast path */

static inline void mock_end(struct mock_call *call)
{
    mock_release(call->cfg);
    call->cfg = NULL;
}

static inline nvmlReturn_t mock_begin(struct mock_call *call, nvmlDevice_t device,
                                      enum mock_guard guard)
{
    call->cfg = mock_acquire();
    if (call->cfg == NULL)
        return NVML_ERROR_UNINITIALIZED;
    if (!mock_handle_pos(device, &call->pos) || call->pos >= call->cfg->device_count) {
        mock_end(call);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    /* a healthy device pays this one predictable branch */
    if (guard == MOCK_GUARDED && __builtin_expect(mock_failure_armed(call->cfg, call->pos), 0)) {
        nvmlReturn_t r = mock_failure_check(call->cfg, call->pos);
        if (r != NVML_SUCCESS) {
            mock_end(call);
            return r;
        }
    }
    return NVML_SUCCESS;
}

/* ------------- deprecation.c, affinity.c, encoder.c, pstates.c: driver branches,
 * the nearest CPU's NUMA node, encoder capacity, performance states */

/* The calls a driver branch removed (deprecation.c holds the table). */
enum mock_deprecated_call {
    MOCK_DEPRECATED_DISPLAY_MODE,
    MOCK_DEPRECATED_APPLICATIONS_CLOCK,
    MOCK_DEPRECATED_DEFAULT_APPLICATIONS_CLOCK,
    MOCK_DEPRECATED_POWER_STATE,
    MOCK_DEPRECATED_RESET_STATUS, /* field values NVML_FI_DEV_(DRAIN_AND_)RESET_STATUS */
    MOCK_DEPRECATED_NONE,         /* a call no branch removed */
    MOCK_DEPRECATED_COUNT = MOCK_DEPRECATED_NONE
};
/* The driver branch the config claims (580 for "580.105.08"); 0 when its
 * system.driver_version does not parse. */
unsigned mock_driver_branch(const struct mock_config *cfg);
/* 1 when that branch answers `call` with NVML_ERROR_DEPRECATED. */
int mock_deprecated(const struct mock_config *cfg, enum mock_deprecated_call call);
/* mock_begin for a call a branch may have removed: NVML_ERROR_DEPRECATED
 * (for any handle of ours, lost or not) when the claimed driver removed
 * `removed`, else mock_begin's answer for `guard`.  On success the caller
 * must call mock_end. */
nvmlReturn_t mock_begin_unless_deprecated(struct mock_call *call, nvmlDevice_t device,
                                          enum mock_guard guard,
                                          enum mock_deprecated_call removed);
/* mock_enable_field (guarded) for a call a branch may have removed (call.c). */
nvmlReturn_t mock_enable_field_removable(nvmlDevice_t device, enum mock_deprecated_call removed,
                                         const char *field, nvmlEnableState_t *out);
/* "P0".."P15" -> 0..15, NVML_PSTATE_UNKNOWN for anything else (power.c). */
nvmlPstates_t mock_parse_pstate(const char *value);
/* The NUMA nodes of the CPUs nearest a device (affinity.c), as a node mask
 * of `nodeSetSize` words: nvidia-smi's `topo -C` (export table slot 223). */
nvmlReturn_t mock_cpu_numa_affinity(nvmlDevice_t device, unsigned int nodeSetSize,
                                    unsigned long *nodeSet, nvmlAffinityScope_t scope);

/* ------------------------------------- idle signature, precomputed PCI */

/* The device's PCI record, every field of a whole current nvmlPciInfo_t
 * (pci.c); `pci` zeroed by the caller.  Run once per snapshot and device
 * (the board, board.c), so nvmlDeviceGetPciInfo* formats nothing. */
void mock_pci_fill(const struct mock_config *cfg, unsigned pos, nvmlPciInfo_t *pci);
/* The device's PCI record as resolved for this snapshot; NULL only
 * without memory (the caller fills its own). */
const nvmlPciInfo_t *mock_board_pci(const struct mock_config *cfg, unsigned pos);
/* The power draw (mW) of an idle device at time t (seconds since the
 * epoch) under the idle signature: 1 and *mw when the signature decides it
 * (on, the board idle, its draw not pinned), else 0 (the draw stands as
 * read).  A driver sample's value (samples.c). */
int mock_idle_power_at(const struct mock_config *cfg, unsigned pos, double t, unsigned *mw);

/* ------------------- the polling getters' figures, resolved once per snapshot */

/* Profile figures the polling getters and field values read that only the
 * config moves (or, for the signature's quantities, the idle signature):
 * each resolved with the device's board (board.c), so such a getter
 * looks up no key.  mock_figure_u64 answers exactly what mock_dev_u64
 * answers for the figure's field. */
enum mock_figure {
    MOCK_FIGURE_POWER_ENFORCED_LIMIT, /* power.enforced_limit_mw */
    MOCK_FIGURE_POWER_MIN_LIMIT,      /* power.min_limit_mw */
    MOCK_FIGURE_POWER_MAX_LIMIT,      /* power.max_limit_mw */
    MOCK_FIGURE_POWER_DEFAULT_LIMIT,  /* power.default_limit_mw */
    MOCK_FIGURE_MODULE_DRAW,          /* module_power.current_draw_mw */
    MOCK_FIGURE_MODULE_ENFORCED_LIMIT,
    MOCK_FIGURE_MODULE_MIN_LIMIT,
    MOCK_FIGURE_MODULE_MAX_LIMIT,
    MOCK_FIGURE_MODULE_DEFAULT_LIMIT,
    MOCK_FIGURE_MEMORY_TEMPERATURE,   /* thermal.temperature_memory_c: the signature moves it */
    MOCK_FIGURE_PCIE_TX,              /* pcie.tx_throughput_kbps: the signature moves it */
    MOCK_FIGURE_PCIE_RX,              /* pcie.rx_throughput_kbps: the signature moves it */
    MOCK_FIGURE_COUNT
};
int mock_figure_u64(const struct mock_config *cfg, unsigned pos, enum mock_figure figure,
                    unsigned long long *out);
/* A whole call answering one figure as an unsigned int, as mock_uint_field
 * answers its field (values.c). */
nvmlReturn_t mock_uint_figure(nvmlDevice_t device, enum mock_guard guard, enum mock_figure figure,
                              unsigned int *out);

/* Where an ECC counter counts (the profile's location names, lookup.c). */
enum mock_ecc_location {
    MOCK_ECC_TOTAL,
    MOCK_ECC_L1_CACHE,
    MOCK_ECC_L2_CACHE,
    MOCK_ECC_DEVICE_MEMORY,
    MOCK_ECC_REGISTER_FILE,
    MOCK_ECC_TEXTURE_MEMORY,
    MOCK_ECC_TEXTURE_SHM,
    MOCK_ECC_CBU,
    MOCK_ECC_SRAM,
    MOCK_ECC_LOCATION_COUNT
};
extern const char *const mock_ecc_location_names[MOCK_ECC_LOCATION_COUNT]
    __attribute__((visibility("hidden")));
/* Every ECC counter of a device as mock_ecc_count answers it, by
 * [counter type][error type][location]; `resolved` is 0 for a device whose
 * counters grow in this process (an `ecc_uncorrectable` failure), which
 * mock_ecc_counter then asks mock_ecc_count for. */
struct mock_ecc_counts {
    unsigned char resolved, has_ecc;
    unsigned long long count[NVML_ECC_COUNTER_TYPE_COUNT][NVML_MEMORY_ERROR_TYPE_COUNT]
                            [MOCK_ECC_LOCATION_COUNT];
};
void mock_ecc_fill(const struct mock_config *cfg, unsigned pos, struct mock_ecc_counts *ecc);
/* mock_ecc_count's answer from the counts resolved for this snapshot;
 * type and counter are valid (valid_ecc_args). */
int mock_ecc_counter(const struct mock_config *cfg, unsigned pos, nvmlMemoryErrorType_t type,
                     nvmlEccCounterType_t counter, enum mock_ecc_location where,
                     unsigned long long *out);
/* Tells snapshots apart however their memory is reused: the serial of the
 * first device's board (board.c); 0 without a device (or memory). */
unsigned long long mock_snapshot_serial(const struct mock_config *cfg);
/* mock_remapped_rows's answer as resolved for this snapshot. */
int mock_board_remapped_rows(const struct mock_config *cfg, unsigned pos,
                             struct mock_remapped_rows *out);

#endif
