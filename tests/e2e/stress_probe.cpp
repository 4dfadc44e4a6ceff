// Stress under the interposer, each part checking its own data. Prints a
// deterministic summary on stdout; figures (operations, reserved bytes over
// time) go to the file named by STRESS_REPORT, when set.
//
//   stress_probe churn SECONDS THREADS   random malloc/calloc/realloc/free of
//       self-checking blocks, a steady live set per thread, a quarter of the
//       frees done by another thread; the backend's reserved bytes sampled
//       every second (mnemosyne_stats_json), so a leak shows as growth
//   stress_probe forks EXECS ONLY        while 4 threads allocate: EXECS
//       children that exec /bin/true, then ONLY children that check the heap
//       and exit without exec
//   stress_probe dlopen LIB COUNT        dlopen/dlclose LIB (it allocates in its
//       constructor, frees in its destructor) COUNT times while 2 threads allocate
#include <dlfcn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "pattern_block.hpp"

namespace {

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "stress_probe: %s\n", what);
  std::fflush(stderr);
  _exit(3);
}

double now_s() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void check(void* block, const char* where) {
  bool checked = false;
  if (!test::block_ok(block, &checked) || !checked) die(where);
}

// The interposer's reserved bytes of all backends, from its own JSON; -1
// without the interposer.
long long reserved_bytes() {
  using StatsFn = char* (*)();
  static const auto stats = reinterpret_cast<StatsFn>(dlsym(RTLD_DEFAULT, "mnemosyne_stats_json"));
  if (stats == nullptr) return -1;
  char* json = stats();
  if (json == nullptr) return -1;
  long long total = 0;
  for (const char* p = json; (p = std::strstr(p, "\"bytes_reserved\": ")) != nullptr;) {
    p += std::strlen("\"bytes_reserved\": ");
    total += std::atoll(p);
  }
  std::free(json);
  return total;
}

// ---- churn

constexpr int kLive = 512;  // blocks each thread keeps
constexpr int kMailbox = 4096;
std::atomic<void*> g_mailbox[kMailbox];  // blocks handed to another thread to free

int mode_churn(double seconds, int threads) {
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> ops{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      void* live[kLive] = {};
      std::uint64_t state = test::mix(static_cast<std::uint64_t>(t) + 77);
      std::uint64_t n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        state = test::mix(state + n++);
        const int i = static_cast<int>(state % kLive);
        if (live[i] != nullptr) {
          check(live[i], "churn: a block changed under its owner");
          if ((state >> 9) % 4 == 0) {  // to another thread
            void* prev = g_mailbox[(state >> 12) % kMailbox].exchange(live[i]);
            if (prev != nullptr) {
              check(prev, "churn: a block changed on its way to another thread");
              test::drop_block(prev);
            }
          } else if ((state >> 9) % 4 == 1) {  // grown or shrunk, in place or moved
            const std::size_t size = static_cast<test::Header*>(live[i])->size;
            const std::size_t smaller = size / 2 > sizeof(test::Header) ? size / 2 : size;
            const std::size_t to = (state >> 15) % 2 ? size + (state >> 16) % 3000 : smaller;
            void* moved = std::realloc(live[i], to);
            if (moved == nullptr) die("churn: realloc failed");
            if (to < size) static_cast<test::Header*>(moved)->size = to;  // what is left to check
            check(moved, "churn: realloc lost the contents");
            test::drop_block(moved);
          } else {
            test::drop_block(live[i]);
          }
          live[i] = nullptr;
        }
        const std::uint64_t r = state >> 20;
        const std::size_t size = r % 50 == 0 ? 16384 + r % 300000 : 16 + r % 1500;
        live[i] = test::make_block(size, state);
        if (live[i] == nullptr) die("churn: malloc failed");
        if (r % 97 == 0) {
          void* z = std::calloc(1, 256 + r % 4000);
          if (z == nullptr) die("churn: calloc failed");
          for (std::size_t k = 0; k < 256; ++k) {
            if (static_cast<unsigned char*>(z)[k] != 0) die("churn: calloc memory not zero");
          }
          std::free(z);
        }
        ops.fetch_add(1, std::memory_order_relaxed);
      }
      for (void* b : live) {
        if (b != nullptr) {
          check(b, "churn: a block changed under its owner");
          test::drop_block(b);
        }
      }
    });
  }
  std::vector<long long> samples;
  const double start = now_s();
  // One sample a second on a fixed schedule: sleeping a second after each
  // sample drifted (the sample itself takes time among 32 busy threads), and
  // a 60 s run once got 55 samples.
  for (int k = 1; k <= seconds; ++k) {
    const double wait = start + k - now_s();
    if (wait > 0) usleep(static_cast<useconds_t>(wait * 1e6));
    samples.push_back(reserved_bytes());
  }
  stop.store(true);
  for (auto& w : workers) w.join();
  for (auto& slot : g_mailbox) {
    if (void* b = slot.exchange(nullptr)) {
      check(b, "churn: a block changed in the mailbox");
      test::drop_block(b);
    }
  }
  if (const char* path = std::getenv("STRESS_REPORT")) {
    if (FILE* f = std::fopen(path, "w")) {
      std::fprintf(f, "ops %llu\nseconds %.1f\n", static_cast<unsigned long long>(ops.load()),
                   now_s() - start);
      for (std::size_t i = 0; i < samples.size(); ++i) {
        std::fprintf(f, "reserved %zu %lld\n", i + 1, samples[i]);
      }
      std::fclose(f);
    }
  }
  std::printf("churn: %d threads, all blocks intact\n", threads);
  return 0;
}

