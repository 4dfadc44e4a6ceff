// What glibc promises on failure and introspection paths, printed so that a
// run under the interposer can be compared with one without it.
//
//   promise_probe align        memalign / aligned_alloc / posix_memalign with
//                              every kind of invalid alignment: result and errno
//   promise_probe stats-cancel malloc_stats() on a thread with a cancellation
//                              pending (deferred): it must print and return,
//                              the thread being cancelled at the next
//                              cancellation point instead
//   promise_probe impossible   malloc/calloc/realloc/memalign of sizes no
//                              allocator serves: NULL and ENOMEM each time
//   promise_probe too-large    the same in glibc's tst-malloc-too-large's
//                              shape (a small malloc and free before each,
//                              nothing else alive): the count on stdout, the
//                              minor page faults the loop took on stderr
//   promise_probe calloc       calloc of sizes from 1 byte to 128 MiB, each
//                              checked zero, then dirtied and freed, twice
//                              over: fresh memory and reused memory alike
//   promise_probe calloc-big MiB
//                              one calloc of MiB, one byte per MiB read,
//                              freed; the peak RSS on stderr: a calloc that
//                              needs no CPU pass leaves it far below MiB
//   promise_probe mallinfo     mallinfo2/mallinfo while the program allocates
//                              and frees small blocks, a large one, and blocks
//                              an exited thread left: the bytes in use
//                              (uordblks + hblkhd) fall by what is freed, and
//                              never exceed what the heap holds (arena + hblkhd)
//   promise_probe phases KiB N  N blocks of KiB each, every page written,
//                              all freed, 3 s of waiting, the same again:
//                              a checksum on stdout; on stderr what the heap
//                              held (mallinfo2 arena + hblkhd) and the RSS at
//                              each peak and after each wait
//   promise_probe fork-limit MiB
//                              24 MiB of patterned blocks, RLIMIT_AS at the
//                              process's size plus MiB, fork: either fork
//                              fails (ENOMEM) or the child finds every byte;
//                              never a child with wrong data; the program's
//                              RLIMIT_FSIZE (`ulimit -f`) stays as it set it
//   promise_probe stats-live POOL
//                              under the interposer with statistics on: blocks
//                              of every size class and kind (aligned, calloc'd,
//                              realloc'd, huge), half freed by another thread;
//                              POOL's bytes_live (mnemosyne_stats_json) grows
//                              by exactly their malloc_usable_size while they
//                              live and comes back to where it was
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "mallinfo2_compat.hpp"

