// glibc's malloc extensions, with results that make sense for the arena:
// mallinfo/mallinfo2 report the arena's committed and in-use bytes (from
// mimalloc's process statistics), malloc_trim collects free memory, mallopt
// accepts and ignores glibc's tuning knobs, malloc_stats prints a summary.
#include <malloc.h>
#include <pthread.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include <mimalloc.h>

#include "arena/arena.hpp"
#include "backend/backend_id.hpp"
#include "mode.hpp"

using namespace mnemosyne;

namespace {

struct Usage {
  std::size_t reserved;  // bytes of segments taken from backends
  std::size_t in_use;    // bytes of live blocks (approximate, mimalloc's view)
};

Usage usage() noexcept {
  arena::Stats s;
  arena::stats(&s);
  Usage u{0, 0};
  for (int i = 0; i < kBackendCount; ++i) u.reserved += s.bytes_reserved[i];
  std::size_t elapsed, user, sys, current_rss, peak_rss, current_commit, peak_commit, faults;
  mi_process_info(&elapsed, &user, &sys, &current_rss, &peak_rss, &current_commit, &peak_commit,
                  &faults);
  u.in_use = current_commit < u.reserved ? current_commit : u.reserved;
  return u;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) struct mallinfo2 mallinfo2() noexcept {
  struct mallinfo2 info;
  std::memset(&info, 0, sizeof info);
  const Usage u = usage();
  info.arena = u.reserved;
  info.uordblks = u.in_use;
  info.fordblks = u.reserved - u.in_use;
  return info;
}

__attribute__((visibility("default"))) struct mallinfo mallinfo() noexcept {
  const struct mallinfo2 wide = mallinfo2();
  struct mallinfo info;
  std::memset(&info, 0, sizeof info);
  auto clamp = [](std::size_t v) { return v > 0x7fffffff ? 0x7fffffff : static_cast<int>(v); };
  info.arena = clamp(wide.arena);
  info.uordblks = clamp(wide.uordblks);
  info.fordblks = clamp(wide.fordblks);
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

__attribute__((visibility("default"))) void malloc_stats() noexcept {
  const Usage u = usage();
  char line[256];
  const int n = std::snprintf(line, sizeof line,
                              "mnemosyne: backend %s, reserved %zu bytes, in use %zu bytes\n",
                              backend_name(arena::active_backend()), u.reserved, u.in_use);
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
