/*
 * Shared pieces of the mock NVML fuzz driver (tests/nvml_fuzz_driver.c,
 * the per-device sweep in tests/nvml_fuzz_device.c).
 */
#ifndef NVML_FUZZ_DRIVER_H
#define NVML_FUZZ_DRIVER_H

#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <stddef.h>

#include "nvml.h"

/* Longest list the driver will allocate for: no simulated GPU has more
 * processes, retired pages or clocks than this, and a larger count is
 * itself a violation (a client would allocate that much). */
#define LIST_LIMIT 65536
/* Most Xid events one drain may deliver before it counts as endless. */
#define EVENT_LIMIT 4096

/* The visible devices' handles, by index (the library has at most 64). */
extern nvmlDevice_t g_handles[64];

/* Prints one "violation ..." line: an answer that breaks NVML's contract. */
void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Counts a call and checks its return code is one NVIDIA's header defines. */
nvmlReturn_t rc(const char *what, nvmlReturn_t r);
#define CALL(call) rc(#call, (call))
/* 1 and *index when `handle` is one of the first `count` visible handles. */
int handle_index(nvmlDevice_t handle, unsigned count, unsigned *index);

typedef nvmlReturn_t (*uint_getter)(nvmlDevice_t, unsigned int *);

/* The per-device sweep (nvml_fuzz_device.c). */
void check_strings(nvmlDevice_t dev);
void check_scalars(nvmlDevice_t dev);
void check_memory(nvmlDevice_t dev);
/* Also collects the pids of the device's compute processes (at most 64). */
void check_lists(nvmlDevice_t dev, unsigned *pids, unsigned *npids);
void check_pci(nvmlDevice_t dev, unsigned count);
void check_nvlink(nvmlDevice_t dev);
/* Samples, process utilization, violations, thermal settings, GPM. */
void check_telemetry(nvmlDevice_t dev);

#endif
