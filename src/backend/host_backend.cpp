// Host: anonymous private mmap, registered like the CUDA backends.
#include <sys/mman.h>

#include <atomic>
#include <cstdint>

#include "backend/backends.hpp"
#include "backend/counters.hpp"
#include "backend/internal.hpp"

namespace mnemosyne {
namespace {

constinit AllocationRegistry g_host_registry;

void count(std::atomic<std::uint64_t>& counter, std::uint64_t n = 1) noexcept {
  counter.fetch_add(n, std::memory_order_relaxed);
}

}  // namespace

void* Host::allocate(std::size_t size) noexcept {
  if (size == 0) return nullptr;
  BackendCounters& c = backend_counters(kId);
  const std::uint64_t start = detail::monotonic_ns();
  count(c.driver_calls);
  void* ptr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (ptr == MAP_FAILED) {
    count(c.driver_failures);
    ptr = nullptr;
  } else if (!g_host_registry.insert(ptr)) {
    count(c.registry_full);
    count(c.driver_calls);
    if (munmap(ptr, size) != 0) count(c.driver_failures);
    ptr = nullptr;
  }
  count(c.driver_ns, detail::monotonic_ns() - start);
  if (ptr != nullptr) {
    count(c.allocations);
    count(c.bytes_allocated, size);
    count(c.bytes_live, size);
  }
  return ptr;
}

bool Host::deallocate(void* ptr, std::size_t size) noexcept {
  if (!g_host_registry.erase(ptr)) return false;
  BackendCounters& c = backend_counters(kId);
  const std::uint64_t start = detail::monotonic_ns();
  count(c.driver_calls);
  const bool released = munmap(ptr, size) == 0;
  count(c.driver_ns, detail::monotonic_ns() - start);
  if (!released) {
    count(c.driver_failures);
    return false;
  }
  count(c.deallocations);
  c.bytes_live.fetch_sub(size, std::memory_order_relaxed);
  return true;
}

AllocationRegistry& Host::registry() noexcept {
  return g_host_registry;
}

}  // namespace mnemosyne
