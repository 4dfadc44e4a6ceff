// The malloc and free fast paths, shared by the C API and operator
// new/delete: mimalloc's own fast path plus one branch on the mode (malloc)
// or on the ownership map (free). Everything else lives out of line in
// malloc_slow / free_slow, so these stay leaf-like: no spills, a tail call.
#pragma once

#include <cstddef>
#include <cstdint>

#include <mimalloc-live.h>
#include <mimalloc.h>

#include "arena/ownership_map.hpp"
#include "mode.hpp"

namespace mnemosyne {

// Every case the fast paths do not handle: another mode, a size or a page
// mimalloc's fast case does not serve, an arena that needs to grow, a
// failure (NULL with errno = ENOMEM); a free while counting or held, of a
// dedicated block, or of a block that is not ours.
[[gnu::noinline]] void* malloc_slow(std::size_t size) noexcept;
[[gnu::noinline]] void free_slow(void* ptr, std::uint8_t tag) noexcept;

// mimalloc's fast case only (a block from its page's free list); every
// other case is one tail call, so nothing is kept across a call.
inline void* fast_malloc(std::size_t size) noexcept {
  if (__builtin_expect(current_mode() == Mode::arena, 1)) {
    void* p = mnemosyne_mi_malloc_fast(size);
    if (__builtin_expect(p != nullptr, 1)) return p;
  }
  return malloc_slow(size);
}

inline void fast_free(void* ptr) noexcept {
  const std::uint8_t tag = owner_tag(ptr);
  if (__builtin_expect(
          (tag & kOwnerArena) != 0 && g_free_checks.load(std::memory_order_relaxed) == 0, 1)) {
    mi_free(ptr);
    return;
  }
  free_slow(ptr, tag);
}

}  // namespace mnemosyne
