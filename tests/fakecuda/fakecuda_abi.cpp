// Fake CUDA driver: the legacy (unversioned) exports and cuGetProcAddress.
//
// This file is compiled with -D__CUDA_API_VERSION_INTERNAL: cuda.h then
// declares both the versioned functions (cuMemFree_v2, ...) and the legacy
// ones under their plain names (cuMemFree taking a 32-bit pointer, ...), so
// both can be named here. With -DFAKECUDA_NO_PROC_ADDRESS (the -noproc
// library) cuGetProcAddress is not exported at all, and a loader must fall
// back to dlsym of the versioned export names.
#include <stdlib.h>
#include <string.h>

#include "fakecuda_internal.h"

using namespace fakecuda;

// ---------------------------------------------------------------- legacy ABI

// The CUDA 2.x cuMemFree takes a 32-bit pointer. A loader that resolved the
// plain name would truncate 64-bit pointers: never free anything, record it.
FAKECUDA_API CUresult cuMemFree(CUdeviceptr_v1 dptr) {
  note_legacy_call("cuMemFree");
  g_counters.legacy_free_calls.fetch_add(1);
  log_line("legacy-free ptr32=0x%x", unsigned(dptr));
  return fail("cuMemFree", CUDA_ERROR_INVALID_VALUE);
}

// Legacy entry points whose ABI differs from the versioned one: traps.
FAKECUDA_API CUresult cuMemAdvise(CUdeviceptr, size_t, CUmem_advise, CUdevice) {
  note_legacy_call("cuMemAdvise");
  return fail("cuMemAdvise", CUDA_ERROR_INVALID_VALUE);
}

FAKECUDA_API CUresult cuMemcpyDtoH(void*, CUdeviceptr_v1, unsigned int) {
  note_legacy_call("cuMemcpyDtoH");
  return fail("cuMemcpyDtoH", CUDA_ERROR_INVALID_VALUE);
}

FAKECUDA_API CUresult cuCtxCreate(CUcontext*, unsigned int, CUdevice) {
  note_legacy_call("cuCtxCreate");
  return fail("cuCtxCreate", CUDA_ERROR_INVALID_VALUE);
}

FAKECUDA_API CUresult cuDeviceTotalMem(unsigned int*, CUdevice) {
  note_legacy_call("cuDeviceTotalMem");
  return fail("cuDeviceTotalMem", CUDA_ERROR_INVALID_VALUE);
}

// Legacy entry points with the same ABI as the versioned ones: they work (as
// in the real driver) but are counted and logged.
FAKECUDA_API CUresult cuCtxDestroy(CUcontext ctx) {
  note_legacy_call("cuCtxDestroy");
  return cuCtxDestroy_v2(ctx);
}

FAKECUDA_API CUresult cuCtxPushCurrent(CUcontext ctx) {
  note_legacy_call("cuCtxPushCurrent");
  return cuCtxPushCurrent_v2(ctx);
}

FAKECUDA_API CUresult cuCtxPopCurrent(CUcontext* pctx) {
  note_legacy_call("cuCtxPopCurrent");
  return cuCtxPopCurrent_v2(pctx);
}

FAKECUDA_API CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  note_legacy_call("cuDevicePrimaryCtxRelease");
  return cuDevicePrimaryCtxRelease_v2(dev);
}

#ifndef FAKECUDA_NO_PROC_ADDRESS

// ---------------------------------------------------------------- cuGetProcAddress

