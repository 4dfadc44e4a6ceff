#include "patch.hpp"

#include <windows.h>

#include <atomic>
#include <cstring>

#include "crt.hpp"
#include "peb.hpp"
#include "process_hooks.hpp"

namespace mnemosyne::win {
namespace {

constinit HMODULE g_self = nullptr;
constinit HMODULE g_skip[3] = {};  // ntdll, kernel32, kernelbase

// ntdll's DLL notification API (documented, declared in no mingw header).
struct DllNotificationData {
  ULONG flags;
  const UNICODE_STRING* full_name;
  const UNICODE_STRING* base_name;
  PVOID base;
  ULONG size;
};
constexpr ULONG kDllLoaded = 1;
using NotificationFn = VOID(CALLBACK*)(ULONG reason, const DllNotificationData* data, PVOID ctx);
using RegisterFn = LONG(NTAPI*)(ULONG flags, NotificationFn fn, PVOID ctx, PVOID* cookie);

bool skipped(HMODULE module) noexcept {
  if (module == g_self) return true;
  for (HMODULE m : g_skip) {
    if (m == module) return true;
  }
  return false;
}

void* replacement(const void* value) noexcept {
  if (void* ours = replacement_for(value)) return ours;
  return process_replacement_for(value);
}

// One import table: descriptors, then each descriptor's address table.
void patch_imports(HMODULE module) noexcept {
  auto* base = reinterpret_cast<unsigned char*>(module);
  const auto* dos = reinterpret_cast<const IMAGE_DOS_HEADER*>(base);
  if (dos->e_magic != IMAGE_DOS_SIGNATURE) return;
  const auto* nt = reinterpret_cast<const IMAGE_NT_HEADERS*>(base + dos->e_lfanew);
  if (nt->Signature != IMAGE_NT_SIGNATURE ||
      nt->OptionalHeader.Magic != IMAGE_NT_OPTIONAL_HDR64_MAGIC) {
    return;
  }
  const IMAGE_DATA_DIRECTORY& dir = nt->OptionalHeader.DataDirectory[IMAGE_DIRECTORY_ENTRY_IMPORT];
  if (dir.VirtualAddress == 0 || dir.Size == 0) return;
  for (auto* desc = reinterpret_cast<const IMAGE_IMPORT_DESCRIPTOR*>(base + dir.VirtualAddress);
       desc->Name != 0 && desc->FirstThunk != 0; ++desc) {
    for (auto* slot = reinterpret_cast<IMAGE_THUNK_DATA*>(base + desc->FirstThunk);
         slot->u1.Function != 0; ++slot) {
      void* ours = replacement(reinterpret_cast<void*>(slot->u1.Function));
      if (ours == nullptr) continue;
      DWORD old = 0;
      if (!VirtualProtect(&slot->u1.Function, sizeof(void*), PAGE_READWRITE, &old)) continue;
      // One aligned 8-byte store: a thread calling through the slot sees
      // the original or ours, never a torn pointer.
      reinterpret_cast<std::atomic<ULONGLONG>*>(&slot->u1.Function)
          ->store(reinterpret_cast<ULONGLONG>(ours), std::memory_order_release);
      VirtualProtect(&slot->u1.Function, sizeof(void*), old, &old);
    }
  }
}

// A module that is one of the runtimes is resolved before anything is
// patched against it.
void note_runtime(HMODULE module) noexcept {
  for (int crt = 0; crt < kCrtCount; ++crt) {
    if (module == GetModuleHandleA(kCrtModules[crt])) resolve_crt(crt, module);
  }
}

VOID CALLBACK on_dll_notification(ULONG reason, const DllNotificationData* data, PVOID) {
  if (reason != kDllLoaded || data == nullptr) return;
  auto* module = static_cast<HMODULE>(data->base);
  note_runtime(module);
  patch_module(module);
}

}  // namespace

void patch_module(void* module) noexcept {
  auto* m = static_cast<HMODULE>(module);
  if (m == nullptr || skipped(m)) return;
  patch_imports(m);
}

void patch_process(void* self) noexcept {
  g_self = static_cast<HMODULE>(self);
  g_skip[0] = GetModuleHandleA("ntdll.dll");
  g_skip[1] = GetModuleHandleA("kernel32.dll");
  g_skip[2] = GetModuleHandleA("kernelbase.dll");
  for (int crt = 0; crt < kCrtCount; ++crt) resolve_crt(crt, GetModuleHandleA(kCrtModules[crt]));
  resolve_process_hooks();

  // Registered before the walk: a module loading meanwhile is not missed
  // (patching a module twice changes nothing).
  auto reg = reinterpret_cast<RegisterFn>(
      reinterpret_cast<void*>(GetProcAddress(g_skip[0], "LdrRegisterDllNotification")));
  static PVOID cookie = nullptr;
  if (reg != nullptr) reg(0, &on_dll_notification, nullptr, &cookie);

  // The modules loaded now, from the loader's own list (no allocation).
  const PEB* peb = current_peb();
  LIST_ENTRY* head = &peb->Ldr->InMemoryOrderModuleList;
  for (LIST_ENTRY* e = head->Flink; e != head; e = e->Flink) {
    const auto* entry = CONTAINING_RECORD(e, LDR_DATA_TABLE_ENTRY, InMemoryOrderLinks);
    patch_module(entry->DllBase);
  }
}

}  // namespace mnemosyne::win
