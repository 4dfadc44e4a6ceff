#include "arena/segment_table.hpp"

namespace mnemosyne {

bool SegmentTable::add(const Segment& segment, bool dedicated) noexcept {
  SpinGuard guard(lock_);
  return add_locked(segment, dedicated);
}

bool SegmentTable::add_locked(const Segment& segment, bool dedicated) noexcept {
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

SegmentTable::Entry* SegmentTable::find_dedicated_locked(const void* start) noexcept {
  for (std::size_t i = 0; i < high_water_; ++i) {
    Entry& e = entries_[i];
    if (e.used && e.dedicated && e.segment.start == start) return &e;
  }
  return nullptr;
}

std::size_t SegmentTable::dedicated_size(const void* start) noexcept {
  SpinGuard guard(lock_);
  const Entry* e = find_dedicated_locked(start);
  return e != nullptr ? e->segment.size : 0;
}

bool SegmentTable::find_dedicated(const void* start, Segment* out) noexcept {
  SpinGuard guard(lock_);
  const Entry* e = find_dedicated_locked(start);
  if (e != nullptr) *out = e->segment;
  return e != nullptr;
}

bool SegmentTable::resize_dedicated(const void* start, std::size_t size) noexcept {
  SpinGuard guard(lock_);
  Entry* e = find_dedicated_locked(start);
  if (e == nullptr || size > e->segment.capacity) return false;
  e->segment.size = size;
  // A fork's early copy of the block, made at its old size, is not this one.
  e->serial = next_serial_++;
  return true;
}

}  // namespace mnemosyne
