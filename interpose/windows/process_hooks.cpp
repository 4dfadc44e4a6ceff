#include "process_hooks.hpp"

#include <windows.h>

#include <cstdio>

#include "crt.hpp"
#include "inject.hpp"
#include "start.hpp"

namespace mnemosyne::win {
namespace {

using GetProcAddressFn = FARPROC(WINAPI*)(HMODULE, LPCSTR);
using CreateProcessWFn = BOOL(WINAPI*)(LPCWSTR, LPWSTR, LPSECURITY_ATTRIBUTES,
                                       LPSECURITY_ATTRIBUTES, BOOL, DWORD, LPVOID, LPCWSTR,
                                       LPSTARTUPINFOW, LPPROCESS_INFORMATION);
using CreateProcessAFn = BOOL(WINAPI*)(LPCSTR, LPSTR, LPSECURITY_ATTRIBUTES, LPSECURITY_ATTRIBUTES,
                                       BOOL, DWORD, LPVOID, LPCSTR, LPSTARTUPINFOA,
                                       LPPROCESS_INFORMATION);

constinit GetProcAddressFn g_get_proc = nullptr;
constinit CreateProcessWFn g_create_w = nullptr;
constinit CreateProcessAFn g_create_a = nullptr;

// Each original as the process may see it: kernel32's export and, where it
// differs, kernelbase's.
constinit void* g_originals[6] = {};
constinit void* g_ours[6] = {};

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

BOOL WINAPI hooked_create_process_w(LPCWSTR app, LPWSTR cmd, LPSECURITY_ATTRIBUTES pa,
                                    LPSECURITY_ATTRIBUTES ta, BOOL inherit, DWORD flags, LPVOID env,
                                    LPCWSTR dir, LPSTARTUPINFOW si, LPPROCESS_INFORMATION pi) {
  if (!inject_children()) return g_create_w(app, cmd, pa, ta, inherit, flags, env, dir, si, pi);
  if (!g_create_w(app, cmd, pa, ta, inherit, flags | CREATE_SUSPENDED, env, dir, si, pi)) {
    return FALSE;
  }
  const DWORD saved = GetLastError();
  inject_child(pi, flags);
  SetLastError(saved);
  return TRUE;
}

BOOL WINAPI hooked_create_process_a(LPCSTR app, LPSTR cmd, LPSECURITY_ATTRIBUTES pa,
                                    LPSECURITY_ATTRIBUTES ta, BOOL inherit, DWORD flags, LPVOID env,
                                    LPCSTR dir, LPSTARTUPINFOA si, LPPROCESS_INFORMATION pi) {
  if (!inject_children()) return g_create_a(app, cmd, pa, ta, inherit, flags, env, dir, si, pi);
  if (!g_create_a(app, cmd, pa, ta, inherit, flags | CREATE_SUSPENDED, env, dir, si, pi)) {
    return FALSE;
  }
  const DWORD saved = GetLastError();
  inject_child(pi, flags);
  SetLastError(saved);
  return TRUE;
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
  const char* names[3] = {"GetProcAddress", "CreateProcessW", "CreateProcessA"};
  void* ours[3] = {reinterpret_cast<void*>(&hooked_get_proc_address),
                   reinterpret_cast<void*>(&hooked_create_process_w),
                   reinterpret_cast<void*>(&hooked_create_process_a)};
  for (int i = 0; i < 3; ++i) {
    g_originals[2 * i] = find(k32, names[i]);
    g_originals[2 * i + 1] = find(kbase, names[i]);
    g_ours[2 * i] = g_ours[2 * i + 1] = ours[i];
  }
}

void* process_replacement_for(const void* original) noexcept {
  if (original == nullptr) return nullptr;
  for (int i = 0; i < 6; ++i) {
    if (g_originals[i] == original) return g_ours[i];
  }
  return nullptr;
}

}  // namespace mnemosyne::win
