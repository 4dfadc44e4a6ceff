// glibc's malloc extensions, with results that make sense for the arena:
// mallinfo/mallinfo2 report what the heap holds and what is in use in it,
// malloc_trim collects free memory, mallopt accepts and ignores glibc's
// tuning knobs, malloc_stats prints a summary.
#include <malloc.h>
#include <pthread.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include <mimalloc.h>

#include "arena/arena.hpp"
#include "backend/backend_id.hpp"
#include "libc.hpp"
#include "mode.hpp"

using namespace mnemosyne;

namespace {

// glibc's fields mean: `arena` the bytes its heap holds outside mmapped
// chunks, `uordblks`/`fordblks` the bytes in use/free in them, `hblks`/
// `hblkhd` the mmapped chunks (large blocks, one mapping each) and their
// bytes; a program watching its heap reads uordblks + hblkhd as "in use".
// The arena maps onto that as: arenas are glibc's heap (held bytes, blocks in
// use as mimalloc's pages count them), dedicated blocks are its mmapped
// chunks. What glibc's own heap serves in this process (memory from before
// our start, from inside driver calls, the host fallback, or everything when
// the arena is off) is added as glibc reports it.
// `max`: the most dedicated blocks and bytes of them live at once.
struct mallinfo2 heap_info(std::size_t max[2] = nullptr) noexcept {
  struct mallinfo2 info;
  std::memset(&info, 0, sizeof info);
  struct mallinfo2 glibc;
  if (linux_host::mallinfo2(&glibc)) info = glibc;
  if (max != nullptr) max[0] = max[1] = 0;
  if (!arena_mode()) return info;  // a child that lost its heap must not read it
  if (current_mode() == Mode::held) wait_while_held();
  arena::Usage u;
  arena::usage(&u);
  if (max != nullptr) {
    max[0] = u.dedicated_max_blocks;
    max[1] = u.dedicated_max_bytes;
  }
  const std::size_t in_use = u.arena_in_use < u.arena_held ? u.arena_in_use : u.arena_held;
  info.arena += u.arena_held;
  info.uordblks += in_use;
  info.fordblks += u.arena_held - in_use;
  info.hblks += u.dedicated_blocks;
  info.hblkhd += u.dedicated_in_use;
  return info;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) struct mallinfo2 mallinfo2() noexcept {
  return heap_info();
}

// The int fields of the old interface wrap past 2 GiB in glibc; here they
// stop at INT_MAX, which no program can mistake for a small heap.
__attribute__((visibility("default"))) struct mallinfo mallinfo() noexcept {
  const struct mallinfo2 wide = heap_info();
  struct mallinfo info;
  std::memset(&info, 0, sizeof info);
  auto clamp = [](std::size_t v) { return v > 0x7fffffff ? 0x7fffffff : static_cast<int>(v); };
  info.arena = clamp(wide.arena);
  info.ordblks = clamp(wide.ordblks);
  info.smblks = clamp(wide.smblks);
  info.hblks = clamp(wide.hblks);
  info.hblkhd = clamp(wide.hblkhd);
  info.usmblks = clamp(wide.usmblks);
  info.fsmblks = clamp(wide.fsmblks);
  info.uordblks = clamp(wide.uordblks);
  info.fordblks = clamp(wide.fordblks);
  info.keepcost = clamp(wide.keepcost);
  return info;
}

__attribute__((visibility("default"))) int malloc_trim(std::size_t) noexcept {
  if (current_mode() == Mode::held) wait_while_held();
  if (arena_mode()) mi_collect(true);
  return 1;
}

__attribute__((visibility("default"))) int mallopt(int, int) noexcept {
  return 1;
}

// glibc's lines, in its layout (programs and glibc's own tests read them),
// with the heap's figures: the arenas as its arena 0, dedicated blocks as
// its mmapped chunks; then one line of mnemosyne's own.
__attribute__((visibility("default"))) void malloc_stats() noexcept {
  std::size_t max[2];
  const struct mallinfo2 info = heap_info(max);
  char line[512];
  const int n = std::snprintf(
      line, sizeof line,
      "Arena 0:\n"
      "system bytes     = %10zu\n"
      "in use bytes     = %10zu\n"
      "Total (incl. mmap):\n"
      "system bytes     = %10zu\n"
      "in use bytes     = %10zu\n"
      "max mmap regions = %10zu\n"
      "max mmap bytes   = %10zu\n"
      "mnemosyne: backend %s, held %zu bytes, in use %zu bytes\n",
      info.arena, info.uordblks, info.arena + info.hblkhd, info.uordblks + info.hblkhd, max[0],
      max[1], backend_name(arena_mode() ? arena::active_backend() : BackendId::host),
      info.arena + info.hblkhd, info.uordblks + info.hblkhd);
  // write() is a cancellation point and glibc's malloc_stats is not: with
  // a cancellation pending the line would be lost and the thread cancelled
  // here. Cancellation is held off around it, as glibc holds it off around
  // its own output.
  int cancel_state = 0;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
  if (n > 0) (void)!write(2, line, static_cast<std::size_t>(n));
  pthread_setcancelstate(cancel_state, nullptr);
}

}  // extern "C"
