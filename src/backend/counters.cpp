// One BackendCounters per backend id, in static storage.
#include "backend/counters.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "backend/loader.hpp"
#include "backend/registry.hpp"

namespace mnemosyne {
namespace {

constinit BackendCounters g_counters[kBackendCount] = {};

}  // namespace

BackendCounters& backend_counters(BackendId id) noexcept {
  const auto index = static_cast<unsigned>(id);
  return g_counters[index < static_cast<unsigned>(kBackendCount) ? index : 0];
}

void describe_last_failure(BackendId id, char* out, std::size_t len) noexcept {
  if (len == 0) return;
  out[0] = '\0';
  const BackendCounters& c = backend_counters(id);
  const int step = c.last_failure_step.load(std::memory_order_relaxed);
  const int result = c.last_failure_result.load(std::memory_order_relaxed);
  const auto size = static_cast<unsigned long long>(c.last_failure_size.load());
  if (step == kContextFailed) {
    const int ordinal = device_ordinal();
    const int count = driver_info().device_count;
    if (driver_state() == DriverState::ready && ordinal >= count) {
      std::snprintf(out, len, "device %d does not exist: the driver reports %d device%s", ordinal,
                    count, count == 1 ? "" : "s");
    } else if (own_context() && result == CUDA_ERROR_NOT_SUPPORTED) {
      const int v = driver_info().version;
      std::snprintf(out, len,
                    "MNEMOSYNE_CONTEXT=own needs cuCtxCreate_v4, which this driver, CUDA %d.%d, "
                    "does not provide (drivers before CUDA 12.5 lack it)",
                    v / 1000, (v % 1000) / 10);
    } else {
      std::snprintf(out, len, "device %d's %s context could not be made current: %s", ordinal,
                    own_context() ? "own (MNEMOSYNE_CONTEXT=own)" : "primary",
                    cu_result_name(static_cast<CUresult>(result)));
    }
  } else if (step == kRegistryFull) {
    std::snprintf(out, len, "the %s backend's table of live blocks is full (%zu blocks)",
                  backend_name(id), AllocationRegistry::kCapacity);
  } else if (step == kInheritable) {
    std::snprintf(out, len,
                  "the kernel refused MADV_DONTFORK on %s memory (%s), so a forked child would "
                  "share its parent's heap",
                  backend_name(id), std::strerror(result));
  } else if (step == kRegisterFailed) {
    std::snprintf(out, len, "cuMemHostRegister of %llu bytes failed: %s", size,
                  cu_result_name(static_cast<CUresult>(result)));
  } else if (step == kVmmCreateFailed || step == kVmmMapFailed || step == kVmmAccessFailed) {
    const char* call = step == kVmmCreateFailed ? "cuMemCreate"
                       : step == kVmmMapFailed  ? "cuMemMap"
                                                : "cuMemSetAccess";
    std::snprintf(out, len,
                  "%s of %llu bytes failed: %s (host memory of the driver's "
                  "virtual-memory API)",
                  call, size, cu_result_name(static_cast<CUresult>(result)));
  } else if (step == kVmmFailed) {
    std::snprintf(out, len,
                  "the driver's virtual-memory API has no host memory of %llu bytes for the heap "
                  "(cuMemGetAllocationGranularity or cuMemAddressReserve): %s",
                  size, cu_result_name(static_cast<CUresult>(result)));
  } else if (step == kReserveFailed) {
    std::snprintf(out, len, "mmap of %llu bytes (a reservation) failed: %s", size,
                  std::strerror(result));
  } else if (step == kAllocationFailed) {
    if (!is_cuda_backend(id)) {
      std::snprintf(out, len, "mmap of %llu bytes failed: %s", size, std::strerror(result));
    } else {
      std::snprintf(out, len, "%s of %llu bytes failed: %s",
                    is_managed_backend(id) ? "cuMemAllocManaged" : "cuMemHostAlloc", size,
                    cu_result_name(static_cast<CUresult>(result)));
    }
  }
}

}  // namespace mnemosyne
