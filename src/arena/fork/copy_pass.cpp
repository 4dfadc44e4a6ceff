// The parent's side of a fork: the copy pass over every segment a child
// does not inherit, into the image (image.cpp), under the segment table's
// lock from prepare_fork until the fork is over.
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
// A large heap (kParallelBytes) is copied, or compared, by the forking thread
// and the fork helpers (helpers.hpp) at once, each its share of every
// segment (Share): one core does not read memory as fast as several.
#include <algorithm>

#include <mimalloc-live.h>

#include "arena/fork/internal.hpp"
#include "arena/segment_provider.hpp"

namespace mnemosyne::arena {

namespace forking {

// Copies pages [first, first + count) of the segment as they are (CPU pass).
static void cpu_copy(Pass& pass, std::size_t first, std::size_t count) noexcept {
  const std::size_t page = Os::page_size();
  auto* base = static_cast<const unsigned char*>(pass.shadow->target);
  put(pass, base + first * page, base + first * page, count * page);
}

// Handles a run of pages that mincore found unmapped (resident = false) or
// mapped, according to the pass.
static void copy_run(Pass& pass, std::size_t first, std::size_t count, bool resident) noexcept {
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
static void copy_live(Pass& pass, void* start, std::size_t size) noexcept {
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

static void flush(Pass& pass) noexcept {
  if (pass.pending_size != 0) copy_live(pass, pass.pending, pass.pending_size);
  pass.pending_size = 0;
}

// A live range (or part of one) the pass copies.
static void take_range(Pass& pass, unsigned char* at, std::size_t size) noexcept {
  if (pass.pending_size != 0 && pass.pending + pass.pending_size == at) {
    pass.pending_size += size;
    return;
  }
  flush(pass);
  pass.pending = at;
  pass.pending_size = size;
}

// mnemosyne_mi_range_fn: one live range; they come in address order.
static void copy_range(void* start, std::size_t size, void* arg) noexcept {
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

// The bytes of the segments a child would need a copy of.
static std::size_t bytes_needing_copy() noexcept {
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

// A worker's share of the CPU pass over every segment copy_all prepared;
// `arg` points to its Share.
static void copy_share(void* arg, std::size_t worker, std::size_t workers) noexcept {
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

}  // namespace forking

using namespace forking;

void prepare_fork(bool may_pull) noexcept {
  finish_pull_in_child();       // a child still pulling: its own child needs all of it
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
  if (may_pull && prepare_pull(adopt)) {  // the child pulls: nothing copied now
    restore_file_size_limit();
    g_fork.child_incomplete = false;
    g_fork.child_state.store(kPending, std::memory_order_release);
    return;
  }
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
  serve_forked_child();  // if the interposer has not (a no-op then)
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

}  // namespace mnemosyne::arena
