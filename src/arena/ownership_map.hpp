// O(1), lock-free answer to "is this pointer ours, and which backend's?".
//
// Every byte mnemosyne hands out lies in a segment that starts on a 32 MiB
// boundary and spans whole 32 MiB chunks, so one byte per chunk of the 47-bit
// user address space (4 MiB of zero-initialized, lazily touched memory)
// describes the whole heap. The malloc/free fast path reads one entry.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "backend/backend_id.hpp"

namespace mnemosyne {

inline constexpr unsigned kSegmentShift = 25;  // 32 MiB: mimalloc 2.0.9's arena block
inline constexpr std::size_t kSegmentAlign = std::size_t{1} << kSegmentShift;
inline constexpr unsigned kAddressBits = 47;
inline constexpr std::size_t kOwnerMapEntries = std::size_t{1} << (kAddressBits - kSegmentShift);

// An entry: 0 = not ours; otherwise a kind bit and the backend id.
inline constexpr std::uint8_t kOwnerArena = 0x40;      // mimalloc arena memory
inline constexpr std::uint8_t kOwnerDedicated = 0x80;  // one block, one segment
inline constexpr std::uint8_t kOwnerOnDemand = 0x20;   // backed only where committed
// A free route, on arena entries only (arena::set_free_route): what a
// free() may do on the one byte it loaded. Fast: straight to mimalloc (no
// statistics, no fork copying the heap); counted: mimalloc, then the count
// (statistics on, no fork copying the heap). Neither: the embedder checks.
inline constexpr std::uint8_t kOwnerFastFree = 0x10;
inline constexpr std::uint8_t kOwnerCountedFree = 0x08;
inline constexpr std::uint8_t kOwnerFreeRoutes = kOwnerFastFree | kOwnerCountedFree;
inline constexpr std::uint8_t kOwnerBackendMask = 0x07;
static_assert(kBackendCount <= kOwnerBackendMask + 1, "a backend id fits the entry's low bits");

extern std::atomic<std::uint8_t> g_owner_map[kOwnerMapEntries];

inline std::uint8_t owner_tag(const void* ptr) noexcept {
  const std::uintptr_t chunk = reinterpret_cast<std::uintptr_t>(ptr) >> kSegmentShift;
  if (chunk >= kOwnerMapEntries) return 0;
  return g_owner_map[chunk].load(std::memory_order_acquire);
}

// owner_tag of a block mimalloc's arenas just served: those lie in the map,
// so no bounds test.
inline std::uint8_t arena_block_tag(const void* block) noexcept {
  const std::uintptr_t chunk = reinterpret_cast<std::uintptr_t>(block) >> kSegmentShift;
  return g_owner_map[chunk & (kOwnerMapEntries - 1)].load(std::memory_order_acquire);
}

inline BackendId owner_backend(std::uint8_t tag) noexcept {
  return static_cast<BackendId>(tag & kOwnerBackendMask);
}

// True when [start, start+size) can be described by the map (and is not at
// address 0).
bool owner_map_covers(const void* start, std::size_t size) noexcept;
// Sets the entries of every chunk in [start, start+size) (32 MiB aligned).
void owner_map_set(const void* start, std::size_t size, std::uint8_t tag) noexcept;
// Puts `route` (0 or one kOwner*Free bit) in place of the free route of the
// entries of [start, start+size) that are an arena's now, each with one
// compare-and-swap: an entry another thread zeroes or re-tags meanwhile is
// left as that thread made it.
void owner_map_set_route(const void* start, std::size_t size, std::uint8_t route) noexcept;

}  // namespace mnemosyne
