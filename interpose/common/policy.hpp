// What the exported allocation API does besides allocating, decided once at
// start from the options and the same on every OS: count for the statistics
// (MNEMOSYNE_SHOW_STATS, MNEMOSYNE_STATS_FILE), and send only the sizes
// MNEMOSYNE_SIZE names to the arena, the others to the system allocator.
#pragma once

#include <cstddef>
#include <cstdint>

#include "config/options.hpp"

namespace mnemosyne {

struct Policy {
  bool counting = false;  // statistics were asked for
  bool routing = false;   // MNEMOSYNE_SIZE was given
  std::size_t size_min = 0;
  std::size_t size_max = SIZE_MAX;

  // Whether a request of `size` bytes is the arena's.
  bool to_arena(std::size_t size) const noexcept {
    return !routing || (size >= size_min && size <= size_max);
  }
};

inline Policy policy_of(const config::Options& o) noexcept {
  Policy p;
  p.counting = o.show_stats || o.stats_file[0] != '\0';
  p.routing = o.size_routing;
  p.size_min = o.size_min;
  p.size_max = o.size_max;
  return p;
}

}  // namespace mnemosyne
