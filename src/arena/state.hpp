// The arena's process-wide state, shared by its growth and fork handling.
// Constant-initialized: malloc can run before any constructor.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "arena/arena.hpp"
#include "arena/segment_table.hpp"
#include "arena/wait_lock.hpp"

namespace mnemosyne::arena {

struct State {
  Config cfg{};
  std::atomic<BackendId> backend{BackendId::none};  // where new segments come from
  std::atomic<std::uint32_t> generation{0};         // bumped by every added arena
  // Requests at least this large get a dedicated segment (arena.cpp).
  std::atomic<std::size_t> dedicated_threshold{std::size_t{1} << 30};
  std::atomic<bool> exhausted{false};  // the backend said no; do not ask again
  char exhausted_reason[kReasonLen] = {};
  std::atomic<bool> warned_fallback{false};
  char fallback_reason[kReasonLen] = {};  // written once, by the first fallback
  WaitLock grow_lock;
  // The process the arena works for: set at start and in a forked child's
  // handler. Another pid on a slow path is a child no fork handler saw
  // (vfork, clone), sharing the parent's memory, where the driver must not
  // be called.
  std::atomic<long> pid{0};
  std::atomic<long> grower{-1};  // thread id of grow_lock's latest holder
  int arenas = 0;                // mimalloc arena slots taken, under grow_lock
  // Committed arenas given back whole (retire.cpp): their mimalloc slot, which
  // a later growth may revive, and size. Under grow_lock.
  struct Retired {
    int slot = 0;
    std::size_t size = 0;
  };
  Retired retired[64] = {};  // mimalloc's MI_MAX_ARENAS
  int retired_count = 0;
  std::atomic<std::uint64_t> arenas_retired{0};  // retired_count, for the statistics
  std::atomic<void*> first_arena{nullptr};       // never retired
  // Fork copies walking arenas (src/arena/fork/; the early one outside the
  // table lock): a retired arena's memory goes back, and a free block's is
  // discarded, only when none is (retire.cpp).
  std::atomic<int> fork_readers{0};
  // A fork() is under way: the slow path does not ask the driver
  // (close_fork_gate), and how many threads are in it past that check.
  std::atomic<bool> fork_gate{false};
  std::atomic<int> slow_paths{0};
  std::size_t next_arena_size = 0;    // under grow_lock
  std::size_t total_arena_bytes = 0;  // under grow_lock
  SegmentTable table;
  // The free route arena entries of the ownership map carry
  // (set_free_route; arena.cpp's enter_arena keeps new arenas in step).
  std::atomic<std::uint8_t> free_route{0};
  std::atomic<std::uint64_t> backend_bytes{0};  // CUDA bytes taken, for the limit
  std::atomic<std::uint64_t> reserved[kBackendCount] = {};
  std::atomic<std::uint64_t> dedicated_live{0};
  std::atomic<std::uint64_t> dedicated_total{0};
  // The most dedicated blocks, and bytes of them, live at once (glibc's
  // malloc_stats reports its mmapped chunks' high-water marks), and the
  // bytes live now.
  std::atomic<std::uint64_t> dedicated_peak{0};
  std::atomic<std::uint64_t> dedicated_bytes{0};
  std::atomic<std::uint64_t> dedicated_bytes_peak{0};
  std::atomic<std::uint64_t> host_fallbacks{0};
  std::atomic<std::uint64_t> driver_allocations{0};
  std::atomic<std::uint64_t> grow_waits_timed_out{0};
  std::atomic<std::uint64_t> fork_bytes_copied{0};
  std::atomic<std::uint64_t> fork_bytes_via_driver{0};
  std::atomic<std::size_t> fork_copy_workers{0};  // the most threads one fork's copy ran on
  bool forked_child = false;  // a child of fork() without exec: never calls the driver
};

extern constinit State g_state;

// In a forked child (child_after_fork): the fork's driver gate open again,
// and the slow paths in flight only this thread's (arena.cpp).
void open_fork_gate_in_child() noexcept;

}  // namespace mnemosyne::arena
