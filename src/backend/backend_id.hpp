// Names of the memory backends, shared by every layer above the backends.
#pragma once

#include <cstdint>
#include <string_view>

namespace mnemosyne {

// One value per backend type. `none` marks "not ours" in ownership tables.
enum class BackendId : std::uint8_t { none = 0, host, unified, device, hbm, gddr, pinned };

inline constexpr int kBackendCount = 7;  // including `none`

constexpr const char* backend_name(BackendId id) noexcept {
  switch (id) {
    case BackendId::host:
      return "host";
    case BackendId::unified:
      return "unified";
    case BackendId::device:
      return "device";
    case BackendId::hbm:
      return "hbm";
    case BackendId::gddr:
      return "gddr";
    case BackendId::pinned:
      return "pinned";
    case BackendId::none:
      break;
  }
  return "none";
}

// Parses a user-facing backend name (exact, lower case). False when unknown.
constexpr bool parse_backend_name(std::string_view name, BackendId* out) noexcept {
  for (int i = 1; i < kBackendCount; ++i) {
    const auto id = static_cast<BackendId>(i);
    if (name == backend_name(id)) {
      *out = id;
      return true;
    }
  }
  return false;
}

constexpr bool is_cuda_backend(BackendId id) noexcept {
  return id != BackendId::none && id != BackendId::host;
}

}  // namespace mnemosyne