namespace {

struct ProcEntry {
  const char* name;  // base name
  int version;       // the CUDA version that introduced this ABI
  void* fn;
};

#define FAKECUDA_PROC(name, version, fn) \
  { name, version, reinterpret_cast<void*>(&fn) }
// For each base name, newest ABI first.
const ProcEntry kProcs[] = {
    FAKECUDA_PROC("cuInit", 2000, cuInit),
    FAKECUDA_PROC("cuDriverGetVersion", 2020, cuDriverGetVersion),
    FAKECUDA_PROC("cuGetProcAddress", 12000, cuGetProcAddress_v2),
    FAKECUDA_PROC("cuGetProcAddress", 11030, cuGetProcAddress),
    FAKECUDA_PROC("cuDeviceGetCount", 2000, cuDeviceGetCount),
    FAKECUDA_PROC("cuDeviceGet", 2000, cuDeviceGet),
    FAKECUDA_PROC("cuDeviceGetName", 2000, cuDeviceGetName),
    FAKECUDA_PROC("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    FAKECUDA_PROC("cuDeviceTotalMem", 2000, cuDeviceTotalMem),
    FAKECUDA_PROC("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    FAKECUDA_PROC("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    FAKECUDA_PROC("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    FAKECUDA_PROC("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease),
    FAKECUDA_PROC("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
    FAKECUDA_PROC("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
    FAKECUDA_PROC("cuCtxPushCurrent", 2000, cuCtxPushCurrent),
    FAKECUDA_PROC("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
    FAKECUDA_PROC("cuCtxPopCurrent", 2000, cuCtxPopCurrent),
    FAKECUDA_PROC("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    FAKECUDA_PROC("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    // cuCtxCreate_v2 (3020) and _v3 (11040) are not provided: older requests
    // get the legacy trap.
    FAKECUDA_PROC("cuCtxCreate", 12050, cuCtxCreate_v4),
    FAKECUDA_PROC("cuCtxCreate", 2000, cuCtxCreate),
    FAKECUDA_PROC("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    FAKECUDA_PROC("cuCtxDestroy", 2000, cuCtxDestroy),
    FAKECUDA_PROC("cuMemAllocManaged", 6000, cuMemAllocManaged),
    FAKECUDA_PROC("cuMemFree", 3020, cuMemFree_v2),
    FAKECUDA_PROC("cuMemFree", 2000, cuMemFree),
    FAKECUDA_PROC("cuMemAdvise", 12020, cuMemAdvise_v2),
    FAKECUDA_PROC("cuMemAdvise", 8000, cuMemAdvise),
    FAKECUDA_PROC("cuMemHostAlloc", 2020, cuMemHostAlloc),
    FAKECUDA_PROC("cuMemFreeHost", 2000, cuMemFreeHost),
    FAKECUDA_PROC("cuMemHostRegister", 6050, cuMemHostRegister_v2),
    FAKECUDA_PROC("cuMemHostUnregister", 4000, cuMemHostUnregister),
    FAKECUDA_PROC("cuPointerGetAttribute", 4000, cuPointerGetAttribute),
    FAKECUDA_PROC("cuMemRangeGetAttribute", 8000, cuMemRangeGetAttribute),
    FAKECUDA_PROC("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2),
    FAKECUDA_PROC("cuMemcpyDtoH", 2000, cuMemcpyDtoH),
    FAKECUDA_PROC("cuStreamCreate", 2000, cuStreamCreate),
    FAKECUDA_PROC("cuStreamSynchronize", 2000, cuStreamSynchronize),
    FAKECUDA_PROC("cuStreamDestroy", 4000, cuStreamDestroy_v2),
    FAKECUDA_PROC("cuMemsetD8Async", 3020, cuMemsetD8Async),
    FAKECUDA_PROC("cuMemDiscardBatchAsync", 13000, cuMemDiscardBatchAsync),
    FAKECUDA_PROC("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    FAKECUDA_PROC("cuMemAddressReserve", 10020, cuMemAddressReserve),
    FAKECUDA_PROC("cuMemAddressFree", 10020, cuMemAddressFree),
    FAKECUDA_PROC("cuMemCreate", 10020, cuMemCreate),
    FAKECUDA_PROC("cuMemRelease", 10020, cuMemRelease),
    FAKECUDA_PROC("cuMemMap", 10020, cuMemMap),
    FAKECUDA_PROC("cuMemUnmap", 10020, cuMemUnmap),
    FAKECUDA_PROC("cuMemSetAccess", 10020, cuMemSetAccess),
    FAKECUDA_PROC("cuModuleLoadData", 2000, cuModuleLoadData),
    FAKECUDA_PROC("cuModuleGetFunction", 2000, cuModuleGetFunction),
    FAKECUDA_PROC("cuModuleUnload", 2000, cuModuleUnload),
    FAKECUDA_PROC("cuLaunchKernel", 4000, cuLaunchKernel),
    FAKECUDA_PROC("cuCtxSynchronize", 2000, cuCtxSynchronize),
    FAKECUDA_PROC("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    FAKECUDA_PROC("cuGetErrorName", 6000, cuGetErrorName),
    FAKECUDA_PROC("cuGetErrorString", 6000, cuGetErrorString),
};
#undef FAKECUDA_PROC

// Whether name is in the comma-separated FAKECUDA_MISSING list. No malloc.
bool listed_missing(const char* name) noexcept {
  const char* list = getenv("FAKECUDA_MISSING");
  if (list == nullptr) return false;
  const std::size_t len = strlen(name);
  for (const char* p = list; *p != '\0';) {
    const char* comma = strchr(p, ',');
    const std::size_t n = comma != nullptr ? std::size_t(comma - p) : strlen(p);
    if (n == len && strncmp(p, name, n) == 0) return true;
    if (comma == nullptr) break;
    p = comma + 1;
  }
  return false;
}

CUresult lookup(const char* call, const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                CUdriverProcAddressQueryResult* status) noexcept {
  if (pfn != nullptr) *pfn = nullptr;
  if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (CUresult rc = enter_no_init(call); rc != CUDA_SUCCESS) return rc;
  constexpr cuuint64_t kKnownFlags =
      CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  if (symbol == nullptr || pfn == nullptr || (flags & ~kKnownFlags) != 0)
    return fail(call, CUDA_ERROR_INVALID_VALUE);
  // A request for a newer CUDA version than the driver's is an error.
  if (cudaVersion > kDriverVersion) return fail(call, CUDA_ERROR_INVALID_VALUE);
  if (listed_missing(symbol)) return fail(call, CUDA_ERROR_NOT_FOUND);
  bool known = false;
  for (const ProcEntry& e : kProcs) {
    if (strcmp(e.name, symbol) != 0) continue;
    known = true;
    if (e.version <= cudaVersion) {
      *pfn = e.fn;
      if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SUCCESS;
      return CUDA_SUCCESS;
    }
  }
  if (known && status != nullptr) *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
  return fail(call, CUDA_ERROR_NOT_FOUND);
}

}  // namespace

FAKECUDA_API CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                          cuuint64_t flags,
                                          CUdriverProcAddressQueryResult* symbolStatus) {
  return lookup("cuGetProcAddress_v2", symbol, pfn, cudaVersion, flags, symbolStatus);
}

// The CUDA 11.3 form, without the status argument.
FAKECUDA_API CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                       cuuint64_t flags) {
  g_counters.legacy_calls.fetch_add(1);
  log_line("legacy-call name=cuGetProcAddress");
  return lookup("cuGetProcAddress", symbol, pfn, cudaVersion, flags, nullptr);
}

#endif  // FAKECUDA_NO_PROC_ADDRESS
