/*
 * The query entry points of libibverbs: device, port, GID and P_Key
 * attributes, answered from the mock tree for the devices verbs.c hands out
 * (ibv_devinfo, ibv_devices and topology probes call them).
 *
 * Apart from verbs.c, which owns the devices' life (list, open, close) and
 * the calls with no data path: these only read the tree, one attribute at
 * a time, and are most of what a mock HCA must get right.
 *
 * Return conventions follow libibverbs: the query calls that read sysfs
 * there (ibv_query_gid, ibv_query_pkey, ibv_query_gid_type,
 * ibv_get_pkey_index) return -1 on failure, the others an errno value.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "ibshim.h"

/* Values no sysfs file carries, as a ConnectX-7 reports them (ibv_devinfo -v). */
#define MLX_IB_VENDOR_ID 0x02c9 /* Mellanox's IEEE OUI, what mlx5 reports as vendor_id */
#define MELLANOX_PCI_VENDOR 0x15b3
#define MAX_MSG_SZ 0x40000000u
#define MAX_VL_NUM 3 /* encoding of 4 data VLs */
#define SUBNET_TIMEOUT 18

/* Prototypes of the exported functions (their declarations live in
 * rdma-core's headers, which the build does not use). */
IBSHIM_EXPORT int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *attr);
IBSHIM_EXPORT int ibv_query_port(struct ibv_context *context, uint8_t port_num,
                                 struct ibv_port_attr *attr);
IBSHIM_EXPORT int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index,
                                union ibv_gid *gid);
IBSHIM_EXPORT int ibv_query_pkey(struct ibv_context *context, uint8_t port_num, int index,
                                 uint16_t *pkey);
IBSHIM_EXPORT int ibv_get_pkey_index(struct ibv_context *context, uint8_t port_num,
                                     uint16_t pkey);
IBSHIM_EXPORT int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num,
                                     unsigned int index, enum ibv_gid_type_sysfs *type);
IBSHIM_EXPORT int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num,
                                    uint32_t gid_index, struct ibv_gid_entry *entry,
                                    uint32_t flags, size_t entry_size);
IBSHIM_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *context,
                                           struct ibv_gid_entry *entries, size_t max_entries,
                                           uint32_t flags, size_t entry_size);

/* ---- queries ------------------------------------------------------------ */

/* Ports of the context's HCA, and whether `port` is one of them. */
static int valid_port(struct ibv_context *context, uint32_t port)
{
    int ports = ibshim_count_entries(context->device->name, "ports");
    return port >= 1 && port <= (uint32_t)ports;
}

