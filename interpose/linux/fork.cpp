// fork() under the preload library.
//
// A forked child gets a copy of the parent's heap (src/arena/fork/),
// which it must put in place before anything touches the heap. glibc's fork()
// touches it in the child of a multi-threaded parent before any atfork child
// handler runs, so from the last prepare handler until the fork is over a
// SIGSEGV/SIGBUS handler of ours is installed: in the child, the first touch
// of a missing segment makes it restore the copy and retry the access. Every
// other fault, in the parent or the child, goes to the application's own
// handler as the kernel would have delivered it. While ours is installed,
// sigaction() and signal() for those two signals record the application's
// new handler (and report it back) instead of replacing ours, so a handler
// installed by another thread during the fork is neither lost nor skipped.
//
// The exported fork() first copies, through the driver, what the CPU has not
// mapped (data that may live on the GPU): before any atfork handler runs,
// because a driver's own prepare handler may hold the locks such a call
// needs. A fork that does not go through it (daemon(), forkpty()) still gets
// a complete copy, read with the CPU. glibc's _Fork() (no atfork handlers)
// is wrapped too: the wrapper runs mnemosyne's handlers around it. Forks are
// serialized and made with the forking thread's asynchronous signals
// blocked (fork_lock.hpp).
//
// Where the copy sits in glibc's fork() (posix/fork.c since 2.34, Debian
// 12's 2.36 among them; sysdeps/nptl/fork.c before, in the same order):
//   1. the atfork prepare handlers, the last registered first: ours, being
//      registered first, runs last;
//   2. in a multi-threaded process, a copy of the NSS configuration made
//      under its lock (__nss_database_fork_prepare_parent), then the stdio
//      list's lock (_IO_list_lock), then glibc malloc's own locks;
//   3. the clone (_Fork); in the child, the stdio locks reset
//      (fresetlockfiles walks every FILE, _IO_list_resetlock), the NSS
//      configuration written back, the loader's lock reset, then the child
//      handlers; in the parent, malloc's locks and the list lock released,
//      then the parent handlers, the first registered first: ours, first.
// The heap's copy is made in our prepare handler, so after the program's
// own handlers (whatever they lock is the same in the copy and in the
// child), and with the stdio list's lock taken first: the lock is glibc's
// exported recursive one, which its fork() takes again at 2 (a count on the
// same owner) and releases in the parent just before our parent handler
// releases ours; the child's reset at 3 ends both holds. The FILEs live in
// the heap, so the child gets them from the copy, and the list's head
// (_IO_list_all) and its lock from libc's data at the clone: with the lock
// held from before the copy until the clone, no thread links or unlinks a
// FILE in between, and the two halves of the list are of one moment. Before
// (issue 45) the copy came before glibc took the list lock: another
// thread's fopen or fclose between the two gave children a torn list, on
// which fresetlockfiles spun forever; and a thread holding a FILE's lock
// while its malloc waited for the segment table (taken for the copy, held
// until the clone) deadlocked the fork against a third thread in
// fflush(NULL), which held the list lock and waited for that FILE. A holder
// of the list lock may still wait for a FILE whose holder is in malloc, so
// until our handler has the list lock, malloc must wait for nothing the
// forking thread holds: not for the copy (it starts after), and not for the
// driver, whose own prepare handler (registered after ours, so run before)
// may hold the driver's locks until the fork is over. Hence the wrapper
// closes the arena's driver gate before glibc's fork() runs any handler
// (arena.hpp, close_fork_gate): other threads' growth of the heap then
// comes from the host heap, and the fork first waits for the growths
// already in the driver, which need nothing it holds yet.
//
// Other libc data that lives partly in the heap, as a child sees it: the
// NSS configuration is copied by glibc under its own lock at 2, after the
// heap's copy, and written back into the heap in the child, so the child
// has the newer of the two; NSS modules and interned action lists, the
// locale archive and loaded locales are added to lists once and never
// freed while the process runs, and a node allocated between the copy and
// the clone comes from the system allocator (Mode::diverted, hold.hpp),
// which the child inherits at the clone, consistent with the list head. The
// loader's link_maps live in the heap too, and glibc's fork takes no loader
// lock (it only resets it in the child, so a glibc child of a fork during
// dlopen sees the loader's data mid-update as well): a dlopen or dlclose
// that links or unlinks a map between the end of the copy and the clone
// (microseconds, against the copy's milliseconds) can leave the child's
// list with the map's neighbour as it was before. Not seen in the stress
// runs (tests/e2e/fork_stdio_probe.cpp, a thread in dlopen/dlclose beside
// the forks); written in docs/fork.md. glibc's _Fork() takes no stdio lock,
// and neither does its wrapper here: it is the async-signal-safe fork,
// whose child may not use stdio.
#include "fork.hpp"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>

