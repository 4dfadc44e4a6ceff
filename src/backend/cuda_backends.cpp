// The CUDA backends: one allocate/deallocate template over the raw driver
// calls of each kind of memory (managed, pinned), called with the backend's
// id, whose row of kBackends says whether to advise a device and which
// registry and counters it uses. No fallback to host memory.
#include <atomic>
#include <cstdint>

#include "backend/backends.hpp"
#include "backend/counters.hpp"
#include "backend/driver_call.hpp"
#include "backend/internal.hpp"
#include "backend/loader.hpp"

namespace mnemosyne {
namespace {

// One registry per backend id (none and host unused: untouched .bss).
constinit AllocationRegistry g_registries[kBackendCount];

CUdeviceptr to_device_ptr(const void* p) noexcept {
  return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
}

// Managed memory: cuMemAllocManaged(ATTACH_GLOBAL) / cuMemFree_v2. Its
// mappings are VM_DONTCOPY already (NVIDIA's open kernel modules, uvm.c
// uvm_mmap, since 530.30.02): MADV_DONTFORK says so again for older drivers,
// and its refusal changes nothing.
struct ManagedCalls {
  static constexpr bool kMustNotBeInherited = false;
  static CUresult raw_alloc(const DriverApi& api, std::size_t size, void** out) noexcept {
    CUdeviceptr dptr = 0;
    const CUresult r = api.cuMemAllocManaged(&dptr, size, CU_MEM_ATTACH_GLOBAL);
    *out = reinterpret_cast<void*>(static_cast<std::uintptr_t>(dptr));
    return r;
  }
  static CUresult raw_free(const DriverApi& api, void* ptr) noexcept {
    return api.cuMemFree(to_device_ptr(ptr));
  }
};

// Page-locked host memory: cuMemHostAlloc(DEVICEMAP | PORTABLE) /
// cuMemFreeHost. The kernel module maps it VM_SHARED and not VM_DONTCOPY
// (nv-mmap.c): unless marked MADV_DONTFORK, a forked child would share these
// pages with its parent, and glibc writes into the heap (FILE locks) in the
// child before any atfork handler runs. Memory the kernel refuses to mark is
// given back, not used.
struct PinnedCalls {
  static constexpr bool kMustNotBeInherited = true;
  static CUresult raw_alloc(const DriverApi& api, std::size_t size, void** out) noexcept {
    return api.cuMemHostAlloc(out, size, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE);
  }
  static CUresult raw_free(const DriverApi& api, void* ptr) noexcept {
    return api.cuMemFreeHost(ptr);
  }
};

// Best effort: a failed advice leaves the allocation valid.
void advise_preferred_device(const DriverCall& call, void* ptr, std::size_t size,
                             BackendCounters& c) noexcept {
  const DriverApi& api = call.api();
  if (api.cuMemAdvise == nullptr) {  // driver older than cuMemAdvise_v2
    count_event(c.advice_failures);
    return;
  }
  CUmemLocation location{};
  location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  location.id = call.ordinal();
  count_event(c.driver_calls);
  if (api.cuMemAdvise(to_device_ptr(ptr), size, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, location) !=
      CUDA_SUCCESS) {
    count_event(c.driver_failures);
    count_event(c.advice_failures);
  }
}

// driver_api() -> DriverCall -> raw alloc -> registry insert -> advice
// (the rows of kBackends that prefer a device). A full registry releases the
// fresh allocation and returns nullptr.
template <class Calls>
void* cuda_allocate(BackendId id, std::size_t size) noexcept {
  if (size == 0 || driver_api() == nullptr) return nullptr;
  BackendCounters& c = backend_counters(id);
  AllocationRegistry& registry = g_registries[static_cast<int>(id)];
  const std::uint64_t start = detail::monotonic_ns();
  void* ptr = nullptr;
  {
    DriverCall call;
    if (!call.ok()) {
      count_event(c.driver_failures);  // the primary context could not be made current
      c.failed(kContextFailed, call.error(), size);
    } else {
      count_event(c.driver_calls);
      const CUresult rc = Calls::raw_alloc(call.api(), size, &ptr);
      if (rc != CUDA_SUCCESS || ptr == nullptr) {
        count_event(c.driver_failures);
        c.failed(kAllocationFailed, rc, size);
        ptr = nullptr;
      } else if (int err = 0;
                 !Os::exclude_from_fork(ptr, size, &err) && Calls::kMustNotBeInherited) {
        c.failed(kInheritable, err, size);
        count_event(c.driver_calls);
        if (Calls::raw_free(call.api(), ptr) != CUDA_SUCCESS) count_event(c.driver_failures);
        ptr = nullptr;
      } else if (!registry.insert(ptr)) {
        count_event(c.registry_full);
        c.failed(kRegistryFull, 0, size);
        count_event(c.driver_calls);
        if (Calls::raw_free(call.api(), ptr) != CUDA_SUCCESS) count_event(c.driver_failures);
        ptr = nullptr;
      } else if (backend_row(id)->prefers_device) {
        advise_preferred_device(call, ptr, size, c);
      }
    }
  }
  count_event(c.driver_ns, detail::monotonic_ns() - start);
  if (ptr != nullptr) c.allocated(size);
  return ptr;
}

// Registry erase first: a pointer this backend does not own is refused
// without any driver call.
template <class Calls>
bool cuda_deallocate(BackendId id, void* ptr, std::size_t size) noexcept {
  if (!g_registries[static_cast<int>(id)].erase(ptr)) return false;
  // Without a usable driver (a forked child) the block cannot be released.
  if (driver_api() == nullptr) return false;
  BackendCounters& c = backend_counters(id);
  const std::uint64_t start = detail::monotonic_ns();
  bool released = false;
  {
    DriverCall call;
    if (!call.ok()) {
      count_event(c.driver_failures);
    } else {
      count_event(c.driver_calls);
      released = Calls::raw_free(call.api(), ptr) == CUDA_SUCCESS;
      if (!released) count_event(c.driver_failures);
    }
  }
  count_event(c.driver_ns, detail::monotonic_ns() - start);
  if (released) c.released(size);
  return released;
}

// Managed memory cleared by the device, so that no page of it is populated
// in host RAM for it: cuMemsetD8Async on a non-blocking stream of our own
// (the legacy stream's cuMemsetD8 would first wait for the program's work
// on it), then cuStreamSynchronize, as an Async memset returns before it is
// done. The CPU clears instead when the driver cannot be asked: no usable
// driver (none, or a forked child), a call from inside a driver call on this
// thread (the driver is calling malloc: asking it again could deadlock),
// entry points missing, or a call that failed.
void cuda_clear(BackendId id, void* ptr, std::size_t size) noexcept {
  BackendCounters& c = backend_counters(id);
  const DriverApi* api = driver_api();
  bool done = false;
  if (api != nullptr && !in_driver_call() && api->cuStreamCreate != nullptr &&
      api->cuMemsetD8Async != nullptr && api->cuStreamSynchronize != nullptr &&
      api->cuStreamDestroy != nullptr) {
    const std::uint64_t start = detail::monotonic_ns();
    DriverCall call;
    CUstream stream = nullptr;
    count_event(c.driver_calls);
    if (call.ok() && api->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS) {
      count_event(c.driver_calls, 3);
      done = api->cuMemsetD8Async(to_device_ptr(ptr), 0, size, stream) == CUDA_SUCCESS &&
             api->cuStreamSynchronize(stream) == CUDA_SUCCESS;
      api->cuStreamDestroy(stream);
    }
    if (!done) count_event(c.driver_failures);
    count_event(c.driver_ns, detail::monotonic_ns() - start);
  }
  if (done) {
    count_event(c.bytes_cleared_on_device, size);
  } else {
    detail::clear_on_cpu(id, ptr, size);
  }
}

}  // namespace

// The documentation says a discard "informs the driver that the contents of
// that range are no longer useful" and "can also help reduce memory
// pressure"; it does not say the pages are freed: scripts/gpu-check.sh
// measures that (give-back-arenas). The call needs CONCURRENT_MANAGED_ACCESS
// on every device, which the driver checks: a refusal stops further tries.
bool discard_managed(BackendId id, void* ptr, std::size_t size) noexcept {
  static constinit std::atomic<bool> refused{false};
  const DriverApi* api = driver_api();
  if (api == nullptr || refused.load(std::memory_order_relaxed) || in_driver_call() ||
      api->cuMemDiscardBatchAsync == nullptr || api->cuStreamCreate == nullptr ||
      api->cuStreamSynchronize == nullptr || api->cuStreamDestroy == nullptr) {
    return false;
  }
  BackendCounters& c = backend_counters(id);
  const std::uint64_t start = detail::monotonic_ns();
  bool done = false;
  {
    DriverCall call;
    CUstream stream = nullptr;
    count_event(c.driver_calls);
    if (call.ok() && api->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS) {
      count_event(c.driver_calls, 3);
      CUdeviceptr range = to_device_ptr(ptr);
      std::size_t bytes = size;
      done = api->cuMemDiscardBatchAsync(&range, &bytes, 1, 0, stream) == CUDA_SUCCESS &&
             api->cuStreamSynchronize(stream) == CUDA_SUCCESS;
      api->cuStreamDestroy(stream);
    }
  }
  if (!done) {
    count_event(c.driver_failures);
    refused.store(true, std::memory_order_relaxed);
  } else {
    count_event(c.bytes_discarded, size);
  }
  count_event(c.driver_ns, detail::monotonic_ns() - start);
  return done;
}

bool CudaHostPinned::fresh_memory_zero() noexcept {
  // -2: not read yet. Two threads may both read the file: same answer.
  static std::atomic<int> known{-2};
  int v = known.load(std::memory_order_relaxed);
  if (v == -2) {
    char source[256];
    v = Os::nvidia_zeroes_pinned_memory(source, sizeof source);
    known.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

bool ManagedMemory::copy_out(void* dst, const void* src, std::size_t size) noexcept {
  if (size == 0) return true;
  const DriverApi* api = driver_api();
  if (api == nullptr || api->cuMemcpyDtoH == nullptr) return false;
  DriverCall call;
  return call.ok() && call.api().cuMemcpyDtoH(dst, to_device_ptr(src), size) == CUDA_SUCCESS;
}

namespace detail {
void* managed_allocate(BackendId id, std::size_t size) noexcept {
  return cuda_allocate<ManagedCalls>(id, size);
}
bool managed_deallocate(BackendId id, void* ptr, std::size_t size) noexcept {
  return cuda_deallocate<ManagedCalls>(id, ptr, size);
}
void managed_clear(BackendId id, void* ptr, std::size_t size) noexcept {
  cuda_clear(id, ptr, size);
}
AllocationRegistry& cuda_registry(BackendId id) noexcept {
  return g_registries[static_cast<int>(id)];
}
}  // namespace detail

void* CudaHostPinned::allocate(std::size_t size) noexcept {
  return cuda_allocate<PinnedCalls>(kId, size);
}
bool CudaHostPinned::deallocate(void* ptr, std::size_t size) noexcept {
  return cuda_deallocate<PinnedCalls>(kId, ptr, size);
}
// Pinned memory is host RAM, resident already: the CPU clears it in place.
void CudaHostPinned::clear(void* ptr, std::size_t size) noexcept {
  detail::clear_on_cpu(kId, ptr, size);
}
AllocationRegistry& CudaHostPinned::registry() noexcept {
  return detail::cuda_registry(kId);
}

bool is_cuda_available() noexcept {
  const DriverApi* api = driver_api();
  return api != nullptr && api->cuMemAllocManaged != nullptr && api->cuMemFree != nullptr &&
         api->cuMemHostAlloc != nullptr && api->cuMemFreeHost != nullptr;
}

}  // namespace mnemosyne
