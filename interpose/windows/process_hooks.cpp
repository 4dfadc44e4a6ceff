#include "process_hooks.hpp"

#include <windows.h>

#include <cstddef>
#include <cstdio>

#include "backend/driver_call.hpp"
#include "crt.hpp"
#include "inject.hpp"
#include "start.hpp"

namespace mnemosyne::win {
namespace {

using GetProcAddressFn = FARPROC(WINAPI*)(HMODULE, LPCSTR);
using CreateProcessWFn = BOOL(WINAPI*)(LPCWSTR, LPWSTR, LPSECURITY_ATTRIBUTES,
                                       LPSECURITY_ATTRIBUTES, BOOL, DWORD, LPVOID, LPCWSTR,
                                       LPSTARTUPINFOW, LPPROCESS_INFORMATION);
using CreateThreadFn = HANDLE(WINAPI*)(LPSECURITY_ATTRIBUTES, SIZE_T, LPTHREAD_START_ROUTINE,
                                       LPVOID, DWORD, LPDWORD);
using CreateProcessAFn = BOOL(WINAPI*)(LPCSTR, LPSTR, LPSECURITY_ATTRIBUTES, LPSECURITY_ATTRIBUTES,
                                       BOOL, DWORD, LPVOID, LPCSTR, LPSTARTUPINFOA,
                                       LPPROCESS_INFORMATION);

constinit GetProcAddressFn g_get_proc = nullptr;
constinit CreateProcessWFn g_create_w = nullptr;
constinit CreateProcessAFn g_create_a = nullptr;
constinit CreateThreadFn g_create_thread = nullptr;

// Each original as the process may see it: kernel32's export and, where it
// differs, kernelbase's.
constexpr int kHooks = 4;
constinit void* g_originals[2 * kHooks] = {};
constinit void* g_ours[2 * kHooks] = {};

FARPROC WINAPI hooked_get_proc_address(HMODULE module, LPCSTR name) {
  FARPROC fn = g_get_proc(module, name);
  if (fn == nullptr) return nullptr;
  void* ours = replacement_for(reinterpret_cast<void*>(fn));
  if (ours == nullptr) ours = process_replacement_for(reinterpret_cast<void*>(fn));
  return ours != nullptr ? reinterpret_cast<FARPROC>(ours) : fn;
}

// After the child is created suspended: the DLL goes in, then the child
// runs (unless its creator asked for it suspended). A child that cannot be
// injected still runs, after one line on stderr.
void inject_child(const PROCESS_INFORMATION* pi, DWORD flags) noexcept {
  char why[512];
  if (!inject_dll(pi->hProcess, self_path(), Method::automatic, why, sizeof why)) {
    char line[700];
    std::snprintf(line, sizeof line, "mnemosyne: child process %lu runs without mnemosyne: %s",
                  static_cast<unsigned long>(pi->dwProcessId), why);
    warn_line(line);
  }
  if ((flags & CREATE_SUSPENDED) == 0) ResumeThread(pi->hThread);
}

// A child whose environment its creator replaced is injected only when that
// environment still names a MNEMOSYNE_ option, as on Linux a child whose
// environment lost LD_PRELOAD runs without it. (The injector always exports
// MNEMOSYNE_BACKEND, so a tree it started keeps the mark.)
template <class Char>
bool names_an_option(const Char* block) noexcept {
  constexpr char kPrefix[] = "MNEMOSYNE_";
  for (const Char* entry = block; *entry != 0;) {
    std::size_t i = 0;
    while (i < sizeof kPrefix - 1 && entry[i] != 0 &&
           (entry[i] == kPrefix[i] || entry[i] == kPrefix[i] + ('a' - 'A'))) {
      ++i;
    }
    if (i == sizeof kPrefix - 1) return true;
    while (*entry != 0) ++entry;
    ++entry;
  }
  return false;
}

bool wants_injection(const void* env, bool unicode) noexcept {
  if (!inject_children()) return false;
  if (env == nullptr) return true;  // inherits this process's environment
  return unicode ? names_an_option(static_cast<const wchar_t*>(env))
                 : names_an_option(static_cast<const char*>(env));
}

// CreateProcessW and CreateProcessA alike: suspended, injected, resumed.
template <class Str, class MutableStr, class StartupInfo>
BOOL create_process(BOOL(WINAPI* create)(Str, MutableStr, LPSECURITY_ATTRIBUTES,
                                         LPSECURITY_ATTRIBUTES, BOOL, DWORD, LPVOID, Str,
                                         StartupInfo, LPPROCESS_INFORMATION),
                    Str app, MutableStr cmd, LPSECURITY_ATTRIBUTES pa, LPSECURITY_ATTRIBUTES ta,
                    BOOL inherit, DWORD flags, LPVOID env, Str dir, StartupInfo si,
                    LPPROCESS_INFORMATION pi) {
  if (!wants_injection(env, (flags & CREATE_UNICODE_ENVIRONMENT) != 0)) {
    return create(app, cmd, pa, ta, inherit, flags, env, dir, si, pi);
  }
  if (!create(app, cmd, pa, ta, inherit, flags | CREATE_SUSPENDED, env, dir, si, pi)) {
    return FALSE;
  }
  const DWORD saved = GetLastError();
  inject_child(pi, flags);
  SetLastError(saved);
  return TRUE;
}

BOOL WINAPI hooked_create_process_w(LPCWSTR app, LPWSTR cmd, LPSECURITY_ATTRIBUTES pa,
                                    LPSECURITY_ATTRIBUTES ta, BOOL inherit, DWORD flags, LPVOID env,
                                    LPCWSTR dir, LPSTARTUPINFOW si, LPPROCESS_INFORMATION pi) {
  return create_process(g_create_w, app, cmd, pa, ta, inherit, flags, env, dir, si, pi);
}

BOOL WINAPI hooked_create_process_a(LPCSTR app, LPSTR cmd, LPSECURITY_ATTRIBUTES pa,
                                    LPSECURITY_ATTRIBUTES ta, BOOL inherit, DWORD flags, LPVOID env,
                                    LPCSTR dir, LPSTARTUPINFOA si, LPPROCESS_INFORMATION pi) {
  return create_process(g_create_a, app, cmd, pa, ta, inherit, flags, env, dir, si, pi);
}

// Threads the driver starts while mnemosyne is inside a driver call (cuInit
// starts some; the C runtime's _beginthreadex and winpthreads end up here
// too) are marked driver-owned, as on Linux (interpose/linux/
// driver_threads.cpp): their mallocs may come from the arena but never make
// it call the driver, since such a thread may hold the driver's lock.
struct Start {
  LPTHREAD_START_ROUTINE routine;
  void* arg;
};

DWORD WINAPI driver_thread_main(void* raw) {
  const Start start = *static_cast<Start*>(raw);
  HeapFree(GetProcessHeap(), 0, raw);
  mark_thread_as_driver_owned();
  return start.routine(start.arg);
}

HANDLE WINAPI hooked_create_thread(LPSECURITY_ATTRIBUTES sa, SIZE_T stack,
                                   LPTHREAD_START_ROUTINE routine, LPVOID arg, DWORD flags,
                                   LPDWORD id) {
  if (!in_driver_call()) return g_create_thread(sa, stack, routine, arg, flags, id);
  auto* start = static_cast<Start*>(HeapAlloc(GetProcessHeap(), 0, sizeof(Start)));
  if (start == nullptr) {
    SetLastError(ERROR_NOT_ENOUGH_MEMORY);
    return nullptr;
  }
  *start = Start{routine, arg};
  HANDLE thread = g_create_thread(sa, stack, &driver_thread_main, start, flags, id);
  if (thread == nullptr) HeapFree(GetProcessHeap(), 0, start);
  return thread;
}

void* find(HMODULE module, const char* name) noexcept {
  return module != nullptr ? reinterpret_cast<void*>(GetProcAddress(module, name)) : nullptr;
}

}  // namespace

void resolve_process_hooks() noexcept {
  HMODULE k32 = GetModuleHandleA("kernel32.dll");
  HMODULE kbase = GetModuleHandleA("kernelbase.dll");
  g_get_proc = reinterpret_cast<GetProcAddressFn>(find(k32, "GetProcAddress"));
  g_create_w = reinterpret_cast<CreateProcessWFn>(find(k32, "CreateProcessW"));
  g_create_a = reinterpret_cast<CreateProcessAFn>(find(k32, "CreateProcessA"));
  g_create_thread = reinterpret_cast<CreateThreadFn>(find(k32, "CreateThread"));
  const char* names[kHooks] = {"GetProcAddress", "CreateProcessW", "CreateProcessA",
                               "CreateThread"};
  void* ours[kHooks] = {reinterpret_cast<void*>(&hooked_get_proc_address),
                        reinterpret_cast<void*>(&hooked_create_process_w),
                        reinterpret_cast<void*>(&hooked_create_process_a),
                        reinterpret_cast<void*>(&hooked_create_thread)};
  for (int i = 0; i < kHooks; ++i) {
    g_originals[2 * i] = find(k32, names[i]);
    g_originals[2 * i + 1] = find(kbase, names[i]);
    g_ours[2 * i] = g_ours[2 * i + 1] = ours[i];
  }
}

void* process_replacement_for(const void* original) noexcept {
  if (original == nullptr) return nullptr;
  for (int i = 0; i < 2 * kHooks; ++i) {
    if (g_originals[i] == original) return g_ours[i];
  }
  return nullptr;
}

}  // namespace mnemosyne::win
