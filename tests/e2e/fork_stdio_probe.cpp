// fork() from several threads while other threads use stdio and the rest of
// libc that keeps data in the heap beside data in libc's own memory: the
// stdio list (FILEs in the heap, the list's head in libc), the loader's
// link_maps (dlopen), NSS (getpwnam), syslog, locales. Under glibc this
// never hangs; a child that got the two halves of such a structure from two
// moments spins or crashes in glibc's fork, and a fork that waits on a lock
// a stdio thread needs deadlocks the parent (issue 45).
//
//   fork_stdio_probe stdio SECONDS DIR LIB
//       3 threads fork; their children either _exit(17) at once or first
//       open, write, read back and close a file of their own (and malloc),
//       then _exit(17); beside them 3 threads write, flush (fflush(NULL)
//       too), read back and check files of their own, and one thread each
//       dlopen/dlclose LIB, call getpwnam/getpwuid, syslog, and
//       newlocale/freelocale.
//   fork_stdio_probe deadlock SECONDS DIR
//       glibc's tst-malloc-fork-deadlock shape: 4 threads fork in a loop
//       (children malloc, free and _exit(17)), 8 threads open a file, read
//       it with getline, rewind, read again, close, and one thread calls
//       fflush(NULL) in a loop.
//
// Every thread runs until SECONDS have passed. The parent waits for every
// child and prints one line; it exits 0 when every child exited with 17 and
// every file read back as written, else 1 with what went wrong on stderr.
// A hang is the runner's to catch (run_e2e.py reports every process's stack).
#include <dlfcn.h>
#include <locale.h>
#include <pthread.h>
#include <pwd.h>
#include <sys/wait.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kChildStatus = 17;

std::atomic<bool> g_stop{false};
std::atomic<long> g_forks{0};
std::atomic<long> g_bad_children{0};
std::atomic<long> g_bad_files{0};
std::atomic<long> g_rounds{0};  // rounds of the non-forking threads
std::string g_dir;

void complain(const char* what, long detail) {
  std::fprintf(stderr, "fork_stdio_probe: %s (%ld)\n", what, detail);
}

std::string path_of(const char* kind, long n) {
  return g_dir + "/" + kind + "-" + std::to_string(n);
}

// A child's own stdio: a file written, read back and removed; a few blocks.
// Only async-signal-unsafe calls a multi-threaded program's child may make
// after glibc's fork() (which resets the stdio locks for this).
[[noreturn]] void stdio_child(long n) {
  const std::string path = path_of("child", n);
  int status = kChildStatus;
  FILE* f = std::fopen(path.c_str(), "w+");
  if (f == nullptr) _exit(2);
  for (int i = 0; i < 50; ++i) std::fprintf(f, "child %ld line %d\n", n, i);
  std::rewind(f);
  char* line = nullptr;
  std::size_t cap = 0;
  int lines = 0;
  while (getline(&line, &cap, f) > 0) ++lines;
  std::free(line);
  if (lines != 50) status = 4;
  if (std::fclose(f) != 0) status = 5;
  unlink(path.c_str());
  void* blocks[32];
  for (std::size_t i = 0; i < 32; ++i) blocks[i] = std::malloc(16 + i * 100);
  for (void* b : blocks) std::free(b);
  _exit(status);
}

void check_child(pid_t pid) {
  int status = 0;
  if (pid < 0) {
    complain("fork failed, errno", errno);
    g_bad_children.fetch_add(1);
    return;
  }
  pid_t r;
  while ((r = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
  }
  if (r != pid || !WIFEXITED(status) || WEXITSTATUS(status) != kChildStatus) {
    if (r == pid && WIFSIGNALED(status)) {
      complain("a child died of signal", WTERMSIG(status));
    } else {
      complain("a child exited with", r == pid ? WEXITSTATUS(status) : -1);
    }
    g_bad_children.fetch_add(1);
  }
}

// stdio mode: children of both kinds, alternately.
void forker(int id) {
  for (long i = 0; !g_stop.load(std::memory_order_relaxed); ++i) {
    const long n = id * 1000000L + i;
    const pid_t pid = fork();
    if (pid == 0) {
      if (i % 2 == 0) _exit(kChildStatus);
      stdio_child(n);
    }
    g_forks.fetch_add(1);
    check_child(pid);
  }
}

// fopen, or a complaint and a bad round counted.
FILE* open_or_count(const std::string& path, const char* mode) {
  FILE* f = std::fopen(path.c_str(), mode);
  if (f == nullptr) {
    complain("fopen failed, errno", errno);
    g_bad_files.fetch_add(1);
  }
  return f;
}

// A file written (fflush(NULL) on the way), read back line by line, checked.
void stdio_worker(int id) {
  const std::string path = path_of("worker", id);
  for (long round = 0; !g_stop.load(std::memory_order_relaxed); ++round) {
    FILE* f = open_or_count(path, "w");
    if (f == nullptr) return;
    const int lines = 20 + static_cast<int>(round % 40);
    for (int i = 0; i < lines; ++i) {
      std::fprintf(f, "worker %d round %ld line %d %s\n", id, round, i, i % 3 ? "" : "padding");
      if (i == lines / 2) std::fflush(nullptr);
    }
    std::fclose(f);
    f = open_or_count(path, "r");
    if (f == nullptr) return;
    char* line = nullptr;
    std::size_t cap = 0;
    int seen = 0;
    bool right = true;
    char want[128];
    while (getline(&line, &cap, f) > 0) {
      std::snprintf(want, sizeof want, "worker %d round %ld line %d %s\n", id, round, seen,
                    seen % 3 ? "" : "padding");
      right = right && std::strcmp(line, want) == 0;
      ++seen;
    }
    std::free(line);
    std::fclose(f);
    if (!right || seen != lines) {
      complain("a file read back differs from what was written, round", round);
      g_bad_files.fetch_add(1);
    }
    g_rounds.fetch_add(1, std::memory_order_relaxed);
  }
  unlink(path.c_str());
}

void dlopen_worker(const char* lib) {
  while (!g_stop.load(std::memory_order_relaxed)) {
    void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      complain(dlerror(), 0);
      g_bad_files.fetch_add(1);
      return;
    }
    dlclose(h);
    g_rounds.fetch_add(1, std::memory_order_relaxed);
  }
}

