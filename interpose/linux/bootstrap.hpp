// What the interposer needs to start, and where it comes from.
#pragma once

#include <cstddef>

#include "arena/arena.hpp"
#include "backend/backend_id.hpp"

namespace mnemosyne {

struct StartOptions {
  bool disable = false;
  BackendId backend = BackendId::unified;
  int device = 0;
  std::size_t arena_size = std::size_t{64} << 20;
  std::size_t limit = 0;
  arena::Fallback fallback = arena::Fallback::host;
};

// Reads MNEMOSYNE_* from the environment without allocating; an invalid
// value gets one warning line and the default.
void read_start_options(StartOptions* options) noexcept;

void start_from_options(const StartOptions& options) noexcept;

// Writes one line to stderr with a single write(2).
void warn_line(const char* line) noexcept;

}  // namespace mnemosyne
