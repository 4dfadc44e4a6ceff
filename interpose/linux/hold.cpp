#include "hold.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

#include "arena/arena.hpp"
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

void AllocationWindow::end() noexcept {
  g_free_checks.fetch_and(static_cast<std::uint8_t>(~kFreeHeld), std::memory_order_seq_cst);
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
