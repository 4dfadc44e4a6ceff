// libFuzzer harness: arbitrary sequences of the allocation API over the
// arena and the test-double driver, on two threads at once.
//
// The interposer's own C API code (interpose/linux/malloc_api.cpp and
// cxx_alloc.cpp) is compiled here with MNEMOSYNE_API_PREFIX=fz_, so fz_malloc,
// fz_realloc, ... are exactly the exported functions, running beside the
// fuzzer's own allocator. Every block gets a pattern written over it that is
// checked when it is resized or freed; alignment, malloc_usable_size, errno
// and that no two live blocks overlap are checked on every call.
//
// Input: byte 0 splits the rest into the two threads' programs; each
// operation is 4 bytes: opcode, slot, and a 16-bit size.
#include <dlfcn.h>
#include <errno.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <thread>

#include "arena/arena.hpp"
#include "backend/loader.hpp"
#include "cxx_alloc.hpp"
#include "libc.hpp"
#include "mode.hpp"

extern "C" {
void* fz_malloc(std::size_t size) noexcept;
void fz_free(void* ptr) noexcept;
void* fz_calloc(std::size_t count, std::size_t size) noexcept;
void* fz_realloc(void* ptr, std::size_t size) noexcept;
void* fz_reallocarray(void* ptr, std::size_t count, std::size_t size) noexcept;
int fz_posix_memalign(void** out, std::size_t alignment, std::size_t size) noexcept;
void* fz_aligned_alloc(std::size_t alignment, std::size_t size) noexcept;
void* fz_memalign(std::size_t alignment, std::size_t size) noexcept;
void* fz_valloc(std::size_t size) noexcept;
void* fz_pvalloc(std::size_t size) noexcept;
std::size_t fz_malloc_usable_size(void* ptr) noexcept;
}

// The harness's own loops over block bytes carry no coverage instrumentation:
// they are not what is fuzzed, and would slow every run.
#if defined(__clang__)
#define NOT_FUZZED __attribute__((no_sanitize("coverage")))
#else
#define NOT_FUZZED
#endif

