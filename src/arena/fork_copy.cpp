// Keeping a forked child's heap.
//
// Memory of the CUDA backends is not inherited by a child created with fork()
// (the driver marks it MADV_DONTFORK, or disables the child's mapping), yet
// the child's heap, mimalloc's metadata included, lives there. So the parent
// copies what the child needs into private anonymous memory ("shadows"),
// which the child inherits and moves to the segments' addresses (mremap).
//
// What is copied: the live ranges of each segment (mimalloc-live.h: segment
// metadata and the blocks each page has handed out; a dedicated block
// whole), whatever mincore says about them:
//  - pages the CPU has mapped, with memcpy;
//  - pages it has not mapped: in managed memory they may hold data that lives
//    on a device, where a CPU read would migrate it back. copy_early() copies
//    those through the backend's copy_out before any atfork handler runs
//    (from the fork() wrapper), leaving pages that read as zero unallocated in
//    the shadow. What it did not copy, prepare_fork() reads with the CPU:
//    correct, at the cost of a migration. In memory whose data is always on
//    the CPU (pinned), an unmapped page was never touched and is skipped.
//
// When the child gets its copy: in a child of a multi-threaded parent,
// glibc's fork() touches the heap before any atfork child handler runs (it
// resets the lock of every FILE). So the child restores every shadow at its
// first touch of a missing segment, from a fault handler
// (restore_child_heap, async-signal-safe), or in child_after_fork, whichever
// comes first.
#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>

#include <mimalloc-live.h>

#include "arena/arena.hpp"
#include "arena/segment_provider.hpp"
#include "arena/state.hpp"
#include "backend/backends.hpp"
#include "backend/loader.hpp"
#include "platform/platform.hpp"

