// Fake CUDA driver: where the data of managed memory lives.
//
// fakecuda_migrate_to_device() moves pages "to the device", as a kernel's
// touch or a prefetch does on real hardware: their data goes into a store
// private to the driver, and the CPU mapping is dropped (PROT_NONE after
// MADV_DONTNEED), so mincore calls them not resident although they hold
// data. A CPU touch of such a page migrates it back (a SIGSEGV handler here,
// where the real driver's fault handler runs in the kernel); the driver's
// copy call (cuMemcpyDtoH_v2) reads it where it is, without migrating.
//
// The fault handler takes no lock (the faulting thread may hold the driver's)
// and allocates nothing: ranges live in a fixed table, their stores and
// per-page states in mmap'd memory.
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fakecuda_internal.h"

namespace fakecuda {
namespace {

enum PageState : std::uint8_t { kOnCpu = 0, kOnDevice = 1, kMigrating = 2 };

// One managed block that has had pages on the device.
struct DeviceRange {
  std::atomic<std::uintptr_t> start{0};  // 0: free slot
  std::size_t len = 0;
  unsigned char* store = nullptr;              // the device copy, len bytes
  std::atomic<std::uint8_t>* state = nullptr;  // one per page
};

constexpr int kMaxRanges = 256;
DeviceRange g_ranges[kMaxRanges];
struct sigaction g_previous {};  // the handler ours replaced
std::atomic<bool> g_handler_installed{false};

std::size_t page_size() noexcept {
  return std::size_t(sysconf(_SC_PAGESIZE));
}

DeviceRange* find_range(std::uintptr_t p) noexcept {
  for (DeviceRange& r : g_ranges) {
    const std::uintptr_t s = r.start.load(std::memory_order_acquire);
    if (s != 0 && p - s < r.len) return &r;
  }
  return nullptr;
}

// Brings page `index` of `r` back to the CPU: a filled private page replaces
// the inaccessible one in one mremap, so no thread ever reads it half-copied.
bool migrate_back(DeviceRange& r, std::size_t index) noexcept {
  const std::size_t page = page_size();
  std::uint8_t expected = kOnDevice;
  if (!r.state[index].compare_exchange_strong(expected, kMigrating)) {
    while (r.state[index].load(std::memory_order_acquire) == kMigrating) {
    }
    return true;  // another thread did it, or it was not on the device
  }
  void* tmp = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (tmp == MAP_FAILED) {
    r.state[index].store(kOnDevice, std::memory_order_release);
    return false;
  }
  memcpy(tmp, r.store + index * page, page);
  madvise(tmp, page, MADV_DONTFORK);  // as all of the driver's memory
  void* target = reinterpret_cast<void*>(r.start.load() + index * page);
  const bool ok = mremap(tmp, page, page, MREMAP_MAYMOVE | MREMAP_FIXED, target) != MAP_FAILED;
  if (!ok) munmap(tmp, page);
  r.state[index].store(ok ? kOnCpu : kOnDevice, std::memory_order_release);
  if (ok) g_counters.cpu_migrations.fetch_add(1, std::memory_order_relaxed);
  return ok;
}

void pass_on(int sig, siginfo_t* info, void* context) noexcept {
  const struct sigaction prev = g_previous;
  if ((prev.sa_flags & SA_SIGINFO) != 0 && prev.sa_sigaction != nullptr) {
    prev.sa_sigaction(sig, info, context);
    return;
  }
  if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
    return;
  }
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigaction(sig, &dfl, nullptr);  // the access runs again and gets the default action
}

void on_segv(int sig, siginfo_t* info, void* context) {
  const int saved = errno;
  if (!g_forked.load(std::memory_order_acquire) && info != nullptr && info->si_code > 0) {
    const auto addr = reinterpret_cast<std::uintptr_t>(info->si_addr);
    if (DeviceRange* r = find_range(addr); r != nullptr) {
      const std::size_t index = (addr - r->start.load()) / page_size();
      if (r->state[index].load(std::memory_order_acquire) != kOnCpu && migrate_back(*r, index)) {
        errno = saved;
        return;
      }
    }
  }
  errno = saved;
  pass_on(sig, info, context);
}

void install_handler() noexcept {
  if (g_handler_installed.exchange(true)) return;
  struct sigaction act {};
  act.sa_sigaction = &on_segv;
  act.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&act.sa_mask);
  sigaction(SIGSEGV, &act, &g_previous);
}

