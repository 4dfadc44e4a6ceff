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
// Children that follow each other share one image (the base): the first
// fork's image is kept, and a fork soon after (Config::fork_keep_ns,
// MNEMOSYNE_FORK_KEEP_MS) writes only
// the pages whose contents differ from it into an image of its own (a
// delta), which its child maps over the base where they differ. Contents
// are compared, not tracked: memory a GPU or a driver copy writes changes
// no page table, so only a comparison sees it. The base is kept while forks
// follow each other; once none has come for the window it is closed (the
// children that map it keep it), from mimalloc's heartbeat
// (release_idle_fork_image) or at the next fork.
//
// A large heap (kParallelBytes) is copied, or compared, by the forking thread
// and the fork helpers (fork_helpers.hpp) at once, each its share of every
// segment (Share): one core does not read memory as fast as several.
//
// When the child gets its copy: in a child of a multi-threaded parent,
// glibc's fork() touches the heap before any atfork child handler runs (it
// resets the lock of every FILE). So the child maps the image at its first
// touch of a missing segment, from a fault handler (restore_child_heap,
// async-signal-safe), or in child_after_fork, whichever comes first.
#include <errno.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include <mimalloc-live.h>

#include "arena/arena.hpp"
#include "arena/fork_helpers.hpp"
#include "arena/segment_provider.hpp"
#include "arena/state.hpp"
#include "backend/backends.hpp"
#include "backend/loader.hpp"
#include "platform/fork_image.hpp"
#include "platform/platform.hpp"

namespace mnemosyne::arena {
namespace {

constexpr std::size_t kMaxShadows = SegmentTable::kCapacity;
// The image's size: every user address (ownership_map.hpp) is an offset.
constexpr std::uint64_t kImageBytes = std::uint64_t{1} << kAddressBits;
// A fork soon after the last one shares its base: the forks of a pool of
// workers or a data loader come a few milliseconds apart; by default (2 s)
// a server's periodic fork (a snapshot a minute) gets an image of its own,
// and keeps no copy of the heap in memory in between. MNEMOSYNE_FORK_KEEP_MS
// trades that memory for cheaper periodic forks, or (0) keeps none.
std::uint64_t keep_ns() noexcept {
  return g_state.cfg.fork_keep_ns;
}
// A delta whose pages reach half the base's makes the next fork a base.
// Runs of a delta are mappings in the child (the kernel allows 65,530 by
// default, the program's own among them): past kMaxDeltaRuns the fork
// makes a new base instead.
constexpr std::size_t kMaxDeltaRuns = 8192;
constexpr std::size_t kWindowPages = std::size_t{1} << 16;  // mincore's: 256 MiB of 4 KiB pages
constexpr std::size_t kBounceBytes = std::size_t{2} << 20;  // copy_out's destination
constexpr std::size_t kCompareBytes = 64 * 1024;            // the base's pages, read to compare
// Free space a child maps as fresh memory rather than from the image: runs
// of at least kMinFreeBytes (a mimalloc small page), at most kMaxFreeRuns of
// them: each run splits the image's mapping, two more mappings of the
// 65,530 the kernel allows a process by default, which the child's own
// mmaps (and a delta's runs, kMaxDeltaRuns) need too.
constexpr std::size_t kMinFreeBytes = 64 * 1024;
constexpr std::size_t kMaxFreeRuns = 1024;
// A heap whose segments (those a child lacks) reach this is copied by the
// fork helpers too (fork_helpers.hpp), each taking stripes of kStripeBytes:
// 1,024 pages, 16 words of a page bitmap, so no two workers write the same
// word (segments start kSegmentAlign-aligned).
constexpr std::size_t kParallelBytes = std::size_t{256} << 20;
constexpr std::size_t kStripeBytes = std::size_t{4} << 20;
static_assert(kSegmentAlign % kStripeBytes == 0);

// A descriptor kept as fd + 1, so that "none" is zero: the fork's state
// below is then all zeros until a fork, and lives in .bss (a -1 in it put
// 786 KB of arrays into the library's data).
class Descriptor {
 public:
  bool open() const noexcept { return plus_one_ != 0; }
  int fd() const noexcept { return plus_one_ - 1; }
  void set(int fd) noexcept { plus_one_ = fd + 1; }
  void close() noexcept {
    if (open()) platform::fork_image::close(fd());
    plus_one_ = 0;
  }
  // Another Descriptor holds it now, or it is not this process's.
  void forget() noexcept { plus_one_ = 0; }

 private:
  int plus_one_ = 0;
};

// A segment the child gets from the image.
struct Shadow {
  void* target = nullptr;  // the segment's start, and its offset in the image
  std::size_t size = 0;
  std::uint64_t serial = 0;         // the table entry it copies
  std::uint64_t* early = nullptr;   // copy_early: one bit per page it copied
  std::size_t early_map_bytes = 0;  // that bitmap's mapping
  // One bit per page: in a base, the pages written into it; in a delta, the
  // pages the child takes from the delta (it differs from the base there).
  std::uint64_t* marks = nullptr;
  std::size_t marks_map_bytes = 0;
  // prepare_fork's: one bit per page of the segment's live ranges. The
  // child maps the rest, which reads zero from the image too, as fresh
  // memory (map_free_space).
  std::uint64_t* live = nullptr;
  std::size_t live_map_bytes = 0;
  // In the base: a read-only view of what it holds of this segment, mapped
  // at the first delta over it (compare_view), for the forks that follow.
  const unsigned char* view = nullptr;
  // In a delta: the base's view and marks of the same segment, when the base
  // holds it (a delta compares through them; otherwise with read_at).
  const unsigned char* base_view = nullptr;
  const std::uint64_t* base_marks = nullptr;
};

// The image kept for the children of the forks that follow (see above):
// what it holds, by address.
struct BaseImage {
  Descriptor fd;
  Shadow segments[SegmentTable::kCapacity];  // target, size, marks: pages it holds
  std::size_t count = 0;
  std::uint64_t pages = 0;        // pages it holds
  std::uint64_t delta_pages = 0;  // the last delta's
  std::uint64_t last_fork_ns = 0;
};

// Who may touch the base: kBaseFree, a fork (kBaseForking, from open_image
// to close_image), or the release of an idle base (kBaseReleasing).
enum BaseUse : int { kBaseFree, kBaseForking, kBaseReleasing };

// A segment the child lacks and has no copy of (the image could not take it).
struct Missing {
  void* start = nullptr;
  std::size_t size = 0;
};

// kPending from prepare_fork until the fork is over (parent) or the child has
// taken its copy.
enum ChildState : int { kIdle, kPending, kRestored };

// A pass's buffers (the two passes run under different locks, and the CPU
// pass on several threads: one each).
struct Scratch {
  unsigned char residency[kWindowPages] = {};  // mincore's answer for a window
  unsigned char base_pages[kCompareBytes] = {};
  unsigned char fault_bounce[64 * 1024] = {};  // write_image's
};

// The fork path's state, all of it. None of it may allocate (a fork may come
// from a signal handler, or while another thread holds the heap), hence
// fixed arrays; all zeros until a fork.
struct ForkCopy {
  // The base kept for the forks that follow, and who may touch it.
  BaseImage base;
  std::atomic<int> base_use{kBaseFree};
  std::atomic<std::uint64_t> base_deadline{0};  // when an idle base may go (0: no base)

