/*
 * The idle signature (`idle_signature: true` in the engine config;
 * docs/nvml.md, "Idle readings") gives each GPU of a fleet its own idle
 * readings, as real idle boards show: its temperature, draw, memory
 * temperature, fan and PCIe traffic sit at a place within the board's idle
 * range drawn from its identity (node name and UUID), drift slowly (two
 * waves of minutes) and the draw and the PCIe traffic jitter from one
 * driver sample (1/6 s) to the next.  Every term is a function of the
 * identity and the shared clock alone, with no state of the process, so two
 * processes reading at the same instant agree.  An override of a reading
 * (`pinned.<field>`) reads the profile's figure; a pattern or a workload
 * drives a busy board from the signature's idle bases, as from the
 * profile's.
 *
 * Apart from the formula of a busy board (dynamics.c) because the two
 * share no term: the signature is where an idle board sits, drawn from its
 * identity; the formula is how load moves a board from there.  The board
 * (board.c) resolves the signature with the rest of the device's inputs;
 * readings.c keeps its readings per tick and serves them.
 */
#include <math.h>
#include <string.h>

#include "dynamics.h"

/* How far idle boards of one kind spread, around the profile's idle
 * figures (which come from one board's capture), from public nvidia-smi
 * outputs of idle nodes:
 *
 *   H100 SXM: NVIDIA/nccl#1264 (eight H100 80GB HBM3, driver 550.54.15,
 *     idle in P0): 28-31 C and 83-88 W across the eight GPUs;
 *   A100 SXM: allenai/PeerRead#40 (eight A100-SXM4-80GB, driver 525.85.12,
 *     idle): 26-28 C and 59-62 W.
 *
 * The half-widths below cover those spreads and the slow drift of one GPU
 * over the day.  The other boards (B200, GB200, GB300, L40S, T4) take the
 * last row, the wider of the two: no public idle output of a whole node of
 * them was at hand.  PCIe traffic of an idle board is the driver's own
 * housekeeping: ollama/ollama#10393 (an idle board in P8, `nvidia-smi -q`)
 * shows TX 2900 KB/s and RX 100 KB/s; nvidia-smi samples it over 20 ms, so
 * it jumps from one query to the next. */
static const struct idle_range {
    const char *name;     /* a word of the board's name; NULL: any board */
    double temperature_c; /* half-width around the profile's idle temperature */
    double power_share;   /* half-width, a share of the profile's idle draw */
    double pcie_lo, pcie_hi; /* KB/s, each direction */
} IDLE_RANGES[] = {
    {"H100", 3, 0.06, 100, 1500},
    {"A100", 2, 0.04, 100, 1500},
    {NULL, 3, 0.06, 100, 1500},
};

/* The draw's jitter from one driver sample to the next: a share of the
 * idle draw, either way. */
#define IDLE_POWER_JITTER 0.015
/* A driver sample's period (samples.c's), in microseconds: the draw and
 * the PCIe traffic hold one value per sample, so a reading is the newest
 * sample's. */
#define IDLE_SAMPLE_US 166667ULL
/* The share of a half-width a GPU's place takes; the drift takes the rest. */
#define IDLE_PLACE 0.7

