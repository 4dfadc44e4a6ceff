#include "arena/ownership_map.hpp"

namespace mnemosyne {

std::atomic<std::uint8_t> g_owner_map[kOwnerMapEntries];

bool owner_map_covers(const void* start, std::size_t size) noexcept {
  const auto first = reinterpret_cast<std::uintptr_t>(start);
  if (size == 0 || first % kSegmentAlign != 0 || size % kSegmentAlign != 0) return false;
  const std::uintptr_t end = first + size;
  return first != 0 && end > first && ((end - 1) >> kSegmentShift) < kOwnerMapEntries;
}

void owner_map_set(const void* start, std::size_t size, std::uint8_t tag) noexcept {
  const std::uintptr_t first = reinterpret_cast<std::uintptr_t>(start) >> kSegmentShift;
  const std::uintptr_t count = size >> kSegmentShift;
  for (std::uintptr_t i = 0; i < count; ++i) {
    g_owner_map[first + i].store(tag, std::memory_order_release);
  }
}

void owner_map_set_route(const void* start, std::size_t size, std::uint8_t route) noexcept {
  const std::uintptr_t first = reinterpret_cast<std::uintptr_t>(start) >> kSegmentShift;
  const std::uintptr_t count = size >> kSegmentShift;
  for (std::uintptr_t i = 0; i < count; ++i) {
    std::atomic<std::uint8_t>& entry = g_owner_map[first + i];
    std::uint8_t tag = entry.load(std::memory_order_relaxed);
    while ((tag & kOwnerArena) != 0) {
      const auto want = static_cast<std::uint8_t>((tag & ~kOwnerFreeRoutes) | route);
      if (want == tag || entry.compare_exchange_weak(tag, want, std::memory_order_seq_cst,
                                                     std::memory_order_relaxed)) {
        break;
      }
    }
  }
}

}  // namespace mnemosyne
