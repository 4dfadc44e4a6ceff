// Allocation statistics, counted only when asked for at start.
//
// Each thread counts into a slot of its own (static storage, claimed once,
// never freed, so no allocation and no lock), with relaxed atomics that only
// the owning thread writes. A report sums the slots. Live bytes are also
// published to a per-pool total every 64 KiB of change, which keeps a peak
// exact to within 64 KiB per thread. After kSlots threads, further threads
// share one overflow slot (atomic adds, slower, still exact).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "backend/backend_id.hpp"

namespace mnemosyne::stats {

// One pool per backend, indexed by BackendId; index 0 (BackendId::none) is
// the system allocator (requests outside MNEMOSYNE_SIZE, fallbacks, the
// driver's own allocations).
inline constexpr int kPools = kBackendCount;
inline constexpr int kSystemPool = 0;
inline int pool_of(BackendId id) noexcept {
  return static_cast<int>(id);
}

struct PoolTotals {
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t bytes_requested = 0;
  std::int64_t bytes_live = 0;
  std::uint64_t bytes_peak = 0;
};

void count_alloc(int pool, std::size_t requested, std::size_t usable) noexcept;
void count_free(int pool, std::size_t usable) noexcept;

// Sums every thread's counts.
void totals(PoolTotals out[kPools]) noexcept;

}  // namespace mnemosyne::stats
