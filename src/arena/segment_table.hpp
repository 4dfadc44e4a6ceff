// The segments the arena holds: its mimalloc arenas and its dedicated blocks.
// Read and changed only on slow paths, under one short lock.
#pragma once

#include <cstddef>
#include <cstdint>

#include "arena/segment_provider.hpp"
#include "arena/spin_lock.hpp"

namespace mnemosyne {

class SegmentTable {
 public:
  static constexpr std::size_t kCapacity = 4096;

  struct Entry {
    Segment segment;
    std::uint64_t serial = 0;  // unique per add(): tells a reused slot from the old one
    bool dedicated = false;
    bool used = false;
  };

  // False when the table is full.
  bool add(const Segment& segment, bool dedicated) noexcept;
  // The same, for a caller that holds lock().
  bool add_locked(const Segment& segment, bool dedicated) noexcept;
  // Removes the dedicated block (or the arena) starting at `start`; false
  // when none does.
  bool remove(const void* start, bool dedicated, Segment* out) noexcept;
  // The same, for a caller that holds lock().
  bool remove_locked(const void* start, bool dedicated, Segment* out) noexcept;
  // Size of the dedicated block starting at `start`, 0 when none does.
  std::size_t dedicated_size(const void* start) noexcept;
  // The dedicated block starting at `start`, in *out; false when none does.
  bool find_dedicated(const void* start, Segment* out) noexcept;
  // Sets the size of the growable block starting at `start` (at most its
  // capacity); false when there is none.
  bool resize_dedicated(const void* start, std::size_t size) noexcept;

  // For fork handling: the caller holds lock() around the iteration.
  SpinLock& lock() noexcept { return lock_; }
  Entry* entries() noexcept { return entries_; }
  std::size_t high_water() const noexcept { return high_water_; }

 private:
  Entry* find_dedicated_locked(const void* start) noexcept;

  SpinLock lock_;
  Entry entries_[kCapacity];
  std::size_t high_water_ = 0;  // entries_[high_water_..] were never used
  std::uint64_t next_serial_ = 1;
};

}  // namespace mnemosyne
