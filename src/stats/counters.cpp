#include "stats/counters.hpp"

namespace mnemosyne::stats {

namespace detail {

constinit Slot g_slots[kSlots + 1];
__attribute__((tls_model("initial-exec"))) constinit thread_local PoolSlot* t_pools = nullptr;

}  // namespace detail

namespace {

using detail::kSlots;
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

}  // namespace

namespace detail {

void count_unslotted(int pool, std::int64_t allocs, std::int64_t frees, std::uint64_t requested,
                     std::int64_t live) noexcept {
  // Only read here: a thread that found the slots taken counts in the
  // overflow slot from then on.
  static __attribute__((tls_model("initial-exec"))) constinit thread_local bool t_overflow = false;
  if (!t_overflow) {
    const int claimed = g_next_slot.fetch_add(1, std::memory_order_relaxed);
    if (claimed < kSlots) {
      t_pools = g_slots[claimed].pools;
      PoolSlot& s = t_pools[pool];
      bump(s.allocations, static_cast<std::uint64_t>(allocs));
      bump(s.frees, static_cast<std::uint64_t>(frees));
      bump(s.bytes_requested, requested);
      add_live(s, pool, live);
      return;
    }
    t_overflow = true;
  }
  PoolSlot& s = g_slots[kSlots].pools[pool];
  s.allocations.fetch_add(static_cast<std::uint64_t>(allocs), std::memory_order_relaxed);
  s.frees.fetch_add(static_cast<std::uint64_t>(frees), std::memory_order_relaxed);
  s.bytes_requested.fetch_add(requested, std::memory_order_relaxed);
  publish_total(pool, live);
}

void publish(PoolSlot& s, int pool, std::int64_t pending) noexcept {
  s.unpublished.store(0, std::memory_order_relaxed);
  publish_total(pool, pending);
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
      t.allocations += s.allocations.load(std::memory_order_relaxed);
      t.frees += s.frees.load(std::memory_order_relaxed);
      t.bytes_requested += s.bytes_requested.load(std::memory_order_relaxed);
      t.bytes_live += s.unpublished.load(std::memory_order_relaxed);
    }
    // The published peak lags the exact live total by under 64 KiB a thread.
    const std::uint64_t peak = g_peak[p].load(std::memory_order_relaxed);
    const std::uint64_t live = t.bytes_live > 0 ? static_cast<std::uint64_t>(t.bytes_live) : 0;
    t.bytes_peak = peak > live ? peak : live;
    out[p] = t;
  }
}

void* count_alloc_rare(void* p, int pool, std::size_t requested, std::size_t usable) noexcept {
  count_alloc(pool, requested, usable);
  return p;
}

void count_free_rare(int pool, std::size_t usable) noexcept {
  count_free(pool, usable);
}

}  // namespace mnemosyne::stats
