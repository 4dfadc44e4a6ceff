// Other threads' allocation calls while a fork is under way.
//
// The heap copy is not the fork's instant snapshot: other threads run
// meanwhile. Two phases keep what a child can reach consistent:
//  - held, while the copy runs: their malloc/free calls wait (Mode::held
//    diverts the fast paths into the slow ones, which call
//    wait_while_held()). A block allocated, filled and published during the
//    copy could otherwise reach the child as a pointer to memory copied
//    before it was filled. Waiting is safe here: the copy needs no lock a
//    waiting thread may hold.
//  - diverted, from the end of the copy until the fork is over: glibc's
//    fork() now takes its own locks (the NSS configuration's, its malloc's;
//    the stdio list's is held from before the copy, fork.cpp), which a
//    waiting thread may hold, so nothing waits any more. Their
//    allocations come from the system allocator instead (Mode::diverted),
//    whose memory the child inherits as of the fork itself: a FILE another
//    thread opens then, which glibc's fork walks in the child, or a block
//    it publishes, reaches the child intact. Frees go on: what mimalloc
//    changes for them, the child's side makes consistent (src/arena/fork/).
#pragma once

#include "mode.hpp"

namespace mnemosyne {

// Used by the thread that forks, which holds the fork lock (its asynchronous
// signals are blocked: a handler that allocated would wait for itself) and
// does not allocate between hold() and end().
class AllocationWindow {
 public:
  void hold() noexcept;
  void divert() noexcept;  // wakes the waiting threads
  void end() noexcept;     // the mode from before hold()

 private:
  Mode before_ = Mode::host;
};

}  // namespace mnemosyne