int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *attr)
{
    if (!ibshim_active()) {
        __typeof__(&ibv_query_device) real = REAL(ibv_query_device);
        return real != NULL ? real(context, attr) : ENOSYS;
    }
    const char *name = context->device->name;
    char text[128];
    memset(attr, 0, sizeof *attr);
    /* Read straight into the 64-byte field: a longer version is cut, as
     * the kernel's own 64-byte buffer would cut it. */
    if (ibshim_read_attr(name, "fw_ver", attr->fw_ver, sizeof attr->fw_ver) < 0)
        return errno != 0 ? errno : EIO;
    if (ibshim_read_attr(name, "node_guid", text, sizeof text) >= 0)
        attr->node_guid = ibshim_parse_guid_be(text);
    if (ibshim_read_attr(name, "sys_image_guid", text, sizeof text) >= 0)
        attr->sys_image_guid = ibshim_parse_guid_be(text);
    long long pci_vendor = ibshim_read_number(name, "device/vendor");
    long long pci_device = ibshim_read_number(name, "device/device");
    long long hw_rev = ibshim_read_number(name, "hw_rev");
    attr->vendor_id = pci_vendor == MELLANOX_PCI_VENDOR ? MLX_IB_VENDOR_ID
                                                        : (uint32_t)(pci_vendor < 0 ? 0 : pci_vendor);
    attr->vendor_part_id = (uint32_t)(pci_device < 0 ? 0 : pci_device);
    attr->hw_ver = (uint32_t)(hw_rev < 0 ? 0 : hw_rev);
    attr->phys_port_cnt = (uint8_t)ibshim_count_entries(name, "ports");
    /* Limits as a ConnectX-7 reports them: nothing reads them from sysfs,
     * and the mock has no data path to enforce them. */
    attr->max_mr_size = UINT64_MAX;
    attr->page_size_cap = 0xfffffffffffff000ull;
    attr->max_qp = 131072;
    attr->max_qp_wr = 32768;
    attr->device_cap_flags = 0x21361c36;
    attr->max_sge = 30;
    attr->max_sge_rd = 30;
    attr->max_cq = 16777216;
    attr->max_cqe = 4194303;
    attr->max_mr = 16777216;
    attr->max_pd = 8388608;
    attr->max_qp_rd_atom = 16;
    attr->max_res_rd_atom = 2097152;
    attr->max_qp_init_rd_atom = 16;
    attr->atomic_cap = IBV_ATOMIC_HCA;
    attr->max_mw = 16777216;
    attr->max_mcast_grp = 2097152;
    attr->max_mcast_qp_attach = 240;
    attr->max_total_mcast_qp_attach = 503316480;
    attr->max_ah = 2147483647;
    attr->max_srq = 8388608;
    attr->max_srq_wr = 32767;
    attr->max_srq_sge = 31;
    attr->max_pkeys = (uint16_t)ibshim_count_entries(name, "ports/1/pkeys");
    attr->local_ca_ack_delay = 16;
    return 0;
}

/* "400 Gb/sec (4X NDR)" -> IBV_WIDTH_* and IBV_SPEED_* encodings. */
static void parse_rate(const char *text, uint8_t *width, uint8_t *speed)
{
    static const struct {
        const char *name;
        uint8_t code;
    } speeds[] = {{"SDR", 1}, {"DDR", 2}, {"QDR", 4}, {"FDR10", 8},
                  {"FDR", 16}, {"EDR", 32}, {"HDR", 64}, {"NDR", 128}};
    static const uint8_t widths[][2] = {{1, 1}, {4, 2}, {8, 4}, {12, 8}, {2, 16}};
    unsigned lanes = 0;
    char name[16] = "";
    const char *open = strchr(text, '(');
    *width = 0;
    *speed = 0;
    if (open == NULL || sscanf(open, "(%uX %15[A-Z0-9]", &lanes, name) < 1)
        return;
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
        if (widths[i][0] == lanes)
            *width = widths[i][1];
    /* XDR (and anything newer) has no 8-bit encoding: this ABI's
     * active_speed cannot name it, so it stays 0. */
    for (size_t i = 0; i < sizeof speeds / sizeof speeds[0]; i++)
        if (strcmp(speeds[i].name, name) == 0)
            *speed = speeds[i].code;
}

/* "ports/<port>/<attr>" */
static long long port_number(const char *name, uint32_t port, const char *attr)
{
    char rel[64];
    snprintf(rel, sizeof rel, "ports/%u/%s", port, attr);
    return ibshim_read_number(name, rel);
}

