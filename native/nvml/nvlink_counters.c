/*
 * What moves on an NVLink, and the NVLink field values.
 *
 * Traffic is simulated: each link carries `utilization.gpu` percent of its
 * bandwidth in each direction, a meter (meters.c), so counters only climb
 * and monitoring agents see a rate that follows `mokka ctl util`.  Errors
 * are the ones `mokka ctl nvlink-error` adds (`nvlink_errors.<link>`).  The
 * field values (fields.c hands over every field whose scope is a link)
 * answer from the links resolved per snapshot (nvlink.c) and from these
 * counters.
 *
 * Apart from the links and their getters (nvlink.c) because these change
 * per call (a meter, an injected error) while the links change only with
 * the config, and the field table is as long as the rest together.
 */
#include <limits.h>
#include <stdio.h>

#include "mock.h"

/* ----------------------------------------------------------------- traffic */

/* KiB per second one link carries per direction at full utilization. */
static double link_kib_per_second(const struct mock_config *cfg)
{
    unsigned long long mbps = 0;
    mock_cfg_u64(cfg, "nvlink.bandwidth_per_link_mbps", &mbps);
    return (double)mbps * 1e6 / 1024.0;
}

unsigned long long mock_nvlink_data_kib(const struct mock_config *cfg, unsigned pos,
                                        unsigned long long *at)
{
    unsigned util = 0;
    mock_dev_uint(cfg, pos, "utilization.gpu", &util);
    double rate = (util > 100 ? 100 : util) / 100.0 * link_kib_per_second(cfg);
    double kib = mock_meter_read(MOCK_METER_NVLINK_KIB, pos, rate, at);
    return (unsigned long long)kib;
}

/* Errors `mokka ctl nvlink-error` put on one link. */
unsigned long long mock_nvlink_errors(const struct mock_config *cfg, unsigned pos, unsigned link)
{
    char field[64];
    unsigned long long n = 0;
    snprintf(field, sizeof field, "nvlink_errors.%u", link);
    mock_dev_u64(cfg, pos, field, &n);
    return n;
}

/* One error counter of a link.  An injected error is a flit that failed
 * its CRC check, which the link then replays: both counters carry it.
 * Recoveries and data CRC/ECC errors never happen on simulated links. */
unsigned long long mock_nvlink_error_count(const struct mock_config *cfg, unsigned pos,
                                           unsigned link, nvmlNvLinkErrorCounter_t counter)
{
    if (counter != NVML_NVLINK_ERROR_DL_CRC_FLIT && counter != NVML_NVLINK_ERROR_DL_REPLAY)
        return 0;
    return mock_nvlink_errors(cfg, pos, link);
}

/* --------------------------------------------------------- field values */

/* Legacy per-link error fields: links 0-5, their total, then links 6-11. */
static const struct {
    unsigned first, total, first_high;
    nvmlNvLinkErrorCounter_t counter;
} LINK_ERROR_FIELDS[] = {
    {NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
     NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L6, NVML_NVLINK_ERROR_DL_CRC_FLIT},
    {NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
     NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6, NVML_NVLINK_ERROR_DL_CRC_DATA},
    {NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
     NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L6, NVML_NVLINK_ERROR_DL_REPLAY},
    {NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
     NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L6, NVML_NVLINK_ERROR_DL_RECOVERY},
    {NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL,
     NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_L6, NVML_NVLINK_ERROR_DL_ECC_DATA},
};

/* The link a legacy per-link field names (-1: all links, its total);
 * 0 when the field is not one of them. */