#include "arena/arena.hpp"
#include "backend/driver_call.hpp"
#include "bootstrap.hpp"
#include "driver_threads.hpp"
#include "fork_lock.hpp"
#include "hold.hpp"
#include "mode.hpp"
#include "platform/page_pull.hpp"
#include "platform/signal_chain.hpp"

// glibc's stdio list lock: exported (GLIBC_2.2.5) though no header declares
// it any more; see the top of this file.
extern "C" {
void _IO_list_lock() noexcept;
void _IO_list_unlock() noexcept;
void _IO_list_resetlock() noexcept;
}

namespace mnemosyne {
namespace {

using ForkFn = pid_t (*)();
using SigactionFn = int (*)(int, const struct sigaction*, struct sigaction*);
using SignalFn = sighandler_t (*)(int, sighandler_t);

// The next definitions (glibc's), resolved on first use. dlsym may malloc,
// which is served like any other request.
template <class Fn>
Fn next(std::atomic<Fn>& slot, const char* name) noexcept {
  Fn fn = slot.load(std::memory_order_acquire);
  if (fn == nullptr) {
    fn = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
    slot.store(fn, std::memory_order_release);
  }
  return fn;
}
constinit std::atomic<ForkFn> g_fork{nullptr};
constinit std::atomic<ForkFn> g_underscore_fork{nullptr};  // glibc 2.34's _Fork
constinit std::atomic<SigactionFn> g_sigaction{nullptr};   // the wrapper passes through to it
constinit std::atomic<SignalFn> g_signal{nullptr};

// ---- the fault handler and the application's handlers it stands in for

constexpr int kSignals[2] = {SIGSEGV, SIGBUS};
constexpr int slot_of(int sig) noexcept {
  return sig == SIGSEGV ? 0 : 1;
}

// What the application installed for SIGSEGV / SIGBUS, written under g_lock.
// The fault handler reads it without the lock (a signal handler cannot wait),
// so every change goes to the spare copy first, then the index flips.
struct AppActions {
  struct sigaction copy[2][2];
  std::atomic<int> current[2] = {0, 0};
};
constinit AppActions g_app{};
constinit std::atomic<bool> g_window{false};  // our handler is installed
constinit std::atomic<bool> g_lock{false};    // taken with every signal blocked

class WindowLock {
 public:
  WindowLock() noexcept {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old_);
    while (g_lock.exchange(true, std::memory_order_acquire)) {
    }
  }
  ~WindowLock() {
    g_lock.store(false, std::memory_order_release);
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  WindowLock(const WindowLock&) = delete;
  WindowLock& operator=(const WindowLock&) = delete;

 private:
  sigset_t old_;
};

struct sigaction app_action(int slot) noexcept {
  return g_app.copy[slot][g_app.current[slot].load(std::memory_order_acquire)];
}

// Under g_lock.
void set_app_action(int slot, const struct sigaction& act) noexcept {
  const int spare = 1 - g_app.current[slot].load(std::memory_order_relaxed);
  g_app.copy[slot][spare] = act;
  g_app.current[slot].store(spare, std::memory_order_release);
}

void on_fault(int sig, siginfo_t* info, void* context);

// Ours, with the mask and flags the application asked for, so that the
// kernel runs its handler (called from ours) as it would have run it; always
// on the alternate stack, which for the forking thread is ours (see
// ForkingThreadStack).
void install_ours(int sig, const struct sigaction& app) noexcept {
  struct sigaction ours {};
  ours.sa_sigaction = &on_fault;
  ours.sa_mask = app.sa_mask;
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK | (app.sa_flags & (SA_NODEFER | SA_RESTART));
  glibc_sigaction(sig, &ours, nullptr);
}

bool is_ours(const struct sigaction& a) noexcept {
  return (a.sa_flags & SA_SIGINFO) != 0 && a.sa_sigaction == &on_fault;
}

// Delivers the signal to what the application installed, as the kernel
// would have (SA_RESETHAND included).
void deliver_to_app(int sig, siginfo_t* info, void* context) noexcept {
  const int slot = slot_of(sig);
  const struct sigaction app = app_action(slot);
  if (!is_default_or_ignore(app) && (app.sa_flags & SA_RESETHAND) != 0) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    WindowLock lock;
    set_app_action(slot, dfl);
  }
  pass_signal_on(app, sig, info, context);
}

void on_fault(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const bool restored = info != nullptr && info->si_code > 0 && (sig == SIGSEGV || sig == SIGBUS) &&
                        arena::restore_child_heap(info->si_addr);
  if (!restored && info != nullptr && info->si_code > 0 && arena::lost_in_child(info->si_addr)) {
    warn_line(
        "mnemosyne: this forked child touched its parent's heap, whose copy could not be made; "
        "it stops here (SIGSEGV) rather than read wrong data");
  }
  errno = saved_errno;
  if (!restored) deliver_to_app(sig, info, context);
}

void open_window() noexcept {
  WindowLock lock;
  for (int sig : kSignals) {
    struct sigaction app {};
    if (glibc_sigaction(sig, nullptr, &app) != 0 || is_ours(app)) continue;
    set_app_action(slot_of(sig), app);
    install_ours(sig, app);
  }
  g_window.store(true, std::memory_order_release);
}

// Puts the application's handlers back, unless something replaced ours
// behind sigaction() (a raw system call): that one stays.
void close_window() noexcept {
  WindowLock lock;
  g_window.store(false, std::memory_order_release);
  for (int sig : kSignals) {
    struct sigaction now {};
    if (glibc_sigaction(sig, nullptr, &now) != 0 || !is_ours(now)) continue;
    const struct sigaction app = app_action(slot_of(sig));
    glibc_sigaction(sig, &app, nullptr);
  }
}

// The forking thread's signal stack, for the window. In the child, the
// thread's own stacks may lie in the heap that is still missing at the first
// fault: an alternate stack the program malloc'd (gdb does), or the thread's
// stack itself (a coroutine's). The kernel could not even deliver the fault
// there, so the window gives the thread this static one, which the child
// inherits, and puts the program's back afterwards. Not while the thread runs
// on its own alternate stack (a fork from a signal handler): that one stays.
class ForkingThreadStack {
 public:
  void enter() noexcept {
    swapped_ = false;
    if (sigaltstack(nullptr, &saved_) != 0 || (saved_.ss_flags & SS_ONSTACK) != 0) return;
    stack_t ours{};
    ours.ss_sp = stack_;
    ours.ss_size = sizeof stack_;
    swapped_ = sigaltstack(&ours, nullptr) == 0;
  }
  void leave() noexcept {
    if (swapped_) sigaltstack(&saved_, nullptr);
    swapped_ = false;
  }

