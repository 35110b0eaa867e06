/*
 * Fuzz driver for the mock NVML library (tests/test_nvml_fuzz.py).
 *
 * For each engine config named on the command line it points
 * MOCK_NVML_CONFIG at the file, calls nvmlInit and, when that succeeds,
 * sweeps every implemented getter with good and bad arguments, checking the
 * answers against NVML's contract (strings terminated inside the buffer,
 * memory figures that add up, lists no longer than the room given, Xids
 * delivered a bounded number of times, known return codes...).  It is built
 * with the same sanitizers as the library, so a memory error or undefined
 * behaviour in the library ends the run with a report; caller buffers are
 * allocated at their exact size, so an overrun hits a redzone.
 *
 * The per-device part of the sweep is tests/nvml_fuzz_device.c.
 *
 * Output (stdout, unbuffered), per config:
 *   config <path>
 *   init <nvmlReturn>
 *   device <index> uuid <escaped or !rc> memory <bytes or !rc>   (per device)
 *   violation <what>                                              (any number)
 *   done <calls>
 * A config that takes longer than SECONDS prints "hang" and exits with 3.
 *
 * usage: nvml_fuzz_driver SECONDS CONFIG...
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nvml_fuzz_driver.h"

/* nvidia-smi's private entry point: the header does not declare it. */
nvmlReturn_t nvmlInternalGetExportTable(const void **table, const unsigned char *id);

nvmlDevice_t g_handles[64];
static unsigned long g_calls; /* NVML calls for the current config */

void violation(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("violation ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

nvmlReturn_t rc(const char *what, nvmlReturn_t r)
{
    g_calls++;
    if (!((r >= NVML_SUCCESS && r <= NVML_ERROR_RESET_TYPE_NOT_SUPPORTED) ||
          r == NVML_ERROR_UNKNOWN))
        violation("%s returned unknown code %d", what, (int)r);
    return r;
}

int handle_index(nvmlDevice_t handle, unsigned count, unsigned *index)
{
    for (unsigned i = 0; i < count; i++) {
        if (g_handles[i] == handle) {
            *index = i;
            return 1;
        }
    }
    return 0;
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "hang\n";
    ssize_t ignored = write(1, msg, sizeof msg - 1);
    (void)ignored;
    _exit(3);
}

/* Prints a config string with anything outside printable ASCII escaped,
 * so the test can compare it with its own reading of the file. */
static void print_escaped(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p > 0x20 && *p < 0x7f && *p != '\\')
            putchar(*p);
        else
            printf("\\x%02x", *p);
    }
}

/* ---------------------------------------------------------------- events */

static void check_events(unsigned count)
{
    nvmlEventSet_t set;
    if (CALL(nvmlEventSetCreate(&set)) != NVML_SUCCESS)
        return;
    for (unsigned i = 0; i < count; i++)
        CALL(nvmlDeviceRegisterEvents(g_handles[i], nvmlEventTypeXidCriticalError, set));
    nvmlEventData_t data;
    unsigned delivered = 0;
    while (CALL(nvmlEventSetWait_v2(set, &data, 0)) == NVML_SUCCESS) {
        unsigned index;
        if (!handle_index(data.device, count, &index))
            violation("xid event for a device that is not visible");
        if (++delivered > EVENT_LIMIT) {
            violation("more than %d xid events", EVENT_LIMIT);
            break;
        }
    }
    nvmlEventData_t v1;
    CALL(nvmlEventSetWait(set, &v1, 0));
    CALL(nvmlEventSetFree(set));
}

/* ------------------------------------------------------------------ system */

