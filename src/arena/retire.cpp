// Giving back committed arenas (retire.hpp).
//
// A committed arena is memory the backend backed whole when it gave it:
// managed memory (and pinned memory from cuMemHostAlloc where the driver
// would not register). mimalloc cannot decommit any of it, and the driver
// frees a managed allocation only whole, so such an arena goes back only
// when no block of it is in use. mimalloc 2.0.9 never removes an arena; the
// private copy gains three calls (mimalloc-live.h): a hook that tells when a
// committed arena has no block in use any more, a retire that takes all of
// an arena's blocks at once when none is in use (so mimalloc never hands one
// out again), and a revive that puts the retired slot back to use over new
// memory of the same size, the next time the arena grows.
//
// The hook runs inside mimalloc's free path, where the driver must not be
// called (it calls malloc): it only wakes a thread of mnemosyne's own (every
// asynchronous signal blocked). That thread looks at the committed arenas
// every kPassNs while any of them has no block in use, and retires an arena
// it found unused twice in a row: an arena goes back between one and two
// passes after its last block was freed, so a program that frees its
// working set and builds it again at once keeps its arenas. The first
// arena, where a program's long-lived blocks usually are, is never retired.
//
// An arena that stays because some block of it lives on still holds the
// memory its free blocks held: the driver cannot free part of an
// allocation, but CUDA 13's cuMemDiscardBatchAsync lets it drop what a range
// held. The hook queues every arena block freed (a ring: it may not
// allocate), and the thread, one pass later, claims each block that is
// still free (mimalloc then hands it to nobody, and the fork copy's walk
// skips it), discards it and releases it. A driver without the call, or
// one that refuses it once, is not asked again.
//
// A retire holds grow_lock (growth and revival exclude it) and, while it
// takes the arena out of the segment table, the table's lock (a fork's copy
// and the statistics walk the table under it). A fork's early copy walks
// arenas it listed outside that lock: the memory goes back only after every
// such walk is over (fork_readers).
#include "arena/retire.hpp"

#include <atomic>
#include <cstdint>

#include <mimalloc-live.h>

#include "arena/segment_provider.hpp"
#include "arena/state.hpp"
#include "platform/platform.hpp"

