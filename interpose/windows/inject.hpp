// Loading the DLL into another process before its own code runs: shared by
// the injector (mnemosyne-inject.exe) and the DLL's CreateProcess hooks.
#pragma once

#include <windows.h>

#include <cstddef>

namespace mnemosyne::win {

// `process` was created suspended (its main thread has not run). Loads
// `dll` into it with a remote thread calling LoadLibraryW, and waits for that
// to finish. False with the reason in `why` (another bitness, no memory in
// the child, LoadLibraryW failed there).
bool inject_dll(HANDLE process, const wchar_t* dll, char* why, std::size_t len) noexcept;

}  // namespace mnemosyne::win
