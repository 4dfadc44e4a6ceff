// fork() racing the rest of a program, as the end-to-end tests run it with
// and without the interposer: the same output is expected from both. Each
// mode prints one summary line; a child that finds anything wrong exits
// non-zero (or dies), which the parent counts.
//
//   fork_race_probe cross-free      4 threads free the 48-byte blocks the main thread
//                                   hands them while it forks every 20,000 blocks; each
//                                   child allocates 100,000 blocks of its own
//   fork_race_probe signal-fork     glibc's tst-mallocfork2 shape: single-threaded, other
//                                   processes send SIGUSR1 while it mallocs, frees and
//                                   forks; the handler forks too; children check the heap
//   fork_race_probe signal-threads  tst-mallocfork3's shape: the senders are threads and
//                                   the handler calls _Fork() (fork() in a handler of a
//                                   multi-threaded process can deadlock in glibc itself),
//                                   whose child _exits at once, as glibc's test's does; a
//                                   second thread forks at the same time as the main one,
//                                   and those children check the heap
#include <dlfcn.h>
#include <gnu/libc-version.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "pattern_block.hpp"

namespace {

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "fork_race_probe: %s\n", what);
  std::fflush(stderr);
  _exit(3);
}

// Waits for `pid` (retrying when a signal interrupts); true when it exited 0.
// Otherwise (or when the fork failed: pid < 0) one line on stderr says how it
// ended; a witness child's exit code names the block it found wrong (see
// witness_child). A signal handler waits here too: snprintf of numbers and
// strings (glibc's takes no lock and allocates nothing) and write.
bool child_ok(pid_t pid, const char* who) {
  int status = 0;
  pid_t r = -1;
  if (pid < 0) {
    char line[96];
    const int n = std::snprintf(line, sizeof line, "%s: fork failed (errno %d)\n", who, errno);
    if (n > 0) (void)!write(2, line, static_cast<std::size_t>(n));
    return false;
  }
  while ((r = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
  }
  if (r == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  char line[160];
  const int n =
      r != pid ? std::snprintf(line, sizeof line, "%s: waitpid failed\n", who)
      : WIFSIGNALED(status)
          ? std::snprintf(line, sizeof line, "%s: child died of signal %d\n", who, WTERMSIG(status))
          : std::snprintf(line, sizeof line, "%s: child exited with %d\n", who,
                          WEXITSTATUS(status));
  if (n > 0) (void)!write(2, line, static_cast<std::size_t>(n));
  return false;
}

// ---- cross-thread frees beside forks

constexpr int kFreers = 4;
constexpr unsigned kQueue = 1024;
struct Queue {
  std::atomic<void*> slot[kQueue];
  std::atomic<unsigned> head{0};
  std::atomic<unsigned> tail{0};
};
Queue g_queues[kFreers];
std::atomic<bool> g_stop{false};

void freer(Queue* q) {
  while (!g_stop.load(std::memory_order_relaxed)) {
    const unsigned t = q->tail.load(std::memory_order_relaxed);
    if (t == q->head.load(std::memory_order_acquire)) continue;  // spins: frees come at once
    std::free(q->slot[t % kQueue].exchange(nullptr, std::memory_order_acq_rel));
    q->tail.store(t + 1, std::memory_order_release);
  }
}

int mode_cross_free() {
  std::vector<std::thread> threads;
  for (auto& q : g_queues) threads.emplace_back(freer, &q);
  constexpr int kChildren = 30;
  int ok = 0;
  int children = 0;
  for (long n = 1; children < kChildren; ++n) {
    Queue& q = g_queues[n % kFreers];
    const unsigned h = q.head.load(std::memory_order_relaxed);
    while (h - q.tail.load(std::memory_order_acquire) >= kQueue) std::this_thread::yield();
    auto* p = static_cast<long*>(std::malloc(48));
    if (p == nullptr) die("malloc failed");
    *p = n;
    q.slot[h % kQueue].store(p, std::memory_order_relaxed);
    q.head.store(h + 1, std::memory_order_release);
    if (n % 20000 != 0) continue;
    const pid_t pid = fork();
    if (pid < 0) die("fork failed");
    if (pid == 0) {
      std::vector<long*> kept;
      kept.reserve(40000);
      for (long i = 0; i < 100000; ++i) {
        auto* c = static_cast<long*>(std::malloc(48));
        if (c == nullptr) _exit(2);
        *c = i;
        if (i % 5 == 0) {
          kept.push_back(c);
        } else {
          std::free(c);
        }
      }
      for (std::size_t i = 0; i < kept.size(); ++i) {
        if (*kept[i] != static_cast<long>(i) * 5) _exit(4);
      }
      _exit(0);
    }
    ++children;
    if (child_ok(pid, "cross-free")) ++ok;
  }
  g_stop.store(true);
  for (auto& t : threads) t.join();
  std::printf("cross-free: %d of %d children ok\n", ok, kChildren);
  return ok == kChildren ? 0 : 1;
}

// ---- forks from a signal handler (glibc's tst-mallocfork2 and 3 shapes)

// Blocks made at the start: every child, the handler's included, checks them.
constexpr int kWitnesses = 64;
void* g_witness[kWitnesses];

void make_witnesses() {
  for (int i = 0; i < kWitnesses; ++i) {
    g_witness[i] = test::make_block(16 + static_cast<std::size_t>(i) * 997, 7000 + i);
    if (g_witness[i] == nullptr) die("malloc failed");
  }
}

// In a child: only reads memory and calls _exit, which a child of a fork
// made in a signal handler may do. Exits 10 + i when witness i reads wrong,
// 80 + i when its header is gone.
[[noreturn]] void witness_child() {
  for (int i = 0; i < kWitnesses; ++i) {
    bool checked = false;
    const bool ok = test::block_ok(g_witness[i], &checked);
    if (!checked) _exit(80 + i);
    if (!ok) _exit(10 + i);
  }
  _exit(0);
}

constexpr int kSenders = 2;
constexpr int kIterations = 400;

std::atomic<int> g_handler_failures{0};
std::atomic<int> g_handler_forks{0};
pid_t (*g_handler_fork)() = &fork;

}  // namespace
#if !__GLIBC_PREREQ(2, 34)
// Declared here where glibc's headers are older than _Fork; resolved, when
// the mode runs, only where the glibc it runs on has it.
extern "C" pid_t _Fork() __attribute__((weak));
#endif
namespace {

// A _Fork() child may only call async-signal-safe functions: it exits at
// once (a _Fork made while another thread's fork has not copied the heap
// yet gives a child without its parent's heap, see docs/fork.md).
bool g_handler_child_checks = true;

void fork_in_handler(int) {
  const int saved = errno;
  const pid_t pid = g_handler_fork();
  if (pid == 0) {
    if (g_handler_child_checks) witness_child();
    _exit(0);
  }
  if (!child_ok(pid, "handler")) g_handler_failures.fetch_add(1);
  g_handler_forks.fetch_add(1);
  errno = saved;
}

// The main loop of both shapes: `iterations` rounds of an occasional fork,
// a free and a malloc, each round between two waits on `barrier`, so that
// the senders' signals land during those calls. Returns the children that
// failed.
int churn_and_fork(pthread_barrier_t* barrier, int iterations) {
  constexpr int kObjects = 1009;
  std::vector<void*> objects(kObjects, nullptr);
  unsigned seed = 1;
  int fork_failures = 0;
  for (int i = 0; i < iterations; ++i) {
    const int slot = rand_r(&seed) % kObjects;
    const std::size_t size = static_cast<std::size_t>(rand_r(&seed)) % 7000;
    const bool do_fork = rand_r(&seed) % 7 == 0;
    pthread_barrier_wait(barrier);
    if (do_fork) {
      const pid_t pid = fork();
      if (pid == 0) witness_child();
      if (!child_ok(pid, "main")) ++fork_failures;
    }
    std::free(objects[slot]);
    objects[slot] = std::malloc(size);
    pthread_barrier_wait(barrier);
    if (objects[slot] == nullptr) die("malloc failed");
  }
  for (void* p : objects) std::free(p);
  return fork_failures;
}

int report(const char* name, int failures) {
  failures += g_handler_failures.load();
  const bool forked = g_handler_forks.load() > 0;
  std::printf("%s: %d iterations, children failed: %d, handler forked: %s\n", name, kIterations,
              failures, forked ? "yes" : "no");
  return failures == 0 && forked ? 0 : 1;
}

void install_handler() {
  struct sigaction action {};
  action.sa_handler = &fork_in_handler;
  sigemptyset(&action.sa_mask);
  if (sigaction(SIGUSR1, &action, nullptr) != 0) die("sigaction failed");
}

int mode_signal_fork() {
  make_witnesses();
  install_handler();
  // Sender processes, so that the probe itself stays single-threaded (but
  // for the driver's threads, under the interposer).
  auto* barrier = static_cast<pthread_barrier_t*>(mmap(nullptr, sizeof(pthread_barrier_t),
                                                       PROT_READ | PROT_WRITE,
                                                       MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (barrier == MAP_FAILED) die("mmap failed");
  pthread_barrierattr_t attr;
  pthread_barrierattr_init(&attr);
  pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_barrier_init(barrier, &attr, kSenders + 1);
  pid_t senders[kSenders];
  const pid_t parent = getpid();
  for (pid_t& s : senders) {
    s = fork();
    if (s < 0) die("fork failed");
    if (s == 0) {
      for (;;) {
        pthread_barrier_wait(barrier);
        kill(parent, SIGUSR1);
        pthread_barrier_wait(barrier);
      }
    }
  }
  const int failures = churn_and_fork(barrier, kIterations);
  for (pid_t s : senders) kill(s, SIGKILL);
  for (pid_t s : senders) waitpid(s, nullptr, 0);
  return report("signal-fork", failures);
}

int mode_signal_threads() {
  // glibc's _Fork is 2.34's: on an older glibc (where the probe is built
  // without it) the mode has nothing to test.
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  if (libc == nullptr || dlsym(libc, "_Fork") == nullptr) {
    std::printf("signal-threads: glibc %s has no _Fork (2.34 and later): not run\n",
                gnu_get_libc_version());
    return 77;
  }
  make_witnesses();
  g_handler_fork = &_Fork;
  g_handler_child_checks = false;
  install_handler();
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, nullptr, kSenders + 1);
  const pthread_t main_thread = pthread_self();
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kSenders; ++i) {
    threads.emplace_back([&] {
      // The main thread only takes them: sigwait-free, as in glibc's test.
      sigset_t usr1;
      sigemptyset(&usr1);
      sigaddset(&usr1, SIGUSR1);
      pthread_sigmask(SIG_BLOCK, &usr1, nullptr);
      for (;;) {
        pthread_barrier_wait(&barrier);
        if (stop.load()) return;
        pthread_kill(main_thread, SIGUSR1);
        pthread_barrier_wait(&barrier);
      }
    });
  }
  // A second forking thread: two forks at once, each child checking.
  std::atomic<int> second_failures{0};
  std::atomic<bool> second_stop{false};
  std::thread second([&] {
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &usr1, nullptr);
    while (!second_stop.load()) {
      const pid_t pid = fork();
      if (pid == 0) witness_child();
      if (!child_ok(pid, "second")) second_failures.fetch_add(1);
      void* p = std::malloc(4096);
      std::free(p);
    }
  });
  const int failures = churn_and_fork(&barrier, kIterations);
  second_stop.store(true);
  second.join();
  stop.store(true);
  pthread_barrier_wait(&barrier);
  for (auto& t : threads) t.join();
  return report("signal-threads", failures + second_failures.load());
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const char* mode = argc > 1 ? argv[1] : "";
  if (std::strcmp(mode, "cross-free") == 0) return mode_cross_free();
  if (std::strcmp(mode, "signal-fork") == 0) return mode_signal_fork();
  if (std::strcmp(mode, "signal-threads") == 0) return mode_signal_threads();
  std::fprintf(stderr, "usage: fork_race_probe cross-free|signal-fork|signal-threads\n");
  return 2;
}