int ibv_query_port(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *attr)
{
    if (!ibshim_active()) {
        __typeof__(&ibv_query_port) real = REAL(ibv_query_port);
        return real != NULL ? real(context, port_num, attr) : ENOSYS;
    }
    const char *name = context->device->name;
    if (!valid_port(context, port_num))
        return EINVAL;
    char rel[64], text[128];
    memset(attr, 0, sizeof *attr); /* only the compat prefix: see ibshim_abi.h */
    long long state = port_number(name, port_num, "state");
    long long phys = port_number(name, port_num, "phys_state");
    long long lid = port_number(name, port_num, "lid");
    long long sm_lid = port_number(name, port_num, "sm_lid");
    long long sm_sl = port_number(name, port_num, "sm_sl");
    long long lmc = port_number(name, port_num, "lid_mask_count");
    long long cap = port_number(name, port_num, "cap_mask");
    if (state < 0 || phys < 0 || lid < 0 || sm_lid < 0 || cap < 0)
        return EIO;
    attr->state = (enum ibv_port_state)state;
    attr->phys_state = (uint8_t)phys;
    attr->lid = (uint16_t)lid;
    attr->sm_lid = (uint16_t)sm_lid;
    attr->sm_sl = (uint8_t)(sm_sl < 0 ? 0 : sm_sl);
    attr->lmc = (uint8_t)(lmc < 0 ? 0 : lmc);
    attr->port_cap_flags = (uint32_t)cap;
    snprintf(rel, sizeof rel, "ports/%u/rate", port_num);
    if (ibshim_read_attr(name, rel, text, sizeof text) >= 0)
        parse_rate(text, &attr->active_width, &attr->active_speed);
    snprintf(rel, sizeof rel, "ports/%u/link_layer", port_num);
    attr->link_layer = IBV_LINK_LAYER_INFINIBAND;
    if (ibshim_read_attr(name, rel, text, sizeof text) >= 0 && strcmp(text, "Ethernet") == 0)
        attr->link_layer = IBV_LINK_LAYER_ETHERNET;
    snprintf(rel, sizeof rel, "ports/%u/gids", port_num);
    attr->gid_tbl_len = ibshim_count_entries(name, rel);
    snprintf(rel, sizeof rel, "ports/%u/pkeys", port_num);
    attr->pkey_tbl_len = (uint16_t)ibshim_count_entries(name, rel);
    attr->max_mtu = IBV_MTU_4096;
    attr->active_mtu = IBV_MTU_4096;
    attr->max_msg_sz = MAX_MSG_SZ;
    attr->max_vl_num = MAX_VL_NUM;
    attr->subnet_timeout = SUBNET_TIMEOUT;
    return 0;
}

/* GID `index` of `port`: 0 and the GID; ENODATA for an empty entry (no
 * file, as the kernel has for unpopulated entries); EINVAL out of range. */
static int read_gid(struct ibv_context *context, uint32_t port, uint32_t index,
                    union ibv_gid *gid)
{
    const char *name = context->device->name;
    char rel[64], text[128];
    if (!valid_port(context, port))
        return EINVAL;
    snprintf(rel, sizeof rel, "ports/%u/gids", port);
    if (index >= (uint32_t)ibshim_count_entries(name, rel))
        return EINVAL;
    snprintf(rel, sizeof rel, "ports/%u/gids/%u", port, index);
    memset(gid, 0, sizeof *gid);
    if (ibshim_read_attr(name, rel, text, sizeof text) < 0)
        return ENODATA;
    if (ibshim_parse_gid(text, gid) < 0)
        return EIO;
    static const union ibv_gid zero;
    return memcmp(gid, &zero, sizeof zero) == 0 ? ENODATA : 0;
}

int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid)
{
    if (!ibshim_active()) {
        __typeof__(&ibv_query_gid) real = REAL(ibv_query_gid);
        return real != NULL ? real(context, port_num, index, gid) : -1;
    }
    if (index < 0)
        return -1;
    int rc = read_gid(context, port_num, (uint32_t)index, gid);
    /* libibverbs reports an empty entry as the zero GID, successfully. */
    return rc == 0 || rc == ENODATA ? 0 : -1;
}

int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index,
                       enum ibv_gid_type_sysfs *type)
{
    if (!ibshim_active()) {
        __typeof__(&ibv_query_gid_type) real = REAL(ibv_query_gid_type);
        return real != NULL ? real(context, port_num, index, type) : -1;
    }
    char rel[64], text[64];
    if (!valid_port(context, port_num))
        return -1;
    snprintf(rel, sizeof rel, "ports/%u/gid_attrs/types/%u", port_num, index);
    *type = IBV_GID_TYPE_SYSFS_IB_ROCE_V1; /* what an IB port's entries are */
    if (ibshim_read_attr(context->device->name, rel, text, sizeof text) >= 0 &&
        strcmp(text, "RoCE v2") == 0)
        *type = IBV_GID_TYPE_SYSFS_ROCE_V2;
    return 0;
}

