/*
 * The guard-page harness of the mock NVML library: the fixed runtime
 * (tests/nvml_guard_harness.c) and the calls generated from nvml.h by
 * tests/nvml_guard_support.py share this interface.
 *
 * Every output buffer a generated call passes is placed flush against a
 * PROT_NONE page, sized exactly as its entry point's struct version, so a
 * write one byte too far (or, on the other side, one byte too early)
 * faults at once, under any memory checker or none.
 */
#ifndef NVML_GUARD_HARNESS_H
#define NVML_GUARD_HARNESS_H

#include <stddef.h>

#include "nvml.h"

/* What the generated calls run against: one device of one config. */
struct guard_ctx {
    nvmlDevice_t dev;  /* the device under test (NULL before nvmlInit) */
    nvmlDevice_t peer; /* a second device, for two-device queries */
    nvmlEventSet_t set;
    const char *uuid, *serial, *bus_id; /* the device's own, for lookups */
    nvmlGpmSample_t gpm[2];             /* two samples taken in order (NULL without GPM) */
    unsigned index;
};

/* A zeroed buffer of `size` bytes against a PROT_NONE page (which side:
 * see guard_set_side).  Size 0 gives an address on the guard page itself. */
void *guard_buf(size_t size);
/* Unmaps every buffer handed out since the last release. */
void guard_release(void);
/* Names the call about to run, for the fault report, and counts it. */
void guard_call(const char *name, unsigned variant);

/* One generated sweep per implemented function. */
struct guard_sweep {
    const char *name;
    void (*run)(const struct guard_ctx *x);
};
extern const struct guard_sweep GUARD_SWEEPS[];
extern const size_t GUARD_SWEEP_COUNT;
/* Implemented functions the runtime calls itself (init, shutdown, event
 * set life cycle): covered, but not by a generated sweep. */
extern const char *const GUARD_FRAME[];
extern const size_t GUARD_FRAME_COUNT;

#endif