static unsigned long long splitmix(unsigned long long x)
{
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

static unsigned long long text_hash(const char *text)
{
    unsigned long long h = 0xcbf29ce484222325ULL; /* FNV-1a */
    for (; text != NULL && *text; text++)
        h = (h ^ (unsigned char)*text) * 0x100000001b3ULL;
    return h;
}

/* A number in [0, 1) drawn from the seed and `what`: the same for every
 * process. */
static double draw(unsigned long long seed, unsigned long long what)
{
    return (double)(splitmix(seed ^ splitmix(what)) >> 11) * 0x1.0p-53;
}

void mock_idle_resolve(const struct mock_config *cfg, unsigned pos, struct mock_board *b)
{
    struct idle_signature *s = &b->idle;
    int on = 0;
    s->on = mock_parse_bool(mock_cfg_get(cfg, "idle_signature"), &on) && on;
    if (!s->on)
        return;
    const char *name = mock_dev_get(cfg, pos, "name");
    const struct idle_range *range = &IDLE_RANGES[MOCK_COUNT(IDLE_RANGES) - 1];
    for (size_t i = 0; name != NULL && IDLE_RANGES[i].name != NULL; i++) {
        if (strstr(name, IDLE_RANGES[i].name) != NULL) {
            range = &IDLE_RANGES[i];
            break;
        }
    }
    s->seed = splitmix(text_hash(mock_cfg_get(cfg, "node_name")) ^
                       splitmix(text_hash(mock_dev_get(cfg, pos, "uuid"))));
    s->temperature_c = range->temperature_c;
    s->power_w = range->power_share * b->power / 1000;
    s->pcie_lo = range->pcie_lo;
    s->pcie_hi = range->pcie_hi;
    for (int i = 0; i < 4; i++)
        s->place[i] = 2 * draw(s->seed, (unsigned long long)i) - 1;
    /* two waves: one of 7 to 11 minutes, one of 25 to 40 */
    s->period[0] = 420 + 240 * draw(s->seed, 10);
    s->period[1] = 1500 + 900 * draw(s->seed, 11);
    s->phase[0] = 2 * M_PI * draw(s->seed, 12);
    s->phase[1] = 2 * M_PI * draw(s->seed, 13);
    double v;
    s->has_power = mock_dev_double(cfg, pos, "power.current_draw_mw", &v);
    s->has_temperature = mock_dev_double(cfg, pos, "thermal.temperature_gpu_c", &v);
    s->has_memory = mock_dev_double(cfg, pos, "thermal.temperature_memory_c", &s->memory_c);
    s->has_pcie = mock_dev_double(cfg, pos, "pcie.tx_throughput_kbps", &s->tx_kbps) &&
                  mock_dev_double(cfg, pos, "pcie.rx_throughput_kbps", &s->rx_kbps);
    unsigned fans = 0;
    s->has_fan = mock_dev_uint(cfg, pos, "fan.count", &fans) && fans > 0 &&
                 mock_dev_double(cfg, pos, "fan.speed_percent", &s->fan);
    /* a busy board starts from the GPU's own idle place, without the drift */
    b->base_power = b->power + IDLE_PLACE * s->place[1] * s->power_w * 1000;
    b->base_temperature = b->temperature + IDLE_PLACE * s->place[0] * s->temperature_c;
}

/* The slow drift at t, -1..1; `shift` (s) moves it along for a quantity
 * that drifts apart from the others. */
static double drift(const struct idle_signature *s, double t, double shift)
{
    double w = 0;
    for (int i = 0; i < 2; i++)
        w += (i == 0 ? 0.6 : 0.4) *
             sin(2 * M_PI * fmod(t + shift, s->period[i]) / s->period[i] + s->phase[i]);
    return w;
}

/* The draw's and the PCIe traffic's jitter in the driver sample holding
 * t, -1..1 (`what` tells the quantities apart). */
static double jitter(const struct idle_signature *s, double t, unsigned long long what)
{
    unsigned long long sample = (unsigned long long)(fmax(t, 0) * 1e6) / IDLE_SAMPLE_US;
    return 2 * draw(s->seed ^ splitmix(sample), what) - 1;
}

/* -1..1: where a quantity stands at t within its half-width. */
static double offset(const struct idle_signature *s, unsigned which, double t, double shift)
{
    return IDLE_PLACE * s->place[which] + (1 - IDLE_PLACE) * drift(s, t, shift);
}

double mock_idle_power_mw(const struct mock_board *b, double t)
{
    const struct idle_signature *s = &b->idle;
    if (!s->on)
        return b->power;
    double w = b->power / 1000 + s->power_w * offset(s, 1, t, 0) +
               IDLE_POWER_JITTER * b->power / 1000 * jitter(s, t, 100);
    double mw = fmax(w * 1000, 0);
    return b->has_limit ? fmin(mw, b->limit) : mw;
}

/* One direction's PCIe traffic: within the board's idle range, above the
 * profile's own figure. */
static double pcie_kbps(const struct idle_signature *s, unsigned which, double t, double base)
{
    double mid = (s->pcie_lo + s->pcie_hi) / 2, half = (s->pcie_hi - s->pcie_lo) / 2;
    double x = mid + half * (0.5 * offset(s, which, t, 97) + 0.5 * jitter(s, t, 100 + which));
    return base + clamp(x, s->pcie_lo, s->pcie_hi);
}

void mock_idle_at(const struct mock_board *b, double t, struct mock_idle *out)
{
    const struct idle_signature *s = &b->idle;
    memset(out, 0, sizeof *out);
    double heat = s->temperature_c * offset(s, 0, t, 0);
    out->temperature_c = (int)lround(b->temperature + heat);
    if (b->has_shutdown && out->temperature_c > b->shutdown - 1)
        out->temperature_c = (int)(b->shutdown - 1);
    out->tlimit_c = b->tlimit - (out->temperature_c - (long long)lround(b->temperature));
    out->memory_c = (int)lround(s->memory_c + heat); /* the memory sits beside the die */
    out->power_mw = (unsigned)lround(mock_idle_power_mw(b, t));
    out->tx_kbps = (unsigned)lround(pcie_kbps(s, 2, t, s->tx_kbps));
    out->rx_kbps = (unsigned)lround(pcie_kbps(s, 3, t, s->rx_kbps));
    /* a fan follows the board's warmth, a few percent either way */
    out->fan_percent = (unsigned)lround(clamp(s->fan + 3 * heat / s->temperature_c, 0, 100));
}
