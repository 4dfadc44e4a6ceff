// call_guarded on Linux: signal handlers that siglongjmp out of fn.
#include "platform/crash_guard.hpp"

#include <setjmp.h>
#include <signal.h>
#include <string.h>

#include <cstdio>

#include "platform/signal_chain.hpp"

namespace mnemosyne {
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE};
constexpr int kCount = sizeof kSignals / sizeof kSignals[0];

// The name of one of kSignals (glibc's sigabbrev_np is 2.32's).
const char* signal_name(int sig) noexcept {
  switch (sig) {
    case SIGSEGV:
      return "SEGV";
    case SIGBUS:
      return "BUS";
    case SIGILL:
      return "ILL";
    case SIGFPE:
      return "FPE";
    default:
      return "?";
  }
}

struct sigaction g_previous[kCount];
__attribute__((tls_model("initial-exec"))) constinit thread_local sigjmp_buf* t_guard = nullptr;

int slot_of(int sig) noexcept {
  for (int i = 0; i < kCount; ++i) {
    if (kSignals[i] == sig) return i;
  }
  return 0;
}

void on_fault(int sig, siginfo_t* info, void* context) {
  if (sigjmp_buf* guard = t_guard; guard != nullptr) {
    t_guard = nullptr;
    siglongjmp(*guard, sig);
  }
  pass_signal_on(g_previous[slot_of(sig)], sig, info, context);
}

}  // namespace

bool call_guarded(void (*fn)(void*), void* arg, char* what, std::size_t len) noexcept {
  struct sigaction guard {};
  guard.sa_sigaction = &on_fault;
  guard.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&guard.sa_mask);
  for (int i = 0; i < kCount; ++i) glibc_sigaction(kSignals[i], &guard, &g_previous[i]);
  sigjmp_buf jump;
  const int caught = sigsetjmp(jump, 1);
  if (caught == 0) {
    t_guard = &jump;
    fn(arg);
  }
  t_guard = nullptr;
  for (int i = 0; i < kCount; ++i) {
    struct sigaction now {};
    glibc_sigaction(kSignals[i], nullptr, &now);
    // Put back what was there, unless fn installed a handler of its own.
    if ((now.sa_flags & SA_SIGINFO) != 0 && now.sa_sigaction == &on_fault) {
      glibc_sigaction(kSignals[i], &g_previous[i], nullptr);
    }
  }
  if (caught != 0) {
    std::snprintf(what, len, "crashed inside the driver (signal %d, %s)", caught,
                  signal_name(caught));
  }
  return caught == 0;
}

}  // namespace mnemosyne
