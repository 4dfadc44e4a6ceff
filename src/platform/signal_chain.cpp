#include "platform/signal_chain.hpp"

#include <dlfcn.h>
#include <errno.h>
#include <signal.h>

#include <atomic>

namespace mnemosyne {
namespace {

using SigactionFn = int (*)(int, const struct sigaction*, struct sigaction*);
constinit std::atomic<SigactionFn> g_glibc_sigaction{nullptr};

}  // namespace

int glibc_sigaction(int sig, const struct sigaction* act, struct sigaction* old) noexcept {
  SigactionFn fn = g_glibc_sigaction.load(std::memory_order_acquire);
  if (fn == nullptr) {
    void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    fn = reinterpret_cast<SigactionFn>(libc != nullptr ? dlsym(libc, "sigaction") : nullptr);
    if (fn == nullptr) {
      errno = ENOSYS;
      return -1;
    }
    g_glibc_sigaction.store(fn, std::memory_order_release);
  }
  return fn(sig, act, old);
}

void pass_signal_on(const struct sigaction& to, int sig, siginfo_t* info, void* context) noexcept {
  const bool from_fault = info != nullptr && info->si_code > 0;
  if (is_default_or_ignore(to)) {
    if (to.sa_handler == SIG_IGN && !from_fault) return;
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    glibc_sigaction(sig, &dfl, nullptr);
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