namespace mnemosyne::arena {
namespace {

constexpr std::uint64_t kPassNs = 500'000'000;
// Whether freed blocks are queued for discarding: until the driver could not.
constinit std::atomic<bool> g_discard_wanted{true};
constexpr std::size_t kMaxArenaSlots = sizeof(State::retired) / sizeof(State::retired[0]);

// Bumped by the hook (and the thread woken when it sleeps on it).
constinit std::atomic<std::uint32_t> g_events{0};
constinit std::atomic<bool> g_sleeping{false};
// The thread: 0 not started, 1 started, -1 the OS refused.
constinit std::atomic<int> g_thread{0};

// Arena blocks freed in kept arenas, for the thread to discard (a ring the
// hook writes: it may not allocate). A block overwritten before the thread
// got to it is not discarded.
constexpr std::size_t kFreedRing = 1024;
constinit std::atomic<std::uintptr_t> g_freed[kFreedRing] = {};
constinit std::atomic<std::uint64_t> g_freed_head{0};
constexpr std::size_t kArenaBlock = std::size_t{32} << 20;  // mimalloc's MI_SEGMENT_SIZE

void wake() noexcept {
  // Both sequentially consistent, as the thread's store and load are: either
  // it sees this event before sleeping, or this sees it sleeping.
  g_events.fetch_add(1, std::memory_order_seq_cst);
  if (g_sleeping.load(std::memory_order_seq_cst)) Os::wake_all(&g_events);
}

// mimalloc's hook (mnemosyne_mi_set_arena_free_hook): inside its free path.
void on_arena_free(void*, void* block, std::size_t size, int arena_unused) {
  if (arena_unused == 0 && size == kArenaBlock &&
      g_discard_wanted.load(std::memory_order_relaxed)) {
    const std::uint64_t i = g_freed_head.fetch_add(1, std::memory_order_acq_rel);
    g_freed[i % kFreedRing].store(reinterpret_cast<std::uintptr_t>(block),
                                  std::memory_order_release);
  } else if (arena_unused == 0) {
    return;
  }
  wake();
}

bool retirable(const SegmentTable::Entry& e) noexcept {
  return e.used && !e.dedicated && !e.segment.on_demand &&
         e.segment.start != g_state.first_arena.load(std::memory_order_relaxed);
}

// Takes the arena at `start` out of use and gives its memory back, if no
// block of it is in use; under grow_lock.
bool retire_locked(void* start) noexcept {
  Segment seg;
  int slot = 0;
  {
    SpinGuard guard(g_state.table.lock());
    slot = mnemosyne_mi_arena_retire(start);
    if (slot == 0) return false;
    g_state.table.remove_locked(start, /*dedicated=*/false, &seg);
  }
  // A fork's early copy that listed the arena before may still be reading it.
  while (g_state.fork_readers.load(std::memory_order_acquire) != 0) Os::sleep_ns(1'000'000);
  release_segment(seg);
  if (is_cuda_backend(seg.backend)) g_state.backend_bytes.fetch_sub(seg.raw_size);
  g_state.reserved[static_cast<int>(seg.backend)].fetch_sub(seg.raw_size,
                                                            std::memory_order_relaxed);
  g_state.total_arena_bytes -= seg.size;
  // Growth starts again from what is held: each new arena as large as all
  // those held together (a retired slot of about that size serves it).
  g_state.next_arena_size = g_state.total_arena_bytes;
  g_state.retired[g_state.retired_count++] = State::Retired{slot, seg.size};
  g_state.arenas_retired.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// Discards the memory of the blocks freed in [from, to) of the ring that are
// still free (mimalloc hands a claimed block to nobody); under grow_lock.
void discard_freed_locked(std::uint64_t from, std::uint64_t to) noexcept {
  if (to - from > kFreedRing) from = to - kFreedRing;  // the older ones were overwritten
  for (std::uint64_t i = from; i < to; ++i) {
    const std::uintptr_t b = g_freed[i % kFreedRing].exchange(0, std::memory_order_acq_rel);
    if (b == 0) continue;
    void* block = reinterpret_cast<void*>(b);
    const BackendId backend = owner_backend(owner_tag(block));
    if (!mnemosyne_mi_block_claim(block)) continue;  // in use again, or its arena went
    // A fork's walk that began before the claim may be reading this block
    // (it was a segment then): not now. Both sequentially consistent with
    // the walk's count and bit reads.
    if (g_state.fork_readers.load(std::memory_order_seq_cst) != 0) {
      mnemosyne_mi_block_release(block);
      const std::uint64_t again = g_freed_head.fetch_add(1, std::memory_order_acq_rel);
      g_freed[again % kFreedRing].store(b, std::memory_order_release);
      continue;
    }
    const bool done = discard_memory(backend, block, kArenaBlock);
    mnemosyne_mi_block_release(block);
    if (!done) {
      // The driver cannot: nothing more is queued.
      g_discard_wanted.store(false, std::memory_order_relaxed);
      return;
    }
  }
}

// One pass: discards the blocks freed before the last pass (`*discard_from`
// up to `*discard_to`, which become the next pass's), retires the arenas
// found unused now that `marked` (the last pass's) holds too, and leaves in
// `marked` those unused now for the first time. Returns how many that is.
std::size_t pass(void** marked, std::size_t count, std::uint64_t* discard_from,
                 std::uint64_t* discard_to) noexcept {
  void* unused[kMaxArenaSlots];
  std::size_t found = 0;
  g_state.grow_lock.lock();
  g_state.grower.store(Os::thread_id(), std::memory_order_relaxed);
  discard_freed_locked(*discard_from, *discard_to);
  *discard_from = *discard_to;
  *discard_to = g_freed_head.load(std::memory_order_acquire);
  {
    SpinGuard guard(g_state.table.lock());
    const SegmentTable::Entry* entries = g_state.table.entries();
    for (std::size_t i = 0; i < g_state.table.high_water() && found < kMaxArenaSlots; ++i) {
      const SegmentTable::Entry& e = entries[i];
      if (retirable(e) && mnemosyne_mi_arena_unused(e.segment.start) != 0) {
        unused[found++] = e.segment.start;
      }
    }
  }
  std::size_t still = 0;
  for (std::size_t i = 0; i < found; ++i) {
    bool seen_before = false;
    for (std::size_t j = 0; j < count && !seen_before; ++j) seen_before = marked[j] == unused[i];
    if (!seen_before || !retire_locked(unused[i])) unused[still++] = unused[i];
  }
  g_state.grow_lock.unlock();
  for (std::size_t i = 0; i < still; ++i) marked[i] = unused[i];
  return still;
}

void retire_thread(void*) {
  void* marked[kMaxArenaSlots];
  std::size_t count = 0;
  std::uint64_t discard_from = 0;
  std::uint64_t discard_to = 0;
  for (;;) {
    const std::uint32_t seen = g_events.load(std::memory_order_seq_cst);
    count = pass(marked, count, &discard_from, &discard_to);
    if (count == 0 && discard_from == discard_to) {
      g_sleeping.store(true, std::memory_order_seq_cst);
      if (g_events.load(std::memory_order_seq_cst) == seen) Os::wait_while_equal(&g_events, seen);
      g_sleeping.store(false, std::memory_order_relaxed);
    }
    Os::sleep_ns(kPassNs);
  }
}

}  // namespace

void install_retire_hook() noexcept {
  mnemosyne_mi_set_arena_free_hook(&on_arena_free);
}

void start_retiring() noexcept {
  if (g_thread.load(std::memory_order_relaxed) != 0 || g_state.forked_child) return;
  bool any = false;
  {
    SpinGuard guard(g_state.table.lock());
    const SegmentTable::Entry* entries = g_state.table.entries();
    for (std::size_t i = 0; i < g_state.table.high_water() && !any; ++i) {
      any = retirable(entries[i]);
    }
  }
  if (!any) return;
  int expected = 0;
  if (!g_thread.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) return;
  // Refused: arenas stay until the process ends, as they did before.
  if (!Os::start_thread(&retire_thread, nullptr)) g_thread.store(-1);
}

int pick_retired_locked(std::size_t need, std::size_t want, std::size_t* size) noexcept {
  int best = -1;
  for (int i = 0; i < g_state.retired_count; ++i) {
    const std::size_t s = g_state.retired[i].size;
    if (s < need) continue;
    if (best < 0) {
      best = i;
      continue;
    }
    const std::size_t b = g_state.retired[best].size;
    // The smallest that holds `want`, else the largest there is.
    if ((s >= want && (b < want || s < b)) || (b < want && s > b)) best = i;
  }
  if (best < 0) return 0;
  *size = g_state.retired[best].size;
  return g_state.retired[best].slot;
}

void revived_locked(int slot) noexcept {
  for (int i = 0; i < g_state.retired_count; ++i) {
    if (g_state.retired[i].slot != slot) continue;
    g_state.retired[i] = g_state.retired[--g_state.retired_count];
    g_state.arenas_retired.fetch_sub(1, std::memory_order_relaxed);
    return;
  }
}

}  // namespace mnemosyne::arena
