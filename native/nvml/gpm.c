/*
 * GPU Performance Monitoring (GPM): the per-SM and per-engine metrics DCGM
 * and other profilers read on Hopper and later.
 *
 * A GPM sample records the board's state at one moment; nvmlGpmMetricsGet
 * turns two samples into rates and percentages over the time between
 * them.  The simulated board's activity is its utilization: SM and
 * graphics activity follow `utilization.gpu`, DRAM bandwidth
 * `utilization.memory`, the media engines theirs, and NVLink traffic the
 * link meters (nvlink.c), each averaged over the two samples.  The split
 * of SM time into pipes (tensor, FP64, FP32...) is the profile's `gpm.*`
 * percentages of SM activity; without them the board is doing no math of
 * that kind, which is what an idle real board reports.
 */
#include <stdlib.h>
#include <string.h>

#include "mock.h"

/* Marks a live sample, so a freed or foreign pointer is refused. */
#define SAMPLE_MAGIC 0x47504d53u /* "GPMS" */

/* Quantities a sample records, averaged between two samples. */
enum gauge {
    GAUGE_GPU,
    GAUGE_MEMORY,
    GAUGE_DECODER,
    GAUGE_JPEG,
    GAUGE_OFA,
    GAUGE_PCIE_TX_KBPS,
    GAUGE_PCIE_RX_KBPS,
    GAUGE_COUNT
};

static const char *const GAUGE_FIELDS[GAUGE_COUNT] = {
    "utilization.gpu",   "utilization.memory",    "utilization.decoder", "utilization.jpeg",
    "utilization.ofa",   "pcie.tx_throughput_kbps", "pcie.rx_throughput_kbps",
};

struct nvmlGpmSample_st {
    unsigned magic;
    int taken;                 /* filled by nvmlGpmSampleGet */
    unsigned pos;              /* the device sampled */
    unsigned long long ns;     /* when */
    unsigned long long nvlink_kib; /* per link and direction, the meter's total */
    unsigned links;
    double gauges[GAUGE_COUNT];
    /* the profile's split of SM activity, percent of it */
    double tensor, dfma, hmma, imma, fp64, fp32, fp16, integer, occupancy;
};

/* GPM is a Hopper-and-later feature; a profile may say otherwise. */
static int gpm_supported(const struct mock_config *cfg, unsigned pos)
{
    int on;
    if (mock_dev_bool(cfg, pos, "gpm.supported", &on))
        return on;
    return mock_dev_is(cfg, pos, "architecture", "hopper") ||
           mock_dev_is(cfg, pos, "architecture", "blackwell");
}