namespace {

using namespace mnemosyne;

[[noreturn]] void fail(const char* what, const void* p = nullptr, std::size_t n = 0) {
  std::fprintf(stderr, "alloc_fuzzer: %s (block %p, %zu bytes)\n", what, p, n);
  std::abort();
}

// How a block came to be, so it is released the matching way.
enum class Kind : std::uint8_t { c, cxx, cxx_array };

struct Block {
  unsigned char* p = nullptr;
  std::size_t size = 0;
  std::size_t align = 0;
  std::uint8_t seed = 0;
  Kind kind = Kind::c;
};

constexpr int kSlots = 64;
Block g_slots[kSlots];
std::mutex g_slot_lock[kSlots];
std::mutex g_live_lock;
std::map<std::uintptr_t, std::uintptr_t> g_live;  // start -> end of every live block

// Bytes written and checked in a block of `size`: all of them up to 256 KiB,
// else the first and last 4 KiB and about 256 bytes spread between (one in
// every 64 KiB at least); of those, the ones below `limit` (what survives a
// realloc).
template <class F>
NOT_FUZZED void each_checked_byte(std::size_t size, std::size_t limit, F f) {
  const auto visit = [&](std::size_t i) {
    if (i < limit) f(i);
  };
  if (size <= 256 * 1024) {
    for (std::size_t i = 0; i < size; ++i) visit(i);
    return;
  }
  for (std::size_t i = 0; i < 4096; ++i) visit(i);
  const std::size_t stride = size / 256 > 65536 ? size / 256 : 65536;
  for (std::size_t i = 4096; i < size - 4096; i += stride) visit(i);
  for (std::size_t i = size - 4096; i < size; ++i) visit(i);
}

NOT_FUZZED unsigned char pattern(std::uint8_t seed, std::size_t i) {
  return static_cast<unsigned char>(seed * 31 + i * 7 + (i >> 9));
}

NOT_FUZZED void fill(const Block& b) {
  each_checked_byte(b.size, b.size, [&](std::size_t i) { b.p[i] = pattern(b.seed, i); });
}

NOT_FUZZED void verify(const Block& b, std::size_t upto) {
  each_checked_byte(b.size, upto, [&](std::size_t i) {
    if (b.p[i] != pattern(b.seed, i)) fail("a block's contents changed", b.p, b.size);
  });
}

// A fresh block: aligned, usable for its size, overlapping no live block.
void admit(Block& b) {
  const auto start = reinterpret_cast<std::uintptr_t>(b.p);
  // malloc's alignment: 16 bytes, as glibc gives, for any block over 8 bytes;
  // a smaller one cannot hold an object that needs more than 8.
  const std::size_t align = b.align != 0 ? b.align : (b.size > 8 ? 16 : 8);
  if (start % align != 0) fail("a block is not aligned as asked", b.p, b.align);
  if (fz_malloc_usable_size(b.p) < b.size) fail("usable size below the request", b.p, b.size);
  const std::uintptr_t end = start + (b.size == 0 ? 1 : b.size);
  std::lock_guard<std::mutex> guard(g_live_lock);
  auto next = g_live.lower_bound(start);
  if (next != g_live.end() && next->first < end) fail("two live blocks overlap", b.p, b.size);
  if (next != g_live.begin() && std::prev(next)->second > start) {
    fail("two live blocks overlap", b.p, b.size);
  }
  g_live[start] = end;
  fill(b);
}

// Before a block goes back: check it and forget its extent.
void retire(const Block& b) {
  verify(b, b.size);
  std::lock_guard<std::mutex> guard(g_live_lock);
  if (g_live.erase(reinterpret_cast<std::uintptr_t>(b.p)) != 1) fail("a block was lost", b.p);
}

void release(Block& b) {
  retire(b);
  if (b.kind == Kind::c) {
    fz_free(b.p);
  } else {
    mnemosyne::fast_free(b.p);  // what every form of operator delete does
  }
  b = Block{};
}

std::size_t decode_size(std::uint16_t v) {
  if (v < 60000) return v % 5000 == 0 ? 0 : v;           // small and medium, and some 0
  if (v < 65000) return std::size_t{v - 60000u} * 4096;  // up to 20 MiB: large and huge pages
  if (v < 65100) return (std::size_t{1} << 30) + std::size_t{v - 65000u} * 4096;  // own segment
  return SIZE_MAX - (65535u - v);  // hopeless: must fail cleanly
}

std::size_t decode_align(std::uint8_t v) {
  return std::size_t{1} << (v % 27);  // 1 .. 64 MiB
}

void expect_nomem(const void* p, const char* what) {
  if (p != nullptr) fail(what);
  if (errno != ENOMEM) fail("a failed allocation did not set errno to ENOMEM");
}

// One operation on a slot; the caller holds the slot's lock.
void run_op(std::uint8_t op, Block& b, std::uint16_t raw, std::uint8_t seed) {
  const std::size_t size = decode_size(raw);
  const bool huge = size > (std::size_t{1} << 46);
  if (b.p != nullptr && op % 17 != 9 && op % 17 != 2 && op % 17 != 3) release(b);
  Block n;
  n.seed = seed;
  n.size = size;
  errno = 0;
  switch (op % 17) {
    case 0:
    case 16:
      n.p = static_cast<unsigned char*>(fz_malloc(size));
      break;
    case 1: {  // calloc, sometimes with an overflowing product
      // A calloc of a segment of its own clears all of it: keep those rare.
      const std::size_t zeroed =
          size >= (std::size_t{1} << 30) && !huge && seed % 16 != 0 ? size % (1 << 20) : size;
      const std::size_t count = raw % 3 == 0 ? (SIZE_MAX / 2 + 2) : 1 + raw % 7;
      const std::size_t each = raw % 3 == 0 ? 2 : zeroed / count;
      n.size = raw % 3 == 0 ? 0 : count * each;
      n.p = static_cast<unsigned char*>(fz_calloc(count, each));
      if (raw % 3 == 0) {
        expect_nomem(n.p, "calloc of an overflowing size succeeded");
        return;
      }
      if (n.p != nullptr) {
        each_checked_byte(n.size, n.size, [&](std::size_t i) {
          if (n.p[i] != 0) fail("calloc memory is not zero", n.p, n.size);
        });
      }
      break;
    }
    case 2:
    case 3: {  // realloc / reallocarray of the slot's block (or of nothing)
      const bool array = op % 17 == 3;
      if (b.p != nullptr && b.kind != Kind::c) {
        release(b);
        return;
      }
      if (b.p != nullptr && b.align > alignof(std::max_align_t)) {
        release(b);  // realloc keeps only malloc's alignment
        return;
      }
      if (b.p != nullptr) retire(b);
      void* q = array ? fz_reallocarray(b.p, 1, size) : fz_realloc(b.p, size);
      if (b.p != nullptr && size == 0) {
        if (q != nullptr) fail("realloc(p, 0) returned a block");
        b = Block{};  // it freed p (glibc's semantics)
        return;
      }
      if (q == nullptr) {
        if (!huge && size != 0) fail("realloc failed", b.p, size);
        if (b.p != nullptr) {  // the old block stays, unchanged
          std::lock_guard<std::mutex> guard(g_live_lock);
          g_live[reinterpret_cast<std::uintptr_t>(b.p)] =
              reinterpret_cast<std::uintptr_t>(b.p) + (b.size == 0 ? 1 : b.size);
        }
        return;
      }
      Block moved = b;
      moved.p = static_cast<unsigned char*>(q);
      verify(moved, b.size < size ? b.size : size);  // what the old block held
      n.p = moved.p;
      b = Block{};
      break;
    }
    case 4:
      n.align = decode_align(seed);
      n.p = static_cast<unsigned char*>(fz_aligned_alloc(n.align, size));
      break;
    case 5: {
      n.align = decode_align(seed) * ((raw & 1) ? 3 : 1);  // some not powers of two
      void* q = nullptr;
      const int rc = fz_posix_memalign(&q, n.align, size);
      const bool valid = (n.align & (n.align - 1)) == 0 && n.align % sizeof(void*) == 0;
      if (!valid) {
        if (rc != EINVAL) fail("posix_memalign took an invalid alignment");
        return;
      }
      if (rc != 0 && rc != ENOMEM) fail("posix_memalign returned an unknown error");
      n.p = static_cast<unsigned char*>(q);
      break;
    }
    case 6: {  // memalign rounds any alignment up
      const std::size_t asked = 1 + seed * 37u % 9000;
      n.p = static_cast<unsigned char*>(fz_memalign(asked, size));
      std::size_t a = 1;
      while (a < asked) a <<= 1;
      n.align = a > alignof(std::max_align_t) ? a : 0;
      break;
    }
    case 7:
      n.align = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
      n.p = static_cast<unsigned char*>(fz_valloc(size));
      break;
    case 8: {
      const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
      n.align = page;
      n.p = static_cast<unsigned char*>(fz_pvalloc(size));
      if (n.p != nullptr) n.size = size == 0 ? page : (size + page - 1) / page * page;
      break;
    }
    case 9:  // the block's usable size, and its contents
      if (b.p != nullptr) {
        if (fz_malloc_usable_size(b.p) < b.size) fail("usable size shrank", b.p, b.size);
        verify(b, b.size);
      } else if (fz_malloc_usable_size(nullptr) != 0) {
        fail("malloc_usable_size(NULL) is not 0");
      }
      return;
    case 10:  // free (done above), and free(NULL)
      fz_free(nullptr);
      return;
    case 11:
    case 12:
    case 13:
      try {
        if (op % 17 == 13) {
          n.align = decode_align(seed);
          n.p = static_cast<unsigned char*>(
              cxx::allocate_aligned(size, static_cast<std::align_val_t>(n.align)));
        } else {
          n.p = static_cast<unsigned char*>(cxx::allocate(size));
        }
        n.kind = op % 17 == 12 ? Kind::cxx_array : Kind::cxx;
      } catch (const std::bad_alloc&) {
        if (!huge) fail("operator new threw bad_alloc", nullptr, size);
        return;
      }
      break;
    case 14:
      n.p = static_cast<unsigned char*>(cxx::allocate_nothrow(size));
      n.kind = Kind::cxx;
      if (n.p == nullptr && !huge) fail("nothrow new failed", nullptr, size);
      break;
    case 15:  // realloc(NULL, n) is malloc
      n.p = static_cast<unsigned char*>(fz_realloc(nullptr, size));
      break;
  }
  if (n.p == nullptr) {
    if (!huge) fail("an allocation failed", nullptr, size);
    if (errno != ENOMEM && op % 17 != 5) fail("a failed allocation left errno unset");
    return;
  }
  if (huge) fail("an impossible allocation succeeded", n.p, size);
  admit(n);
  b = n;
}

std::atomic<std::uint64_t> g_operations{0};

void report_operations() {
  std::fprintf(stderr, "alloc_fuzzer: %llu operations\n",
               static_cast<unsigned long long>(g_operations.load()));
}

void run_program(const std::uint8_t* data, std::size_t size) {
  g_operations.fetch_add(size / 4, std::memory_order_relaxed);
  for (std::size_t i = 0; i + 4 <= size; i += 4) {
    const int slot = data[i + 1] % kSlots;
    const auto raw = static_cast<std::uint16_t>(data[i + 2] | (data[i + 3] << 8));
    std::lock_guard<std::mutex> guard(g_slot_lock[slot]);
    run_op(data[i], g_slots[slot], raw, static_cast<std::uint8_t>(data[i + 1] ^ data[i + 2]));
  }
}

// The second thread lives as long as the fuzzer (a thread per input would
// mostly measure thread start-up): it runs the program it is handed.
class SecondThread {
 public:
  SecondThread() : thread_([this] { loop(); }) {}

