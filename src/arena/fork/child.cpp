// The child's side of a fork: the parent's image mapped at the segments'
// addresses (a base with the delta's pages over it), free space as fresh
// memory, and what could not be copied reserved with no access.
//
// When the child gets its copy: in a child of a multi-threaded parent,
// glibc's fork() touches the heap before any atfork child handler runs (it
// resets the lock of every FILE). So the child maps the image at its first
// touch of a missing segment, from a fault handler (restore_child_heap,
// async-signal-safe), or in child_after_fork, whichever comes first.
#include <mimalloc-live.h>

#include "arena/fork/internal.hpp"
#include "arena/segment_provider.hpp"
#include "backend/loader.hpp"

namespace mnemosyne::arena {

namespace forking {

// In the child: maps `file` at [at, at + size), privately.
static bool map_image(int file, unsigned char* at, std::size_t size) noexcept {
  return platform::fork_image::map_at(file, at, size, reinterpret_cast<std::uintptr_t>(at));
}

// In the child: the shadow's copy at its target; from a delta, the base with
// the delta's runs over it.
static bool map_shadow(const Shadow& s) noexcept {
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
static void map_free_space(const Shadow& s, std::size_t* budget) noexcept {
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
static void forget_base() noexcept {
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
  forget_heartbeat();
}

// In the child: maps the image at every shadow's target, and an
// inaccessible reservation where a segment has no copy. Runs once, with
// every signal blocked (no handler may touch the heap half-way);
// async-signal-safe.
static void restore_once() noexcept {
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
    // A child that pulls: the image is empty yet; its pages are watched,
    // and the parent fills them as they are touched (pull.cpp).
    if (g_fork.pull) start_pull_in_child();
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

static bool in_copied_segment(const void* addr) noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  const SegmentTable::Entry* entries = g_state.table.entries();
  for (std::size_t i = 0; i < g_state.table.high_water(); ++i) {
    const SegmentTable::Entry& e = entries[i];
    const auto start = reinterpret_cast<std::uintptr_t>(e.segment.start);
    if (e.used && !inherited(e.segment.backend) && a - start < e.segment.size) return true;
  }
  return false;
}

}  // namespace forking

using namespace forking;

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
  if (!own_fork) {  // nor that fork's pull
    g_fork.pull_parent.close();
    g_fork.pull_child.close();
    g_fork.pull = false;
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
