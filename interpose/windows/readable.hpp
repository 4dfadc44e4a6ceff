// Memory this process may read without faulting, asked of the system
// (VirtualQuery) before reading: for data whose place another process
// chose, which may lie next to, or in, memory that is not mapped.
#pragma once

#include <windows.h>

#include <cstddef>

namespace mnemosyne::win {

// Committed, readable, not a guard page.
bool readable(const MEMORY_BASIC_INFORMATION& region) noexcept;

// Every byte of [at, at + n) lies in such memory (n == 0: true).
bool readable(const void* at, std::size_t n) noexcept;

}  // namespace mnemosyne::win
