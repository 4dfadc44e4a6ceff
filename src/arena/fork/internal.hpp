// The fork path's shared parts: its state (one object, g_fork), the types
// its files pass each other, and what each file offers the others. Internal
// to src/arena/fork/; the arena's entry points are in arena.hpp.
//
// How a fork gives the child its heap, file by file:
//  - image.cpp: the image the child maps, a memfd whose offsets are
//    addresses; the base kept for the forks that follow, and the deltas
//    over it.
//  - driver_copy.cpp: before the fork, pages the CPU has not mapped (data a
//    device may hold) copied through the driver.
//  - copy_pass.cpp: the parent's side: prepare_fork's pass over every
//    segment's live ranges, on the fork helpers (helpers.hpp) too for a
//    large heap, and what the parent keeps afterwards.
//  - child.cpp: the child's side: the image mapped at the segments'
//    addresses, at its first touch of the heap or in its atfork handler.
//  - pull.cpp: a child that takes its heap page by page as it touches it
//    (MNEMOSYNE_FORK_PULL_MS), served by the parent's forking thread until
//    it execs or exits, or the parent copies the rest as above.
// Nothing here allocates: a fork may come from a signal handler, or while
// another thread holds the heap.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "arena/arena.hpp"
#include "arena/fork/helpers.hpp"
#include "arena/segment_table.hpp"
#include "arena/state.hpp"
#include "backend/backends.hpp"
#include "platform/fork_image.hpp"
#include "platform/platform.hpp"

