// The C runtimes whose heap functions the DLL redirects (msvcrt.dll, and
// ucrtbase.dll behind the api-ms-win-crt-heap-* forwarders), and the
// original functions of each: blocks mnemosyne does not own go back to the
// runtime they came from.
#pragma once

#include <cstddef>

namespace mnemosyne::win {

enum Crt : int { kMsvcrt = 0, kUcrt = 1 };
inline constexpr int kCrtCount = 2;
inline constexpr const char* kCrtModules[kCrtCount] = {"msvcrt.dll", "ucrtbase.dll"};

struct CrtHeap {
  void* (*malloc)(std::size_t);
  void (*free)(void*);
  void* (*calloc)(std::size_t, std::size_t);
  void* (*realloc)(void*, std::size_t);
  std::size_t (*msize)(void*);
  void* (*expand)(void*, std::size_t);
  void* (*recalloc)(void*, std::size_t, std::size_t);
  void* (*aligned_malloc)(std::size_t, std::size_t);
  void (*aligned_free)(void*);
  void* (*aligned_realloc)(void*, std::size_t, std::size_t);
  void* (*aligned_recalloc)(void*, std::size_t, std::size_t, std::size_t);
  std::size_t (*aligned_msize)(void*, std::size_t, std::size_t);
  void* (*aligned_offset_malloc)(std::size_t, std::size_t, std::size_t);
  void* (*aligned_offset_realloc)(void*, std::size_t, std::size_t, std::size_t);
  void* (*aligned_offset_recalloc)(void*, std::size_t, std::size_t, std::size_t, std::size_t);
  char* (*strdup)(const char*);
  wchar_t* (*wcsdup)(const wchar_t*);
};

// Filled by resolve_crt; entries stay null for a runtime not loaded (yet) or
// a function it lacks (msvcrt.dll has no _recalloc on older systems).
extern CrtHeap g_crt[kCrtCount];

// One redirected function: the runtime's export, and ours in its place.
struct Hook {
  const char* name;
  void* original;
  void* replacement;
};

// Resolves the originals of runtime `crt` from its loaded module (nothing
// when it is not loaded) and adds its hooks to the table; once per runtime.
// True when this call resolved it.
bool resolve_crt(int crt, void* module) noexcept;

// The hooks of every runtime resolved so far (appended, never removed).
const Hook* hooks(std::size_t* count) noexcept;

// Ours for `original` (an export of a redirected runtime), or nullptr.
void* replacement_for(const void* original) noexcept;

}  // namespace mnemosyne::win
