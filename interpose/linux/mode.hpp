// Where the exported malloc API sends requests, decided once at start.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace mnemosyne {

enum class Mode : std::uint8_t {
  host = 0,     // before start-up, MNEMOSYNE_DISABLE, or a forked child that lost its heap
  arena = 1,    // every request to the arena: the fast path
  managed = 2,  // the arena, with MNEMOSYNE_SIZE routing and/or statistics counting
};

struct Policy {
  bool counting = false;  // statistics were asked for
  bool routing = false;   // MNEMOSYNE_SIZE was given
  std::size_t size_min = 0;
  std::size_t size_max = SIZE_MAX;
};

extern std::atomic<Mode> g_mode;
extern std::atomic<bool> g_counting;  // same as g_policy.counting, read on free
extern Policy g_policy;               // written before g_mode leaves host

inline Mode current_mode() noexcept {
  return g_mode.load(std::memory_order_acquire);
}

inline bool arena_mode() noexcept {
  return current_mode() != Mode::host;
}

}  // namespace mnemosyne