namespace {

// Sizes and calls the compiler cannot see through: these requests are
// meant to fail, and its checks of them would refuse to build the probe.
std::size_t opaque(std::size_t v) {
  volatile std::size_t x = v;
  return x;
}
void* (*volatile g_realloc)(void*, std::size_t) = &std::realloc;

int mode_align() {
  const std::size_t alignments[] = {0,
                                    1,
                                    3,
                                    sizeof(void*) / 2,
                                    24,
                                    4096,
                                    4097,
                                    SIZE_MAX >> 1,
                                    (SIZE_MAX >> 1) + 1,
                                    (SIZE_MAX >> 1) + 2,
                                    SIZE_MAX};
  for (std::size_t a : alignments) {
    errno = 0;
    void* m = memalign(a, 64);
    const int m_errno = errno;
    errno = 0;
    void* q = aligned_alloc(a, 64);
    const int q_errno = errno;
    void* r = nullptr;
    errno = 0;
    const int r_rc = posix_memalign(&r, a, 64);
    const int r_errno = errno;
    std::printf(
        "alignment %#zx: memalign %s errno %d, aligned_alloc %s errno %d, "
        "posix_memalign %d errno %d\n",
        a, m != nullptr ? "ok" : "NULL", m_errno, q != nullptr ? "ok" : "NULL", q_errno, r_rc,
        r_errno);
    if (m != nullptr && a > 1 && (reinterpret_cast<std::uintptr_t>(m) & (a - 1)) != 0 &&
        (a & (a - 1)) == 0) {
      std::printf("  memalign's block is not aligned\n");
    }
    std::free(m);
    std::free(q);
    if (r_rc == 0) std::free(r);
  }
  // Small alignments of small sizes, many at once (where consecutive small
  // blocks lie): each block as aligned as asked.
  int misaligned = 0;
  void* small[64];
  for (int i = 0; i < 64; ++i) {
    const std::size_t align = std::size_t{2} << (i % 4);               // 2 .. 16
    const std::size_t size = opaque(static_cast<std::size_t>(i % 9));  // 0 .. 8
    small[i] = i % 2 == 0 ? memalign(align, size) : aligned_alloc(align, size);
    // Through a volatile: the compiler assumes memalign's result is aligned
    // and would fold the check away.
    volatile std::uintptr_t address = reinterpret_cast<std::uintptr_t>(small[i]);
    if (small[i] == nullptr || address % align != 0) ++misaligned;
  }
  for (void* b : small) std::free(b);
  std::printf("64 small blocks of alignments 2 to 16: %d not aligned as asked\n", misaligned);
  // A valid alignment with a size whose padding overflows.
  errno = 0;
  void* p = memalign(4096, opaque(SIZE_MAX - 100));
  std::printf("memalign(4096, SIZE_MAX - 100): %s errno %d\n", p ? "ok" : "NULL", errno);
  return 0;
}

volatile bool g_stats_returned = false;

void* stats_thread(void*) {
  pthread_cancel(pthread_self());  // deferred: pending until a cancellation point
  malloc_stats();
  g_stats_returned = true;
  pthread_testcancel();
  return nullptr;
}

int mode_stats_cancel() {
  pthread_t t;
  if (pthread_create(&t, nullptr, stats_thread, nullptr) != 0) return 1;
  void* result = nullptr;
  pthread_join(t, &result);
  std::printf("malloc_stats %s; the thread %s\n", g_stats_returned ? "returned" : "did not return",
              result == PTHREAD_CANCELED ? "was cancelled" : "ran on");
  return 0;
}

int mode_impossible() {
  int refused = 0;
  int wrong = 0;
  for (std::size_t k = 0; k < 4096; k += 64) {
    const std::size_t size = opaque(SIZE_MAX - k);
    errno = 0;
    void* p = std::malloc(size);
    (p == nullptr && errno == ENOMEM) ? ++refused : ++wrong;
    errno = 0;
    p = std::calloc(1, size);
    (p == nullptr && errno == ENOMEM) ? ++refused : ++wrong;
    errno = 0;
    p = memalign(64, size);
    (p == nullptr && errno == ENOMEM) ? ++refused : ++wrong;
    void* keep = std::malloc(32);
    errno = 0;
    p = g_realloc(keep, size);
    (p == nullptr && errno == ENOMEM) ? ++refused : ++wrong;
    std::free(keep);  // a failed realloc leaves the block as it was
    errno = 0;
    p = std::malloc(opaque(static_cast<std::size_t>(PTRDIFF_MAX) + 1 + k));
    (p == nullptr && errno == ENOMEM) ? ++refused : ++wrong;
  }
  std::printf("impossible sizes: %d refused with ENOMEM, %d otherwise\n", refused, wrong);
  return wrong == 0 ? 0 : 1;
}

// glibc's tst-malloc-too-large's shape: sizes from 2^50 up, each request
// after a small malloc and free, with no other small block alive (stdout
// unbuffered), as that test runs. Prints the count on stdout, and on stderr
// the minor page faults the loop took: a failed request that made the
// allocator free its one page and fault it back took 16 each.
int mode_too_large() {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  struct rusage before;
  getrusage(RUSAGE_SELF, &before);
  int refused = 0;
  int wrong = 0;
  for (std::size_t msbs = 1; msbs < 4096; ++msbs) {
    for (const std::size_t size : {msbs << 50, (msbs << 50) | ((std::size_t{1} << 50) - 1)}) {
      for (int call = 0; call < 4; ++call) {
        void* volatile small = std::malloc(16);
        std::free(small);
        void* keep = call == 3 ? std::malloc(16) : nullptr;
        errno = 0;
        void* p = call == 0   ? std::malloc(opaque(size))
                  : call == 1 ? std::calloc(1, opaque(size))
                  : call == 2 ? memalign(64, opaque(size))
                              : g_realloc(keep, opaque(size));
        (p == nullptr && errno == ENOMEM) ? ++refused : ++wrong;
        std::free(keep);
      }
    }
  }
  struct rusage after;
  getrusage(RUSAGE_SELF, &after);
  std::printf("too-large sizes: %d refused with ENOMEM, %d otherwise\n", refused, wrong);
  std::fprintf(stderr, "faults=%ld\n", after.ru_minflt - before.ru_minflt);
  return wrong == 0 ? 0 : 1;
}

constexpr int kBlocks = 384;
constexpr std::size_t kBlockBytes = 64 * 1024;

unsigned char pattern(int block, std::size_t i) {
  return static_cast<unsigned char>((block * 131 + i * 7 + 1) & 0xff) | 1;  // never 0
}

int mode_fork_limit(long mib) {
  unsigned char* blocks[kBlocks];
  for (int b = 0; b < kBlocks; ++b) {
    blocks[b] = static_cast<unsigned char*>(std::malloc(kBlockBytes));
    if (blocks[b] == nullptr) return 2;
    for (std::size_t i = 0; i < kBlockBytes; ++i) blocks[b][i] = pattern(b, i);
  }
  unsigned long pages = 0;
  FILE* statm = std::fopen("/proc/self/statm", "r");
  if (statm == nullptr || std::fscanf(statm, "%lu", &pages) != 1) return 2;
  std::fclose(statm);
  struct rlimit lim {};
  lim.rlim_cur = lim.rlim_max =
      static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) +
      (static_cast<rlim_t>(mib) << 20);
  if (setrlimit(RLIMIT_AS, &lim) != 0) {
    std::perror("setrlimit");
    return 2;
  }
  struct rlimit fsize_before {};
  getrlimit(RLIMIT_FSIZE, &fsize_before);
  auto same_fsize = [&fsize_before] {
    struct rlimit now {};
    getrlimit(RLIMIT_FSIZE, &now);
    return now.rlim_cur == fsize_before.rlim_cur && now.rlim_max == fsize_before.rlim_max;
  };
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid != 0 && !same_fsize()) std::printf("the parent's RLIMIT_FSIZE changed\n");
  if (pid < 0) {
    // Allowed: a fork that cannot give the child its heap fails, cleanly.
    std::printf("fork failed: %s\n", errno == ENOMEM ? "ENOMEM" : std::strerror(errno));
    return 0;
  }
  if (pid == 0) {
    long wrong = 0;
    for (int b = 0; b < kBlocks; ++b) {
      for (std::size_t i = 0; i < kBlockBytes; ++i) wrong += blocks[b][i] != pattern(b, i);
    }
    if (!same_fsize()) _exit(4);
    _exit(wrong == 0 ? 0 : 3);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    std::printf("fork: the child found every byte\n");
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == 3) {
    std::printf("fork: THE CHILD READ WRONG DATA\n");
    return 1;
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == 4) {
    std::printf("fork: the child's RLIMIT_FSIZE differs from its parent's\n");
    return 1;
  } else {
    std::printf("fork: the child died (%s %d)\n", WIFSIGNALED(status) ? "signal" : "exit",
                WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    return 1;
  }
  for (int b = 0; b < kBlocks; ++b) std::free(blocks[b]);
  return 0;
}

