// Allocation statistics, counted only when asked for at start.
//
// Each thread counts into a slot of its own (static storage, claimed once,
// never freed, so no allocation and no lock); only the owning thread writes
// it, other threads read it at any time. A report sums the slots. Live bytes
// go to a per-pool total in steps: a thread's slot keeps the bytes it
// allocated and those it freed apart, each until it reaches 64 KiB, which
// keeps the published total (and the peak taken from it) within 64 KiB per
// thread of the exact one; the live total of a report is that total plus
// every slot's unpublished bytes. After kSlots threads, further threads
// share one overflow slot (atomic adds, out of line, still exact).
//
// Counting runs on every malloc and free while statistics are on, so what
// is inline is a thread-local pointer, a test of it, and one add per
// counter: two plus an add that says when 64 KiB are reached (malloc), one
// plus that add (free).
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
inline constexpr int pool_of(BackendId id) noexcept {
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
inline constexpr std::uint64_t kPublishBytes = 64 * 1024;
// Where an unpublished byte counter starts: kPublishBytes below 2^64, so
// the add that brings it to kPublishBytes carries out, and the counter then
// holds the excess.
inline constexpr std::uint64_t kUnpublishedStart = 0 - kPublishBytes;

// One thread's counts of one pool, on a cache line of its own. Plain
// integers: the owning thread adds with single instructions (bump), readers
// load them with std::atomic_ref. `added` and `removed` are zero until the
// slot is claimed (the slots stay in .bss), then count from
// kUnpublishedStart; a report takes their difference, so either way they
// read as their unpublished bytes.
struct alignas(64) PoolSlot {
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t bytes_requested = 0;
  std::uint64_t added = 0;    // live bytes allocated, not yet in the pool's total
  std::uint64_t removed = 0;  // and freed
};

struct Slot {
  PoolSlot pools[kPools];
};

extern Slot g_slots[kSlots + 1];  // the last one is shared by overflow threads
// The thread's own slot's pools; null before its first count, and for
// threads beyond kSlots (which count out of line). constinit on the
// declaration too: without it every access calls a TLS wrapper.
extern __attribute__((tls_model("initial-exec"))) constinit thread_local PoolSlot* t_pools;

// The counts of a thread without a slot of its own: claims one, or counts in
// the overflow slot.
void count_unslotted(int pool, std::uint64_t allocs, std::uint64_t frees, std::uint64_t requested,
                     std::int64_t live) noexcept;
// An unpublished counter that carried: its bytes go to the total of the
// slot's pool.
void publish_added(PoolSlot& s) noexcept;
void publish_removed(PoolSlot& s) noexcept;

// On x86-64 GCC and Clang (TSan aside, which cannot see into an asm), a
// counter only this thread writes takes one add to memory: GCC splits a
// relaxed atomic's load and store into three instructions, and an add to
// memory is one store, so a reader never sees it torn (aligned 8 bytes).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(__SANITIZE_THREAD__)
#define MNEMOSYNE_COUNTER_ASM 1
#else
#define MNEMOSYNE_COUNTER_ASM 0
#endif

// Adds v to a counter of this thread's slot.
inline void bump(std::uint64_t& counter, std::uint64_t v) noexcept {
#if MNEMOSYNE_COUNTER_ASM
  asm("addq %1, %0" : "+m"(counter) : "er"(v) : "cc");
#else
  std::atomic_ref<std::uint64_t> c(counter);
  c.store(c.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
#endif
}

// bump for an unpublished counter: true when the add carried out, i.e. the
// counter reached kPublishBytes and must be published.
inline bool bump_carries(std::uint64_t& counter, std::uint64_t v) noexcept {
  // asm goto with an output operand: GCC 11 and later, Clang 11 and later.
#if MNEMOSYNE_COUNTER_ASM && (defined(__clang__) || __GNUC__ >= 11)
  asm goto("addq %1, %0\n\tjc %l[carried]" : "+m"(counter) : "er"(v) : "cc" : carried);
  return false;
carried:
  return true;
#else
  std::atomic_ref<std::uint64_t> c(counter);
  const std::uint64_t before = c.load(std::memory_order_relaxed);
  c.store(before + v, std::memory_order_relaxed);
  return before + v < before;
#endif
}

inline std::uint64_t read(const std::uint64_t& counter) noexcept {
  return std::atomic_ref<std::uint64_t>(const_cast<std::uint64_t&>(counter))
      .load(std::memory_order_relaxed);
}

}  // namespace detail

inline void count_alloc(int pool, std::size_t requested, std::size_t usable) noexcept {
  detail::PoolSlot* pools = detail::t_pools;
  if (__builtin_expect(pools == nullptr, 0)) {
    detail::count_unslotted(pool, 1, 0, requested, static_cast<std::int64_t>(usable));
    return;
  }
  detail::PoolSlot& s = pools[pool];
  detail::bump(s.allocations, 1);
  detail::bump(s.bytes_requested, requested);
  if (__builtin_expect(detail::bump_carries(s.added, usable), 0)) detail::publish_added(s);
}

inline void count_free(int pool, std::size_t usable) noexcept {
  detail::PoolSlot* pools = detail::t_pools;
  if (__builtin_expect(pools == nullptr, 0)) {
    detail::count_unslotted(pool, 0, 1, 0, -static_cast<std::int64_t>(usable));
    return;
  }
  detail::PoolSlot& s = pools[pool];
  detail::bump(s.frees, 1);
  if (__builtin_expect(detail::bump_carries(s.removed, usable), 0)) {
    detail::publish_removed(s);
  }
}

// count_alloc and count_free where they end a counted malloc or free: the
// rare cases (a thread without a slot, a publish) are tail calls, so the
// common case needs no register saved across a call.
//
// They take the pool scaled, `pool * kPoolScale`: a pool's slot is then
// kPoolScale times that from the thread's first, one scaled address on
// x86-64, and the interposer passes an ownership-map entry's backend bits
// as they are (arena/ownership_map.hpp).
inline constexpr std::size_t kPoolScale = 8;
static_assert(sizeof(detail::PoolSlot) == kPoolScale * kPoolScale);

[[gnu::noinline]] void* count_alloc_unslotted(void* p, std::size_t scaled_pool,
                                              std::size_t requested, std::size_t usable) noexcept;
[[gnu::noinline]] void* publish_added_then(void* p, detail::PoolSlot& s) noexcept;
[[gnu::noinline]] void count_free_unslotted(std::size_t scaled_pool, std::size_t usable) noexcept;

inline detail::PoolSlot& scaled_slot(detail::PoolSlot* pools, std::size_t scaled_pool) noexcept {
  return *reinterpret_cast<detail::PoolSlot*>(reinterpret_cast<char*>(pools) +
                                              scaled_pool * kPoolScale);
}

inline void* count_alloc_then(void* p, std::size_t scaled_pool, std::size_t requested,
                              std::size_t usable) noexcept {
  detail::PoolSlot* pools = detail::t_pools;
  if (__builtin_expect(pools == nullptr, 0)) {
    return count_alloc_unslotted(p, scaled_pool, requested, usable);
  }
  detail::PoolSlot& s = scaled_slot(pools, scaled_pool);
  detail::bump(s.allocations, 1);
  detail::bump(s.bytes_requested, requested);
  if (__builtin_expect(detail::bump_carries(s.added, usable), 0)) {
    return publish_added_then(p, s);
  }
  return p;
}

inline void count_free_then(std::size_t scaled_pool, std::size_t usable) noexcept {
  detail::PoolSlot* pools = detail::t_pools;
  if (__builtin_expect(pools == nullptr, 0)) return count_free_unslotted(scaled_pool, usable);
  detail::PoolSlot& s = scaled_slot(pools, scaled_pool);
  detail::bump(s.frees, 1);
  if (__builtin_expect(detail::bump_carries(s.removed, usable), 0)) {
    return detail::publish_removed(s);
  }
}

// Sums every thread's counts.
void totals(PoolTotals out[kPools]) noexcept;

}  // namespace mnemosyne::stats