void nss_worker() {
  while (!g_stop.load(std::memory_order_relaxed)) {
    struct passwd pw {};
    struct passwd* found = nullptr;
    char buf[4096];
    getpwnam_r("root", &pw, buf, sizeof buf, &found);
    const struct passwd* p = getpwuid(0);
    if (found == nullptr || p == nullptr || std::strcmp(p->pw_name, "root") != 0) {
      complain("getpwnam/getpwuid did not find root", 0);
      g_bad_files.fetch_add(1);
      return;
    }
    g_rounds.fetch_add(1, std::memory_order_relaxed);
  }
}

void syslog_worker() {
  for (long i = 0; !g_stop.load(std::memory_order_relaxed); ++i) {
    openlog("fork_stdio_probe", LOG_NDELAY, LOG_USER);
    syslog(LOG_DEBUG, "fork_stdio_probe round %ld", i);
    closelog();
    g_rounds.fetch_add(1, std::memory_order_relaxed);
  }
}

void locale_worker() {
  while (!g_stop.load(std::memory_order_relaxed)) {
    locale_t loc = newlocale(LC_ALL_MASK, "C.UTF-8", nullptr);
    if (loc == nullptr) loc = newlocale(LC_ALL_MASK, "C", nullptr);
    if (loc == nullptr) {
      complain("newlocale failed, errno", errno);
      g_bad_files.fetch_add(1);
      return;
    }
    const locale_t old = uselocale(loc);
    char text[64];
    std::snprintf(text, sizeof text, "%.2f", 1.5);
    uselocale(old);
    freelocale(loc);
    if (std::strcmp(text, "1.50") != 0) g_bad_files.fetch_add(1);
    g_rounds.fetch_add(1, std::memory_order_relaxed);
  }
}

// deadlock mode.
void deadlock_forker() {
  while (!g_stop.load(std::memory_order_relaxed)) {
    const pid_t pid = fork();
    if (pid == 0) {
      void* a = std::malloc(100);
      void* b = std::malloc(70000);
      std::free(a);
      std::free(b);
      _exit(kChildStatus);
    }
    g_forks.fetch_add(1);
    check_child(pid);
  }
}

void deadlock_reader(const std::string& path) {
  while (!g_stop.load(std::memory_order_relaxed)) {
    FILE* f = open_or_count(path, "r");
    if (f == nullptr) return;
    char* line = nullptr;
    std::size_t cap = 0;
    int first = 0;
    int second = 0;
    while (getline(&line, &cap, f) > 0) ++first;
    std::rewind(f);
    while (getline(&line, &cap, f) > 0) ++second;
    std::free(line);
    std::fclose(f);
    if (first != 64 || second != 64) {
      complain("a file read differently, lines", first * 1000 + second);
      g_bad_files.fetch_add(1);
    }
    g_rounds.fetch_add(1, std::memory_order_relaxed);
  }
}

void flusher() {
  while (!g_stop.load(std::memory_order_relaxed)) {
    std::fflush(nullptr);
    g_rounds.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (argc < 4 || (mode != "stdio" && mode != "deadlock") || (mode == "stdio" && argc < 5)) {
    std::fprintf(stderr, "usage: fork_stdio_probe stdio SECONDS DIR LIB | deadlock SECONDS DIR\n");
    return 2;
  }
  const double seconds = std::atof(argv[2]);
  g_dir = argv[3];
  std::vector<std::thread> threads;
  if (mode == "stdio") {
    for (int i = 0; i < 3; ++i) threads.emplace_back(stdio_worker, i);
    threads.emplace_back(dlopen_worker, argv[4]);
    threads.emplace_back(nss_worker);
    threads.emplace_back(syslog_worker);
    threads.emplace_back(locale_worker);
    for (int i = 0; i < 3; ++i) threads.emplace_back(forker, i);
  } else {
    const std::string path = path_of("lines", 0);
    FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) return 3;
    for (int i = 0; i < 64; ++i) std::fprintf(f, "line %d of the file the readers read\n", i);
    std::fclose(f);
    for (int i = 0; i < 8; ++i) threads.emplace_back(deadlock_reader, path);
    threads.emplace_back(flusher);
    for (int i = 0; i < 4; ++i) threads.emplace_back(deadlock_forker);
  }
  const timespec wait{static_cast<time_t>(seconds),
                      static_cast<long>((seconds - static_cast<time_t>(seconds)) * 1e9)};
  nanosleep(&wait, nullptr);
  g_stop.store(true);
  for (std::thread& t : threads) t.join();
  if (mode == "deadlock") unlink(path_of("lines", 0).c_str());
  const long bad = g_bad_children.load() + g_bad_files.load();
  std::printf("fork_stdio_probe %s: %ld forks, %ld bad children, %ld bad rounds of %ld\n",
              mode.c_str(), g_forks.load(), g_bad_children.load(), g_bad_files.load(),
              g_rounds.load());
  return bad == 0 && g_forks.load() > 0 ? 0 : 1;
}
