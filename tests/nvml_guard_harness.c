/*
 * The fixed runtime of the guard-page harness (see nvml_guard_harness.h):
 * the guarded allocator, the fault report, and the frame that initializes
 * the library and runs every generated sweep on every device, with the
 * guard page after each buffer (overruns) and then before it (underruns).
 *
 * usage: nvml_guard MAX_DEVICES SIDES
 *   MAX_DEVICES  how many devices to sweep (0: all)
 *   SIDES        1: guard after each buffer only; 2: after, then before
 *
 * Prints the sweeps run, the frame functions and the call count, then
 * "OK"; a fault prints "FAULT <function> ..." and exits 70.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "nvml_guard_harness.h"

enum { SIDE_AFTER = 0, SIDE_BEFORE = 1 };

static int g_side = SIDE_AFTER;
static size_t g_page;
static struct {
    void *base;
    size_t length;
} g_maps[64];
static size_t g_map_count;
static const char *volatile g_name = "(none)";
static volatile unsigned g_variant, g_device;
static unsigned long long g_calls;

void *guard_buf(size_t size)
{
    if (g_map_count == sizeof g_maps / sizeof *g_maps) {
        fprintf(stderr, "harness: more than %zu buffers in one call\n", g_map_count);
        exit(2);
    }
    size_t pages = (size + g_page - 1) / g_page;
    size_t length = (pages + 1) * g_page;
    char *base = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
        perror("harness: mmap");
        exit(2);
    }
    g_maps[g_map_count].base = base;
    g_maps[g_map_count].length = length;
    g_map_count++;
    char *guard = g_side == SIDE_AFTER ? base + pages * g_page : base;
    if (mprotect(guard, g_page, PROT_NONE) != 0) {
        perror("harness: mprotect");
        exit(2);
    }
    if (size == 0)
        return guard; /* nothing may be written through it at all */
    return g_side == SIDE_AFTER ? guard - size : base + g_page;
}

void guard_release(void)
{
    for (size_t i = 0; i < g_map_count; i++)
        munmap(g_maps[i].base, g_maps[i].length);
    g_map_count = 0;
}

void guard_call(const char *name, unsigned variant)
{
    g_name = name;
    g_variant = variant;
    g_calls++;
}

static void on_fault(int sig)
{
    /* Only async-signal-safe calls here. */
    char line[512];
    int n = snprintf(line, sizeof line, "FAULT %s variant=%u device=%u side=%s signal=%d\n",
                     g_name, g_variant, g_device, g_side == SIDE_AFTER ? "after" : "before",
                     sig);
    if (n > 0)
        write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
    _exit(70);
}

static void sweep_all(const struct guard_ctx *x)
{
    for (size_t i = 0; i < GUARD_SWEEP_COUNT; i++) {
        GUARD_SWEEPS[i].run(x);
        guard_release();
    }
}

static void must(const char *what, nvmlReturn_t r)
{
    if (r != NVML_SUCCESS) {
        fprintf(stderr, "harness: %s: %s\n", what, nvmlErrorString(r));
        exit(2);
    }
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s MAX_DEVICES SIDES\n", argv[0]);
        return 2;
    }
    unsigned max_devices = (unsigned)strtoul(argv[1], NULL, 10);
    int sides = atoi(argv[2]);
    g_page = (size_t)sysconf(_SC_PAGESIZE);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fault;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);

    /* Before nvmlInit every call must fail cleanly, whatever it is given. */
    struct guard_ctx none = {.uuid = "", .serial = "", .bus_id = ""};
    sweep_all(&none);

    /* The reference count: three inits need three shutdowns. */
    must("nvmlInitWithFlags", nvmlInitWithFlags(0));
    must("nvmlInit_v2", nvmlInit_v2());
    must("nvmlInit", nvmlInit());
    must("nvmlShutdown", nvmlShutdown());
    must("nvmlShutdown", nvmlShutdown());

    unsigned count = 0;
    must("nvmlDeviceGetCount_v2", nvmlDeviceGetCount_v2(&count));
    if (max_devices == 0 || max_devices > count)
        max_devices = count;
    for (int side = 0; side < sides; side++) {
        g_side = side;
        for (unsigned i = 0; i < max_devices; i++) {
            static char uuid[96], serial[96], bus_id[32];
            struct guard_ctx x = {.index = i, .uuid = uuid, .serial = serial, .bus_id = bus_id};
            g_device = i;
            must("nvmlDeviceGetHandleByIndex_v2", nvmlDeviceGetHandleByIndex_v2(i, &x.dev));
            must("nvmlDeviceGetHandleByIndex_v2",
                 nvmlDeviceGetHandleByIndex_v2((i + 1) % count, &x.peer));
            /* Identity answers even for a lost GPU. */
            must("nvmlDeviceGetUUID", nvmlDeviceGetUUID(x.dev, uuid, sizeof uuid));
            nvmlPciInfo_t pci;
            must("nvmlDeviceGetPciInfo_v3", nvmlDeviceGetPciInfo_v3(x.dev, &pci));
            memcpy(bus_id, pci.busId, sizeof bus_id);
            if (nvmlDeviceGetSerial(x.dev, serial, sizeof serial) != NVML_SUCCESS)
                serial[0] = '\0';

            /* Two GPM samples for the metrics query; a board without GPM
             * leaves them NULL, which the calls must refuse cleanly. */
            for (int k = 0; k < 2; k++)
                if (nvmlGpmSampleAlloc(&x.gpm[k]) != NVML_SUCCESS ||
                    nvmlGpmSampleGet(x.dev, x.gpm[k]) != NVML_SUCCESS) {
                    if (x.gpm[k] != NULL)
                        nvmlGpmSampleFree(x.gpm[k]);
                    x.gpm[k] = NULL;
                }

            guard_call("nvmlEventSetCreate", 0);
            nvmlEventSet_t *set = guard_buf(sizeof *set);
            must("nvmlEventSetCreate", nvmlEventSetCreate(set));
            x.set = *set;
            guard_release();
            sweep_all(&x);
            guard_call("nvmlEventSetFree", 0);
            must("nvmlEventSetFree", nvmlEventSetFree(x.set));
            for (int k = 0; k < 2; k++)
                if (x.gpm[k] != NULL)
                    nvmlGpmSampleFree(x.gpm[k]);
        }
    }
    must("nvmlShutdown", nvmlShutdown());

    for (size_t i = 0; i < GUARD_SWEEP_COUNT; i++)
        printf("SWEEP %s\n", GUARD_SWEEPS[i].name);
    for (size_t i = 0; i < GUARD_FRAME_COUNT; i++)
        printf("FRAME %s\n", GUARD_FRAME[i]);
    printf("DEVICES %u\nCALLS %llu\nOK\n", max_devices, g_calls);
    return 0;
}
