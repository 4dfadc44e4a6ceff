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
#include <cstring>

#include "arena/arena.hpp"
#include "backend/loader.hpp"
#include "fork.hpp"
#include "libc.hpp"
#include "mode.hpp"
#include "stats_report.hpp"

extern char** environ;

namespace mnemosyne {

namespace {

constinit config::Options g_options{};

// DEVICE=local-rank: the rank's local index modulo the device count, which
// needs the driver (loaded here, at the moment it would be anyway).
int choose_device(const config::Options& o) noexcept {
  if (!o.device_local_rank) return o.device;
  if (!is_cuda_backend(o.backend) || o.local_rank < 0 || driver_api() == nullptr) return 0;
  const int count = driver_info().device_count;
  return count > 0 ? o.local_rank % count : 0;
}

void say(const char* fmt, const char* a, const char* b = "") noexcept {
  char line[1024];
  std::snprintf(line, sizeof line, fmt, a, b);
  warn_line(line);
}

void print_verbose(const config::Options& o, const arena::StartReport& report,
                   int device) noexcept {
  char line[1024];
  std::snprintf(line, sizeof line, "mnemosyne: version %s, pid %ld", MNEMOSYNE_VERSION,
                static_cast<long>(getpid()));
  warn_line(line);
  std::snprintf(line, sizeof line,
                "mnemosyne: BACKEND=%s DEVICE=%d%s SIZE=%zu:%zu%s ARENA_SIZE=%zu LIMIT=%zu%s "
                "FALLBACK=%s",
                backend_name(o.backend), device, o.device_local_rank ? " (local-rank)" : "",
                o.size_min, o.size_max, o.size_routing ? "" : " (all sizes)", o.arena_size, o.limit,
                o.limit == 0 ? " (none)" : "",
                o.fallback == config::Fallback::fail ? "fail" : "host");
  warn_line(line);
  std::snprintf(line, sizeof line,
                "mnemosyne: SHOW_STATS=%d STATS_FILE=%.200s CUDA_DRIVER=%.200s DISABLE=0 VERBOSE=1",
                o.show_stats ? 1 : 0, o.stats_file[0] ? o.stats_file : "(none)",
                o.cuda_driver[0] ? o.cuda_driver : "(default search)");
  warn_line(line);
  const DriverState state = driver_state();
  if (state == DriverState::ready) {
    const DriverInfo& info = driver_info();
    std::snprintf(line, sizeof line, "mnemosyne: driver %.300s, CUDA %d.%d, %d device(s)",
                  info.path, info.version / 1000, (info.version % 1000) / 10, info.device_count);
  } else if (state == DriverState::unavailable) {
    std::snprintf(line, sizeof line, "mnemosyne: driver unavailable: %.700s", driver_info().reason);
  } else {
    std::snprintf(line, sizeof line, "mnemosyne: driver not loaded (the %s backend needs none)",
                  backend_name(o.backend));
  }
  warn_line(line);
  std::snprintf(line, sizeof line, "mnemosyne: heap on %s%s%.300s", backend_name(report.active),
                report.reason[0] ? ": " : "", report.reason);
  warn_line(line);
}

void start() noexcept {
  config::Options& o = g_options;
  config::read_options(environ, getauxval(AT_SECURE) != 0, &o, &warn_line);
  if (o.disable) {
    if (o.verbose) warn_line("mnemosyne: DISABLE is set: the system allocator serves this process");
    return;
  }
  set_driver_path(o.cuda_driver);
  const int device = choose_device(o);
  set_device_ordinal(device);

  arena::Config cfg;
  cfg.backend = o.backend;
  cfg.first_segment = o.arena_size;
  cfg.limit = o.limit;
  cfg.fallback =
      o.fallback == config::Fallback::fail ? arena::Fallback::fail : arena::Fallback::host;
  cfg.host = arena::HostHeap{&__libc_malloc, &__libc_memalign, &__libc_free};
  cfg.warn = &warn_line;

  arena::StartReport report;
  if (!arena::start(cfg, &report)) {
    say("mnemosyne: no memory for the heap (%.300s); the system allocator serves this process",
        report.reason);
    return;
  }
  if (report.reason[0] != '\0') {
    if (report.active == BackendId::host) {
      say("mnemosyne: the %s backend is unavailable (%.700s); the heap uses host memory",
          backend_name(report.requested), report.reason);
    } else {
      say("mnemosyne: the %s backend is unavailable (%.700s); allocations fail "
          "(MNEMOSYNE_FALLBACK=fail)",
          backend_name(report.requested), report.reason);
    }
  }
  if (o.verbose) print_verbose(o, report, device);

  g_policy.counting = o.show_stats || o.stats_file[0] != '\0';
  g_policy.routing = o.size_routing;
  g_policy.size_min = o.size_min;
  g_policy.size_max = o.size_max;
  g_free_checks.store(g_policy.counting ? kFreeCounting : 0, std::memory_order_relaxed);
  if (o.show_stats || o.stats_file[0] != '\0') install_exit_report();
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
