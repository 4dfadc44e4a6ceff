// Where the exported malloc API sends new requests.
#pragma once

#include <atomic>
#include <cstdint>

namespace mnemosyne {

enum class Mode : std::uint8_t {
  host = 0,   // before start-up, MNEMOSYNE_DISABLE, or a forked child that lost its heap
  arena = 1,  // the arena (the normal state)
};

extern std::atomic<Mode> g_mode;

inline bool arena_mode() noexcept {
  return __builtin_expect(g_mode.load(std::memory_order_acquire) == Mode::arena, 1);
}

}  // namespace mnemosyne
