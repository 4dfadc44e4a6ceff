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

// An entry: 0 = not ours; otherwise a kind bit and the backend id, in
// bits 3-5: an entry masked with kOwnerBackendMask is the id times 8, which
// the counted paths turn into an offset with a scaled address.
inline constexpr std::uint8_t kOwnerDedicated = 0x80;  // one block, one segment
inline constexpr std::uint8_t kOwnerArena = 0x40;      // mimalloc arena memory
inline constexpr unsigned kOwnerBackendShift = 3;
inline constexpr std::uint8_t kOwnerBackendMask = 0x38;
inline constexpr std::uint8_t kOwnerOnDemand = 0x04;  // backed only where committed
// A free route, on arena entries only (arena::set_free_route): what a
// free() may do on the one byte it loaded. Fast: straight to mimalloc (no
// statistics, no fork copying the heap); counted: mimalloc, then the count
// (statistics on, no fork copying the heap). Neither: the embedder checks.
inline constexpr std::uint8_t kOwnerFastFree = 0x02;
inline constexpr std::uint8_t kOwnerCountedFree = 0x01;
inline constexpr std::uint8_t kOwnerFreeRoutes = kOwnerFastFree | kOwnerCountedFree;
static_assert(kBackendCount <= (kOwnerBackendMask >> kOwnerBackendShift) + 1,
              "a backend id fits the entry's backend bits");

// The entry of a kind (kOwnerArena, kOwnerDedicated, with kOwnerOnDemand)
// of `backend`'s memory.
inline constexpr std::uint8_t owner_entry(std::uint8_t kind, BackendId backend) noexcept {
  return static_cast<std::uint8_t>(kind | (static_cast<unsigned>(backend) << kOwnerBackendShift));
}

extern std::atomic<std::uint8_t> g_owner_map[kOwnerMapEntries];

inline std::uint8_t owner_tag(const void* ptr) noexcept {
  const std::uintptr_t chunk = reinterpret_cast<std::uintptr_t>(ptr) >> kSegmentShift;
  if (chunk >= kOwnerMapEntries) return 0;
  return g_owner_map[chunk].load(std::memory_order_acquire);
}

// The entry's index for a pointer below 2^47, with no bounds test and no
// mask: for the fast paths, whose pointers a process's allocators returned
// (on x86-64 Linux those all lie below 2^47: interpose/linux/fast_path.hpp;
// mnemosyne takes no segment the map does not cover). The mask it had cost
// free() one instruction in five of its overhead over mimalloc's (issue 48).
// A pointer at or above 2^47 indexes past the map: only a pointer no
// allocator returned (free of it crashes glibc's free too), or one whose top
// bits carry a tag under Intel's linear address masking (LAM, which a
// process must enable itself; mnemosyne does not support it). owner_tag,
// which tests the bound, everywhere else.
inline std::uintptr_t owner_chunk_unchecked(const void* ptr) noexcept {
  return reinterpret_cast<std::uintptr_t>(ptr) >> kSegmentShift;
}
inline std::atomic<std::uint8_t>& owner_entry_unchecked(const void* ptr) noexcept {
  return g_owner_map[owner_chunk_unchecked(ptr)];
}

// owner_tag of a block mimalloc's arenas just served: those lie in the map.
inline std::uint8_t arena_block_tag(const void* block) noexcept {
  return owner_entry_unchecked(block).load(std::memory_order_acquire);
}

inline BackendId owner_backend(std::uint8_t tag) noexcept {
  return static_cast<BackendId>((tag & kOwnerBackendMask) >> kOwnerBackendShift);
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
