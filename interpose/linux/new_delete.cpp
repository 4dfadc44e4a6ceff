// Every C++ replaceable allocation function: plain, nothrow, sized, aligned
// and array forms (cxx_alloc.hpp does the work).
#include <cstddef>
#include <new>

#include "cxx_alloc.hpp"
#include "fast_path.hpp"

using mnemosyne::cxx::allocate;
using mnemosyne::cxx::allocate_aligned;
using mnemosyne::cxx::allocate_aligned_nothrow;
using mnemosyne::cxx::allocate_nothrow;

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
