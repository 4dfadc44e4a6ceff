// Self-test of the fake CUDA driver. Usage:
//   fakecuda_selftest <libfakecuda.so> <libfakecuda-noproc.so>
// It dlopens the libraries as the product does (never links them) and checks
// the behaviour documented in README.md. It re-executes itself with
// "--env-faults <lib>" and "--env-nodev <lib>" to check the settings that are
// read from the environment at cuInit in a fresh process.
//
// On Windows (fakecuda.dll, fakecuda-noproc.dll) the same checks run, less
// fork and residency, which the driver does not simulate there.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
// The double's driver version (fakecuda::kDriverVersion), whatever headers
// built it.
constexpr int kDoubleVersion = 13000;
// Entry points a 12.x toolkit's headers lack, typed as CUDA 13.0 types them
// (the double is a 13.0 driver; the calls below pass no context parameters).
#if CUDA_VERSION < 12050
typedef CUresult(CUDAAPI* PFN_cuCtxCreate_v12050)(CUcontext*, void*, unsigned int, CUdevice);
#endif
#if CUDA_VERSION < 13000
typedef CUresult(CUDAAPI* PFN_cuMemDiscardBatchAsync_v13000)(CUdeviceptr*, size_t*, size_t,
                                                             unsigned long long, CUstream);
#endif
#if defined(_WIN32)
#include <process.h>
#include <windows.h>
#else
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#endif

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "fakecuda.h"

namespace {

int g_failures = 0;

#if defined(_WIN32)
// The POSIX calls this test makes, over LoadLibrary/GetProcAddress and the CRT
// (which the DLL shares: msvcrt.dll, so it sees this environment).
constexpr int RTLD_NOW = 0;
constexpr int RTLD_LOCAL = 0;

void* dlopen(const char* path, int) {
  return reinterpret_cast<void*>(LoadLibraryA(path));
}

void* dlsym(void* h, const char* name) {
  return reinterpret_cast<void*>(GetProcAddress(static_cast<HMODULE>(h), name));
}

const char* dlerror() {
  static char buf[32];
  snprintf(buf, sizeof buf, "error %lu", GetLastError());
  return buf;
}

int setenv(const char* name, const char* value, int) {
  return _putenv_s(name, value);
}

int unsetenv(const char* name) {
  return _putenv_s(name, "");  // an empty value removes the variable
}
#endif

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                            \
    }                                                                          \
  } while (0)

#define CHECK_RC(expr, expected)                                                              \
  do {                                                                                        \
    const int rc_ = static_cast<int>(expr);                                                   \
    if (rc_ != static_cast<int>(expected)) {                                                  \
      fprintf(stderr, "%s:%d: %s returned %d, expected %d\n", __FILE__, __LINE__, #expr, rc_, \
              static_cast<int>(expected));                                                    \
      ++g_failures;                                                                           \
    }                                                                                         \
  } while (0)

constexpr size_t kMiB = size_t{1} << 20;

// The entry points, resolved by their versioned export names.
struct Api {
  void* handle = nullptr;
  PFN_cuInit_v2000 cuInit = nullptr;
  PFN_cuDriverGetVersion_v2020 cuDriverGetVersion = nullptr;
  PFN_cuGetProcAddress_v12000 cuGetProcAddress = nullptr;
  PFN_cuGetProcAddress_v11030 cuGetProcAddressLegacy = nullptr;
  PFN_cuDeviceGetCount_v2000 cuDeviceGetCount = nullptr;
  PFN_cuDeviceGet_v2000 cuDeviceGet = nullptr;
  PFN_cuDeviceGetName_v2000 cuDeviceGetName = nullptr;
  PFN_cuDeviceTotalMem_v3020 cuDeviceTotalMem = nullptr;
  PFN_cuDeviceGetAttribute_v2000 cuDeviceGetAttribute = nullptr;
  PFN_cuDevicePrimaryCtxRetain_v7000 cuDevicePrimaryCtxRetain = nullptr;
  PFN_cuDevicePrimaryCtxRelease_v11000 cuDevicePrimaryCtxRelease = nullptr;
  PFN_cuCtxPushCurrent_v4000 cuCtxPushCurrent = nullptr;
  PFN_cuCtxPopCurrent_v4000 cuCtxPopCurrent = nullptr;
  PFN_cuCtxGetCurrent_v4000 cuCtxGetCurrent = nullptr;
  PFN_cuCtxSetCurrent_v4000 cuCtxSetCurrent = nullptr;
  PFN_cuCtxCreate_v12050 cuCtxCreate = nullptr;
  PFN_cuCtxDestroy_v4000 cuCtxDestroy = nullptr;
  PFN_cuMemAllocManaged_v6000 cuMemAllocManaged = nullptr;
  PFN_cuMemFree_v3020 cuMemFree = nullptr;
  CUresult (*cuMemFreeLegacy)(unsigned int) = nullptr;  // the CUDA 2.0 ABI
  PFN_cuMemAdvise_v12020 cuMemAdvise = nullptr;
  PFN_cuMemHostAlloc_v2020 cuMemHostAlloc = nullptr;
  PFN_cuMemFreeHost_v2000 cuMemFreeHost = nullptr;
  PFN_cuPointerGetAttribute_v4000 cuPointerGetAttribute = nullptr;
  PFN_cuMemRangeGetAttribute_v8000 cuMemRangeGetAttribute = nullptr;
  PFN_cuGetErrorName_v6000 cuGetErrorName = nullptr;
  PFN_cuGetErrorString_v6000 cuGetErrorString = nullptr;
  fakecuda_set_fail_alloc_after_fn set_fail_alloc_after = nullptr;
  fakecuda_set_mem_limit_fn set_mem_limit = nullptr;
  fakecuda_set_advise_error_fn set_advise_error = nullptr;
  fakecuda_reset_counters_fn reset_counters = nullptr;
  fakecuda_get_counters_fn get_counters = nullptr;
  fakecuda_owns_fn owns = nullptr;
  fakecuda_get_advice_fn get_advice = nullptr;
  PFN_cuMemcpyDtoH_v3020 cuMemcpyDtoH = nullptr;
  fakecuda_migrate_to_device_fn migrate_to_device = nullptr;
  fakecuda_on_device_fn on_device = nullptr;
  fakecuda_set_copy_error_fn set_copy_error = nullptr;
  PFN_cuStreamCreate_v2000 cuStreamCreate = nullptr;
  PFN_cuStreamSynchronize_v2000 cuStreamSynchronize = nullptr;
  PFN_cuStreamDestroy_v4000 cuStreamDestroy = nullptr;
  PFN_cuMemsetD8Async_v3020 cuMemsetD8Async = nullptr;
  PFN_cuMemDiscardBatchAsync_v13000 cuMemDiscardBatchAsync = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 cuMemGetAllocationGranularity = nullptr;
  PFN_cuMemAddressReserve_v10020 cuMemAddressReserve = nullptr;
  PFN_cuMemAddressFree_v10020 cuMemAddressFree = nullptr;
  PFN_cuMemCreate_v10020 cuMemCreate = nullptr;
  PFN_cuMemRelease_v10020 cuMemRelease = nullptr;
  PFN_cuMemMap_v10020 cuMemMap = nullptr;
  PFN_cuMemUnmap_v10020 cuMemUnmap = nullptr;
  PFN_cuMemSetAccess_v10020 cuMemSetAccess = nullptr;
  PFN_cuMemAlloc_v3020 cuMemAlloc = nullptr;
  PFN_cuMemcpyHtoD_v3020 cuMemcpyHtoD = nullptr;
  PFN_cuMemcpyHtoDAsync_v3020 cuMemcpyHtoDAsync = nullptr;
  PFN_cuMemcpyDtoHAsync_v3020 cuMemcpyDtoHAsync = nullptr;

  fakecuda_counters counters() const {
    fakecuda_counters c{};
    get_counters(&c);
    return c;
  }
};

template <class F>
void resolve(void* h, const char* name, F* out, bool required = true) {
  *out = reinterpret_cast<F>(dlsym(h, name));
  if (required && *out == nullptr) {
    fprintf(stderr, "missing export %s\n", name);
    ++g_failures;
  }
}

