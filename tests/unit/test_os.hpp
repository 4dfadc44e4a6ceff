// The few operating-system calls the unit tests make themselves, so that the
// tests read the same on Linux and on Windows (mingw-w64, run under wine):
// finding a library the product already loaded and a symbol in it, setting
// the environment the product reads, the page size, a host heap whose free
// takes back every block, and the exit of a scenario.
#pragma once

#if defined(_WIN32)
#include <malloc.h>
#include <process.h>
#include <windows.h>
#else
#include <dlfcn.h>
#include <unistd.h>
#endif

#include <cstddef>
#include <cstdlib>

namespace mnemosyne::test {

// The library loaded at `path` in this process, without loading it: nullptr
// when it is not loaded. Linux: dlopen(RTLD_NOLOAD); Windows: the module
// handle of that path.
inline void* loaded_library(const char* path) {
#if defined(_WIN32)
  return reinterpret_cast<void*>(GetModuleHandleA(path));
#else
  return dlopen(path, RTLD_NOW | RTLD_NOLOAD);
#endif
}

// An exported symbol of a library from loaded_library; nullptr when absent.
inline void* library_symbol(void* library, const char* name) {
#if defined(_WIN32)
  return reinterpret_cast<void*>(GetProcAddress(static_cast<HMODULE>(library), name));
#else
  return dlsym(library, name);
#endif
}

// Sets (overwrites) a variable of this process's environment, where the
// product (getenv) and the fake driver (getenv from the same C runtime) see
// it. Windows: the C runtime's copy (_putenv_s) and the process's own
// (SetEnvironmentVariableA, what GetEnvironmentStringsA and child processes
// see). `value` must not be empty: an empty value unsets on Windows.
inline void set_env(const char* name, const char* value) {
#if defined(_WIN32)
  _putenv_s(name, value);
  SetEnvironmentVariableA(name, value);
#else
  setenv(name, value, 1);
#endif
}

inline std::size_t page_size() {
#if defined(_WIN32)
  SYSTEM_INFO info;
  GetSystemInfo(&info);
  return info.dwPageSize;
#else
  return static_cast<std::size_t>(getpagesize());
#endif
}

// A host heap for arena::HostHeap whose one free takes back the blocks of
// both allocation functions. Windows has no posix_memalign, and
// _aligned_malloc's blocks need _aligned_free, so there every block is an
// _aligned_malloc one.
inline void* host_malloc(std::size_t size) {
#if defined(_WIN32)
  return _aligned_malloc(size, alignof(std::max_align_t));
#else
  return std::malloc(size);
#endif
}
inline void* host_memalign(std::size_t alignment, std::size_t size) {
#if defined(_WIN32)
  return _aligned_malloc(size, alignment);
#else
  void* p = nullptr;
  return posix_memalign(&p, alignment, size) == 0 ? p : nullptr;
#endif
}
inline void host_free(void* p) {
#if defined(_WIN32)
  _aligned_free(p);
#else
  std::free(p);
#endif
}

// A CUDA driver path in a directory that does not exist, and that directory;
// with the reason the OS gives for it where the test checks one.
#if defined(_WIN32)
inline constexpr const char kMissingDriverDir[] = "C:\\nonexistent";
inline constexpr const char kMissingDriverPath[] = "C:\\nonexistent\\nvcuda.dll";
// ERROR_MOD_NOT_FOUND, as platform_windows.cpp words a LoadLibrary failure.
inline constexpr const char kMissingDriverError[] = "LoadLibrary failed: error 126";
#else
inline constexpr const char kMissingDriverDir[] = "/nonexistent";
inline constexpr const char kMissingDriverPath[] = "/nonexistent/libcuda.so.1";
#endif

// Ends the process at once, without exit handlers (a scenario's result).
[[noreturn]] inline void exit_now(int code) {
  _exit(code);
}

}  // namespace mnemosyne::test
