// The backend contract: zero-size types with static functions and constexpr
// capability flags, checked by a concept (snmalloc's PAL idea). Callers are
// templates over the backend, so choosing one costs no run-time dispatch.
#pragma once

#include <concepts>
#include <cstddef>
#include <type_traits>

#include "backend/backend_id.hpp"

namespace mnemosyne {

template <class B>
concept MemoryBackend = std::is_empty_v<B> && requires(std::size_t size, void* ptr) {
  // Returns `size` bytes (size > 0, a multiple of the page size), or
  // nullptr. Never falls back to another kind of memory.
  { B::allocate(size) }
  noexcept->std::same_as<void*>;
  // Releases a block `allocate` returned. False (and no driver call) when
  // `ptr` is not a live block of this backend, or when the release failed.
  { B::deallocate(ptr, size) }
  noexcept->std::same_as<bool>;
} && std::same_as<std::remove_cv_t<decltype(B::kId)>, BackendId> &&
    std::convertible_to<decltype(B::kName), const char*> &&
    // mimalloc may reset (MADV_DONTNEED) unused pages of this memory.
    std::same_as < std::remove_cv_t<decltype(B::supports_page_reset)>,
bool > &&
       // Guard pages (mprotect) may be placed in this memory.
       std::same_as<std::remove_cv_t<decltype(B::supports_make_guard)>, bool>&&
           // mimalloc may decommit parts of this memory.
           std::same_as<std::remove_cv_t<decltype(B::supports_decommit)>, bool>&&
               // Worth caching freed blocks on the CPU side (as in the seed).
               std::same_as<std::remove_cv_t<decltype(B::enable_cpu_cache)>, bool>&&
                   // A child created by fork() without exec still sees this memory.
                   std::same_as<std::remove_cv_t<decltype(B::inherited_by_fork)>, bool>;

}  // namespace mnemosyne