bool open_api(const char* path, Api* api, bool with_proc_address) {
  api->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (api->handle == nullptr) {
    fprintf(stderr, "dlopen(%s): %s\n", path, dlerror());
    return false;
  }
  void* h = api->handle;
  resolve(h, "cuInit", &api->cuInit);
  resolve(h, "cuDriverGetVersion", &api->cuDriverGetVersion);
  resolve(h, "cuGetProcAddress_v2", &api->cuGetProcAddress, with_proc_address);
  resolve(h, "cuGetProcAddress", &api->cuGetProcAddressLegacy, with_proc_address);
  resolve(h, "cuDeviceGetCount", &api->cuDeviceGetCount);
  resolve(h, "cuDeviceGet", &api->cuDeviceGet);
  resolve(h, "cuDeviceGetName", &api->cuDeviceGetName);
  resolve(h, "cuDeviceTotalMem_v2", &api->cuDeviceTotalMem);
  resolve(h, "cuDeviceGetAttribute", &api->cuDeviceGetAttribute);
  resolve(h, "cuMemcpyDtoH_v2", &api->cuMemcpyDtoH);
  resolve(h, "fakecuda_migrate_to_device", &api->migrate_to_device);
  resolve(h, "fakecuda_on_device", &api->on_device);
  resolve(h, "fakecuda_set_copy_error", &api->set_copy_error);
  resolve(h, "cuStreamCreate", &api->cuStreamCreate);
  resolve(h, "cuStreamSynchronize", &api->cuStreamSynchronize);
  resolve(h, "cuStreamDestroy_v2", &api->cuStreamDestroy);
  resolve(h, "cuMemsetD8Async", &api->cuMemsetD8Async);
  resolve(h, "cuMemAlloc_v2", &api->cuMemAlloc);
  resolve(h, "cuMemcpyHtoD_v2", &api->cuMemcpyHtoD);
  resolve(h, "cuMemcpyHtoDAsync_v2", &api->cuMemcpyHtoDAsync);
  resolve(h, "cuMemcpyDtoHAsync_v2", &api->cuMemcpyDtoHAsync);
  resolve(h, "cuMemDiscardBatchAsync", &api->cuMemDiscardBatchAsync);
  resolve(h, "cuMemGetAllocationGranularity", &api->cuMemGetAllocationGranularity);
  resolve(h, "cuMemAddressReserve", &api->cuMemAddressReserve);
  resolve(h, "cuMemAddressFree", &api->cuMemAddressFree);
  resolve(h, "cuMemCreate", &api->cuMemCreate);
  resolve(h, "cuMemRelease", &api->cuMemRelease);
  resolve(h, "cuMemMap", &api->cuMemMap);
  resolve(h, "cuMemUnmap", &api->cuMemUnmap);
  resolve(h, "cuMemSetAccess", &api->cuMemSetAccess);
  resolve(h, "cuDevicePrimaryCtxRetain", &api->cuDevicePrimaryCtxRetain);
  resolve(h, "cuDevicePrimaryCtxRelease_v2", &api->cuDevicePrimaryCtxRelease);
  resolve(h, "cuCtxPushCurrent_v2", &api->cuCtxPushCurrent);
  resolve(h, "cuCtxPopCurrent_v2", &api->cuCtxPopCurrent);
  resolve(h, "cuCtxGetCurrent", &api->cuCtxGetCurrent);
  resolve(h, "cuCtxSetCurrent", &api->cuCtxSetCurrent);
  resolve(h, "cuCtxCreate_v4", &api->cuCtxCreate);
  resolve(h, "cuCtxDestroy_v2", &api->cuCtxDestroy);
  resolve(h, "cuMemAllocManaged", &api->cuMemAllocManaged);
  resolve(h, "cuMemFree_v2", &api->cuMemFree);
  resolve(h, "cuMemFree", &api->cuMemFreeLegacy);
  resolve(h, "cuMemAdvise_v2", &api->cuMemAdvise);
  resolve(h, "cuMemHostAlloc", &api->cuMemHostAlloc);
  resolve(h, "cuMemFreeHost", &api->cuMemFreeHost);
  resolve(h, "cuPointerGetAttribute", &api->cuPointerGetAttribute);
  resolve(h, "cuMemRangeGetAttribute", &api->cuMemRangeGetAttribute);
  resolve(h, "cuGetErrorName", &api->cuGetErrorName);
  resolve(h, "cuGetErrorString", &api->cuGetErrorString);
  resolve(h, "fakecuda_set_fail_alloc_after", &api->set_fail_alloc_after);
  resolve(h, "fakecuda_set_mem_limit", &api->set_mem_limit);
  resolve(h, "fakecuda_set_advise_error", &api->set_advise_error);
  resolve(h, "fakecuda_reset_counters", &api->reset_counters);
  resolve(h, "fakecuda_get_counters", &api->get_counters);
  resolve(h, "fakecuda_owns", &api->owns);
  resolve(h, "fakecuda_get_advice", &api->get_advice);
  return g_failures == 0;
}

double now_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) / 1e6;
}

std::string read_file(const char* path) {
  std::string s;
  FILE* f = fopen(path, "rb");
  if (f == nullptr) return s;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  fclose(f);
  return s;
}

bool contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

CUmemLocation device_location(int id) {
  CUmemLocation loc{};
  loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
  loc.id = id;
  return loc;
}

// ------------------------------------------------------------------ checks

void check_before_init(Api& a) {
  int v = 0;
  CHECK_RC(a.cuDriverGetVersion(&v), CUDA_SUCCESS);
  CHECK(v == 13000);
  int n = -1;
  CHECK_RC(a.cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
  CUcontext ctx = nullptr;
  CHECK_RC(a.cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_ERROR_NOT_INITIALIZED);
  CUdeviceptr p = 0;
  CHECK_RC(a.cuMemAllocManaged(&p, 4096, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_NOT_INITIALIZED);
  CHECK_RC(a.cuCtxGetCurrent(&ctx), CUDA_ERROR_NOT_INITIALIZED);
  const char* name = nullptr;
  CHECK_RC(a.cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &name), CUDA_SUCCESS);
  CHECK(name != nullptr && strcmp(name, "CUDA_ERROR_OUT_OF_MEMORY") == 0);
  void* fn = nullptr;
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  CHECK_RC(a.cuGetProcAddress("cuInit", &fn, kDoubleVersion, 0, &st), CUDA_SUCCESS);
  CHECK(fn == reinterpret_cast<void*>(a.cuInit) && st == CU_GET_PROC_ADDRESS_SUCCESS);
  CHECK(a.counters().failed_calls >= 4);

  // Injected cuInit failure, then a good one.
  setenv("FAKECUDA_INIT_ERROR", "100", 1);
  CHECK_RC(a.cuInit(0), CUDA_ERROR_NO_DEVICE);
  CHECK_RC(a.cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
  unsetenv("FAKECUDA_INIT_ERROR");
  CHECK_RC(a.cuInit(1), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(a.cuInit(0), CUDA_SUCCESS);
  CHECK_RC(a.cuInit(0), CUDA_SUCCESS);
  CHECK(a.counters().init_calls == 4);
}

void check_proc_address(Api& a) {
  struct Case {
    const char* base;
    const char* versioned;
  };
  const Case cases[] = {
      {"cuMemFree", "cuMemFree_v2"},
      {"cuMemAdvise", "cuMemAdvise_v2"},
      {"cuCtxCreate", "cuCtxCreate_v4"},
      {"cuCtxDestroy", "cuCtxDestroy_v2"},
      {"cuCtxPushCurrent", "cuCtxPushCurrent_v2"},
      {"cuCtxPopCurrent", "cuCtxPopCurrent_v2"},
      {"cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2"},
      {"cuDeviceTotalMem", "cuDeviceTotalMem_v2"},
      {"cuGetProcAddress", "cuGetProcAddress_v2"},
      {"cuMemAllocManaged", "cuMemAllocManaged"},
      {"cuMemHostAlloc", "cuMemHostAlloc"},
      {"cuMemFreeHost", "cuMemFreeHost"},
      {"cuPointerGetAttribute", "cuPointerGetAttribute"},
      {"cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain"},
      {"cuCtxGetCurrent", "cuCtxGetCurrent"},
      {"cuCtxSetCurrent", "cuCtxSetCurrent"},
      {"cuDeviceGetAttribute", "cuDeviceGetAttribute"},
      {"cuGetErrorName", "cuGetErrorName"},
  };
  for (const Case& c : cases) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CHECK_RC(a.cuGetProcAddress(c.base, &fn, kDoubleVersion, CU_GET_PROC_ADDRESS_DEFAULT, &st),
             CUDA_SUCCESS);
    if (fn != dlsym(a.handle, c.versioned)) {
      fprintf(stderr, "cuGetProcAddress(%s) is not %s\n", c.base, c.versioned);
      ++g_failures;
    }
    CHECK(st == CU_GET_PROC_ADDRESS_SUCCESS);
  }
  void* fn = reinterpret_cast<void*>(1);
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
  CHECK_RC(a.cuGetProcAddress("cuNoSuchFunction", &fn, kDoubleVersion, 0, &st),
           CUDA_ERROR_NOT_FOUND);
  CHECK(fn == nullptr && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  // Versioned names are not base names.
  CHECK_RC(a.cuGetProcAddress("cuMemFree_v2", &fn, kDoubleVersion, 0, &st), CUDA_ERROR_NOT_FOUND);
  // Too old a version for the symbol; an old version gets the old ABI.
  CHECK_RC(a.cuGetProcAddress("cuMemAllocManaged", &fn, 5000, 0, &st), CUDA_ERROR_NOT_FOUND);
  CHECK(st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  CHECK_RC(a.cuGetProcAddress("cuMemFree", &fn, 3010, 0, &st), CUDA_SUCCESS);
  CHECK(fn == reinterpret_cast<void*>(a.cuMemFreeLegacy));
  // Newer than the driver.
  CHECK_RC(a.cuGetProcAddress("cuMemFree", &fn, kDoubleVersion + 10, 0, &st),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(a.cuGetProcAddress("cuMemFree", nullptr, kDoubleVersion, 0, &st),
           CUDA_ERROR_INVALID_VALUE);
  // The status argument is optional; the 11.3 form works too.
  CHECK_RC(a.cuGetProcAddress("cuMemAdvise", &fn, kDoubleVersion, 0, nullptr), CUDA_SUCCESS);
  CHECK(fn == reinterpret_cast<void*>(a.cuMemAdvise));
  CHECK_RC(a.cuGetProcAddressLegacy("cuCtxCreate", &fn, kDoubleVersion, 0), CUDA_SUCCESS);
  CHECK(fn == reinterpret_cast<void*>(a.cuCtxCreate));
  // FAKECUDA_MISSING hides base names.
  setenv("FAKECUDA_MISSING", "cuFoo,cuMemAdvise,cuBar", 1);
  CHECK_RC(a.cuGetProcAddress("cuMemAdvise", &fn, kDoubleVersion, 0, &st), CUDA_ERROR_NOT_FOUND);
  CHECK(fn == nullptr && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  CHECK_RC(a.cuGetProcAddress("cuMemAdviseX", &fn, kDoubleVersion, 0, &st), CUDA_ERROR_NOT_FOUND);
  CHECK_RC(a.cuGetProcAddress("cuMemFree", &fn, kDoubleVersion, 0, &st), CUDA_SUCCESS);
  unsetenv("FAKECUDA_MISSING");
}

void check_devices(Api& a) {
  int n = -1;
  CHECK_RC(a.cuDeviceGetCount(&n), CUDA_SUCCESS);
  CHECK(n == 2);
  CUdevice d = -1;
  CHECK_RC(a.cuDeviceGet(&d, 1), CUDA_SUCCESS);
  CHECK(d == 1);
  CHECK_RC(a.cuDeviceGet(&d, 2), CUDA_ERROR_INVALID_DEVICE);
  char name[64];
  CHECK_RC(a.cuDeviceGetName(name, sizeof name, 1), CUDA_SUCCESS);
  CHECK(strcmp(name, "mnemosyne fake GPU 1") == 0);
  CHECK_RC(a.cuDeviceGetName(name, sizeof name, 7), CUDA_ERROR_INVALID_DEVICE);
  size_t total = 0;
  CHECK_RC(a.cuDeviceTotalMem(&total, 0), CUDA_SUCCESS);
  CHECK(total == (size_t{16} << 30));
  int v = -1;
  CHECK_RC(a.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 0),
           CUDA_SUCCESS);
  CHECK(v == 1);
  CHECK_RC(a.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, 0), CUDA_SUCCESS);
  CHECK(v == 0);
  CHECK_RC(a.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 1),
           CUDA_SUCCESS);
  CHECK(v == 9);
  CHECK_RC(a.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 1),
           CUDA_SUCCESS);
  CHECK(v == 0);
  CHECK_RC(a.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 0), CUDA_SUCCESS);
  CHECK(v == 0);
  CHECK_RC(a.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 2),
           CUDA_ERROR_INVALID_DEVICE);
}

