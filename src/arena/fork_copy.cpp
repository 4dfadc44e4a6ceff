// Keeping a forked child's heap.
//
// Memory of the CUDA backends is not inherited by a child created with fork()
// (the driver marks it MADV_DONTFORK, or disables the child's mapping), yet
// the child's heap, mimalloc's metadata included, lives there. So the parent
// writes what the child needs into an image: a memfd whose file offsets are
// the segments' addresses (a sparse file: only what is written takes
// memory). The child inherits the descriptor and maps the image privately at
// those addresses, copy-on-write, as fork() would have shared the pages.
// Writing the image with pwrite() copies each byte once, into page-cache
// pages the kernel does not zero first; the parent maps nothing new and
// unmaps nothing after the fork (it closes the descriptor). An anonymous
// copy, populated and then written, cost the kernel's zero-fill and, on
// virtual machines that shadow page tables, a trap per page the first time
// it was written.
//
// What is copied: the live ranges of each segment (mimalloc-live.h: segment
// metadata and the blocks each page has handed out; a dedicated block
// whole), whatever mincore says about them:
//  - pages the CPU has mapped, written from where they are;
//  - pages it has not mapped: in managed memory they may hold data that lives
//    on a device, where a CPU read would migrate it back. copy_early() copies
//    those through the backend's copy_out before any atfork handler runs
//    (from the fork() wrapper), leaving pages that read as zero out of the
//    image. What it did not copy, prepare_fork() reads with the CPU:
//    correct, at the cost of a migration. In pinned memory the CPU reads
//    them in place (copy_run says why), the zero ones left out.
//
// When the child gets its copy: in a child of a multi-threaded parent,
// glibc's fork() touches the heap before any atfork child handler runs (it
// resets the lock of every FILE). So the child maps the image at its first
// touch of a missing segment, from a fault handler (restore_child_heap,
// async-signal-safe), or in child_after_fork, whichever comes first.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
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
// The image's size: every user address (ownership_map.hpp) is an offset.
constexpr off_t kImageBytes = off_t{1} << kAddressBits;

// A segment the child gets from the image.
struct Shadow {
  void* target = nullptr;  // the segment's start, and its offset in the image
  std::size_t size = 0;
  std::uint64_t serial = 0;         // the table entry it copies
  std::uint64_t* early = nullptr;   // copy_early: one bit per page it copied
  std::size_t early_map_bytes = 0;  // that bitmap's mapping
};

// A segment the child lacks and has no copy of (the image could not take it).
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
constinit int g_image = -1;  // the fork's image (memfd), shared by both passes

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