int mode_calloc() {
  int sizes = 0;
  int dirty = 0;
  for (int round = 0; round < 2; ++round) {
    for (std::size_t n = 1; n <= (std::size_t{128} << 20); n = n * 3 + 5) {
      unsigned char* p = static_cast<unsigned char*>(std::calloc(n, 1));
      if (p == nullptr) {
        std::printf("calloc(%zu, 1) failed\n", n);
        return 1;
      }
      static const unsigned char kZeros[4096] = {};
      for (std::size_t i = 0; i < n; i += sizeof kZeros) {
        const std::size_t len = n - i < sizeof kZeros ? n - i : sizeof kZeros;
        if (std::memcmp(p + i, kZeros, len) != 0) {
          ++dirty;
          break;
        }
      }
      std::memset(p, 0x5a, n);  // what the next round may get back
      std::free(p);
      ++sizes;
    }
  }
  std::printf("calloc: %d sizes, %d with a byte that is not zero\n", sizes, dirty);
  return dirty == 0 ? 0 : 1;
}

int mode_calloc_big(long mib) {
  const std::size_t n = static_cast<std::size_t>(mib) << 20;
  auto* p = static_cast<volatile unsigned char*>(std::calloc(n, 1));
  if (p == nullptr) {
    std::printf("calloc of %ld MiB failed\n", mib);
    return 1;
  }
  // One byte per MiB, at an offset that moves through the pages: reading a
  // page can populate it (it does on some kernels), and the peak RSS is the
  // point. promise_probe calloc checks every byte of smaller blocks.
  std::size_t dirty = 0;
  for (std::size_t mib_at = 0; mib_at < n; mib_at += std::size_t{1} << 20) {
    dirty += p[mib_at + (mib_at / 4096 * 4099) % (std::size_t{1} << 20)] != 0;
  }
  dirty += p[n - 1] != 0;
  std::free(const_cast<unsigned char*>(p));
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::printf("calloc of %ld MiB: %zu sampled bytes are not zero\n", mib, dirty);
  std::fprintf(stderr, "maxrss_kib=%ld\n", usage.ru_maxrss);
  return dirty == 0 ? 0 : 1;
}

