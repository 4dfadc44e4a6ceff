// An ordinary program that uses every allocation function, from several
// threads, with frees on other threads than the allocating one. Its output
// is deterministic, so it must be byte-identical with and without the
// interposer. With PROBE_POINTERS=FILE it also writes a sample of the
// pointers it got (hex, one a line) for the test to check where they live.
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "mallinfo2_compat.hpp"

namespace {

std::mutex g_pointers_mutex;
FILE* g_pointers = nullptr;

void record(const void* p) {
  if (g_pointers == nullptr || p == nullptr) return;
  std::lock_guard<std::mutex> lock(g_pointers_mutex);
  fprintf(g_pointers, "%p\n", p);
}

int g_failures = 0;
void check(bool ok, const char* what) {
  printf("%-58s %s\n", what, ok ? "ok" : "FAILED");
  if (!ok) ++g_failures;
}

// std::set_new_handler: the handler the program installs is the one called,
// by every form of operator new, until it uninstalls itself; nothrow forms
// turn what it throws into null.
int g_handler_calls = 0;
void handler_three_times() {
  if (++g_handler_calls == 3) std::set_new_handler(nullptr);
}
void handler_throws() {
  ++g_handler_calls;
  throw std::bad_alloc();
}

void new_handler_checks(size_t impossible) {
  const std::align_val_t al{64};
  bool threw = false;
  g_handler_calls = 0;
  std::set_new_handler(handler_three_times);
  try {
    (void)!new char[impossible];
  } catch (const std::bad_alloc&) {
    threw = true;
  }
  check(threw && g_handler_calls == 3, "new calls the program's new-handler, then throws");
  threw = false;
  g_handler_calls = 0;
  std::set_new_handler(handler_three_times);
  try {
    (void)!::operator new(impossible, al);
  } catch (const std::bad_alloc&) {
    threw = true;
  }
  check(threw && g_handler_calls == 3, "aligned new calls the new-handler, then throws");
  g_handler_calls = 0;
  std::set_new_handler(handler_three_times);
  check((new (std::nothrow) char[impossible] == nullptr) && g_handler_calls == 3,
        "nothrow new calls the new-handler, then returns null");
  g_handler_calls = 0;
  std::set_new_handler(handler_three_times);
  check((::operator new(impossible, al, std::nothrow) == nullptr) && g_handler_calls == 3,
        "aligned nothrow new calls the new-handler, then returns null");
  g_handler_calls = 0;
  std::set_new_handler(handler_throws);
  check((new (std::nothrow) char[impossible] == nullptr) && g_handler_calls == 1,
        "nothrow new returns null when the new-handler throws");
  g_handler_calls = 0;
  check((::operator new(impossible, al, std::nothrow) == nullptr) && g_handler_calls == 1,
        "aligned nothrow new returns null when the handler throws");
  std::set_new_handler(nullptr);
}

bool aligned_to(const void* p, size_t a) {
  return (reinterpret_cast<uintptr_t>(p) % a) == 0;
}

void fill(unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>(seed + i * 31);
}
bool verify(const unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != static_cast<unsigned char>(seed + i * 31)) return false;
  }
  return true;
}

struct alignas(256) Wide {
  unsigned char bytes[512];
};

// glibc's own allocator, which the interposer does not replace: a block it
// hands out and the program frees with free() must go back to it (free()'s
// ownership map sends every pointer that is not the arena's there).
extern "C" void* __libc_malloc(size_t size);

