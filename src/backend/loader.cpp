// One-time loading of the CUDA driver: the library, entry points, cuInit.
//
// Nothing here allocates: the state lives in static storage, messages are
// formatted with snprintf into fixed arrays. dlopen/dlsym/cuInit may call
// malloc; they run with the thread's in-driver flag set so that an
// interposer serves those calls without re-entering the driver.
#include "backend/loader.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/driver_call.hpp"
#include "backend/internal.hpp"
#include "platform/crash_guard.hpp"
#include "platform/platform.hpp"

namespace mnemosyne {
namespace {

constinit DriverApi g_api{};
constinit DriverInfo g_info{};
constinit std::atomic<int> g_state{static_cast<int>(DriverState::uninitialized)};
constinit std::atomic<bool> g_forked{false};

// Device ordinal in the low bits; kFrozen once the first allocation used it.
constexpr unsigned kFrozen = 1u << 31;
constinit std::atomic<unsigned> g_ordinal{0};
constinit std::atomic<bool> g_own_context{false};

// Resolves entry points by cuGetProcAddress_v2 when the driver exports it,
// else by the versioned export name.
class Resolver {
 public:
  explicit Resolver(void* handle) noexcept : handle_(handle) {
    getproc_ = reinterpret_cast<PFN_cuGetProcAddress_v12000>(
        Os::find_symbol(handle, "cuGetProcAddress_v2"));
  }

  // Asks the driver for its version (allowed before cuInit) and from then on
  // requests entry points for min(CUDA_VERSION, that version). Returns it, 0
  // when unknown.
  int detect_driver_version() noexcept {
    PFN_cuDriverGetVersion_v2020 get_version = nullptr;
    resolve(&get_version, "cuDriverGetVersion", "cuDriverGetVersion", 2020, false);
    if (get_version == nullptr) {  // the export has had one ABI since CUDA 2.2
      get_version = reinterpret_cast<PFN_cuDriverGetVersion_v2020>(
          Os::find_symbol(handle_, "cuDriverGetVersion"));
    }
    int version = 0;
    const CUresult rc = get_version != nullptr ? get_version(&version) : CUDA_ERROR_NOT_FOUND;
    stub_ = rc == CUDA_ERROR_STUB_LIBRARY;
    if (rc != CUDA_SUCCESS || version < 0) version = 0;
    driver_version_ = version;
    if (version > 0 && version < request_version_) request_version_ = version;
    return version;
  }

  // True when the library answered CUDA_ERROR_STUB_LIBRARY: the CUDA
  // Toolkit's stub libcuda.so, which exists for linking, not a driver.
  bool is_stub() const noexcept { return stub_; }

  // `proc_name` is the base name cuGetProcAddress expects, `export_name` the
  // versioned export, `abi` the CUDA version that introduced the ABI the PFN
  // type describes. Returns false (reason set) when a required one is
  // missing; a missing optional one is left null.
  template <class Fn>
  bool resolve(Fn* out, const char* proc_name, const char* export_name, int abi,
               bool required) noexcept {
    void* fn = nullptr;
    if (getproc_ != nullptr) {
      // An older driver hands out the newest ABI it has for a name, which
      // may predate the PFN type used here: such an entry counts as missing.
      if (driver_version_ == 0 || driver_version_ >= abi) {
        CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        const CUresult r =
            getproc_(proc_name, &fn, request_version_, CU_GET_PROC_ADDRESS_DEFAULT, &found);
        if (r != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS) fn = nullptr;
      }
    } else {
      fn = Os::find_symbol(handle_, export_name);
    }
    *out = reinterpret_cast<Fn>(fn);
    if (fn == nullptr && required) {
      std::snprintf(g_info.reason, sizeof g_info.reason,
                    "the CUDA driver lacks the entry point %s (%s, driver version %d)", export_name,
                    getproc_ != nullptr ? "cuGetProcAddress_v2" : "its exports", driver_version_);
      return false;
    }
    return true;
  }

