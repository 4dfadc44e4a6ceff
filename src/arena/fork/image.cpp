// The image a forked child maps its heap from, and the base kept for the
// forks that follow.
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
// Children that follow each other share one image (the base): the first
// fork's image is kept, and a fork soon after (Config::fork_keep_ns,
// MNEMOSYNE_FORK_KEEP_MS) writes only the pages whose contents differ from
// it into an image of its own (a delta), which its child maps over the base
// where they differ. Contents are compared, not tracked: memory a GPU or a
// driver copy writes changes no page table, so only a comparison sees it.
// The base is kept while forks follow each other; once none has come for
// the window it is closed (the children that map it keep it), from
// mimalloc's heartbeat (release_idle_fork_image) or at the next fork.
#include <errno.h>

#include <mimalloc-live.h>

#include "arena/fork/internal.hpp"

namespace mnemosyne::arena {

namespace forking {

constinit ForkCopy g_fork;

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
static constinit SpinLock g_heartbeat_lock;

static void on_heartbeat(bool, unsigned long long, void*) noexcept {
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
static bool base_reusable() noexcept {
  return g_fork.base.fd.open() && Os::monotonic_ns() - g_fork.base.last_fork_ns <= keep_ns() &&
         g_fork.base.delta_pages <= g_fork.base.pages / 2;
}

// The fork's image, made once per fork (both passes write into it). A memfd;
// close-on-exec, so that a child that execs without touching its heap leaves
// it behind. A delta over the base when the base serves (see above);
// `fresh` asks for a base whatever the base (a delta that would not do).
bool open_image(bool fresh) noexcept {
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
static bool write_image(const void* at, const void* src, std::size_t size,
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

static void write_pages(Pass& pass, const unsigned char* at, const unsigned char* src,
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
static bool note_delta_run() noexcept {
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
static void put_delta(Pass& pass, const unsigned char* at, const unsigned char* src,
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

// A delta's segment that the base holds whole is compared through a view of
// the base (mapped once, kept with the base): a read of the base with
// read_at costs a system call and a copy per kCompareBytes, a delta of a
// heap of small objects many of them.
static void compare_view(Shadow& held, Shadow& s) noexcept {
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

void forget_heartbeat() noexcept {
  // One thread here: the lock's holder at the fork, if any, is not.
  g_heartbeat_lock.reset();
  mi_register_deferred_free(nullptr, nullptr);
}

}  // namespace forking

using namespace forking;

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

}  // namespace mnemosyne::arena
