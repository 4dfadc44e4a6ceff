// This process's PEB, read from the TEB (gs:0x60 on x64) with one
// instruction: mingw's NtCurrentTeb()/__readgsqword trip GCC 12's
// array-bounds check, and the PEB's fields used here are not in its headers.
#pragma once

#include <windows.h>
#include <winternl.h>

namespace mnemosyne::win {

inline PEB* current_peb() noexcept {
  PEB* peb;
  asm("movq %%gs:0x60, %0" : "=r"(peb));
  return peb;
}

// PEB.LoaderLock (offset 0x110 on x64; a Reserved field in winternl.h).
inline RTL_CRITICAL_SECTION* loader_lock() noexcept {
  return *reinterpret_cast<RTL_CRITICAL_SECTION**>(reinterpret_cast<unsigned char*>(current_peb()) +
                                                   0x110);
}

}  // namespace mnemosyne::win
