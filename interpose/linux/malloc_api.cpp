// The C allocation API, exported in place of glibc's.
//
// Fast path: one mode check, then mimalloc (malloc) or one ownership-map load
// (free). Pointers the arena does not own (allocated by glibc before our
// start, by glibc-internal __libc_* calls, or while the driver was calling
// malloc) go back to glibc.
#include <errno.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "arena/arena.hpp"
#include "libc.hpp"
#include "mode.hpp"

namespace mnemosyne {
namespace {

inline void* nomem() noexcept {
  errno = ENOMEM;
  return nullptr;
}

inline bool is_power_of_two(std::size_t n) noexcept {
  return n != 0 && (n & (n - 1)) == 0;
}

std::size_t page_size() noexcept {
  static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

void* aligned(std::size_t alignment, std::size_t size) noexcept {
  if (arena_mode()) {
    void* p = arena::alloc_aligned(size, alignment);
    return p != nullptr ? p : nomem();
  }
  return __libc_memalign(alignment, size);
}

// A block the arena owns, resized while the arena is not in use (a forked
// child that lost its heap): its bytes cannot be read any more.
void* realloc_lost(std::size_t size) noexcept {
  return __libc_malloc(size);
}

// A block glibc owns: move it into the arena so the heap ends up in backend
// memory, unless its size is unknown (then glibc keeps it).
void* realloc_foreign(void* ptr, std::size_t size) noexcept {
  const std::size_t old_size = linux_host::usable_size(ptr);
  if (!arena_mode() || old_size == 0) return __libc_realloc(ptr, size);
  void* p = arena::alloc(size);
  if (p == nullptr) return nomem();
  std::memcpy(p, ptr, old_size < size ? old_size : size);
  __libc_free(ptr);
  return p;
}

}  // namespace
}  // namespace mnemosyne

using namespace mnemosyne;

extern "C" {

__attribute__((visibility("default"))) void* malloc(std::size_t size) noexcept {
  if (arena_mode()) {
    void* p = arena::alloc(size);
    return p != nullptr ? p : nomem();
  }
  return __libc_malloc(size);
}

__attribute__((visibility("default"))) void free(void* ptr) noexcept {
  const std::uint8_t tag = owner_tag(ptr);
  if (__builtin_expect(tag != 0, 1)) {
    arena::free(ptr, tag);
  } else if (ptr != nullptr) {
    __libc_free(ptr);
  }
}

__attribute__((visibility("default"))) void cfree(void* ptr) noexcept {
  free(ptr);
}

__attribute__((visibility("default"))) void* calloc(std::size_t count, std::size_t size) noexcept {
  std::size_t total;
  if (__builtin_mul_overflow(count, size, &total)) return nomem();
  if (arena_mode()) {
    void* p = arena::alloc_zeroed(total);
    return p != nullptr ? p : nomem();
  }
  return __libc_calloc(count, size);
}

__attribute__((visibility("default"))) void* realloc(void* ptr, std::size_t size) noexcept {
  if (ptr == nullptr) return malloc(size);
  if (size == 0) {  // as glibc: frees the block and returns NULL
    free(ptr);
    return nullptr;
  }
  const std::uint8_t tag = owner_tag(ptr);
  if (tag == 0) return realloc_foreign(ptr, size);
  if (!arena_mode()) return realloc_lost(size);
  void* p = arena::realloc(ptr, tag, size);
  return p != nullptr ? p : nomem();
}

__attribute__((visibility("default"))) void* reallocarray(void* ptr, std::size_t count,
                                                          std::size_t size) noexcept {
  std::size_t total;
  if (__builtin_mul_overflow(count, size, &total)) return nomem();
  return realloc(ptr, total);
}

__attribute__((visibility("default"))) int posix_memalign(void** out, std::size_t alignment,
                                                          std::size_t size) noexcept {
  if (!is_power_of_two(alignment) || alignment % sizeof(void*) != 0) return EINVAL;
  const int saved = errno;
  void* p = aligned(alignment, size);
  if (p == nullptr) {
    errno = saved;  // posix_memalign reports through its result, not errno
    return ENOMEM;
  }
  *out = p;
  return 0;
}

__attribute__((visibility("default"))) void* aligned_alloc(std::size_t alignment,
                                                           std::size_t size) noexcept {
  if (!is_power_of_two(alignment)) {
    errno = EINVAL;
    return nullptr;
  }
  return aligned(alignment, size);
}

// glibc's memalign accepts any alignment and rounds it up to a power of two.
__attribute__((visibility("default"))) void* memalign(std::size_t alignment,
                                                      std::size_t size) noexcept {
  if (alignment <= alignof(std::max_align_t)) return malloc(size);
  if (!is_power_of_two(alignment)) {
    if (alignment > (SIZE_MAX >> 1)) return nomem();
    alignment = std::size_t{1} << (64 - __builtin_clzl(alignment));
  }
  return aligned(alignment, size);
}

__attribute__((visibility("default"))) void* valloc(std::size_t size) noexcept {
  return aligned(page_size(), size);
}

__attribute__((visibility("default"))) void* pvalloc(std::size_t size) noexcept {
  const std::size_t page = page_size();
  if (size > SIZE_MAX - page) return nomem();
  return aligned(page, size == 0 ? page : (size + page - 1) / page * page);
}

__attribute__((visibility("default"))) std::size_t malloc_usable_size(void* ptr) noexcept {
  if (ptr == nullptr) return 0;
  const std::uint8_t tag = owner_tag(ptr);
  if (tag == 0) return linux_host::usable_size(ptr);
  if (!arena_mode()) return 0;
  return arena::usable_size(ptr, tag);
}

}  // extern "C"
