// The arena: a private mimalloc whose every segment comes from one backend.
//
// mimalloc runs with limit_os_alloc, so it never takes memory from the OS for
// user blocks: when it returns NULL, the slow path here asks the segment
// provider for another arena (geometric growth, one grower at a time) and
// retries. Requests no arena can serve (alignment above 16 MiB, or very
// large) get a dedicated segment from the same backend.
//
// The fast paths below are mimalloc's own plus one predictable branch.
#pragma once

#include <cstddef>
#include <cstdint>

#include <mimalloc.h>

#include "arena/ownership_map.hpp"
#include "backend/backend_id.hpp"
#include "backend/backends.hpp"

namespace mnemosyne::arena {

enum class Fallback : std::uint8_t { host, fail };
// Whether fresh backend memory reads zero: as the backend says, or as the
// user asserts (MNEMOSYNE_ZEROED).
enum class Zeroed : std::uint8_t { automatic, yes, no };

// The platform's own allocator (glibc's; the CRT's on Windows): where memory
// goes that must not or cannot come from the backend.
// The arena only allocates from it: such blocks are not the arena's
// (owner_tag 0), and the interposer frees them with the platform's own free.
struct HostHeap {
  void* (*malloc)(std::size_t size);
  void* (*memalign)(std::size_t alignment, std::size_t size);
};

struct Config {
  BackendId backend = BackendId::unified;
  std::size_t first_segment = std::size_t{64} << 20;  // first arena reservation
  std::size_t limit = 0;                              // cap on backend bytes; 0 = none
  Fallback fallback = Fallback::host;
  Zeroed zeroed = Zeroed::automatic;
  // pinned: page-lock each arena whole, or only the granules mimalloc
  // commits, and by which route (MNEMOSYNE_PIN; set_pinned_commit).
  PinnedCommit pin = PinnedCommit::whole;
  // How long a fork's image is kept for the forks that follow (src/arena/fork/;
  // MNEMOSYNE_FORK_KEEP_MS); 0: none is kept.
  std::uint64_t fork_keep_ns = 2'000'000'000;
  // How long a forked child may pull its heap page by page before the parent
  // copies the rest (src/arena/fork/pull.cpp; MNEMOSYNE_FORK_PULL_MS); 0: a
  // fork copies the heap before it returns.
  std::uint32_t fork_pull_ms = 0;
  HostHeap host{};
  void (*warn)(const char* line) = nullptr;  // one line, no newline
};

// Room for a reason in messages: a driver's path and what went wrong with it.
inline constexpr std::size_t kReasonLen = 512;

struct StartReport {
  BackendId requested = BackendId::none;
  BackendId active = BackendId::none;  // host when the requested one failed
  char reason[kReasonLen] = {};        // why the requested backend is not active
};

// Sets mimalloc's options, then reserves the first arena from cfg.backend, or
// from the host backend (mmap) when that fails. False only when not even the
// host backend could give memory; the caller then serves from its host heap.
bool start(const Config& cfg, StartReport* report) noexcept;

// What a free of an arena block may do without the embedder's checks: the
// ownership map's entries of every arena chunk carry `route` (0,
// kOwnerFastFree or kOwnerCountedFree), and those of arenas added later, so
// the free fast path tests the one byte it loads. 0 at start. The embedder
// sets 0 while frees must be checked (a fork's copy of the heap that they
// must wait for) and a route when they need none or only a count; a free
// that loaded its entry before a change may still complete by the old
// route, as with any flag it could test instead. Takes the segment table's
// lock (asynchronous signals blocked); async-signal-safe; not from a thread
// that holds that lock (between prepare_fork and the after-fork handlers).
// Calls are serialised by the caller.
void set_free_route(std::uint8_t route) noexcept;

inline constexpr std::size_t kMaxArenaAlign = std::size_t{16} << 20;  // MI_ALIGNMENT_MAX

void* alloc_slow(std::size_t size, std::size_t alignment, bool zero) noexcept;
void free_dedicated(void* ptr) noexcept;

// Requests at least this large get a segment of their own (alloc_slow);
// 16 MiB or more, 1 GiB at most.
std::size_t dedicated_threshold() noexcept;
// Whether a request of `size` bytes never comes from mimalloc: it is not
// asked, as it would fail, and a mimalloc that fails collects its whole
// heap first (a program making requests no allocator can serve freed and
// faulted back a page for each: 196,000 page faults where glibc took 200).
inline bool is_dedicated_request(std::size_t size) noexcept {
  return __builtin_expect(size >= (std::size_t{16} << 20), 0) && size >= dedicated_threshold();
}
std::size_t dedicated_size(const void* ptr) noexcept;
void* realloc_slow(void* ptr, std::uint8_t tag, std::size_t size) noexcept;

inline void* alloc(std::size_t size) noexcept {
  if (is_dedicated_request(size)) return alloc_slow(size, 0, false);
  void* p = mi_malloc(size);
  if (__builtin_expect(p != nullptr, 1)) return p;
  return alloc_slow(size, 0, false);
}

inline void* alloc_zeroed(std::size_t size) noexcept {
  if (is_dedicated_request(size)) return alloc_slow(size, 0, true);
  void* p = mi_zalloc(size);
  if (__builtin_expect(p != nullptr, 1)) return p;
  return alloc_slow(size, 0, true);
}

// mi_malloc_aligned_at(.., 0), not mi_malloc_aligned: 2.0.9's fast path of the
// latter returns under-aligned blocks (a 512-byte alignas(256) object came
// back 128-aligned; upstream issues #700, #602).
inline void* alloc_aligned(std::size_t size, std::size_t alignment) noexcept {
  if (alignment <= kMaxArenaAlign && !is_dedicated_request(size)) {
    void* p = mi_malloc_aligned_at(size, alignment, 0);
    if (__builtin_expect(p != nullptr, 1)) return p;
  }
  return alloc_slow(size, alignment, false);
}

// `tag` is owner_tag(ptr), non-zero.
inline void free(void* ptr, std::uint8_t tag) noexcept {
  if (__builtin_expect((tag & kOwnerArena) != 0, 1)) {
    mi_free(ptr);
  } else {
    free_dedicated(ptr);
  }
}

inline std::size_t usable_size(const void* ptr, std::uint8_t tag) noexcept {
  if ((tag & kOwnerArena) != 0) return mi_usable_size(ptr);
  return dedicated_size(ptr);
}

// A realloc that grows a block to this size or more makes it a growable
// block: one that later reallocs grow where it stands, as glibc's mremap
// does (arena.cpp; managed memory from 16 MiB on).
inline constexpr std::size_t kGrowableMin = (std::size_t{4} << 20) + 1;

// Resizes a block this arena owns (`tag` non-zero, size > 0). Null on failure,
// the old block then left as it was.
inline void* realloc(void* ptr, std::uint8_t tag, std::size_t size) noexcept {
  if (__builtin_expect(
          (tag & kOwnerArena) != 0 && (size < kGrowableMin || size <= mi_usable_size(ptr)), 1)) {
    void* p = mi_realloc(ptr, size);
    if (__builtin_expect(p != nullptr, 1)) return p;
  }
  return realloc_slow(ptr, tag, size);
}

// Whether memory fresh from `backend` is treated as zero: MNEMOSYNE_ZEROED
// (Config::zeroed) when given, else what the backend says.
bool fresh_memory_reads_zero(BackendId backend) noexcept;

// The backend that new segments come from now.
BackendId active_backend() noexcept;

// fork() without exec (see src/arena/fork/): the live data of segments a child
// does not inherit is copied into private memory before the fork, and the
// child moves that copy to the segments' addresses; afterwards the child
// grows with host memory and never calls the driver.
//
// copy_early: from a fork() wrapper, before any atfork handler runs; copies
// through the driver what the CPU has not mapped. False when there was no
// memory for the copy (the fork should then fail with ENOMEM). end_early:
// after the fork, on the same thread; frees what prepare_fork did not take.
bool copy_early() noexcept;
void end_early() noexcept;
// The atfork handlers (prepare runs last among prepare handlers when
// registered first). child_after_fork returns false when the child's heap
// could not be restored: the caller must then stop using the arena.
// own_fork is false in the child of a fork made while another thread's fork
// was under way (a _Fork from a signal handler): that child never takes the
// other fork's copy.
// may_pull: the program has no thread but the forking one (the driver's
// aside), so its child may pull its heap (fork/pull.cpp).
void prepare_fork(bool may_pull = false) noexcept;
void parent_after_fork() noexcept;
bool child_after_fork(bool own_fork = true) noexcept;
// A child that pulls its heap (MNEMOSYNE_FORK_PULL_MS, fork/pull.cpp):
// fork_child_pulls says, in the parent after the clone, whether this fork's
// child does; serve_forked_child then serves it (from the parent's after-fork
// handler, before parent_after_fork, with the program's other threads held
// and glibc's stdio list locked) until it execs or exits, or copies the rest
// into its image; finish_pull_in_child, in a child still pulling, before it
// forks itself, has its parent copy the rest.
bool fork_pull_enabled() noexcept;  // MNEMOSYNE_FORK_PULL_MS is not 0
// Whether the next fork's child would pull, as far as the arena can tell
// before the fork (the option, a kept base, userfaultfd): copy_early's
// driver copy is then not worth making.
bool fork_may_pull() noexcept;
bool fork_child_pulls() noexcept;
void serve_forked_child() noexcept;
void finish_pull_in_child() noexcept;
// The driver gate of a fork (arena.cpp). close_fork_gate: from a fork()
// wrapper, before glibc's fork() runs the atfork handlers (the driver's may
// hold the driver's locks until the fork is over); from then on the
// allocation slow path serves from the host heap instead of asking the
// driver, and the call returns once no other thread is inside the slow
// path. open_fork_gate: once the fork is over, in the parent (the child
// opens it in child_after_fork).
void close_fork_gate() noexcept;
void open_fork_gate() noexcept;
// Closes the image kept for the children of forks that follow each other
// once no fork has come for the reuse window (src/arena/fork/); the children
// that map it keep it. From mimalloc's heartbeat (the allocation slow path),
// which calls it only while a base is kept (src/arena/fork/). Linux only.
void release_idle_fork_image() noexcept;
// Starts the threads that help a fork copy a large heap (fork/helpers.hpp)
// once the segments a child would lack reach 256 MiB; cheap after that.
// From the allocation slow path, outside every lock. Linux only.
void start_fork_copy_helpers() noexcept;
// For a fault handler in the child, before child_after_fork ran: whether
// `addr` lies in a segment whose copy could not be made (reserved without
// access). Async-signal-safe.
bool lost_in_child(const void* addr) noexcept;
// For a fault handler in the child, before child_after_fork ran: when `addr`
// lies in a segment the child lacks, puts every copy in place and returns
// true (the faulting access can be retried). Async-signal-safe.
bool restore_child_heap(const void* addr) noexcept;

struct Stats {
  std::uint64_t segments = 0;                        // arenas held (added, less those given back)
  std::uint64_t dedicated_live = 0;                  // dedicated blocks live now
  std::uint64_t dedicated_total = 0;                 // dedicated blocks served
  std::uint64_t bytes_reserved[kBackendCount] = {};  // per backend, arenas + dedicated
  std::uint64_t host_fallbacks =
      0;  // requests the backend could not serve, served by the host heap
  std::uint64_t driver_allocations = 0;  // the driver's own requests that needed new memory
  std::uint64_t grow_waits_timed_out = 0;
  std::uint64_t fork_bytes_copied = 0;      // written into children's copies
  std::uint64_t fork_bytes_via_driver = 0;  // read through the driver for them
  std::uint64_t fork_copy_workers = 0;      // most threads one fork's copy ran on
  bool forked_child = false;                // this process is a child of fork() without exec
};
void stats(Stats* out) noexcept;

// What the heap holds now, for mallinfo2 and malloc_stats: arenas (held
// from the backends, and the bytes of blocks in use in them, as their pages
// count them) and dedicated blocks (one segment each, in use while live).
// Walks every arena's page tables: a slow call, no lock of the fast path.
struct Usage {
  std::uint64_t arena_held = 0;
  std::uint64_t arena_in_use = 0;
  std::uint64_t dedicated_blocks = 0;
  std::uint64_t dedicated_in_use = 0;      // their usable bytes
  std::uint64_t dedicated_held = 0;        // what the backends gave for them
  std::uint64_t dedicated_max_blocks = 0;  // the most live at once
  std::uint64_t dedicated_max_bytes = 0;   // the most usable bytes of them at once
};
void usage(Usage* out) noexcept;

// Why the first request went to the host heap instead of the backend; ""
// when none did.
const char* fallback_reason() noexcept;

}  // namespace mnemosyne::arena