 private:
  alignas(64) unsigned char stack_[128 * 1024] = {};
  stack_t saved_{};
  bool swapped_ = false;
};
constinit ForkingThreadStack g_fork_stack;

// ---- the atfork handlers and the fork() wrapper

constinit ForkLock g_fork_lock;

// What the handlers of one fork do, by the fork lock's depth of their hold:
// a fork nested in another on the same thread (a fault's handler that forks)
// has a depth of its own.
enum class Role : unsigned char {
  none,    // nothing to copy (the system allocator serves the process)
  copier,  // made the heap copy: opened the window, holds the segment table
  reuse,   // nested in a fork whose copy is made: its child takes that copy
};
constexpr int kMaxRoles = 8;
constinit Role g_roles[kMaxRoles] = {};
constinit int g_copier_depth = 0;  // the depth of the fork whose copy is made; 0: none
constinit AllocationWindow g_window_for_others;  // the copier's (hold.hpp)
constinit bool g_stdio_list_held = false;        // the copier holds glibc's stdio list lock

Role& role_at(int depth) noexcept {
  return g_roles[(depth < kMaxRoles ? depth : kMaxRoles) - 1];
}

// Whether the forking thread is the program's only one (the driver's
// threads aside): only then may its child pull its heap after the clone
// (src/arena/fork/pull.cpp). Another thread of the program runs on between
// the clone and the parent's handler, and a block it takes from the system
// allocator then, published into the heap, would reach the child as a
// pointer to memory the child does not have. The driver's threads write
// only their own blocks, which a child never reads; mnemosyne's own (fork
// helpers, the retire and give-back threads) none of the program's, and the
// heap's free blocks only when no fork reads it.
bool alone_but_for_the_driver() noexcept {
  const long threads = platform::page_pull::threads_in_process();
  const long ours = static_cast<long>(platform::page_pull::own_threads()) + live_driver_threads();
  return threads > 0 && threads - 1 - ours <= 0;
}

// `stdio`: whether the fork is glibc's fork(), which takes the stdio list's
// lock after this handler; not its _Fork() (see the top of this file).
void prepare_fork(bool stdio) noexcept {
  const int depth = g_fork_lock.acquire();
  Role& role = role_at(depth);
  if (!arena_mode()) {
    role = Role::none;
  } else if (g_copier_depth != 0) {
    role = Role::reuse;
  } else {
    role = Role::copier;
    if (stdio) _IO_list_lock();  // before the copy, held until the clone
    g_stdio_list_held = stdio;
    g_window_for_others.hold();
    arena::prepare_fork(/*may_pull=*/arena::fork_pull_enabled() && alone_but_for_the_driver());
    // A child that pulls reads the heap after the clone: other threads'
    // frees wait in a list until the fork is over.
    if (arena::fork_child_pulls()) {
      g_window_for_others.divert_deferring_frees();
    } else {
      g_window_for_others.divert();
    }
    g_copier_depth = depth;
    g_fork_stack.enter();
    open_window();
  }
}

void on_prepare_fork() noexcept {
  prepare_fork(/*stdio=*/true);
}

void on_parent_after_fork() noexcept {
  const int depth = g_fork_lock.depth();
  if (role_at(depth) == Role::copier) {
    // A child that pulls its heap is served now, before the list lock and
    // the other threads are let go (src/arena/fork/pull.cpp).
    if (arena::fork_child_pulls()) {
      // Other threads' allocations wait too while it pulls: a block they
      // would take from the system allocator now is not in the child, and a
      // pointer to it written into the heap would reach the child.
      g_window_for_others.hold_again();
      arena::serve_forked_child();
    }
    // glibc has released its own hold of the list lock already.
    if (g_stdio_list_held) _IO_list_unlock();
    g_stdio_list_held = false;
    close_window();
    g_fork_stack.leave();
    arena::parent_after_fork();
    g_window_for_others.end();
    g_copier_depth = 0;
  }
  g_fork_lock.release();
}

void on_child_after_fork() noexcept {
  // The fork lock's owner id is the parent's thread: depth() cannot tell.
  g_lock.store(false, std::memory_order_relaxed);  // its holder may not exist here
  const Role role = role_at(g_fork_lock.depth_in_child());
  if (role != Role::none) {
    const bool ok = arena::child_after_fork();
    if (role == Role::copier) {
      // glibc's fork() resets the list lock only when the parent had
      // threads; the parent's holds are none of this child's either way.
      if (g_stdio_list_held) _IO_list_resetlock();
      g_stdio_list_held = false;
      close_window();
      g_fork_stack.leave();
      g_window_for_others.end(/*in_child=*/true);
      g_copier_depth = 0;
    }
    if (!ok) {
      g_mode.store(Mode::host, std::memory_order_release);
      warn_line(
          "mnemosyne: this forked child's copy of its parent's heap could not be made; "
          "the parent's blocks cannot be read here (a touch ends the child with SIGSEGV), "
          "and new ones come from the system allocator");
    }
  }
  g_fork_lock.release_in_child();
}

// The child of a _Fork made while another thread's fork held the lock: the
// fork lock and the window are that fork's, and nobody here holds them. The
// child does not take that fork's copy (it may have been copied half-way
// through that fork's writes, see child_after_fork): a child of a CUDA
// backend lacks its parent's blocks.
void on_child_of_overlapping_fork() noexcept {
  g_lock.store(false, std::memory_order_relaxed);
  g_fork_lock.reset_in_child();
  const bool ok = arena::child_after_fork(/*own_fork=*/false);
  close_window();  // if the other fork had opened it
  const Mode mode = current_mode();
  if (mode == Mode::held || mode == Mode::diverted) g_window_for_others.end(/*in_child=*/true);
  g_copier_depth = 0;
  // Without its parent's blocks: the system allocator serves, and frees of
  // those blocks are ignored. Said nowhere: such a child of a handler
  // usually just execs or exits, and may not even have a stderr of its own.
  if (!ok) g_mode.store(Mode::host, std::memory_order_release);
}

}  // namespace

