#include "stats/counters.hpp"

namespace mnemosyne::stats {

namespace detail {

constinit Slot g_slots[kSlots + 1];
__attribute__((tls_model("initial-exec"))) constinit thread_local PoolSlot* t_pools = nullptr;

}  // namespace detail

namespace {

using detail::kSlots;
using detail::kUnpublishedStart;
using detail::PoolSlot;

constinit std::atomic<int> g_next_slot{0};
constinit std::atomic<std::int64_t> g_live[kPools] = {};
constinit std::atomic<std::uint64_t> g_peak[kPools] = {};

void publish_total(int pool, std::int64_t delta) noexcept {
  const std::int64_t now = g_live[pool].fetch_add(delta, std::memory_order_relaxed) + delta;
  if (now <= 0) return;
  std::uint64_t peak = g_peak[pool].load(std::memory_order_relaxed);
  while (static_cast<std::uint64_t>(now) > peak &&
         !g_peak[pool].compare_exchange_weak(peak, static_cast<std::uint64_t>(now),
                                             std::memory_order_relaxed)) {
  }
}

// Takes an unpublished counter's bytes (it counts from kUnpublishedStart)
// and starts it again.
std::uint64_t take_unpublished(std::uint64_t& counter) noexcept {
  const std::uint64_t bytes = detail::read(counter) - kUnpublishedStart;
  std::atomic_ref<std::uint64_t>(counter).store(kUnpublishedStart, std::memory_order_relaxed);
  return bytes;
}

// The pool a thread's counts in `s` are of: slots are arrays of kPools.
int pool_of_slot(const PoolSlot& s) noexcept {
  return static_cast<int>((&s - &detail::g_slots[0].pools[0]) % kPools);
}

}  // namespace

namespace detail {

void count_unslotted(int pool, std::uint64_t allocs, std::uint64_t frees, std::uint64_t requested,
                     std::int64_t live) noexcept {
  // Only read here: a thread that found the slots taken counts in the
  // overflow slot from then on.
  static __attribute__((tls_model("initial-exec"))) constinit thread_local bool t_overflow = false;
  if (!t_overflow) {
    const int claimed = g_next_slot.fetch_add(1, std::memory_order_relaxed);
    if (claimed < kSlots) {
      // A report reading the slot meanwhile may see one of the two started
      // and not the other: 64 KiB off for that instant, as while a publish
      // is under way.
      for (PoolSlot& s : g_slots[claimed].pools) {
        std::atomic_ref<std::uint64_t>(s.added).store(kUnpublishedStart, std::memory_order_relaxed);
        std::atomic_ref<std::uint64_t>(s.removed).store(kUnpublishedStart,
                                                        std::memory_order_relaxed);
      }
      t_pools = g_slots[claimed].pools;
      if (allocs != 0) {
        count_alloc(pool, requested, static_cast<std::size_t>(live));
      } else {
        count_free(pool, static_cast<std::size_t>(-live));
      }
      return;
    }
    t_overflow = true;
  }
  // Shared: atomic adds, and live bytes straight to the pool's total.
  std::atomic_ref<std::uint64_t>(g_slots[kSlots].pools[pool].allocations)
      .fetch_add(allocs, std::memory_order_relaxed);
  std::atomic_ref<std::uint64_t>(g_slots[kSlots].pools[pool].frees)
      .fetch_add(frees, std::memory_order_relaxed);
  std::atomic_ref<std::uint64_t>(g_slots[kSlots].pools[pool].bytes_requested)
      .fetch_add(requested, std::memory_order_relaxed);
  publish_total(pool, live);
}

void publish_added(PoolSlot& s) noexcept {
  publish_total(pool_of_slot(s), static_cast<std::int64_t>(take_unpublished(s.added)));
}

void publish_removed(PoolSlot& s) noexcept {
  publish_total(pool_of_slot(s), -static_cast<std::int64_t>(take_unpublished(s.removed)));
}

}  // namespace detail

void totals(PoolTotals out[kPools]) noexcept {
  const int used = g_next_slot.load(std::memory_order_relaxed);
  const int last = used < kSlots ? used : kSlots;
  for (int p = 0; p < kPools; ++p) {
    PoolTotals t;
    t.bytes_live = g_live[p].load(std::memory_order_relaxed);
    for (int i = 0; i <= last; ++i) {
      const PoolSlot& s = detail::g_slots[i].pools[p];
      t.allocations += detail::read(s.allocations);
      t.frees += detail::read(s.frees);
      t.bytes_requested += detail::read(s.bytes_requested);
      // Both count from the same start: their difference is the net.
      t.bytes_live += static_cast<std::int64_t>(detail::read(s.added) - detail::read(s.removed));
    }
    // The published peak lags the exact live total by under 64 KiB a thread.
    const std::uint64_t peak = g_peak[p].load(std::memory_order_relaxed);
    const std::uint64_t live = t.bytes_live > 0 ? static_cast<std::uint64_t>(t.bytes_live) : 0;
    t.bytes_peak = peak > live ? peak : live;
    out[p] = t;
  }
}

void* count_alloc_unslotted(void* p, std::size_t scaled_pool, std::size_t requested,
                            std::size_t usable) noexcept {
  count_alloc(static_cast<int>(scaled_pool / kPoolScale), requested, usable);
  return p;
}

void* publish_added_then(void* p, detail::PoolSlot& s) noexcept {
  detail::publish_added(s);
  return p;
}

void count_free_unslotted(std::size_t scaled_pool, std::size_t usable) noexcept {
  count_free(static_cast<int>(scaled_pool / kPoolScale), usable);
}

}  // namespace mnemosyne::stats
