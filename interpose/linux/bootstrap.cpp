// Start-up of the preloaded library: read the options, start the arena,
// install the fork handlers, then switch the exported API to the arena.
//
// The constructor runs at priority 101, before every constructor of default
// priority in this process's libraries that were loaded after us. Anything
// allocated before it (the dynamic loader, earlier constructors) is glibc's
// and is freed back to glibc. The driver is loaded and initialized here,
// once, on the main thread: that is when a CUDA backend's cuInit cost is paid
// (0.1 s to seconds on real hardware), even by a process that never
// allocates again.
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "arena/arena.hpp"
#include "backend/loader.hpp"
#include "bootstrap.hpp"
#include "libc.hpp"
#include "mode.hpp"

namespace mnemosyne {

constinit std::atomic<Mode> g_mode{Mode::host};

namespace {

constinit bool g_started = false;
constinit bool g_fork_prepared = false;

void on_prepare_fork() noexcept {
  g_fork_prepared = g_started && arena_mode();
  if (g_fork_prepared) arena::prepare_fork();
}

void on_parent_after_fork() noexcept {
  if (g_fork_prepared) arena::parent_after_fork();
}

void on_child_after_fork() noexcept {
  if (!g_fork_prepared) return;
  if (!arena::child_after_fork()) {
    g_mode.store(Mode::host, std::memory_order_release);
    warn_line(
        "mnemosyne: this forked child's heap could not be restored; it continues on "
        "the system allocator and ignores frees of its parent's blocks");
  }
}

}  // namespace

void warn_line(const char* line) noexcept {
  char buf[640];
  const int n = std::snprintf(buf, sizeof buf, "%s\n", line);
  if (n > 0) {
    const std::size_t len = static_cast<std::size_t>(n) < sizeof buf ? n : sizeof buf - 1;
    (void)!write(STDERR_FILENO, buf, len);
  }
}

void start_from_options(const StartOptions& options) noexcept {
  if (options.disable) return;
  set_device_ordinal(options.device);
  arena::Config cfg;
  cfg.backend = options.backend;
  cfg.first_segment = options.arena_size;
  cfg.limit = options.limit;
  cfg.fallback = options.fallback;
  cfg.host = arena::HostHeap{&__libc_malloc, &__libc_memalign, &__libc_free};
  cfg.warn = &warn_line;

  arena::StartReport report;
  if (!arena::start(cfg, &report)) {
    char line[512];
    std::snprintf(
        line, sizeof line,
        "mnemosyne: no memory for the heap (%s); the system allocator serves this process",
        report.reason);
    warn_line(line);
    return;
  }
  if (report.reason[0] != '\0') {
    char line[512];
    if (report.active == BackendId::host) {
      std::snprintf(line, sizeof line,
                    "mnemosyne: the %s backend is unavailable (%s); the heap uses host memory",
                    backend_name(report.requested), report.reason);
    } else {
      std::snprintf(line, sizeof line,
                    "mnemosyne: the %s backend is unavailable (%s); allocations fail "
                    "(MNEMOSYNE_FALLBACK=fail)",
                    backend_name(report.requested), report.reason);
    }
    warn_line(line);
  }
  pthread_atfork(&on_prepare_fork, &on_parent_after_fork, &on_child_after_fork);
  g_started = true;
  g_mode.store(Mode::arena, std::memory_order_release);
}

}  // namespace mnemosyne

__attribute__((constructor(101))) static void mnemosyne_constructor() {
  mnemosyne::linux_host::resolve();
  mnemosyne::StartOptions options;
  mnemosyne::read_start_options(&options);
  mnemosyne::start_from_options(options);
}
