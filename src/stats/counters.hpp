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

namespace detail {

inline constexpr int kSlots = 4096;
inline constexpr std::int64_t kPublishBytes = 64 * 1024;

struct PoolSlot {
  std::atomic<std::uint64_t> allocations{0};
  std::atomic<std::uint64_t> frees{0};
  std::atomic<std::uint64_t> bytes_requested{0};
  std::atomic<std::int64_t> live{0};         // this thread's net usable bytes
  std::atomic<std::int64_t> unpublished{0};  // not yet in the pool's total
};

struct Slot {
  PoolSlot pools[kPools];
};

extern Slot g_slots[kSlots + 1];  // the last one is shared by overflow threads
// The thread's slot, -1 before its first count. constinit on the
// declaration too: without it every access calls a TLS wrapper.
extern __attribute__((tls_model("initial-exec"))) constinit thread_local int t_slot;

int claim_slot() noexcept;  // first count of a thread
void shared_count(PoolSlot& s, int pool, std::int64_t allocs, std::int64_t frees,
                  std::uint64_t requested, std::int64_t live) noexcept;  // overflow slot
void publish(PoolSlot& s, int pool, std::int64_t pending) noexcept;      // every 64 KiB

// Adds to a counter only this thread writes: a plain load and store.
template <class T>
inline void bump(std::atomic<T>& counter, T v) noexcept {
  counter.store(counter.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
}

// Inline: counting runs on every malloc and free while statistics are on.
inline void count(int pool, std::int64_t allocs, std::int64_t frees, std::uint64_t requested,
                  std::int64_t live) noexcept {
  int index = t_slot;
  if (__builtin_expect(index < 0, 0)) index = claim_slot();
  PoolSlot& s = g_slots[index].pools[pool];
  if (__builtin_expect(index == kSlots, 0)) {
    shared_count(s, pool, allocs, frees, requested, live);
    return;
  }
  if (allocs != 0) {
    bump(s.allocations, static_cast<std::uint64_t>(allocs));
    bump(s.bytes_requested, requested);
  }
  if (frees != 0) bump(s.frees, static_cast<std::uint64_t>(frees));
  bump(s.live, live);
  const std::int64_t pending = s.unpublished.load(std::memory_order_relaxed) + live;
  if (__builtin_expect(pending >= kPublishBytes || pending <= -kPublishBytes, 0)) {
    publish(s, pool, pending);
  } else {
    s.unpublished.store(pending, std::memory_order_relaxed);
  }
}

}  // namespace detail

inline void count_alloc(int pool, std::size_t requested, std::size_t usable) noexcept {
  detail::count(pool, 1, 0, requested, static_cast<std::int64_t>(usable));
}

inline void count_free(int pool, std::size_t usable) noexcept {
  detail::count(pool, 0, 1, 0, -static_cast<std::int64_t>(usable));
}

// Sums every thread's counts.
void totals(PoolTotals out[kPools]) noexcept;

}  // namespace mnemosyne::stats
