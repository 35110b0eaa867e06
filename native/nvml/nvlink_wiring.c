/*
 * What each GPU link of a board reaches: an NVSwitch port, or a link of
 * another GPU.
 *
 * On a board whose profile lists NVSwitches (`nvlink.switch.<i>.bus_id`),
 * each GPU sends a fixed number of its links to each switch, in contiguous
 * blocks, and each switch port has exactly one GPU link at its other end.
 * On a board without them (a direct mesh: DGX-1, 4-GPU HGX boards, bridged
 * pairs), the links join pairs of GPUs, as many between two GPUs in one
 * direction as in the other, and each link ends at exactly one link of its
 * peer.  nvlink.c answers RemotePciInfo, field 146, `nvidia-smi nvlink -R`
 * and `topo -m` from this one wiring.
 */
#include <stdio.h>
#include <string.h>

#include "mock.h"

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

/* NVML's packed PCI id (device << 16 | vendor) of switch `sw`, for both
 * pciDeviceId and pciSubSystemId: the pcibus simulator gives the switches
 * NVIDIA's vendor and their device id as subsystem ids too.  The id is the
 * daemon's, the one it stages in sysfs (nvswitch_device_id in
 * mokka/simulators/pcibus/endpoints.py).  0 when the engine config names
 * none for it (a hand-written config). */
unsigned mock_nvswitch_pci_id(const struct mock_config *cfg, unsigned sw)
{
    char field[64];
    unsigned long long id = 0;
    snprintf(field, sizeof field, "nvlink.switch.%u.pci_device_id", sw);
    if (!mock_cfg_u64(cfg, field, &id) || id == 0 || id > 0xffff)
        return 0;
    return (unsigned)id << 16 | NVIDIA_VENDOR;
}

/* ------------------------------------------------------- direct GPU meshes */

/* Direct-mesh boards whose wiring is public: how many links join each pair
 * of GPUs, by GPU position. */
static const struct {
    unsigned gpus, links;
    unsigned char pairs[8][8];
} MESHES[] = {
    /* DGX-1 with 8 V100 (six NVLink 2 links each), the hybrid cube-mesh:
     * two quads joined inside and across, some pairs doubled (NVIDIA's
     * "DGX-1 with Tesla V100 System Architecture" white paper; a DGX-1V
     * topology dump in NVIDIA/nccl issue 671: GPU 0 has 1, 1, 2 and 2
     * links to GPUs 1, 2, 3 and 4, GPU 1 has 2, 1 and 2 to GPUs 2, 3, 5). */
    {8, 6, {{0, 1, 1, 2, 2, 0, 0, 0}, {1, 0, 2, 1, 0, 2, 0, 0},
            {1, 2, 0, 2, 0, 0, 1, 0}, {2, 1, 2, 0, 0, 0, 0, 1},
            {2, 0, 0, 0, 0, 1, 1, 2}, {0, 2, 0, 0, 1, 0, 2, 1},
            {0, 0, 1, 0, 1, 2, 0, 2}, {0, 0, 0, 1, 2, 1, 2, 0}}},
};

/* How many links join GPUs `a` and `b` (a != b) of an `n`-GPU mesh whose
 * GPUs have `links` links each; the same number for (b, a).
 *
 * A public board's table; any other board spreads each GPU's links over
 * all its peers, all-to-all as 4-GPU HGX boards are (18 links over 3 peers:
 * NV6 each, NVIDIA/nccl issue 1617) and bridged pairs (every link to the
 * one peer).  What is left after the even share goes to the nearest peers
 * around the ring of positions (both neighbours at distance 1, then 2 ...),
 * then, for an odd remainder, to the GPU opposite (even `n`) or to a
 * partner in pairs (0, 1), (2, 3) ... (odd `n`, where the last GPU keeps
 * one link unwired: an odd number of link ends cannot all pair up). */
static unsigned mesh_pair_links(unsigned n, unsigned links, unsigned a, unsigned b)
{
    for (size_t m = 0; m < MOCK_COUNT(MESHES); m++)
        if (MESHES[m].gpus == n && MESHES[m].links == links)
            return MESHES[m].pairs[a][b];
    unsigned peers = n - 1, extra = links % peers;
    unsigned d = (b + n - a) % n;
    if (n - d < d)
        d = n - d;
    unsigned count = links / peers + (d <= extra / 2);
    if (extra % 2 == 1) {
        if (n % 2 == 0)
            count += 2 * d == n;
        else
            count += a / 2 == b / 2 && a < n - 1 && b < n - 1;
    }
    return count;
}

/* The first of GPU `a`'s links to GPU `b`: a GPU's mesh links go to its
 * peers in position order, in contiguous blocks. */
static unsigned mesh_block_start(unsigned n, unsigned links, unsigned a, unsigned b)
{
    unsigned first = 0;
    for (unsigned c = 0; c < b; c++)
        if (c != a)
            first += mesh_pair_links(n, links, a, c);
    return first;
}

unsigned mock_nvlink_links_between(const struct mock_config *cfg, unsigned a, unsigned b)
{
    unsigned n = cfg->device_count, links = mock_link_count(cfg, a);
    /* the engine config marks a board's links `gpu` only on a direct mesh */
    if (a == b || a >= n || b >= n || links == 0 ||
        !mock_dev_is(cfg, a, "nvlink.link.0.remote_type", "gpu"))
        return 0;
    return mesh_pair_links(n, links, a, b);
}

/* The GPU at the far end of a device's link on a direct mesh: 1 with its
 * position (every device in the engine config, seen by this process or
 * not) and the link of it this one lands on; 0 for a link that is no mesh
 * link (a switch link, no such link) or one the mesh leaves unwired. */
int mock_nvlink_wired_gpu(const struct mock_config *cfg, unsigned pos, unsigned link,
                          unsigned *peer, unsigned *peer_link)
{
    unsigned n = cfg->device_count, links = mock_link_count(cfg, pos);
    if (link >= links || n < 2 || pos >= n)
        return 0;
    char field[64];
    snprintf(field, sizeof field, "nvlink.link.%u.remote_type", link);
    if (!mock_dev_is(cfg, pos, field, "gpu"))
        return 0;
    unsigned first = 0;
    for (unsigned b = 0; b < n; b++) {
        if (b == pos)
            continue;
        unsigned count = mesh_pair_links(n, links, pos, b);
        if (link < first + count) {
            *peer = b;
            *peer_link = mesh_block_start(n, links, b, pos) + (link - first);
            return 1;
        }
        first += count;
    }
    return 0;
}
