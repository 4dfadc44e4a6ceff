// The memory backends, one table: every layer above the backends (options,
// the launcher's help and info, the start report, the arena) takes names,
// choices and properties from kBackends, in the manner of mimalloc's options
// table. Adding a backend: an enumerator, a row, and its implementation
// (backends.hpp, BackendType); a missing row fails the static_assert below.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string_view>

namespace mnemosyne {

// One value per backend. `none` marks "not ours" in ownership tables; the
// values are part of the ownership-map and statistics encodings. `count` is
// not a backend: the number of ids, `none` included.
enum class BackendId : std::uint8_t { none = 0, host, unified, device, hbm, gddr, pinned, count };

inline constexpr int kBackendCount = static_cast<int>(BackendId::count);

// The driver memory a backend serves.
enum class MemoryKind : std::uint8_t {
  host,     // anonymous mmap (VirtualAlloc), no driver
  managed,  // cuMemAllocManaged: migrates between the CPU and the GPUs
  pinned,   // page-locked host RAM mapped into the device's address space
};

struct BackendRow {
  BackendId id;
  const char* name;  // the user's name (MNEMOSYNE_BACKEND, --backend, statistics pools)
  MemoryKind memory;
  // Managed memory advised to live on the chosen device (cuMemAdvise
  // SET_PREFERRED_LOCATION, MNEMOSYNE_DEVICE).
  bool prefers_device;
  // Why fresh memory does or does not read zero, as the start report says it
  // (MNEMOSYNE_VERBOSE); null: the platform layer reads the evidence (pinned:
  // the nvidia module's InitializeSystemMemoryAllocations).
  const char* zero_evidence;
  const char* summary;  // one line for --help and the documentation
};

// In the order the documentation, the warnings and `mnemosyne info` list
// them: the driver's first, the one without a driver last.
inline constexpr BackendRow kBackends[] = {
    {BackendId::unified, "unified", MemoryKind::managed, false,
     "the driver documents managed memory as not cleared",
     "managed memory (cuMemAllocManaged), migrating on demand between CPU and GPU"},
    {BackendId::device, "device", MemoryKind::managed, true,
     "the driver documents managed memory as not cleared",
     "managed memory advised to live on device MNEMOSYNE_DEVICE"},
    {BackendId::hbm, "hbm", MemoryKind::managed, true,
     "the driver documents managed memory as not cleared",
     "as device, under a pool identity of its own (no claim of physical placement)"},
    {BackendId::gddr, "gddr", MemoryKind::managed, true,
     "the driver documents managed memory as not cleared",
     "as device, under a pool identity of its own (no claim of physical placement)"},
    {BackendId::pinned, "pinned", MemoryKind::pinned, false, nullptr,
     "page-locked host RAM mapped into the device (MNEMOSYNE_PIN: how much is locked)"},
    {BackendId::host, "host", MemoryKind::host, false,
     "anonymous memory from the system is zero-filled",
     "anonymous host memory, no driver (never chosen silently for a CUDA backend)"},
};

// Every backend has exactly one row, with a name.
consteval bool backend_table_complete() {
  if (std::size(kBackends) != std::size_t(kBackendCount - 1)) return false;
  for (int i = 1; i < kBackendCount; ++i) {
    int rows = 0;
    for (const BackendRow& row : kBackends) {
      if (static_cast<int>(row.id) == i && row.name != nullptr && row.name[0] != '\0') ++rows;
    }
    if (rows != 1) return false;
  }
  return true;
}
static_assert(backend_table_complete(), "every BackendId needs exactly one row in kBackends");

// The row of `id`; null for `none`. Not for constant expressions: GCC's
// UBSan instruments the pointer test, which then is not one (the functions
// below return values instead).
inline const BackendRow* backend_row(BackendId id) noexcept {
  for (const BackendRow& row : kBackends) {
    if (row.id == id) return &row;
  }
  return nullptr;
}

constexpr const char* backend_name(BackendId id) noexcept {
  for (const BackendRow& row : kBackends) {
    if (row.id == id) return row.name;
  }
  return "none";
}

// The kind of memory of `id`; host for `none`.
constexpr MemoryKind backend_memory(BackendId id) noexcept {
  for (const BackendRow& row : kBackends) {
    if (row.id == id) return row.memory;
  }
  return MemoryKind::host;
}

// Parses a user-facing backend name (exact, lower case). False when unknown.
constexpr bool parse_backend_name(std::string_view name, BackendId* out) noexcept {
  for (const BackendRow& row : kBackends) {
    if (name == row.name) {
      *out = row.id;
      return true;
    }
  }
  return false;
}

constexpr bool is_cuda_backend(BackendId id) noexcept {
  return backend_memory(id) != MemoryKind::host;
}

constexpr bool is_managed_backend(BackendId id) noexcept {
  return backend_memory(id) == MemoryKind::managed;
}

}  // namespace mnemosyne
