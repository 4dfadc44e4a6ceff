#include "inject.hpp"

#include <cstdio>
#include <cwchar>

namespace mnemosyne::win {

bool inject_dll(HANDLE process, const wchar_t* dll, char* why, std::size_t len) noexcept {
  BOOL wow64 = FALSE;
  if (IsWow64Process(process, &wow64) && wow64) {
    std::snprintf(why, len,
                  "it is a 32-bit program; mnemosyne.dll is 64-bit (a 32-bit build is not made)");
    return false;
  }
  const std::size_t bytes = (std::wcslen(dll) + 1) * sizeof(wchar_t);
  void* remote = VirtualAllocEx(process, nullptr, bytes, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
  if (remote == nullptr) {
    std::snprintf(why, len, "VirtualAllocEx failed (error %lu)", GetLastError());
    return false;
  }
  bool ok = false;
  if (!WriteProcessMemory(process, remote, dll, bytes, nullptr)) {
    std::snprintf(why, len, "WriteProcessMemory failed (error %lu)", GetLastError());
  } else {
    // kernel32 is mapped at the same address in every process of a session.
    auto* load = reinterpret_cast<LPTHREAD_START_ROUTINE>(
        reinterpret_cast<void*>(GetProcAddress(GetModuleHandleA("kernel32.dll"), "LoadLibraryW")));
    HANDLE thread = CreateRemoteThread(process, nullptr, 0, load, remote, 0, nullptr);
    if (thread == nullptr) {
      std::snprintf(why, len, "CreateRemoteThread failed (error %lu)", GetLastError());
    } else {
      DWORD module = 0;  // the low 32 bits of the HMODULE: 0 when it failed
      if (WaitForSingleObject(thread, 60 * 1000) != WAIT_OBJECT_0) {
        std::snprintf(why, len, "LoadLibraryW did not return within 60 s in the new process");
      } else if (!GetExitCodeThread(thread, &module) || module == 0) {
        std::snprintf(why, len, "LoadLibraryW(%ls) failed in the new process", dll);
      } else {
        ok = true;
      }
      CloseHandle(thread);
    }
  }
  if (ok) VirtualFreeEx(process, remote, 0, MEM_RELEASE);
  return ok;
}

}  // namespace mnemosyne::win
