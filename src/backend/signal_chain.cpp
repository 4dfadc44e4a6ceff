#include "backend/signal_chain.hpp"

#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace mnemosyne {
namespace {

// The kernel's struct sigaction (not glibc's, whose mask is 128 bytes).
struct KernelSigaction {
  void (*handler)(int);
  unsigned long flags;
  void (*restorer)();
  unsigned long mask;
};

// The default action, set with the system call itself: in a preloaded
// library, sigaction() may be a wrapper of ours that records the program's
// handlers instead of installing them.
void set_default_action(int sig) noexcept {
  KernelSigaction dfl{SIG_DFL, 0, nullptr, 0};
  syscall(SYS_rt_sigaction, sig, &dfl, nullptr, sizeof dfl.mask);
}

}  // namespace

void pass_signal_on(const struct sigaction& to, int sig, siginfo_t* info, void* context) noexcept {
  const bool from_fault = info != nullptr && info->si_code > 0;
  if (is_default_or_ignore(to)) {
    if (to.sa_handler == SIG_IGN && !from_fault) return;
    set_default_action(sig);
    if (!from_fault) raise(sig);
    return;
  }
  if ((to.sa_flags & SA_SIGINFO) != 0) {
    to.sa_sigaction(sig, info, context);
  } else {
    to.sa_handler(sig);
  }
}

}  // namespace mnemosyne