static void fill_entry(struct ibv_gid_entry *entry, const union ibv_gid *gid, uint32_t port,
                       uint32_t index)
{
    memset(entry, 0, sizeof *entry);
    entry->gid = *gid;
    entry->gid_index = index;
    entry->port_num = port;
    entry->gid_type = IBV_GID_TYPE_IB;
}

int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
                      struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
    if (!ibshim_active()) {
        __typeof__(&_ibv_query_gid_ex) real = REAL(_ibv_query_gid_ex);
        return real != NULL ? real(context, port_num, gid_index, entry, flags, entry_size)
                            : ENOSYS;
    }
    if (flags != 0 || entry_size < sizeof *entry)
        return EINVAL;
    union ibv_gid gid;
    int rc = read_gid(context, port_num, gid_index, &gid);
    if (rc == 0)
        fill_entry(entry, &gid, port_num, gid_index);
    return rc;
}

ssize_t _ibv_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries,
                             size_t max_entries, uint32_t flags, size_t entry_size)
{
    if (!ibshim_active()) {
        __typeof__(&_ibv_query_gid_table) real = REAL(_ibv_query_gid_table);
        return real != NULL ? real(context, entries, max_entries, flags, entry_size) : -ENOSYS;
    }
    if (flags != 0 || entry_size < sizeof *entries)
        return -EINVAL;
    /* Entries are entry_size apart: callers built against a newer, larger
     * struct pass their size. */
    size_t count = 0;
    int ports = ibshim_count_entries(context->device->name, "ports");
    for (uint32_t port = 1; port <= (uint32_t)ports; port++) {
        char rel[64];
        snprintf(rel, sizeof rel, "ports/%u/gids", port);
        int len = ibshim_count_entries(context->device->name, rel);
        for (uint32_t index = 0; index < (uint32_t)len; index++) {
            union ibv_gid gid;
            if (read_gid(context, port, index, &gid) != 0)
                continue;
            if (count == max_entries)
                return -EINVAL; /* as libibverbs: the table does not fit */
            struct ibv_gid_entry *slot =
                (struct ibv_gid_entry *)((char *)entries + count * entry_size);
            fill_entry(slot, &gid, port, index);
            count++;
        }
    }
    return (ssize_t)count;
}

int ibv_query_pkey(struct ibv_context *context, uint8_t port_num, int index, uint16_t *pkey)
{
    if (!ibshim_active()) {
        __typeof__(&ibv_query_pkey) real = REAL(ibv_query_pkey);
        return real != NULL ? real(context, port_num, index, pkey) : -1;
    }
    char rel[64];
    if (!valid_port(context, port_num) || index < 0)
        return -1;
    snprintf(rel, sizeof rel, "ports/%u/pkeys/%d", port_num, index);
    long long value = ibshim_read_number(context->device->name, rel);
    if (value < 0 || value > 0xffff)
        return -1;
    *pkey = __builtin_bswap16((uint16_t)value); /* network byte order */
    return 0;
}

int ibv_get_pkey_index(struct ibv_context *context, uint8_t port_num, uint16_t pkey)
{
    if (!ibshim_active()) {
        __typeof__(&ibv_get_pkey_index) real = REAL(ibv_get_pkey_index);
        return real != NULL ? real(context, port_num, pkey) : -1;
    }
    char rel[64];
    snprintf(rel, sizeof rel, "ports/%u/pkeys", port_num);
    int len = ibshim_count_entries(context->device->name, rel);
    for (int index = 0; index < len; index++) {
        uint16_t value;
        if (ibv_query_pkey(context, port_num, index, &value) == 0 && value == pkey)
            return index;
    }
    return -1;
}
