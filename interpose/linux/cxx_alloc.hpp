// What operator new does (new_delete.cpp) and the fuzzing harness calls.
#pragma once

#include <cstddef>
#include <new>

#include "fast_path.hpp"

namespace mnemosyne::cxx {

// Finds the process's C++ runtime, if one is loaded yet (cxx_alloc.cpp):
// from the constructor, while dlopen may still allocate.
void resolve_runtime() noexcept;

// After a failed attempt: the new-handler loop, then std::bad_alloc.
[[gnu::noinline]] void* allocate_failed(std::size_t size);

// Inline: operator new's fast path is malloc's.
inline void* allocate(std::size_t size) {
  if (void* p = fast_malloc(size)) return p;
  return allocate_failed(size);
}
void* allocate_aligned(std::size_t size, std::align_val_t alignment);
void* allocate_nothrow(std::size_t size) noexcept;
void* allocate_aligned_nothrow(std::size_t size, std::align_val_t alignment) noexcept;

}  // namespace mnemosyne::cxx
