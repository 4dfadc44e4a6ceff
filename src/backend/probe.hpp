// What the driver and its devices offer, for `mnemosyne info` and tests.
#pragma once

#include <cstddef>

namespace mnemosyne {

struct DeviceReport {
  int ordinal;
  char name[256];
  std::size_t total_memory;
  int concurrent_managed_access;  // CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS
  int pageable_memory_access;     // CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS
  int compute_major;
  int compute_minor;
};

struct DriverReport {
  bool available;
  char path[512];
  int version;  // e.g. 13000
  char reason[512];
  int device_count;
  static constexpr int kMaxDevices = 64;
  DeviceReport devices[kMaxDevices];
};

// Loads the driver if needed and fills `out`. Never fails: an unavailable
// driver is reported with its reason.
void probe_driver(DriverReport* out) noexcept;

}  // namespace mnemosyne
