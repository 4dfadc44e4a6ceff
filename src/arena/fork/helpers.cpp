// Helper threads for the fork copy (helpers.hpp).
//
// A job is published by bumping g_generation (the work, its argument and the
// number of workers stored before it); each helper that takes part runs its
// share and counts g_pending down, the last one waking the caller. A helper
// takes its index when it is ready to see the next generation, so a job
// never counts on a helper that could miss it.
#include "arena/fork/helpers.hpp"

#include <atomic>
#include <cstdint>

#include "platform/platform.hpp"

namespace mnemosyne::arena {
namespace {

using Work = void (*)(void*, std::size_t, std::size_t);

// 0 not started, 1 started (or being started), -1 none to start.
constinit std::atomic<int> g_started{0};
// Helpers waiting for jobs; helper i (1-based) takes part in a job of n > i
// workers.
constinit std::atomic<std::uint32_t> g_ready{0};
constinit std::atomic<std::uint32_t> g_generation{0};
constinit std::atomic<std::uint32_t> g_pending{0};
constinit std::atomic<Work> g_work{nullptr};
constinit std::atomic<void*> g_arg{nullptr};
constinit std::atomic<std::size_t> g_workers{0};
constexpr std::uint64_t kReadyWaitNs = 100'000'000;

void helper_main(void*) {
  std::uint32_t seen = g_generation.load(std::memory_order_seq_cst);
  const std::size_t index = g_ready.fetch_add(1, std::memory_order_seq_cst) + 1;
  Os::wake_all(&g_ready);
  for (;;) {
    std::uint32_t now = g_generation.load(std::memory_order_acquire);
    while (now == seen) {
      Os::wait_while_equal(&g_generation, seen, platform::kNoTimeout);
      now = g_generation.load(std::memory_order_acquire);
    }
    seen = now;
    const std::size_t workers = g_workers.load(std::memory_order_relaxed);
    if (index >= workers) continue;  // not in this job
    g_work.load(std::memory_order_relaxed)(g_arg.load(std::memory_order_relaxed), index, workers);
    if (g_pending.fetch_sub(1, std::memory_order_acq_rel) == 1) Os::wake_all(&g_pending);
  }
}

}  // namespace

void start_fork_helpers(std::size_t cpus) noexcept {
  int expected = 0;
  if (!g_started.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) return;
  const std::size_t helpers = (cpus < kMaxForkWorkers ? cpus : kMaxForkWorkers) - 1;
  std::uint32_t started = 0;
  for (; started < helpers; ++started) {
    if (!Os::start_thread(&helper_main, nullptr)) break;  // the copy runs on fewer
  }
  // Until they are ready (a fork soon after gets them all), for a moment at
  // most: a thread takes tens of microseconds to start.
  const std::uint64_t deadline = Os::monotonic_ns() + kReadyWaitNs;
  for (std::uint32_t ready; (ready = g_ready.load(std::memory_order_acquire)) < started;) {
    const std::uint64_t now = Os::monotonic_ns();
    if (now >= deadline) break;
    Os::wait_while_equal(&g_ready, ready, deadline - now);
  }
}

bool fork_helpers_started() noexcept {
  return g_started.load(std::memory_order_relaxed) != 0;
}

std::size_t fork_workers_ready() noexcept {
  const std::size_t n = g_ready.load(std::memory_order_seq_cst) + 1;
  return n < kMaxForkWorkers ? n : kMaxForkWorkers;
}

std::size_t run_on_fork_workers(Work work, void* arg, std::size_t want) noexcept {
  std::size_t n = fork_workers_ready();
  if (n > want) n = want;
  if (n <= 1) {
    work(arg, 0, 1);
    return 1;
  }
  g_work.store(work, std::memory_order_relaxed);
  g_arg.store(arg, std::memory_order_relaxed);
  g_workers.store(n, std::memory_order_relaxed);
  g_pending.store(static_cast<std::uint32_t>(n - 1), std::memory_order_relaxed);
  g_generation.fetch_add(1, std::memory_order_seq_cst);
  Os::wake_all(&g_generation);
  work(arg, 0, n);
  for (std::uint32_t left; (left = g_pending.load(std::memory_order_acquire)) != 0;) {
    Os::wait_while_equal(&g_pending, left, platform::kNoTimeout);
  }
  return n;
}

void forget_fork_helpers() noexcept {
  g_ready.store(0, std::memory_order_relaxed);
  g_pending.store(0, std::memory_order_relaxed);
  g_started.store(-1, std::memory_order_relaxed);
}

}  // namespace mnemosyne::arena
