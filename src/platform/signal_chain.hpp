// Passing a signal on to the handler a program installed, as the kernel would
// have delivered it, from a handler of ours that stands in front of it for a
// while (the loader's guard around cuInit, the interposer's fork window).
#pragma once

#include <signal.h>

namespace mnemosyne {

// Calls the program's handler `to` for `sig`; for SIG_DFL (and SIG_IGN of a
// fault, which the kernel does not allow to be ignored) restores the default
// action so that the faulting access, run again, gets it, and raises a signal
// someone sent (kill) again. Async-signal-safe.
void pass_signal_on(const struct sigaction& to, int sig, siginfo_t* info, void* context) noexcept;

// glibc's own sigaction(), taken from libc itself: a preloaded library's
// sigaction() (the interposer exports one) may record handlers instead of
// installing them. Resolved on the first call, which must not be in a signal
// handler: install handlers through it, and it is resolved before any runs.
int glibc_sigaction(int sig, const struct sigaction* act, struct sigaction* old) noexcept;

// True for SIG_DFL and SIG_IGN.
inline bool is_default_or_ignore(const struct sigaction& a) noexcept {
  return (a.sa_flags & SA_SIGINFO) == 0 && (a.sa_handler == SIG_DFL || a.sa_handler == SIG_IGN);
}

}  // namespace mnemosyne
