// The statistics at exit (MNEMOSYNE_SHOW_STATS, MNEMOSYNE_STATS_FILE) and
// for mnemosyne_stats_json, as on Linux.
#pragma once

#include <cstddef>

namespace mnemosyne::win {

void install_exit_report() noexcept;
std::size_t stats_json(char* buf, std::size_t len) noexcept;

}  // namespace mnemosyne::win
