// The statistics report of this process: at exit (MNEMOSYNE_SHOW_STATS,
// MNEMOSYNE_STATS_FILE) and on demand (mnemosyne_stats_json).
#pragma once

#include <cstddef>

namespace mnemosyne {

// Registers the at-exit report; called once from start-up.
void install_exit_report() noexcept;

// This process's statistics as JSON into buf (see stats::format_json).
std::size_t stats_json(char* buf, std::size_t len) noexcept;

}  // namespace mnemosyne