long rss_kib() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  long pages = 0;
  long resident = 0;
  if (f != nullptr) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

int mode_phases(long kib, long count) {
  const std::size_t size = static_cast<std::size_t>(kib) << 10;
  std::uint64_t sum = 0;
  for (int phase = 0; phase < 2; ++phase) {
    auto** blocks = static_cast<unsigned char**>(std::malloc(sizeof(void*) * count));
    if (blocks == nullptr) return 1;
    for (long i = 0; i < count; ++i) {
      blocks[i] = static_cast<unsigned char*>(std::malloc(size));
      if (blocks[i] == nullptr) {
        std::printf("malloc of block %ld failed\n", i);
        return 1;
      }
      for (std::size_t at = 0; at < size; at += 4096) blocks[i][at] = static_cast<unsigned char>(i);
    }
    for (long i = 0; i < count; ++i) sum += blocks[i][size - 1] + blocks[i][0];
    const struct mallinfo2 peak = mallinfo2();
    const long peak_rss = rss_kib();
    for (long i = 0; i < count; ++i) std::free(blocks[i]);
    std::free(blocks);
    sleep(3);
    const struct mallinfo2 after = mallinfo2();
    std::fprintf(stderr,
                 "phase=%d held_peak_mib=%zu held_after_mib=%zu rss_peak_mib=%ld "
                 "rss_after_mib=%ld\n",
                 phase, (peak.arena + peak.hblkhd) >> 20, (after.arena + after.hblkhd) >> 20,
                 peak_rss >> 10, rss_kib() >> 10);
  }
  std::printf("phases: %ld blocks of %ld KiB twice, checksum %llu\n", count, kib,
              static_cast<unsigned long long>(sum));
  return 0;
}

// What a program watching its heap reads from mallinfo2.
struct Heap {
  std::size_t in_use;
  std::size_t held;
};
Heap heap_now() {
  const struct mallinfo2 m = mallinfo2();
  return Heap{m.uordblks + m.hblkhd, m.arena + m.hblkhd};
}

int g_mallinfo_failures = 0;
void say(const char* what, bool ok) {
  std::printf("%s: %s\n", what, ok ? "yes" : "NO");
  if (!ok) ++g_mallinfo_failures;
}
// The same, with the two readings compared on stderr when the check fails.
void say(const char* what, bool ok, const Heap& before, const Heap& after) {
  say(what, ok);
  if (!ok) {
    std::fprintf(stderr, "%s: in use %zu then %zu, held %zu then %zu\n", what, before.in_use,
                 after.in_use, before.held, after.held);
  }
}

