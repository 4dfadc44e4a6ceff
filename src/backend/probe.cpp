// probe_driver: what the loaded driver and its devices report.
#include "backend/probe.hpp"

#include <cstdio>
#include <cstring>

#include "backend/internal.hpp"
#include "backend/loader.hpp"

namespace mnemosyne {
namespace {

int attribute(const DriverApi& api, CUdevice_attribute attr, CUdevice dev) noexcept {
  int value = 0;
  if (api.cuDeviceGetAttribute == nullptr ||
      api.cuDeviceGetAttribute(&value, attr, dev) != CUDA_SUCCESS) {
    return 0;
  }
  return value;
}

void probe_device(const DriverApi& api, int ordinal, DeviceReport* d) noexcept {
  d->ordinal = ordinal;
  CUdevice dev = 0;
  if (api.cuDeviceGet(&dev, ordinal) != CUDA_SUCCESS) {
    std::snprintf(d->name, sizeof d->name, "(cuDeviceGet failed)");
    return;
  }
  if (api.cuDeviceGetName == nullptr ||
      api.cuDeviceGetName(d->name, static_cast<int>(sizeof d->name), dev) != CUDA_SUCCESS) {
    d->name[0] = '\0';
  }
  d->name[sizeof d->name - 1] = '\0';
  std::size_t total = 0;
  if (api.cuDeviceTotalMem != nullptr && api.cuDeviceTotalMem(&total, dev) == CUDA_SUCCESS) {
    d->total_memory = total;
  }
  d->concurrent_managed_access = attribute(api, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, dev);
  d->pageable_memory_access = attribute(api, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, dev);
  d->compute_major = attribute(api, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  d->compute_minor = attribute(api, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
}

}  // namespace

void probe_driver(DriverReport* out) noexcept {
  std::memset(out, 0, sizeof *out);
  const DriverApi* api = driver_api();
  const DriverInfo& info = driver_info();
  out->available = api != nullptr;
  std::snprintf(out->path, sizeof out->path, "%s", info.path);
  out->version = info.version;
  if (api == nullptr) {
    if (info.reason[0] != '\0') {
      std::snprintf(out->reason, sizeof out->reason, "%s", info.reason);
    } else if (driver_state() == DriverState::unavailable) {
      std::snprintf(out->reason, sizeof out->reason,
                    "the CUDA driver must not be used in a child created by fork()");
    } else {
      std::snprintf(out->reason, sizeof out->reason, "the CUDA driver is not loaded");
    }
    return;
  }
  detail::InDriverScope in_driver;
  int count = 0;
  if (api->cuDeviceGetCount(&count) != CUDA_SUCCESS) count = info.device_count;
  out->device_count = count;
  const int shown = count < DriverReport::kMaxDevices ? count : DriverReport::kMaxDevices;
  for (int i = 0; i < shown; ++i) probe_device(*api, i, &out->devices[i]);
}

}  // namespace mnemosyne