static void check_system(unsigned count, const unsigned *pids, unsigned npids)
{
    static const unsigned lengths[] = {0, 1, 8, 80, 4097};
    for (size_t i = 0; i < sizeof lengths / sizeof *lengths; i++) {
        unsigned len = lengths[i];
        char *buf = malloc(len ? len : 1);
        if (CALL(nvmlSystemGetDriverVersion(buf, len)) == NVML_SUCCESS &&
            memchr(buf, '\0', len) == NULL)
            violation("driver version: unterminated");
        if (CALL(nvmlSystemGetNVMLVersion(buf, len)) == NVML_SUCCESS &&
            memchr(buf, '\0', len) == NULL)
            violation("nvml version: unterminated");
        for (unsigned p = 0; p < npids; p++)
            if (CALL(nvmlSystemGetProcessName(pids[p], buf, len)) == NVML_SUCCESS &&
                memchr(buf, '\0', len) == NULL)
                violation("process name: unterminated");
        free(buf);
    }
    char name[64];
    CALL(nvmlSystemGetProcessName(0xfffffff0u, name, sizeof name));
    int cuda;
    CALL(nvmlSystemGetCudaDriverVersion_v2(&cuda));
    CALL(nvmlSystemGetCudaDriverVersion(&cuda));
    unsigned value;
    CALL(nvmlSystemGetHicVersion(&value, NULL));
    CALL(nvmlUnitGetCount(&value));
    CALL(nvmlGetExcludedDeviceCount(&value));
    unsigned set_count = 0;
    /* CPU 0's GPUs: those whose affinity holds it, never more than are visible. */
    if (CALL(nvmlSystemGetTopologyGpuSet(0, &set_count, NULL)) == NVML_SUCCESS &&
        set_count > count)
        violation("gpu set of %u devices, %u visible", set_count, count);
    /* Lookups by hostile keys. */
    static const char *const junk[] = {"", ":", "zz:zz.z", "ffffffff:ff:ff.f",
                                       "00000000:00:00.0", "GPU-", "%s%n"};
    nvmlDevice_t found;
    for (size_t i = 0; i < sizeof junk / sizeof *junk; i++) {
        CALL(nvmlDeviceGetHandleByPciBusId_v2(junk[i], &found));
        CALL(nvmlDeviceGetHandleByUUID(junk[i], &found));
        CALL(nvmlDeviceGetHandleBySerial(junk[i], &found));
    }
    char huge[8192];
    memset(huge, 'f', sizeof huge - 1);
    huge[sizeof huge - 1] = '\0';
    CALL(nvmlDeviceGetHandleByPciBusId_v2(huge, &found));
    CALL(nvmlDeviceGetHandleByUUID(huge, &found));
    nvmlUUID_t uuid = {.version = nvmlUUID_v1, .type = NVML_UUID_TYPE_ASCII};
    memset(uuid.value.str, 'A', sizeof uuid.value.str);
    CALL(nvmlDeviceGetHandleByUUIDV(&uuid, &found));
    /* Bad handles. */
    nvmlDevice_t bogus[] = {NULL, (nvmlDevice_t)(uintptr_t)1, (nvmlDevice_t)name};
    for (size_t i = 0; i < sizeof bogus / sizeof *bogus; i++) {
        unsigned u;
        if (CALL(nvmlDeviceGetIndex(bogus[i], &u)) == NVML_SUCCESS)
            violation("index of a bogus handle");
        CALL(nvmlDeviceGetName(bogus[i], name, sizeof name));
    }
    if (CALL(nvmlDeviceGetHandleByIndex_v2(count, &found)) == NVML_SUCCESS)
        violation("handle for index %u of %u", count, count);
    /* nvidia-smi's private table: slot 23 asks the path between two bus ids. */
    static const unsigned char guid[16] = {0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e,
                                           0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4};
    const void *table_ptr;
    if (CALL(nvmlInternalGetExportTable(&table_ptr, guid)) == NVML_SUCCESS) {
        const void *const *table = table_ptr;
        int (*level_of)(const char *, const char *, unsigned *) =
            (int (*)(const char *, const char *, unsigned *))table[23];
        for (unsigned a = 0; a < count && a < 8; a++) {
            for (unsigned b = 0; b < count && b < 8; b++) {
                nvmlPciInfo_t pa, pb;
                unsigned level;
                if (nvmlDeviceGetPciInfo_v3(g_handles[a], &pa) == NVML_SUCCESS &&
                    nvmlDeviceGetPciInfo_v3(g_handles[b], &pb) == NVML_SUCCESS)
                    rc("export slot 23", (nvmlReturn_t)level_of(pa.busId, pb.busId, &level));
            }
        }
        unsigned level;
        rc("export slot 23", (nvmlReturn_t)level_of("zz", huge, &level));
    }
}

/* -------------------------------------------------------------------- main */

static void sweep(void)
{
    unsigned count = 0, count_v1 = 0;
    if (CALL(nvmlDeviceGetCount_v2(&count)) != NVML_SUCCESS)
        return;
    CALL(nvmlDeviceGetCount(&count_v1));
    if (count != count_v1)
        violation("device count %u, v1 says %u", count, count_v1);
    if (count > 64) {
        violation("%u devices", count);
        count = 64;
    }
    for (unsigned i = 0; i < count; i++) {
        if (CALL(nvmlDeviceGetHandleByIndex_v2(i, &g_handles[i])) != NVML_SUCCESS) {
            violation("no handle for index %u of %u", i, count);
            return;
        }
        unsigned index = ~0u;
        if (CALL(nvmlDeviceGetIndex(g_handles[i], &index)) != NVML_SUCCESS || index != i)
            violation("handle %u reports index %u", i, index);
    }
    unsigned pids[64], npids = 0;
    for (unsigned i = 0; i < count; i++) {
        nvmlDevice_t dev = g_handles[i];
        char uuid[96];
        nvmlMemory_t memory;
        printf("device %u uuid ", i);
        nvmlReturn_t r = CALL(nvmlDeviceGetUUID(dev, uuid, sizeof uuid));
        if (r == NVML_SUCCESS)
            print_escaped(uuid);
        else
            printf("!%d", (int)r);
        r = CALL(nvmlDeviceGetMemoryInfo(dev, &memory));
        if (r == NVML_SUCCESS)
            printf(" memory %llu\n", memory.total);
        else
            printf(" memory !%d\n", (int)r);
        check_strings(dev);
        check_scalars(dev);
        check_memory(dev);
        check_lists(dev, pids, &npids);
        check_pci(dev, count);
        check_nvlink(dev);
        check_telemetry(dev);
    }
    check_events(count);
    check_system(count, pids, npids);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: nvml_fuzz_driver SECONDS CONFIG...\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IONBF, 0);
    signal(SIGALRM, on_alarm);
    unsigned seconds = (unsigned)atoi(argv[1]);
    for (int i = 2; i < argc; i++) {
        printf("config %s\n", argv[i]);
        setenv("MOCK_NVML_CONFIG", argv[i], 1);
        g_calls = 0;
        alarm(seconds);
        nvmlReturn_t r = CALL(nvmlInit_v2());
        printf("init %d\n", (int)r);
        if (r == NVML_SUCCESS) {
            sweep();
            if (CALL(nvmlShutdown()) != NVML_SUCCESS)
                violation("shutdown failed");
        }
        /* Calls after shutdown answer UNINITIALIZED, never crash. */
        unsigned count;
        if (CALL(nvmlDeviceGetCount_v2(&count)) != NVML_ERROR_UNINITIALIZED)
            violation("device count after shutdown");
        alarm(0);
        printf("done %lu\n", g_calls);
    }
    return 0;
}