constexpr std::size_t kMiB = std::size_t{1} << 20;
char* volatile g_keep;
constexpr std::size_t kSmall = 4000;
constexpr int kSmallCount = static_cast<int>(96 * kMiB / kSmall);

void* thread_leaves_blocks(void* out) {
  void** blocks = static_cast<void**>(out);
  for (int i = 0; i < kSmallCount / 3; ++i) {
    blocks[i] = std::malloc(kSmall);
    std::memset(blocks[i], 1, kSmall);
  }
  return nullptr;
}

// Each figure is compared between two moments with no driver call between
// them: growing the heap calls the driver, whose own host memory (glibc's,
// counted too) comes and goes with its calls.
int mode_mallinfo() {
  static void* blocks[kSmallCount];
  const std::size_t small_total = kSmallCount * kSmall;

  for (int i = 0; i < kSmallCount; ++i) {
    blocks[i] = std::malloc(kSmall);
    std::memset(blocks[i], 2, kSmall);
  }
  const Heap filled = heap_now();
  say("in use <= held", filled.in_use <= filled.held);
  // Deprecated, and still what older programs call.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  const struct mallinfo old = mallinfo();
#pragma GCC diagnostic pop
  say("mallinfo (int) counts them too",
      static_cast<std::size_t>(old.uordblks) + static_cast<std::size_t>(old.hblkhd) >= small_total);
  for (int i = 0; i < kSmallCount; ++i) std::free(blocks[i]);
  const Heap freed = heap_now();
  say("96 MiB of small blocks, freed: in use fell by at least 90% of that",
      filled.in_use >= freed.in_use + small_total / 10 * 9, filled, freed);
  say("96 MiB of small blocks, freed: in use fell by less than twice that",
      filled.in_use < freed.in_use + 2 * small_total, filled, freed);

  const std::size_t large_size = 256 * kMiB;
  char* large = static_cast<char*>(std::malloc(large_size));
  std::memset(large, 3, large_size);
  g_keep = large;  // the compiler may not drop the block
  const Heap with_large = heap_now();
  say("in use <= held", with_large.in_use <= with_large.held);
  std::free(large);
  const Heap without_large = heap_now();
  // Less 64 KiB: the driver's threads may allocate between the two readings
  // (seen under pinned: in use fell by 2,432 bytes less than the block).
  say("a 256 MiB block, freed: in use fell by at least that",
      with_large.in_use + 64 * 1024 >= without_large.in_use + large_size, with_large,
      without_large);

  pthread_t thread;
  pthread_create(&thread, nullptr, thread_leaves_blocks, blocks);
  pthread_join(thread, nullptr);
  const Heap left = heap_now();
  const std::size_t left_total = (kSmallCount / 3) * kSmall;
  for (int i = 0; i < kSmallCount / 3; ++i) std::free(blocks[i]);
  const Heap left_freed = heap_now();
  say("32 MiB an exited thread left, freed here: in use fell by at least 90% of that",
      left.in_use >= left_freed.in_use + left_total / 10 * 9, left, left_freed);
  return g_mallinfo_failures == 0 ? 0 : 1;
}

// POOL's bytes_live now, read from mnemosyne_stats_json (its string freed).
long long live_bytes(char* (*stats)(), const char* pool) {
  char* json = stats();
  if (json == nullptr) return -1;
  char key[64];
  std::snprintf(key, sizeof key, "\"%s\": {", pool);
  long long live = -1;
  if (const char* at = std::strstr(json, key)) {
    if (const char* field = std::strstr(at, "\"bytes_live\": ")) {
      live = std::strtoll(field + std::strlen("\"bytes_live\": "), nullptr, 10);
    }
  }
  std::free(json);
  return live;
}

struct CrossFree {
  void** blocks;
  int count;
  pthread_barrier_t* go;
};

void* cross_free_thread(void* arg) {
  auto* work = static_cast<CrossFree*>(arg);
  pthread_barrier_wait(work->go);  // the blocks are made
  for (int i = 0; i < work->count; i += 2) std::free(work->blocks[i]);
  pthread_barrier_wait(work->go);  // freed
  return nullptr;
}

