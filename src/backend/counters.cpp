// One BackendCounters per backend id, in static storage.
#include "backend/counters.hpp"

namespace mnemosyne {
namespace {

constinit BackendCounters g_counters[kBackendCount] = {};

}  // namespace

BackendCounters& backend_counters(BackendId id) noexcept {
  const auto index = static_cast<unsigned>(id);
  return g_counters[index < static_cast<unsigned>(kBackendCount) ? index : 0];
}

}  // namespace mnemosyne
