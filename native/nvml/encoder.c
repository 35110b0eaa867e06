/*
 * Encoder capacity: how much of the board's NVENC capacity is free, per
 * codec (nvmlDeviceGetEncoderCapacity).
 *
 * Whether a board has NVENC at all, and which codecs it encodes, is a fact
 * of the chip, not of a profile setting: the boards with video encoders are
 * listed here by PCI device id, from NVIDIA's datasheets.  Every other
 * board (A100, H100, B200, GB200, GB300: NVDEC and NVJPG only, no NVENC)
 * answers NVML_ERROR_NOT_SUPPORTED, as a real one does.  Apart from
 * utilization.c, which reports how busy the encoder is: this says what is
 * left of it.
 */
#include "mock.h"

enum codec_bits {
    H264 = 1u << NVML_ENCODER_QUERY_H264,
    HEVC = 1u << NVML_ENCODER_QUERY_HEVC,
    AV1 = 1u << NVML_ENCODER_QUERY_AV1,
};

/* Boards with NVENC and the codecs it encodes. */
static const struct {
    unsigned device_id; /* PCI device id (pci.device_id) */
    unsigned codecs;    /* enum codec_bits */
} NVENC_BOARDS[] = {
    /* Tesla T4 (Turing, TU104): one NVENC, H.264 and H.265 (T4 datasheet) */
    {0x1EB8, H264 | HEVC},
    /* L40S (Ada, AD102): three NVENC with AV1 (L40S datasheet) */
    {0x26B9, H264 | HEVC | AV1},
};

/* The codecs the device's NVENC encodes; 0 for a board without one. */
static unsigned board_codecs(const struct mock_config *cfg, unsigned pos)
{
    unsigned device_id = mock_pci_device_id(cfg, pos) >> 16;
    for (size_t i = 0; i < MOCK_COUNT(NVENC_BOARDS); i++)
        if (NVENC_BOARDS[i].device_id == device_id)
            return NVENC_BOARDS[i].codecs;
    return 0;
}

/* The free share of the encoder: 100 % on an idle board, less what the
 * encoder is busy with (`utilization.encoder`, nvmlDeviceGetEncoderUtilization's
 * figure), whatever the codec: the codecs share the engine. */
MOCK_API nvmlReturn_t nvmlDeviceGetEncoderCapacity(nvmlDevice_t device,
                                                   nvmlEncoderType_t encoderQueryType,
                                                   unsigned int *encoderCapacity)
{
    if (encoderCapacity == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (encoderQueryType != NVML_ENCODER_QUERY_H264 &&
        encoderQueryType != NVML_ENCODER_QUERY_HEVC && encoderQueryType != NVML_ENCODER_QUERY_AV1)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    if (!(board_codecs(c.cfg, c.pos) & (1u << encoderQueryType))) {
        r = NVML_ERROR_NOT_SUPPORTED;
    } else {
        unsigned busy = 0;
        mock_dev_uint(c.cfg, c.pos, "utilization.encoder", &busy);
        *encoderCapacity = busy < 100 ? 100 - busy : 0;
    }
    mock_end(&c);
    return r;
}