void install_fork_handling() noexcept {
  // Resolved now, not on first use inside a fork's prepare handler.
  next(g_fork, "fork");
  next(g_underscore_fork, "_Fork");
  next(g_sigaction, "sigaction");
  next(g_signal, "signal");
  struct sigaction current {};
  glibc_sigaction(SIGSEGV, nullptr, &current);
  pthread_atfork(&on_prepare_fork, &on_parent_after_fork, &on_child_after_fork);
}

namespace {

// The fork lock is taken here already, so that the early copy through the
// driver (before any atfork handler runs: a driver's own prepare handler may
// hold the locks such a call needs) belongs to the same fork as the copy
// the prepare handler makes. glibc's _Fork() runs no atfork handler: for it
// the wrapper runs ours itself. A successful fork leaves errno as it was, in
// the parent and in the child.
template <bool kRunHandlers>
pid_t wrapped_fork(ForkFn real) noexcept {
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  if (!arena_mode()) return real();
  const int saved_errno = errno;
  // glibc's _Fork is async-signal-safe: from a handler it must not wait for
  // another thread's fork, which may need a lock the interrupted code holds
  // (glibc's malloc lock, say). That other fork's copy serves its child.
  const int depth = kRunHandlers ? g_fork_lock.try_acquire() : g_fork_lock.acquire();
  if (depth == 0) {
    const pid_t pid = real();
    if (pid == 0) {
      on_child_of_overlapping_fork();
      errno = saved_errno;
    } else if (pid > 0) {
      errno = saved_errno;
    }
    return pid;
  }
  // Not from a driver thread or inside a driver call (the driver must not be
  // called there), nor nested in a fork of this thread (its copy is in use):
  // then the prepare handler reads everything with the CPU.
  const bool early = depth == 1 && !in_driver_call();
  // From here until the fork is over, other threads' allocations do not ask
  // the driver (arena.hpp): the driver's prepare handler may hold its locks
  // while glibc waits for the stdio list's lock (see the top of this file).
  // Not for _Fork(), which runs no atfork handler, nor on a thread the
  // driver owns or inside a driver call, where the wait could be for itself.
  const bool gate = early && !kRunHandlers;
  if (gate) arena::close_fork_gate();
  // A child that will pull its heap reads only what it touches: copying
  // what a device holds through the driver first would cost a heap's worth
  // for a child that execs (the pages it does pull are read by the CPU).
  // Should the fork copy after all, its pass reads those with the CPU too.
  const bool copy_first = early && !(arena::fork_may_pull() && alone_but_for_the_driver());
  if (copy_first && !arena::copy_early()) {
    if (gate) arena::open_fork_gate();
    g_fork_lock.release();
    errno = ENOMEM;  // no memory for the child's copy of the heap
    return -1;
  }
  if (kRunHandlers) prepare_fork(/*stdio=*/false);
  const pid_t pid = real();
  const int fork_errno = errno;
  if (pid == 0) {
    if (kRunHandlers) on_child_after_fork();
    g_fork_lock.release_in_child();
    errno = saved_errno;
    return 0;
  }
  if (kRunHandlers) on_parent_after_fork();
  if (gate) arena::open_fork_gate();
  if (copy_first) arena::end_early();
  g_fork_lock.release();
  errno = pid > 0 ? saved_errno : fork_errno;
  return pid;
}

}  // namespace
}  // namespace mnemosyne