namespace mnemosyne::arena::forking {

constexpr std::size_t kMaxShadows = SegmentTable::kCapacity;
// The image's size: every user address (ownership_map.hpp) is an offset.
constexpr std::uint64_t kImageBytes = std::uint64_t{1} << kAddressBits;
// A fork soon after the last one shares its base: the forks of a pool of
// workers or a data loader come a few milliseconds apart; by default (2 s)
// a server's periodic fork (a snapshot a minute) gets an image of its own,
// and keeps no copy of the heap in memory in between. MNEMOSYNE_FORK_KEEP_MS
// trades that memory for cheaper periodic forks, or (0) keeps none.
inline std::uint64_t keep_ns() noexcept {
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
// fork helpers too (helpers.hpp), each taking stripes of kStripeBytes:
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

  // The pull (pull.cpp). In the parent, from prepare_fork to the end of its
  // service: this fork's child pulls. In the child: it pulls still (its
  // parent serves it), until its pull is over.
  bool pull = false;
  bool pull_adopt = false;  // prepare_fork adopted copy_early's bitmaps
  Descriptor pull_parent;   // the parent's end of the socket
  Descriptor pull_child;    // the child's end
  Descriptor pull_faults;   // the child's userfaultfd (either side)
  // In the child: which files those two are (the program may close them and
  // reuse the numbers).
  std::uint64_t pull_child_id = 0;
  std::uint64_t pull_faults_id = 0;
  // In the child: its watched segments are the first pull_count of shadows
  // (child_after_fork forgets shadow_count).
  std::size_t pull_count = 0;
};
extern constinit ForkCopy g_fork;  // defined in image.cpp

// ---- small helpers

inline bool inherited(BackendId id) noexcept {
  return g_state.forked_child ||
         with_backend(id, []<MemoryBackend B>() { return B::inherited_by_fork; });
}

inline bool data_off_cpu(BackendId id) noexcept {
  return with_backend(id, []<MemoryBackend B>() { return B::data_off_cpu; });
}

inline bool copy_out(BackendId id, void* dst, const void* src, std::size_t size) noexcept {
  return with_backend(id, [&]<MemoryBackend B>() { return B::copy_out(dst, src, size); });
}

inline void* map_anonymous(std::size_t size) noexcept {
  int err = 0;
  return Os::map_pages(size, &err);
}

// Page bitmaps (Shadow::early, Shadow::marks): anonymous memory, which a
// child inherits (it reads the marks of its delta).
inline std::uint64_t* map_bits(std::size_t pages, std::size_t* map_bytes) noexcept {
  *map_bytes = round_up((pages + 63) / 64 * sizeof(std::uint64_t), Os::page_size());
  return static_cast<std::uint64_t*>(map_anonymous(*map_bytes));
}

inline void unmap_bits(std::uint64_t*& bits, std::size_t map_bytes) noexcept {
  if (bits != nullptr) Os::unmap_pages(bits, map_bytes);
  bits = nullptr;
}

inline bool bit(const std::uint64_t* bits, std::size_t i) noexcept {
  return (bits[i / 64] >> (i % 64) & 1) != 0;
}

inline void set_bit(std::uint64_t* bits, std::size_t i, bool on) noexcept {
  const std::uint64_t m = std::uint64_t{1} << (i % 64);
  bits[i / 64] = on ? bits[i / 64] | m : bits[i / 64] & ~m;
}

inline void drop_bitmap(Shadow& s) noexcept {
  unmap_bits(s.early, s.early_map_bytes);
}

inline bool is_zero(const unsigned char* p, std::size_t n) noexcept {
  std::uint64_t acc = 0;
  for (std::size_t i = 0; i < n; i += sizeof acc) {
    std::uint64_t w;
    std::memcpy(&w, p + i, sizeof w);
    acc |= w;
  }
  return acc == 0;
}

inline bool early_copied(const Shadow& s, std::size_t page_index) noexcept {
  return s.early != nullptr && bit(s.early, page_index);
}

inline void drop_marks(Shadow& s) noexcept {
  unmap_bits(s.marks, s.marks_map_bytes);
}

inline void drop_live(Shadow& s) noexcept {
  unmap_bits(s.live, s.live_map_bytes);
}

// ---- a pass over a segment's live ranges (copy_pass.cpp, driver_copy.cpp)

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

// ---- image.cpp

// RLIMIT_FSIZE lifted while the image is made (false: it cannot be), and
// put back to the program's.
bool lift_file_size_limit() noexcept;
void restore_file_size_limit() noexcept;
// Closes the base (the children that map it keep it). Under kBaseForking or
// kBaseReleasing, or in a child.
void drop_base() noexcept;
// mimalloc's heartbeat calls release_idle_fork_image while a base is kept.
void set_heartbeat(bool wanted) noexcept;
// In a forked child: the heartbeat's lock free and the callback gone.
void forget_heartbeat() noexcept;
// Takes g_fork.base for this fork.
void use_base() noexcept;
// The fork's image (a delta over the base when the base serves; `fresh`: a
// base whatever the base), and its release.
bool open_image(bool fresh = false) noexcept;
void close_image() noexcept;
// Whether a delta has been given up (too scattered: kMaxDeltaRuns).
bool delta_abandoned() noexcept;
// Pages [at, at + size), whose contents are at `src`, into the image.
void put(Pass& pass, const unsigned char* at, const unsigned char* src, std::size_t size) noexcept;
// The shadow's page marks before its passes.
bool begin_marks(Shadow& s) noexcept;
// A delta's runs of marked pages (its pages into g_fork.delta_pages).
std::size_t count_delta_runs() noexcept;
// After the fork, in the parent: the image kept as the base, or a delta's size.
void keep_image() noexcept;

// ---- driver_copy.cpp

// Pages [first, first + count) the CPU has not mapped, through the driver.
void early_copy(Pass& pass, std::size_t first, std::size_t count) noexcept;
// copy_early's shadows dropped.
void drop_early() noexcept;
// copy_early's bitmaps of table entry `serial` moved into `out`.
bool adopt_early(std::uint64_t serial, Shadow& out) noexcept;

// ---- copy_pass.cpp

// A segment's live ranges, through the pass.
void copy_segment(const SegmentTable::Entry& e, Pass& pass) noexcept;
// A shadow of table entry `e`, with no bitmaps yet.
void describe(Shadow& s, const SegmentTable::Entry& e) noexcept;
// Whether some segment would need a copy in a child.
bool any_segment_needs_copy() noexcept;
// The pass's bytes into the statistics.
void add_copied(const Pass& pass) noexcept;
// Every segment a child lacks, into the image (prepare_fork's pass; the
// pull's when the child has pulled for long enough).
void copy_all(bool adopt) noexcept;

// ---- pull.cpp

// In prepare_fork: whether this fork's child pulls, and if so, everything
// it needs made (the image, empty; the socket; the shadows).
bool prepare_pull(bool adopt) noexcept;
// In the child, from restore_once, the image mapped: its pages watched and
// the parent asked to serve them (or, where it cannot be, to copy them all).
void start_pull_in_child() noexcept;

}  // namespace mnemosyne::arena::forking
