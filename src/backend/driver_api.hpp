// The CUDA driver entry points mnemosyne uses, typed with the PFN_ types of
// cudaTypedefs.h for the ABI version that the headers' names map to.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstddef>

// Entry points newer than the CUDA headers at hand (a 12.x toolkit): their
// types as CUDA 13.0's cudaTypedefs.h declares them, so that every toolkit
// from 12.0 on builds the same library. The loader asks the driver for every
// entry point at CUDA 13.0's ABI (kDriverApiVersion, loader.cpp), or the
// driver's own version if older; a driver without one leaves it null.
#if CUDA_VERSION < 12050
// Opaque here: mnemosyne only ever passes none (a null pointer).
typedef struct CUctxCreateParams_st CUctxCreateParams;
typedef CUresult(CUDAAPI* PFN_cuCtxCreate_v12050)(CUcontext* pctx,
                                                  CUctxCreateParams* ctxCreateParams,
                                                  unsigned int flags, CUdevice dev);
#endif
#if CUDA_VERSION < 13000
typedef CUresult(CUDAAPI* PFN_cuMemDiscardBatchAsync_v13000)(CUdeviceptr_v2* dptrs,
                                                             std::size_t* sizes, std::size_t count,
                                                             unsigned long long flags,
                                                             CUstream hStream);
#endif

namespace mnemosyne {

// The newest ABI typed below: the loader asks the driver for it even where
// the headers are older.
inline constexpr int kDriverApiVersion = 13000;
// CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER (36 in CUDA 13.0's cuda.h), which
// older headers do not name.
inline constexpr CUresult kCudaErrorCallRequiresNewerDriver = static_cast<CUresult>(36);

struct DriverApi {
  PFN_cuInit_v2000 cuInit;
  PFN_cuDriverGetVersion_v2020 cuDriverGetVersion;
  PFN_cuDeviceGetCount_v2000 cuDeviceGetCount;
  PFN_cuDeviceGet_v2000 cuDeviceGet;
  PFN_cuDeviceGetName_v2000 cuDeviceGetName;
  PFN_cuDeviceTotalMem_v3020 cuDeviceTotalMem;  // cuDeviceTotalMem_v2
  PFN_cuDeviceGetAttribute_v2000 cuDeviceGetAttribute;
  PFN_cuDevicePrimaryCtxRetain_v7000 cuDevicePrimaryCtxRetain;
  PFN_cuDevicePrimaryCtxRelease_v11000 cuDevicePrimaryCtxRelease;  // _v2
  PFN_cuCtxPushCurrent_v4000 cuCtxPushCurrent;                     // cuCtxPushCurrent_v2
  PFN_cuCtxPopCurrent_v4000 cuCtxPopCurrent;                       // cuCtxPopCurrent_v2
  PFN_cuCtxGetCurrent_v4000 cuCtxGetCurrent;
  PFN_cuCtxCreate_v12050 cuCtxCreate;   // cuCtxCreate_v4
  PFN_cuCtxDestroy_v4000 cuCtxDestroy;  // cuCtxDestroy_v2
  PFN_cuMemAllocManaged_v6000 cuMemAllocManaged;
  PFN_cuMemFree_v3020 cuMemFree;       // cuMemFree_v2 (64-bit pointer)
  PFN_cuMemAdvise_v12020 cuMemAdvise;  // cuMemAdvise_v2 (CUmemLocation)
  PFN_cuMemHostAlloc_v2020 cuMemHostAlloc;
  PFN_cuMemFreeHost_v2000 cuMemFreeHost;
  // Page-locking memory of our own, granule by granule (optional: may be null).
  PFN_cuMemHostRegister_v6050 cuMemHostRegister;  // cuMemHostRegister_v2
  PFN_cuMemHostUnregister_v4000 cuMemHostUnregister;
  PFN_cuPointerGetAttribute_v4000 cuPointerGetAttribute;
  PFN_cuMemcpyDtoH_v3020 cuMemcpyDtoH;  // cuMemcpyDtoH_v2; optional: may be null
  // Clearing managed memory on the device (optional: may be null).
  PFN_cuStreamCreate_v2000 cuStreamCreate;
  PFN_cuMemsetD8Async_v3020 cuMemsetD8Async;
  PFN_cuStreamSynchronize_v2000 cuStreamSynchronize;
  PFN_cuStreamDestroy_v4000 cuStreamDestroy;  // cuStreamDestroy_v2
  PFN_cuGetErrorName_v6000 cuGetErrorName;    // optional: may be null
  // Dropping what free managed memory held (CUDA 13; optional: may be null).
  PFN_cuMemDiscardBatchAsync_v13000 cuMemDiscardBatchAsync;
  // Host memory through the virtual-memory API, granule by granule
  // (MNEMOSYNE_PIN=vmm; host locations need CUDA 12.2; optional: may be null).
  PFN_cuMemGetAllocationGranularity_v10020 cuMemGetAllocationGranularity;
  PFN_cuMemAddressReserve_v10020 cuMemAddressReserve;
  PFN_cuMemAddressFree_v10020 cuMemAddressFree;
  PFN_cuMemCreate_v10020 cuMemCreate;
  PFN_cuMemRelease_v10020 cuMemRelease;
  PFN_cuMemMap_v10020 cuMemMap;
  PFN_cuMemUnmap_v10020 cuMemUnmap;
  PFN_cuMemSetAccess_v10020 cuMemSetAccess;
};

}  // namespace mnemosyne