// Returns the retained primary context of device 0, pushed.
CUcontext check_contexts(Api& a) {
  CUcontext cur = reinterpret_cast<CUcontext>(1);
  CHECK_RC(a.cuCtxGetCurrent(&cur), CUDA_SUCCESS);
  CHECK(cur == nullptr);
  CHECK_RC(a.cuCtxPopCurrent(&cur), CUDA_ERROR_INVALID_CONTEXT);

  // No current context: the allocation calls fail.
  const uint64_t inval_before = a.counters().invalid_context_calls;
  CUdeviceptr dp = 0;
  void* hp = nullptr;
  CHECK_RC(a.cuMemAllocManaged(&dp, kMiB, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_RC(a.cuMemHostAlloc(&hp, 4096, 0), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_RC(a.cuMemFree(0x1000), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_RC(a.cuMemAdvise(0x1000, 1, CU_MEM_ADVISE_SET_READ_MOSTLY, device_location(0)),
           CUDA_ERROR_INVALID_CONTEXT);
  CHECK(a.counters().invalid_context_calls == inval_before + 4);

  // Garbage handles are rejected without being dereferenced.
  CHECK_RC(a.cuCtxPushCurrent(reinterpret_cast<CUcontext>(uintptr_t{0x1234})),
           CUDA_ERROR_INVALID_CONTEXT);
  int on_stack[8] = {};
  CHECK_RC(a.cuCtxPushCurrent(reinterpret_cast<CUcontext>(on_stack)), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_RC(a.cuCtxSetCurrent(reinterpret_cast<CUcontext>(on_stack)), CUDA_ERROR_INVALID_CONTEXT);

  // Primary contexts: the same handle every time, one per device.
  CUcontext p0 = nullptr, p0b = nullptr, p1 = nullptr;
  CHECK_RC(a.cuDevicePrimaryCtxRetain(&p0, 0), CUDA_SUCCESS);
  CHECK_RC(a.cuDevicePrimaryCtxRetain(&p0b, 0), CUDA_SUCCESS);
  CHECK_RC(a.cuDevicePrimaryCtxRetain(&p1, 1), CUDA_SUCCESS);
  CHECK(p0 != nullptr && p0 == p0b && p1 != p0);
  CHECK_RC(a.cuDevicePrimaryCtxRetain(&p1, 5), CUDA_ERROR_INVALID_DEVICE);
  CHECK_RC(a.cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);  // still retained once

  // Stack semantics.
  CHECK_RC(a.cuCtxPushCurrent(p0), CUDA_SUCCESS);
  CHECK_RC(a.cuCtxPushCurrent(p1), CUDA_SUCCESS);
  CHECK_RC(a.cuCtxGetCurrent(&cur), CUDA_SUCCESS);
  CHECK(cur == p1);
  CHECK_RC(a.cuCtxPopCurrent(&cur), CUDA_SUCCESS);
  CHECK(cur == p1);
  CHECK_RC(a.cuCtxGetCurrent(&cur), CUDA_SUCCESS);
  CHECK(cur == p0);
  CHECK_RC(a.cuCtxSetCurrent(p1), CUDA_SUCCESS);  // replaces the top
  CHECK_RC(a.cuCtxGetCurrent(&cur), CUDA_SUCCESS);
  CHECK(cur == p1);
  CHECK_RC(a.cuCtxSetCurrent(nullptr), CUDA_SUCCESS);  // pops
  CHECK_RC(a.cuCtxGetCurrent(&cur), CUDA_SUCCESS);
  CHECK(cur == nullptr);

  // Created contexts become current; destroying pops them and frees their memory.
  CHECK_RC(a.cuCtxPushCurrent(p0), CUDA_SUCCESS);
  CUcontext c = nullptr;
  CHECK_RC(a.cuCtxCreate(&c, nullptr, 0, 1), CUDA_SUCCESS);
  CHECK_RC(a.cuCtxGetCurrent(&cur), CUDA_SUCCESS);
  CHECK(c != nullptr && cur == c);
  CHECK_RC(a.cuMemAllocManaged(&dp, kMiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  int dev = -1;
  CHECK_RC(a.cuPointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dp), CUDA_SUCCESS);
  CHECK(dev == 1);
  CHECK(a.owns(reinterpret_cast<void*>(dp)) == 1);
  CHECK_RC(a.cuCtxDestroy(p0), CUDA_ERROR_INVALID_CONTEXT);  // primary
  CHECK_RC(a.cuCtxDestroy(c), CUDA_SUCCESS);
  CHECK(a.owns(reinterpret_cast<void*>(dp)) == 0);
  CHECK(a.counters().ctx_freed_blocks == 1);
  CHECK_RC(a.cuCtxGetCurrent(&cur), CUDA_SUCCESS);
  CHECK(cur == p0);
  CHECK_RC(a.cuCtxPushCurrent(c), CUDA_ERROR_INVALID_CONTEXT);  // destroyed
  CHECK_RC(a.cuCtxCreate(&c, nullptr, 0x10000, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(a.cuCtxCreate(&c, nullptr, 0, 9), CUDA_ERROR_INVALID_DEVICE);

  // Releasing a primary context for the last time destroys its memory.
  CHECK_RC(a.cuCtxPushCurrent(p1), CUDA_SUCCESS);
  CHECK_RC(a.cuMemAllocManaged(&dp, kMiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  CHECK_RC(a.cuCtxPopCurrent(nullptr), CUDA_SUCCESS);
  CHECK_RC(a.cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
  CHECK(a.owns(reinterpret_cast<void*>(dp)) == 0);
  CHECK_RC(a.cuDevicePrimaryCtxRelease(1), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_RC(a.cuCtxPushCurrent(p1), CUDA_SUCCESS);  // inactive: cannot allocate
  CHECK_RC(a.cuMemAllocManaged(&dp, kMiB, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_RC(a.cuCtxPopCurrent(nullptr), CUDA_SUCCESS);
  CHECK(a.counters().ctx_freed_blocks == 2);
  return p0;
}

struct Blocks {
  CUdeviceptr managed = 0;
  void* host = nullptr;
};

Blocks check_memory(Api& a) {
  Blocks out;
  const fakecuda_counters before = a.counters();
  CUdeviceptr dp = 0;
  CHECK_RC(a.cuMemAllocManaged(&dp, 0, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(a.cuMemAllocManaged(&dp, kMiB, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(a.cuMemAllocManaged(nullptr, kMiB, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_INVALID_VALUE);

  // Managed: 2 MiB aligned, never 32 MiB aligned.
  std::vector<CUdeviceptr> ptrs;
  for (int i = 0; i < 24; ++i) {
    CUdeviceptr p = 0;
    const size_t size = (i % 3 == 0) ? 40 * kMiB : size_t(i + 1) * 100000;
    CHECK_RC(a.cuMemAllocManaged(&p, size, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    CHECK(p % (2 * kMiB) == 0);
    CHECK(p % (32 * kMiB) != 0);
    memset(reinterpret_cast<void*>(p), 0xab, size);
    CHECK(a.owns(reinterpret_cast<void*>(p + size - 1)) == 1);
    CHECK(a.owns(reinterpret_cast<void*>(p + size)) == 0);
    ptrs.push_back(p);
  }
  CHECK(a.counters().alloc_managed == before.alloc_managed + 24);
  for (CUdeviceptr p : ptrs) CHECK_RC(a.cuMemFree(p), CUDA_SUCCESS);
  CHECK(a.counters().free_managed == before.free_managed + 24);
  CHECK(a.counters().live_bytes == before.live_bytes);
  // The high-water mark saw all 24 at once (8 of 40 MiB, 16 small ones).
  CHECK(a.counters().peak_live_bytes >= before.live_bytes + 8 * 40 * kMiB);

  CHECK_RC(a.cuMemAllocManaged(&out.managed, 3 * kMiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  const CUdeviceptr m = out.managed;
  CHECK(a.counters().live_bytes == before.live_bytes + 3 * kMiB);

  // Pointer attributes of interior pointers.
  unsigned int u = 7;
  CHECK_RC(a.cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_IS_MANAGED, m + 12345), CUDA_SUCCESS);
  CHECK(u == 1);
  CHECK_RC(a.cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, m + 1), CUDA_SUCCESS);
  CHECK(u == CU_MEMORYTYPE_DEVICE);
  int dev = -1;
  CHECK_RC(a.cuPointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, m + 1), CUDA_SUCCESS);
  CHECK(dev == 0);
  CUdeviceptr start = 0;
  CHECK_RC(a.cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, m + 3 * kMiB - 1),
           CUDA_SUCCESS);
  CHECK(start == m);
  size_t range = 0;
  CHECK_RC(a.cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, m + 5), CUDA_SUCCESS);
  CHECK(range == 3 * kMiB);
  CHECK_RC(a.cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_IS_MANAGED, m + 3 * kMiB),
           CUDA_ERROR_INVALID_VALUE);
  int local = 0;
  CHECK_RC(a.cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                   reinterpret_cast<CUdeviceptr>(&local)),
           CUDA_ERROR_INVALID_VALUE);

  // Pinned: page aligned.
  CHECK_RC(a.cuMemHostAlloc(&out.host, 10000, CU_MEMHOSTALLOC_PORTABLE), CUDA_SUCCESS);
  CHECK(reinterpret_cast<uintptr_t>(out.host) % 4096 == 0);
  memset(out.host, 1, 10000);
  CHECK(a.owns(static_cast<char*>(out.host) + 9999) == 2);
  CHECK_RC(a.cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                   reinterpret_cast<CUdeviceptr>(out.host)),
           CUDA_SUCCESS);
  CHECK(u == 0);
  CHECK_RC(a.cuMemHostAlloc(&out.host, 10, 0x100), CUDA_ERROR_INVALID_VALUE);
  // The wrong free function, interior pointers, unknown pointers.
  CHECK_RC(a.cuMemFree(reinterpret_cast<CUdeviceptr>(out.host)), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(a.cuMemFreeHost(reinterpret_cast<void*>(m)), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(a.cuMemFree(m + 4096), CUDA_ERROR_INVALID_VALUE);
  CHECK(a.owns(reinterpret_cast<void*>(m)) == 1);
  CHECK(a.owns(out.host) == 2);

  // The legacy 32-bit cuMemFree never frees.
  const uint64_t legacy = a.counters().legacy_free_calls;
  CHECK_RC(a.cuMemFreeLegacy(static_cast<unsigned int>(m)), CUDA_ERROR_INVALID_VALUE);
  CHECK(a.counters().legacy_free_calls == legacy + 1);
  CHECK(a.owns(reinterpret_cast<void*>(m)) == 1);

  // Advice.
  CHECK_RC(a.cuMemAdvise(m, 3 * kMiB, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, device_location(1)),
           CUDA_SUCCESS);
  CHECK(a.counters().advise_last_device == 1);
  fakecuda_advice adv{};
  CHECK(a.get_advice(reinterpret_cast<void*>(m + 100), &adv) == 1);
  CHECK(adv.count == 1 && adv.advice == CU_MEM_ADVISE_SET_PREFERRED_LOCATION &&
        adv.loc_type == CU_MEM_LOCATION_TYPE_DEVICE && adv.loc_id == 1);
  CUmemLocation host{};
  host.type = CU_MEM_LOCATION_TYPE_HOST;
  CHECK_RC(a.cuMemAdvise(m + kMiB, kMiB, CU_MEM_ADVISE_SET_ACCESSED_BY, host), CUDA_SUCCESS);
  CHECK(a.counters().advise_last_device == -1);
  CHECK(a.counters().advise_last_loc_type == CU_MEM_LOCATION_TYPE_HOST);
  CHECK_RC(a.cuMemAdvise(m, kMiB, CU_MEM_ADVISE_SET_ACCESSED_BY, device_location(2)),
           CUDA_ERROR_INVALID_DEVICE);
  CHECK_RC(a.cuMemAdvise(m, 4 * kMiB, CU_MEM_ADVISE_SET_READ_MOSTLY, device_location(0)),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(a.cuMemAdvise(reinterpret_cast<CUdeviceptr>(out.host), 4096,
                         CU_MEM_ADVISE_SET_READ_MOSTLY, device_location(0)),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(a.cuMemAdvise(m, kMiB, static_cast<CUmem_advise>(42), device_location(0)),
           CUDA_ERROR_INVALID_VALUE);
  a.set_advise_error(CUDA_ERROR_NOT_SUPPORTED);
  CHECK_RC(a.cuMemAdvise(m, kMiB, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, device_location(0)),
           CUDA_ERROR_NOT_SUPPORTED);
  a.set_advise_error(0);
  CHECK(a.get_advice(reinterpret_cast<void*>(m), &adv) == 1);
  CHECK(adv.count == 3 && adv.loc_id == 0);
  CHECK(a.counters().advise_last_device == 0);
  CHECK(a.counters().advise_calls == before.advise_calls + 7);

  // The preferred location of a range: the injected failure above changed
  // nothing, so device 1 over the first 3 MiB still holds.
  int where = 42;
  const auto preferred = [&](CUdeviceptr p, size_t n) {
    return a.cuMemRangeGetAttribute(&where, sizeof where, CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION,
                                    p, n);
  };
  CHECK_RC(preferred(m + kMiB, kMiB), CUDA_SUCCESS);
  CHECK(where == 1);
  CHECK_RC(preferred(m, 3 * kMiB), CUDA_SUCCESS);
  CHECK(where == 1);
  CHECK_RC(preferred(m, 4 * kMiB), CUDA_ERROR_INVALID_VALUE);  // past the block
  CHECK_RC(preferred(reinterpret_cast<CUdeviceptr>(out.host), 4096), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(a.cuMemRangeGetAttribute(&where, 8, CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, m, kMiB),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(a.cuMemAdvise(m, kMiB, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, host), CUDA_SUCCESS);
  CHECK_RC(preferred(m, kMiB), CUDA_SUCCESS);
  CHECK(where == int(CU_DEVICE_CPU));
  CHECK_RC(preferred(m, 3 * kMiB), CUDA_SUCCESS);  // part CPU, part not advised
  CHECK(where == int(CU_DEVICE_INVALID));
  CHECK_RC(a.cuMemAdvise(m, kMiB, CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION, host), CUDA_SUCCESS);
  CHECK_RC(preferred(m, kMiB), CUDA_SUCCESS);
  CHECK(where == int(CU_DEVICE_INVALID));
  return out;
}

void check_fault_injection(Api& a) {
  a.set_fail_alloc_after(2);
  CUdeviceptr p1 = 0, p2 = 0, p3 = 0;
  void* h = nullptr;
  CHECK_RC(a.cuMemAllocManaged(&p1, kMiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  CHECK_RC(a.cuMemHostAlloc(&h, 4096, 0), CUDA_SUCCESS);
  CHECK_RC(a.cuMemAllocManaged(&p2, kMiB, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_RC(a.cuMemHostAlloc(&h, 4096, 0), CUDA_ERROR_OUT_OF_MEMORY);
  a.set_fail_alloc_after(-1);
  CHECK_RC(a.cuMemAllocManaged(&p2, kMiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  CHECK_RC(a.cuMemFree(p1), CUDA_SUCCESS);
  CHECK_RC(a.cuMemFree(p2), CUDA_SUCCESS);
  CHECK_RC(a.cuMemFreeHost(h), CUDA_SUCCESS);

  const uint64_t live = a.counters().live_bytes;
  a.set_mem_limit(live + 3 * kMiB);
  CHECK_RC(a.cuMemAllocManaged(&p1, 2 * kMiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  CHECK_RC(a.cuMemAllocManaged(&p2, 2 * kMiB, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_RC(a.cuMemAllocManaged(&p3, kMiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  CHECK_RC(a.cuMemFree(p1), CUDA_SUCCESS);
  CHECK_RC(a.cuMemAllocManaged(&p2, 2 * kMiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  a.set_mem_limit(0);
  CHECK_RC(a.cuMemAllocManaged(&p1, 64 * kMiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  CHECK_RC(a.cuMemFree(p1), CUDA_SUCCESS);
  CHECK_RC(a.cuMemFree(p2), CUDA_SUCCESS);
  CHECK_RC(a.cuMemFree(p3), CUDA_SUCCESS);
  CHECK(a.counters().live_bytes == live);
}

#if !defined(_WIN32)
void check_fork(Api& a, const Blocks& blocks) {
  fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    int bad = 0;
    int v = 0;
    if (a.cuDriverGetVersion(&v) != CUDA_ERROR_NOT_INITIALIZED) bad |= 1;
    if (a.cuDeviceGetCount(&v) != CUDA_ERROR_NOT_INITIALIZED) bad |= 2;
    if (a.cuInit(0) != CUDA_ERROR_NOT_INITIALIZED) bad |= 4;
    CUdeviceptr p = 0;
    if (a.cuMemAllocManaged(&p, 4096, CU_MEM_ATTACH_GLOBAL) != CUDA_ERROR_NOT_INITIALIZED) bad |= 8;
    void* fn = nullptr;
    if (a.cuGetProcAddress("cuInit", &fn, kDoubleVersion, 0, nullptr) != CUDA_ERROR_NOT_INITIALIZED)
      bad |= 16;
    if (a.owns(reinterpret_cast<void*>(blocks.managed)) != 0) bad |= 32;
    _exit(bad);
  }
  int status = 0;
  CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
    fprintf(stderr, "fork child: failure bits 0x%x\n", WEXITSTATUS(status));

  // The driver's memory is not inherited: touching it in the child faults.
  const void* targets[] = {reinterpret_cast<void*>(blocks.managed), blocks.host};
  for (const void* target : targets) {
    pid = fork();
    if (pid == 0) {
      rlimit no_core{0, 0};
      setrlimit(RLIMIT_CORE, &no_core);
      signal(SIGSEGV, SIG_DFL);  // a sanitizer's handler would turn the fault into an exit
      volatile const char* q = static_cast<volatile const char*>(target);
      _exit(q[0] == 0x7f ? 3 : 4);
    }
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
  }
  // The parent is unaffected.
  int n = 0;
  CHECK_RC(a.cuDeviceGetCount(&n), CUDA_SUCCESS);
}
#endif

void check_threads(Api& a, CUcontext primary) {
  // The internal thread: about 30 malloc/free pairs under the driver lock.
  const double deadline = now_ms() + 3000;
  while (a.counters().thread_finished == 0 && now_ms() < deadline) usleep(2000);
  CHECK(a.counters().thread_finished == 1);
  CHECK(a.counters().thread_allocs == 30);

  // Concurrent allocation from several threads, each with its own stack.
  struct Arg {
    Api* api;
    CUcontext ctx;
    std::atomic<int>* errors;
  };
  std::atomic<int> errors{0};
  Arg arg{&a, primary, &errors};
  auto body = [](void* p) -> void* {
    Arg* g = static_cast<Arg*>(p);
    Api& api = *g->api;
    CUcontext cur = nullptr;
    if (api.cuCtxGetCurrent(&cur) != CUDA_SUCCESS || cur != nullptr) ++*g->errors;
    if (api.cuCtxPushCurrent(g->ctx) != CUDA_SUCCESS) ++*g->errors;
    for (int i = 0; i < 200; ++i) {
      CUdeviceptr d = 0;
      void* h = nullptr;
      if (api.cuMemAllocManaged(&d, 4096 * size_t(1 + i % 7), CU_MEM_ATTACH_GLOBAL) != CUDA_SUCCESS)
        ++*g->errors;
      if (api.cuMemHostAlloc(&h, 100, 0) != CUDA_SUCCESS) ++*g->errors;
      if (api.owns(reinterpret_cast<void*>(d)) != 1 || api.owns(h) != 2) ++*g->errors;
      if (api.cuMemFree(d) != CUDA_SUCCESS) ++*g->errors;
      if (api.cuMemFreeHost(h) != CUDA_SUCCESS) ++*g->errors;
    }
    if (api.cuCtxPopCurrent(nullptr) != CUDA_SUCCESS) ++*g->errors;
    return nullptr;
  };
  pthread_t t[4];
  for (pthread_t& th : t) CHECK(pthread_create(&th, nullptr, body, &arg) == 0);
  for (pthread_t& th : t) pthread_join(th, nullptr);
  CHECK(errors.load() == 0);
}

void check_log(const char* path, pid_t self) {
  const std::string log = read_file(path);
  const std::string pid = std::to_string(self) + " ";
  const char* expected[] = {
      "fail call=cuDeviceGetCount rc=3",
      "init rc=100",
      "fail call=cuInit rc=100",
      "init rc=0",
      "alloc kind=managed ptr=0x",
      "alloc kind=host ptr=0x",
      "free kind=managed ptr=0x",
      "free kind=host ptr=0x",
      "advise ptr=0x",
      "fail call=cuMemAdvise_v2 rc=801\n",  // the injected advise error
      "legacy-free ptr32=0x",
      "fail call=cuMemAllocManaged rc=201",
      "fail call=cuMemAllocManaged rc=2\n",
      "fail call=cuGetProcAddress_v2 rc=500",
      "ctx-free kind=managed",
      "thread-exit allocs=30",
      "memset kind=managed ptr=0x",
      "memset kind=host ptr=0x",
  };
  for (const char* e : expected) {
    if (!contains(log, pid + e)) {
      fprintf(stderr, "log lacks \"%s%s\"\n", pid.c_str(), e);
      ++g_failures;
    }
  }
  CHECK(contains(log, " advice=3 loc_type=1 loc_id=1 rc=0\n"));
#if !defined(_WIN32)
  CHECK(contains(log, " fork-child\n"));
#endif
  // One well-formed line per event: "<pid> <event> ...".
  size_t lines = 0;
  for (size_t pos = 0; pos < log.size();) {
    size_t nl = log.find('\n', pos);
    CHECK(nl != std::string::npos);
    if (nl == std::string::npos) break;
    const std::string line = log.substr(pos, nl - pos);
    char* end = nullptr;
    long p = strtol(line.c_str(), &end, 10);
    CHECK(p > 0 && end != nullptr && *end == ' ' && end[1] != '\0');
    pos = nl + 1;
    ++lines;
  }
  CHECK(lines > 50);
}

void check_noproc(const char* path) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  CHECK(h != nullptr);
  if (h == nullptr) return;
  CHECK(dlsym(h, "cuGetProcAddress_v2") == nullptr);
  CHECK(dlsym(h, "cuGetProcAddress") == nullptr);
  const char* versioned[] = {"cuInit",
                             "cuMemFree_v2",
                             "cuMemAdvise_v2",
                             "cuCtxCreate_v4",
                             "cuCtxDestroy_v2",
                             "cuCtxPushCurrent_v2",
                             "cuCtxPopCurrent_v2",
                             "cuDevicePrimaryCtxRelease_v2",
                             "cuDeviceTotalMem_v2",
                             "cuMemAllocManaged",
                             "cuMemHostAlloc",
                             "cuMemFreeHost",
                             "cuPointerGetAttribute",
                             "cuMemFree",
                             "fakecuda_get_counters"};
  for (const char* name : versioned) {
    if (dlsym(h, name) == nullptr) {
      fprintf(stderr, "noproc library lacks %s\n", name);
      ++g_failures;
    }
  }
  auto version = reinterpret_cast<PFN_cuDriverGetVersion_v2020>(dlsym(h, "cuDriverGetVersion"));
  int v = 0;
  CHECK(version != nullptr && version(&v) == CUDA_SUCCESS && v == 13000);
  // Only the driver's exports and the fakecuda_* functions are visible.
  CHECK(dlsym(h, "_ZN8fakecuda10g_countersE") == nullptr);
}

// ------------------------------------------------------------------ env children

int run_env_faults(const char* lib) {
  Api a;
  if (!open_api(lib, &a, true)) return 1;
  const double t0 = now_ms();
  CHECK_RC(a.cuInit(0), CUDA_SUCCESS);
  CHECK(now_ms() - t0 >= 50);  // FAKECUDA_INIT_DELAY_MS=60
  int n = 0;
  CHECK_RC(a.cuDeviceGetCount(&n), CUDA_SUCCESS);
  CHECK(n == 1);
  int v = 0;
  CHECK_RC(a.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, 0), CUDA_SUCCESS);
  CHECK(v == 1);
  void* fn = nullptr;
  CHECK_RC(a.cuGetProcAddress("cuPointerGetAttribute", &fn, kDoubleVersion, 0, nullptr),
           CUDA_ERROR_NOT_FOUND);
  CHECK_RC(a.cuGetProcAddress("cuMemFree", &fn, kDoubleVersion, 0, nullptr), CUDA_SUCCESS);
  CUcontext ctx = nullptr;
  CHECK_RC(a.cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
  CHECK_RC(a.cuCtxPushCurrent(ctx), CUDA_SUCCESS);
  // FAKECUDA_FAIL_ALLOC_AFTER=2, FAKECUDA_MEM_LIMIT=3 MiB.
  CUdeviceptr p1 = 0, p2 = 0;
  CHECK_RC(a.cuMemAllocManaged(&p1, 2 * kMiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);  // 1st
  CHECK_RC(a.cuMemAllocManaged(&p2, 2 * kMiB, CU_MEM_ATTACH_GLOBAL),                 // 2nd
           CUDA_ERROR_OUT_OF_MEMORY);                                                // (limit)
  // FAKECUDA_ADVISE_ERROR=999: recorded, then failed.
  CHECK_RC(a.cuMemAdvise(p1, kMiB, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, device_location(0)),
           CUDA_ERROR_UNKNOWN);
  fakecuda_advice adv{};
  CHECK(a.get_advice(reinterpret_cast<void*>(p1), &adv) == 1 && adv.count == 1);
  CHECK_RC(a.cuMemFree(p1), CUDA_SUCCESS);
  void* h = nullptr;
  CHECK_RC(a.cuMemHostAlloc(&h, 4096, 0), CUDA_ERROR_OUT_OF_MEMORY);  // 3rd (after N)
  // FAKECUDA_THREAD_ITERS=0: no internal thread.
  usleep(20000);
  CHECK(a.counters().thread_allocs == 0);
  return g_failures == 0 ? 0 : 1;
}

int run_env_nodev(const char* lib) {
  Api a;
  if (!open_api(lib, &a, false)) return 1;
  CHECK_RC(a.cuInit(0), CUDA_SUCCESS);
  int n = -1;
  CHECK_RC(a.cuDeviceGetCount(&n), CUDA_SUCCESS);
  CHECK(n == 0);
  CUdevice d = 0;
  CHECK_RC(a.cuDeviceGet(&d, 0), CUDA_ERROR_INVALID_DEVICE);
  CUcontext ctx = nullptr;
  CHECK_RC(a.cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_ERROR_INVALID_DEVICE);
  return g_failures == 0 ? 0 : 1;
}

#if defined(_WIN32)
// The child inherits this process's environment: set env, spawn, restore.
// (_spawnl does not quote: the paths must not contain spaces.)
bool run_child(const char* mode, const char* lib, const std::vector<std::string>& env) {
  fflush(nullptr);
  std::vector<std::string> names, saved;
  for (const std::string& e : env) {
    const size_t eq = e.find('=');
    names.push_back(e.substr(0, eq));
    const char* old = getenv(names.back().c_str());
    saved.push_back(old != nullptr ? old : "");
    _putenv_s(names.back().c_str(), e.c_str() + eq + 1);
  }
  char self[MAX_PATH];
  const DWORD len = GetModuleFileNameA(nullptr, self, sizeof self);
  const intptr_t status =
      len == 0 || len == sizeof self
          ? -1
          : _spawnl(_P_WAIT, self, "fakecuda_selftest", mode, lib, static_cast<char*>(nullptr));
  for (size_t i = 0; i < names.size(); ++i) _putenv_s(names[i].c_str(), saved[i].c_str());
  if (status != 0) {
    fprintf(stderr, "child %s failed (status %d)\n", mode, int(status));
    return false;
  }
  return true;
}
#else
bool run_child(const char* mode, const char* lib, const std::vector<std::string>& env) {
  fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    for (const std::string& e : env) putenv(const_cast<char*>(e.c_str()));
    execl("/proc/self/exe", "fakecuda_selftest", mode, lib, static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return false;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "child %s failed (status 0x%x)\n", mode, status);
    return false;
  }
  return true;
}
#endif

#if defined(_WIN32)
// No residency simulation: nothing moves to the device, the copy call reads
// the CPU's data.
void check_residency(Api& a) {
  CUdeviceptr dp = 0;
  CHECK_RC(a.cuMemAllocManaged(&dp, 4 * 4096, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  auto* p = reinterpret_cast<unsigned char*>(dp);
  memset(p, 0x3c, 4 * 4096);
  CHECK(a.migrate_to_device(p, 4096) == -1);
  CHECK(a.on_device(p) == 0);
  unsigned char out[100] = {};
  CHECK_RC(a.cuMemcpyDtoH(out, dp + 4000, sizeof out), CUDA_SUCCESS);
  CHECK(out[0] == 0x3c && out[99] == 0x3c);
  a.set_copy_error(CUDA_ERROR_UNKNOWN);
  CHECK_RC(a.cuMemcpyDtoH(out, dp, sizeof out), CUDA_ERROR_UNKNOWN);
  a.set_copy_error(0);
  CHECK_RC(a.cuMemcpyDtoH(out, dp, 5 * 4096), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(a.cuMemFree(dp), CUDA_SUCCESS);
}
#else
// Pages on the device: mincore calls them not resident, yet they hold data;
// the copy call reads it in place; a CPU touch migrates it back.
void check_residency(Api& a) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  CUdeviceptr dp = 0;
  CHECK_RC(a.cuMemAllocManaged(&dp, 16 * page, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  auto* p = reinterpret_cast<unsigned char*>(dp);
  for (size_t i = 0; i < 16 * page; ++i) p[i] = static_cast<unsigned char>(i * 13 + 1);
  const fakecuda_counters before = a.counters();
  CHECK(a.migrate_to_device(p + 4 * page, 8 * page) == 8);
  CHECK(a.migrate_to_device(p, 16 * page) == 8);  // the others; the 8 stay
  CHECK(a.on_device(p + 5 * page) == 1);
  unsigned char residency[16] = {};
  CHECK(mincore(p, 16 * page, residency) == 0);
  int resident = 0;
  for (unsigned char r : residency) resident += r & 1;
  CHECK(resident == 0);  // a naive reading: "nothing here"
  std::vector<unsigned char> out(16 * page);
  CHECK_RC(a.cuMemcpyDtoH(out.data(), dp, out.size()), CUDA_SUCCESS);
  bool same = true;
  for (size_t i = 0; i < out.size(); ++i)
    same = same && out[i] == static_cast<unsigned char>(i * 13 + 1);
  CHECK(same);
  CHECK(a.on_device(p + 5 * page) == 1);  // read in place: still there
  CHECK(a.counters().cpu_migrations == before.cpu_migrations);
  CHECK(a.counters().dtoh_bytes == before.dtoh_bytes + out.size());
  // A CPU touch migrates just that page back, with its data.
  CHECK(p[5 * page + 7] == static_cast<unsigned char>((5 * page + 7) * 13 + 1));
  CHECK(a.on_device(p + 5 * page) == 0 && a.on_device(p + 6 * page) == 1);
  CHECK(a.counters().cpu_migrations == before.cpu_migrations + 1);
  p[6 * page] = 0xee;  // a write migrates too
  CHECK(a.on_device(p + 6 * page) == 0);
  CHECK(a.counters().cpu_migrations == before.cpu_migrations + 2);
  // The copy call: injected failure, bad ranges.
  a.set_copy_error(CUDA_ERROR_UNKNOWN);
  CHECK_RC(a.cuMemcpyDtoH(out.data(), dp, page), CUDA_ERROR_UNKNOWN);
  a.set_copy_error(0);
  CHECK_RC(a.cuMemcpyDtoH(out.data(), dp, 17 * page), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(a.cuMemcpyDtoH(out.data(), CUdeviceptr(out.data()), page), CUDA_ERROR_INVALID_VALUE);
  CHECK(a.migrate_to_device(out.data(), page) == -1);  // not the driver's memory
  CHECK_RC(a.cuMemFree(dp), CUDA_SUCCESS);
  CHECK(a.on_device(p) == 0);
}
#endif

// Device memory and the copies to and from it (gpu_probe gains): device
// memory reads as the device's, a copy round-trips its bytes from pageable
// and driver memory, the async forms check their stream, ranges the driver
// did not hand out are refused, and cuMemFree_v2 frees it.
void check_device_copies(Api& a) {
  constexpr size_t kBytes = 3 * 4096 + 100;
  CUdeviceptr dev = 0;
  CHECK_RC(a.cuMemAlloc(&dev, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(a.cuMemAlloc(&dev, kBytes), CUDA_SUCCESS);
  unsigned type = 0;
  CHECK_RC(a.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dev + 5), CUDA_SUCCESS);
  CHECK(type == CU_MEMORYTYPE_DEVICE);
  std::vector<unsigned char> in(kBytes), out(kBytes);
  for (size_t i = 0; i < kBytes; ++i) in[i] = static_cast<unsigned char>(i * 7 + 3);
  const fakecuda_counters before = a.counters();
  CHECK_RC(a.cuMemcpyHtoD(dev, in.data(), kBytes), CUDA_SUCCESS);  // pageable source
  CHECK_RC(a.cuMemcpyDtoH(out.data(), dev, kBytes), CUDA_SUCCESS);
  CHECK(out == in);
  CHECK(a.counters().htod_calls == before.htod_calls + 1);
  CHECK(a.counters().htod_bytes == before.htod_bytes + kBytes);
  // From managed memory, on a stream, and back on it.
  CUdeviceptr managed = 0;
  CHECK_RC(a.cuMemAllocManaged(&managed, kBytes, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  memset(reinterpret_cast<void*>(managed), 0x5c, kBytes);
  CUstream s = nullptr;
  CHECK_RC(a.cuStreamCreate(&s, 0), CUDA_SUCCESS);
  CHECK_RC(a.cuMemcpyHtoDAsync(dev, reinterpret_cast<void*>(managed), kBytes, s), CUDA_SUCCESS);
  CHECK_RC(a.cuMemcpyDtoHAsync(out.data(), dev, kBytes, s), CUDA_SUCCESS);
  CHECK_RC(a.cuStreamSynchronize(s), CUDA_SUCCESS);
  CHECK(std::all_of(out.begin(), out.end(), [](unsigned char c) { return c == 0x5c; }));
  CHECK(a.counters().dtoh_calls == before.dtoh_calls + 2);
  // Refused: a destroyed stream, a range past the block, memory the driver
  // did not hand out.
  CHECK_RC(a.cuStreamDestroy(s), CUDA_SUCCESS);
  CHECK_RC(a.cuMemcpyHtoDAsync(dev, in.data(), kBytes, s), CUDA_ERROR_INVALID_HANDLE);
  CHECK_RC(a.cuMemcpyHtoD(dev, in.data(), 5 * 4096), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(a.cuMemcpyHtoD(CUdeviceptr(out.data()), in.data(), 16), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(a.cuMemcpyHtoD(dev, nullptr, 16), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(a.cuMemFree(managed), CUDA_SUCCESS);
  CHECK_RC(a.cuMemFree(dev), CUDA_SUCCESS);
  CHECK_RC(a.cuMemFree(dev), CUDA_ERROR_INVALID_VALUE);
}

// Streams and the device memset: handles are checked; a memset sets
// exactly its range, wherever each page lives, and whole pages of managed
// memory set to zero take no host RAM (Linux: mincore).
void check_streams_and_memset(Api& a) {
  const size_t page = 4096;
  CUstream s = nullptr;
  CHECK_RC(a.cuStreamCreate(nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(a.cuStreamCreate(&s, 2), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(a.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CHECK(a.counters().live_streams == 1);
  CUdeviceptr dp = 0;
  CHECK_RC(a.cuMemAllocManaged(&dp, 16 * page, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  auto* p = reinterpret_cast<unsigned char*>(dp);
  memset(p, 0x11, 16 * page);
#if !defined(_WIN32)
  CHECK(a.migrate_to_device(p + 8 * page, page) == 1);  // one page lives on the device
#endif
  const fakecuda_counters before = a.counters();
  // From the middle of page 1 to the middle of page 12: ten whole pages.
  CHECK_RC(a.cuMemsetD8Async(dp + page + 100, 0, 11 * page, s), CUDA_SUCCESS);
  CHECK_RC(a.cuStreamSynchronize(s), CUDA_SUCCESS);
  CHECK(a.counters().memset_calls == before.memset_calls + 1);
  CHECK(a.counters().memset_bytes == before.memset_bytes + 11 * page);
#if !defined(_WIN32)
  unsigned char residency[16] = {};
  CHECK(mincore(p, 16 * page, residency) == 0);
  int resident = 0;
  for (int i = 2; i < 12; ++i) resident += residency[i] & 1;
  CHECK(resident == 0);  // set on the device: nothing in host RAM
#endif
  bool exact = true;
  for (size_t i = 0; i < 16 * page; ++i) {
    const bool inside = i >= page + 100 && i < 12 * page + 100;
    exact = exact && p[i] == (inside ? 0 : 0x11);
  }
  CHECK(exact);
  // A non-zero value, on the legacy stream; pinned memory too.
  CHECK_RC(a.cuMemsetD8Async(dp, 0x7e, 10, nullptr), CUDA_SUCCESS);
  CHECK(p[0] == 0x7e && p[9] == 0x7e && p[10] == 0x11);
  void* host = nullptr;
  CHECK_RC(a.cuMemHostAlloc(&host, 2 * page, CU_MEMHOSTALLOC_DEVICEMAP), CUDA_SUCCESS);
  memset(host, 0x22, 2 * page);
  CHECK_RC(a.cuMemsetD8Async(CUdeviceptr(host) + 1, 0, page, s), CUDA_SUCCESS);
  CHECK(static_cast<unsigned char*>(host)[0] == 0x22 && static_cast<unsigned char*>(host)[1] == 0 &&
        static_cast<unsigned char*>(host)[page] == 0 &&
        static_cast<unsigned char*>(host)[page + 1] == 0x22);
  // Outside one block, or a bad handle.
  CHECK_RC(a.cuMemsetD8Async(dp, 0, 17 * page, s), CUDA_ERROR_INVALID_VALUE);
  unsigned char mine[64];
  CHECK_RC(a.cuMemsetD8Async(CUdeviceptr(mine), 0, sizeof mine, s), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(a.cuMemsetD8Async(dp, 0, page, reinterpret_cast<CUstream>(mine)),
           CUDA_ERROR_INVALID_HANDLE);
  // A discard: each range in one managed block, a stream of the caller's;
  // the pages read zero afterwards (the double is not dirty here).
  memset(p, 0x33, 16 * page);
  CUdeviceptr ranges[2] = {dp, dp + 8 * page};
  size_t sizes[2] = {4 * page, 8 * page};
  const fakecuda_counters before_discard = a.counters();
  CHECK_RC(a.cuMemDiscardBatchAsync(ranges, sizes, 2, 0, nullptr), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(a.cuMemDiscardBatchAsync(ranges, sizes, 2, 1, s), CUDA_ERROR_INVALID_VALUE);
  size_t too_big[2] = {4 * page, 9 * page};
  CHECK_RC(a.cuMemDiscardBatchAsync(ranges, too_big, 2, 0, s), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr pinned[1] = {CUdeviceptr(host)};
  CHECK_RC(a.cuMemDiscardBatchAsync(pinned, sizes, 1, 0, s), CUDA_ERROR_INVALID_VALUE);
  CHECK(p[0] == 0x33 && p[15 * page] == 0x33);  // refused batches change nothing
  CHECK_RC(a.cuMemDiscardBatchAsync(ranges, sizes, 2, 0, s), CUDA_SUCCESS);
  CHECK(p[0] == 0 && p[4 * page - 1] == 0 && p[4 * page] == 0x33 && p[8 * page] == 0 &&
        p[16 * page - 1] == 0);
  CHECK(a.counters().discard_calls == before_discard.discard_calls + 1);
  CHECK(a.counters().discard_bytes == before_discard.discard_bytes + 12 * page);
  CHECK_RC(a.cuStreamDestroy(s), CUDA_SUCCESS);
  CHECK_RC(a.cuStreamDestroy(s), CUDA_ERROR_INVALID_HANDLE);
  CHECK_RC(a.cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
  CHECK(a.counters().live_streams == 0);
  CHECK_RC(a.cuMemFreeHost(host), CUDA_SUCCESS);
  CHECK_RC(a.cuMemFree(dp), CUDA_SUCCESS);
}

}  // namespace

#if !defined(_WIN32)
// The virtual-memory API with host memory, as an H200 showed it (gpu_probe
// vmm-host): 2 MiB granules mapped side by side in one reservation are one
// range for copies (two reservations are not); the CPU reaches a mapping
// only once given access; a forked child shares the mapping's pages; what
// is still mapped keeps its reservation; releases free the memory once
// unmapped; FAKECUDA_DIRTY applies (checked by the e2e cases).
void check_vmm(Api& a) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
  size_t g = 0;
  CHECK_RC(a.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
           CUDA_SUCCESS);
  CHECK(g == 2 * kMiB);
  const fakecuda_counters before = a.counters();
  CUdeviceptr base = 0;
  CUdeviceptr other = 0;
  CHECK_RC(a.cuMemAddressReserve(&base, 3 * g, g, 0, 0), CUDA_SUCCESS);
  CHECK_RC(a.cuMemAddressReserve(&other, g, g, 0, 0), CUDA_SUCCESS);
  CHECK_RC(a.cuMemAddressReserve(&other, g + 4096, g, 0, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK(base % g == 0);
  CUmemGenericAllocationHandle h[3] = {};
  for (auto& x : h) CHECK_RC(a.cuMemCreate(&x, g, &prop, 0), CUDA_SUCCESS);
  CHECK(a.counters().vmm_bytes == before.vmm_bytes + 3 * g);
  CHECK_RC(a.cuMemMap(base, g, 0, h[0], 0), CUDA_SUCCESS);
  CHECK_RC(a.cuMemMap(base + g, g, 0, h[1], 0), CUDA_SUCCESS);
  CHECK_RC(a.cuMemMap(base, g, 0, h[2], 0), CUDA_ERROR_ALREADY_MAPPED);
  CHECK_RC(a.cuMemMap(other, g, 0, h[2], 0), CUDA_SUCCESS);
  CUmemAccessDesc access[2] = {};
  access[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access[0].location.id = 0;
  access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  access[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  access[1].location.id = 0;
  access[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  // Before cuMemSetAccess the CPU has no access: a child touching it dies.
  auto* p = reinterpret_cast<unsigned char*>(base);
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL);  // not a sanitizer's report
    signal(SIGBUS, SIG_DFL);
    p[0] = 1;
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(!(WIFEXITED(status) && WEXITSTATUS(status) == 0));  // the write did not happen
  CHECK_RC(a.cuMemSetAccess(base, 2 * g, access, 2), CUDA_SUCCESS);
  CHECK_RC(a.cuMemSetAccess(other, g, access, 2), CUDA_SUCCESS);
  CHECK_RC(a.cuMemSetAccess(base + 2 * g, g, access, 2), CUDA_ERROR_INVALID_VALUE);  // unmapped
  for (size_t i = 0; i < 2 * g; i += 4096) CHECK(p[i] == 0);
  memset(p, 0x5a, 2 * g);
  CHECK(a.owns(p + g) == 2);
  // A copy across the two mappings of one reservation: taken. Across two
  // reservations (other may lie anywhere): one range each only.
  static unsigned char out[8192];
  CHECK_RC(a.cuMemcpyDtoH(out, base + g - 4096, 8192), CUDA_SUCCESS);
  CHECK(out[0] == 0x5a && out[8191] == 0x5a);
  CHECK_RC(a.cuMemcpyDtoH(out, other + g - 4096, 8192), CUDA_ERROR_INVALID_VALUE);
  // Shared: a child's write reaches the parent, until MADV_DONTFORK.
  pid = fork();
  if (pid == 0) {
    p[0] = 7;
    _exit(0);
  }
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && p[0] == 7);
  CHECK(madvise(p, 2 * g, MADV_DONTFORK) == 0);
  // Still mapped: the reservation cannot be freed; an unmap names whole mappings.
  CHECK_RC(a.cuMemAddressFree(base, 3 * g), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(a.cuMemUnmap(base, g / 2), CUDA_ERROR_INVALID_VALUE);
  for (auto& x : h) CHECK_RC(a.cuMemRelease(x), CUDA_SUCCESS);
  CHECK_RC(a.cuMemRelease(h[0]), CUDA_ERROR_INVALID_VALUE);
  CHECK(a.counters().vmm_bytes == before.vmm_bytes + 3 * g);  // still mapped
  CHECK_RC(a.cuMemUnmap(base, 2 * g), CUDA_SUCCESS);
  CHECK_RC(a.cuMemUnmap(other, g), CUDA_SUCCESS);
  CHECK(a.counters().vmm_bytes == before.vmm_bytes);
  CHECK(a.owns(p) == 0);
  CHECK_RC(a.cuMemAddressFree(base, 3 * g), CUDA_SUCCESS);
  CHECK_RC(a.cuMemAddressFree(other, g), CUDA_SUCCESS);
  // Device memory is not modelled; a driver before CUDA 12.2 knows no host
  // location (FAKECUDA_VMM_HOST=0, checked by the arena's tests).
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CHECK_RC(a.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
           CUDA_ERROR_NOT_SUPPORTED);
}
#endif

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[1], "--env-faults") == 0) return run_env_faults(argv[2]);
  if (argc == 3 && strcmp(argv[1], "--env-nodev") == 0) return run_env_nodev(argv[2]);
  if (argc != 3) {
    fprintf(stderr, "usage: %s <libfakecuda.so> <libfakecuda-noproc.so>\n", argv[0]);
    return 2;
  }
  const char* lib = argv[1];
  const char* noproc = argv[2];

#if defined(_WIN32)
  char temp_dir[MAX_PATH];
  char log_path[MAX_PATH];
  const DWORD dir_len = GetTempPathA(sizeof temp_dir, temp_dir);
  if (dir_len == 0 || dir_len >= sizeof temp_dir ||
      GetTempFileNameA(temp_dir, "fcu", 0, log_path) == 0) {
    fprintf(stderr, "GetTempFileName failed: %lu\n", GetLastError());
    return 1;
  }
#else
  char log_path[] = "/tmp/fakecuda-selftest-XXXXXX";
  int fd = mkstemp(log_path);
  if (fd < 0) {
    perror("mkstemp");
    return 1;
  }
  close(fd);
#endif
  const char* cleared[] = {"FAKECUDA_INIT_ERROR",       "FAKECUDA_INIT_DELAY_MS",
                           "FAKECUDA_FAIL_ALLOC_AFTER", "FAKECUDA_MEM_LIMIT",
                           "FAKECUDA_MISSING",          "FAKECUDA_ADVISE_ERROR",
                           "FAKECUDA_PAGEABLE",         "FAKECUDA_CONCURRENT_MANAGED",
                           "FAKECUDA_THREAD_ITERS",     "FAKECUDA_THREAD_FIRST_ALLOC",
                           "FAKECUDA_COPY_ERROR",       "FAKECUDA_STUB",
                           "FAKECUDA_INIT_CRASH"};
  for (const char* name : cleared) unsetenv(name);
  setenv("FAKECUDA_LOG", log_path, 1);
  setenv("FAKECUDA_DEVICES", "2", 1);
  setenv("FAKECUDA_THREAD_ALLOC_MAX", "16777216", 1);

  Api a;
  if (!open_api(lib, &a, true)) return 1;
  check_before_init(a);
  check_proc_address(a);
  check_devices(a);
  CUcontext primary = check_contexts(a);
  const Blocks blocks = check_memory(a);
  check_fault_injection(a);
  check_residency(a);
  check_streams_and_memset(a);
  check_device_copies(a);
#if !defined(_WIN32)
  check_fork(a, blocks);
  check_vmm(a);
#endif
  check_threads(a, primary);
  CHECK_RC(a.cuMemFree(blocks.managed), CUDA_SUCCESS);
  CHECK_RC(a.cuMemFreeHost(blocks.host), CUDA_SUCCESS);
  CHECK(a.owns(reinterpret_cast<void*>(blocks.managed)) == 0);
  check_log(log_path, getpid());

  a.reset_counters();
  fakecuda_counters c = a.counters();
  CHECK(c.total_calls == 0 && c.failed_calls == 0 && c.advise_last_device == -1);
  CHECK(c.live_bytes == 0);
  CHECK_RC(a.cuCtxPopCurrent(nullptr), CUDA_SUCCESS);
  CHECK_RC(a.cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
  c = a.counters();
  CHECK(c.total_calls == 2 && c.failed_calls == 0);

  check_noproc(noproc);

  const std::string log_env = std::string("FAKECUDA_LOG=") + log_path;
  CHECK(run_child(
      "--env-faults", lib,
      {log_env, "FAKECUDA_DEVICES=1", "FAKECUDA_PAGEABLE=1", "FAKECUDA_INIT_DELAY_MS=60",
       "FAKECUDA_FAIL_ALLOC_AFTER=2", "FAKECUDA_MEM_LIMIT=3145728", "FAKECUDA_ADVISE_ERROR=999",
       "FAKECUDA_MISSING=cuPointerGetAttribute", "FAKECUDA_THREAD_ITERS=0"}));
  CHECK(run_child("--env-nodev", lib, {log_env, "FAKECUDA_DEVICES=0", "FAKECUDA_THREAD_ITERS=0"}));
  CHECK(
      run_child("--env-nodev", noproc, {log_env, "FAKECUDA_DEVICES=0", "FAKECUDA_THREAD_ITERS=0"}));

  unlink(log_path);
  if (g_failures != 0) {
    fprintf(stderr, "fakecuda_selftest: %d failure(s)\n", g_failures);
    return 1;
  }
  printf("fakecuda_selftest: all checks passed\n");
  return 0;
}
