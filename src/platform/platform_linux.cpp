// platform::System on Linux: dlopen, mmap, secure_getenv, signal masks.
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "platform/page_pull.hpp"
#include "platform/platform.hpp"

namespace mnemosyne::platform {

void* System::open_library(const char* path, char* error, std::size_t len) noexcept {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* why = dlerror();
    std::snprintf(error, len, "%s", why != nullptr ? why : "dlopen failed");
  }
  return h;
}

void* System::find_symbol(void* library, const char* name) noexcept {
  return dlsym(library, name);
}

void* System::map_pages(std::size_t size, int* error) noexcept {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p != MAP_FAILED) return p;
  *error = errno;
  return nullptr;
}

bool System::unmap_pages(void* ptr, std::size_t size) noexcept {
  return munmap(ptr, size) == 0;
}

// glibc answers from the auxiliary vector it keeps: no system call.
std::size_t System::page_size() noexcept {
  return static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

const char* System::secure_env(const char* name) noexcept {
  return secure_getenv(name);
}

void System::pause(std::size_t spins) noexcept {
  if (spins < 64) {
    sched_yield();
  } else {
    struct timespec ts = {0, 200 * 1000};
    nanosleep(&ts, nullptr);
  }
}

void System::sleep_ns(std::uint64_t ns) noexcept {
  struct timespec ts = {static_cast<time_t>(ns / 1000000000u), static_cast<long>(ns % 1000000000u)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

bool System::discard_pages(void* ptr, std::size_t size) noexcept {
  const int saved = errno;
  const bool ok = madvise(ptr, size, MADV_DONTNEED) == 0;
  errno = saved;
  return ok;
}

// A private futex: the word is never shared with another process.
void System::wait_while_equal(std::atomic<std::uint32_t>* word, std::uint32_t seen,
                              std::uint64_t timeout_ns) noexcept {
  struct timespec limit = {static_cast<time_t>(timeout_ns / 1000000000u),
                           static_cast<long>(timeout_ns % 1000000000u)};
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT_PRIVATE, seen,
          timeout_ns == kNoTimeout ? nullptr : &limit, nullptr, 0);
}

void System::wake_all(std::atomic<std::uint32_t>* word) noexcept {
  const int saved = errno;  // called from the program's own malloc and free
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE_PRIVATE, 0x7fffffff,
          nullptr, nullptr, 0);
  errno = saved;
}

namespace {
struct ThreadStart {
  void (*fn)(void*);
  void* arg;
};
void* thread_main(void* raw) {
  const ThreadStart start = *static_cast<ThreadStart*>(raw);
  munmap(raw, System::page_size());
  start.fn(start.arg);
  return nullptr;
}
}  // namespace

// The threads start_thread started: mnemosyne's own, which never end
// (page_pull::own_threads).
static constinit std::atomic<std::size_t> g_own_threads{0};

bool System::start_thread(void (*fn)(void*), void* arg) noexcept {
  // The start record is a page of its own, not malloc's: this runs on the
  // allocator's slow path.
  int err = 0;
  auto* start = static_cast<ThreadStart*>(map_pages(page_size(), &err));
  if (start == nullptr) return false;
  *start = ThreadStart{fn, arg};
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  sigset_t saved;
  block_async_signals(&saved);  // inherited by the new thread
  pthread_t thread;
  const int rc = pthread_create(&thread, &attr, &thread_main, start);
  restore_signals(saved);
  pthread_attr_destroy(&attr);
  if (rc != 0) munmap(start, page_size());
  if (rc == 0) g_own_threads.fetch_add(1, std::memory_order_relaxed);
  return rc == 0;
}

namespace page_pull {
std::size_t own_threads() noexcept {
  return g_own_threads.load(std::memory_order_relaxed);
}
}  // namespace page_pull

std::size_t System::cpu_count() noexcept {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  const int n = CPU_COUNT(&set);
  return n > 0 ? static_cast<std::size_t>(n) : 1;
}

std::uint64_t System::monotonic_ns() noexcept {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

long System::process_id() noexcept {
  return static_cast<long>(getpid());
}

long System::thread_id() noexcept {
  return static_cast<long>(gettid());
}

// The kernel's clock id for a thread's CPU time, as glibc's
// pthread_getcpuclockid builds it from the thread's id (CPUCLOCK_PERTHREAD
// | CPUCLOCK_SCHED): usable for any thread of the process, without a
// pthread_t that must still be alive. Some kernels refuse other threads'
// clocks (EINVAL; seen on a Firecracker guest's 6.18 kernel): then the
// scheduler's own figure, the first field of /proc/self/task/<tid>/schedstat
// (ns on the CPU), read with plain system calls (no allocation: this runs in
// malloc's slow path).
std::uint64_t System::thread_cpu_ns(long tid) noexcept {
  const auto clock = static_cast<clockid_t>((~static_cast<unsigned>(tid) << 3) | 6);
  struct timespec ts;
  if (clock_gettime(clock, &ts) == 0) {
    return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u +
           static_cast<std::uint64_t>(ts.tv_nsec);
  }
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/task/%ld/schedstat", tid);
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char text[64];
  const ssize_t n = read(fd, text, sizeof text - 1);
  close(fd);
  std::uint64_t ns = 0;
  for (ssize_t i = 0; i < n && text[i] >= '0' && text[i] <= '9'; ++i) {
    ns = ns * 10 + static_cast<std::uint64_t>(text[i] - '0');
  }
  return ns;
}

namespace {

// The first number after `key` in the file at `path` (a "Key: N" line of
// /proc/driver/nvidia/params, or the lone number of a module parameter
// file); -1 when the file or the key is missing. Plain system calls and a
// stack buffer: this runs inside malloc's start-up.
int number_in_file(const char* path, const char* key) noexcept {
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char text[8192];
  std::size_t have = 0;
  for (;;) {
    const ssize_t n = read(fd, text + have, sizeof text - 1 - have);
    if (n <= 0) break;
    have += static_cast<std::size_t>(n);
    if (have == sizeof text - 1) break;
  }
  close(fd);
  text[have] = '\0';
  const char* at = text;
  if (key[0] != '\0') {
    at = std::strstr(text, key);
    if (at == nullptr) return -1;
    at += std::strlen(key);
    while (*at == ':' || *at == ' ' || *at == '\t') ++at;
  } else {
    while (*at == ' ' || *at == '\n') ++at;
  }
  if (*at < '0' || *at > '9') return -1;
  int value = 0;
  while (*at >= '0' && *at <= '9' && value < 1000000) value = value * 10 + (*at++ - '0');
  return value;
}

}  // namespace

// The nvidia module zeroes the system memory it allocates (pinned host
// memory among it) while its InitializeSystemMemoryAllocations setting is 1,
// the default (open-gpu-kernel-modules: nv-reg.h, os.c
// osAllocPagesInternal); an administrator can set it to 0. The module lists
// its settings in /proc/driver/nvidia/params, and the parameter itself in
// sysfs. MNEMOSYNE_TEST_NVIDIA_PARAMS names another params file (tests).
int System::nvidia_zeroes_pinned_memory(char* source, std::size_t len) noexcept {
  static constexpr char kKey[] = "InitializeSystemMemoryAllocations";
  const char* test_file = secure_getenv("MNEMOSYNE_TEST_NVIDIA_PARAMS");
  const char* params = test_file != nullptr ? test_file : "/proc/driver/nvidia/params";
  int value = number_in_file(params, kKey);
  if (value >= 0) {
    std::snprintf(source, len, "%s: %s %d", params, kKey, value);
    return value != 0 ? 1 : 0;
  }
  if (test_file == nullptr) {
    static constexpr char kSysfs[] =
        "/sys/module/nvidia/parameters/NVreg_InitializeSystemMemoryAllocations";
    value = number_in_file(kSysfs, "");
    if (value >= 0) {
      std::snprintf(source, len, "%s: %d", kSysfs, value);
      return value != 0 ? 1 : 0;
    }
  }
  std::snprintf(source, len, "%s: not readable", params);
  return -1;
}

bool System::exclude_from_fork(void* ptr, std::size_t size, int* error) noexcept {
  if (madvise(ptr, size, MADV_DONTFORK) == 0) return true;
  *error = errno;
  return false;
}

// atexit handlers and destructors run with every thread alive.
bool System::process_exiting() noexcept {
  return false;
}

void System::block_async_signals(SignalMask* saved) noexcept {
  sigset_t async;
  sigfillset(&async);
  constexpr int kFaults[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS};
  for (int sig : kFaults) sigdelset(&async, sig);
  pthread_sigmask(SIG_BLOCK, &async, saved);
}

void System::restore_signals(const SignalMask& saved) noexcept {
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
}

}  // namespace mnemosyne::platform
