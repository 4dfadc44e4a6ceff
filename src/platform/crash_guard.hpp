// Calling into the driver where a crash there must not take the process
// with it: cuInit, the first call into a library mnemosyne did not write,
// runs while the interposer starts, before the program's main.
#pragma once

#include <cstddef>

namespace mnemosyne {

// Runs fn(arg) and returns true when it returned. When it crashed instead,
// returns false with what happened in `what` (e.g. "crashed inside the
// driver (signal 11, SEGV)"). Whatever fn left behind stays as it was (locks
// it held, threads it started): the caller must never call into it again.
// Faults of other threads meanwhile go to their handlers as usual. Not
// reentrant.
//
// Linux (crash_guard_linux.cpp): on the calling thread, under SIGSEGV,
// SIGBUS, SIGILL and SIGFPE handlers that jump back out of fn.
// Windows (crash_guard_windows.cpp): on a worker thread, under a vectored
// exception handler that ends that thread on an access violation (or other
// fatal exception) raised in it; fn that gives no answer within
// kGuardTimeoutMs counts as failed too, and is left running.
bool call_guarded(void (*fn)(void*), void* arg, char* what, std::size_t len) noexcept;

inline constexpr unsigned kGuardTimeoutMs = 60 * 1000;

}  // namespace mnemosyne
