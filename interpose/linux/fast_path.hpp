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

// Every case the fast paths do not handle: another mode (statistics
// counting first), a size or a page mimalloc's fast case does not serve, an
// arena that needs to grow, a failure (NULL with errno = ENOMEM); a free
// while counting or held, of a dedicated block, or of a block that is not
// ours (`chunk`: its ownership-map index, as fast_free computed it).
[[gnu::noinline]] void* malloc_slow(std::size_t size) noexcept;
[[gnu::noinline]] void free_slow(void* ptr, std::uintptr_t chunk) noexcept;

// mimalloc's fast case only (a block from its page's free list); every
// other case is one tail call, so nothing is kept across a call.
//
// The mode test is one compare of the byte in memory, then the branch: GCC
// loads an atomic into a register and compares that (two instructions where
// one does), and materialises a flag an asm outputs. What follows the test
// reads only this thread's own heap, so it needs no acquire; the asm reads
// g_mode once, as a relaxed load would.
inline void* fast_malloc(std::size_t size) noexcept {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  asm goto("cmpb %[arena], %[mode]\n\tjne %l[other]"
           :
           : [mode] "m"(g_mode), [arena] "i"(static_cast<int>(Mode::arena))
           : "cc"
           : other);
#else
  if (__builtin_expect(current_mode() != Mode::arena, 0)) goto other;
#endif
  {
    void* p = mnemosyne_mi_malloc_fast(size);
    if (__builtin_expect(p != nullptr, 1)) return p;
  }
other:
  return malloc_slow(size);
}

// One byte of the ownership map says both "an arena block" and what its free
// needs (its free route): nothing but mimalloc's free, inlined here; or a
// count after it, or every check, both free_slow's. The route is tested in
// memory, as malloc's mode is.
//
// The entry is the chunk's of the pointer, with no bounds test: on x86-64
// Linux every address a process is given without asking lies below 2^47
// (the kernel's 5-level paging document, "User space": mmap returns an
// address above only for a hint above), so every block any allocator in
// the process returned has its own entry. Only a pointer no allocator
// returned (a mapping the program placed above 2^47 with a hint itself, a
// wild pointer, a pointer tagged under LAM) indexes past the map, and free()
// of such a pointer is undefined with any allocator: it crashes glibc's too
// (ownership_map.hpp). Elsewhere (aarch64 places mappings up to 2^48) the
// bounded index, 0 beyond the map: chunk 0 is never an arena's.
inline void fast_free(void* ptr) noexcept {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  const std::uintptr_t chunk = owner_chunk_unchecked(ptr);
  asm goto("testb %[fast], %[entry]\n\tje %l[other]"
           :
           : [entry] "m"(g_owner_map[chunk]), [fast] "i"(kOwnerFastFree)
           : "cc"
           : other);
#else
  std::uintptr_t chunk = reinterpret_cast<std::uintptr_t>(ptr) >> kSegmentShift;
  if (chunk >= kOwnerMapEntries) chunk = 0;
  if (__builtin_expect((g_owner_map[chunk].load(std::memory_order_relaxed) & kOwnerFastFree) == 0,
                       0))
    goto other;
#endif
  // No arena lies in the map's chunk 0: mimalloc's test for nullptr goes.
  if (reinterpret_cast<std::uintptr_t>(ptr) < kSegmentAlign) __builtin_unreachable();
  mi_free(ptr);
  return;
other:
  // One call, given the entry's index, and the entry loaded again there:
  // passing its value, or a second call for the counted route, costs the
  // path above a register copy (GCC 12 keeps ptr twice); the index rides in
  // the register that computed it.
  free_slow(ptr, chunk);
}

}  // namespace mnemosyne
