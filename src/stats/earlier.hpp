// Blocks the system allocator handed out before mnemosyne began counting:
// the dynamic loader's and earlier constructors' (Linux), the C runtime's
// before injection (Windows). Their allocations were never counted, so
// their frees are counted apart ("earlier_frees"), not as frees of the
// system pool, whose figures would otherwise go negative.
//
// The interposer remembers each such block before its start: on Linux
// every one passes through its malloc; on Windows it walks the runtime's
// heap at start. A free of a block of the system allocator asks here first.
// A fixed table (nothing here may allocate); blocks past its capacity are
// not remembered, and their frees then count as the system pool's (the
// report never shows that pool's live bytes below zero, see report.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace mnemosyne::stats {

// Thread-safe; false when the table is full.
bool remember_earlier(const void* block) noexcept;
// Forgets a remembered block that is not freed but replaced (a realloc
// before the start), without counting anything.
void forget_earlier(const void* block) noexcept;

// The free of a block of the system allocator: counted apart when it is a
// remembered one (and forgotten), else as a free of the system pool.
void count_system_free(const void* block, std::size_t usable) noexcept;

struct EarlierFrees {
  std::uint64_t count = 0;
  std::uint64_t bytes = 0;
  std::uint64_t not_remembered = 0;  // blocks past the table's capacity
};
EarlierFrees earlier_frees() noexcept;

}  // namespace mnemosyne::stats