void semantics() {
  {
    void* g = __libc_malloc(200);
    if (g != nullptr) memset(g, 7, 200);
    free(g);
    // glibc hands the block it just took back out again (its per-thread
    // cache): only if free() gave it to glibc.
    void* again = __libc_malloc(200);
    check(g != nullptr && again == g, "free() gives a block of glibc's own back to glibc");
    free(again);
  }

  void* a = malloc(0);
  void* b = malloc(0);
  check(a != nullptr && b != nullptr && a != b, "malloc(0) returns unique pointers");
  record(a);
  free(a);
  free(b);

  errno = 0;
  void* c = calloc(SIZE_MAX / 2, 4);
  check(c == nullptr && errno == ENOMEM, "calloc overflow returns NULL with ENOMEM");

  errno = 0;
  void* huge = malloc(SIZE_MAX - 4096);
  check(huge == nullptr && errno == ENOMEM, "malloc(SIZE_MAX - 4096) returns NULL with ENOMEM");

  void* m = nullptr;
  check(posix_memalign(&m, 3, 64) == EINVAL, "posix_memalign rejects alignment 3 (EINVAL)");
  check(posix_memalign(&m, 4096, 100) == 0 && aligned_to(m, 4096), "posix_memalign 4096");
  record(m);
  free(m);

  for (size_t align : {size_t{16}, size_t{64}, size_t{256}, size_t{4096}, size_t{1} << 21,
                       size_t{1} << 24, size_t{1} << 25, size_t{1} << 26}) {
    void* p = aligned_alloc(align, 1000);
    void* q = memalign(align, 3 * align + 5);
    char what[80];
    snprintf(what, sizeof what, "aligned_alloc/memalign honour %zu", align);
    check(p != nullptr && q != nullptr && aligned_to(p, align) && aligned_to(q, align), what);
    if (p != nullptr) memset(p, 1, 1000);
    if (q != nullptr) memset(q, 2, 3 * align + 5);
    record(p);
    record(q);
    free(p);
    free(q);
  }
  void* v = valloc(10);
  void* pv = pvalloc(10);
  check(aligned_to(v, 4096) && aligned_to(pv, 4096) && malloc_usable_size(pv) >= 4096,
        "valloc / pvalloc are page aligned, pvalloc rounds up");
  free(v);
  free(pv);

  check(malloc_usable_size(nullptr) == 0, "malloc_usable_size(NULL) is 0");
  void* u = malloc(100);
  check(malloc_usable_size(u) >= 100, "malloc_usable_size >= requested");
  check(realloc(u, 0) == nullptr, "realloc(p, 0) frees and returns NULL");
  void* r = realloc(nullptr, 50);
  check(r != nullptr, "realloc(NULL, n) allocates");
  fill(static_cast<unsigned char*>(r), 50, 7);
  r = realloc(r, 100000);
  check(r != nullptr && verify(static_cast<unsigned char*>(r), 50, 7), "realloc keeps contents");
  record(r);
  errno = 0;
  void* ra = reallocarray(r, SIZE_MAX / 2, 3);
  check(ra == nullptr && errno == ENOMEM, "reallocarray overflow returns NULL with ENOMEM");
  free(r);

  // glibc's extensions answer sensibly (their figures differ between
  // allocators; only their consistency is printed).
  struct mallinfo2 info = mallinfo2();
  check(info.uordblks <= info.arena || info.arena == 0, "mallinfo2: in use <= arena");
  check(mallopt(M_MMAP_THRESHOLD, 1 << 20) == 1, "mallopt accepts M_MMAP_THRESHOLD");
  const int trimmed = malloc_trim(0);
  check(trimmed == 0 || trimmed == 1, "malloc_trim returns 0 or 1");

  Wide* w = new Wide;
  Wide* wa = new Wide[3];
  check(aligned_to(w, 256) && aligned_to(wa, 256), "new of an alignas(256) type is 256-aligned");
  record(w);
  delete w;
  delete[] wa;

  bool threw = false;
  try {
    volatile size_t n = SIZE_MAX / 2;
    char* x = new char[n];
    x[0] = 1;
  } catch (const std::bad_alloc&) {
    threw = true;
  }
  check(threw, "operator new of an impossible size throws std::bad_alloc");
  volatile size_t impossible = SIZE_MAX / 4;
  check(new (std::nothrow) char[impossible] == nullptr, "nothrow new returns null");
  new_handler_checks(impossible);

  void* big = malloc(size_t{300} << 20);
  check(big != nullptr, "malloc of 300 MiB");
  if (big != nullptr) {
    memset(big, 3, size_t{300} << 20);
    record(big);
  }
  free(big);

  void* bigger = calloc(1, size_t{1100} << 20);
  bool zero = bigger != nullptr;
  for (size_t i = 0; zero && i < (size_t{1100} << 20); i += 1 << 20) {
    zero = static_cast<unsigned char*>(bigger)[i] == 0;
  }
  check(zero, "calloc of 1100 MiB is zeroed");
  record(bigger);
  free(bigger);
}

