// Growth patterns a program's heap goes through over a whole run, for the
// corpus that checks the backend's memory (locked, or the driver's) against
// the live bytes (run_growth.py). Each pattern reaches its peak, frees what
// a program would, then holds what it keeps through a quiet phase.
//
//   growth_probe PATTERN [QUIET_MS]
//
//   concat     a buffer grown from 40 to 160 MiB by concatenation: a 4 MiB
//              block, a new buffer of both, the two old ones freed (x = x + y)
//   realloc    one block grown by realloc, by half each step, 4 KiB to 512 MiB
//   vector     a std::vector<char> grown by push_back to 256 MiB (doubling)
//   temp-huge  a 256 MiB block allocated, written and freed at each step
//              beside a block grown by realloc from 40 to 160 MiB
//   threads    8 threads, each growing a block by realloc to 32 MiB and
//              freeing it, 4 times over, beside 4 MiB of small blocks each
//   burst      16 MiB of long-lived 4 KiB blocks, then 512 MiB in blocks of
//              1 KiB to 1 MiB, all freed
//   scatter    512 MiB in blocks of 1 KiB to 1 MiB, all freed but every
//              32nd (about 16 MiB, on pages all over the burst's)
//   small      200 threads, each holding one 64-byte block until all have
//              one, then the blocks freed and the threads ended
//
// What it prints (stdout), one line at each point: `point NAME live=BYTES`,
// then, when the interposer is loaded, `stats JSON` (mnemosyne_stats_json);
// when the test-double driver is (MNEMOSYNE_CUDA_DRIVER names it), `fake
// live=BYTES peak=BYTES`; and always `status VmLck=KiB VmPin=KiB VmRSS=KiB VmHWM=KiB`.
// Points: `peak` when the pattern holds the most, `end` after the quiet
// phase (default 3000 ms). `live` is what the pattern holds by its own
// count (usable sizes); the run's peak is in the statistics.
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "fakecuda.h"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

std::atomic<std::size_t> g_live{0};

void* take(std::size_t n) {
  void* p = std::malloc(n);
  if (p == nullptr) {
    std::fprintf(stderr, "growth_probe: malloc(%zu) failed\n", n);
    std::exit(2);
  }
  std::memset(p, 0x5a, n);
  g_live += malloc_usable_size(p);
  return p;
}

void give(void* p) {
  g_live -= malloc_usable_size(p);
  std::free(p);
}

void* grow(void* p, std::size_t old_size, std::size_t n) {
  if (p != nullptr) g_live -= malloc_usable_size(p);
  void* q = std::realloc(p, n);
  if (q == nullptr) {
    std::fprintf(stderr, "growth_probe: realloc(%zu) failed\n", n);
    std::exit(2);
  }
  std::memset(static_cast<char*>(q) + old_size, 0x6b, n - old_size);
  g_live += malloc_usable_size(q);
  return q;
}

long status_kib(const char* key) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long v = -1;
  const std::size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, key, n) == 0 && line[n] == ':') v = std::atol(line + n + 1);
  }
  std::fclose(f);
  return v;
}

void point(const char* name) {
  std::printf("point %s live=%zu\n", name, g_live.load());
  using StatsJson = char* (*)();
  if (auto json = reinterpret_cast<StatsJson>(dlsym(RTLD_DEFAULT, "mnemosyne_stats_json"))) {
    char* doc = json();
    if (doc != nullptr) {
      for (char* c = doc; *c != '\0'; ++c) {
        if (*c == '\n') *c = ' ';  // one line
      }
      std::printf("stats %s\n", doc);
    }
    std::free(doc);
  }
  // The double, when it is the driver: the same instance the interposer
  // loaded (the same path).
  const char* driver = std::getenv("MNEMOSYNE_CUDA_DRIVER");
  if (driver != nullptr) {
    if (void* h = dlopen(driver, RTLD_NOW | RTLD_NOLOAD)) {
      using Get = void (*)(fakecuda_counters*);
      if (auto get = reinterpret_cast<Get>(dlsym(h, "fakecuda_get_counters"))) {
        fakecuda_counters c{};
        get(&c);
        std::printf("fake live=%llu peak=%llu\n", static_cast<unsigned long long>(c.live_bytes),
                    static_cast<unsigned long long>(c.peak_live_bytes));
      }
      dlclose(h);
    }
  }
  std::printf("status VmLck=%ld VmPin=%ld VmRSS=%ld VmHWM=%ld\n", status_kib("VmLck"),
              status_kib("VmPin"), status_kib("VmRSS"), status_kib("VmHWM"));
  std::fflush(stdout);
}

