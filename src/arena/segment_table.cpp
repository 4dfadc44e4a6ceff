#include "arena/segment_table.hpp"

namespace mnemosyne {

bool SegmentTable::add(const Segment& segment, bool dedicated) noexcept {
  SpinGuard guard(lock_);
  for (std::size_t i = 0; i < kCapacity; ++i) {
    if (!entries_[i].used) {
      entries_[i] = Entry{segment, next_serial_++, dedicated, true};
      if (i + 1 > high_water_) high_water_ = i + 1;
      return true;
    }
  }
  return false;
}

bool SegmentTable::remove(const void* start, bool dedicated, Segment* out) noexcept {
  SpinGuard guard(lock_);
  return remove_locked(start, dedicated, out);
}

bool SegmentTable::remove_locked(const void* start, bool dedicated, Segment* out) noexcept {
  for (std::size_t i = 0; i < high_water_; ++i) {
    Entry& e = entries_[i];
    if (e.used && e.dedicated == dedicated && e.segment.start == start) {
      *out = e.segment;
      e.used = false;
      return true;
    }
  }
  return false;
}

std::size_t SegmentTable::dedicated_size(const void* start) noexcept {
  SpinGuard guard(lock_);
  for (std::size_t i = 0; i < high_water_; ++i) {
    const Entry& e = entries_[i];
    if (e.used && e.dedicated && e.segment.start == start) return e.segment.size;
  }
  return 0;
}

}  // namespace mnemosyne
