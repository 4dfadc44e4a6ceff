// The rank's index on its node, from the variables MPI launchers and Slurm set.
#include <climits>
#include <cstdint>

#include "config/internal.hpp"
#include "config/options.hpp"

namespace mnemosyne::config {
namespace {

// The value of the first entry of envp named exactly `name`, or nullptr.
// (Launchers' variables are case-sensitive, unlike MNEMOSYNE_ ones.)
const char* find_exact(char* const* envp, const char* name) noexcept {
  if (envp == nullptr) return nullptr;
  for (char* const* entry = envp; *entry != nullptr; ++entry) {
    const char* e = *entry;
    const char* n = name;
    while (*n != '\0' && *e == *n) {
      ++e;
      ++n;
    }
    if (*n == '\0' && *e == '=') return e + 1;
  }
  return nullptr;
}

}  // namespace

int local_rank(char* const* envp) noexcept {
  for (const char* name : detail::kLocalRankVariables) {
    const char* value = find_exact(envp, name);
    if (value == nullptr) continue;
    std::uint64_t rank = 0;
    if (detail::parse_decimal(value, detail::length(value), INT_MAX, &rank)) {
      return static_cast<int>(rank);
    }
  }
  return -1;
}

}  // namespace mnemosyne::config