// Lock held. The range of the managed block [start, start + len), made on
// first use.
DeviceRange* range_for(std::uintptr_t start, std::size_t len) noexcept {
  if (DeviceRange* r = find_range(start); r != nullptr) return r;
  for (DeviceRange& r : g_ranges) {
    if (r.start.load(std::memory_order_relaxed) != 0) continue;
    void* store = mmap(nullptr, len, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    const std::size_t state_len = len / page_size();
    void* state = mmap(nullptr, state_len, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (store == MAP_FAILED || state == MAP_FAILED) {
      if (store != MAP_FAILED) munmap(store, len);
      if (state != MAP_FAILED) munmap(state, state_len);
      return nullptr;
    }
    madvise(store, len, MADV_DONTFORK);
    madvise(state, state_len, MADV_DONTFORK);
    r.len = len;
    r.store = static_cast<unsigned char*>(store);
    r.state = static_cast<std::atomic<std::uint8_t>*>(state);
    r.start.store(start, std::memory_order_release);
    return &r;
  }
  return nullptr;
}

}  // namespace

long migrate_to_device(std::uintptr_t block, std::size_t block_len, std::uintptr_t p,
                       std::size_t n) noexcept {
  const std::size_t page = page_size();
  const std::uintptr_t first = (p - block) / page;
  const std::uintptr_t last = (p - block + n + page - 1) / page;  // exclusive
  DeviceRange* r = range_for(block, block_len);
  if (r == nullptr) return -1;
  install_handler();
  long moved = 0;
  for (std::uintptr_t i = first; i < last && i < block_len / page; ++i) {
    if (r->state[i].load(std::memory_order_acquire) != kOnCpu) continue;
    auto* cpu = reinterpret_cast<unsigned char*>(block + i * page);
    memcpy(r->store + i * page, cpu, page);
    madvise(cpu, page, MADV_DONTNEED);
    mprotect(cpu, page, PROT_NONE);
    r->state[i].store(kOnDevice, std::memory_order_release);
    ++moved;
  }
  g_counters.pages_to_device.fetch_add(std::uint64_t(moved), std::memory_order_relaxed);
  return moved;
}

bool on_device(std::uintptr_t p) noexcept {
  DeviceRange* r = find_range(p);
  return r != nullptr &&
         r->state[(p - r->start.load()) / page_size()].load(std::memory_order_acquire) != kOnCpu;
}

// Walks [addr, addr + n), in one block whose device range is `r` (or none),
// page piece by page piece: f(addr, len, store) with `store` the piece's bytes
// in the driver when its page is on the device, else nullptr (the CPU's).
template <class F>
void each_piece_where_it_lives(DeviceRange* r, std::uintptr_t addr, std::size_t n, F f) noexcept {
  const std::size_t page = page_size();
  while (n > 0) {
    const std::size_t in_page = page - addr % page;
    const std::size_t len = n < in_page ? n : in_page;
    unsigned char* store = nullptr;
    if (r != nullptr) {
      const std::size_t index = (addr - r->start.load()) / page;
      while (r->state[index].load(std::memory_order_acquire) == kMigrating) {
      }
      if (r->state[index].load(std::memory_order_acquire) == kOnDevice) {
        store = r->store + (addr - r->start.load());
      }
    }
    f(addr, len, store);
    addr += len;
    n -= len;
  }
}

void read_where_it_lives(void* dst, std::uintptr_t src, std::size_t n) noexcept {
  const std::size_t page = page_size();
  auto* out = static_cast<unsigned char*>(dst);
  // Whether the CPU has a page mapped, asked one mincore per window of
  // pages: a copy of a large untouched range (a fork's copy of the tails of
  // blocks nobody wrote) made one system call a page, which no driver
  // costs. Where mincore refuses the window, the page alone; where it
  // refuses that, the page is read.
  constexpr std::size_t kWindow = 512;
  unsigned char residency[kWindow];
  std::uintptr_t window_first = 0;
  std::size_t window_pages = 0;
  const std::uintptr_t end = (src + n + page - 1) / page * page;
  const auto resident = [&](std::uintptr_t page_start) {
    if (page_start < window_first || page_start >= window_first + window_pages * page) {
      window_first = page_start;
      window_pages = (end - page_start) / page < kWindow ? (end - page_start) / page : kWindow;
      if (mincore(reinterpret_cast<void*>(page_start), window_pages * page, residency) != 0) {
        window_pages = 1;
        if (mincore(reinterpret_cast<void*>(page_start), page, residency) != 0) residency[0] = 1;
      }
    }
    return (residency[(page_start - window_first) / page] & 1) != 0;
  };
  // [src, src + n) lies in one block.
  each_piece_where_it_lives(find_range(src), src, n,
                            [&](std::uintptr_t at, std::size_t len, unsigned char* store) {
                              if (store != nullptr) {
                                memcpy(out, store, len);
                              } else if (!resident(at - at % page)) {
                                // A page nobody has touched is not populated anywhere: it reads as
                                // zeros, as the driver knows without touching it.
                                memset(out, 0, len);
                              } else {
                                memcpy(out, reinterpret_cast<const void*>(at), len);
                              }
                              out += len;
                            });
}

void set_where_it_lives(std::uintptr_t dst, std::size_t n, unsigned char value,
                        bool managed) noexcept {
  const std::size_t page = page_size();
  DeviceRange* r = managed ? find_range(dst) : nullptr;  // [dst, dst + n) lies in one block
  // Whole pages of managed memory set to zero: nothing enters host RAM.
  if (managed && value == 0) {
    const std::uintptr_t first = (dst + page - 1) / page * page;
    const std::uintptr_t last = (dst + n) / page * page;
    if (first < last) {
      if (r != nullptr) {  // pages on the device read zero there too
        const std::uintptr_t s = r->start.load();
        madvise(r->store + (first - s), last - first, MADV_DONTNEED);
      }
      madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
      set_where_it_lives(dst, first - dst, value, managed);
      set_where_it_lives(last, dst + n - last, value, managed);
      return;
    }
  }
  each_piece_where_it_lives(
      r, dst, n, [&](std::uintptr_t at, std::size_t len, unsigned char* store) {
        memset(store != nullptr ? store : reinterpret_cast<unsigned char*>(at), value, len);
      });
}

void forget_device_range(std::uintptr_t block) noexcept {
  for (DeviceRange& r : g_ranges) {
    if (r.start.load(std::memory_order_relaxed) != block) continue;
    r.start.store(0, std::memory_order_release);
    munmap(r.store, r.len);
    munmap(static_cast<void*>(r.state), r.len / page_size());
    r.store = nullptr;
    r.state = nullptr;
    return;
  }
}

}  // namespace fakecuda
