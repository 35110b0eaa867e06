/*
 * Encoder capacity: how much of the board's NVENC capacity is free, per
 * codec (nvmlDeviceGetEncoderCapacity).
 *
 * Whether a board has NVENC, and which codecs it encodes, is the profile's
 * `encoder` block (`encoder.codecs`: h264, hevc, av1), written from the
 * board's datasheet.  A board without the block (A100, H100, B200, GB200,
 * GB300: NVDEC and NVJPG only, no NVENC) answers NVML_ERROR_NOT_SUPPORTED
 * for every codec, as a real one does, and so does a board for a codec its
 * NVENC does not encode (AV1 on a T4).  Apart from utilization.c, which
 * reports how busy the encoder is: this says what is left of it.
 */
#include <stdio.h>
#include <strings.h>

#include "mock.h"

/* The profile's word for each nvmlEncoderType_t a capacity query names. */
static const char *const CODEC_WORDS[] = {
    [NVML_ENCODER_QUERY_H264] = "h264",
    [NVML_ENCODER_QUERY_HEVC] = "hevc",
    [NVML_ENCODER_QUERY_AV1] = "av1",
};

/* Whether the device's NVENC encodes `codec` (an index into CODEC_WORDS):
 * the word is among `encoder.codecs`.  Not a hot path: a client asks once
 * per codec, and the list holds at most three words. */
static int encodes(const struct mock_config *cfg, unsigned pos, unsigned codec)
{
    unsigned count = 0;
    if (!mock_dev_list_len(cfg, pos, "encoder.codecs", &count))
        return 0;
    for (unsigned i = 0; i < count; i++) {
        char field[48];
        snprintf(field, sizeof field, "encoder.codecs.%u", i);
        const char *word = mock_dev_get(cfg, pos, field);
        if (word != NULL && strcasecmp(word, CODEC_WORDS[codec]) == 0)
            return 1;
    }
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
    if ((unsigned)encoderQueryType >= MOCK_COUNT(CODEC_WORDS) ||
        CODEC_WORDS[encoderQueryType] == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_call c;
    nvmlReturn_t r = mock_begin(&c, device, MOCK_GUARDED);
    if (r != NVML_SUCCESS)
        return r;
    if (!encodes(c.cfg, c.pos, (unsigned)encoderQueryType)) {
        r = NVML_ERROR_NOT_SUPPORTED;
    } else {
        unsigned busy = 0;
        mock_dev_uint(c.cfg, c.pos, "utilization.encoder", &busy);
        *encoderCapacity = busy < 100 ? 100 - busy : 0;
    }
    mock_end(&c);
    return r;
}
