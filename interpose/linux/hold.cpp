#include "hold.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

#include "arena/arena.hpp"
#include "arena/ownership_map.hpp"
#include "mode.hpp"

namespace mnemosyne {
namespace {

constinit std::atomic<int> g_hold_generation{0};  // the futex waiters sleep on

long futex(std::atomic<int>* word, int op, int value, const timespec* timeout) noexcept {
  return syscall(SYS_futex, reinterpret_cast<int*>(word), op, value, timeout, nullptr, 0);
}

void wake_waiters() noexcept {
  g_hold_generation.fetch_add(1, std::memory_order_seq_cst);
  futex(&g_hold_generation, FUTEX_WAKE_PRIVATE, 0x7fffffff, nullptr);
}

}  // namespace

void AllocationWindow::hold() noexcept {
  before_ = g_mode.load(std::memory_order_relaxed);
  g_mode.store(Mode::held, std::memory_order_seq_cst);
  // Held first: a free that finds its entry's route gone sees it then.
  g_free_checks.fetch_or(kFreeHeld, std::memory_order_seq_cst);
  arena::set_free_route(0);
}

// Frees go on, on the slow path until end(): divert() runs with the segment
// table's lock held (prepare_fork's), which set_free_route takes.
void AllocationWindow::divert() noexcept {
  g_free_checks.fetch_and(static_cast<std::uint8_t>(~kFreeHeld), std::memory_order_seq_cst);
  g_mode.store(Mode::diverted, std::memory_order_seq_cst);
  wake_waiters();
}

namespace {

// The frees a fork defers: a fixed list (a free must not allocate), 512 KiB
// of .bss. A free past its end waits for the fork's end, as under hold().
constexpr std::size_t kDeferredCapacity = std::size_t{1} << 16;
constinit std::atomic<void*> g_deferred[kDeferredCapacity] = {};
constinit std::atomic<std::size_t> g_deferred_count{0};  // slots taken (may pass the capacity)

// Frees the deferred blocks, kFreeDeferred being off: those whose slot was
// taken before the bit went off. In a child, a slot taken and not yet written
// at the clone belongs to a thread that is not there: skipped. A free that
// read the bit just before it went off and takes its slot after the list is
// emptied stays in the list until the next fork's end (freed late, never
// twice).
void free_deferred(bool in_child) noexcept {
  std::size_t done = 0;
  for (;;) {
    std::size_t taken = g_deferred_count.load(std::memory_order_acquire);
    const std::size_t n = taken < kDeferredCapacity ? taken : kDeferredCapacity;
    for (std::size_t i = done; i < n; ++i) {
      void* p = g_deferred[i].exchange(nullptr, std::memory_order_acq_rel);
      while (p == nullptr && !in_child) {  // taken, not yet written: a moment
        p = g_deferred[i].exchange(nullptr, std::memory_order_acq_rel);
      }
      if (p != nullptr) arena::free(p, owner_tag(p));
    }
    done = n > done ? n : done;
    if (g_deferred_count.compare_exchange_strong(taken, 0, std::memory_order_acq_rel)) return;
  }
}

}  // namespace

void AllocationWindow::divert_deferring_frees() noexcept {
  g_free_checks.fetch_or(kFreeDeferred, std::memory_order_seq_cst);
  divert();
}

void AllocationWindow::hold_again() noexcept {
  g_mode.store(Mode::held, std::memory_order_seq_cst);
}

void free_arena_block(void* ptr, std::uint8_t tag) noexcept {
  while ((g_free_checks.load(std::memory_order_acquire) & kFreeDeferred) != 0) {
    const std::size_t slot = g_deferred_count.fetch_add(1, std::memory_order_acq_rel);
    if (slot < kDeferredCapacity) {
      g_deferred[slot].store(ptr, std::memory_order_release);
      return;
    }
    g_deferred_count.fetch_sub(1, std::memory_order_acq_rel);
    wait_while_held();  // full: until the fork's end
  }
  arena::free(ptr, tag);
}

void AllocationWindow::end(bool in_child) noexcept {
  const std::uint8_t bits = kFreeHeld | kFreeDeferred;
  const bool deferred =
      (g_free_checks.fetch_and(static_cast<std::uint8_t>(~bits), std::memory_order_seq_cst) &
       kFreeDeferred) != 0;
  if (deferred) free_deferred(in_child);
  arena::set_free_route(free_route_of(g_free_checks.load(std::memory_order_relaxed)));
  g_mode.store(before_, std::memory_order_seq_cst);
  wake_waiters();
}

void wait_while_held() noexcept {
  const int generation = g_hold_generation.load(std::memory_order_seq_cst);
  if (g_mode.load(std::memory_order_seq_cst) != Mode::held) return;
  // A timeout, so that a wake-up lost to a race costs a millisecond, not a hang.
  const timespec ms{0, 1000 * 1000};
  futex(&g_hold_generation, FUTEX_WAIT_PRIVATE, generation, &ms);
}

}  // namespace mnemosyne