  // This fork's image (both passes write into it), a delta over the base or not.
  Descriptor image;
  bool delta = false;
  std::uint64_t delta_pages = 0;
  // The runs a delta has written so far, by every worker; past
  // kMaxDeltaRuns the delta is abandoned where it stands (see put_delta).
  std::atomic<std::size_t> delta_writes{0};
  std::atomic<bool> delta_abandoned{false};

  // RLIMIT_FSIZE, lifted for the copy (lift_file_size_limit).
  bool fsize_lifted = false;
  std::uint64_t fsize_soft = 0;  // the program's, while lifted

  // prepare_fork's shadows, for the child (under the table lock until the
  // fork is over).
  Shadow shadows[kMaxShadows];
  std::size_t shadow_count = 0;
  Missing missing[kMaxShadows];
  std::size_t missing_count = 0;
  long parent_pid = 0;

  // copy_early's shadows, until the prepare_fork of the same thread adopts them.
  Shadow early[kMaxShadows];
  std::size_t early_count = 0;
  std::atomic<long> early_thread{0};  // set once the shadows are complete
  SegmentTable::Entry snapshot[kMaxShadows];

  std::atomic<int> child_state{kIdle};
  bool child_incomplete = false;  // in the child: a segment could not be restored

  // prepare_fork's CPU pass: the table entries of g_fork.shadows, and which
  // of them could not be copied (written by every worker).
  SegmentTable::Entry entries[kMaxShadows];
  std::atomic<bool> failed[kMaxShadows];

