// Every C++ replaceable allocation function: plain, nothrow, sized, aligned
// and array forms. Failure follows the standard: call the new-handler and
// retry while there is one, else throw std::bad_alloc (nothrow: return null).
#include <cstddef>
#include <cstdlib>
#include <new>

#include "fast_path.hpp"

namespace {

void* allocate(std::size_t size) {
  for (;;) {
    if (void* p = mnemosyne::fast_malloc(size)) return p;
    std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) throw std::bad_alloc();
    handler();
  }
}

void* allocate_aligned(std::size_t size, std::align_val_t alignment) {
  const auto align = static_cast<std::size_t>(alignment);
  for (;;) {
    void* p = nullptr;
    if (posix_memalign(&p, align < sizeof(void*) ? sizeof(void*) : align, size) == 0) return p;
    std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) throw std::bad_alloc();
    handler();
  }
}

void* allocate_nothrow(std::size_t size) noexcept {
  try {
    return allocate(size);
  } catch (...) {
    return nullptr;
  }
}

void* allocate_aligned_nothrow(std::size_t size, std::align_val_t alignment) noexcept {
  try {
    return allocate_aligned(size, alignment);
  } catch (...) {
    return nullptr;
  }
}

}  // namespace

#define MNEMOSYNE_EXPORT __attribute__((visibility("default")))

MNEMOSYNE_EXPORT void* operator new(std::size_t size) {
  return allocate(size);
}
MNEMOSYNE_EXPORT void* operator new[](std::size_t size) {
  return allocate(size);
}
MNEMOSYNE_EXPORT void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  return allocate_nothrow(size);
}
MNEMOSYNE_EXPORT void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  return allocate_nothrow(size);
}
MNEMOSYNE_EXPORT void* operator new(std::size_t size, std::align_val_t al) {
  return allocate_aligned(size, al);
}
MNEMOSYNE_EXPORT void* operator new[](std::size_t size, std::align_val_t al) {
  return allocate_aligned(size, al);
}
MNEMOSYNE_EXPORT void* operator new(std::size_t size, std::align_val_t al,
                                    const std::nothrow_t&) noexcept {
  return allocate_aligned_nothrow(size, al);
}
MNEMOSYNE_EXPORT void* operator new[](std::size_t size, std::align_val_t al,
                                      const std::nothrow_t&) noexcept {
  return allocate_aligned_nothrow(size, al);
}

MNEMOSYNE_EXPORT void operator delete(void* p) noexcept {
  mnemosyne::fast_free(p);
}
MNEMOSYNE_EXPORT void operator delete[](void* p) noexcept {
  mnemosyne::fast_free(p);
}
MNEMOSYNE_EXPORT void operator delete(void* p, const std::nothrow_t&) noexcept {
  mnemosyne::fast_free(p);
}
MNEMOSYNE_EXPORT void operator delete[](void* p, const std::nothrow_t&) noexcept {
  mnemosyne::fast_free(p);
}
MNEMOSYNE_EXPORT void operator delete(void* p, std::size_t) noexcept {
  mnemosyne::fast_free(p);
}
MNEMOSYNE_EXPORT void operator delete[](void* p, std::size_t) noexcept {
  mnemosyne::fast_free(p);
}
MNEMOSYNE_EXPORT void operator delete(void* p, std::align_val_t) noexcept {
  mnemosyne::fast_free(p);
}
MNEMOSYNE_EXPORT void operator delete[](void* p, std::align_val_t) noexcept {
  mnemosyne::fast_free(p);
}
MNEMOSYNE_EXPORT void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  mnemosyne::fast_free(p);
}
MNEMOSYNE_EXPORT void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  mnemosyne::fast_free(p);
}
MNEMOSYNE_EXPORT void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  mnemosyne::fast_free(p);
}
MNEMOSYNE_EXPORT void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  mnemosyne::fast_free(p);
}
