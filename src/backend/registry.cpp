// AllocationRegistry: lock-free open addressing with linear probing.
//
// A slot holds 0 (never used), kTombstone (used, then erased) or a pointer.
// Slots never return to 0, so a recorded pointer is always reached from its
// home slot through non-empty slots: a lookup may stop at the first 0. An
// insert takes the first free (0 or tombstone) slot on its probe path; the
// backends insert each pointer once, fresh from the driver, so no duplicate
// check is needed. count_ is reserved before a slot is claimed, which makes
// "full" exact under concurrency and guarantees the reserving insert a slot.
#include "backend/registry.hpp"

namespace mnemosyne {
namespace {

constexpr std::uintptr_t kEmpty = 0;
constexpr std::uintptr_t kTombstone = 1;
constexpr std::size_t kMask = AllocationRegistry::kCapacity - 1;
static_assert((AllocationRegistry::kCapacity & kMask) == 0, "capacity must be a power of two");

bool storable(const void* ptr) noexcept {
  const auto v = reinterpret_cast<std::uintptr_t>(ptr);
  return v != kEmpty && v != kTombstone;
}

}  // namespace

std::size_t AllocationRegistry::slot_of(const void* ptr) noexcept {
  // Blocks are page aligned (driver blocks 2 MiB aligned): drop the low bits,
  // then Fibonacci hashing spreads neighbours over the table.
  const auto v = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(ptr)) >> 12;
  return static_cast<std::size_t>((v * 0x9E3779B97F4A7C15ull) >> 40) & kMask;
}

bool AllocationRegistry::insert(void* ptr) noexcept {
  if (!storable(ptr)) return false;
  const std::size_t limit = kCapacity - withheld_.load(std::memory_order_relaxed);
  if (count_.fetch_add(1, std::memory_order_relaxed) >= limit) {
    count_.fetch_sub(1, std::memory_order_relaxed);
    return false;
  }
  const auto value = reinterpret_cast<std::uintptr_t>(ptr);
  const std::size_t home = slot_of(ptr);
  // The reservation guarantees a free slot; concurrent inserts may take the
  // ones this scan saw, so scan again until one is claimed.
  for (;;) {
    for (std::size_t i = 0; i < kCapacity; ++i) {
      std::atomic<std::uintptr_t>& slot = slots_[(home + i) & kMask];
      std::uintptr_t cur = slot.load(std::memory_order_relaxed);
      while (cur == kEmpty || cur == kTombstone) {
        if (slot.compare_exchange_weak(cur, value, std::memory_order_release,
                                       std::memory_order_relaxed)) {
          return true;
        }
      }
    }
  }
}

bool AllocationRegistry::erase(void* ptr) noexcept {
  if (!storable(ptr)) return false;
  const auto value = reinterpret_cast<std::uintptr_t>(ptr);
  const std::size_t home = slot_of(ptr);
  for (std::size_t i = 0; i < kCapacity; ++i) {
    std::atomic<std::uintptr_t>& slot = slots_[(home + i) & kMask];
    std::uintptr_t cur = slot.load(std::memory_order_acquire);
    if (cur == kEmpty) return false;
    if (cur == value) {
      // Only one of two racing erasers of the same pointer wins.
      if (!slot.compare_exchange_strong(cur, kTombstone, std::memory_order_acq_rel,
                                        std::memory_order_relaxed)) {
        return false;
      }
      count_.fetch_sub(1, std::memory_order_relaxed);
      return true;
    }
  }
  return false;
}

bool AllocationRegistry::contains(const void* ptr) const noexcept {
  if (!storable(ptr)) return false;
  const auto value = reinterpret_cast<std::uintptr_t>(ptr);
  const std::size_t home = slot_of(ptr);
  for (std::size_t i = 0; i < kCapacity; ++i) {
    const std::uintptr_t cur = slots_[(home + i) & kMask].load(std::memory_order_acquire);
    if (cur == kEmpty) return false;
    if (cur == value) return true;
  }
  return false;
}

void AllocationRegistry::set_limit_for_testing(std::size_t limit) noexcept {
  withheld_.store(limit < kCapacity ? kCapacity - limit : 0, std::memory_order_relaxed);
}

}  // namespace mnemosyne
