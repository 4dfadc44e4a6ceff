// Holding other threads' allocations while a fork copies the heap.
//
// The copy is not a fork's instant snapshot: other threads run meanwhile. A
// block they allocated, filled and published during it could reach the
// child as a published pointer to memory copied before it was filled. So
// while the copy runs, their malloc/free calls wait: Mode::held diverts the
// fast paths into the slow ones, which call wait_while_held(). Whatever they
// allocate then is allocated after the copy, in the parent only.
#pragma once

#include <signal.h>

namespace mnemosyne {

// RAII, on the thread that copies: from construction to destruction other
// threads' allocation calls wait. The holder's own asynchronous signals are
// blocked meanwhile (a handler that allocated would wait for itself), and it
// must not allocate; nothing it does may wait for another thread, so the
// hold cannot deadlock. End it before anything that takes locks a waiting
// thread may hold (glibc's fork does).
class HeldAllocations {
 public:
  HeldAllocations() noexcept;
  ~HeldAllocations();
  HeldAllocations(const HeldAllocations&) = delete;
  HeldAllocations& operator=(const HeldAllocations&) = delete;

 private:
  sigset_t mask_;
};

}  // namespace mnemosyne
