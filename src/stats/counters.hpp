// Allocation statistics, counted only when asked for at start.
//
// Each thread counts into a slot of its own (static storage, claimed once,
// never freed, so no allocation and no lock), with relaxed atomics that only
// the owning thread writes. A report sums the slots. Live bytes go to a
// per-pool total every 64 KiB of change a thread makes (the rest waits in
// its slot), which keeps a peak exact to within 64 KiB per thread; the live
// total is that total plus every slot's unpublished bytes. After kSlots
// threads, further threads share one overflow slot (atomic adds, out of
// line, still exact).
//
// Counting runs on every malloc and free while statistics are on, so the
// inline part is a thread-local pointer, three plain adds and one compare.
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
  std::atomic<std::int64_t> unpublished{0};  // live bytes not yet in the pool's total
};

struct Slot {
  PoolSlot pools[kPools];
};

extern Slot g_slots[kSlots + 1];  // the last one is shared by overflow threads
// The thread's own slot's pools; null before its first count, and for
// threads beyond kSlots (which count out of line). constinit on the
// declaration too: without it every access calls a TLS wrapper.
extern __attribute__((tls_model("initial-exec"))) constinit thread_local PoolSlot* t_pools;

// A count of a thread without a slot of its own: claims one, or counts in
// the overflow slot.
void count_unslotted(int pool, std::int64_t allocs, std::int64_t frees, std::uint64_t requested,
                     std::int64_t live) noexcept;
void publish(PoolSlot& s, int pool, std::int64_t pending) noexcept;  // every 64 KiB

// Adds to a counter only this thread writes: a plain load and store.
template <class T>
inline void bump(std::atomic<T>& counter, T v) noexcept {
  counter.store(counter.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
}

inline void add_live(PoolSlot& s, int pool, std::int64_t live) noexcept {
  const std::int64_t pending = s.unpublished.load(std::memory_order_relaxed) + live;
  // |pending| >= kPublishBytes, in one unsigned compare.
  if (__builtin_expect(static_cast<std::uint64_t>(pending + kPublishBytes - 1) >=
                           static_cast<std::uint64_t>(2 * kPublishBytes - 1),
                       0)) {
    publish(s, pool, pending);
  } else {
    s.unpublished.store(pending, std::memory_order_relaxed);
  }
}

}  // namespace detail

inline void count_alloc(int pool, std::size_t requested, std::size_t usable) noexcept {
  detail::PoolSlot* pools = detail::t_pools;
  if (__builtin_expect(pools == nullptr, 0)) {
    detail::count_unslotted(pool, 1, 0, requested, static_cast<std::int64_t>(usable));
    return;
  }
  detail::PoolSlot& s = pools[pool];
  detail::bump(s.allocations, std::uint64_t{1});
  detail::bump(s.bytes_requested, static_cast<std::uint64_t>(requested));
  detail::add_live(s, pool, static_cast<std::int64_t>(usable));
}

inline void count_free(int pool, std::size_t usable) noexcept {
  detail::PoolSlot* pools = detail::t_pools;
  if (__builtin_expect(pools == nullptr, 0)) {
    detail::count_unslotted(pool, 0, 1, 0, -static_cast<std::int64_t>(usable));
    return;
  }
  detail::PoolSlot& s = pools[pool];
  detail::bump(s.frees, std::uint64_t{1});
  detail::add_live(s, pool, -static_cast<std::int64_t>(usable));
}

// count_alloc and count_free where they end a counted malloc or free: the
// rare cases (a thread without a slot, a publish) are tail calls, so the
// common case needs no register saved across a call; that case costs a
// plain path with statistics on about 14 instructions a malloc or free.
[[gnu::noinline]] void* count_alloc_rare(void* p, int pool, std::size_t requested,
                                         std::size_t usable) noexcept;
[[gnu::noinline]] void count_free_rare(int pool, std::size_t usable) noexcept;

inline void* count_alloc_then(void* p, int pool, std::size_t requested,
                              std::size_t usable) noexcept {
  detail::PoolSlot* pools = detail::t_pools;
  if (__builtin_expect(pools == nullptr, 0)) return count_alloc_rare(p, pool, requested, usable);
  detail::PoolSlot& s = pools[pool];
  const std::int64_t pending =
      s.unpublished.load(std::memory_order_relaxed) + static_cast<std::int64_t>(usable);
  if (__builtin_expect(pending >= detail::kPublishBytes, 0)) {
    return count_alloc_rare(p, pool, requested, usable);
  }
  detail::bump(s.allocations, std::uint64_t{1});
  detail::bump(s.bytes_requested, static_cast<std::uint64_t>(requested));
  s.unpublished.store(pending, std::memory_order_relaxed);
  return p;
}

inline void count_free_then(int pool, std::size_t usable) noexcept {
  detail::PoolSlot* pools = detail::t_pools;
  if (__builtin_expect(pools == nullptr, 0)) return count_free_rare(pool, usable);
  detail::PoolSlot& s = pools[pool];
  const std::int64_t pending =
      s.unpublished.load(std::memory_order_relaxed) - static_cast<std::int64_t>(usable);
  if (__builtin_expect(pending <= -detail::kPublishBytes, 0)) return count_free_rare(pool, usable);
  detail::bump(s.frees, std::uint64_t{1});
  s.unpublished.store(pending, std::memory_order_relaxed);
}

// Sums every thread's counts.
void totals(PoolTotals out[kPools]) noexcept;

}  // namespace mnemosyne::stats
