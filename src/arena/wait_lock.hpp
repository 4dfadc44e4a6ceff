// A lock whose waiters sleep, with a bounded wait: the arena's grow lock,
// held across driver calls that may take seconds. Written over the
// platform's futex (platform::System::wait_while_equal / wake_all) rather
// than pthread_mutex_timedlock: the arena then calls no thread library of
// its own (winpthreads on Windows), the wait is measured on the monotonic
// clock (a timed pthread lock takes a CLOCK_REALTIME deadline, which a
// clock change moves), and the lock is constant-initialised, usable before
// any constructor runs.
//
// The protocol is the second mutex of Drepper's "Futexes Are Tricky":
// 0 free, 1 held, 2 held with (perhaps) waiters.
#pragma once

#include <errno.h>

#include <atomic>
#include <cstdint>

#include "platform/platform.hpp"

namespace mnemosyne {

class WaitLock {
 public:
  void lock() noexcept { (void)lock_within(platform::kNoTimeout); }

  // True when the lock was taken within timeout_ns (platform::kNoTimeout:
  // no limit). errno is left as it was.
  bool lock_within(std::uint64_t timeout_ns) noexcept {
    std::uint32_t c = 0;
    if (state_.compare_exchange_strong(c, 1, std::memory_order_acquire)) return true;
    const int saved_errno = errno;
    const std::uint64_t start = platform::System::monotonic_ns();
    if (c != 2) c = state_.exchange(2, std::memory_order_acquire);
    while (c != 0) {
      std::uint64_t left = platform::kNoTimeout;
      if (timeout_ns != platform::kNoTimeout) {
        const std::uint64_t spent = platform::System::monotonic_ns() - start;
        if (spent >= timeout_ns) break;
        left = timeout_ns - spent;
      }
      platform::System::wait_while_equal(&state_, 2, left);
      c = state_.exchange(2, std::memory_order_acquire);
    }
    errno = saved_errno;
    return c == 0;
  }

  void unlock() noexcept {
    if (state_.exchange(0, std::memory_order_release) == 2) platform::System::wake_all(&state_);
  }

  // After fork() in the child: the holder may not exist there.
  void reset() noexcept { state_.store(0, std::memory_order_relaxed); }

 private:
  std::atomic<std::uint32_t> state_{0};
};

}  // namespace mnemosyne
