// Host: the OS's private pages (mmap, VirtualAlloc), registered like the
// CUDA backends.

#include <atomic>
#include <cstdint>
#include <cstring>

#include "backend/backends.hpp"
#include "backend/counters.hpp"
#include "backend/internal.hpp"

namespace mnemosyne {
namespace {

constinit AllocationRegistry g_host_registry;

}  // namespace

void* Host::allocate(std::size_t size) noexcept {
  if (size == 0) return nullptr;
  BackendCounters& c = backend_counters(kId);
  const std::uint64_t start = detail::monotonic_ns();
  count_event(c.driver_calls);
  int error = 0;
  void* ptr = Os::map_pages(size, &error);
  if (ptr == nullptr) {
    count_event(c.driver_failures);
    c.failed(kAllocationFailed, error, size);
  } else if (!g_host_registry.insert(ptr)) {
    count_event(c.registry_full);
    c.failed(kRegistryFull, 0, size);
    count_event(c.driver_calls);
    if (!Os::unmap_pages(ptr, size)) count_event(c.driver_failures);
    ptr = nullptr;
  }
  count_event(c.driver_ns, detail::monotonic_ns() - start);
  if (ptr != nullptr) c.allocated(size);
  return ptr;
}

bool Host::deallocate(void* ptr, std::size_t size) noexcept {
  if (!g_host_registry.erase(ptr)) return false;
  BackendCounters& c = backend_counters(kId);
  const std::uint64_t start = detail::monotonic_ns();
  count_event(c.driver_calls);
  const bool released = Os::unmap_pages(ptr, size);
  count_event(c.driver_ns, detail::monotonic_ns() - start);
  if (!released) {
    count_event(c.driver_failures);
    return false;
  }
  c.released(size);
  return true;
}

// Called from inside mimalloc's free path: a system call, no allocation.
void Host::decommit(void* ptr, std::size_t size) noexcept {
  if (!Os::discard_pages(ptr, size)) count_event(backend_counters(kId).driver_failures);
}

void Host::clear(void* ptr, std::size_t size) noexcept {
  detail::clear_on_cpu(kId, ptr, size);
}

namespace detail {
void clear_on_cpu(BackendId id, void* ptr, std::size_t size) noexcept {
  std::memset(ptr, 0, size);
  count_event(backend_counters(id).bytes_cleared_on_cpu, size);
}
}  // namespace detail

bool CpuMemory::copy_out(void* dst, const void* src, std::size_t size) noexcept {
  std::memcpy(dst, src, size);
  return true;
}

AllocationRegistry& Host::registry() noexcept {
  return g_host_registry;
}

}  // namespace mnemosyne
