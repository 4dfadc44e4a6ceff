// Per-backend counters of the slow path (driver and mmap calls). Updated with
// relaxed atomics: these calls are rare and each costs microseconds or more.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "backend/backend_id.hpp"

namespace mnemosyne {

enum FailureStep : int {
  kNoFailure = 0,
  kContextFailed,
  kAllocationFailed,
  kRegistryFull,
  kInheritable,      // the kernel refused MADV_DONTFORK on memory a child must not share
  kRegisterFailed,   // cuMemHostRegister refused a granule of a reservation
  kReserveFailed,    // mmap refused a reservation (result: errno)
  kVmmFailed,        // the virtual-memory API has no host memory for us (PIN=vmm)
  kVmmCreateFailed,  // cuMemCreate refused a granule (PIN=vmm)
  kVmmMapFailed,     // cuMemMap refused a granule
  kVmmAccessFailed,  // cuMemSetAccess refused a granule
};

inline void count_event(std::atomic<std::uint64_t>& counter, std::uint64_t n = 1) noexcept {
  counter.fetch_add(n, std::memory_order_relaxed);
}

struct BackendCounters {
  std::atomic<std::uint64_t> allocations{0};              // successful allocate()
  std::atomic<std::uint64_t> deallocations{0};            // successful deallocate()
  std::atomic<std::uint64_t> bytes_allocated{0};          // sum of sizes allocated
  std::atomic<std::uint64_t> bytes_live{0};               // allocated - deallocated
  std::atomic<std::uint64_t> bytes_live_peak{0};          // the most bytes_live has been
  std::atomic<std::uint64_t> driver_calls{0};             // every driver (or mmap) call
  std::atomic<std::uint64_t> driver_failures{0};          // calls that returned an error
  std::atomic<std::uint64_t> advice_failures{0};          // cuMemAdvise errors (device tiers)
  std::atomic<std::uint64_t> registry_full{0};            // allocations rolled back
  std::atomic<std::uint64_t> driver_ns{0};                // time spent in those calls
  std::atomic<std::uint64_t> bytes_cleared_on_device{0};  // clear() by the driver
  std::atomic<std::uint64_t> bytes_discarded{0};  // free managed memory dropped (discard_managed)
  std::atomic<std::uint64_t> bytes_cleared_on_cpu{0};  // clear() by the CPU
  // The last failed allocate(), for messages: which step, the driver's
  // answer, and the size asked for.
  std::atomic<int> last_failure_step{0};  // a FailureStep
  std::atomic<int> last_failure_result{0};
  std::atomic<std::uint64_t> last_failure_size{0};

  // `size` bytes more live, and their high-water mark.
  void add_live(std::uint64_t size) noexcept {
    const std::uint64_t now = bytes_live.fetch_add(size, std::memory_order_relaxed) + size;
    std::uint64_t peak = bytes_live_peak.load(std::memory_order_relaxed);
    while (now > peak &&
           !bytes_live_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }
  // A block of `size` bytes handed out / given back.
  void allocated(std::uint64_t size) noexcept {
    count_event(allocations);
    count_event(bytes_allocated, size);
    add_live(size);
  }
  void failed(FailureStep step, int result, std::uint64_t size) noexcept {
    last_failure_step.store(step, std::memory_order_relaxed);
    last_failure_result.store(result, std::memory_order_relaxed);
    last_failure_size.store(size, std::memory_order_relaxed);
  }
  void released(std::uint64_t size) noexcept {
    count_event(deallocations);
    bytes_live.fetch_sub(size, std::memory_order_relaxed);
  }
};

BackendCounters& backend_counters(BackendId id) noexcept;

// Describes the last failed allocate() of `id` in one clause ("device 5 does
// not exist: the driver reports 2 devices", "cuMemAllocManaged of 100663296
// bytes failed: CUDA_ERROR_OUT_OF_MEMORY"); "" when there was none.
void describe_last_failure(BackendId id, char* out, std::size_t len) noexcept;

}  // namespace mnemosyne
