/*
 * nvmlInternalGetExportTable: the private table nvidia-smi asks for.
 *
 * nvidia-smi 535 calls it right after nvmlInitWithFlags with one GUID and
 * exits with "Mismatch in versions between nvidia-smi and NVML" unless it
 * succeeds.  The table is an array of pointer-sized slots; slot 0 holds the
 * table's size in bytes, and nvidia-smi guards every slot it reads with
 * `size > offset` and a NULL check.  A NULL slot prints N/A; a table that
 * is too small prints "Uninitialized" for the fields behind the missing
 * slots.  The smallest table that satisfies every guard nvidia-smi 535
 * evaluates is MOCK_EXPORT_TABLE_BYTES (tests/test_nvidia_smi_real.py proves
 * it by building one slot smaller).  Only slot 23 is filled: `topo -m` uses
 * it to ask the PCI path between two bus ids.
 */
#include <pthread.h>
#include <string.h>

#include "mock.h"

/* Size in bytes nvidia-smi 535 must see: the highest slot it guards is at
 * offset 0x798 (`size > 0x798`), so 0x7a0 bytes is the smallest table that
 * prints no "Uninitialized".  Overridable at build time for that proof. */
#ifndef MOCK_EXPORT_TABLE_BYTES
#define MOCK_EXPORT_TABLE_BYTES 0x7a0
#endif
#define EXPORT_TABLE_SLOTS (MOCK_EXPORT_TABLE_BYTES / sizeof(void *))
#define SLOT_TOPOLOGY_LEVEL 23

/* The GUID nvidia-smi passes: 6c3efec4-8fc9-4e6c-a327-ee696e12f7c4, in
 * the byte order of a Windows-style GUID struct (first three groups
 * little-endian), which is how NVIDIA lays out its export table ids. */
static const unsigned char SMI_TABLE_GUID[16] = {
    0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e,
    0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4,
};

/* PCI path levels as `topo -m` numbers them. */
enum smi_level { SMI_PIX = 0, SMI_PXB = 1, SMI_PHB = 2, SMI_NODE = 3, SMI_SYS = 4 };

/* Slot 23: (busIdA, busIdB, &level) -> 0 on success. */
static int topology_level(const char *bus_a, const char *bus_b, unsigned int *level)
{
    if (bus_a == NULL || bus_b == NULL || level == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_config *cfg = mock_acquire();
    if (cfg == NULL)
        return NVML_ERROR_UNINITIALIZED;
    unsigned a, b;
    *level = SMI_SYS;
    if (mock_find_bus_id(cfg, bus_a, &a) && mock_find_bus_id(cfg, bus_b, &b)) {
        switch (mock_topology_level(cfg, a, b)) {
        case NVML_TOPOLOGY_INTERNAL:
        case NVML_TOPOLOGY_SINGLE: *level = SMI_PIX; break;
        case NVML_TOPOLOGY_MULTIPLE: *level = SMI_PXB; break;
        case NVML_TOPOLOGY_HOSTBRIDGE: *level = SMI_PHB; break;
        case NVML_TOPOLOGY_NODE: *level = SMI_NODE; break;
        default: *level = SMI_SYS; break;
        }
    }
    mock_release(cfg);
    return NVML_SUCCESS;
}

_Static_assert(EXPORT_TABLE_SLOTS > SLOT_TOPOLOGY_LEVEL, "export table too small for slot 23");
static const void *g_table[EXPORT_TABLE_SLOTS];
static pthread_once_t g_table_once = PTHREAD_ONCE_INIT;

static void build_table(void)
{
    g_table[0] = (const void *)(uintptr_t)MOCK_EXPORT_TABLE_BYTES;
    g_table[SLOT_TOPOLOGY_LEVEL] = (const void *)(uintptr_t)&topology_level;
}

MOCK_API nvmlReturn_t nvmlInternalGetExportTable(const void **ppExportTable,
                                                 const unsigned char *pExportTableId)
{
    if (ppExportTable == NULL || pExportTableId == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memcmp(pExportTableId, SMI_TABLE_GUID, sizeof SMI_TABLE_GUID) != 0) {
        mock_debug("export table requested for an unknown id");
        return NVML_ERROR_NOT_SUPPORTED;
    }
    pthread_once(&g_table_once, build_table);
    *ppExportTable = g_table;
    return NVML_SUCCESS;
}
