// Helpers shared by the .cpp files of src/backend only; not part of the
// backend's public contract.
#pragma once

#include <cstdint>

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

// CLOCK_MONOTONIC in nanoseconds.
std::uint64_t monotonic_ns() noexcept;

}  // namespace mnemosyne::detail