  void start(const std::uint8_t* data, std::size_t size) {
    std::lock_guard<std::mutex> guard(lock_);
    data_ = data;
    size_ = size;
    pending_ = true;
    wake_.notify_one();
  }
  void wait() {
    std::unique_lock<std::mutex> guard(lock_);
    wake_.wait(guard, [this] { return !pending_; });
  }

 private:
  void loop() {
    for (;;) {
      std::unique_lock<std::mutex> guard(lock_);
      wake_.wait(guard, [this] { return pending_; });
      guard.unlock();
      run_program(data_, size_);
      guard.lock();
      pending_ = false;
      wake_.notify_all();
    }
  }

  std::mutex lock_;
  std::condition_variable wake_;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  bool pending_ = false;
  std::thread thread_;
};

SecondThread* g_second = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  linux_host::resolve();
  const char* fake = std::getenv("MNEMOSYNE_FUZZ_FAKECUDA");
  set_driver_path(fake != nullptr && *fake ? fake : MNEMOSYNE_FUZZ_FAKECUDA);
  arena::Config cfg;
  cfg.backend = BackendId::unified;
  // glibc's allocator for the host heap, as in the preload library. Under a
  // sanitizer __libc_memalign and memalign are intercepted, and their blocks
  // could not go to __libc_free: glibc's own memalign is taken from libc.
  using MemalignFn = void* (*)(std::size_t, std::size_t);
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  static const auto glibc_memalign =
      reinterpret_cast<MemalignFn>(libc != nullptr ? dlsym(libc, "memalign") : nullptr);
  if (glibc_memalign == nullptr) {
    std::fprintf(stderr, "alloc_fuzzer: glibc's memalign not found\n");
    std::exit(1);
  }
  cfg.host = arena::HostHeap{&__libc_malloc, glibc_memalign};
  arena::StartReport report;
  if (!arena::start(cfg, &report) || report.active != BackendId::unified) {
    std::fprintf(stderr, "alloc_fuzzer: the arena did not start on the test double: %s\n",
                 report.reason);
    std::exit(1);
  }
  g_mode.store(Mode::arena);
  std::atexit(&report_operations);
  g_second = new SecondThread;  // never destroyed: it runs until the process exits
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::size_t split = 1 + (size - 1) * data[0] / 256;
  g_second->start(data + split, size - split);
  run_program(data + 1, split - 1);
  g_second->wait();
  for (int s = 0; s < kSlots; ++s) {
    if (g_slots[s].p != nullptr) release(g_slots[s]);
  }
  if (!g_live.empty()) fail("live blocks left after every slot was released");
  return 0;
}
