// glibc's own allocator, reached directly: memory from before our start,
// from inside driver calls, or in a forked child that lost its heap.
#pragma once

#include <malloc.h>

#include <cstddef>

#if !__GLIBC_PREREQ(2, 33)
// glibc before 2.33 has no mallinfo2: its struct as 2.33 declares it, for
// the mallinfo2 this library exports (glibc_extras.cpp) and for glibc's own,
// looked up at run time (there is none on such a glibc).
struct mallinfo2 {
  std::size_t arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks, fordblks, keepcost;
};
#endif

extern "C" {
void* __libc_malloc(std::size_t size);
void* __libc_calloc(std::size_t count, std::size_t size);
void* __libc_realloc(void* ptr, std::size_t size);
void* __libc_memalign(std::size_t alignment, std::size_t size);
void __libc_free(void* ptr);
}

namespace mnemosyne::linux_host {

// glibc's malloc_usable_size (it has no __libc_ alias); 0 until resolved.
std::size_t usable_size(void* ptr) noexcept;
// glibc's mallinfo2 (its figures for the blocks glibc's heap serves: memory
// from before our start, from driver calls, the host fallback); false, with
// nothing written, when this glibc has none.
bool mallinfo2(struct mallinfo2* out) noexcept;
// Resolves what usable_size and mallinfo2 need; called once from the constructor.
void resolve() noexcept;
// Whether the glibc this process runs on refuses aligned_alloc alignments
// that are not powers of two (2.38 and later); read once, on first use.
bool aligned_alloc_is_strict() noexcept;

}  // namespace mnemosyne::linux_host
