/*
 * Power: the draw, its limits and management mode, the total energy
 * counter, and the performance and power states (which follow the load).
 *
 * Every value is a profile field (after overrides), so `mokka ctl power`
 * and `pstate` change what running processes read within a second; a
 * moving one (the draw, the state of a busy board) is the reading that
 * readings.c serves.  A field the profile leaves out reads as
 * NOT_SUPPORTED, which nvidia-smi prints as N/A.  Apart from thermal.c,
 * clocks.c and utilization.c: each is a group of getters a monitoring
 * agent polls, with no state or helper shared between them.
 */
#include "mock.h"

/* ------------------------------------------------------------------- power */

MOCK_API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    return mock_uint_key(device, MOCK_GUARDED, MOCK_KEY_POWER_DRAW, power);
}

MOCK_API nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    return mock_uint_figure(device, MOCK_GUARDED, MOCK_FIGURE_POWER_ENFORCED_LIMIT, limit);
}

MOCK_API nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    return mock_uint_figure(device, MOCK_GUARDED, MOCK_FIGURE_POWER_ENFORCED_LIMIT, limit);
}

MOCK_API nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device,
                                                               unsigned int *defaultLimit)
{
    return mock_uint_figure(device, MOCK_GUARDED, MOCK_FIGURE_POWER_DEFAULT_LIMIT, defaultLimit);
}

MOCK_API nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device,
                                                                   unsigned int *minLimit,
                                                                   unsigned int *maxLimit)
{
    if (minLimit == NULL || maxLimit == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    if (!mock_dev_uint(c.cfg, c.pos, "power.min_limit_mw", minLimit) ||
        !mock_dev_uint(c.cfg, c.pos, "power.max_limit_mw", maxLimit))
        r = NVML_ERROR_NOT_SUPPORTED;
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetPowerManagementMode(nvmlDevice_t device,
                                                       nvmlEnableState_t *mode)
{
    if (mode == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    int on = 1;
    if (!mock_dev_bool(c.cfg, c.pos, "power.management_mode", &on))
        mock_dev_bool(c.cfg, c.pos, "power.management_supported", &on);
    *mode = mock_enable_state(on);
    mock_end(&c);
    return r;
}

static int read_energy(const struct mock_config *cfg, unsigned pos, void *out)
{
    return mock_energy_mj(cfg, pos, out);
}

/* The integral of the power draw (energy.c). */
MOCK_API nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device,
                                                          unsigned long long *energy)
{
    if (energy == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return mock_read(device, read_energy, energy);
}

nvmlPstates_t mock_parse_pstate(const char *value)
{
    unsigned long long n;
    if (value != NULL && (value[0] == 'P' || value[0] == 'p') && mock_parse_u64(value + 1, &n) &&
        n <= 15)
        return (nvmlPstates_t)n;
    return NVML_PSTATE_UNKNOWN;
}

/* The profile's state is the idle board's; a busy one runs in P0
 * (mock_reading_pstate).  `key` is the getter's state, MOCK_KEY_PERFORMANCE_STATE
 * or MOCK_KEY_POWER_STATE. */
static nvmlReturn_t pstate(nvmlDevice_t device, enum mock_key key, nvmlPstates_t *out)
{
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    /* the power state getter is removed in the 595 drivers (deprecation.c) */
    nvmlReturn_t r = key == MOCK_KEY_POWER_STATE
                         ? mock_begin_unless_deprecated(&c, device, MOCK_GUARDED,
                                                        MOCK_DEPRECATED_POWER_STATE)
                         : mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    /* The two getters name one state: a performance state an override set
     * alone (`mokka ctl set performance_state=P3`) is the power state too. */
    if (key == MOCK_KEY_POWER_STATE &&
        mock_key_value(c.cfg, c.pos, MOCK_KEY_PINNED_POWER_STATE)->text == NULL &&
        mock_key_value(c.cfg, c.pos, MOCK_KEY_PINNED_PERFORMANCE_STATE)->text != NULL)
        key = MOCK_KEY_PERFORMANCE_STATE;
    const char *value = mock_key_value(c.cfg, c.pos, key)->text;
    if (value == NULL)
        value = mock_key_value(c.cfg, c.pos, MOCK_KEY_PERFORMANCE_STATE)->text;
    *out = (nvmlPstates_t)mock_reading_pstate(c.cfg, c.pos, mock_parse_pstate(value));
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, nvmlPstates_t *pState)
{
    return pstate(device, MOCK_KEY_PERFORMANCE_STATE, pState);
}

MOCK_API nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t device, nvmlPstates_t *pState)
{
    return pstate(device, MOCK_KEY_POWER_STATE, pState);
}
