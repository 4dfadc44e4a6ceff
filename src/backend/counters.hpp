// Per-backend counters of the slow path (driver and mmap calls). Updated with
// relaxed atomics: these calls are rare and each costs microseconds or more.
#pragma once

#include <atomic>
#include <cstdint>

#include "backend/backend_id.hpp"

namespace mnemosyne {

inline void count_event(std::atomic<std::uint64_t>& counter, std::uint64_t n = 1) noexcept {
  counter.fetch_add(n, std::memory_order_relaxed);
}

struct BackendCounters {
  std::atomic<std::uint64_t> allocations{0};      // successful allocate()
  std::atomic<std::uint64_t> deallocations{0};    // successful deallocate()
  std::atomic<std::uint64_t> bytes_allocated{0};  // sum of sizes allocated
  std::atomic<std::uint64_t> bytes_live{0};       // allocated - deallocated
  std::atomic<std::uint64_t> driver_calls{0};     // every driver (or mmap) call
  std::atomic<std::uint64_t> driver_failures{0};  // calls that returned an error
  std::atomic<std::uint64_t> advice_failures{0};  // cuMemAdvise errors (device tiers)
  std::atomic<std::uint64_t> registry_full{0};    // allocations rolled back
  std::atomic<std::uint64_t> driver_ns{0};        // time spent in those calls

  // A block of `size` bytes handed out / given back.
  void allocated(std::uint64_t size) noexcept {
    count_event(allocations);
    count_event(bytes_allocated, size);
    count_event(bytes_live, size);
  }
  void released(std::uint64_t size) noexcept {
    count_event(deallocations);
    bytes_live.fetch_sub(size, std::memory_order_relaxed);
  }
};

BackendCounters& backend_counters(BackendId id) noexcept;

}  // namespace mnemosyne
