/*
 * nvmlDeviceGetFieldValues: NVML's generic telemetry query.
 *
 * The call itself succeeds and each entry carries its own nvmlReturn.
 * nvidia-smi 535 depends on that: `-q` reads every power limit through
 * fields 187-192 (scope 0 = GPU, 1 = module) and prints whatever the
 * entry holds, so an entry must never be left unwritten.  NVLink fields
 * (link state 165 for `nvlink -s`, throughput 138-141, field 147 for
 * `topo -m`'s NV<n>, ...) are nvlink_counters.c's: their scope is a link.  A field
 * that has a getter of its own (violation time, remapped rows, total
 * energy, ...) reads what that getter reads, so the two always agree.
 *
 * A polling loop calls it every few seconds per GPU, so an entry looks up
 * no key: power limits, the memory temperature, ECC counters and remapped
 * rows are resolved once per config snapshot (mock.h's figures).  Every
 * entry is stamped with the call's clock (CLOCK_REALTIME_COARSE as the
 * call began, in microseconds): the instant the readings are derived for
 * (readings.c), read once per call instead of a precise clock read that
 * would cost more than the rest of the call.
 */
#include <string.h>

#include "mock.h"

/* A 32-bit answer; a value past 32 bits is no answer (NOT_SUPPORTED), as
 * the getter of the same quantity says, rather than its low bits. */
