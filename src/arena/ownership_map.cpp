#include "arena/ownership_map.hpp"

namespace mnemosyne {

std::atomic<std::uint8_t> g_owner_map[kOwnerMapEntries];

bool owner_map_covers(const void* start, std::size_t size) noexcept {
  const auto first = reinterpret_cast<std::uintptr_t>(start);
  if (size == 0 || first % kSegmentAlign != 0 || size % kSegmentAlign != 0) return false;
  const std::uintptr_t end = first + size;
  return end > first && ((end - 1) >> kSegmentShift) < kOwnerMapEntries;
}

void owner_map_set(const void* start, std::size_t size, std::uint8_t tag) noexcept {
  const std::uintptr_t first = reinterpret_cast<std::uintptr_t>(start) >> kSegmentShift;
  const std::uintptr_t count = size >> kSegmentShift;
  for (std::uintptr_t i = 0; i < count; ++i) {
    g_owner_map[first + i].store(tag, std::memory_order_release);
  }
}

}  // namespace mnemosyne
