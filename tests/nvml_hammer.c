/*
 * Test driver: THREADS threads call the mock NVML library concurrently for
 * SECONDS, while the main thread re-initializes and waits on events, so a
 * memory checker sees reference counting, config snapshots and event sets
 * under contention.  Exit status 0 when every call returned what it should.
 *
 * usage: nvml_hammer THREADS SECONDS
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "nvml.h"

static double g_seconds;
static int g_failures;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void fail(const char *what, nvmlReturn_t r)
{
    pthread_mutex_lock(&g_lock);
    g_failures++;
    fprintf(stderr, "%s: %s\n", what, nvmlErrorString(r));
    pthread_mutex_unlock(&g_lock);
}

static void *work(void *arg)
{
    unsigned seed = (unsigned)(size_t)arg;
    double stop = now() + g_seconds;
    unsigned count = 0;
    nvmlReturn_t r = nvmlInit_v2();
    if (r != NVML_SUCCESS) {
        fail("init", r);
        return NULL;
    }
    nvmlDeviceGetCount_v2(&count);
    for (unsigned i = 0; now() < stop; i++) {
        nvmlDevice_t h;
        char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
        nvmlMemory_t memory;
        nvmlFieldValue_t fields[2] = {{.fieldId = NVML_FI_DEV_POWER_MAX_LIMIT},
                                      {.fieldId = NVML_FI_DEV_MEMORY_TEMP}};
        unsigned temp;
        if ((r = nvmlDeviceGetHandleByIndex_v2((seed + i) % count, &h)) != NVML_SUCCESS)
            fail("handle", r);
        else if ((r = nvmlDeviceGetName(h, name, sizeof name)) != NVML_SUCCESS)
            fail("name", r);
        else if ((r = nvmlDeviceGetMemoryInfo(h, &memory)) != NVML_SUCCESS)
            fail("memory", r);
        else if ((r = nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU, &temp)) != NVML_SUCCESS)
            fail("temperature", r);
        else if ((r = nvmlDeviceGetFieldValues(h, 2, fields)) != NVML_SUCCESS)
            fail("fields", r);
    }
    nvmlShutdown();
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s THREADS SECONDS\n", argv[0]);
        return 2;
    }
    int threads = atoi(argv[1]);
    g_seconds = atof(argv[2]);
    if (threads < 1 || threads > 64)
        return 2;
    nvmlReturn_t r = nvmlInit_v2();
    if (r != NVML_SUCCESS) {
        fprintf(stderr, "init: %s\n", nvmlErrorString(r));
        return 1;
    }
    pthread_t ids[64];
    for (int i = 0; i < threads; i++)
        pthread_create(&ids[i], NULL, work, (void *)(size_t)i);
    printf("RUNNING\n");
    fflush(stdout);
    /* Meanwhile: event sets created, waited on and freed. */
    double stop = now() + g_seconds;
    while (now() < stop) {
        nvmlEventSet_t set;
        nvmlDevice_t h;
        nvmlEventData_t data;
        if (nvmlEventSetCreate(&set) != NVML_SUCCESS) {
            fail("event set", NVML_ERROR_UNKNOWN);
            break;
        }
        nvmlDeviceGetHandleByIndex_v2(0, &h);
        nvmlDeviceRegisterEvents(h, nvmlEventTypeXidCriticalError, set);
        r = nvmlEventSetWait_v2(set, &data, 20);
        if (r != NVML_ERROR_TIMEOUT && r != NVML_SUCCESS)
            fail("wait", r);
        nvmlEventSetFree(set);
    }
    for (int i = 0; i < threads; i++)
        pthread_join(ids[i], NULL);
    nvmlShutdown();
    printf("failures=%d\n", g_failures);
    return g_failures == 0 ? 0 : 1;
}
