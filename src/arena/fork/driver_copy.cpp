// The driver's copy of pages the CPU has not mapped, before the fork: in
// managed memory they may hold data that lives on a device, where a CPU read
// would migrate it back. copy_early runs from the fork() wrapper, before any
// atfork handler, outside the segment table's lock; prepare_fork adopts its
// bitmaps of the pages it copied (adopt_early) and reads the rest with the
// CPU.
#include <mimalloc-live.h>

#include "arena/fork/internal.hpp"
#include "backend/loader.hpp"

namespace mnemosyne::arena {

namespace forking {

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

// copy_early's bitmap of the pages it copied.
static bool map_bitmap(Shadow& s) noexcept {
  s.early = map_bits(s.size / Os::page_size(), &s.early_map_bytes);
  return s.early != nullptr;
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

}  // namespace forking

using namespace forking;

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

}  // namespace mnemosyne::arena
