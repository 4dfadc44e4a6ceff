// Where the exported API sends requests (mode.hpp): host until start-up.
#include "mode.hpp"

namespace mnemosyne {

constinit std::atomic<Mode> g_mode{Mode::host};
constinit std::atomic<std::uint8_t> g_free_checks{0};
constinit Policy g_policy{};
constinit std::atomic<bool> g_before_start{true};

}  // namespace mnemosyne
