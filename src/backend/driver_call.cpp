// The in-driver flag, the heap's contexts (retained primary ones, or
// mnemosyne's own), and the DriverCall scope that makes one current around
// each driver call.
#include "backend/driver_call.hpp"

#include <errno.h>

#include <algorithm>
#include <atomic>

#include "backend/internal.hpp"
#include "backend/loader.hpp"

namespace mnemosyne {
namespace {

// Set while this thread runs a driver call made by mnemosyne (nested scopes
// keep the outer value). Initial-exec TLS: reading it never allocates.
__attribute__((tls_model("initial-exec"))) constinit thread_local bool t_in_driver = false;
// Set for good on threads the driver started.
__attribute__((tls_model("initial-exec"))) constinit thread_local bool t_driver_owned = false;

// The context each device ordinal's heap lives in (primary, retained once,
// or mnemosyne's own), and the CUdevice it belongs to (valid once the
// context slot is non-null).
constexpr int kMaxDevices = 64;
constinit std::atomic<CUcontext> g_heap_context[kMaxDevices] = {};
constinit std::atomic<CUdevice> g_heap_device[kMaxDevices] = {};

// A context of mnemosyne's on dev, not current on any thread. cuCtxCreate
// makes it current on this one; popping it restores what the thread had.
CUcontext create_own_context(const DriverApi& api, CUdevice dev, CUresult* error) noexcept {
  if (api.cuCtxCreate == nullptr) {  // drivers before CUDA 12.5 (see describe_last_failure)
    *error = CUDA_ERROR_NOT_SUPPORTED;
    return nullptr;
  }
  CUcontext ctx = nullptr;
  if ((*error = api.cuCtxCreate(&ctx, nullptr, 0, dev)) != CUDA_SUCCESS) return nullptr;
  CUcontext popped = nullptr;
  api.cuCtxPopCurrent(&popped);
  return ctx;
}

// Returns the heap's context on `ordinal`, retaining the primary context (or
// creating mnemosyne's own, set_own_context) on first use. Two threads may
// race: the loser releases its reference (or destroys its context), so the
// heap has exactly one context per device.
CUcontext heap_context(const DriverApi& api, int ordinal, CUdevice* device,
                       CUresult* error) noexcept {
  if (ordinal < 0 || ordinal >= kMaxDevices) {
    *error = CUDA_ERROR_INVALID_DEVICE;
    return nullptr;
  }
  CUcontext ctx = g_heap_context[ordinal].load(std::memory_order_acquire);
  if (ctx != nullptr) {
    *device = g_heap_device[ordinal].load(std::memory_order_relaxed);
    return ctx;
  }
  CUdevice dev = 0;
  if ((*error = api.cuDeviceGet(&dev, ordinal)) != CUDA_SUCCESS) return nullptr;
  const bool own = own_context();
  CUcontext fresh = nullptr;
  if (own) {
    fresh = create_own_context(api, dev, error);
  } else if ((*error = api.cuDevicePrimaryCtxRetain(&fresh, dev)) != CUDA_SUCCESS) {
    fresh = nullptr;
  }
  if (fresh == nullptr) {
    if (*error == CUDA_SUCCESS) *error = CUDA_ERROR_INVALID_CONTEXT;
    return nullptr;
  }
  g_heap_device[ordinal].store(dev, std::memory_order_relaxed);
  CUcontext expected = nullptr;
  if (!g_heap_context[ordinal].compare_exchange_strong(expected, fresh, std::memory_order_acq_rel,
                                                       std::memory_order_acquire)) {
    if (own) {
      if (api.cuCtxDestroy != nullptr) api.cuCtxDestroy(fresh);  // lost the race: holds nothing
    } else {
      api.cuDevicePrimaryCtxRelease(dev);  // lost the race: drop the extra reference
    }
    fresh = expected;
  }
  *device = dev;
  return fresh;
}

}  // namespace

bool in_driver_call() noexcept {
  return t_in_driver || t_driver_owned;
}

namespace {
// Thread ids of the driver's threads, for driver_threads_cpu_ns. Fixed and
// lock-free: written from the threads' start, read from malloc's slow path.
constexpr int kMaxDriverThreads = 32;
constinit std::atomic<long> g_driver_threads[kMaxDriverThreads] = {};
constinit std::atomic<int> g_driver_thread_count{0};
}  // namespace

void mark_thread_as_driver_owned() noexcept {
  t_driver_owned = true;
  const int slot = g_driver_thread_count.fetch_add(1, std::memory_order_relaxed);
  if (slot < kMaxDriverThreads) {
    g_driver_threads[slot].store(Os::thread_id(), std::memory_order_release);
  }
}

namespace {
constinit std::atomic<std::uint64_t> g_driver_calls_done{0};
}  // namespace

std::uint64_t driver_calls_done() noexcept {
  return g_driver_calls_done.load(std::memory_order_relaxed);
}

std::uint64_t driver_threads_cpu_ns() noexcept {
  const int n = std::min(g_driver_thread_count.load(std::memory_order_acquire), kMaxDriverThreads);
  std::uint64_t sum = 0;
  for (int i = 0; i < n; ++i) {
    const long tid = g_driver_threads[i].load(std::memory_order_acquire);
    if (tid > 0) sum += Os::thread_cpu_ns(tid);
  }
  return sum;
}

detail::InDriverScope::InDriverScope() noexcept : outer_(t_in_driver) {
  t_in_driver = true;
}

detail::InDriverScope::~InDriverScope() {
  t_in_driver = outer_;
}

DriverCall::DriverCall() noexcept : outer_flag_(t_in_driver), saved_errno_(errno) {
  // driver_api() first: it refuses to load on a thread already flagged (the
  // load flags itself).
  const DriverApi* api = driver_api();
  t_in_driver = true;
  if (!outer_flag_) {
    Os::block_async_signals(&saved_mask_);
    blocked_ = true;
  }
  if (api == nullptr) {
    error_ = CUDA_ERROR_NOT_INITIALIZED;
    return;
  }
  ordinal_ = detail::freeze_device_ordinal();
  CUdevice dev = 0;
  CUcontext ctx = heap_context(*api, ordinal_, &dev, &error_);
  if (ctx == nullptr || (error_ = api->cuCtxPushCurrent(ctx)) != CUDA_SUCCESS) return;
  pushed_ = true;
  device_ = dev;
  api_ = api;
}

DriverCall::~DriverCall() {
  if (pushed_) {
    CUcontext popped = nullptr;
    api_->cuCtxPopCurrent(&popped);
  }
  t_in_driver = outer_flag_;
  if (api_ != nullptr) g_driver_calls_done.fetch_add(1, std::memory_order_relaxed);
  if (blocked_) Os::restore_signals(saved_mask_);
  errno = saved_errno_;
}

CUcontext create_temp_context(int ordinal) noexcept {
  const DriverApi* api = driver_api();
  if (api == nullptr || api->cuCtxCreate == nullptr) return nullptr;
  detail::InDriverScope in_driver;
  CUdevice dev = 0;
  if (api->cuDeviceGet(&dev, ordinal) != CUDA_SUCCESS) return nullptr;
  CUcontext ctx = nullptr;
  if (api->cuCtxCreate(&ctx, nullptr, 0, dev) != CUDA_SUCCESS) return nullptr;
  return ctx;
}

bool destroy_temp_context(CUcontext ctx) noexcept {
  const DriverApi* api = driver_api();
  if (api == nullptr || api->cuCtxDestroy == nullptr || ctx == nullptr) return false;
  detail::InDriverScope in_driver;
  return api->cuCtxDestroy(ctx) == CUDA_SUCCESS;
}

}  // namespace mnemosyne
