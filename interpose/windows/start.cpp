// Start-up: DllMain patches the import tables at once (the runtimes'
// functions keep serving from their own heaps meanwhile), and the first heap
// call made outside the loader lock starts mnemosyne: options, driver, arena.
// Not from DllMain itself: cuInit runs on a worker thread (crash_guard),
// which cannot begin while DllMain holds the loader lock.
#include "start.hpp"

#include <malloc.h>
#include <windows.h>

#include <atomic>
#include <cstdio>
#include <cstring>

#include "arena/arena.hpp"
#include "common/start_heap.hpp"
#include "crt.hpp"
#include "mode.hpp"
#include "patch.hpp"
#include "peb.hpp"
#include "platform/platform.hpp"
#include "restore_imports.hpp"
#include "stats/earlier.hpp"
#include "stats_report.hpp"

namespace mnemosyne::win {

void* host_heap_malloc(std::size_t size);
void* host_heap_memalign(std::size_t alignment, std::size_t size);

namespace {

constinit config::Options g_options{};
constinit wchar_t g_self_path[MAX_PATH * 2] = {};
constinit std::atomic<int> g_start{0};  // 0 not started, 1 starting, 2 done
constinit std::atomic<bool> g_disabled{false};

// The environment as envp, without allocating: pointers into the block
// GetEnvironmentStringsA returns (kept for the process's life).
constexpr int kMaxEnv = 4096;
constinit char* g_envp[kMaxEnv + 1] = {};

char* const* environment() noexcept {
  char* block = GetEnvironmentStringsA();
  int n = 0;
  for (char* p = block; p != nullptr && *p != '\0' && n < kMaxEnv; p += std::strlen(p) + 1) {
    g_envp[n++] = p;
  }
  g_envp[n] = nullptr;
  return g_envp;
}

using LockedFn = BOOLEAN(NTAPI*)(PRTL_CRITICAL_SECTION);

// True while this thread holds the loader lock (in DllMain, a TLS callback
// or a DLL notification): PEB.LoaderLock, asked of ntdll.
bool loader_lock_held() noexcept {
  static const LockedFn locked = reinterpret_cast<LockedFn>(reinterpret_cast<void*>(
      GetProcAddress(GetModuleHandleA("ntdll.dll"), "RtlIsCriticalSectionLockedByThread")));
  RTL_CRITICAL_SECTION* lock = loader_lock();
  if (lock == nullptr) return false;
  if (locked != nullptr) return locked(lock) != 0;
  return reinterpret_cast<DWORD_PTR>(lock->OwningThread) == GetCurrentThreadId();
}

// PROGRAMS and EXCLUDE: whether this process is one whose heap moves. Its
// names: the executable's path, and the same without ".exe" (so "python"
// names python.exe); case is ignored, as Windows does.
bool selected(const config::Options& o) noexcept {
  if (o.programs[0] == '\0' && o.exclude[0] == '\0') return true;
  char exe[MAX_PATH * 2];
  const DWORD n = GetModuleFileNameA(nullptr, exe, sizeof exe);
  exe[n < sizeof exe ? n : 0] = '\0';
  char stem[sizeof exe];
  std::memcpy(stem, exe, sizeof exe);
  const std::size_t len = std::strlen(stem);
  if (len > 4 && _stricmp(stem + len - 4, ".exe") == 0) stem[len - 4] = '\0';
  const char* names[] = {exe, stem};
  const config::Selection selection = config::select_process(o, names, 2, true);
  if (selection == config::Selection::moves) return true;
  if (o.verbose) {
    char line[1024];
    std::snprintf(line, sizeof line,
                  "mnemosyne: %s=%.300s %s %.300s: the C runtime serves this "
                  "process",
                  selection == config::Selection::excluded ? "EXCLUDE" : "PROGRAMS",
                  selection == config::Selection::excluded ? o.exclude : o.programs,
                  selection == config::Selection::excluded ? "names" : "does not name", exe);
    warn_line(line);
  }
  return false;
}

// The blocks each C runtime holds when counting begins (allocated before
// injection, before the start, or by the runtime itself): their frees are
// counted apart (stats/earlier.hpp). The runtime's own _heapwalk lists them.
void remember_runtime_blocks() noexcept {
  using WalkFn = int (*)(_HEAPINFO*);
  for (const char* name : kCrtModules) {
    const HMODULE module = GetModuleHandleA(name);
    const auto walk =
        module != nullptr
            ? reinterpret_cast<WalkFn>(reinterpret_cast<void*>(GetProcAddress(module, "_heapwalk")))
            : nullptr;
    if (walk == nullptr) continue;
    _HEAPINFO entry{};
    while (walk(&entry) == _HEAPOK) {
      if (entry._useflag == _USEDENTRY && !stats::remember_earlier(entry._pentry)) return;
    }
  }
}

// For the processes this one starts: CreateProcess passes on the process's
// environment block, which this changes (the C runtime's copy is not read).
void mark_warned(const char* key) noexcept {
  SetEnvironmentVariableA("MNEMOSYNE_WARNED", key);
}

void start() noexcept {
  config::Options& o = g_options;
  config::read_options(environment(), false, &o, &warn_line);
  if (o.disable) {
    g_disabled.store(true);
    if (o.verbose) warn_line("mnemosyne: DISABLE is set: the C runtime serves this process");
    return;
  }
  // Not named: the C runtime serves, and children are still injected (one of
  // them may be named).
  if (!selected(o)) return;
  const StartPlatform platform{arena::HostHeap{&host_heap_malloc, &host_heap_memalign},
                               "the C runtime",
                               Os::process_id(),
                               " (Windows DLL)",
                               &warn_line,
                               &mark_warned};
  if (!start_heap(o, platform)) return;

  g_policy = policy_of(o);
  if (g_policy.counting) remember_runtime_blocks();
  // Counted frees take the slow path here (free_slow).
  arena::set_free_route(g_policy.counting ? 0 : kOwnerFastFree);
  if (g_policy.counting) install_exit_report();
  g_mode.store(g_policy.counting || g_policy.routing ? Mode::managed : Mode::arena,
               std::memory_order_release);
}

}  // namespace

Mode start_if_possible() noexcept {
  if (g_start.load(std::memory_order_acquire) != 0 || loader_lock_held()) return current_mode();
  int expected = 0;
  if (!g_start.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    return current_mode();  // another thread is starting: the runtime serves meanwhile
  }
  start();
  g_start.store(2, std::memory_order_release);
  return current_mode();
}

void attach(void* self) noexcept {
  GetModuleFileNameW(static_cast<HMODULE>(self), g_self_path,
                     sizeof g_self_path / sizeof g_self_path[0]);
  // Never unloaded: patched tables point into this DLL until the process ends.
  HMODULE pinned = nullptr;
  GetModuleHandleExW(GET_MODULE_HANDLE_EX_FLAG_PIN | GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS,
                     reinterpret_cast<LPCWSTR>(&attach), &pinned);
  // Loaded through a rewritten import table (mnemosyne's injector, or
  // Detours'): the image gets its own back before anything walks it
  // (patch_process does).
  restore_import_directory();
  patch_process(self);
}

const config::Options& start_options() noexcept {
  return g_options;
}

void warn_line(const char* line) noexcept {
  char buf[1024];
  const int n = std::snprintf(buf, sizeof buf, "%s\n", line);
  if (n <= 0) return;
  const DWORD len =
      static_cast<DWORD>(static_cast<std::size_t>(n) < sizeof buf ? n : sizeof buf - 1);
  DWORD written = 0;
  WriteFile(GetStdHandle(STD_ERROR_HANDLE), buf, len, &written, nullptr);
}

const wchar_t* self_path() noexcept {
  return g_self_path;
}

bool inject_children() noexcept {
  return !g_disabled.load(std::memory_order_relaxed);
}

}  // namespace mnemosyne::win
