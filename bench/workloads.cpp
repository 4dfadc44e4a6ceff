// The allocation workloads of the side-by-side benchmark (scripts/bench.sh),
// one per classic allocator-benchmark shape, written for this project. Each
// is deterministic (a fixed-seed generator), uses only malloc/free/realloc/
// calloc (so any LD_PRELOADed allocator serves it), checks the bytes it
// wrote, and prints one line: "<name> ok <checksum>".
//
//   workloads NAME [SCALE]     SCALE (default 1.0) multiplies the work
//
// Built with WORKLOADS_MIMALLOC (Windows only: workloads-mimalloc.exe), the
// same calls go to mnemosyne's private mimalloc linked in, the baseline the
// injected DLL is measured against (bench/run_bench.py, windows table).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#ifdef WORKLOADS_MIMALLOC
#include <mimalloc-live.h>
#include <mimalloc.h>
#endif

namespace {

// The allocator under test: the C library's malloc (whatever serves it in
// this process), or mimalloc called directly.
namespace heap {
#ifdef WORKLOADS_MIMALLOC
void* malloc(std::size_t n) {
  return mi_malloc(n);
}
void* calloc(std::size_t c, std::size_t n) {
  return mi_calloc(c, n);
}
void* realloc(void* p, std::size_t n) {
  return mi_realloc(p, n);
}
void free(void* p) {
  mi_free(p);
}
#else
using std::calloc;
using std::free;
using std::malloc;
using std::realloc;
#endif
}  // namespace heap

struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
};

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "workloads: %s\n", what);
  std::exit(1);
}

void* must(void* p) {
  if (p == nullptr) die("out of memory");
  return p;
}

void stamp(void* p, std::size_t n, std::uint64_t tag) {
  std::memcpy(p, &tag, n < sizeof tag ? n : sizeof tag);
}

std::uint64_t read_stamp(const void* p, std::size_t n) {
  std::uint64_t tag = 0;
  std::memcpy(&tag, p, n < sizeof tag ? n : sizeof tag);
  return tag;
}

// Single-threaded small-object churn: 1,000 live blocks of 8..1024 bytes.
std::uint64_t churn(double scale) {
  const long ops = static_cast<long>(2'000'000 * scale);
  void* live[1000] = {};
  std::size_t sizes[1000] = {};
  Rng r{42};
  std::uint64_t sum = 0;
  for (long i = 0; i < ops; ++i) {
    const std::size_t slot = r.next() % 1000;
    if (live[slot] != nullptr) {
      sum += read_stamp(live[slot], sizes[slot]);
      heap::free(live[slot]);
    }
    sizes[slot] = 8 + r.next() % 1017;
    live[slot] = must(heap::malloc(sizes[slot]));
    stamp(live[slot], sizes[slot], static_cast<std::uint64_t>(i));
  }
  for (void* p : live) heap::free(p);
  return sum;
}

// The allocator's fast path and little else: churn's pattern (1,024 live
// blocks of 8..1,023 bytes, each slot's block freed and replaced) with one
// random number per pair, masks for divisions and one byte written per
// block, so that the instructions of malloc and free are most of what runs
// (about 20 of the loop's own per pair). scripts/bench.sh counts it at two
// scales and takes the difference: start-up apart, per pair.
std::uint64_t churn_bare(double scale) {
  const long ops = static_cast<long>(2'000'000 * scale);
  void* live[1024] = {};
  Rng r{42};
  std::uint64_t sum = 0;
  for (long i = 0; i < ops; ++i) {
    const std::uint64_t x = r.next();
    void*& slot = live[x & 1023];
    heap::free(slot);
    slot = must(heap::malloc(8 + ((x >> 10) & 1015)));
    *static_cast<volatile unsigned char*>(slot) = static_cast<unsigned char>(i);
    sum += reinterpret_cast<std::uintptr_t>(slot) & 0xff;
  }
  for (void* p : live) heap::free(p);
  return sum;
}

