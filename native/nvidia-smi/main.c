/*
 * Command line of the fallback nvidia-smi.
 *
 * Supported: (no arguments) the summary table, -L/--list-gpus,
 * --query-gpu=<fields> --format=csv[,noheader][,nounits], -q/--query,
 * -i/--id, --version, -h/--help.  Anything else is refused with the real
 * tool's message and exit code, so a script never mistakes the fallback's
 * silence for an answer.
 */
#include <stdio.h>
#include <string.h>

#include "smi.h"

static void usage(void)
{
    printf("NVIDIA System Management Interface (fallback for simulated GPUs)\n\n"
           "nvidia-smi [OPTION1 [ARG1]] [OPTION2 [ARG2]] ...\n\n"
           "    -h,   --help                Print usage information and exit.\n"
           "          --version             Print version information and exit.\n"
           "    -L,   --list-gpus           Display a list of GPUs connected to the system.\n"
           "    -q,   --query               Display GPU or Unit info.\n"
           "    -i,   --id=                 Target a specific GPU.\n"
           "          --query-gpu=          Information about GPU.\n"
           "          --format=             Comma separated list of format options:\n"
           "                                  csv - comma separated values (MANDATORY)\n"
           "                                  noheader - skip the first line with column "
           "headers\n"
           "                                  nounits - don't print units for numerical "
           "values\n");
}

static int bad_option(const char *option)
{
    printf("ERROR: Option %s is not recognized. Please run 'nvidia-smi -h'.\n\n", option);
    return SMI_EXIT_BAD_OPTION;
}

/* Matches `--name=value`, `--name value`, `-n value` and `-n=value`. */
static int take_value(int argc, char **argv, int *i, const char *long_name,
                      const char *short_name, const char **value)
{
    const char *arg = argv[*i];
    const char *names[] = {long_name, short_name};
    for (int k = 0; k < 2; k++) {
        if (names[k] == NULL)
            continue;
        size_t len = strlen(names[k]);
        if (strncmp(arg, names[k], len) != 0)
            continue;
        if (arg[len] == '=') {
            *value = arg + len + 1;
            return 1;
        }
        if (arg[len] == '\0' && *i + 1 < argc) {
            *value = argv[++*i];
            return 1;
        }
    }
    return 0;
}

static int init_failed(nvmlReturn_t r)
{
    if (r == NVML_ERROR_DRIVER_NOT_LOADED) {
        printf("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
               "Make sure that the latest NVIDIA driver is installed and running.\n\n");
        return 9;
    }
    printf("Failed to initialize NVML: %s\n", nvmlErrorString(r));
    return SMI_EXIT_BAD_OPTION;
}

static int list_gpus(void)
{
    unsigned count = 0;
    nvmlDeviceGetCount(&count);
    for (unsigned i = 0; i < count; i++) {
        nvmlDevice_t h;
        char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = "Unknown Error";
        char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = "Unknown Error";
        if (nvmlDeviceGetHandleByIndex(i, &h) == NVML_SUCCESS) {
            nvmlDeviceGetName(h, name, sizeof name);
            nvmlDeviceGetUUID(h, uuid, sizeof uuid);
        }
        printf("GPU %u: %s (UUID: %s)\n", i, name, uuid);
    }
    return 0;
}

static int version(void)
{
    struct smi_header h;
    char nvml[NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE] = "N/A";
    smi_load_header(&h);
    nvmlSystemGetNVMLVersion(nvml, sizeof nvml);
    /* NVML spells its version "<cuda major>.<driver>"; the tool prints the driver part. */
    const char *shown = nvml;
    int dots = 0;
    for (const char *p = nvml; *p; p++)
        dots += *p == '.';
    if (dots >= 3)
        shown = strchr(nvml, '.') + 1;
    printf("NVIDIA-SMI version  : %s\n", h.driver);
    printf("NVML version        : %s\n", shown);
    printf("DRIVER version      : %s\n", h.driver);
    printf("CUDA Version        : %s\n", h.cuda);
    return 0;
}

int main(int argc, char **argv)
{
    enum { TABLE, LIST, QUERY_GPU, REPORT, VERSION, HELP } mode = TABLE;
    const char *ids = NULL, *fields = NULL, *format = NULL;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *value;
        if (strcmp(arg, "-L") == 0 || strcmp(arg, "--list-gpus") == 0)
            mode = LIST;
        else if (strcmp(arg, "-q") == 0 || strcmp(arg, "--query") == 0)
            mode = REPORT;
        else if (strcmp(arg, "--version") == 0)
            mode = VERSION;
        else if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0)
            mode = HELP;
        else if (take_value(argc, argv, &i, "--query-gpu", NULL, &value)) {
            mode = QUERY_GPU;
            fields = value;
        } else if (take_value(argc, argv, &i, "--format", NULL, &value))
            format = value;
        else if (take_value(argc, argv, &i, "--id", "-i", &value))
            ids = value;
        else
            return bad_option(arg);
    }
    if (mode == HELP) {
        usage();
        return 0;
    }
    if (mode == LIST && ids != NULL) {
        printf("ERROR: Option -i is not valid for this command. "
               "Please run 'nvidia-smi -h' for help.\n\n");
        return SMI_EXIT_USAGE;
    }
    if (mode == QUERY_GPU && format == NULL) {
        printf("\"--format=\" switch is missing. Please run 'nvidia-smi -h' for help.\n\n");
        return SMI_EXIT_USAGE;
    }
    nvmlReturn_t r = nvmlInitWithFlags(0);
    if (r != NVML_SUCCESS)
        return init_failed(r);
    int rc;
    switch (mode) {
    case LIST: rc = list_gpus(); break;
    case QUERY_GPU: rc = smi_query_gpu(fields, format, ids); break;
    case REPORT: rc = smi_report(ids); break;
    case VERSION: rc = version(); break;
    default: rc = smi_table(); break;
    }
    nvmlShutdown();
    return rc;
}
