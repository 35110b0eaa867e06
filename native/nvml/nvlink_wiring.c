/*
 * Which NVSwitch port each GPU link of an HGX baseboard reaches.
 *
 * On a board whose profile lists NVSwitches (`nvlink.switch.<i>.bus_id`),
 * each GPU sends a fixed number of its links to each switch, in contiguous
 * blocks, and each switch port has exactly one GPU link at its other end;
 * nvlink.c answers RemotePciInfo, field 146 and `nvidia-smi nvlink -R`
 * from this one wiring.
 */
#include <stdio.h>
#include <string.h>

#include "mock.h"

/* The NVSwitch device ids the pcibus
 * simulator stages in sysfs for the node's switches
 * (mokka/simulators/pcibus/hierarchy.py, NVSWITCH_DEVICE_IDS): the
 * third-generation NVSwitch 22a3 on Hopper boards and on any board whose
 * generation has no public id, the A100 NVSwitch 1af1 on Ampere boards. */
#define NVSWITCH_HOPPER 0x22a3u
#define NVSWITCH_AMPERE 0x1af1u

/* Baseboards whose split of a GPU's links over its NVSwitches is public,
 * by (switch count, links per GPU); the switches in the profile's order.
 * Any other board spreads a GPU's links as evenly as they go, in
 * contiguous blocks, the first switches taking one more (switch_block). */
static const struct {
    unsigned switches, links;
    unsigned char per_switch[4];
} BOARDS[] = {
    /* HGX H100/H200 8-GPU: four third-generation NVSwitch chips, 5, 4, 4
     * and 5 of each H100's 18 NVLink4 links (NVIDIA's DGX H100 diagram,
     * Hot Chips 34): 40 + 32 + 32 + 40 ports in use for 8 GPUs. */
    {4, 18, {5, 4, 4, 5}},
    /* HGX B200 8-GPU: two NVLink 5 switch chips, 9 of each GPU's 18 links
     * to each: 8 GPUs x 9 = the 72 ports of a chip. */
    {2, 18, {9, 9}},
};

/* How many of a GPU's `links` switch links go to switch `s` of
 * `switches`, and (`*first`) the index among them of the first one. */
static unsigned switch_block(unsigned links, unsigned switches, unsigned s, unsigned *first)
{
    for (size_t b = 0; b < MOCK_COUNT(BOARDS); b++) {
        if (BOARDS[b].switches != switches || BOARDS[b].links != links)
            continue;
        *first = 0;
        for (unsigned i = 0; i < s; i++)
            *first += BOARDS[b].per_switch[i];
        return BOARDS[b].per_switch[s];
    }
    unsigned base = links / switches, extra = links % switches;
    *first = s * base + (s < extra ? s : extra);
    return base + (s < extra);
}

/* The NVSwitch at the far end of a device's link, as the board wires it:
 * 1 with the switch's index in the profile's list and the port the link
 * lands on; 0 when the link does not go to one of the listed switches
 * (no switches listed, a GPU link, no such link).  A device's switch
 * links, in link order, go in blocks to the switches in turn; on each
 * switch the ports are numbered by GPU position (every device in the
 * engine config, seen by this process or not), then by link, so every
 * port has exactly one GPU link at its other end. */
int mock_nvlink_wired_switch(const struct mock_config *cfg, unsigned pos, unsigned link,
                             unsigned *sw, unsigned *port)
{
    unsigned switches = 0;
    if (!mock_cfg_list_len(cfg, "nvlink.switch_count", "nvlink.switch.", &switches) ||
        switches == 0 || link >= mock_link_count(cfg, pos))
        return 0;
    char field[64];
    snprintf(field, sizeof field, "nvlink.link.%u.remote_type", link);
    if (!mock_dev_is(cfg, pos, field, "switch"))
        return 0;
    /* this link's place among the device's switch links */
    unsigned nth = 0;
    for (unsigned l = 0; l < link; l++) {
        snprintf(field, sizeof field, "nvlink.link.%u.remote_type", l);
        nth += mock_dev_is(cfg, pos, field, "switch");
    }
    unsigned mine = mock_nvswitch_link_count(cfg, pos), first = 0, count = 0, s;
    for (s = 0; s < switches; s++) {
        count = switch_block(mine, switches, s, &first);
        if (nth >= first && nth < first + count)
            break;
    }
    if (s == switches)
        return 0;
    /* the ports of the devices before this one on that switch, then ours */
    unsigned base = 0, ignored;
    for (unsigned q = 0; q < pos; q++)
        base += switch_block(mock_nvswitch_link_count(cfg, q), switches, s, &ignored);
    *sw = s;
    *port = base + (nth - first);
    return 1;
}

/* NVML's packed PCI id (device << 16 | vendor) of the node's NVSwitches,
 * for both pciDeviceId and pciSubSystemId: the pcibus simulator gives
 * them NVIDIA's vendor and their device id as subsystem ids too.  The
 * Hopper switch wins on a mixed node, as it does there. */
unsigned mock_nvswitch_pci_id(const struct mock_config *cfg)
{
    int ampere = 0;
    for (unsigned p = 0; p < cfg->device_count; p++) {
        if (mock_dev_is(cfg, p, "architecture", "hopper"))
            return NVSWITCH_HOPPER << 16 | NVIDIA_VENDOR;
        ampere |= mock_dev_is(cfg, p, "architecture", "ampere");
    }
    return (ampere ? NVSWITCH_AMPERE : NVSWITCH_HOPPER) << 16 | NVIDIA_VENDOR;
}