MOCK_API nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport)
{
    if (gpmSupport == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (gpmSupport->version != NVML_GPM_SUPPORT_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    gpmSupport->isSupportedDevice = (unsigned)gpm_supported(c.cfg, c.pos);
    mock_end(&c);
    return r;
}

MOCK_API nvmlReturn_t nvmlGpmQueryIfStreamingEnabled(nvmlDevice_t device, unsigned int *state)
{
    /* Streaming (driver-side sampling) stays off: samples are taken on demand. */
    return mock_constant_uint(device, MOCK_GUARDED, 0, state);
}

MOCK_API nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample)
{
    if (gpmSample == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = mock_require_init();
    if (r != NVML_SUCCESS)
        return r;
    struct nvmlGpmSample_st *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NVML_ERROR_MEMORY;
    s->magic = SAMPLE_MAGIC;
    *gpmSample = s;
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t gpmSample)
{
    if (gpmSample == NULL || gpmSample->magic != SAMPLE_MAGIC)
        return NVML_ERROR_INVALID_ARGUMENT;
    gpmSample->magic = 0;
    free(gpmSample);
    return NVML_SUCCESS;
}

static double percent_field(const struct mock_config *cfg, unsigned pos, const char *field)
{
    double value = 0;
    if (!mock_dev_double(cfg, pos, field, &value) || value < 0)
        return 0;
    return value > 100 ? 100 : value;
}

MOCK_API nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample)
{
    if (gpmSample == NULL || gpmSample->magic != SAMPLE_MAGIC)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    if (!gpm_supported(c.cfg, c.pos)) {
        r = NVML_ERROR_NOT_SUPPORTED;
    } else {
        struct nvmlGpmSample_st *s = gpmSample;
        s->pos = c.pos;
        s->links = mock_link_count(c.cfg, c.pos);
        /* the sample's time is the meter's, so rates between two samples
         * are exact however long the process waited in between */
        s->nvlink_kib = mock_nvlink_data_kib(c.cfg, c.pos, &s->ns);
        for (unsigned g = 0; g < GAUGE_COUNT; g++) {
            unsigned long long v = 0;
            mock_dev_u64(c.cfg, c.pos, GAUGE_FIELDS[g], &v);
            s->gauges[g] = (double)v;
        }
        s->tensor = percent_field(c.cfg, c.pos, "gpm.tensor_active_pct");
        s->dfma = percent_field(c.cfg, c.pos, "gpm.dfma_tensor_active_pct");
        s->hmma = percent_field(c.cfg, c.pos, "gpm.hmma_tensor_active_pct");
        s->imma = percent_field(c.cfg, c.pos, "gpm.imma_tensor_active_pct");
        s->fp64 = percent_field(c.cfg, c.pos, "gpm.fp64_active_pct");
        s->fp32 = percent_field(c.cfg, c.pos, "gpm.fp32_active_pct");
        s->fp16 = percent_field(c.cfg, c.pos, "gpm.fp16_active_pct");
        s->integer = percent_field(c.cfg, c.pos, "gpm.integer_active_pct");
        s->occupancy = percent_field(c.cfg, c.pos, "gpm.sm_occupancy_pct");
        s->taken = 1;
    }
    mock_end(&c);
    return r;
}

/* The metrics the library knows, with the names and unit it reports for
 * each: nvmlGpmMetricsGet answers only a metric listed here (any other is
 * NOT_SUPPORTED), so every answer carries its names.
 *
 * The first sixteen are the names NVIDIA's library reports.  The media
 * engine and per-link NVLink names could not be checked against a real
 * driver: they are derived from the same pattern (the short name is the
 * nvml.h id's suffix in lower case without "_PER_SEC", the long name its
 * words with the engine or link named as nvml.h's comment does, the unit
 * that of the metric's kind: "%" for a utilization, "MiB/sec" for a
 * bandwidth). */
struct metric_name {
    unsigned id;
    const char *short_name, *long_name, *unit;
};

/* NVDEC 0..7, NVJPG 0..7, NVOFA 0: "<engine>_<n>_util", "<ENGINE> <n> utilization". */
#define MEDIA_UTIL(ENGINE, engine, n)                                                   \
    {NVML_GPM_METRIC_##ENGINE##_##n##_UTIL, #engine "_" #n "_util",                     \
     #ENGINE " " #n " utilization", "%"}
#define MEDIA_UTIL_8(ENGINE, engine)                                                    \
    MEDIA_UTIL(ENGINE, engine, 0), MEDIA_UTIL(ENGINE, engine, 1),                       \
        MEDIA_UTIL(ENGINE, engine, 2), MEDIA_UTIL(ENGINE, engine, 3),                   \
        MEDIA_UTIL(ENGINE, engine, 4), MEDIA_UTIL(ENGINE, engine, 5),                   \
        MEDIA_UTIL(ENGINE, engine, 6), MEDIA_UTIL(ENGINE, engine, 7)
/* Link l's two directions: "nvlink_l<l>_rx", "NVLink L<l> RX" (as the totals). */
#define NVLINK_LINK(l)                                                                  \
    {NVML_GPM_METRIC_NVLINK_L##l##_RX_PER_SEC, "nvlink_l" #l "_rx", "NVLink L" #l " RX", \
     "MiB/sec"},                                                                        \
        {NVML_GPM_METRIC_NVLINK_L##l##_TX_PER_SEC, "nvlink_l" #l "_tx",                 \
         "NVLink L" #l " TX", "MiB/sec"}

static const struct metric_name METRIC_NAMES[] = {
    {NVML_GPM_METRIC_GRAPHICS_UTIL, "gr_util", "graphics utilization", "%"},
    {NVML_GPM_METRIC_SM_UTIL, "sm_util", "SM utilization", "%"},
    {NVML_GPM_METRIC_SM_OCCUPANCY, "sm_occupancy", "SM occupancy", "%"},
    {NVML_GPM_METRIC_INTEGER_UTIL, "integer_util", "integer utilization", "%"},
    {NVML_GPM_METRIC_ANY_TENSOR_UTIL, "any_tensor_util", "tensor utilization", "%"},
    {NVML_GPM_METRIC_DFMA_TENSOR_UTIL, "dfma_tensor_util", "DFMA tensor utilization", "%"},
    {NVML_GPM_METRIC_HMMA_TENSOR_UTIL, "hmma_tensor_util", "HMMA tensor utilization", "%"},
    {NVML_GPM_METRIC_IMMA_TENSOR_UTIL, "imma_tensor_util", "IMMA tensor utilization", "%"},
    {NVML_GPM_METRIC_DRAM_BW_UTIL, "dram_bw_util", "DRAM bandwidth utilization", "%"},
    {NVML_GPM_METRIC_FP64_UTIL, "fp64_util", "FP64 utilization", "%"},
    {NVML_GPM_METRIC_FP32_UTIL, "fp32_util", "FP32 utilization", "%"},
    {NVML_GPM_METRIC_FP16_UTIL, "fp16_util", "FP16 utilization", "%"},
    {NVML_GPM_METRIC_PCIE_TX_PER_SEC, "pcie_tx", "PCIe TX", "MiB/sec"},
    {NVML_GPM_METRIC_PCIE_RX_PER_SEC, "pcie_rx", "PCIe RX", "MiB/sec"},
    {NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, "nvlink_total_rx", "NVLink total RX", "MiB/sec"},
    {NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, "nvlink_total_tx", "NVLink total TX", "MiB/sec"},
    /* derived (see above) */
    MEDIA_UTIL_8(NVDEC, nvdec),
    MEDIA_UTIL_8(NVJPG, nvjpg),
    MEDIA_UTIL(NVOFA, nvofa, 0),
    NVLINK_LINK(0), NVLINK_LINK(1), NVLINK_LINK(2), NVLINK_LINK(3), NVLINK_LINK(4),
    NVLINK_LINK(5), NVLINK_LINK(6), NVLINK_LINK(7), NVLINK_LINK(8), NVLINK_LINK(9),
    NVLINK_LINK(10), NVLINK_LINK(11), NVLINK_LINK(12), NVLINK_LINK(13), NVLINK_LINK(14),
    NVLINK_LINK(15), NVLINK_LINK(16), NVLINK_LINK(17),
};

#undef MEDIA_UTIL
#undef MEDIA_UTIL_8
#undef NVLINK_LINK

/* The entry of a metric the library knows; NULL for any other id. */
static const struct metric_name *metric_name(unsigned id)
{
    for (size_t n = 0; n < MOCK_COUNT(METRIC_NAMES); n++)
        if (METRIC_NAMES[n].id == id)
            return &METRIC_NAMES[n];
    return NULL;
}

/* The value of one metric between two samples; 0 when the board has no
 * such unit (a media engine it lacks, a link past its count, C2C). */
static int metric_value(const struct nvmlGpmSample_st *a, const struct nvmlGpmSample_st *b,
                        unsigned id, double *out)
{
    double seconds = (double)(b->ns - a->ns) / 1e9;
    double sm = (a->gauges[GAUGE_GPU] + b->gauges[GAUGE_GPU]) / 2;
    /* MiB/s over one link and direction, from the link meter */
    double link_mib = seconds > 0 ? (double)(b->nvlink_kib - a->nvlink_kib) / 1024 / seconds : 0;
#define AVG(g) ((a->g + b->g) / 2)
    switch (id) {
    case NVML_GPM_METRIC_GRAPHICS_UTIL:
    case NVML_GPM_METRIC_SM_UTIL: *out = sm; return 1;
    case NVML_GPM_METRIC_SM_OCCUPANCY: *out = sm * AVG(occupancy) / 100; return 1;
    case NVML_GPM_METRIC_INTEGER_UTIL: *out = sm * AVG(integer) / 100; return 1;
    case NVML_GPM_METRIC_ANY_TENSOR_UTIL: *out = sm * AVG(tensor) / 100; return 1;
    case NVML_GPM_METRIC_DFMA_TENSOR_UTIL: *out = sm * AVG(dfma) / 100; return 1;
    case NVML_GPM_METRIC_HMMA_TENSOR_UTIL: *out = sm * AVG(hmma) / 100; return 1;
    case NVML_GPM_METRIC_IMMA_TENSOR_UTIL: *out = sm * AVG(imma) / 100; return 1;
    case NVML_GPM_METRIC_FP64_UTIL: *out = sm * AVG(fp64) / 100; return 1;
    case NVML_GPM_METRIC_FP32_UTIL: *out = sm * AVG(fp32) / 100; return 1;
    case NVML_GPM_METRIC_FP16_UTIL: *out = sm * AVG(fp16) / 100; return 1;
    case NVML_GPM_METRIC_DRAM_BW_UTIL: *out = AVG(gauges[GAUGE_MEMORY]); return 1;
    /* the profile's PCIe throughput is in KB/s */
    case NVML_GPM_METRIC_PCIE_TX_PER_SEC:
        *out = AVG(gauges[GAUGE_PCIE_TX_KBPS]) * 1000 / (1024 * 1024);
        return 1;
    case NVML_GPM_METRIC_PCIE_RX_PER_SEC:
        *out = AVG(gauges[GAUGE_PCIE_RX_KBPS]) * 1000 / (1024 * 1024);
        return 1;
    case NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC:
    case NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC:
        *out = link_mib * b->links;
        return b->links > 0;
    default: break;
    }
#undef AVG
    if (id >= NVML_GPM_METRIC_NVDEC_0_UTIL && id <= NVML_GPM_METRIC_NVDEC_7_UTIL) {
        *out = (a->gauges[GAUGE_DECODER] + b->gauges[GAUGE_DECODER]) / 2;
        return 1;
    }
    if (id >= NVML_GPM_METRIC_NVJPG_0_UTIL && id <= NVML_GPM_METRIC_NVJPG_7_UTIL) {
        *out = (a->gauges[GAUGE_JPEG] + b->gauges[GAUGE_JPEG]) / 2;
        return 1;
    }
    if (id == NVML_GPM_METRIC_NVOFA_0_UTIL) {
        *out = (a->gauges[GAUGE_OFA] + b->gauges[GAUGE_OFA]) / 2;
        return 1;
    }
    /* Per link: L<l>_RX then L<l>_TX, links 0..17. */
    if (id >= NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC && id <= NVML_GPM_METRIC_NVLINK_L17_TX_PER_SEC) {
        unsigned link = (id - NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC) / 2;
        *out = link_mib;
        return link < b->links;
    }
    return 0;
}

MOCK_API nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet)
{
    if (metricsGet == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (metricsGet->version != NVML_GPM_METRICS_GET_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlReturn_t r = mock_require_init();
    if (r != NVML_SUCCESS)
        return r;
    const struct nvmlGpmSample_st *a = metricsGet->sample1, *b = metricsGet->sample2;
    if (metricsGet->numMetrics > NVML_GPM_METRIC_MAX || a == NULL || b == NULL ||
        a->magic != SAMPLE_MAGIC || b->magic != SAMPLE_MAGIC || !a->taken || !b->taken ||
        a->pos != b->pos || b->ns < a->ns)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < metricsGet->numMetrics; i++) {
        nvmlGpmMetric_t *m = &metricsGet->metrics[i];
        const struct metric_name *name = metric_name(m->metricId);
        double value = 0;
        memset(&m->metricInfo, 0, sizeof m->metricInfo);
        m->value = 0;
        /* an unknown metric, or one the board lacks (a link past its
         * count): no value, and no names (nvml.h: they "can be NULL") */
        if (name == NULL || !metric_value(a, b, m->metricId, &value)) {
            m->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            continue;
        }
        m->nvmlReturn = NVML_SUCCESS;
        m->value = value;
        /* NVML hands out pointers to its own constant strings. */
        m->metricInfo.shortName = (char *)name->short_name;
        m->metricInfo.longName = (char *)name->long_name;
        m->metricInfo.unit = (char *)name->unit;
    }
    return NVML_SUCCESS;
}
