// Loading the DLL into another process before its own code runs: shared by
// the injector (mnemosyne-inject.exe) and the DLL's CreateProcess hooks.
#pragma once

#include <windows.h>

#include <cstddef>
#include <cstdint>

namespace mnemosyne::win {

enum class Method {
  imports,    // Detours' way: the DLL added to the suspended image's import table
  thread,     // a remote thread calling LoadLibraryW
  automatic,  // imports, and thread if that could not be done
};

// `process` was created suspended (its main thread has not run). Loads `dll`
// into it before the program's code runs. With Method::imports the DLL is
// imported by ordinal 1 (so Detours' requirement holds for ours too) and
// loads when the main thread resumes; with Method::thread it is loaded when
// this returns. False with the reason in `why`: another bitness, the image
// could not be read or changed, LoadLibraryW failed there.
bool inject_dll(HANDLE process, const wchar_t* dll, Method method, char* why,
                std::size_t len) noexcept;

// What inject_dll writes before the new import descriptors, so that the
// DLL, once loaded, can put the image's import directory back as it was
// (restore_imports.hpp; Detours' DetourRestoreAfterWith does the same with
// its payload).
struct ImportPayload {
  static constexpr std::uint64_t kMagic = 0x31656e79736f6d6eULL;  // "mnmosyn1"
  std::uint64_t magic;
  std::uint32_t import_rva, import_size;  // the original IMAGE_DIRECTORY_ENTRY_IMPORT
  std::uint32_t bound_rva, bound_size;    // the original IMAGE_DIRECTORY_ENTRY_BOUND_IMPORT
};

}  // namespace mnemosyne::win
