/*
 * Test client: holds the mock NVML library open while the files it reads
 * are damaged and repaired.  For each line read on stdin it makes one round
 * of calls and prints one tab-separated line of `what=code:answer` (the
 * answer empty or 0 when the code is not NVML_SUCCESS): the device count,
 * device 0's name, UUID and GPU utilization, how many compute processes
 * hold it, and the name of the process 200001.  Each call is repeated
 * REPEAT times per round (200 unless given), so a round spans more calls
 * than the library reads the change notice in, and the last answer is
 * printed.
 *
 * usage: nvml_damage_client [REPEAT]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvml.h"

#define HOLDER_PID 200001

int main(int argc, char **argv)
{
    int repeat = argc > 1 ? atoi(argv[1]) : 200;
    nvmlReturn_t r = nvmlInit_v2();
    printf("init=%d\n", r);
    fflush(stdout);
    if (r != NVML_SUCCESS)
        return 0;
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        unsigned count = 0, util = 0, procs = 0;
        char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = "", uuid[96] = "", process[64] = "";
        nvmlReturn_t rc_count = 0, rc_name = 0, rc_uuid = 0, rc_util = 0, rc_procs = 0,
                     rc_process = 0;
        for (int i = 0; i < repeat; i++) {
            nvmlDevice_t h = NULL;
            nvmlUtilization_t rates = {0};
            nvmlProcessInfo_t infos[8];
            rc_count = nvmlDeviceGetCount_v2(&count);
            nvmlDeviceGetHandleByIndex_v2(0, &h);
            rc_name = nvmlDeviceGetName(h, name, sizeof name);
            rc_uuid = nvmlDeviceGetUUID(h, uuid, sizeof uuid);
            rc_util = nvmlDeviceGetUtilizationRates(h, &rates);
            util = rates.gpu;
            procs = 8;
            rc_procs = nvmlDeviceGetComputeRunningProcesses_v3(h, &procs, infos);
            rc_process = nvmlSystemGetProcessName(HOLDER_PID, process, sizeof process);
        }
        printf("count=%d:%u\tname=%d:%s\tuuid=%d:%s\tutil=%d:%u\tprocs=%d:%u\tprocess=%d:%s\n",
               rc_count, rc_count ? 0 : count, rc_name, rc_name ? "" : name, rc_uuid,
               rc_uuid ? "" : uuid, rc_util, rc_util ? 0 : util, rc_procs, rc_procs ? 0 : procs,
               rc_process, rc_process ? "" : process);
        fflush(stdout);
    }
    nvmlShutdown();
    return 0;
}
