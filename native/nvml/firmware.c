/*
 * The board's firmware: VBIOS and InfoROM versions, the InfoROM black box
 * flush, and the GSP firmware.
 *
 * Apart from devices.c because these are guarded calls (a lost GPU fails
 * them) and the black box's flush keeps state of its own: the node's boot
 * time, read once per process (the energy counter's origin too, energy.c).
 */
#include <pthread.h>
#include <stdio.h>
#include <strings.h>

#include "mock.h"

MOCK_API nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char *version,
                                                unsigned int length)
{
    return mock_string_field(device, MOCK_GUARDED, "vbios_version", version, length);
}

MOCK_API nvmlReturn_t nvmlDeviceGetInforomImageVersion(nvmlDevice_t device, char *version,
                                                       unsigned int length)
{
    return mock_string_field(device, MOCK_GUARDED, "inforom.image_version", version, length);
}

MOCK_API nvmlReturn_t nvmlDeviceGetInforomVersion(nvmlDevice_t device, nvmlInforomObject_t object,
                                                  char *version, unsigned int length)
{
    static const char *const fields[] = {
        [NVML_INFOROM_OEM] = "inforom.oem_object",
        [NVML_INFOROM_ECC] = "inforom.ecc_object",
        [NVML_INFOROM_POWER] = "inforom.pwr_object",
    };
    if ((unsigned)object >= sizeof fields / sizeof *fields || fields[object] == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    const char *value = mock_dev_get(c.cfg, c.pos, fields[object]);
    if (value != NULL && strcasecmp(value, "N/A") == 0)
        value = NULL; /* the profile spells "not present" as N/A */
    r = mock_copy_out(value, version, length);
    mock_end(&c);
    return r;
}

/* The node's boot time (seconds since the epoch, `btime` of /proc/stat):
 * the driver loads at boot, and the black box's flush is timed from there,
 * as is the energy counter (energy.c).  Read once per process; 0 when
 * /proc/stat has no boot time.  The real boot time even when the clock is
 * pinned (MOCK_NVML_CLOCK_OVERRIDE moves "now", never the boot). */
static unsigned long long g_boot_time;
static pthread_once_t g_boot_time_once = PTHREAD_ONCE_INIT;

static void read_boot_time(void)
{
    FILE *f = fopen("/proc/stat", "re");
    if (f == NULL)
        return;
    char line[256];
    unsigned long long btime;
    while (fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "btime %llu", &btime) == 1) {
            g_boot_time = btime;
            break;
        }
    }
    fclose(f);
}

unsigned long long mock_boot_time(void)
{
    pthread_once(&g_boot_time_once, read_boot_time);
    return g_boot_time;
}

/* The InfoROM black box (BBX) is flushed once after the driver loads, so
 * real boards report the same instant, hours old, until the next boot (H100
 * and GB200 captures: a few minutes apart per GPU, tens of milliseconds
 * long).  The profile says when, after boot (`inforom.bbx_flush_after_boot_ms`),
 * and how long (`inforom.bbx_flush_duration_us`); a board whose driver
 * answers N/A (A100, B200 captures) has neither: NOT_SUPPORTED.  Before that
 * instant the flush has not happened yet: NOT_READY, as NVML documents.  The
 * timestamp is in microseconds since the epoch, as nvidia-smi prints it. */
struct bbx_flush {
    unsigned long long timestamp_us;
    unsigned long duration_us;
    int ready;
};

static int read_bbx_flush(const struct mock_config *cfg, unsigned pos, void *out)
{
    struct bbx_flush *flush = out;
    unsigned long long after_boot_ms, duration_us;
    if (!mock_dev_u64(cfg, pos, "inforom.bbx_flush_after_boot_ms", &after_boot_ms) ||
        !mock_dev_u64(cfg, pos, "inforom.bbx_flush_duration_us", &duration_us))
        return 0;
    if (after_boot_ms > 0xFFFFFFFFULL || duration_us > 0xFFFFFFFFULL) {
        mock_debug("LastBBXFlushTime: device %u: inforom.bbx_flush_* out of range", pos);
        return 0;
    }
    unsigned long long boot = mock_boot_time();
    if (boot == 0) {
        mock_debug("LastBBXFlushTime: /proc/stat has no boot time");
        return 0;
    }
    unsigned long long at_ms = boot * 1000ULL + after_boot_ms;
    flush->ready = mock_reading_time() * 1000.0 >= (double)at_ms;
    flush->timestamp_us = at_ms * 1000ULL;
    flush->duration_us = (unsigned long)duration_us;
    return 1;
}

MOCK_API nvmlReturn_t nvmlDeviceGetLastBBXFlushTime(nvmlDevice_t device,
                                                    unsigned long long *timestamp,
                                                    unsigned long *durationUs)
{
    if (timestamp == NULL || durationUs == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct bbx_flush flush;
    nvmlReturn_t r = mock_read(device, read_bbx_flush, &flush);
    if (r != NVML_SUCCESS)
        return r;
    if (!flush.ready)
        return NVML_ERROR_NOT_READY;
    *timestamp = flush.timestamp_us;
    *durationUs = flush.duration_us;
    return NVML_SUCCESS;
}

MOCK_API nvmlReturn_t nvmlDeviceGetGspFirmwareVersion(nvmlDevice_t device, char *version)
{
    /* NVIDIA documents the buffer as NVML_GSP_FIRMWARE_VERSION_BUF_SIZE (0x40). */
    return mock_string_field(device, MOCK_GUARDED, "gsp_firmware.version", version, 0x40);
}

MOCK_API nvmlReturn_t nvmlDeviceGetGspFirmwareMode(nvmlDevice_t device, unsigned int *isEnabled,
                                                   unsigned int *defaultMode)
{
    if (isEnabled == NULL || defaultMode == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    int enabled;
    if (mock_dev_bool(c.cfg, c.pos, "gsp_firmware.mode", &enabled)) {
        *isEnabled = (unsigned)enabled;
        *defaultMode = (unsigned)enabled;
    } else {
        r = NVML_ERROR_NOT_SUPPORTED;
    }
    mock_end(&c);
    return r;
}
