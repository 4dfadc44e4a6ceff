// One fork at a time, never waiting in a signal handler for itself.
//
// Forks are serialized: the heap copy is made into process-wide state, and a
// second thread's fork waits until the first one is over, as glibc's own
// locks make it wait inside fork() anyway. The lock is held from the fork()
// wrapper's start (or the prepare handler, for a fork that bypasses the
// wrapper: daemon(), forkpty()) until the fork is over in the parent, with
// the holder's asynchronous signals blocked: no handler can run on the
// forking thread meanwhile, so none can fork again there and wait for a lock
// its own thread holds (a handler that forks while the main thread forks is
// a crash reporter's or a supervisor's shape; POSIX lists fork() as
// async-signal-safe). The signals stay pending and are delivered once the
// fork is over, in the parent (a child starts with none pending).
//
// The owner may still enter again through a synchronous signal (a fault)
// whose handler forks: that is counted, never waited for.
#pragma once

#include "platform/platform.hpp"

namespace mnemosyne {

class ForkLock {
 public:
  // Blocks the asynchronous signals, then waits until no other thread holds
  // the lock. Returns the depth of this hold on the calling thread (1 for the
  // outermost).
  int acquire() noexcept;
  // As acquire(), but when another thread holds the lock: returns 0 at once
  // and changes nothing (glibc's _Fork must not wait, see fork.cpp).
  int try_acquire() noexcept;
  // Ends the innermost hold of the owner and puts back the signal mask it
  // found.
  void release() noexcept;
  // In a forked child, for the hold the fork was made under: the child's
  // thread (a new thread id) owns what is left of the parent's holds.
  void release_in_child() noexcept;
  // In the child of a fork made without the lock (another thread held it):
  // nobody holds it there.
  void reset_in_child() noexcept;
  // Holds of the calling thread (0 when another thread or none holds it).
  int depth() const noexcept;
  // In a forked child, before release_in_child: the holds the forking
  // thread had (the owner's id is still the parent thread's).
  int depth_in_child() const noexcept { return depth_; }

 private:
  int take(bool wait) noexcept;

  static constexpr int kMaxDepth = 8;
  int owner_ = 0;  // thread id, accessed atomically (a futex word)
  int depth_ = 0;  // the owner's holds
  Os::SignalMask masks_[kMaxDepth] = {};
};

}  // namespace mnemosyne
