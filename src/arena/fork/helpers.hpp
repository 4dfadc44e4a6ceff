// Threads that share a fork's copy of the heap with the forking thread.
//
// The copy a child needs is made before fork() returns (copy_pass.cpp), and
// its cost is a read (and, for the first fork of a series, a write) of the
// whole live heap: bound by memory bandwidth, which one core does not
// saturate. So a process whose heap is large gets a few threads of
// mnemosyne's own, started once from the allocation slow path (never from a
// fork, which may come from a signal handler) and asleep on a futex until a
// fork hands them part of the copy. They block every asynchronous signal.
// A forked child has none (fork() copies only the calling thread) and needs
// none: its own forks copy nothing.
#pragma once

#include <cstddef>

namespace mnemosyne::arena {

// The forking thread and at most this many less one helpers.
inline constexpr std::size_t kMaxForkWorkers = 8;

// Starts the helpers, once: one less than the CPUs the process may run on,
// at most kMaxForkWorkers - 1; none on one CPU. Not from a signal handler,
// and outside every lock of mnemosyne's and mimalloc's (pthread_create
// allocates).
void start_fork_helpers(std::size_t cpus) noexcept;
// Whether start_fork_helpers has been called (in this process).
bool fork_helpers_started() noexcept;

// The workers a copy may have now: the helpers ready, plus one, at most
// kMaxForkWorkers.
std::size_t fork_workers_ready() noexcept;

// Calls work(arg, w, n) for every w in [0, n) at once, w = 0 on the calling
// thread and the others on helpers, and returns n once every call has
// returned. n is `want`, or fewer when fewer are ready (fork_workers_ready
// never shrinks). Only futex calls: async-signal-safe. One caller at a time
// (a fork holds the table lock).
std::size_t run_on_fork_workers(void (*work)(void* arg, std::size_t w, std::size_t n), void* arg,
                                std::size_t want) noexcept;

// In a forked child: the helpers were not copied.
void forget_fork_helpers() noexcept;

}  // namespace mnemosyne::arena
