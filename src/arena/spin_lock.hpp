// A tiny lock for short critical sections on the slow path (no driver calls,
// no allocation inside). Constant-initialized, so usable before constructors.
#pragma once

#include <sched.h>

#include <atomic>

namespace mnemosyne {

class SpinLock {
 public:
  void lock() noexcept {
    while (flag_.exchange(true, std::memory_order_acquire)) {
      while (flag_.load(std::memory_order_relaxed)) sched_yield();
    }
  }
  void unlock() noexcept { flag_.store(false, std::memory_order_release); }
  // After fork() in the child: the holder may not exist there.
  void reset() noexcept { flag_.store(false, std::memory_order_relaxed); }

 private:
  std::atomic<bool> flag_{false};
};

class SpinGuard {
 public:
  explicit SpinGuard(SpinLock& lock) noexcept : lock_(lock) { lock_.lock(); }
  ~SpinGuard() { lock_.unlock(); }
  SpinGuard(const SpinGuard&) = delete;
  SpinGuard& operator=(const SpinGuard&) = delete;

 private:
  SpinLock& lock_;
};

}  // namespace mnemosyne
