/*
 * The CUDA driver API entry points a loader probes, and nothing else.
 *
 * Mokka simulates GPUs to the management stack (NVML, nvidia-smi, device
 * nodes), not compute: there is no CUDA device to give a context to.  The
 * library exists because tools that write CDI specs (nvidia-ctk cdi
 * generate, the device plugin's cdi-* strategies, both through the
 * toolkit's nvcdi) require libcuda.so.<driver version> in a driver root,
 * and a real driver root has one.  Whatever dlopens it and probes it gets
 * the answers of a driver that sees no device:
 *
 *   cuInit               CUDA_ERROR_NO_DEVICE (after checking Flags == 0)
 *   cuDriverGetVersion   the profile's CUDA version (version.c), with or
 *                        without cuInit, as the real one; NOT_INITIALIZED
 *                        when no engine config is readable
 *   cuDeviceGetCount     NOT_INITIALIZED before cuInit, 0 devices after
 *   cuGetErrorName/String  the codes above
 *   cuGetProcAddress(_v2)  CUDA_ERROR_NOT_FOUND for every symbol
 *
 * Every other CUDA symbol is absent, so a client that needs more fails at
 * dlsym, visibly, rather than running on made-up answers.
 */
#include <stddef.h>

#include "stub.h"

/* Whether cuInit has been called (and failed, as it always does).  One
 * flag, set once and never cleared: atomics, no lock. */
static int initialized;

CUDA_API CUresult cuInit(unsigned int Flags)
{
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
    return CUDA_ERROR_NO_DEVICE;
}

CUDA_API CUresult cuDriverGetVersion(int *driverVersion)
{
    if (driverVersion == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    int version = cuda_stub_version();
    if (version == 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    *driverVersion = version;
    return CUDA_SUCCESS;
}

CUDA_API CUresult cuDeviceGetCount(int *count)
{
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *count = 0;
    return CUDA_SUCCESS;
}

/* Names and texts as NVIDIA's driver words them (CUDA Driver API, "Data
 * types": the documentation of each CUresult value). */
static int describe(CUresult error, const char **name, const char **text)
{
    switch (error) {
    case CUDA_SUCCESS:
        *name = "CUDA_SUCCESS", *text = "no error";
        return 1;
    case CUDA_ERROR_INVALID_VALUE:
        *name = "CUDA_ERROR_INVALID_VALUE", *text = "invalid argument";
        return 1;
    case CUDA_ERROR_NOT_INITIALIZED:
        *name = "CUDA_ERROR_NOT_INITIALIZED", *text = "initialization error";
        return 1;
    case CUDA_ERROR_NO_DEVICE:
        *name = "CUDA_ERROR_NO_DEVICE", *text = "no CUDA-capable device is detected";
        return 1;
    case CUDA_ERROR_NOT_FOUND:
        *name = "CUDA_ERROR_NOT_FOUND", *text = "named symbol not found";
        return 1;
    }
    return 0;
}

CUDA_API CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    const char *name, *text;
    if (pStr == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!describe(error, &name, &text)) {
        *pStr = NULL;
        return CUDA_ERROR_INVALID_VALUE;
    }
    *pStr = name;
    return CUDA_SUCCESS;
}

CUDA_API CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    const char *name, *text;
    if (pStr == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!describe(error, &name, &text)) {
        *pStr = NULL;
        return CUDA_ERROR_INVALID_VALUE;
    }
    *pStr = text;
    return CUDA_SUCCESS;
}

/* The CUDA 11.3 ABI, still exported under this name by CUDA 12 drivers
 * (cuda.h maps the name to _v2 only at compile time). */
CUDA_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                   cuuint64_t flags)
{
    (void)cudaVersion;
    (void)flags;
    if (symbol == NULL || pfn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    return CUDA_ERROR_NOT_FOUND;
}

CUDA_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                      cuuint64_t flags,
                                      CUdriverProcAddressQueryResult *symbolStatus)
{
    CUresult r = cuGetProcAddress(symbol, pfn, cudaVersion, flags);
    if (symbolStatus != NULL && r == CUDA_ERROR_NOT_FOUND)
        *symbolStatus = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return r;
}
