// Where the redirected CRT functions send requests, decided once at start.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "common/policy.hpp"

namespace mnemosyne::win {

enum class Mode : std::uint8_t {
  host = 0,     // not started yet, or MNEMOSYNE_DISABLE: the original CRT functions
  arena = 1,    // every request to the arena: the fast path
  managed = 2,  // the arena, with MNEMOSYNE_SIZE routing and/or statistics counting
};

extern std::atomic<Mode> g_mode;
extern Policy g_policy;  // written before g_mode leaves host

inline Mode current_mode() noexcept {
  return g_mode.load(std::memory_order_acquire);
}

// Starts mnemosyne on the first call that can (start.cpp): not inside
// DllMain (the loader lock is held there, and the driver's cuInit runs on a
// worker thread that needs it), once, by one thread. Returns the mode after.
Mode start_if_possible() noexcept;

}  // namespace mnemosyne::win
