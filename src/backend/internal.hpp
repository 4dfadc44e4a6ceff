// Helpers shared by the .cpp files of src/backend only; not part of the
// backend's public contract.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/backend_id.hpp"
#include "platform/platform.hpp"

namespace mnemosyne::detail {

// Sets the thread's in-driver flag for a scope without touching contexts:
// for the one-time load and for probes, where the driver may call malloc.
class InDriverScope {
 public:
  InDriverScope() noexcept;
  ~InDriverScope();
  InDriverScope(const InDriverScope&) = delete;
  InDriverScope& operator=(const InDriverScope&) = delete;

 private:
  bool outer_;
};

// Makes the device ordinal final (first allocation) and returns it: later
// set_device_ordinal calls are ignored.
int freeze_device_ordinal() noexcept;

// A monotonic clock in nanoseconds.
inline std::uint64_t monotonic_ns() noexcept {
  return Os::monotonic_ns();
}

// Clears memory of backend `id` with the CPU, counted.
void clear_on_cpu(BackendId id, void* ptr, std::size_t size) noexcept;

}  // namespace mnemosyne::detail
