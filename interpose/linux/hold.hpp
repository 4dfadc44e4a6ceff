// Holding other threads' allocations while a fork copies the heap.
//
// The copy is not a fork's instant snapshot: other threads run meanwhile. A
// block they allocated, filled and published during it could reach the
// child as a published pointer to memory copied before it was filled. So
// while the copy runs, their malloc/free calls wait: Mode::held diverts the
// fast paths into the slow ones, which call wait_while_held(). Whatever they
// allocate then is allocated after the copy.
//
// The hold ends with the copy, before glibc's fork() takes its own locks
// (the NSS database's, the stdio list's), which a waiting thread may hold.
// What other threads do between the copy and the fork's system call, and
// what was already under way in mimalloc when the hold began, the child's
// side makes consistent (src/arena/fork_copy.cpp).
#pragma once

#include "mode.hpp"

namespace mnemosyne {

// RAII, on the thread that copies, which holds the fork lock (its
// asynchronous signals are blocked: a handler that allocated would wait for
// itself) and must not allocate. Nothing it does may wait for another
// thread, so the hold cannot deadlock.
class HeldAllocations {
 public:
  HeldAllocations() noexcept;
  ~HeldAllocations();
  HeldAllocations(const HeldAllocations&) = delete;
  HeldAllocations& operator=(const HeldAllocations&) = delete;

 private:
  Mode before_;
};

}  // namespace mnemosyne
