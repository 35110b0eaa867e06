/*
 * Calls the driver a profile claims has removed: they answer
 * NVML_ERROR_DEPRECATED, as that driver's library does.
 *
 * NVIDIA deprecates an NVML call in one release and removes it in a later
 * one; from then on the function is still exported but "Removed functions
 * will return the NVML error code NVML_ERROR_DEPRECATED" (NVML API
 * reference, "Deprecation and/or Removal Notices").  Which driver branch
 * removed which call is one table here, so every getter asks the same
 * question (mock_deprecated) and a new branch is one row.
 *
 * The branch is the major number of the engine config's
 * `system.driver_version` (the profile's `system.driver_version`):
 * "580.105.08" is branch 580.  A version that does not parse removes
 * nothing (the calls answer as before).
 *
 * Sources of the rows:
 *   - display mode, 580: the `nvidia-smi -q -x` captures of 580.105.08
 *     (H100, B200) and 580.173.02 (GB200) print "Requested functionality
 *     has been deprecated" for display_mode, while 570.148.08 (A100) still
 *     answers (tests/data/nvidia-smi/).  Display *active* still answers on
 *     580 in the same captures (and in public 580 outputs: "Display
 *     Active : Enabled" beside the deprecated mode), so it has no row.
 *   - applications clocks, default applications clocks and the power
 *     state, 595: deprecated in CUDA 13.0 (the 580 drivers; nvml.h 13.0
 *     marks them DEPRECATED(13.0), "will be removed in CUDA 14.0"), still
 *     answering on 580 (the captures above print their values), and
 *     answering NVML_ERROR_DEPRECATED on the 595 boards (L40S, T4 on
 *     595.91.07, measured with nvidia-smi 535).
 *   - GPU reset status (field values NVML_FI_DEV_RESET_STATUS and
 *     NVML_FI_DEV_DRAIN_AND_RESET_STATUS), 570: nvml.h marks both
 *     "Deprecated, do not use (use NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
 *     instead)", and the 570.148.08 capture (A100) prints "Requested
 *     functionality has been deprecated" for both.
 */
#include <stdlib.h>

#include "mock.h"

/* The first driver branch that answers NVML_ERROR_DEPRECATED, per call. */
static const unsigned REMOVED_IN[MOCK_DEPRECATED_COUNT] = {
    [MOCK_DEPRECATED_DISPLAY_MODE] = 580,
    [MOCK_DEPRECATED_APPLICATIONS_CLOCK] = 595,
    [MOCK_DEPRECATED_DEFAULT_APPLICATIONS_CLOCK] = 595,
    [MOCK_DEPRECATED_POWER_STATE] = 595,
    [MOCK_DEPRECATED_RESET_STATUS] = 570,
};

unsigned mock_driver_branch(const struct mock_config *cfg)
{
    const char *version = mock_cfg_get(cfg, "system.driver_version");
    if (version == NULL)
        return 0;
    char *end;
    unsigned long branch = strtoul(version, &end, 10);
    /* "580.105.08" and a bare "580" are versions; anything else is none */
    if (end == version || (*end != '.' && *end != '\0') || branch > 0xffffu)
        return 0;
    return (unsigned)branch;
}

int mock_deprecated(const struct mock_config *cfg, enum mock_deprecated_call call)
{
    if ((unsigned)call >= MOCK_DEPRECATED_COUNT)
        return 0;
    unsigned branch = mock_driver_branch(cfg);
    return branch != 0 && branch >= REMOVED_IN[call];
}

nvmlReturn_t mock_begin_unless_deprecated(struct mock_call *call, nvmlDevice_t device,
                                          enum mock_guard guard,
                                          enum mock_deprecated_call removed)
{
    /* A removed function asks the GPU nothing: any handle of ours, lost or
     * not, gets NVML_ERROR_DEPRECATED; so the handle is checked first, the
     * GPU's health only for a call the driver still has. */
    nvmlReturn_t r = mock_begin(call, device, MOCK_IDENTITY);
    if (r != NVML_SUCCESS)
        return r;
    if (mock_deprecated(call->cfg, removed)) {
        mock_end(call);
        return NVML_ERROR_DEPRECATED;
    }
    if (guard == MOCK_GUARDED && mock_failure_armed(call->cfg, call->pos)) {
        r = mock_failure_check(call->cfg, call->pos);
        if (r != NVML_SUCCESS)
            mock_end(call);
    }
    return r;
}
