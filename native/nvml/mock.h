/*
 * Internal interfaces of the mock NVML library.
 *
 * The library answers NVML calls from one engine config file that the node
 * daemon compiles (docs/engine-config.md).  The pieces:
 *
 *   config.c      parse the engine config into an immutable snapshot
 *   library.c     init/shutdown reference count, the current snapshot,
 *                 change detection and re-reading, error strings
 *   call.c        one call on a device (begin/end) and the typed getters
 *                 built on it, so each NVML getter names only its field
 *   devices.c     device handles, visibility, identity and modes
 *   failure.c     per-process failure injection (lost GPUs, ECC storms)
 *   pci.c         PCI identity, link state, topology and affinity
 *   memory.c      frame buffer, BAR1, ECC, retired pages, processes
 *   power.c       power, temperature, fans, clocks, utilization
 *   nvlink.c      NVLink state, fabric info, addressing mode
 *   fields.c      nvmlDeviceGetFieldValues
 *   events.c      event sets and Xid delivery
 *   export_table.c  nvmlInternalGetExportTable for nvidia-smi
 *   system.c      system-level queries (versions, process names, units)
 *   stubs.c       generated: every other function NVIDIA's header declares
 *
 * Snapshots are immutable and reference counted, so a call works on one
 * consistent config even while another thread swaps in a newer one.
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

/* ------------------------------------------------------------ config.c */

struct mock_entry {
    const char *key;   /* points into mock_config.text */
    const char *value; /* unquoted, NUL-terminated */
};

struct mock_config {
    int refs;                    /* atomic; the library's current pointer holds one */
    char *text;                  /* owned copy of the file, split in place */
    struct mock_entry *entries;  /* sorted by key, unique keys */
    size_t count;
    char dir[4096];              /* directory of the config file (for relative paths) */
    unsigned device_count;
    /* Devices this process may see (see devices.c, visibility). */
    unsigned visible_count;
    unsigned visible[MOCK_MAX_DEVICES];  /* ordinal -> position */
    int ordinal[MOCK_MAX_DEVICES];       /* position -> ordinal, -1 if hidden */
};

/* Parses `len` bytes of config text.  On error returns NULL and writes a
 * one-line reason into err. */
struct mock_config *mock_config_parse(const char *text, size_t len, const char *dir,
                                      char *err, size_t errlen);
void mock_config_free(struct mock_config *cfg);

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

/* ----------------------------------------------------------- library.c */

struct mock_config *mock_acquire(void);  /* NULL when not initialized */
void mock_release(struct mock_config *cfg);
/* NVML_SUCCESS when initialized, else UNINITIALIZED: for calls that answer
 * a constant but must still fail before nvmlInit, as NVIDIA's do. */
nvmlReturn_t mock_require_init(void);
void mock_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Monotonic clock in nanoseconds. */
unsigned long long mock_now_ns(void);

/* ----------------------------------------------------------- devices.c */

struct nvmlDevice_st {
    unsigned char unused; /* handles are addresses in a static table */
};

nvmlDevice_t mock_handle(unsigned pos);
int mock_handle_pos(nvmlDevice_t device, unsigned *pos);
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

/* -------------------------------------------------------------- call.c */

/* Starts a device call: checks init, validates the handle, applies failure
 * injection.  On success the caller must call mock_end. */
nvmlReturn_t mock_begin(struct mock_call *call, nvmlDevice_t device, enum mock_guard guard);
void mock_end(struct mock_call *call);

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
/* Position of the device whose NVML bus id matches (any case, 4- or
 * 8-digit domain); returns 1 when found. */
int mock_find_bus_id(const struct mock_config *cfg, const char *bus_id, unsigned *pos);

/* ----------------------------------------------------------- failure.c */

/* Applies the device's failure spec to one guarded call. */
nvmlReturn_t mock_failure_check(const struct mock_config *cfg, unsigned pos);
/* Extra uncorrectable ECC errors accumulated by `ecc_uncorrectable`. */
unsigned long long mock_failure_ecc_extra(unsigned pos);
void mock_failure_cleanup(void);

/* ----------------------------------------------------------- memory.c */

/* One ECC counter; location is a profile name ("total", "device_memory",
 * "sram", "l1_cache", ...).  Returns 0 when the board has no ECC. */
int mock_ecc_count(const struct mock_config *cfg, unsigned pos, nvmlMemoryErrorType_t type,
                   nvmlEccCounterType_t counter, const char *location, unsigned long long *out);

/* -------------------------------------------------------------- pci.c */

nvmlGpuTopologyLevel_t mock_topology_level(const struct mock_config *cfg, unsigned a,
                                           unsigned b);
/* NVML's packed PCI id of a device: device id high, vendor id low
 * (0x233010DE); 0 parts for ids the profile lacks. */
unsigned mock_pci_device_id(const struct mock_config *cfg, unsigned pos);

/* ----------------------------------------------------------- events.c */

void mock_events_cleanup(void);

/* ----------------------------------------------------------- nvlink.c */

/* Number of the device's links whose far end is an NVSwitch. */
unsigned mock_nvswitch_link_count(const struct mock_config *cfg, unsigned pos);
unsigned mock_link_count(const struct mock_config *cfg, unsigned pos);

#endif