static int link_error_field(unsigned field, int *link, nvmlNvLinkErrorCounter_t *counter)
{
    for (size_t i = 0; i < MOCK_COUNT(LINK_ERROR_FIELDS); i++) {
        unsigned first = LINK_ERROR_FIELDS[i].first, high = LINK_ERROR_FIELDS[i].first_high;
        *counter = LINK_ERROR_FIELDS[i].counter;
        if (field >= first && field < LINK_ERROR_FIELDS[i].total)
            *link = (int)(field - first);
        else if (field == LINK_ERROR_FIELDS[i].total)
            *link = -1;
        /* ECC data fields run L0..L11 in one block before their total. */
        else if (high != LINK_ERROR_FIELDS[i].first && field >= high && field < high + 6)
            *link = (int)(field - high) + 6;
        else
            continue;
        return 1;
    }
    return 0;
}

/* Per-link NVLink speed fields: links 0-5, then 6-11. */
static int nvlink_speed_link(unsigned field)
{
    if (field >= NVML_FI_DEV_NVLINK_SPEED_MBPS_L0 && field <= NVML_FI_DEV_NVLINK_SPEED_MBPS_L5)
        return (int)(field - NVML_FI_DEV_NVLINK_SPEED_MBPS_L0);
    if (field >= NVML_FI_DEV_NVLINK_SPEED_MBPS_L6 && field <= NVML_FI_DEV_NVLINK_SPEED_MBPS_L11)
        return (int)(field - NVML_FI_DEV_NVLINK_SPEED_MBPS_L6) + 6;
    return -1;
}

/* The links a field with a link scope covers: one link, or (UINT_MAX)
 * all of them; 0 for a link the board does not have. */
static int scope_links(unsigned scope, unsigned links, unsigned *first, unsigned *count)
{
    if (scope == UINT_MAX) {
        *first = 0;
        *count = links;
        return links > 0;
    }
    *first = scope;
    *count = 1;
    return scope < links;
}