// Server-style churn across threads (larson-like): each thread replaces
// random blocks of its own array, and every round hands its array to the
// next thread, so blocks are freed by threads that did not allocate them.
std::uint64_t larson(double scale) {
  constexpr int kThreads = 4, kSlots = 2000;
  const int rounds = static_cast<int>(20 * scale) + 1;
  const long per_round = 50'000;
  std::vector<std::vector<void*>> arrays(kThreads, std::vector<void*>(kSlots, nullptr));
  std::atomic<std::uint64_t> sum{0};
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::thread> pool;
    for (int t = 0; t < kThreads; ++t) {
      pool.emplace_back([&, t] {
        std::vector<void*>& mine = arrays[(t + round) % kThreads];
        Rng r{static_cast<std::uint64_t>(round * 131 + t + 1)};
        std::uint64_t local = 0;
        for (long i = 0; i < per_round; ++i) {
          const std::size_t slot = r.next() % kSlots;
          if (mine[slot] != nullptr) {
            local += static_cast<unsigned char*>(mine[slot])[0];
            heap::free(mine[slot]);
          }
          const std::size_t n = 16 + r.next() % 496;
          mine[slot] = must(heap::malloc(n));
          static_cast<unsigned char*>(mine[slot])[0] = static_cast<unsigned char>(i);
        }
        sum += local;
      });
    }
    for (auto& th : pool) th.join();
  }
  for (auto& a : arrays) {
    for (void* p : a) heap::free(p);
  }
  return sum.load();
}