void quiet(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

void concat(int quiet_ms) {
  std::size_t n = 40 * kMiB;
  void* x = take(n);
  while (n < 160 * kMiB) {
    void* t = take(4 * kMiB);
    void* y = take(n + 4 * kMiB);
    std::memcpy(y, x, n);
    std::memcpy(static_cast<char*>(y) + n, t, 4 * kMiB);
    give(x);
    give(t);
    x = y;
    n += 4 * kMiB;
  }
  point("peak");
  quiet(quiet_ms);
  point("end");
  give(x);
}

void realloc_chain(int quiet_ms) {
  std::size_t n = 4096;
  void* p = grow(nullptr, 0, n);
  while (n < 512 * kMiB) {
    const std::size_t next = n + n / 2;
    p = grow(p, n, next);
    n = next;
  }
  point("peak");
  quiet(quiet_ms);
  point("end");
  give(p);
}

void vector_doubling(int quiet_ms) {
  std::vector<char> v;
  std::size_t counted = 0;
  for (std::size_t i = 0; i < 256 * kMiB; ++i) {
    v.push_back(static_cast<char>(i));
    if (v.capacity() != counted) {  // the vector moved to a new block
      g_live += v.capacity() - counted;
      counted = v.capacity();
    }
  }
  point("peak");
  quiet(quiet_ms);
  point("end");
  g_live -= counted;
}

void temp_huge(int quiet_ms) {
  std::size_t n = 40 * kMiB;
  void* x = grow(nullptr, 0, n);
  while (n < 160 * kMiB) {
    void* t = take(256 * kMiB);
    give(t);
    x = grow(x, n, n + 8 * kMiB);
    n += 8 * kMiB;
  }
  point("peak");
  quiet(quiet_ms);
  point("end");
  give(x);
}

// Runs `body(peak)` on `count` threads, then the quiet phase: each thread
// calls peak() when it holds the most it will, and the last one to do so
// reports the peak while the others wait for it.
template <class Body>
void on_threads(int count, int quiet_ms, Body body) {
  std::vector<std::thread> threads;
  std::atomic<int> arrived{0};
  std::atomic<bool> measured{false};
  auto peak = [&] {
    if (++arrived == count) {
      point("peak");
      measured = true;
    }
    while (!measured) quiet(1);
  };
  for (int t = 0; t < count; ++t) threads.emplace_back([&] { body(peak); });
  for (auto& t : threads) t.join();
  quiet(quiet_ms);
  point("end");
}

void threads_growing(int quiet_ms) {
  on_threads(8, quiet_ms, [](auto peak) {
    std::vector<void*> small;
    for (int i = 0; i < 4096; ++i) small.push_back(take(1024));
    for (int round = 0; round < 4; ++round) {
      std::size_t n = 4096;
      void* p = grow(nullptr, 0, n);
      while (n < 32 * kMiB) {
        p = grow(p, n, n * 2);
        n *= 2;
      }
      if (round == 3) peak();
      give(p);
    }
    for (void* p : small) give(p);
  });
}

// `keep_every`: 0, a long-lived 16 MiB allocated before the burst and the
// burst all freed; n, every n-th block of the burst kept instead (the kept
// blocks scattered over the pages the burst used).
void burst(int quiet_ms, std::size_t keep_every) {
  std::vector<void*> kept;
  if (keep_every == 0) {
    for (int i = 0; i < 4096; ++i) kept.push_back(take(4096));
  }
  std::vector<void*> blocks;
  std::size_t total = 0;
  unsigned seed = 12345;
  while (total < 512 * kMiB) {
    seed = seed * 1103515245u + 12345u;
    const std::size_t n = std::size_t{1024} << (seed >> 16) % 11;  // 1 KiB to 1 MiB
    blocks.push_back(take(n));
    total += n;
  }
  point("peak");
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    if (keep_every != 0 && i % keep_every == 0) {
      kept.push_back(blocks[i]);
    } else {
      give(blocks[i]);
    }
  }
  quiet(quiet_ms);
  point("end");
  for (void* p : kept) give(p);
}

void small_threads(int quiet_ms) {
  on_threads(200, quiet_ms, [](auto peak) {
    void* p = take(64);
    peak();
    give(p);
  });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: growth_probe PATTERN [QUIET_MS]\n");
    return 2;
  }
  const std::string pattern = argv[1];
  const int quiet_ms = argc > 2 ? std::atoi(argv[2]) : 3000;
  if (pattern == "concat") {
    concat(quiet_ms);
  } else if (pattern == "realloc") {
    realloc_chain(quiet_ms);
  } else if (pattern == "vector") {
    vector_doubling(quiet_ms);
  } else if (pattern == "temp-huge") {
    temp_huge(quiet_ms);
  } else if (pattern == "threads") {
    threads_growing(quiet_ms);
  } else if (pattern == "burst") {
    burst(quiet_ms, 0);
  } else if (pattern == "scatter") {
    burst(quiet_ms, 32);
  } else if (pattern == "small") {
    small_threads(quiet_ms);
  } else {
    std::fprintf(stderr, "growth_probe: unknown pattern %s\n", pattern.c_str());
    return 2;
  }
  return 0;
}
