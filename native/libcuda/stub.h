/*
 * The few CUDA driver API types and codes the stub answers with, declared
 * here rather than taken from NVIDIA's cuda.h (no CUDA toolkit is needed to
 * build Mokka).  Names, values and prototypes are those of NVIDIA's
 * published CUDA Driver API reference (docs.nvidia.com/cuda/cuda-driver-api:
 * "Error Handling", "Initialization", "Version Management", "Device
 * Management", "Driver Entry Point Access"), so a loader built against the
 * real header calls these with the ABI it expects.
 */
#ifndef MOKKA_CUDA_STUB_H
#define MOKKA_CUDA_STUB_H

#include <stdint.h>

/* Every exported function has default visibility; the rest of the library
 * is hidden (-fvisibility=hidden), so the export list is exactly these. */
#define CUDA_API __attribute__((visibility("default")))

typedef uint64_t cuuint64_t;

/* CUresult (enum cudaError_enum): only the codes the stub returns. */
typedef enum cudaError_enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_NOT_FOUND = 500,
} CUresult;

/* CUdriverProcAddressQueryResult (cuGetProcAddress_v2's symbolStatus). */
typedef enum CUdriverProcAddressQueryResult_enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
} CUdriverProcAddressQueryResult;

/* The profile's CUDA version (major * 1000 + minor * 10) from the engine
 * config, or 0 when no config can be read (version.c). */
int cuda_stub_version(void);

#endif