// Producer/consumer: blocks allocated on one thread are freed on another.
void threads(int nthreads, int rounds) {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<unsigned char*, size_t>> queue;
  std::atomic<int> producers_left{nthreads};
  std::atomic<long> verified{0};
  std::atomic<long> bad{0};

  auto producer = [&](int id) {
    for (int i = 0; i < rounds; ++i) {
      const size_t n = 1 + static_cast<size_t>((i * 7919 + id * 104729) % 70000);
      unsigned char* p;
      switch (i % 6) {
        case 0:
          p = static_cast<unsigned char*>(malloc(n));
          break;
        case 1:
          p = static_cast<unsigned char*>(calloc(n, 1));
          break;
        case 2:
          p = static_cast<unsigned char*>(aligned_alloc(64, n));
          break;
        case 3:
          p = new unsigned char[n];
          break;
        case 4:
          p = static_cast<unsigned char*>(realloc(malloc(n / 2 + 1), n));
          break;
        default: {
          void* q = nullptr;
          if (posix_memalign(&q, 128, n) != 0) q = nullptr;
          p = static_cast<unsigned char*>(q);
        }
      }
      if (p == nullptr) {
        bad++;
        continue;
      }
      if (i % 997 == 0) record(p);
      fill(p, n, static_cast<unsigned>(n));
      std::lock_guard<std::mutex> lock(mu);
      queue.emplace_back(p, n);
      cv.notify_one();
    }
    producers_left--;
    cv.notify_all();
  };
  auto consumer = [&]() {
    for (;;) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return !queue.empty() || producers_left.load() == 0; });
      if (queue.empty()) return;
      auto [p, n] = queue.front();
      queue.pop_front();
      lock.unlock();
      if (verify(p, n, static_cast<unsigned>(n)))
        verified++;
      else
        bad++;
      free(p);  // operator new[] blocks too: same allocator, as glibc allows
    }
  };
  std::vector<std::thread> pool;
  for (int i = 0; i < nthreads; ++i) pool.emplace_back(producer, i);
  for (int i = 0; i < nthreads; ++i) pool.emplace_back(consumer);
  for (auto& t : pool) t.join();
  printf("threads: %d producers, %ld blocks verified, %ld bad\n", nthreads, verified.load(),
         bad.load());
  if (bad.load() != 0) ++g_failures;

  // C++ containers across threads.
  std::vector<std::unique_ptr<std::string>> strings(1000);
  std::thread writer([&] {
    for (size_t i = 0; i < strings.size(); ++i) {
      strings[i] = std::make_unique<std::string>(std::string(i % 300 + 1, char('a' + i % 26)));
    }
  });
  writer.join();
  size_t total = 0;
  std::thread reader([&] {
    for (auto& s : strings) total += s->size();
    strings.clear();
  });
  reader.join();
  printf("strings: %zu bytes\n", total);
}

}  // namespace

int main() {
  if (const char* path = getenv("PROBE_POINTERS")) g_pointers = fopen(path, "w");
  semantics();
  threads(4, 6000);
  if (g_pointers != nullptr) fclose(g_pointers);
  printf("%s\n", g_failures == 0 ? "probe: all checks passed" : "probe: FAILURES");
  return g_failures == 0 ? 0 : 1;
}
