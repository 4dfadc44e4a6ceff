// A bounded, lock-free set of the live blocks one backend handed out.
//
// Open addressing over a fixed array of atomic slots: insert claims an empty
// slot with compare-and-swap, erase clears the slot holding the pointer. A full
// registry refuses the insert; the caller then rolls its allocation back.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace mnemosyne {

class AllocationRegistry {
 public:
  static constexpr std::size_t kCapacity = 4096;

  // Records `ptr`. False when every slot is taken.
  bool insert(void* ptr) noexcept;
  // Forgets `ptr`. False when it was not recorded.
  bool erase(void* ptr) noexcept;
  bool contains(const void* ptr) const noexcept;
  std::size_t size() const noexcept { return count_.load(std::memory_order_relaxed); }

  // Tests only: how many slots may be used (<= kCapacity), to reach "full"
  // without thousands of driver allocations.
  void set_limit_for_testing(std::size_t limit) noexcept;

 private:
  static std::size_t slot_of(const void* ptr) noexcept;
  std::atomic<std::uintptr_t> slots_[kCapacity] = {};
  std::atomic<std::size_t> count_{0};
  // Slots withheld by set_limit_for_testing: zero by default, so that a
  // registry is all zeros and lies in .bss, not in the library's file.
  std::atomic<std::size_t> withheld_{0};
};

}  // namespace mnemosyne
