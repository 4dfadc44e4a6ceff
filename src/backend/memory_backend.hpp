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
concept MemoryBackend = std::is_empty_v<B> && requires(std::size_t size, void* ptr, void* dst) {
  // Returns `size` bytes (size > 0, a multiple of the page size), or
  // nullptr. Never falls back to another kind of memory.
  { B::allocate(size) }
  noexcept->std::same_as<void*>;
  // Releases a block `allocate` returned. False (and no driver call) when
  // `ptr` is not a live block of this backend, or when the release failed.
  { B::deallocate(ptr, size) }
  noexcept->std::same_as<bool>;
  // Copies `size` bytes of this backend's memory at `ptr` into host memory
  // at `dst`, leaving the data where it lives (a CPU read of managed memory
  // the CPU has not mapped would migrate it). False when the copy failed;
  // `dst` may then hold part of it.
  { B::copy_out(dst, ptr, size) }
  noexcept->std::same_as<bool>;
  // Whether memory fresh from `allocate` is known to read zero, by the
  // evidence each backend cites. False makes the arena clear what it needs
  // zero (mimalloc's segment metadata, calloc's blocks) itself.
  { B::fresh_memory_zero() }
  noexcept->std::same_as<bool>;
  // Sets `size` bytes of this backend's memory at `ptr` to zero in the
  // cheapest correct way for where it lives: the device clears managed
  // memory (no page of it enters host RAM); the CPU clears host memory.
  { B::clear(ptr, size) }
  noexcept->std::same_as<void>;
} && std::same_as<std::remove_cv_t<decltype(B::kId)>, BackendId> &&
    std::convertible_to<decltype(B::kName), const char*> &&
    // A child created by fork() without exec still sees this memory.
    std::same_as < std::remove_cv_t<decltype(B::inherited_by_fork)>,
bool > &&
        // A page the CPU has not mapped (mincore says "not resident") may still
        // hold data, somewhere only copy_out reads without moving it.
        std::same_as<std::remove_cv_t<decltype(B::data_off_cpu)>, bool>&&
            // Memory backed only where it is committed: reserve() gives address
            // space (nothing of it locked or allocated), commit() marks a
            // page-aligned range inside a reservation in use (false: it is not
            // all backed; never a driver call, as it runs inside mimalloc),
            // back() backs such a range for a commit about to be asked again
            // (a driver call, outside the allocator; nothing marked in use)
            // and keeps it backed until back_done() says the retry is over,
            // decommit() marks a range unused (no driver call),
            // release() gives back the whole reservation, start_give_back()
            // starts what returns unused parts of reservations (outside the
            // allocator and its locks). The arena lets mimalloc's commits
            // decide (mimalloc-os-hooks.patch). defers_release: decommit()
            // only marks, and the backend gives memory back after a delay
            // of its own (mimalloc's delay before it decommits is then
            // dropped, arena.cpp).
            std::same_as<std::remove_cv_t<decltype(B::commits_on_demand)>, bool> &&
    (!B::commits_on_demand || requires(std::size_t size, void* ptr) {
      // Whether the arena reserves its arenas now (pinned: not while
      // MNEMOSYNE_PIN=arena locks them whole); false: allocate() them.
      { B::reserves_arenas() }
      noexcept->std::same_as<bool>;
      { B::defers_release } -> std::same_as<const bool&>;
      { B::reserve(size) }
      noexcept->std::same_as<void*>;
      // Whether reserved memory reads zero where it is first committed.
      { B::reservation_zero() }
      noexcept->std::same_as<bool>;
      { B::commit(ptr, size) }
      noexcept->std::same_as<bool>;
      { B::back(ptr, size) }
      noexcept->std::same_as<bool>;
      { B::back_done(ptr, size) }
      noexcept->std::same_as<void>;
      { B::decommit(ptr, size) }
      noexcept->std::same_as<void>;
      { B::release(ptr, size) }
      noexcept->std::same_as<bool>;
      { B::start_give_back() }
      noexcept->std::same_as<void>;
      // Whether [ptr, ptr + size) of a reservation may be read now (it is
      // backed, or reads zero unbacked). Once hold_backing(true) is in
      // place, what was readable stays so until hold_backing(false): walks
      // over the heap (mallinfo, the fork copy) read between the two.
      { B::readable(ptr, size) }
      noexcept->std::same_as<bool>;
      { B::hold_backing(true) }
      noexcept->std::same_as<void>;
    });

}  // namespace mnemosyne
