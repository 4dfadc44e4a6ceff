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
  // divert(), for a fork whose child pulls its heap from this process after
  // the clone (src/arena/fork/pull.cpp): the child must find the heap as it
  // was at the clone, so other threads' frees of arena blocks do not reach
  // mimalloc until end(): they are kept in a list (free_arena_block), which
  // end() frees, and which the child frees too (those made before the clone
  // are the child's as well). Allocations come from the system allocator,
  // which the child inherits at the clone, as with divert().
  void divert_deferring_frees() noexcept;
  // After the clone, while that child pulls: allocations wait again (glibc's
  // fork() has released its own locks), frees still go to the list.
  void hold_again() noexcept;
  // The mode from before hold(), and the deferred frees made (in_child: in a
  // forked child, whose list holds those made before the clone).
  void end(bool in_child = false) noexcept;

 private:
  Mode before_ = Mode::host;
};

// Frees an arena block (tag: its ownership-map entry), or keeps it for
// end() while a fork defers frees (divert_deferring_frees).
void free_arena_block(void* ptr, std::uint8_t tag) noexcept;

}  // namespace mnemosyne