bool inherited(BackendId id) noexcept {
  return g_state.forked_child ||
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

// RLIMIT_FSIZE applies to the image (a memfd is a file, and its offsets are
// addresses): over the limit, ftruncate and pwrite fail with EFBIG and the
// kernel sends the thread SIGXFSZ, whose default action kills the program.
// So for the copy the soft limit is lifted to the hard one, and put back
// before the fork itself (the child inherits the program's own). The limit
// is the process's: while the early copy runs (before other threads are
// held), a file another thread writes past the program's soft limit is not
// stopped by it. With a finite hard limit the image cannot be made at all:
// open_image fails, and so does the fork (ENOMEM) where the wrapper can
// still refuse it.
constinit rlim_t g_fsize_soft = RLIM_INFINITY;  // the program's, while lifted
constinit bool g_fsize_lifted = false;

bool lift_file_size_limit() noexcept {
  struct rlimit lim {};
  if (getrlimit(RLIMIT_FSIZE, &lim) != 0) return true;
  if (lim.rlim_max != RLIM_INFINITY) return false;
  if (lim.rlim_cur == RLIM_INFINITY || g_fsize_lifted) return true;
  g_fsize_soft = lim.rlim_cur;
  lim.rlim_cur = RLIM_INFINITY;
  if (setrlimit(RLIMIT_FSIZE, &lim) != 0) return false;
  g_fsize_lifted = true;
  return true;
}

void restore_file_size_limit() noexcept {
  if (!g_fsize_lifted) return;
  struct rlimit lim {};
  lim.rlim_cur = g_fsize_soft;
  lim.rlim_max = RLIM_INFINITY;
  setrlimit(RLIMIT_FSIZE, &lim);
  g_fsize_lifted = false;
}

// The fork's image, made once per fork (both passes write into it). A memfd;
// close-on-exec, so that a child that execs without touching its heap leaves
// it behind.
bool open_image() noexcept {
  if (g_image >= 0) return true;
  if (!lift_file_size_limit()) return false;
  const int fd = memfd_create("mnemosyne-fork-heap", MFD_CLOEXEC);
  if (fd < 0) return false;
  if (ftruncate(fd, kImageBytes) != 0) {
    close(fd);
    return false;
  }
  g_image = fd;
  return true;
}

void close_image() noexcept {
  if (g_image >= 0) close(g_image);
  g_image = -1;
  restore_file_size_limit();
}

// Writes [src, src + size) into the image at `at`'s offset. False when the
// image could not take it (no memory). The kernel reads the source itself;
// where it cannot (EFAULT: memory whose pages a driver maps in only from its
// own fault handler, as the test double does with pages it holds "on the
// device"), the bytes go through a buffer, read by this thread.
constinit unsigned char g_fault_bounce[64 * 1024];  // under the fork lock

bool write_image(const void* at, const void* src, std::size_t size) noexcept {
  auto* from = static_cast<const unsigned char*>(src);
  auto offset = static_cast<off_t>(reinterpret_cast<std::uintptr_t>(at));
  while (size > 0) {
    ssize_t n = pwrite(g_image, from, size, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EFAULT) {
      const std::size_t piece = size < sizeof g_fault_bounce ? size : sizeof g_fault_bounce;
      std::memcpy(g_fault_bounce, from, piece);
      n = pwrite(g_image, g_fault_bounce, piece, offset);
      if (n < 0 && errno == EINTR) continue;
    }
    if (n <= 0) return false;
    from += n;
    offset += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

void drop_bitmap(Shadow& s) noexcept {
  if (s.early != nullptr) munmap(s.early, s.early_map_bytes);
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
  unsigned char* residency;  // mincore buffer, kWindowPages entries
  unsigned char* bounce;     // early pass: copy_out's destination
  std::uint64_t bytes = 0;   // written into the image
  std::uint64_t via_backend = 0;
  bool failed = false;  // the image could not take a write
  // Live ranges that touch are handled as one (a full page's blocks end
  // where the next page's begin): one mincore and one write for a run of
  // them, not one per page.
  unsigned char* pending = nullptr;
  std::size_t pending_size = 0;
};

constexpr std::size_t kWindowPages = std::size_t{1} << 16;  // 256 MiB of 4 KiB pages
constexpr std::size_t kBounceBytes = std::size_t{2} << 20;
constinit unsigned char g_residency[kWindowPages];        // prepare_fork's, under the table lock
constinit unsigned char g_early_residency[kWindowPages];  // copy_early's, under the fork lock

bool early_copied(const Shadow& s, std::size_t page_index) noexcept {
  return s.early != nullptr && (s.early[page_index / 64] >> (page_index % 64) & 1) != 0;
}

void put(Pass& pass, const unsigned char* at, const unsigned char* src, std::size_t size) noexcept {
  if (!write_image(at, src, size)) {
    pass.failed = true;
    return;
  }
  pass.bytes += size;
}

// Copies pages [first, first + count) of the segment as they are (CPU pass).
void cpu_copy(Pass& pass, std::size_t first, std::size_t count) noexcept {
  const std::size_t page = Os::page_size();
  auto* base = static_cast<const unsigned char*>(pass.shadow->target);
  put(pass, base + first * page, base + first * page, count * page);
}

// Early pass: pages [first, first + count), which the CPU has not mapped,
// through copy_out, chunk by chunk; zero pages stay out of the image.
void early_copy(Pass& pass, std::size_t first, std::size_t count) noexcept {
  const std::size_t page = Os::page_size();
  Shadow& s = *pass.shadow;
  auto* base = static_cast<const unsigned char*>(s.target);
  const std::size_t chunk_pages = kBounceBytes / page;
  for (std::size_t done = 0; done < count;) {
    const std::size_t n = count - done < chunk_pages ? count - done : chunk_pages;
    const std::size_t at = first + done;
    if (copy_out(pass.backend, pass.bounce, base + at * page, n * page)) {
      pass.via_backend += n * page;
      // Runs of non-zero pages, each in one write.
      for (std::size_t i = 0; i < n;) {
        if (is_zero(pass.bounce + i * page, page)) {
          ++i;
          continue;
        }
        std::size_t j = i + 1;
        while (j < n && !is_zero(pass.bounce + j * page, page)) ++j;
        put(pass, base + (at + i) * page, pass.bounce + i * page, (j - i) * page);
        i = j;
      }
      for (std::size_t i = 0; i < n; ++i) {
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
  // Managed memory not copied early (no fork() wrapper, the copy failed, or
  // allocated since): read with the CPU, which migrates the data but reads
  // it right. Pinned memory: a page never touched reads zero, but what
  // mincore says of the driver's own mappings (cuMemHostAlloc's; PIN=vmm's
  // are VM_MIXEDMAP, "mm" in smaps on an H200) is not documented, and a
  // kernel's writes map no page for the CPU: read too. Pages that read as
  // zero stay out of the image.
  // Parts of a reservation not backed now hold nothing, and may not be read
  // (the driver's inaccessible address space under PIN=vmm).
  const std::size_t page = Os::page_size();
  auto* base = static_cast<const unsigned char*>(pass.shadow->target);
  const bool all_readable = segment_readable(base + first * page, count * page);
  for (std::size_t i = first; i < first + count; ++i) {
    if (early_copied(*pass.shadow, i)) continue;
    if (!all_readable && !segment_readable(base + i * page, page)) continue;
    if (is_zero(base + i * page, page)) continue;
    put(pass, base + i * page, base + i * page, page);
  }
}

// One run of live ranges of the segment the pass copies.
void copy_live(Pass& pass, void* start, std::size_t size) noexcept {
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

void flush(Pass& pass) noexcept {
  if (pass.pending_size != 0) copy_live(pass, pass.pending, pass.pending_size);
  pass.pending_size = 0;
}

// mnemosyne_mi_range_fn: one live range; they come in address order.
void copy_range(void* start, std::size_t size, void* arg) noexcept {
  Pass& pass = *static_cast<Pass*>(arg);
  auto* at = static_cast<unsigned char*>(start);
  if (pass.pending_size != 0 && pass.pending + pass.pending_size == at) {
    pass.pending_size += size;
    return;
  }
  flush(pass);
  pass.pending = at;
  pass.pending_size = size;
}

void copy_segment(const SegmentTable::Entry& e, Pass& pass) noexcept {
  if (e.dedicated || mnemosyne_mi_arena_live(e.segment.start, &copy_range, &pass) == 0) {
    copy_range(e.segment.start, e.segment.size, &pass);  // a dedicated block is live whole
  }
  flush(pass);
}

void describe(Shadow& s, const SegmentTable::Entry& e) noexcept {
  s.target = e.segment.start;
  s.size = e.segment.size;
  s.serial = e.serial;
  s.early = nullptr;
}

// copy_early's bitmap of the pages it copied.
bool map_bitmap(Shadow& s) noexcept {
  const std::size_t pages = s.size / Os::page_size();
  s.early_map_bytes = round_up((pages + 63) / 64 * sizeof(std::uint64_t), Os::page_size());
  s.early = static_cast<std::uint64_t*>(map_anonymous(s.early_map_bytes));
  return s.early != nullptr;
}

void drop_early() noexcept {
  g_early_thread.store(0, std::memory_order_relaxed);
  for (std::size_t i = 0; i < g_early_count; ++i) drop_bitmap(g_early[i]);
  g_early_count = 0;
}

// Moves copy_early's bitmap of table entry `serial` into `out`; false when
// there is none (the image is shared: nothing else moves).
bool adopt_early(std::uint64_t serial, Shadow& out) noexcept {
  for (std::size_t i = 0; i < g_early_count; ++i) {
    Shadow& s = g_early[i];
    if (s.early == nullptr || s.serial != serial) continue;
    out.early = s.early;
    out.early_map_bytes = s.early_map_bytes;
    s.early = nullptr;
    return true;
  }
  return false;
}

// True when some segment would need a copy in a child.
bool any_segment_needs_copy() noexcept {
  const SegmentTable::Entry* entries = g_state.table.entries();
  for (std::size_t i = 0; i < g_state.table.high_water(); ++i) {
    if (entries[i].used && !inherited(entries[i].segment.backend)) return true;
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
  if (g_state.forked_child) return true;
  {
    SpinGuard guard(g_state.table.lock());
    if (!any_segment_needs_copy()) return true;
  }
  // The image the child's copy goes into, opened here, before the fork: if
  // it cannot be made, the fork fails (ENOMEM) instead of giving a child
  // without its heap. prepare_fork adopts it.
  if (!open_image()) return false;
  g_early_thread.store(gettid(), std::memory_order_release);
  // driver_state(), not driver_api(): a process whose driver was never loaded
  // (the host backend) must not load it to fork.
  if (driver_state() != DriverState::ready) return true;
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
    // The arenas listed are read below, outside the lock: one retired
    // meanwhile (retire.cpp) keeps its memory until this walk is over.
    if (n != 0) g_state.fork_readers.fetch_add(1, std::memory_order_seq_cst);
  }
  if (n == 0) return true;
  auto* bounce = static_cast<unsigned char*>(map_anonymous(kBounceBytes));
  bool ok = bounce != nullptr;
  for (std::size_t i = 0; i < n && ok; ++i) {
    Shadow& s = g_early[g_early_count];
    describe(s, g_snapshot[i]);
    if (!map_bitmap(s)) {
      ok = false;
      break;
    }
    ++g_early_count;
    // An arena's memory is not given back while this walk reads it
    // (fork_readers), so reading its metadata here, outside the table lock,
    // is safe; a dedicated block freed meanwhile only makes copy_out fail,
    // and the table no longer lists it.
    Pass pass{&s, g_snapshot[i].segment.backend, true, g_early_residency, bounce};
    copy_segment(g_snapshot[i], pass);
    add_copied(pass);
    ok = !pass.failed;
  }
  g_state.fork_readers.fetch_sub(1, std::memory_order_acq_rel);
  if (bounce != nullptr) munmap(bounce, kBounceBytes);
  if (!ok) {
    drop_early();
    close_image();
    return false;
  }
  return true;
}

void end_early() noexcept {
  if (g_early_thread.load(std::memory_order_acquire) == gettid()) drop_early();
  close_image();  // the parent's; a child has its own descriptor
}

void prepare_fork() noexcept {
  g_state.table.lock().lock();  // released in parent_after_fork / child_after_fork
  // The walk below reads arena blocks in use; a free block being discarded
  // meanwhile (retire.cpp) is skipped, one freed during the walk is not
  // discarded until the fork is over.
  g_state.fork_readers.fetch_add(1, std::memory_order_seq_cst);
  // Nor is backing given up under what it reads (pinned granules, PIN=vmm).
  hold_backing(true);
  g_parent_pid = getpid();
  g_shadow_count = 0;
  g_missing_count = 0;
  const bool adopt = g_early_thread.load(std::memory_order_acquire) == gettid();
  if (!adopt) close_image();  // not this fork's: another thread's early copy, long over
  const SegmentTable::Entry* entries = g_state.table.entries();
  for (std::size_t i = 0; i < g_state.table.high_water(); ++i) {
    const SegmentTable::Entry& e = entries[i];
    if (!e.used || inherited(e.segment.backend)) continue;
    Shadow& s = g_shadows[g_shadow_count];
    describe(s, e);
    if (adopt) adopt_early(e.serial, s);
    bool ok = open_image();
    if (ok) {
      Pass pass{&s, e.segment.backend, false, g_residency, nullptr};
      copy_segment(e, pass);
      add_copied(pass);
      ok = !pass.failed;
    }
    drop_bitmap(s);  // the child has no use for it
    if (!ok) {
      g_missing[g_missing_count++] = Missing{e.segment.start, e.segment.size};
      continue;
    }
    ++g_shadow_count;
  }
  if (adopt) drop_early();    // bitmaps of segments released since copy_early
  restore_file_size_limit();  // before the fork: the child inherits the program's
  g_child_complete = g_missing_count == 0;
  g_child_state.store(kPending, std::memory_order_release);
}

void parent_after_fork() noexcept {
  hold_backing(false);
  g_state.fork_readers.fetch_sub(1, std::memory_order_seq_cst);
  g_child_state.store(kIdle, std::memory_order_release);
  g_shadow_count = 0;
  close_image();  // the child holds its own descriptor to it
  g_state.table.lock().unlock();
}

namespace {

// In the child: maps the image at every shadow's target, and an
// inaccessible reservation where a segment has no copy. Runs once, with
// every signal blocked (no handler may touch the heap half-way);
// async-signal-safe.
void restore_once() noexcept {
  sigset_t all;
  sigset_t old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int expected = kPending;
  if (g_child_state.compare_exchange_strong(expected, kRestored, std::memory_order_acq_rel)) {
    for (std::size_t i = 0; i < g_shadow_count; ++i) {
      Shadow& s = g_shadows[i];
      const auto offset = static_cast<off_t>(reinterpret_cast<std::uintptr_t>(s.target));
      if (mmap(s.target, s.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE,
               g_image, offset) == MAP_FAILED) {
        g_missing[g_missing_count++] = Missing{s.target, s.size};
        g_child_complete = false;
      }
    }
    close_image();  // the mappings keep the image
    // What has no copy is never shown as zeros (a child running on wrong
    // data is worse than one that stops): the range is reserved with no
    // access, and a touch of it ends the child with SIGSEGV.
    for (std::size_t i = 0; i < g_missing_count; ++i) {
      mmap(g_missing[i].start, g_missing[i].size, PROT_NONE,
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

bool lost_in_child(const void* addr) noexcept {
  if (g_child_state.load(std::memory_order_acquire) != kRestored || getpid() == g_parent_pid) {
    return false;
  }
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  for (std::size_t i = 0; i < g_missing_count; ++i) {
    if (a - reinterpret_cast<std::uintptr_t>(g_missing[i].start) < g_missing[i].size) return true;
  }
  return false;
}

bool restore_child_heap(const void* addr) noexcept {
  if (g_child_state.load(std::memory_order_acquire) != kPending) return false;
  if (getpid() == g_parent_pid || !in_copied_segment(addr)) return false;
  restore_once();
  return true;
}

bool child_after_fork() noexcept {
  g_state.pid.store(Os::process_id(), std::memory_order_relaxed);
  g_state.fork_readers.store(0, std::memory_order_relaxed);  // the parent's walks
  // A child whose fork made no copy (a _Fork from a signal handler while
  // another thread's fork had not copied yet) lacks every segment that is not
  // inherited. kRestored means the first fault here already put the copy in.
  if (g_child_state.load(std::memory_order_acquire) == kIdle && any_segment_needs_copy()) {
    g_child_complete = false;
  }
  restore_once();
  close_image();  // a child that took no copy (a nested fork's) has one open too
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
  g_state.forked_child = true;
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
                    owner_entry(kOwnerDedicated, e.segment.backend));
      e.used = false;
    }
  }
  g_state.table.lock().reset();
  return ok;
}

}  // namespace mnemosyne::arena
