// Start-up of the preloaded library and what it leaves for the rest of the
// interposer: the options read, and the one-line warning writer.
#pragma once

#include "config/options.hpp"

namespace mnemosyne {

// The options as read at start (valid once the constructor ran).
const config::Options& start_options() noexcept;

// Writes one line to stderr with a single write(2).
void warn_line(const char* line) noexcept;

}  // namespace mnemosyne