 private:
  void* handle_;
  PFN_cuGetProcAddress_v12000 getproc_ = nullptr;
  int driver_version_ = 0;  // 0: unknown, no ABI gate
  bool stub_ = false;
  // The ABI the entry points are typed for (driver_api.hpp: the headers', and
  // CUDA 13.0's for those older headers lack), or the driver's if older: a
  // 12.x toolkit's build asks for what a 13.0 one does.
  int request_version_ = CUDA_VERSION > kDriverApiVersion ? CUDA_VERSION : kDriverApiVersion;
};

// Every entry point. Required: what loading and the backends need to
// allocate and free. Optional (null when absent): the probes, test contexts,
// advice, the fork copy's device-to-host copy, clearing on the device and
// error names.
bool resolve_all(Resolver& r) noexcept {
  DriverApi& a = g_api;
  constexpr bool req = true;
  constexpr bool opt = false;
  // clang-format off
  return r.resolve(&a.cuInit, "cuInit", "cuInit", 2000, req) &&
         r.resolve(&a.cuDriverGetVersion, "cuDriverGetVersion", "cuDriverGetVersion", 2020, req) &&
         r.resolve(&a.cuDeviceGetCount, "cuDeviceGetCount", "cuDeviceGetCount", 2000, req) &&
         r.resolve(&a.cuDeviceGet, "cuDeviceGet", "cuDeviceGet", 2000, req) &&
         r.resolve(&a.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", 7000, req) &&
         r.resolve(&a.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2", 11000, req) &&
         r.resolve(&a.cuCtxPushCurrent, "cuCtxPushCurrent", "cuCtxPushCurrent_v2", 4000, req) &&
         r.resolve(&a.cuCtxPopCurrent, "cuCtxPopCurrent", "cuCtxPopCurrent_v2", 4000, req) &&
         r.resolve(&a.cuMemAllocManaged, "cuMemAllocManaged", "cuMemAllocManaged", 6000, req) &&
         r.resolve(&a.cuMemFree, "cuMemFree", "cuMemFree_v2", 3020, req) &&
         r.resolve(&a.cuMemHostAlloc, "cuMemHostAlloc", "cuMemHostAlloc", 2020, req) &&
         r.resolve(&a.cuMemFreeHost, "cuMemFreeHost", "cuMemFreeHost", 2000, req) &&
         r.resolve(&a.cuMemAdvise, "cuMemAdvise", "cuMemAdvise_v2", 12020, opt) &&
         r.resolve(&a.cuDeviceGetName, "cuDeviceGetName", "cuDeviceGetName", 2000, opt) &&
         r.resolve(&a.cuDeviceTotalMem, "cuDeviceTotalMem", "cuDeviceTotalMem_v2", 3020, opt) &&
         r.resolve(&a.cuDeviceGetAttribute, "cuDeviceGetAttribute", "cuDeviceGetAttribute", 2000, opt) &&
         r.resolve(&a.cuCtxGetCurrent, "cuCtxGetCurrent", "cuCtxGetCurrent", 4000, opt) &&
         r.resolve(&a.cuCtxCreate, "cuCtxCreate", "cuCtxCreate_v4", 12050, opt) &&
         r.resolve(&a.cuCtxDestroy, "cuCtxDestroy", "cuCtxDestroy_v2", 4000, opt) &&
         r.resolve(&a.cuPointerGetAttribute, "cuPointerGetAttribute", "cuPointerGetAttribute", 4000, opt) &&
         r.resolve(&a.cuMemcpyDtoH, "cuMemcpyDtoH", "cuMemcpyDtoH_v2", 3020, opt) &&
         r.resolve(&a.cuMemHostRegister, "cuMemHostRegister", "cuMemHostRegister_v2", 6050, opt) &&
         r.resolve(&a.cuMemHostUnregister, "cuMemHostUnregister", "cuMemHostUnregister", 4000, opt) &&
         r.resolve(&a.cuStreamCreate, "cuStreamCreate", "cuStreamCreate", 2000, opt) &&
         r.resolve(&a.cuMemsetD8Async, "cuMemsetD8Async", "cuMemsetD8Async", 3020, opt) &&
         r.resolve(&a.cuStreamSynchronize, "cuStreamSynchronize", "cuStreamSynchronize", 2000, opt) &&
         r.resolve(&a.cuStreamDestroy, "cuStreamDestroy", "cuStreamDestroy_v2", 4000, opt) &&
         r.resolve(&a.cuGetErrorName, "cuGetErrorName", "cuGetErrorName", 6000, opt) &&
         r.resolve(&a.cuMemDiscardBatchAsync, "cuMemDiscardBatchAsync", "cuMemDiscardBatchAsync", 13000, opt) &&
         r.resolve(&a.cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity", "cuMemGetAllocationGranularity", 10020, opt) &&
         r.resolve(&a.cuMemAddressReserve, "cuMemAddressReserve", "cuMemAddressReserve", 10020, opt) &&
         r.resolve(&a.cuMemAddressFree, "cuMemAddressFree", "cuMemAddressFree", 10020, opt) &&
         r.resolve(&a.cuMemCreate, "cuMemCreate", "cuMemCreate", 10020, opt) &&
         r.resolve(&a.cuMemRelease, "cuMemRelease", "cuMemRelease", 10020, opt) &&
         r.resolve(&a.cuMemMap, "cuMemMap", "cuMemMap", 10020, opt) &&
         r.resolve(&a.cuMemUnmap, "cuMemUnmap", "cuMemUnmap", 10020, opt) &&
         r.resolve(&a.cuMemSetAccess, "cuMemSetAccess", "cuMemSetAccess", 10020, opt);
  // clang-format on
}

constinit char g_driver_path[512] = {};
constinit bool g_driver_path_set = false;

void* open_driver() noexcept {
  const char* override_path =
      g_driver_path_set ? g_driver_path : Os::secure_env("MNEMOSYNE_CUDA_DRIVER");
  char err[300];
  if (override_path != nullptr && override_path[0] != '\0') {
    std::snprintf(g_info.path, sizeof g_info.path, "%s", override_path);
    void* h = Os::open_library(override_path, err, sizeof err);
    if (h == nullptr) {
      std::snprintf(g_info.reason, sizeof g_info.reason,
                    "cannot load MNEMOSYNE_CUDA_DRIVER=%.200s: %.250s", override_path, err);
    }
    return h;
  }
  for (const char* name : Os::kDriverNames) {
    std::snprintf(g_info.path, sizeof g_info.path, "%s", name);
    if (void* h = Os::open_library(name, err, sizeof err)) return h;
    std::snprintf(g_info.reason, sizeof g_info.reason, "cannot load the CUDA driver (%s): %.300s",
                  name, err);
  }
  return nullptr;
}

void say_stub() noexcept {
  std::snprintf(g_info.reason, sizeof g_info.reason,
                "%.200s is the CUDA Toolkit's stub libcuda.so, for linking only (it answers "
                "CUDA_ERROR_STUB_LIBRARY): install the NVIDIA driver, or set "
                "MNEMOSYNE_CUDA_DRIVER to the driver's libcuda.so.1",
                g_info.path);
}

struct InitCall {
  PFN_cuInit_v2000 cuInit;
  CUresult result;
};

// The one-time load. Returns the final state.
DriverState load() noexcept {
  detail::InDriverScope in_driver;
  g_info.init_result = CUDA_ERROR_NOT_INITIALIZED;
  void* handle = open_driver();
  if (handle == nullptr) return DriverState::unavailable;
  // The handle is never closed: cuInit may have started threads inside it.
  Resolver resolver(handle);
  g_info.version = resolver.detect_driver_version();
  if (resolver.is_stub()) {
    say_stub();
    return DriverState::unavailable;
  }
  if (!resolve_all(resolver)) return DriverState::unavailable;

  // A driver that crashes in cuInit must not take the process with it.
  // Static: on Windows a cuInit that timed out still returns into it later.
  static constinit InitCall call{nullptr, CUDA_ERROR_UNKNOWN};
  call = InitCall{g_api.cuInit, CUDA_ERROR_UNKNOWN};
  char what[160];
  if (!call_guarded(
          [](void* arg) {
            // On Windows a worker thread runs it for this one: its mallocs,
            // and threads the driver starts from it, are the driver's.
            detail::InDriverScope in_driver;
            auto* c = static_cast<InitCall*>(arg);
            c->result = c->cuInit(0);
          },
          &call, what, sizeof what)) {
    std::snprintf(g_info.reason, sizeof g_info.reason,
                  "cuInit(0) %s; the driver is not called again", what);
    return DriverState::unavailable;
  }
  const CUresult init = call.result;
  g_info.init_result = init;
  if (init == CUDA_ERROR_STUB_LIBRARY) {
    say_stub();
    return DriverState::unavailable;
  }
  if (init != CUDA_SUCCESS) {
    std::snprintf(g_info.reason, sizeof g_info.reason, "cuInit(0) failed: %s (%d)",
                  cu_result_name(init), static_cast<int>(init));
    return DriverState::unavailable;
  }
  int count = 0;
  if (g_api.cuDeviceGetCount(&count) == CUDA_SUCCESS) g_info.device_count = count;
  g_info.reason[0] = '\0';
  return DriverState::ready;
}

void wait_while_initializing() noexcept {
  // cuInit takes 0.1 s or more: yield, then sleep.
  for (std::size_t spins = 0;
       g_state.load(std::memory_order_acquire) == static_cast<int>(DriverState::initializing);
       ++spins) {
    Os::pause(spins);
  }
}

const DriverApi* driver_api_slow() noexcept {
  // Re-entered from inside the load itself, or called on a thread that is
  // inside the driver (or owned by it): waiting there for the load could wait
  // on a lock that thread holds. Such callers never load nor wait.
  if (in_driver_call()) return nullptr;
  int expected = static_cast<int>(DriverState::uninitialized);
  if (g_state.compare_exchange_strong(expected, static_cast<int>(DriverState::initializing),
                                      std::memory_order_acq_rel, std::memory_order_acquire)) {
    const DriverState result = load();  // flags the thread as in the driver
    g_state.store(static_cast<int>(result), std::memory_order_release);
  } else {
    wait_while_initializing();
  }
  if (g_forked.load(std::memory_order_acquire)) return nullptr;
  return g_state.load(std::memory_order_acquire) == static_cast<int>(DriverState::ready) ? &g_api
                                                                                         : nullptr;
}

}  // namespace

const DriverApi* driver_api() noexcept {
  if (g_forked.load(std::memory_order_acquire)) return nullptr;
  const int s = g_state.load(std::memory_order_acquire);
  if (s == static_cast<int>(DriverState::ready)) return &g_api;
  if (s == static_cast<int>(DriverState::unavailable)) return nullptr;
  return driver_api_slow();
}

void set_driver_path(const char* path) noexcept {
  if (g_state.load(std::memory_order_acquire) != static_cast<int>(DriverState::uninitialized)) {
    return;
  }
  std::snprintf(g_driver_path, sizeof g_driver_path, "%s", path != nullptr ? path : "");
  g_driver_path_set = path != nullptr && path[0] != '\0';
}

DriverState driver_state() noexcept {
  if (g_forked.load(std::memory_order_acquire)) return DriverState::unavailable;
  return static_cast<DriverState>(g_state.load(std::memory_order_acquire));
}

const DriverInfo& driver_info() noexcept {
  return g_info;
}

void set_device_ordinal(int ordinal) noexcept {
  if (ordinal < 0) return;
  unsigned cur = g_ordinal.load(std::memory_order_relaxed);
  while ((cur & kFrozen) == 0 &&
         !g_ordinal.compare_exchange_weak(cur, static_cast<unsigned>(ordinal),
                                          std::memory_order_relaxed)) {
  }
}

void set_own_context(bool own) noexcept {
  g_own_context.store(own, std::memory_order_relaxed);
}

bool own_context() noexcept {
  return g_own_context.load(std::memory_order_relaxed);
}

int device_ordinal() noexcept {
  return static_cast<int>(g_ordinal.load(std::memory_order_relaxed) & ~kFrozen);
}

int detail::freeze_device_ordinal() noexcept {
  return static_cast<int>(g_ordinal.fetch_or(kFrozen, std::memory_order_relaxed) & ~kFrozen);
}

void driver_mark_forked_child() noexcept {
  g_forked.store(true, std::memory_order_release);
}

const char* cu_result_name(CUresult result) noexcept {
  // Not named by headers before 13.0 (no case label: not in their enum).
  if (result == kCudaErrorCallRequiresNewerDriver) return "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER";
#define MNEMOSYNE_CU_NAME(n) \
  case n:                    \
    return #n;
  switch (result) {
    MNEMOSYNE_CU_NAME(CUDA_SUCCESS)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_INVALID_VALUE)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_OUT_OF_MEMORY)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_NOT_INITIALIZED)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_DEINITIALIZED)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_STUB_LIBRARY)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_DEVICE_UNAVAILABLE)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_NO_DEVICE)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_INVALID_DEVICE)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_DEVICE_NOT_LICENSED)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_INVALID_CONTEXT)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_CONTEXT_ALREADY_CURRENT)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_MAP_FAILED)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_UNMAP_FAILED)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_ECC_UNCORRECTABLE)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_CONTEXT_ALREADY_IN_USE)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_FILE_NOT_FOUND)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_OPERATING_SYSTEM)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_INVALID_HANDLE)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_ILLEGAL_STATE)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_NOT_FOUND)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_NOT_READY)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_ILLEGAL_ADDRESS)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_CONTEXT_IS_DESTROYED)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_LAUNCH_FAILED)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_NOT_PERMITTED)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_NOT_SUPPORTED)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_SYSTEM_NOT_READY)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_MPS_CONNECTION_FAILED)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_TIMEOUT)
    MNEMOSYNE_CU_NAME(CUDA_ERROR_UNKNOWN)
    default:
      break;
  }
#undef MNEMOSYNE_CU_NAME
  // Rarer codes: ask the driver when it is loaded and usable here.
  if (!g_forked.load(std::memory_order_acquire) &&
      g_state.load(std::memory_order_acquire) == static_cast<int>(DriverState::ready) &&
      g_api.cuGetErrorName != nullptr) {
    const char* name = nullptr;
    if (g_api.cuGetErrorName(result, &name) == CUDA_SUCCESS && name != nullptr) return name;
  }
  return "CUDA_ERROR_UNRECOGNIZED";
}

}  // namespace mnemosyne