namespace mnemosyne::arena {
namespace {

constexpr std::size_t kMaxShadows = SegmentTable::kCapacity;

struct Shadow {
  void* copy = nullptr;    // private memory the child inherits
  void* target = nullptr;  // the segment's start
  std::size_t size = 0;
  std::uint64_t serial = 0;         // the table entry it copies
  std::uint64_t* early = nullptr;   // copy_early: one bit per page it copied
  std::size_t early_map_bytes = 0;  // that bitmap's mapping
};

// A segment the child lacks and has no copy of (no memory for one).
struct Missing {
  void* start = nullptr;
  std::size_t size = 0;
};

// prepare_fork's shadows, for the child (under the table lock until the fork
// is over). Statics: none of this may allocate.
constinit Shadow g_shadows[kMaxShadows] = {};
constinit std::size_t g_shadow_count = 0;
constinit Missing g_missing[kMaxShadows] = {};
constinit std::size_t g_missing_count = 0;
constinit pid_t g_parent_pid = 0;

// copy_early's shadows, until the prepare_fork of the same thread adopts them.
constinit Shadow g_early[kMaxShadows] = {};
constinit std::size_t g_early_count = 0;
constinit std::atomic<pid_t> g_early_thread{0};  // set once the shadows are complete
constinit SegmentTable::Entry g_snapshot[kMaxShadows] = {};

// kPending from prepare_fork until the fork is over (parent) or the child has
// taken its copy.
enum ChildState : int { kIdle, kPending, kRestored };
constinit std::atomic<int> g_child_state{kIdle};
constinit bool g_child_complete = true;  // in the child: every segment was restored
constinit bool g_in_forked_child = false;

bool inherited(BackendId id) noexcept {
  return g_in_forked_child ||
         with_backend(id, []<MemoryBackend B>() { return B::inherited_by_fork; });
}

bool data_off_cpu(BackendId id) noexcept {
  return with_backend(id, []<MemoryBackend B>() { return B::data_off_cpu; });
}

bool copy_out(BackendId id, void* dst, const void* src, std::size_t size) noexcept {
  return with_backend(id, [&]<MemoryBackend B>() { return B::copy_out(dst, src, size); });
}

void* map_anonymous(std::size_t size) noexcept {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void unmap_shadow(Shadow& s) noexcept {
  if (s.copy != nullptr) munmap(s.copy, s.size);
  if (s.early != nullptr) munmap(s.early, s.early_map_bytes);
  s.copy = nullptr;
  s.early = nullptr;
}

bool is_zero(const unsigned char* p, std::size_t n) noexcept {
  std::uint64_t acc = 0;
  for (std::size_t i = 0; i < n; i += sizeof acc) {
    std::uint64_t w;
    std::memcpy(&w, p + i, sizeof w);
    acc |= w;
  }
  return acc == 0;
}

// One pass over a segment's live ranges: the early pass (through copy_out,
// pages the CPU has not mapped) or the CPU pass (the rest).
struct Pass {
  Shadow* shadow;
  BackendId backend;
  bool early;
  bool off_cpu;              // data_off_cpu(backend)
  unsigned char* residency;  // mincore buffer, kWindowPages entries
  unsigned char* bounce;     // early pass: copy_out's destination
  std::uint64_t bytes = 0;   // written into the shadow
  std::uint64_t via_backend = 0;
};

constexpr std::size_t kWindowPages = std::size_t{1} << 16;  // 256 MiB of 4 KiB pages
constexpr std::size_t kBounceBytes = std::size_t{2} << 20;
constinit unsigned char g_residency[kWindowPages];        // prepare_fork's, under the table lock
constinit unsigned char g_early_residency[kWindowPages];  // copy_early's, under the fork lock

bool early_copied(const Shadow& s, std::size_t page_index) noexcept {
  return s.early != nullptr && (s.early[page_index / 64] >> (page_index % 64) & 1) != 0;
}

// Copies pages [first, first + count) of the segment (CPU pass). The shadow
// pages are faulted in by one madvise first: a fault per 4 KiB page costs
// more than the copy itself (kernels before 5.14 lack it: the copy faults).
void cpu_copy(Pass& pass, std::size_t first, std::size_t count) noexcept {
  const std::size_t page = Os::page_size();
  auto* src = static_cast<const unsigned char*>(pass.shadow->target);
  auto* dst = static_cast<unsigned char*>(pass.shadow->copy);
  madvise(dst + first * page, count * page, MADV_POPULATE_WRITE);
  std::memcpy(dst + first * page, src + first * page, count * page);
  pass.bytes += count * page;
}

// Early pass: pages [first, first + count), which the CPU has not mapped,
// through copy_out, chunk by chunk; zero pages stay unallocated.
void early_copy(Pass& pass, std::size_t first, std::size_t count) noexcept {
  const std::size_t page = Os::page_size();
  Shadow& s = *pass.shadow;
  auto* src = static_cast<const unsigned char*>(s.target);
  auto* dst = static_cast<unsigned char*>(s.copy);
  const std::size_t chunk_pages = kBounceBytes / page;
  for (std::size_t done = 0; done < count;) {
    const std::size_t n = count - done < chunk_pages ? count - done : chunk_pages;
    const std::size_t at = first + done;
    if (copy_out(pass.backend, pass.bounce, src + at * page, n * page)) {
      pass.via_backend += n * page;
      for (std::size_t i = 0; i < n; ++i) {
        const unsigned char* p = pass.bounce + i * page;
        if (!is_zero(p, page)) {
          std::memcpy(dst + (at + i) * page, p, page);
          pass.bytes += page;
        }
        s.early[(at + i) / 64] |= std::uint64_t{1} << ((at + i) % 64);
      }
    }
    done += n;
  }
}

// Handles a run of pages that mincore found unmapped (resident = false) or
// mapped, according to the pass.
void copy_run(Pass& pass, std::size_t first, std::size_t count, bool resident) noexcept {
  if (pass.early) {
    if (!resident) early_copy(pass, first, count);
    return;
  }
  if (resident) {
    cpu_copy(pass, first, count);
    return;
  }
  if (!pass.off_cpu) return;  // never touched: zero in the child too
  // Not copied early (no fork() wrapper, the copy failed, or allocated since):
  // read with the CPU, which migrates the data but reads it right. Pages
  // that read as zero (never touched, most likely) stay unallocated.
  const std::size_t page = Os::page_size();
  auto* src = static_cast<const unsigned char*>(pass.shadow->target);
  auto* dst = static_cast<unsigned char*>(pass.shadow->copy);
  for (std::size_t i = first; i < first + count; ++i) {
    if (early_copied(*pass.shadow, i) || is_zero(src + i * page, page)) continue;
    std::memcpy(dst + i * page, src + i * page, page);
    pass.bytes += page;
  }
}

// mnemosyne_mi_range_fn: one live range of the segment the pass copies.
void copy_range(void* start, std::size_t size, void* arg) noexcept {
  Pass& pass = *static_cast<Pass*>(arg);
  const std::size_t page = Os::page_size();
  auto* base = static_cast<unsigned char*>(pass.shadow->target);
  const std::size_t first =
      static_cast<std::size_t>(static_cast<unsigned char*>(start) - base) / page;
  const std::size_t pages = size / page;
  for (std::size_t off = 0; off < pages; off += kWindowPages) {
    const std::size_t n = pages - off < kWindowPages ? pages - off : kWindowPages;
    unsigned char* window = base + (first + off) * page;
    if (mincore(window, n * page, pass.residency) != 0) {
      // Residency unknown: the CPU pass copies it all, the early pass leaves
      // it to the CPU pass.
      if (!pass.early) cpu_copy(pass, first + off, n);
      continue;
    }
    for (std::size_t i = 0; i < n;) {
      const bool resident = (pass.residency[i] & 1) != 0;
      std::size_t j = i + 1;
      while (j < n && ((pass.residency[j] & 1) != 0) == resident) ++j;
      copy_run(pass, first + off + i, j - i, resident);
      i = j;
    }
  }
}

void copy_segment(const SegmentTable::Entry& e, Pass& pass) noexcept {
  if (e.dedicated || mnemosyne_mi_arena_live(e.segment.start, &copy_range, &pass) == 0) {
    copy_range(e.segment.start, e.segment.size, &pass);  // a dedicated block is live whole
  }
}

// Private memory for the copy of a segment. Not transparent huge pages: the
// copy is sparse (segment metadata, pages in use), and a huge page would
// back 2 MiB for every 4 KiB written.
bool map_shadow(Shadow& s, const SegmentTable::Entry& e, bool with_bitmap) noexcept {
  s.target = e.segment.start;
  s.size = e.segment.size;
  s.serial = e.serial;
  s.copy = map_anonymous(s.size);
  if (s.copy == nullptr) return false;
  if (with_bitmap) {
    const std::size_t pages = s.size / Os::page_size();
    s.early_map_bytes = round_up((pages + 63) / 64 * sizeof(std::uint64_t), Os::page_size());
    s.early = static_cast<std::uint64_t*>(map_anonymous(s.early_map_bytes));
    if (s.early == nullptr) {
      unmap_shadow(s);
      return false;
    }
  }
  return true;
}

void drop_early() noexcept {
  g_early_thread.store(0, std::memory_order_relaxed);
  for (std::size_t i = 0; i < g_early_count; ++i) unmap_shadow(g_early[i]);
  g_early_count = 0;
}

// Moves copy_early's shadow of table entry `serial` into `out`; false when
// there is none.
bool adopt_early(std::uint64_t serial, Shadow& out) noexcept {
  for (std::size_t i = 0; i < g_early_count; ++i) {
    Shadow& s = g_early[i];
    if (s.copy == nullptr || s.serial != serial) continue;
    out.copy = s.copy;
    out.target = s.target;
    out.size = s.size;
    out.serial = s.serial;
    out.early = s.early;
    out.early_map_bytes = s.early_map_bytes;
    s.copy = nullptr;
    s.early = nullptr;
    return true;
  }
  return false;
}

void add_copied(const Pass& pass) noexcept {
  g_state.fork_bytes_copied.fetch_add(pass.bytes, std::memory_order_relaxed);
  g_state.fork_bytes_via_driver.fetch_add(pass.via_backend, std::memory_order_relaxed);
}

}  // namespace

bool copy_early() noexcept {
  drop_early();
  // driver_state(), not driver_api(): a process whose driver was never loaded
  // (the host backend) must not load it to fork.
  if (g_in_forked_child || driver_state() != DriverState::ready) return true;
  std::size_t n = 0;
  {
    SpinGuard guard(g_state.table.lock());
    const SegmentTable::Entry* entries = g_state.table.entries();
    for (std::size_t i = 0; i < g_state.table.high_water(); ++i) {
      const SegmentTable::Entry& e = entries[i];
      if (e.used && !inherited(e.segment.backend) && data_off_cpu(e.segment.backend)) {
        g_snapshot[n++] = e;
      }
    }
  }
  if (n == 0) return true;
  auto* bounce = static_cast<unsigned char*>(map_anonymous(kBounceBytes));
  if (bounce == nullptr) return false;
  bool ok = true;
  for (std::size_t i = 0; i < n && ok; ++i) {
    Shadow& s = g_early[g_early_count];
    if (!map_shadow(s, g_snapshot[i], /*with_bitmap=*/true)) {
      ok = false;
      break;
    }
    ++g_early_count;
    // Arena segments are never released, so reading their metadata here,
    // outside the table lock, is safe; a dedicated block freed meanwhile
    // only makes copy_out fail, and the table no longer lists it.
    Pass pass{&s, g_snapshot[i].segment.backend, true, true, g_early_residency, bounce};
    copy_segment(g_snapshot[i], pass);
    add_copied(pass);
  }
  munmap(bounce, kBounceBytes);
  if (!ok) {
    drop_early();
    return false;
  }
  g_early_thread.store(gettid(), std::memory_order_release);
  return true;
}

void end_early() noexcept {
  if (g_early_thread.load(std::memory_order_acquire) == gettid()) drop_early();
}

void prepare_fork() noexcept {
  g_state.table.lock().lock();  // released in parent_after_fork / child_after_fork
  g_parent_pid = getpid();
  g_shadow_count = 0;
  g_missing_count = 0;
  const bool adopt = g_early_thread.load(std::memory_order_acquire) == gettid();
  const SegmentTable::Entry* entries = g_state.table.entries();
  for (std::size_t i = 0; i < g_state.table.high_water(); ++i) {
    const SegmentTable::Entry& e = entries[i];
    if (!e.used || inherited(e.segment.backend)) continue;
    Shadow& s = g_shadows[g_shadow_count];
    if (!(adopt && adopt_early(e.serial, s)) && !map_shadow(s, e, /*with_bitmap=*/false)) {
      g_missing[g_missing_count++] = Missing{e.segment.start, e.segment.size};
      continue;
    }
    ++g_shadow_count;
    Pass pass{&s, e.segment.backend, false, data_off_cpu(e.segment.backend), g_residency, nullptr};
    copy_segment(e, pass);
    add_copied(pass);
    if (s.early != nullptr) {  // the child has no use for the bitmap
      munmap(s.early, s.early_map_bytes);
      s.early = nullptr;
    }
  }
  if (adopt) drop_early();  // shadows of segments released since copy_early
  g_child_complete = g_missing_count == 0;
  g_child_state.store(kPending, std::memory_order_release);
}

void parent_after_fork() noexcept {
  g_child_state.store(kIdle, std::memory_order_release);
  for (std::size_t i = 0; i < g_shadow_count; ++i) unmap_shadow(g_shadows[i]);
  g_shadow_count = 0;
  g_state.table.lock().unlock();
}

namespace {

// In the child: puts every shadow at its target, and fresh zero memory where
// a segment has no copy, so that nothing glibc touches before
// child_after_fork faults. Runs once, with every signal blocked (no handler
// may touch the heap half-way); async-signal-safe.
void restore_once() noexcept {
  sigset_t all;
  sigset_t old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int expected = kPending;
  if (g_child_state.compare_exchange_strong(expected, kRestored, std::memory_order_acq_rel)) {
    for (std::size_t i = 0; i < g_shadow_count; ++i) {
      Shadow& s = g_shadows[i];
      if (mremap(s.copy, s.size, s.size, MREMAP_MAYMOVE | MREMAP_FIXED, s.target) == MAP_FAILED) {
        g_missing[g_missing_count++] = Missing{s.target, s.size};
        g_child_complete = false;
      }
    }
    for (std::size_t i = 0; i < g_missing_count; ++i) {
      mmap(g_missing[i].start, g_missing[i].size, PROT_READ | PROT_WRITE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    }
    mnemosyne_mi_fork_child();  // the copy is older than the fork: see mimalloc-live.h
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

bool in_copied_segment(const void* addr) noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  const SegmentTable::Entry* entries = g_state.table.entries();
  for (std::size_t i = 0; i < g_state.table.high_water(); ++i) {
    const SegmentTable::Entry& e = entries[i];
    const auto start = reinterpret_cast<std::uintptr_t>(e.segment.start);
    if (e.used && !inherited(e.segment.backend) && a - start < e.segment.size) return true;
  }
  return false;
}

}  // namespace

bool restore_child_heap(const void* addr) noexcept {
  if (g_child_state.load(std::memory_order_acquire) != kPending) return false;
  if (getpid() == g_parent_pid || !in_copied_segment(addr)) return false;
  restore_once();
  return true;
}

bool child_after_fork() noexcept {
  restore_once();
  const bool ok = g_child_complete;
  g_shadow_count = 0;
  g_missing_count = 0;
  // copy_early's shadows, if another thread of the parent was making them,
  // are the parent's: forget them here.
  g_early_count = 0;
  g_early_thread.store(0, std::memory_order_relaxed);
  // The driver must never be called here, and segments are the child's own
  // memory from now on: new ones come from the host backend, and a fork of
  // this child copies nothing.
  g_in_forked_child = true;
  driver_mark_forked_child();
  provider_enter_forked_child();
  g_state.backend.store(BackendId::host);
  g_state.exhausted.store(false);
  pthread_mutex_init(&g_state.grow_lock, nullptr);
  if (!ok) {
    // Some of the heap could not be restored: no arena block may be touched
    // again. Re-tag every segment as an unknown dedicated block, so that a
    // free of one is ignored and its usable size reads 0.
    SegmentTable::Entry* entries = g_state.table.entries();
    for (std::size_t i = 0; i < g_state.table.high_water(); ++i) {
      SegmentTable::Entry& e = entries[i];
      if (!e.used) continue;
      owner_map_set(e.segment.start, e.segment.size,
                    static_cast<std::uint8_t>(kOwnerDedicated | std::uint8_t(e.segment.backend)));
      e.used = false;
    }
  }
  g_state.table.lock().reset();
  return ok;
}

}  // namespace mnemosyne::arena
