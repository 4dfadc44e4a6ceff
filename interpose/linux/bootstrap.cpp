// Start-up of the preloaded library: register the fork handlers, read the
// options, start the arena and the exit report, then switch the exported API
// to the arena.
//
// The constructor runs at priority 101, before every constructor of default
// priority in this process's libraries that were loaded after us. Anything
// allocated before it (the dynamic loader, earlier constructors) is glibc's
// and is freed back to glibc. The driver is loaded and initialized here,
// once, on the main thread: that is when a CUDA backend's cuInit cost is paid
// (0.1 s to seconds on real hardware), even by a process that never
// allocates again.
#include "bootstrap.hpp"

#include <stdlib.h>
#include <sys/auxv.h>
#include <unistd.h>

#include <cstdio>

#include "arena/arena.hpp"
#include "common/start_report.hpp"
#include "fork.hpp"
#include "libc.hpp"
#include "mode.hpp"
#include "stats_report.hpp"

extern char** environ;

namespace mnemosyne {

namespace {

constinit config::Options g_options{};

void start() noexcept {
  config::Options& o = g_options;
  config::read_options(environ, getauxval(AT_SECURE) != 0, &o, &warn_line);
  if (o.disable) {
    if (o.verbose) warn_line("mnemosyne: DISABLE is set: the system allocator serves this process");
    return;
  }
  const StartPlatform platform{arena::HostHeap{&__libc_malloc, &__libc_memalign},
                               "the system allocator", static_cast<long>(getpid()), "", &warn_line};
  if (!start_heap(o, platform)) return;

  g_policy.counting = o.show_stats || o.stats_file[0] != '\0';
  g_policy.routing = o.size_routing;
  g_policy.size_min = o.size_min;
  g_policy.size_max = o.size_max;
  g_free_checks.store(g_policy.counting ? kFreeCounting : 0, std::memory_order_relaxed);
  if (g_policy.counting) install_exit_report();
  g_mode.store(g_policy.counting || g_policy.routing ? Mode::managed : Mode::arena,
               std::memory_order_release);
}

}  // namespace

const config::Options& start_options() noexcept {
  return g_options;
}

void warn_line(const char* line) noexcept {
  char buf[1024];
  const int n = std::snprintf(buf, sizeof buf, "%s\n", line);
  if (n > 0) {
    const std::size_t len = static_cast<std::size_t>(n) < sizeof buf ? n : sizeof buf - 1;
    (void)!write(STDERR_FILENO, buf, len);
  }
}

}  // namespace mnemosyne

__attribute__((constructor(101))) static void mnemosyne_constructor() {
  mnemosyne::install_fork_handling();
  mnemosyne::linux_host::resolve();
  mnemosyne::start();
}