  Scratch cpu_pass[kMaxForkWorkers];  // prepare_fork's, under the table lock
  Scratch early_pass;                 // copy_early's, under the fork lock
};
constinit ForkCopy g_fork;

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
  int err = 0;
  return Os::map_pages(size, &err);
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
constexpr std::uint64_t kUnlimited = platform::fork_image::kUnlimited;

bool lift_file_size_limit() noexcept {
  std::uint64_t soft = 0;
  std::uint64_t hard = 0;
  if (!platform::fork_image::file_size_limit(&soft, &hard)) return true;
  if (hard != kUnlimited) return false;
  if (soft == kUnlimited || g_fork.fsize_lifted) return true;
  g_fork.fsize_soft = soft;
  if (!platform::fork_image::set_file_size_soft_limit(kUnlimited, kUnlimited)) return false;
  g_fork.fsize_lifted = true;
  return true;
}

void restore_file_size_limit() noexcept {
  if (!g_fork.fsize_lifted) return;
  platform::fork_image::set_file_size_soft_limit(g_fork.fsize_soft, kUnlimited);
  g_fork.fsize_lifted = false;
}

// Page bitmaps (Shadow::early, Shadow::marks): anonymous memory, which a
// child inherits (it reads the marks of its delta).
std::uint64_t* map_bits(std::size_t pages, std::size_t* map_bytes) noexcept {
  *map_bytes = round_up((pages + 63) / 64 * sizeof(std::uint64_t), Os::page_size());
  return static_cast<std::uint64_t*>(map_anonymous(*map_bytes));
}

void unmap_bits(std::uint64_t*& bits, std::size_t map_bytes) noexcept {
  if (bits != nullptr) Os::unmap_pages(bits, map_bytes);
  bits = nullptr;
}

bool bit(const std::uint64_t* bits, std::size_t i) noexcept {
  return (bits[i / 64] >> (i % 64) & 1) != 0;
}

void set_bit(std::uint64_t* bits, std::size_t i, bool on) noexcept {
  const std::uint64_t m = std::uint64_t{1} << (i % 64);
  bits[i / 64] = on ? bits[i / 64] | m : bits[i / 64] & ~m;
}

// Closes the base (the children that map it keep it). Under kBaseForking or
// kBaseReleasing, or in a child.
void drop_base() noexcept {
  for (std::size_t i = 0; i < g_fork.base.count; ++i) {
    Shadow& held = g_fork.base.segments[i];
    unmap_bits(held.marks, held.marks_map_bytes);
    if (held.view != nullptr) platform::fork_image::unmap_view(held.view, held.size);
    held.view = nullptr;
  }
  g_fork.base.count = 0;
  g_fork.base.pages = 0;
  g_fork.base.delta_pages = 0;
  g_fork.base.fd.close();
}

// The idle base's release (release_idle_fork_image) rides on mimalloc's
// heartbeat, its deferred-free callback, which mimalloc calls on every page
// refill (the generic path of malloc). Registered only while a base is
// kept: with none, mimalloc's generic path costs what it costs without
// mnemosyne (issue 48: the callback, called for nothing on every refill,
// was a quarter of the gap between the fast paths' cost and mimalloc's).
// Armed by a fork that keeps a base, disarmed by the release that drops
// it, each under this lock with the deadline checked again, so that a fork
// keeping a new base while another thread drops the old one always ends
// with the callback in place.
constinit SpinLock g_heartbeat_lock;

void on_heartbeat(bool, unsigned long long, void*) noexcept {
  release_idle_fork_image();
}

void set_heartbeat(bool wanted) noexcept {
  SpinGuard guard(g_heartbeat_lock);
  const bool kept = g_fork.base_deadline.load(std::memory_order_acquire) != 0;
  if (wanted == kept) mi_register_deferred_free(kept ? &on_heartbeat : nullptr, nullptr);
}

// Takes g_fork.base for this fork (a release of an idle base in progress on
// another thread is short: it closes one descriptor and unmaps bitmaps).
void use_base() noexcept {
  int expected = kBaseFree;
  while (
      !g_fork.base_use.compare_exchange_weak(expected, kBaseForking, std::memory_order_acquire)) {
    if (expected == kBaseForking) return;  // this fork's already
    expected = kBaseFree;
    Os::pause(0);
  }
}

// Whether this fork's image can be a delta over the base: a base there is,
// a fork came within the window, and the last delta stayed small.
bool base_reusable() noexcept {
  return g_fork.base.fd.open() && Os::monotonic_ns() - g_fork.base.last_fork_ns <= keep_ns() &&
         g_fork.base.delta_pages <= g_fork.base.pages / 2;
}

void close_image() noexcept;

// The fork's image, made once per fork (both passes write into it). A memfd;
// close-on-exec, so that a child that execs without touching its heap leaves
// it behind. A delta over the base when the base serves (see above);
// `fresh` asks for a base whatever the base (a delta that would not do).
bool open_image(bool fresh = false) noexcept {
  if (g_fork.image.open()) return true;
  if (!lift_file_size_limit()) return false;
  use_base();
  g_fork.delta = !fresh && base_reusable();
  if (!g_fork.delta) drop_base();
  g_fork.delta_pages = 0;
  g_fork.delta_writes.store(0, std::memory_order_relaxed);
  g_fork.delta_abandoned.store(false, std::memory_order_relaxed);
  const int fd = platform::fork_image::create(
      g_fork.delta ? "mnemosyne-fork-delta" : "mnemosyne-fork-heap", kImageBytes);
  if (fd >= 0) {
    g_fork.image.set(fd);
    return true;
  }
  close_image();
  return false;
}

void close_image() noexcept {
  g_fork.image.close();
  g_fork.delta = false;
  restore_file_size_limit();
  if (g_fork.base_use.load(std::memory_order_relaxed) == kBaseForking) {
    g_fork.base_use.store(kBaseFree, std::memory_order_release);
  }
}

// Writes [src, src + size) into the image at `at`'s offset. False when the
// image could not take it (no memory). The kernel reads the source itself;
// where it cannot (EFAULT: memory whose pages a driver maps in only from its
// own fault handler, as the test double does with pages it holds "on the
// device"), the bytes go through a buffer, read by this thread.

bool write_image(const void* at, const void* src, std::size_t size,
                 unsigned char (&bounce)[64 * 1024]) noexcept {
  auto* from = static_cast<const unsigned char*>(src);
  auto offset = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(at));
  while (size > 0) {
    int err = 0;
    long n = platform::fork_image::write_at(g_fork.image.fd(), from, size, offset, &err);
    if (n < 0 && err == EFAULT) {
      const std::size_t piece = size < sizeof bounce ? size : sizeof bounce;
      std::memcpy(bounce, from, piece);
      n = platform::fork_image::write_at(g_fork.image.fd(), bounce, piece, offset, &err);
    }
    if (n <= 0) return false;
    from += n;
    offset += static_cast<std::uint64_t>(n);
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

void drop_bitmap(Shadow& s) noexcept {
  unmap_bits(s.early, s.early_map_bytes);
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

// Which live ranges of a segment a worker of the CPU pass copies. With
// helpers, a mimalloc segment's metadata (its header and page table: the
// range that starts at the segment, kSegmentAlign-aligned) is copied before
// any of its blocks, as one thread copying in address order does: a free
// another thread had begun when the copy started writes the block before
// the page's list head, and the child must not get the head without the
// block (mimalloc-live.h). So the workers first copy the metadata, each
// that of the segments whose index it owns, and then, after every worker
// is done, the rest, each its stripes of kStripeBytes.
enum class Share { all, metadata, blocks };

// One pass over a segment's live ranges: the early pass (through copy_out,
// pages the CPU has not mapped) or the CPU pass (the rest).
struct Pass {
  Shadow* shadow;
  BackendId backend;
  bool early;
  Scratch* scratch;          // residency: mincore buffer; base_pages: a delta's, the base's pages
  unsigned char* bounce;     // early pass: copy_out's destination
  Share share = Share::all;  // the CPU pass with helpers: which ranges (see Share)
  std::size_t worker = 0;    // this worker, of `workers`
  std::size_t workers = 1;
  bool whole = false;       // a segment live whole (a dedicated block): no metadata
  std::uint64_t bytes = 0;  // written into the image
  std::uint64_t via_backend = 0;
  bool failed = false;  // the image could not take a write
  // Live ranges that touch are handled as one (a full page's blocks end
  // where the next page's begin): one mincore and one write for a run of
  // them, not one per page.
  unsigned char* pending = nullptr;
  std::size_t pending_size = 0;
  // The residency of the segment's pages [window_first, window_first +
  // window_pages), in `residency`: one mincore for a window of the segment,
  // not one per live run (a heap of small objects has hundreds a fork).
  std::size_t window_first = 0;
  std::size_t window_pages = 0;  // 0: none read yet
  bool window_known = false;     // mincore answered for it
};

bool early_copied(const Shadow& s, std::size_t page_index) noexcept {
  return s.early != nullptr && bit(s.early, page_index);
}

void write_pages(Pass& pass, const unsigned char* at, const unsigned char* src,
                 std::size_t size) noexcept {
  if (!write_image(at, src, size, pass.scratch->fault_bounce)) {
    pass.failed = true;
    return;
  }
  pass.bytes += size;
}

// One run of a delta's changed pages written; false once the delta has
// written more runs than a child may map (kMaxDeltaRuns): it is then
// abandoned, and prepare_fork makes a fresh image instead. A heap whose
// changes are scattered (a server whose clients write all over it) learns
// that after a fraction of the comparison, not after all of it and the
// writes of every run (2026-12-07, this VM: Redis's second save of 1 GiB
// forked in 3.0 s with a kept image, against 0.74 s for a fresh one). Runs
// that touch across two calls count twice: an early fresh image costs time,
// never correctness.
bool note_delta_run() noexcept {
  if (g_fork.delta_writes.fetch_add(1, std::memory_order_relaxed) < kMaxDeltaRuns) return true;
  g_fork.delta_abandoned.store(true, std::memory_order_relaxed);
  return false;
}

bool delta_abandoned() noexcept {
  return g_fork.delta_abandoned.load(std::memory_order_relaxed);
}

// A delta: the pages of [at, at + size) whose contents `src` differ from the
// base's go into the delta, and are marked; the others are unmarked (the
// child takes them from the base). Reading the base costs no memory: a
// page it does not hold reads as zeros.
void put_delta(Pass& pass, const unsigned char* at, const unsigned char* src,
               std::size_t size) noexcept {
  const std::size_t page = Os::page_size();
  Shadow& s = *pass.shadow;
  const auto* base = static_cast<const unsigned char*>(s.target);
  std::size_t run = 0;  // pages that differ, not yet written, ending at `done`
  for (std::size_t done = 0; done < size && !pass.failed;) {
    if (delta_abandoned()) return;
    const std::size_t n = size - done < kCompareBytes ? size - done : kCompareBytes;
    // The base's pages: through its view (a page it does not hold reads
    // zero, and is not read there), or read into the scratch buffer.
    long got = static_cast<long>(n);
    if (s.base_view == nullptr) {
      const auto offset = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(at + done));
      got = platform::fork_image::read_at(g_fork.base.fd.fd(), pass.scratch->base_pages, n, offset);
      if (got < 0) got = 0;  // unreadable: every page counts as different
    }
    for (std::size_t i = 0; i < n; i += page) {
      const std::size_t index = static_cast<std::size_t>(at + done + i - base) / page;
      const unsigned char* now = src + done + i;
      bool same = false;
      if (s.base_view == nullptr) {
        same = static_cast<std::size_t>(got) >= i + page &&
               std::memcmp(now, pass.scratch->base_pages + i, page) == 0;
      } else if (bit(s.base_marks, index)) {
        same = std::memcmp(now, s.base_view + (at + done + i - base), page) == 0;
      } else {
        same = is_zero(now, page);
      }
      set_bit(s.marks, index, !same);
      if (!same) {
        run += page;
        continue;
      }
      if (run != 0) {
        if (!note_delta_run()) return;
        write_pages(pass, at + done + i - run, src + done + i - run, run);
      }
      run = 0;
    }
    done += n;
  }
  if (run != 0 && !pass.failed && note_delta_run()) {
    write_pages(pass, at + size - run, src + size - run, run);
  }
}

void put(Pass& pass, const unsigned char* at, const unsigned char* src, std::size_t size) noexcept {
  if (g_fork.delta) return put_delta(pass, at, src, size);
  write_pages(pass, at, src, size);
  // A base: what it holds.
  const std::size_t page = Os::page_size();
  const auto first =
      static_cast<std::size_t>(at - static_cast<unsigned char*>(pass.shadow->target));
  for (std::size_t i = 0; i < size / page; ++i) set_bit(pass.shadow->marks, first / page + i, true);
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
      for (std::size_t i = 0; i < n; ++i) set_bit(s.early, at + i, true);
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
  // An abandoned delta is made again whole (prepare_fork): neither its
  // residency nor a driver copy is of use any more.
  if (g_fork.delta && delta_abandoned()) return;
  const std::size_t page = Os::page_size();
  auto* base = static_cast<unsigned char*>(pass.shadow->target);
  const std::size_t first =
      static_cast<std::size_t>(static_cast<unsigned char*>(start) - base) / page;
  const std::size_t pages = size / page;
  if (!pass.early && pass.shadow->live != nullptr) {
    for (std::size_t i = first; i < first + pages; ++i) set_bit(pass.shadow->live, i, true);
  }
  const std::size_t end = first + pages;
  const std::size_t segment_pages = pass.shadow->size / page;
  for (std::size_t p = first; p < end;) {
    if (p < pass.window_first || p >= pass.window_first + pass.window_pages) {
      // A window from here to as far as the segment and the buffer go;
      // where mincore refuses it (a part of the segment not mapped: an
      // unbacked stretch of a reservation), the live run alone, as before.
      pass.window_first = p;
      pass.window_pages = std::min(kWindowPages, segment_pages - p);
      pass.window_known = platform::fork_image::resident_pages(
          base + p * page, pass.window_pages * page, pass.scratch->residency);
      if (!pass.window_known) {
        pass.window_pages = std::min(kWindowPages, end - p);
        pass.window_known = platform::fork_image::resident_pages(
            base + p * page, pass.window_pages * page, pass.scratch->residency);
      }
    }
    const std::size_t stop = std::min(end, pass.window_first + pass.window_pages);
    if (!pass.window_known) {
      // Residency unknown: the CPU pass copies it all, the early pass leaves
      // it to the CPU pass.
      if (!pass.early) cpu_copy(pass, p, stop - p);
      p = stop;
      continue;
    }
    const auto resident_at = [&pass](std::size_t i) {
      return (pass.scratch->residency[i - pass.window_first] & 1) != 0;
    };
    for (std::size_t i = p; i < stop;) {
      const bool resident = resident_at(i);
      std::size_t j = i + 1;
      while (j < stop && resident_at(j) == resident) ++j;
      copy_run(pass, i, j - i, resident);
      i = j;
    }
    p = stop;
  }
}

void flush(Pass& pass) noexcept {
  if (pass.pending_size != 0) copy_live(pass, pass.pending, pass.pending_size);
  pass.pending_size = 0;
}

// A live range (or part of one) the pass copies.
void take_range(Pass& pass, unsigned char* at, std::size_t size) noexcept {
  if (pass.pending_size != 0 && pass.pending + pass.pending_size == at) {
    pass.pending_size += size;
    return;
  }
  flush(pass);
  pass.pending = at;
  pass.pending_size = size;
}

// mnemosyne_mi_range_fn: one live range; they come in address order.
void copy_range(void* start, std::size_t size, void* arg) noexcept {
  Pass& pass = *static_cast<Pass*>(arg);
  auto* at = static_cast<unsigned char*>(start);
  if (pass.share == Share::all) return take_range(pass, at, size);
  const auto addr = reinterpret_cast<std::uintptr_t>(at);
  // In an arena the walk reports each mimalloc segment's metadata first, as
  // a range of its own that starts at the segment; no other range starts on
  // a kSegmentAlign boundary (blocks follow the metadata in their segment).
  const bool metadata = !pass.whole && addr % kSegmentAlign == 0;
  if (pass.share == Share::metadata) {
    if (metadata && addr / kSegmentAlign % pass.workers == pass.worker) take_range(pass, at, size);
    return;
  }
  if (metadata) return;
  while (size > 0) {
    const auto a = reinterpret_cast<std::uintptr_t>(at);
    const std::size_t stripe_left = kStripeBytes - a % kStripeBytes;
    const std::size_t n = size < stripe_left ? size : stripe_left;
    if (a / kStripeBytes % pass.workers == pass.worker) take_range(pass, at, n);
    at += n;
    size -= n;
  }
}

void copy_segment(const SegmentTable::Entry& e, Pass& pass) noexcept {
  if (e.dedicated || mnemosyne_mi_arena_live(e.segment.start, &copy_range, &pass) == 0) {
    pass.whole = true;  // a dedicated block is live whole
    copy_range(e.segment.start, e.segment.size, &pass);
  }
  flush(pass);
}

void describe(Shadow& s, const SegmentTable::Entry& e) noexcept {
  s.target = e.segment.start;
  s.size = e.segment.size;
  s.serial = e.serial;
  s.early = nullptr;
  s.marks = nullptr;
  s.live = nullptr;
  s.view = nullptr;
  s.base_view = nullptr;
  s.base_marks = nullptr;
}

// copy_early's bitmap of the pages it copied.
bool map_bitmap(Shadow& s) noexcept {
  s.early = map_bits(s.size / Os::page_size(), &s.early_map_bytes);
  return s.early != nullptr;
}

// A delta's segment that the base holds whole is compared through a view of
// the base (mapped once, kept with the base): a read of the base with
// read_at costs a system call and a copy per kCompareBytes, a delta of a
// heap of small objects many of them.
void compare_view(Shadow& held, Shadow& s) noexcept {
  if (held.view == nullptr) {
    held.view = platform::fork_image::map_view(
        g_fork.base.fd.fd(), held.size,
        static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(held.target)));
  }
  s.base_view = held.view;
  s.base_marks = held.marks;
}

// The shadow's marks before its passes: in a base, none; in a delta, the
// pages the base holds there (a page no pass finds live again then reads as
// zero, from the delta, as in a child with an image of its own).
bool begin_marks(Shadow& s) noexcept {
  const std::size_t page = Os::page_size();
  s.marks = map_bits(s.size / page, &s.marks_map_bytes);
  if (s.marks == nullptr || !g_fork.delta) return s.marks != nullptr;
  const auto lo = reinterpret_cast<std::uintptr_t>(s.target);
  const std::uintptr_t hi = lo + s.size;
  for (std::size_t b = 0; b < g_fork.base.count; ++b) {
    Shadow& held = g_fork.base.segments[b];
    const auto held_lo = reinterpret_cast<std::uintptr_t>(held.target);
    const std::uintptr_t from = held_lo > lo ? held_lo : lo;
    const std::uintptr_t to = held_lo + held.size < hi ? held_lo + held.size : hi;
    for (std::uintptr_t a = from; a < to; a += page) {
      if (bit(held.marks, (a - held_lo) / page)) set_bit(s.marks, (a - lo) / page, true);
    }
    if (held.target == s.target && held.size == s.size) compare_view(held, s);
  }
  return true;
}

void drop_marks(Shadow& s) noexcept {
  unmap_bits(s.marks, s.marks_map_bytes);
}

void drop_live(Shadow& s) noexcept {
  unmap_bits(s.live, s.live_map_bytes);
}

void drop_early() noexcept {
  g_fork.early_thread.store(0, std::memory_order_relaxed);
  for (std::size_t i = 0; i < g_fork.early_count; ++i) {
    drop_bitmap(g_fork.early[i]);
    drop_marks(g_fork.early[i]);
  }
  g_fork.early_count = 0;
}

// Moves copy_early's bitmap of table entry `serial` into `out`; false when
// there is none (the image is shared: nothing else moves).
bool adopt_early(std::uint64_t serial, Shadow& out) noexcept {
  for (std::size_t i = 0; i < g_fork.early_count; ++i) {
    Shadow& s = g_fork.early[i];
    if (s.early == nullptr || s.serial != serial) continue;
    out.early = s.early;
    out.early_map_bytes = s.early_map_bytes;
    out.marks = s.marks;
    out.marks_map_bytes = s.marks_map_bytes;
    out.base_view = s.base_view;
    out.base_marks = s.base_marks;
    s.early = nullptr;
    s.marks = nullptr;
    return true;
  }
  return false;
}

// The bytes of the segments a child would need a copy of.
std::size_t bytes_needing_copy() noexcept {
  std::size_t bytes = 0;
  const SegmentTable::Entry* entries = g_state.table.entries();
  for (std::size_t i = 0; i < g_state.table.high_water(); ++i) {
    if (entries[i].used && !inherited(entries[i].segment.backend)) bytes += entries[i].segment.size;
  }
  return bytes;
}

// True when some segment would need a copy in a child.
bool any_segment_needs_copy() noexcept {
  return bytes_needing_copy() != 0;
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
  g_fork.early_thread.store(Os::thread_id(), std::memory_order_release);
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
        g_fork.snapshot[n++] = e;
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
    Shadow& s = g_fork.early[g_fork.early_count];
    describe(s, g_fork.snapshot[i]);
    if (!map_bitmap(s) || !begin_marks(s)) {
      drop_bitmap(s);
      drop_marks(s);
      ok = false;
      break;
    }
    ++g_fork.early_count;
    // An arena's memory is not given back while this walk reads it
    // (fork_readers), so reading its metadata here, outside the table lock,
    // is safe; a dedicated block freed meanwhile only makes copy_out fail,
    // and the table no longer lists it.
    Pass pass{&s, g_fork.snapshot[i].segment.backend, true, &g_fork.early_pass, bounce};
    copy_segment(g_fork.snapshot[i], pass);
    add_copied(pass);
    ok = !pass.failed;
  }
  g_state.fork_readers.fetch_sub(1, std::memory_order_acq_rel);
  if (bounce != nullptr) Os::unmap_pages(bounce, kBounceBytes);
  if (!ok) {
    drop_early();
    close_image();
    return false;
  }
  return true;
}

void end_early() noexcept {
  if (g_fork.early_thread.load(std::memory_order_acquire) == Os::thread_id()) drop_early();
  close_image();  // the parent's; a child has its own descriptor
}

namespace {

// A worker's share of the CPU pass over every segment copy_all prepared;
// `arg` points to its Share.
void copy_share(void* arg, std::size_t worker, std::size_t workers) noexcept {
  const Share share = *static_cast<const Share*>(arg);
  for (std::size_t i = 0; i < g_fork.shadow_count; ++i) {
    if (g_fork.failed[i].load(std::memory_order_relaxed)) continue;
    const SegmentTable::Entry& e = g_fork.entries[i];
    Pass pass{&g_fork.shadows[i], e.segment.backend, false, &g_fork.cpu_pass[worker], nullptr};
    pass.share = share;
    pass.worker = worker;
    pass.workers = workers;
    copy_segment(e, pass);
    add_copied(pass);
    if (pass.failed) g_fork.failed[i].store(true, std::memory_order_relaxed);
  }
}

// One walk: every segment a child does not inherit, into the image (its
// shadows in g_fork.shadows, those it could not copy in g_fork.missing).
// A heap of kParallelBytes or more is copied by the fork helpers too.
void copy_all(bool adopt) noexcept {
  g_fork.shadow_count = 0;
  g_fork.missing_count = 0;
  std::size_t bytes = 0;
  const SegmentTable::Entry* entries = g_state.table.entries();
  for (std::size_t i = 0; i < g_state.table.high_water(); ++i) {
    const SegmentTable::Entry& e = entries[i];
    if (!e.used || inherited(e.segment.backend)) continue;
    const std::size_t k = g_fork.shadow_count++;
    Shadow& s = g_fork.shadows[k];
    describe(s, e);
    if (adopt) adopt_early(e.serial, s);
    // Without it the child maps all of the segment from the image.
    s.live = map_bits(s.size / Os::page_size(), &s.live_map_bytes);
    g_fork.entries[k] = e;
    const bool ok = open_image() && (s.marks != nullptr || begin_marks(s));
    g_fork.failed[k].store(!ok, std::memory_order_relaxed);
    if (ok) bytes += e.segment.size;
  }
  const std::size_t workers = bytes < kParallelBytes ? 1 : fork_workers_ready();
  if (workers <= 1) {
    Share all = Share::all;
    copy_share(&all, 0, 1);
  } else {
    // Every worker's metadata before any worker's blocks (see Share).
    Share metadata = Share::metadata;
    Share blocks = Share::blocks;
    run_on_fork_workers(&copy_share, &metadata, workers);
    run_on_fork_workers(&copy_share, &blocks, workers);
  }
  if (bytes >= kParallelBytes &&
      workers > g_state.fork_copy_workers.load(std::memory_order_relaxed)) {
    g_state.fork_copy_workers.store(workers, std::memory_order_relaxed);
  }
  // The shadows copied stay, in order; the others are missing.
  std::size_t kept = 0;
  for (std::size_t i = 0; i < g_fork.shadow_count; ++i) {
    Shadow& s = g_fork.shadows[i];
    drop_bitmap(s);  // the child has no use for it
    if (g_fork.failed[i].load(std::memory_order_relaxed)) {
      drop_marks(s);
      drop_live(s);
      g_fork.missing[g_fork.missing_count++] = Missing{s.target, s.size};
      continue;
    }
    g_fork.shadows[kept++] = s;
  }
  g_fork.shadow_count = kept;
}

// A delta's runs of marked pages (a mapping each in the child), and its
// pages (g_fork.delta_pages).
std::size_t count_delta_runs() noexcept {
  std::size_t runs = 0;
  g_fork.delta_pages = 0;
  for (std::size_t i = 0; i < g_fork.shadow_count; ++i) {
    const Shadow& s = g_fork.shadows[i];
    const std::size_t pages = s.size / Os::page_size();
    bool in_run = false;
    for (std::size_t p = 0; p < pages; ++p) {
      const bool on = bit(s.marks, p);
      runs += on && !in_run;
      g_fork.delta_pages += on;
      in_run = on;
    }
  }
  return runs;
}

// After the fork, in the parent: a complete base image is kept for the forks
// that follow (unless FORK_KEEP_MS is 0); a delta leaves its size, for the
// next fork to judge.
void keep_image() noexcept {
  for (std::size_t i = 0; i < g_fork.shadow_count; ++i) drop_live(g_fork.shadows[i]);
  if (g_fork.image.open() && g_fork.delta) {
    g_fork.base.delta_pages = g_fork.delta_pages;
    g_fork.base.last_fork_ns = Os::monotonic_ns();
  } else if (g_fork.image.open() && g_fork.missing_count == 0 && keep_ns() != 0) {
    drop_base();
    for (std::size_t i = 0; i < g_fork.shadow_count; ++i) {
      Shadow& held = g_fork.base.segments[g_fork.base.count++];
      held = g_fork.shadows[i];
      g_fork.shadows[i].marks = nullptr;
      for (std::size_t w = 0; w < held.marks_map_bytes / sizeof(std::uint64_t); ++w) {
        g_fork.base.pages += static_cast<std::uint64_t>(__builtin_popcountll(held.marks[w]));
      }
    }
    g_fork.base.fd = g_fork.image;
    g_fork.image.forget();
    g_fork.base.last_fork_ns = Os::monotonic_ns();
  }
  for (std::size_t i = 0; i < g_fork.shadow_count; ++i) drop_marks(g_fork.shadows[i]);
}

}  // namespace

void prepare_fork() noexcept {
  g_state.table.lock().lock();  // released in parent_after_fork / child_after_fork
  // The walk below reads arena blocks in use; a free block being discarded
  // meanwhile (retire.cpp) is skipped, one freed during the walk is not
  // discarded until the fork is over.
  g_state.fork_readers.fetch_add(1, std::memory_order_seq_cst);
  // Nor is backing given up under what it reads (pinned granules, PIN=vmm).
  hold_backing(true);
  g_fork.parent_pid = Os::process_id();
  const bool adopt = g_fork.early_thread.load(std::memory_order_acquire) == Os::thread_id();
  if (!adopt) close_image();  // not this fork's: another thread's early copy, long over
  // Nor is the base released while this fork may read it, or the child
  // inherits it.
  use_base();
  copy_all(adopt);
  if (g_fork.delta && (delta_abandoned() || count_delta_runs() > kMaxDeltaRuns)) {
    // Too scattered for the child's mappings: this fork makes a base, every
    // page read again with the CPU.
    for (std::size_t i = 0; i < g_fork.shadow_count; ++i) {
      drop_marks(g_fork.shadows[i]);
      drop_live(g_fork.shadows[i]);
    }
    close_image();
    drop_early();
    use_base();
    open_image(/*fresh=*/true);
    copy_all(/*adopt=*/false);
  }
  if (adopt) drop_early();    // bitmaps of segments released since copy_early
  restore_file_size_limit();  // before the fork: the child inherits the program's
  g_fork.child_incomplete = g_fork.missing_count != 0;
  g_fork.child_state.store(kPending, std::memory_order_release);
}

void parent_after_fork() noexcept {
  hold_backing(false);
  g_state.fork_readers.fetch_sub(1, std::memory_order_seq_cst);
  g_fork.child_state.store(kIdle, std::memory_order_release);
  keep_image();
  g_fork.shadow_count = 0;
  close_image();  // the child holds its own descriptor to it
  if (g_fork.base.fd.open()) {
    g_fork.base_deadline.store(g_fork.base.last_fork_ns + keep_ns(), std::memory_order_release);
    set_heartbeat(true);
  }
  g_state.table.lock().unlock();
}

void start_fork_copy_helpers() noexcept {
  if (g_state.forked_child || fork_helpers_started()) return;
  std::size_t bytes = 0;
  {
    SpinGuard guard(g_state.table.lock());
    bytes = bytes_needing_copy();
  }
  if (bytes >= kParallelBytes) start_fork_helpers(Os::cpu_count());
}

void release_idle_fork_image() noexcept {
  const std::uint64_t deadline = g_fork.base_deadline.load(std::memory_order_acquire);
  if (deadline == 0 || Os::monotonic_ns() < deadline) return;
  int expected = kBaseFree;
  if (!g_fork.base_use.compare_exchange_strong(expected, kBaseReleasing,
                                               std::memory_order_acquire)) {
    return;  // a fork uses it
  }
  const int saved_errno = errno;
  if (g_fork.base.fd.open() && Os::monotonic_ns() - g_fork.base.last_fork_ns > keep_ns())
    drop_base();
  const bool dropped = !g_fork.base.fd.open();
  if (dropped) g_fork.base_deadline.store(0, std::memory_order_release);
  g_fork.base_use.store(kBaseFree, std::memory_order_release);
  if (dropped) set_heartbeat(false);
  errno = saved_errno;
}

namespace {

// In the child: maps `file` at [at, at + size), privately.
bool map_image(int file, unsigned char* at, std::size_t size) noexcept {
  return platform::fork_image::map_at(file, at, size, reinterpret_cast<std::uintptr_t>(at));
}

// In the child: the shadow's copy at its target; from a delta, the base with
// the delta's runs over it.
bool map_shadow(const Shadow& s) noexcept {
  auto* target = static_cast<unsigned char*>(s.target);
  if (!g_fork.delta) return map_image(g_fork.image.fd(), target, s.size);
  if (!map_image(g_fork.base.fd.fd(), target, s.size)) return false;
  const std::size_t page = Os::page_size();
  const std::size_t pages = s.size / page;
  for (std::size_t p = 0; p < pages;) {
    if (!bit(s.marks, p)) {
      ++p;
      continue;
    }
    std::size_t q = p + 1;
    while (q < pages && bit(s.marks, q)) ++q;
    if (!map_image(g_fork.image.fd(), target + p * page, (q - p) * page)) return false;
    p = q;
  }
  return true;
}

// In the child: the shadow's free space (runs of pages outside its live
// ranges, at least kMinFreeBytes long) mapped as fresh memory over the
// image, while *budget lasts. Either way it reads zero; from the image, a
// child's first touch of it (a new block there) would put a page of zeros
// into the image the siblings share, then copy it, where fresh memory costs
// one zeroed page. A failed mapping leaves the image's.
void map_free_space(const Shadow& s, std::size_t* budget) noexcept {
  if (s.live == nullptr) return;
  const std::size_t page = Os::page_size();
  const std::size_t pages = s.size / page;
  const std::size_t min_pages = kMinFreeBytes / page;
  auto* target = static_cast<unsigned char*>(s.target);
  for (std::size_t p = 0; p<pages&& * budget> 0;) {
    if (bit(s.live, p)) {
      ++p;
      continue;
    }
    std::size_t q = p + 1;
    while (q < pages && !bit(s.live, q)) ++q;
    if (q - p >= min_pages &&
        platform::fork_image::map_zero_at(target + p * page, (q - p) * page)) {
      --*budget;
    }
    p = q;
  }
}

// In the child: the parent's base is not its own (the mappings keep what
// they took of it). A release that was under way on another thread at the
// fork left its state half-way: then only forgotten.
void forget_base() noexcept {
  // The parent's views of the base are not here (MADV_DONTFORK): their
  // addresses may be another mapping's in this process, never unmapped.
  for (std::size_t i = 0; i < g_fork.base.count; ++i) g_fork.base.segments[i].view = nullptr;
  if (g_fork.base_use.load(std::memory_order_relaxed) == kBaseReleasing) {
    g_fork.base.fd.forget();
    g_fork.base.count = 0;
  } else {
    drop_base();
  }
  g_fork.base_use.store(kBaseFree, std::memory_order_relaxed);
  g_fork.base_deadline.store(0, std::memory_order_relaxed);
  // One thread here: the lock's holder at the fork, if any, is not.
  g_heartbeat_lock.reset();
  mi_register_deferred_free(nullptr, nullptr);
}

// In the child: maps the image at every shadow's target, and an
// inaccessible reservation where a segment has no copy. Runs once, with
// every signal blocked (no handler may touch the heap half-way);
// async-signal-safe.
void restore_once() noexcept {
  Os::SignalMask old;
  platform::fork_image::block_all_signals(&old);
  int expected = kPending;
  if (g_fork.child_state.compare_exchange_strong(expected, kRestored, std::memory_order_acq_rel)) {
    std::size_t free_runs = kMaxFreeRuns;
    for (std::size_t i = 0; i < g_fork.shadow_count; ++i) {
      Shadow& s = g_fork.shadows[i];
      if (map_shadow(s)) {
        map_free_space(s, &free_runs);
      } else {
        g_fork.missing[g_fork.missing_count++] = Missing{s.target, s.size};
        g_fork.child_incomplete = true;
      }
      drop_marks(s);
      drop_live(s);
    }
    close_image();  // the mappings keep the image
    forget_base();
    // What has no copy is never shown as zeros (a child running on wrong
    // data is worse than one that stops): the range is reserved with no
    // access, and a touch of it ends the child with SIGSEGV.
    for (std::size_t i = 0; i < g_fork.missing_count; ++i) {
      platform::fork_image::reserve_inaccessible(g_fork.missing[i].start, g_fork.missing[i].size);
    }
    // The copy is older than the fork: see mimalloc-live.h. A heap with
    // segments missing is forgotten instead (nothing may walk it).
    mnemosyne_mi_fork_child(g_fork.child_incomplete ? 0 : 1);
  }
  Os::restore_signals(old);
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
  if (g_fork.child_state.load(std::memory_order_acquire) != kRestored ||
      Os::process_id() == g_fork.parent_pid) {
    return false;
  }
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  for (std::size_t i = 0; i < g_fork.missing_count; ++i) {
    if (a - reinterpret_cast<std::uintptr_t>(g_fork.missing[i].start) < g_fork.missing[i].size)
      return true;
  }
  return false;
}

bool restore_child_heap(const void* addr) noexcept {
  if (g_fork.child_state.load(std::memory_order_acquire) != kPending) return false;
  if (Os::process_id() == g_fork.parent_pid || !in_copied_segment(addr)) return false;
  restore_once();
  return true;
}

bool child_after_fork(bool own_fork) noexcept {
  g_state.pid.store(Os::process_id(), std::memory_order_relaxed);
  open_fork_gate_in_child();
  forget_fork_helpers();
  g_state.fork_readers.store(0, std::memory_order_relaxed);  // the parent's walks
  // The child of a _Fork from a signal handler while another thread's fork
  // was under way never takes that fork's copy: the other thread went on
  // writing the copy's state while the kernel copied this process's memory
  // page by page, so the child may find it half old, half new (an image
  // already closed under a state that still says ready: 2026-12-07, one
  // run in about a hundred of tst-mallocfork3's shape, a SIGSEGV here).
  if (!own_fork && g_fork.child_state.load(std::memory_order_acquire) == kPending) {
    g_fork.child_state.store(kIdle, std::memory_order_release);
  }
  // A child whose fork made no copy lacks every segment that is not
  // inherited. kRestored means the first fault here already put the copy in.
  if (g_fork.child_state.load(std::memory_order_acquire) == kIdle && any_segment_needs_copy()) {
    g_fork.child_incomplete = true;
    mnemosyne_mi_fork_child(0);  // its heap may not be walked (mimalloc-live.h)
  }
  restore_once();
  close_image();  // a child that took no copy (a nested fork's) has one open too
  forget_base();
  const bool ok = !g_fork.child_incomplete;
  g_fork.shadow_count = 0;
  g_fork.missing_count = 0;
  // copy_early's shadows, if another thread of the parent was making them,
  // are the parent's: forget them here.
  g_fork.early_count = 0;
  g_fork.early_thread.store(0, std::memory_order_relaxed);
  // The driver must never be called here, and segments are the child's own
  // memory from now on: new ones come from the host backend, and a fork of
  // this child copies nothing.
  g_state.forked_child = true;
  driver_mark_forked_child();
  provider_enter_forked_child();
  g_state.backend.store(BackendId::host);
  g_state.exhausted.store(false);
  g_state.grow_lock.reset();
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
