// Per-backend counters of the slow path (driver and mmap calls). Updated with
// relaxed atomics: these calls are rare and each costs microseconds or more.
#pragma once

#include <atomic>
#include <cstdint>

#include "backend/backend_id.hpp"

namespace mnemosyne {

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
};

BackendCounters& backend_counters(BackendId id) noexcept;

}  // namespace mnemosyne
