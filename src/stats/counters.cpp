#include "stats/counters.hpp"

namespace mnemosyne::stats {
namespace {

constexpr int kSlots = 4096;
constexpr std::int64_t kPublishBytes = 64 * 1024;

struct PoolSlot {
  std::atomic<std::uint64_t> allocations{0};
  std::atomic<std::uint64_t> frees{0};
  std::atomic<std::uint64_t> bytes_requested{0};
  std::atomic<std::int64_t> live{0};         // this thread's net usable bytes
  std::atomic<std::int64_t> unpublished{0};  // not yet in g_live
};

struct Slot {
  PoolSlot pools[kPools];
};

constinit Slot g_slots[kSlots + 1];  // the last one is shared by overflow threads
constinit std::atomic<int> g_next_slot{0};
constinit std::atomic<std::int64_t> g_live[kPools] = {};
constinit std::atomic<std::uint64_t> g_peak[kPools] = {};

__attribute__((tls_model("initial-exec"))) constinit thread_local int t_slot = -1;

int slot_index() noexcept {
  if (__builtin_expect(t_slot >= 0, 1)) return t_slot;
  const int claimed = g_next_slot.fetch_add(1, std::memory_order_relaxed);
  t_slot = claimed < kSlots ? claimed : kSlots;
  return t_slot;
}

// Adds `v` to a counter only this thread writes (plain load + store), or
// with an atomic add in the shared overflow slot.
template <class T>
inline void bump(std::atomic<T>& counter, T v, bool shared) noexcept {
  if (shared) {
    counter.fetch_add(v, std::memory_order_relaxed);
  } else {
    counter.store(counter.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
  }
}

void publish(int pool, std::int64_t delta) noexcept {
  const std::int64_t now = g_live[pool].fetch_add(delta, std::memory_order_relaxed) + delta;
  if (now <= 0) return;
  std::uint64_t peak = g_peak[pool].load(std::memory_order_relaxed);
  while (static_cast<std::uint64_t>(now) > peak &&
         !g_peak[pool].compare_exchange_weak(peak, static_cast<std::uint64_t>(now),
                                             std::memory_order_relaxed)) {
  }
}

void change_live(PoolSlot& s, int pool, std::int64_t delta, bool shared) noexcept {
  bump(s.live, delta, shared);
  if (shared) {
    publish(pool, delta);
    return;
  }
  const std::int64_t pending = s.unpublished.load(std::memory_order_relaxed) + delta;
  if (pending >= kPublishBytes || pending <= -kPublishBytes) {
    s.unpublished.store(0, std::memory_order_relaxed);
    publish(pool, pending);
  } else {
    s.unpublished.store(pending, std::memory_order_relaxed);
  }
}

}  // namespace

void count_alloc(int pool, std::size_t requested, std::size_t usable) noexcept {
  const int index = slot_index();
  const bool shared = index == kSlots;
  PoolSlot& s = g_slots[index].pools[pool];
  bump(s.allocations, std::uint64_t{1}, shared);
  bump(s.bytes_requested, static_cast<std::uint64_t>(requested), shared);
  change_live(s, pool, static_cast<std::int64_t>(usable), shared);
}

void count_free(int pool, std::size_t usable) noexcept {
  const int index = slot_index();
  const bool shared = index == kSlots;
  PoolSlot& s = g_slots[index].pools[pool];
  bump(s.frees, std::uint64_t{1}, shared);
  change_live(s, pool, -static_cast<std::int64_t>(usable), shared);
}

void totals(PoolTotals out[kPools]) noexcept {
  const int used = g_next_slot.load(std::memory_order_relaxed);
  const int last = used < kSlots ? used : kSlots;
  for (int p = 0; p < kPools; ++p) {
    PoolTotals t;
    for (int i = 0; i <= last; ++i) {
      const PoolSlot& s = g_slots[i].pools[p];
      t.allocations += s.allocations.load(std::memory_order_relaxed);
      t.frees += s.frees.load(std::memory_order_relaxed);
      t.bytes_requested += s.bytes_requested.load(std::memory_order_relaxed);
      t.bytes_live += s.live.load(std::memory_order_relaxed);
    }
    // The published peak lags the exact live total by under 64 KiB a thread.
    const std::uint64_t peak = g_peak[p].load(std::memory_order_relaxed);
    const std::uint64_t live = t.bytes_live > 0 ? static_cast<std::uint64_t>(t.bytes_live) : 0;
    t.bytes_peak = peak > live ? peak : live;
    out[p] = t;
  }
}

}  // namespace mnemosyne::stats
