/*
 * The part of libibverbs' public ABI the verbs shim speaks, declared here.
 *
 * The project builds without rdma-core's headers, so the few structures
 * and constants an application shares with libibverbs through the calls we
 * interpose are spelled out from the stable ABI (libibverbs.so.1, symbol
 * versions IBVERBS_1.0/1.1, unchanged in layout since rdma-core v13).  Field
 * names and order are rdma-core's <infiniband/verbs.h>; tests/test_ib.py
 * compiles a probe against this header and one against the real header (from
 * Debian's libibverbs-dev) and compares every offset, size and constant.
 *
 * Only what the shim reads or writes is declared; opaque pointers stand in
 * for the objects it never hands out (PDs, CQs, QPs, ...).
 */
#ifndef MOKKA_IBSHIM_ABI_H
#define MOKKA_IBSHIM_ABI_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define IBV_SYSFS_NAME_MAX 64
#define IBV_SYSFS_PATH_MAX 256

enum ibv_node_type {
    IBV_NODE_UNKNOWN = -1,
    IBV_NODE_CA = 1,
    IBV_NODE_SWITCH,
    IBV_NODE_ROUTER,
    IBV_NODE_RNIC,
    IBV_NODE_USNIC,
    IBV_NODE_USNIC_UDP,
    IBV_NODE_UNSPECIFIED,
};

enum ibv_transport_type {
    IBV_TRANSPORT_UNKNOWN = -1,
    IBV_TRANSPORT_IB = 0,
    IBV_TRANSPORT_IWARP,
    IBV_TRANSPORT_USNIC,
    IBV_TRANSPORT_USNIC_UDP,
    IBV_TRANSPORT_UNSPECIFIED,
};

enum ibv_atomic_cap { IBV_ATOMIC_NONE, IBV_ATOMIC_HCA, IBV_ATOMIC_GLOB };

enum ibv_mtu {
    IBV_MTU_256 = 1,
    IBV_MTU_512 = 2,
    IBV_MTU_1024 = 3,
    IBV_MTU_2048 = 4,
    IBV_MTU_4096 = 5,
};

enum ibv_port_state {
    IBV_PORT_NOP = 0,
    IBV_PORT_DOWN = 1,
    IBV_PORT_INIT = 2,
    IBV_PORT_ARMED = 3,
    IBV_PORT_ACTIVE = 4,
    IBV_PORT_ACTIVE_DEFER = 5,
};

enum {
    IBV_LINK_LAYER_UNSPECIFIED,
    IBV_LINK_LAYER_INFINIBAND,
    IBV_LINK_LAYER_ETHERNET,
};

enum ibv_gid_type { IBV_GID_TYPE_IB, IBV_GID_TYPE_ROCE_V1, IBV_GID_TYPE_ROCE_V2 };

/* Private to rdma-core (its driver.h, not installed): the answer of
 * ibv_query_gid_type (IBVERBS_PRIVATE_34), which ibv_devinfo calls. */
enum ibv_gid_type_sysfs { IBV_GID_TYPE_SYSFS_IB_ROCE_V1, IBV_GID_TYPE_SYSFS_ROCE_V2 };

union ibv_gid {
    uint8_t raw[16];
    struct {
        uint64_t subnet_prefix; /* big-endian */
        uint64_t interface_id;  /* big-endian */
    } global;
};

struct ibv_gid_entry {
    union ibv_gid gid;
    uint32_t gid_index;
    uint32_t port_num;
    uint32_t gid_type; /* enum ibv_gid_type */
    uint32_t ndev_ifindex;
};

struct ibv_context;
struct ibv_device;

struct _ibv_device_ops {
    struct ibv_context *(*_dummy1)(struct ibv_device *device, int cmd_fd);
    void (*_dummy2)(struct ibv_context *context);
};

struct ibv_device {
    struct _ibv_device_ops _ops;
    enum ibv_node_type node_type;
    enum ibv_transport_type transport_type;
    char name[IBV_SYSFS_NAME_MAX];       /* kernel device, "mlx5_0" */
    char dev_name[IBV_SYSFS_NAME_MAX];   /* uverbs device, "uverbs0" */
    char dev_path[IBV_SYSFS_PATH_MAX];   /* its infiniband_verbs class entry */
    char ibdev_path[IBV_SYSFS_PATH_MAX]; /* its infiniband class entry */
};

/* struct ibv_context_ops: 32 function pointers (most of them "_compat_"
 * slots).  Applications reach five of them inline (poll_cq,
 * req_notify_cq, post_send, post_recv, post_srq_recv) only through objects
 * the shim never creates, so the slots are one array here. */
#define IBSHIM_CONTEXT_OPS 32
typedef void *(*ibshim_op)(void);

struct ibv_context {
    struct ibv_device *device;
    ibshim_op ops[IBSHIM_CONTEXT_OPS];
    int cmd_fd;
    int async_fd;
    int num_comp_vectors;
    pthread_mutex_t mutex;
    void *abi_compat; /* UINTPTR_MAX marks a struct verbs_context: never here */
};

struct ibv_device_attr {
    char fw_ver[64];
    uint64_t node_guid;      /* big-endian */
    uint64_t sys_image_guid; /* big-endian */
    uint64_t max_mr_size;
    uint64_t page_size_cap;
    uint32_t vendor_id;
    uint32_t vendor_part_id;
    uint32_t hw_ver;
    int max_qp;
    int max_qp_wr;
    unsigned int device_cap_flags;
    int max_sge;
    int max_sge_rd;
    int max_cq;
    int max_cqe;
    int max_mr;
    int max_pd;
    int max_qp_rd_atom;
    int max_ee_rd_atom;
    int max_res_rd_atom;
    int max_qp_init_rd_atom;
    int max_ee_init_rd_atom;
    enum ibv_atomic_cap atomic_cap;
    int max_ee;
    int max_rdd;
    int max_mw;
    int max_raw_ipv6_qp;
    int max_raw_ethy_qp;
    int max_mcast_grp;
    int max_mcast_qp_attach;
    int max_total_mcast_qp_attach;
    int max_ah;
    int max_fmr;
    int max_map_per_fmr;
    int max_srq;
    int max_srq_wr;
    int max_srq_sge;
    uint16_t max_pkeys;
    uint8_t local_ca_ack_delay;
    uint8_t phys_port_cnt;
};

/* The port attributes as the exported ibv_query_port fills them: the
 * "compat" prefix of today's struct ibv_port_attr, up to and including
 * `flags`.  Newer fields (port_cap_flags2, ...) follow in the caller's
 * struct; the inline wrapper in verbs.h zeroes them before the call, and
 * the shim never writes past `flags`, so an application built against any
 * rdma-core version gets a consistent answer. */
struct ibv_port_attr {
    enum ibv_port_state state;
    enum ibv_mtu max_mtu;
    enum ibv_mtu active_mtu;
    int gid_tbl_len;
    uint32_t port_cap_flags;
    uint32_t max_msg_sz;
    uint32_t bad_pkey_cntr;
    uint32_t qkey_viol_cntr;
    uint16_t pkey_tbl_len;
    uint16_t lid;
    uint16_t sm_lid;
    uint8_t lmc;
    uint8_t max_vl_num;
    uint8_t sm_sl;
    uint8_t subnet_timeout;
    uint8_t init_type_reply;
    uint8_t active_width;
    uint8_t active_speed;
    uint8_t phys_state;
    uint8_t link_layer;
    uint8_t flags;
};

#endif