int mock_nvlink_field(const struct mock_config *cfg, unsigned pos, nvmlFieldValue_t *v)
{
    struct mock_nvlink own;
    const struct mock_nvlink *resolved = mock_nvlink_of(cfg, pos, &own);
    unsigned links = resolved->link_count, first, count;
    unsigned long long n = 0, speed = resolved->bandwidth_mbps;
    int link, found, has_speed = resolved->has_bandwidth, nvlink5 = resolved->nvlink5;
    nvmlNvLinkErrorCounter_t counter;

    if ((link = nvlink_speed_link(v->fieldId)) >= 0) {
        mock_field_uint(v, (unsigned)link < links && has_speed, speed);
        return 1;
    }
    if (link_error_field(v->fieldId, &link, &counter)) {
        /* A total counts every link; per-link fields name theirs. */
        found = link < 0 ? links > 0 : (unsigned)link < links;
        for (unsigned l = 0; found && l < links; l++)
            if (link < 0 || (unsigned)link == l)
                n += mock_nvlink_error_count(cfg, pos, l, counter);
        mock_field_ull(v, found, n);
        return 1;
    }
    switch (v->fieldId) {
    case NVML_FI_DEV_NVLINK_LINK_COUNT:
        mock_field_uint(v, 1, links);
        return 1;
    case NVML_FI_DEV_NVSWITCH_CONNECTED_LINK_COUNT:
        mock_field_uint(v, 1, resolved->switch_links);
        return 1;
    case NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON:
        mock_field_uint(v, links > 0 && has_speed, speed);
        return 1;
    case NVML_FI_DEV_NVLINK_GET_SPEED:
        mock_field_uint(v, v->scopeId < links && has_speed, speed);
        return 1;
    case NVML_FI_DEV_NVLINK_GET_STATE:
        found = v->scopeId < links;
        mock_field_uint(v, found,
                        found && resolved->up_mask >> v->scopeId & 1 ? NVML_FEATURE_ENABLED
                                                                     : NVML_FEATURE_DISABLED);
        return 1;
    case NVML_FI_DEV_NVLINK_GET_VERSION:
        mock_field_uint(v, v->scopeId < links && resolved->has_version, resolved->version);
        return 1;
    case NVML_FI_DEV_NVLINK_GET_POWER_STATE:
        mock_field_uint(v, v->scopeId < links, NVML_NVLINK_POWER_STATE_HIGH_SPEED);
        return 1;
    case NVML_FI_DEV_NVLINK_REMOTE_NVLINK_ID: {
        /* A wired switch link ends at its port of the switch, a mesh link
         * at its link of the peer GPU; a link to a switch outside this node
         * at the same link number of it. */
        unsigned sw, port = v->scopeId, peer;
        found = v->scopeId < links;
        if (found && !mock_nvlink_wired_switch(cfg, pos, v->scopeId, &sw, &port) &&
            !mock_nvlink_wired_gpu(cfg, pos, v->scopeId, &peer, &port))
            found = resolved->up_mask >> v->scopeId & 1;
        mock_field_uint(v, found, port);
        return 1;
    }
    case NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY:
    case NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY:
    case NVML_FI_DEV_NVLINK_ERROR_DL_CRC: {
        static const nvmlNvLinkErrorCounter_t kinds[] = {
            NVML_NVLINK_ERROR_DL_REPLAY, NVML_NVLINK_ERROR_DL_RECOVERY,
            NVML_NVLINK_ERROR_DL_CRC_FLIT};
        found = v->scopeId < links;
        n = found ? mock_nvlink_error_count(cfg, pos, v->scopeId,
                                            kinds[v->fieldId - NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY])
                  : 0;
        mock_field_ull(v, found, n);
        return 1;
    }
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
    case NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX:
    case NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX: {
        /* KiB; symmetric traffic, so TX equals RX.  Raw adds the flit
         * headers: one 16-byte header per 256-byte payload. */
        found = scope_links(v->scopeId, links, &first, &count);
        n = found ? mock_nvlink_data_kib(cfg, pos, NULL) : 0;
        if (v->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX ||
            v->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX)
            n += n / 16;
        mock_field_ull(v, found, n * count);
        return 1;
    }
    case NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES:
    case NVML_FI_DEV_NVLINK_COUNT_RCV_BYTES:
    case NVML_FI_DEV_NVLINK_COUNT_XMIT_PACKETS:
    case NVML_FI_DEV_NVLINK_COUNT_RCV_PACKETS: {
        /* NVLink 5 counters, in bytes and 256-byte packets. */
        found = nvlink5 && scope_links(v->scopeId, links, &first, &count);
        n = found ? mock_nvlink_data_kib(cfg, pos, NULL) * 1024ULL * count : 0;
        if (v->fieldId == NVML_FI_DEV_NVLINK_COUNT_XMIT_PACKETS ||
            v->fieldId == NVML_FI_DEV_NVLINK_COUNT_RCV_PACKETS)
            n /= 256;
        mock_field_ull(v, found, n);
        return 1;
    }
    case NVML_FI_DEV_NVLINK_COUNT_RCV_ERRORS:
    case NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS:
    case NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS:
        /* NVLink 5 reports an injected error as a received bad packet. */
        found = nvlink5 && scope_links(v->scopeId, links, &first, &count);
        for (unsigned l = first; found && l < first + count; l++)
            n += mock_nvlink_errors(cfg, pos, l);
        mock_field_ull(v, found, n);
        return 1;
    case NVML_FI_DEV_NVLINK_COUNT_MALFORMED_PACKET_ERRORS:
    case NVML_FI_DEV_NVLINK_COUNT_BUFFER_OVERRUN_ERRORS:
    case NVML_FI_DEV_NVLINK_COUNT_RCV_REMOTE_ERRORS:
    case NVML_FI_DEV_NVLINK_COUNT_RCV_GENERAL_ERRORS:
    case NVML_FI_DEV_NVLINK_COUNT_LOCAL_LINK_INTEGRITY_ERRORS:
    case NVML_FI_DEV_NVLINK_COUNT_XMIT_DISCARDS:
    case NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS:
    case NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS:
    case NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS:
        found = nvlink5 && scope_links(v->scopeId, links, &first, &count);
        mock_field_ull(v, found, 0);
        return 1;
    default:
        return 0;
    }
}
