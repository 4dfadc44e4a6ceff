#include "fork_lock.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

namespace mnemosyne {
namespace {

int load(const int& word) noexcept {
  return __atomic_load_n(&word, __ATOMIC_ACQUIRE);
}

}  // namespace

int ForkLock::take(bool wait) noexcept {
  Os::SignalMask mask;
  Os::block_async_signals(&mask);
  const int self = static_cast<int>(gettid());
  if (load(owner_) != self) {
    for (;;) {
      int expected = 0;
      if (__atomic_compare_exchange_n(&owner_, &expected, self, false, __ATOMIC_ACQUIRE,
                                      __ATOMIC_RELAXED)) {
        break;
      }
      if (!wait) {
        Os::restore_signals(mask);
        return 0;
      }
      // A timeout, so that a wake-up lost to a race costs a millisecond.
      const timespec ms{0, 1000 * 1000};
      syscall(SYS_futex, &owner_, FUTEX_WAIT_PRIVATE, expected, &ms, nullptr, 0);
    }
  }
  if (depth_ < kMaxDepth) masks_[depth_] = mask;
  return ++depth_;
}

int ForkLock::acquire() noexcept {
  return take(true);
}

int ForkLock::try_acquire() noexcept {
  return take(false);
}

void ForkLock::release() noexcept {
  const int depth = --depth_;
  if (depth == 0) {
    __atomic_store_n(&owner_, 0, __ATOMIC_RELEASE);
    syscall(SYS_futex, &owner_, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
  }
  // Holds nested deeper than kMaxDepth found the signals blocked already:
  // they stay so.
  if (depth < kMaxDepth) Os::restore_signals(masks_[depth]);
}

void ForkLock::release_in_child() noexcept {
  __atomic_store_n(&owner_, static_cast<int>(gettid()), __ATOMIC_RELAXED);
  release();
}

void ForkLock::reset_in_child() noexcept {
  __atomic_store_n(&owner_, 0, __ATOMIC_RELAXED);
  depth_ = 0;
}

int ForkLock::depth() const noexcept {
  return load(owner_) == static_cast<int>(gettid()) ? depth_ : 0;
}

}  // namespace mnemosyne
