// The malloc and free fast paths, shared by the C API and operator
// new/delete: mimalloc's own fast path plus one branch on the mode (malloc)
// or on the block's ownership-map entry (free). Everything else lives out of line in
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
[[gnu::noinline]] void free_slow(void* ptr) noexcept;

// mimalloc's fast case only (a block from its page's free list); every
// other case is one tail call, so nothing is kept across a call.
inline void* fast_malloc(std::size_t size) noexcept {
  if (__builtin_expect(current_mode() == Mode::arena, 1)) {
    void* p = mnemosyne_mi_malloc_fast(size);
    if (__builtin_expect(p != nullptr, 1)) return p;
  }
  return malloc_slow(size);
}

// One byte of the ownership map says both "an arena block" and what its free
// needs (its free route): nothing but mimalloc's free, inlined here; or a
// count after it, or every check, both free_slow's.
inline void fast_free(void* ptr) noexcept {
  const std::uint8_t tag = owner_tag(ptr);
  if (__builtin_expect((tag & kOwnerFastFree) != 0, 1)) {
    // No arena lies in the map's chunk 0: mimalloc's test for nullptr goes.
    if (reinterpret_cast<std::uintptr_t>(ptr) < kSegmentAlign) __builtin_unreachable();
    mi_free(ptr);
    return;
  }
  // One call, and the entry looked up again there: passing it, or a second
  // call for the counted route, costs the path above a register copy (GCC
  // 12 keeps ptr twice); the slow path pays a few instructions instead.
  free_slow(ptr);
}

}  // namespace mnemosyne
