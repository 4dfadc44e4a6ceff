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
#include "common/start_heap.hpp"
#include "cxx_alloc.hpp"
#include "fork.hpp"
#include "libc.hpp"
#include "mode.hpp"
#include "stats_report.hpp"

extern char** environ;

namespace mnemosyne {

namespace {

constinit config::Options g_options{};

// PROGRAMS and EXCLUDE: whether this process is one whose heap moves. Its
// names: the file execve was given (AT_EXECFN: a #! script's own path, a
// symlink's name), the executable after symlinks (/proc/self/exe) and
// argv[0].
bool selected(const config::Options& o, const char* argv0) noexcept {
  if (o.programs[0] == '\0' && o.exclude[0] == '\0') return true;
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = '\0';
  const char* execfn = reinterpret_cast<const char*>(getauxval(AT_EXECFN));
  const char* names[] = {execfn, exe, argv0};
  const config::Selection selection = config::select_process(o, names, 3, false);
  if (selection == config::Selection::moves) return true;
  if (o.verbose) {
    char line[1024];
    if (selection == config::Selection::excluded) {
      std::snprintf(line, sizeof line,
                    "mnemosyne: EXCLUDE=%.300s names %.300s: the system allocator serves this "
                    "process",
                    o.exclude, exe);
    } else {
      std::snprintf(line, sizeof line,
                    "mnemosyne: PROGRAMS=%.300s names none of %.200s, %.200s, %.200s: the system "
                    "allocator serves this process",
                    o.programs, execfn != nullptr ? execfn : "", exe,
                    argv0 != nullptr ? argv0 : "");
    }
    warn_line(line);
  }
  return false;
}

// For the processes this one starts: they inherit the environment (unless
// the program passes another to execve). The constructor runs before the
// program's main and before any thread of its own: setenv is safe here.
void mark_warned(const char* key) noexcept {
  setenv("MNEMOSYNE_WARNED", key, 1);
}

void start(const char* argv0) noexcept {
  config::Options& o = g_options;
  config::read_options(environ, getauxval(AT_SECURE) != 0, &o, &warn_line);
  if (o.disable) {
    if (o.verbose) warn_line("mnemosyne: DISABLE is set: the system allocator serves this process");
    return;
  }
  if (!selected(o, argv0)) return;
  const StartPlatform platform{arena::HostHeap{&__libc_malloc, &__libc_memalign},
                               "the system allocator",
                               static_cast<long>(getpid()),
                               "",
                               &warn_line,
                               &mark_warned};
  if (!start_heap(o, platform)) return;

  g_policy = policy_of(o);
  g_free_checks.store(g_policy.counting ? kFreeCounting : 0, std::memory_order_relaxed);
  arena::set_free_route(free_route_of(g_free_checks.load(std::memory_order_relaxed)));
  if (g_policy.counting) install_exit_report();
  Mode mode = Mode::arena;
  if (g_policy.routing) {
    mode = Mode::managed;
  } else if (g_policy.counting) {
    mode = Mode::counted;
  }
  g_mode.store(mode, std::memory_order_release);
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

// glibc calls the constructors of every object, preloaded ones included,
// with (argc, argv, envp).
__attribute__((constructor(101))) static void mnemosyne_constructor(int argc, char** argv, char**) {
  mnemosyne::install_fork_handling();
  mnemosyne::linux_host::resolve();
  mnemosyne::cxx::resolve_runtime();
  mnemosyne::start(argc > 0 && argv != nullptr ? argv[0] : nullptr);
  mnemosyne::g_before_start.store(false, std::memory_order_relaxed);
}