int mode_stats_live(const char* pool) {
  using StatsFn = char* (*)();
  const auto stats = reinterpret_cast<StatsFn>(dlsym(RTLD_DEFAULT, "mnemosyne_stats_json"));
  if (stats == nullptr) {
    std::printf("no mnemosyne_stats_json: not under the interposer\n");
    return 1;
  }
  // The thread, and stdout's buffer, before the first reading: what they
  // allocate is not the blocks'.
  std::printf("stats-live [%s]\n", pool);
  std::fflush(stdout);
  constexpr int kCount = 64;
  void* blocks[kCount] = {};
  pthread_barrier_t go;
  pthread_barrier_init(&go, nullptr, 2);
  CrossFree work{blocks, kCount, &go};
  pthread_t t;
  if (pthread_create(&t, nullptr, cross_free_thread, &work) != 0) return 1;

  const long long before = live_bytes(stats, pool);
  const std::size_t sizes[] = {1,        8,        16,        24,       100,    512,
                               1000,     4096,     10000,     70000,    300000, 1u << 20,
                               2u << 20, 5u << 20, 20u << 20, 40u << 20};
  constexpr int kSizes = sizeof sizes / sizeof sizes[0];
  long long usable = 0;
  for (int i = 0; i < kCount; ++i) {
    const std::size_t size = opaque(sizes[i % kSizes]);
    void* p = nullptr;
    switch (i / kSizes) {
      case 0:
        p = std::malloc(size);
        break;
      case 1:
        p = std::calloc(1, size);
        break;
      case 2:
        if (posix_memalign(&p, i % 2 != 0 ? 4096 : 64, size) != 0) p = nullptr;
        break;
      default:
        p = g_realloc(std::malloc(size / 2 + 1), size);
        break;  // grown from half
    }
    if (p == nullptr) return 1;
    std::memset(p, 0x5a, size < 4096 ? size : 4096);
    blocks[i] = p;
    usable += static_cast<long long>(malloc_usable_size(p));
  }
  const long long held = live_bytes(stats, pool);
  pthread_barrier_wait(&go);  // the other thread frees the even blocks
  pthread_barrier_wait(&go);
  for (int i = 1; i < kCount; i += 2) std::free(blocks[i]);
  const long long after = live_bytes(stats, pool);
  pthread_join(t, nullptr);
  std::printf("%s: live grew by %s while the blocks lived, and came back %s\n", pool,
              held - before == usable ? "their usable size" : "another amount",
              after == before ? "to where it was" : "elsewhere");
  if (held - before != usable || after != before) {
    std::fprintf(stderr, "before %lld, held %lld (blocks' usable size %lld), after %lld\n", before,
                 held, usable, after);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "align") == 0) return mode_align();
  if (argc >= 2 && std::strcmp(argv[1], "stats-cancel") == 0) return mode_stats_cancel();
  if (argc >= 2 && std::strcmp(argv[1], "impossible") == 0) return mode_impossible();
  if (argc >= 2 && std::strcmp(argv[1], "too-large") == 0) return mode_too_large();
  if (argc >= 2 && std::strcmp(argv[1], "mallinfo") == 0) return mode_mallinfo();
  if (argc >= 2 && std::strcmp(argv[1], "calloc") == 0) return mode_calloc();
  if (argc >= 3 && std::strcmp(argv[1], "calloc-big") == 0) {
    return mode_calloc_big(std::strtol(argv[2], nullptr, 10));
  }
  if (argc >= 4 && std::strcmp(argv[1], "phases") == 0) {
    return mode_phases(std::strtol(argv[2], nullptr, 10), std::strtol(argv[3], nullptr, 10));
  }
  if (argc >= 3 && std::strcmp(argv[1], "fork-limit") == 0) {
    return mode_fork_limit(std::strtol(argv[2], nullptr, 10));
  }
  if (argc >= 3 && std::strcmp(argv[1], "stats-live") == 0) return mode_stats_live(argv[2]);
  std::fprintf(stderr,
               "usage: promise_probe align|stats-cancel|impossible|too-large|calloc|calloc-big MiB|"
               "mallinfo|"
               "phases KiB N|fork-limit MiB|stats-live POOL\n");
  return 2;
}