using namespace mnemosyne;

extern "C" {

__attribute__((visibility("default"))) pid_t fork() {
  return wrapped_fork<false>(next(g_fork, "fork"));
}

__attribute__((visibility("default"))) pid_t _Fork() {
  return wrapped_fork<true>(next(g_underscore_fork, "_Fork"));
}

__attribute__((visibility("default"))) int sigaction(int sig, const struct sigaction* act,
                                                     struct sigaction* old) {
  if ((sig == SIGSEGV || sig == SIGBUS) && g_window.load(std::memory_order_acquire)) {
    WindowLock lock;
    if (g_window.load(std::memory_order_relaxed)) {
      const int slot = slot_of(sig);
      if (old != nullptr) *old = app_action(slot);
      if (act != nullptr) {
        set_app_action(slot, *act);
        install_ours(sig, *act);
      }
      return 0;
    }
  }
  // Outside the window: to whatever comes next (glibc, or another library
  // that wraps sigaction, such as a JVM's libjsig).
  const SigactionFn real = next(g_sigaction, "sigaction");
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  return real(sig, act, old);
}

// glibc's signal(): BSD semantics, the signal blocked in its own handler,
// system calls restarted.
__attribute__((visibility("default"))) sighandler_t signal(int sig, sighandler_t handler) {
  if ((sig == SIGSEGV || sig == SIGBUS) && g_window.load(std::memory_order_acquire)) {
    struct sigaction act {};
    struct sigaction old {};
    act.sa_handler = handler;
    sigemptyset(&act.sa_mask);
    sigaddset(&act.sa_mask, sig);
    act.sa_flags = SA_RESTART;
    if (handler == SIG_ERR || sigaction(sig, &act, &old) != 0) {
      errno = EINVAL;
      return SIG_ERR;
    }
    return old.sa_handler;
  }
  const SignalFn real = next(g_signal, "signal");
  if (real == nullptr) {
    errno = ENOSYS;
    return SIG_ERR;
  }
  return real(sig, handler);
}

}  // extern "C"
