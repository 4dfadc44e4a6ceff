// A tiny lock for short critical sections on the slow path (no driver calls,
// no allocation inside). Constant-initialized, so usable before constructors.
#pragma once

#include <atomic>

#include "platform/platform.hpp"

namespace mnemosyne {

class SpinLock {
 public:
  void lock() noexcept {
    while (flag_.exchange(true, std::memory_order_acquire)) {
      for (std::size_t spins = 0; flag_.load(std::memory_order_relaxed); ++spins) Os::pause(spins);
    }
  }
  void unlock() noexcept { flag_.store(false, std::memory_order_release); }
  // After fork() in the child: the holder may not exist there.
  void reset() noexcept { flag_.store(false, std::memory_order_relaxed); }

 private:
  std::atomic<bool> flag_{false};
};

// Holds the lock with the thread's asynchronous signals blocked: a handler
// that interrupted the holder could otherwise fork, and the fork's copy of
// the heap takes the same lock on the same thread.
class SpinGuard {
 public:
  explicit SpinGuard(SpinLock& lock) noexcept : lock_(lock) { lock_.lock(); }
  ~SpinGuard() { lock_.unlock(); }
  SpinGuard(const SpinGuard&) = delete;
  SpinGuard& operator=(const SpinGuard&) = delete;

 private:
  AsyncSignalsBlocked blocked_;  // constructed first, released last
  SpinLock& lock_;
};

}  // namespace mnemosyne
