// The work of the C++ allocation functions (new_delete.cpp exports them).
// Failure follows the standard: call the new-handler and retry while there
// is one, else throw std::bad_alloc (nothrow forms: return null).
#include "cxx_alloc.hpp"

#include <cstdlib>
#include <new>

#include "api_names.hpp"

#ifdef MNEMOSYNE_API_PREFIX
extern "C" int MNEMOSYNE_API(posix_memalign)(void** out, std::size_t alignment,
                                             std::size_t size) noexcept;
#endif

namespace mnemosyne::cxx {

void* allocate_failed(std::size_t size) {
  for (;;) {
    std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) throw std::bad_alloc();
    handler();
    if (void* p = fast_malloc(size)) return p;
  }
}

void* allocate_aligned(std::size_t size, std::align_val_t alignment) {
  const auto align = static_cast<std::size_t>(alignment);
  for (;;) {
    void* p = nullptr;
    if (MNEMOSYNE_API(posix_memalign)(&p, align < sizeof(void*) ? sizeof(void*) : align, size) == 0)
      return p;
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

}  // namespace mnemosyne::cxx
