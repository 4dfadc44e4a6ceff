// Loads the CUDA driver once per process and resolves its entry points.
//
// One atomic state machine: uninitialized -> initializing -> ready |
// unavailable. Concurrent first callers see exactly one load and one cuInit;
// the losers wait for the winner. Nothing here calls malloc on a path that a
// malloc interposer reaches after start-up, except dlopen/dlsym inside the
// one-time load (which runs with the in-driver flag set, see driver_call.hpp).
#pragma once

#include <cstddef>

#include "backend/driver_api.hpp"

namespace mnemosyne {

enum class DriverState : int { uninitialized = 0, initializing, ready, unavailable };

// Loads the driver if nobody has yet: the library named by
// MNEMOSYNE_CUDA_DRIVER (read with secure_getenv on Linux, so ignored in
// set-uid and set-gid processes), else libcuda.so.1, else libcuda.so
// (nvcuda.dll on Windows); resolves every entry point with cuGetProcAddress_v2
// (ABI of CUDA_VERSION) when the driver has it, else by the versioned export
// names; calls cuInit(0) through call_guarded (platform/crash_guard.hpp).
// Returns the entry points, or nullptr when the driver is unavailable.
// On a thread inside a driver call (in_driver_call()) it never loads nor waits
// for a load in progress: it returns nullptr unless the driver is ready.
const DriverApi* driver_api() noexcept;

// Names the driver library to open instead of reading MNEMOSYNE_CUDA_DRIVER
// (the caller has read its options already, and applies the set-uid rule).
// Effective only before the first load; "" restores the default search.
void set_driver_path(const char* path) noexcept;

// The current state, without triggering a load.
DriverState driver_state() noexcept;

// What the load found, valid once driver_state() is ready or unavailable.
struct DriverInfo {
  char path[512];        // the library that was opened, or the last one tried
  int version;           // cuDriverGetVersion, 0 when unknown
  int device_count;      // cuDeviceGetCount, 0 when unknown
  CUresult init_result;  // cuInit's result, CUDA_SUCCESS when it succeeded
  char reason[512];      // why the driver is unavailable; empty when ready
};
const DriverInfo& driver_info() noexcept;

// The device the CUDA backends allocate on and advise for (default 0).
// May be changed until the first allocation; later changes are ignored.
void set_device_ordinal(int ordinal) noexcept;
int device_ordinal() noexcept;

// The context the CUDA backends allocate in: the device's primary context
// (false, the default), or one mnemosyne creates with cuCtxCreate_v4 (true),
// which cuDevicePrimaryCtxReset (cudaDeviceReset) does not free. Read when
// a device's context is first needed; later changes are ignored.
void set_own_context(bool own) noexcept;
bool own_context() noexcept;

// In a child created by fork() without exec the driver must never be called:
// this makes driver_api() return nullptr for good in this process.
void driver_mark_forked_child() noexcept;

// Name of a CUresult for messages ("CUDA_ERROR_OUT_OF_MEMORY"); never null.
const char* cu_result_name(CUresult result) noexcept;

}  // namespace mnemosyne