// ---- forks while other threads allocate

std::atomic<bool> g_stop_background{false};

std::vector<std::thread> background(int count) {
  std::vector<std::thread> threads;
  for (int t = 0; t < count; ++t) {
    threads.emplace_back([t] {
      std::vector<void*> mine;
      std::uint64_t s = test::mix(static_cast<std::uint64_t>(t) + 5);
      while (!g_stop_background.load(std::memory_order_relaxed)) {
        s = test::mix(s);
        void* b = test::make_block(16 + s % 20000, s);
        if (b == nullptr) die("background: malloc failed");
        mine.push_back(b);
        if (mine.size() > 300) {
          for (void* m : mine) {
            check(m, "background: a block changed");
            test::drop_block(m);
          }
          mine.clear();
        }
      }
      for (void* m : mine) test::drop_block(m);
    });
  }
  return threads;
}

bool exited_zero(pid_t pid) {
  int status = 0;
  return waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int mode_forks(int execs, int only) {
  void* keep = test::make_block(100000, 9);
  std::vector<std::thread> threads = background(4);
  int exec_ok = 0;
  for (int i = 0; i < execs; ++i) {
    const pid_t pid = fork();
    if (pid < 0) die("fork failed");
    if (pid == 0) {
      char* args[] = {const_cast<char*>("/bin/true"), nullptr};
      execv(args[0], args);
      _exit(127);
    }
    exec_ok += exited_zero(pid) ? 1 : 0;
  }
  int only_ok = 0;
  for (int i = 0; i < only; ++i) {
    const pid_t pid = fork();
    if (pid < 0) die("fork failed");
    if (pid == 0) {
      check(keep, "child: the parent's block is damaged");
      void* b = test::make_block(5000, 1);
      if (b == nullptr) die("child: malloc failed");
      check(b, "child: its block is damaged");
      test::drop_block(b);
      _exit(0);
    }
    only_ok += exited_zero(pid) ? 1 : 0;
  }
  g_stop_background.store(true);
  for (auto& t : threads) t.join();
  test::drop_block(keep);
  std::printf("forks: %d of %d exec'd children ok, %d of %d forked children ok\n", exec_ok, execs,
              only_ok, only);
  return exec_ok == execs && only_ok == only ? 0 : 1;
}

// ---- dlopen / dlclose in a loop

int mode_dlopen(const char* lib, int count) {
  std::vector<std::thread> threads = background(2);
  int ok = 0;
  for (int i = 0; i < count; ++i) {
    void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) die(dlerror());
    auto message = reinterpret_cast<const char* (*)()>(dlsym(h, "ctor_alloc_message"));
    if (message != nullptr && message() != nullptr &&
        std::strcmp(message(), "allocated in a constructor") == 0) {
      ++ok;
    }
    if (dlclose(h) != 0) die("dlclose failed");
  }
  g_stop_background.store(true);
  for (auto& t : threads) t.join();
  std::printf("dlopen: %d of %d loads saw their constructor's block\n", ok, count);
  return ok == count ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  if (std::strcmp(mode, "churn") == 0 && argc == 4) {
    return mode_churn(std::atof(argv[2]), std::atoi(argv[3]));
  }
  if (std::strcmp(mode, "forks") == 0 && argc == 4) {
    return mode_forks(std::atoi(argv[2]), std::atoi(argv[3]));
  }
  if (std::strcmp(mode, "dlopen") == 0 && argc == 4) {
    return mode_dlopen(argv[2], std::atoi(argv[3]));
  }
  std::fprintf(stderr,
               "usage: stress_probe churn SECONDS THREADS | forks EXECS ONLY | dlopen LIB COUNT\n");
  return 2;
}