void mock_field_uint(nvmlFieldValue_t *v, int found, unsigned long long value)
{
    found = found && value <= 0xffffffffULL;
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
    v->value.uiVal = found ? (unsigned)value : 0;
    v->nvmlReturn = found ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

void mock_field_ull(nvmlFieldValue_t *v, int found, unsigned long long value)
{
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    v->value.ullVal = value;
    v->nvmlReturn = found ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

/* One ECC counter field: which error type, counter and location. */
static int ecc_field(unsigned field, nvmlEccCounterType_t *counter, nvmlMemoryErrorType_t *type,
                     enum mock_ecc_location *where)
{
    static const enum mock_ecc_location locations[] = {
        MOCK_ECC_L1_CACHE, MOCK_ECC_L2_CACHE, MOCK_ECC_DEVICE_MEMORY, MOCK_ECC_REGISTER_FILE,
        MOCK_ECC_TEXTURE_MEMORY};
    const nvmlMemoryErrorType_t sbe = NVML_MEMORY_ERROR_TYPE_CORRECTED;
    const nvmlMemoryErrorType_t dbe = NVML_MEMORY_ERROR_TYPE_UNCORRECTED;
    if (field >= NVML_FI_DEV_ECC_SBE_VOL_TOTAL && field <= NVML_FI_DEV_ECC_DBE_AGG_TOTAL) {
        unsigned i = field - NVML_FI_DEV_ECC_SBE_VOL_TOTAL; /* SBE vol, DBE vol, SBE agg, DBE agg */
        *type = i % 2 ? dbe : sbe;
        *counter = i < 2 ? NVML_VOLATILE_ECC : NVML_AGGREGATE_ECC;
        *where = MOCK_ECC_TOTAL;
        return 1;
    }
    /* 7..16 volatile and 18..27 aggregate: SBE/DBE pairs per location. */
    static const struct {
        unsigned first, last;
        nvmlEccCounterType_t counter;
    } ranges[] = {
        {NVML_FI_DEV_ECC_SBE_VOL_L1, NVML_FI_DEV_ECC_DBE_VOL_TEX, NVML_VOLATILE_ECC},
        {NVML_FI_DEV_ECC_SBE_AGG_L1, NVML_FI_DEV_ECC_DBE_AGG_TEX, NVML_AGGREGATE_ECC},
    };
    for (size_t r = 0; r < MOCK_COUNT(ranges); r++) {
        if (field < ranges[r].first || field > ranges[r].last)
            continue;
        unsigned i = field - ranges[r].first;
        *type = i % 2 ? dbe : sbe;
        *counter = ranges[r].counter;
        *where = locations[i / 2];
        return 1;
    }
    return 0;
}

/* Power fields in mW: 1 with the figure scope 0 (the GPU: `power.*`) and
 * scope 1 (the module, GB200's superchip: the same names under
 * `module_power.*`) read.  The GPU's draw moves: *gpu is MOCK_FIGURE_COUNT
 * for it, read by its key instead. */
static int power_field(unsigned field, enum mock_figure *gpu, enum mock_figure *module)
{
    switch (field) {
    case NVML_FI_DEV_POWER_AVERAGE:
    case NVML_FI_DEV_POWER_INSTANT:
        *gpu = MOCK_FIGURE_COUNT;
        *module = MOCK_FIGURE_MODULE_DRAW;
        return 1;
    case NVML_FI_DEV_POWER_MIN_LIMIT:
        *gpu = MOCK_FIGURE_POWER_MIN_LIMIT;
        *module = MOCK_FIGURE_MODULE_MIN_LIMIT;
        return 1;
    case NVML_FI_DEV_POWER_MAX_LIMIT:
        *gpu = MOCK_FIGURE_POWER_MAX_LIMIT;
        *module = MOCK_FIGURE_MODULE_MAX_LIMIT;
        return 1;
    case NVML_FI_DEV_POWER_DEFAULT_LIMIT:
        *gpu = MOCK_FIGURE_POWER_DEFAULT_LIMIT;
        *module = MOCK_FIGURE_MODULE_DEFAULT_LIMIT;
        return 1;
    case NVML_FI_DEV_POWER_CURRENT_LIMIT:
    case NVML_FI_DEV_POWER_REQUESTED_LIMIT:
        *gpu = MOCK_FIGURE_POWER_ENFORCED_LIMIT;
        *module = MOCK_FIGURE_MODULE_ENFORCED_LIMIT;
        return 1;
    default: return 0;
    }
}

/* The perf policy counters 74-81 by field id: the policy whose violation
 * time (ns) each reports, as nvmlDeviceGetViolationStatus does (the same
 * meter, on the call's clock: an entry's value is for its timestamp).  Not
 * in enum order: 80 and 81 are the totals (policies 10 and 11). */
static int perf_policy_field(unsigned field, nvmlPerfPolicyType_t *policy)
{
    static const struct {
        unsigned field;
        nvmlPerfPolicyType_t policy;
    } map[] = {
        {NVML_FI_DEV_PERF_POLICY_POWER, NVML_PERF_POLICY_POWER},
        {NVML_FI_DEV_PERF_POLICY_THERMAL, NVML_PERF_POLICY_THERMAL},
        {NVML_FI_DEV_PERF_POLICY_SYNC_BOOST, NVML_PERF_POLICY_SYNC_BOOST},
        {NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT, NVML_PERF_POLICY_BOARD_LIMIT},
        {NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION, NVML_PERF_POLICY_LOW_UTILIZATION},
        {NVML_FI_DEV_PERF_POLICY_RELIABILITY, NVML_PERF_POLICY_RELIABILITY},
        {NVML_FI_DEV_PERF_POLICY_TOTAL_APP_CLOCKS, NVML_PERF_POLICY_TOTAL_APP_CLOCKS},
        {NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS, NVML_PERF_POLICY_TOTAL_BASE_CLOCKS},
    };
    for (size_t i = 0; i < MOCK_COUNT(map); i++) {
        if (map[i].field == field) {
            *policy = map[i].policy;
            return 1;
        }
    }
    return 0;
}

/* The remapped rows fields 142-145: nvmlDeviceGetRemappedRows's four
 * answers, each an unsigned int. */
static int remapped_rows_field(const struct mock_config *cfg, unsigned pos, nvmlFieldValue_t *v)
{
    struct mock_remapped_rows rows;
    unsigned value = 0;
    int found;
    switch (v->fieldId) {
    case NVML_FI_DEV_REMAPPED_COR:
    case NVML_FI_DEV_REMAPPED_UNC:
    case NVML_FI_DEV_REMAPPED_PENDING:
    case NVML_FI_DEV_REMAPPED_FAILURE: break;
    default: return 0;
    }
    found = mock_board_remapped_rows(cfg, pos, &rows);
    if (found) {
        value = v->fieldId == NVML_FI_DEV_REMAPPED_COR       ? rows.correctable
                : v->fieldId == NVML_FI_DEV_REMAPPED_UNC     ? rows.uncorrectable
                : v->fieldId == NVML_FI_DEV_REMAPPED_PENDING ? rows.pending
                                                             : rows.failure_occurred;
    }
    mock_field_uint(v, found, value);
    return 1;
}

static void fill_field(const struct mock_config *cfg, unsigned pos, nvmlFieldValue_t *v)
{
    unsigned long long n = 0;
    unsigned u = 0;
    int found, on = 0;
    nvmlEccCounterType_t counter;
    nvmlMemoryErrorType_t type;
    enum mock_ecc_location where;
    enum mock_figure gpu, module;

    v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
    v->value.ullVal = 0;

    if (power_field(v->fieldId, &gpu, &module)) {
        if (v->scopeId == NVML_POWER_SCOPE_GPU)
            found = gpu == MOCK_FIGURE_COUNT ? mock_key_u64(cfg, pos, MOCK_KEY_POWER_DRAW, &n)
                                             : mock_figure_u64(cfg, pos, gpu, &n);
        else
            found = v->scopeId == NVML_POWER_SCOPE_MODULE && mock_figure_u64(cfg, pos, module, &n);
        mock_field_uint(v, found, n);
        return;
    }
    if (ecc_field(v->fieldId, &counter, &type, &where)) {
        found = mock_ecc_counter(cfg, pos, type, counter, where, &n);
        mock_field_ull(v, found, n);
        return;
    }
    nvmlPerfPolicyType_t policy;
    if (perf_policy_field(v->fieldId, &policy)) {
        found = mock_violation_ns(cfg, pos, policy, &n);
        mock_field_ull(v, found, n);
        return;
    }
    if (remapped_rows_field(cfg, pos, v))
        return;
    switch (v->fieldId) {
    case NVML_FI_DEV_ECC_CURRENT:
    case NVML_FI_DEV_ECC_PENDING:
        found = mock_dev_bool(cfg, pos,
                              v->fieldId == NVML_FI_DEV_ECC_CURRENT ? "ecc.mode_current"
                                                                     : "ecc.mode_pending",
                              &on);
        mock_field_uint(v, found, (unsigned)on);
        break;
    case NVML_FI_DEV_MEMORY_TEMP:
        found = mock_figure_u64(cfg, pos, MOCK_FIGURE_MEMORY_TEMPERATURE, &n);
        mock_field_uint(v, found, n);
        break;
    case NVML_FI_DEV_PCIE_REPLAY_COUNTER:
        found = mock_dev_uint(cfg, pos, "pcie.replay_counter", &u);
        mock_field_uint(v, found, u);
        break;
    case NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER:
        mock_field_uint(v, 1, 0);
        break;
    case NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
    case NVML_FI_DEV_ENERGY:
        /* the same counter as nvmlDeviceGetTotalEnergyConsumption (191 by GPU scope) */
        found = (v->fieldId != NVML_FI_DEV_ENERGY || v->scopeId == 0) &&
                mock_energy_mj(cfg, pos, &n);
        mock_field_ull(v, found, n);
        break;
    case NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT:
    case NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT:
    case NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT:
    case NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT: {
        /* T.Limit thresholds, in the order of fields 193..196 and with the
         * names `nvidia-smi -q -x` gives them (profile `thermal` block). */
        static const char *const names[] = {
            "thermal.max_tlimit_threshold_c", "thermal.slow_tlimit_threshold_c",
            "thermal.max_mem_tlimit_threshold_c", "thermal.max_gpu_tlimit_threshold_c"};
        int t = 0;
        found = mock_dev_int(cfg, pos, names[v->fieldId - NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT],
                             &t);
        v->valueType = NVML_VALUE_TYPE_SIGNED_INT;
        v->value.siVal = t;
        v->nvmlReturn = found ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
        break;
    }
    case NVML_FI_DEV_RESET_STATUS:
    case NVML_FI_DEV_DRAIN_AND_RESET_STATUS:
        /* no reset or drain needed; the 570 drivers removed both fields for
         * the recovery action below (deprecation.c) */
        mock_field_uint(v, 1, 0);
        if (mock_deprecated(cfg, MOCK_DEPRECATED_RESET_STATUS))
            v->nvmlReturn = NVML_ERROR_DEPRECATED;
        break;
    case NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
        mock_field_uint(v, 1, 0); /* NVML_GPU_RECOVERY_ACTION_NONE */
        break;
    default:
        /* last: the NVLink fields' lookup of the board's links is no other
         * field's cost */
        if (!mock_nvlink_field(cfg, pos, v))
            mock_debug("field value %u (scope %u): not supported by the mock", v->fieldId,
                       v->scopeId);
        break; /* NOT_SUPPORTED, already set */
    }
}

MOCK_API nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                               nvmlFieldValue_t *values)
{
    if (values == NULL || valuesCount < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c = {0}; /* read only after a successful mock_begin */
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    long long stamp = (long long)(mock_call_clock() / 1000ULL);
    for (int i = 0; i < valuesCount; i++) {
        values[i].timestamp = stamp;
        values[i].latencyUsec = 0;
        if (r != NVML_SUCCESS) {
            /* Every entry says why, even when the whole call fails. */
            values[i].valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            values[i].value.ullVal = 0;
            values[i].nvmlReturn = r;
            continue;
        }
        fill_field(c.cfg, c.pos, &values[i]);
    }
    if (r == NVML_SUCCESS)
        mock_end(&c);
    return r;
}