// Producer/consumer with cross-thread frees (xmalloc-like): two producers
// allocate, two consumers check and free, through bounded queues.
std::uint64_t xmalloc(double scale) {
  constexpr int kPairs = 2;
  const long per_producer = static_cast<long>(400'000 * scale);
  struct Queue {
    std::vector<std::atomic<void*>> slots = std::vector<std::atomic<void*>>(4096);
    std::atomic<std::uint64_t> head{0}, tail{0};
  };
  std::vector<Queue> queues(kPairs);
  std::atomic<std::uint64_t> sum{0};
  std::vector<std::thread> pool;
  for (int q = 0; q < kPairs; ++q) {
    pool.emplace_back([&, q] {
      Queue& queue = queues[q];
      Rng r{static_cast<std::uint64_t>(q + 7)};
      for (long i = 0; i < per_producer; ++i) {
        const std::size_t n = 8 + r.next() % 248;
        auto* p = static_cast<unsigned char*>(must(heap::malloc(n)));
        p[0] = static_cast<unsigned char>(n);
        while (queue.head.load(std::memory_order_acquire) - queue.tail.load() >= 4096) {
          std::this_thread::yield();
        }
        const std::uint64_t h = queue.head.load(std::memory_order_relaxed);
        queue.slots[h % 4096].store(p, std::memory_order_relaxed);
        queue.head.store(h + 1, std::memory_order_release);
      }
    });
    pool.emplace_back([&, q] {
      Queue& queue = queues[q];
      std::uint64_t local = 0;
      for (long i = 0; i < per_producer; ++i) {
        while (queue.tail.load(std::memory_order_relaxed) ==
               queue.head.load(std::memory_order_acquire)) {
          std::this_thread::yield();
        }
        const std::uint64_t t = queue.tail.load(std::memory_order_relaxed);
        auto* p = static_cast<unsigned char*>(queue.slots[t % 4096].load());
        local += p[0];
        heap::free(p);
        queue.tail.store(t + 1, std::memory_order_release);
      }
      sum += local;
    });
  }
  for (auto& th : pool) th.join();
  return sum.load();
}

// False-sharing sensitivity (cache-scratch-like): each thread allocates
// small objects and writes them many times; an allocator that hands
// neighbouring bytes to different threads makes them fight over lines.
std::uint64_t cache_scratch(double scale) {
  constexpr int kThreads = 4;
  const long objects = static_cast<long>(5'000 * scale) + 1;
  std::atomic<std::uint64_t> sum{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([&, t] {
      std::uint64_t local = 0;
      for (long i = 0; i < objects; ++i) {
        auto* p = static_cast<volatile unsigned char*>(must(heap::malloc(8)));
        for (int k = 0; k < 500; ++k) p[k % 8] = static_cast<unsigned char>(p[k % 8] + k + t);
        local += p[0];
        heap::free(const_cast<unsigned char*>(p));
      }
      sum += local;
    });
  }
  for (auto& th : pool) th.join();
  return sum.load();
}

// glibc's malloc-simple shape: allocate many blocks of one size, free them,
// again; `threads` of them at once for the malloc-thread shape.
std::uint64_t simple(double scale, int threads) {
  const int rounds = static_cast<int>(200 * scale) + 1;
  std::atomic<std::uint64_t> sum{0};
  auto body = [&](int t) {
    std::vector<void*> blocks(10'000);
    std::uint64_t local = 0;
    for (int round = 0; round < rounds; ++round) {
      const std::size_t n = 16u << (round % 5);
      for (void*& b : blocks) {
        b = must(heap::malloc(n));
        static_cast<unsigned char*>(b)[0] = static_cast<unsigned char>(round + t);
      }
      for (void* b : blocks) {
        local += static_cast<unsigned char*>(b)[0];
        heap::free(b);
      }
    }
    sum += local;
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(body, t);
  for (auto& th : pool) th.join();
  return sum.load();
}

// Random sizes with realloc chains: blocks grow and shrink in place or move,
// and their contents must follow.
std::uint64_t realloc_chains(double scale) {
  const long ops = static_cast<long>(600'000 * scale);
  void* live[256] = {};
  std::size_t sizes[256] = {};
  Rng r{9};
  std::uint64_t sum = 0;
  for (long i = 0; i < ops; ++i) {
    const std::size_t slot = r.next() % 256;
    const std::size_t n = 1 + r.next() % (r.next() % 8 == 0 ? 65536 : 2048);
    if (live[slot] != nullptr && read_stamp(live[slot], sizes[slot]) != slot) {
      die("realloc lost a block's contents");
    }
    live[slot] = must(heap::realloc(live[slot], n));
    sizes[slot] = n;
    stamp(live[slot], n, slot);
    sum += n;
  }
  for (void* p : live) heap::free(p);
  return sum;
}

// Large buffers touched once (the GPU user's case: a few big arrays).
std::uint64_t large(double scale) {
  const int rounds = static_cast<int>(8 * scale) + 1;
  std::uint64_t sum = 0;
  for (int round = 0; round < rounds; ++round) {
    std::vector<unsigned char*> arrays;
    for (int k = 0; k < 4; ++k) {
      const std::size_t n = (std::size_t{16} << 20) << (k % 3);  // 16, 32, 64 MiB
      auto* p = static_cast<unsigned char*>(must(heap::malloc(n)));
      for (std::size_t off = 0; off < n; off += 4096) p[off] = static_cast<unsigned char>(off);
      arrays.push_back(p);
    }
    for (unsigned char* p : arrays) {
      sum += p[4096];
      heap::free(p);
    }
  }
  return sum;
}

// Memory at scale (issue 9, section 3). 200 threads that each keep one
// 64-byte block alive until all have allocated.
std::uint64_t threads_200(double) {
  constexpr int kThreads = 200;
  std::vector<void*> blocks(kThreads);
  std::atomic<int> ready{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([&, t] {
      blocks[t] = must(heap::malloc(64));
      static_cast<unsigned char*>(blocks[t])[0] = static_cast<unsigned char>(t);
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();
    });
  }
  for (auto& th : pool) th.join();
  std::uint64_t sum = 0;
  for (void* b : blocks) {
    sum += static_cast<unsigned char*>(b)[0];
    heap::free(b);
  }
  return sum;
}

// numpy.zeros is calloc: one big zeroed array, a few pages read.
std::uint64_t calloc_large(double scale) {
  const std::size_t n = static_cast<std::size_t>((std::size_t{1} << 30) * scale);
  const auto start = std::chrono::steady_clock::now();
  auto* p = static_cast<unsigned char*>(must(heap::calloc(1, n)));
  const std::chrono::duration<double, std::milli> call = std::chrono::steady_clock::now() - start;
  std::fprintf(stderr, "call_ms=%.3f\n", call.count());  // the call itself, for bench/run_bench.py
  std::uint64_t sum = 0;
  for (std::size_t off = 0; off < n; off += n / 16) sum += p[off];
  if (sum != 0) die("calloc memory is not zero");
  heap::free(p);
  return n;
}

// One block grown by 1.5x steps (a vector that never reserves).
std::uint64_t realloc_grow(double scale) {
  const std::size_t limit = static_cast<std::size_t>((std::size_t{1} << 30) * scale);
  std::size_t n = 4096;
  auto* p = static_cast<unsigned char*>(must(heap::malloc(n)));
  std::memset(p, 1, n);
  while (n < limit) {
    const std::size_t grown = n + n / 2;
    p = static_cast<unsigned char*>(must(heap::realloc(p, grown)));
    if (p[n - 1] != 1) die("realloc lost the data");
    std::memset(p + n, 1, grown - n);
    n = grown;
  }
  heap::free(p);
  return n;
}

// Requests no allocator can serve (a size computed from corrupt input, or
// a probe for the limit): each must fail, and fast. (Which errno each
// allocator sets is not timed here: Debian's mimalloc sets EOVERFLOW;
// mnemosyne's ENOMEM is checked by the e2e promises case.)
std::uint64_t impossible(double scale) {
  const long n = static_cast<long>(2000000 * scale);
  volatile std::size_t base = SIZE_MAX;  // the compiler must not see the sizes
  std::uint64_t refused = 0;
  for (long i = 0; i < n; ++i) {
    void* p = heap::malloc(base - static_cast<std::size_t>(i % 4096));
    if (p != nullptr) die("an impossible size was served");
    ++refused;
  }
  return refused;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(
        stderr,
        "usage: workloads NAME [SCALE]; NAME: churn churn-bare larson xmalloc cache-scratch "
        "malloc-simple malloc-thread realloc-chains large threads-200 calloc-large "
        "realloc-grow impossible\n");
    return 2;
  }
#ifdef WORKLOADS_MIMALLOC
  mnemosyne_mi_load();  // the private build has no constructor of its own
#endif
  const std::string name = argv[1];
  const double scale = argc > 2 ? std::atof(argv[2]) : 1.0;
  std::uint64_t sum;
  // The workload alone, start-up (a driver's cuInit, ~0.2 s) excluded: for
  // scripts/gpu-check.sh's throughput table.
  const auto started = std::chrono::steady_clock::now();
  if (name == "churn") {
    sum = churn(scale);
  } else if (name == "churn-bare") {
    sum = churn_bare(scale);
  } else if (name == "larson") {
    sum = larson(scale);
  } else if (name == "xmalloc") {
    sum = xmalloc(scale);
  } else if (name == "cache-scratch") {
    sum = cache_scratch(scale);
  } else if (name == "malloc-simple") {
    sum = simple(scale, 1);
  } else if (name == "malloc-thread") {
    sum = simple(scale, 4);
  } else if (name == "malloc-thread-8") {  // for scripts/gpu-check.sh (16 cores there)
    sum = simple(scale, 8);
  } else if (name == "realloc-chains") {
    sum = realloc_chains(scale);
  } else if (name == "large") {
    sum = large(scale);
  } else if (name == "threads-200") {
    sum = threads_200(scale);
  } else if (name == "calloc-large") {
    sum = calloc_large(scale);
  } else if (name == "realloc-grow") {
    sum = realloc_grow(scale);
  } else if (name == "impossible") {
    sum = impossible(scale);
  } else {
    std::fprintf(stderr, "workloads: unknown workload %s\n", name.c_str());
    return 2;
  }
  const std::chrono::duration<double, std::milli> work = std::chrono::steady_clock::now() - started;
  std::fprintf(stderr, "work_ms=%.3f\n", work.count());
  std::printf("%s ok %llu\n", name.c_str(), static_cast<unsigned long long>(sum));
  return 0;
}
