// Scope of one driver call: makes the heap's context on the configured device
// current (its primary context, retained once, or mnemosyne's own), marks the
// thread as "inside the driver" so the interposer never re-enters the driver
// from a malloc the driver makes, and on exit restores whatever context the
// thread had before.
#pragma once

#include <cstdint>

#include "backend/driver_api.hpp"
#include "platform/platform.hpp"

namespace mnemosyne {

// True while this thread is inside a driver call made by mnemosyne, or when
// the thread was started by the driver during such a call (see
// mark_thread_as_driver_owned).
bool in_driver_call() noexcept;

// Marks the calling thread as one the driver owns: the interposer then never
// asks the driver for memory on it. Called on threads the driver creates.
void mark_thread_as_driver_owned() noexcept;

// The CPU time (ns) the driver's own threads (those marked above, the first
// kMaxDriverThreads of them) have used so far: whether the driver is making
// progress while a thread of ours waits inside it for a lock one of them
// holds. Threads that ended count 0.
std::uint64_t driver_threads_cpu_ns() noexcept;

// Driver calls (DriverCall scopes) any thread of the process has finished
// so far: whether threads ahead of a waiting grower in the driver's locks
// are getting through.
std::uint64_t driver_calls_done() noexcept;

// RAII: sets the in-driver flag, then pushes the heap's context on
// device_ordinal(). ok() is false when the driver is unavailable or the
// context could not be made current (then nothing is pushed). For the call's
// duration the thread's asynchronous signals are blocked (they are delivered
// when it ends): a handler that forked in the middle of it would meet the
// driver's own fork handler waiting for a lock its own thread holds, as
// fork() from a handler that interrupted malloc must work (the call is made
// from malloc's slow path). The driver's one-time load is not covered: it
// runs in the library's constructor, before the program's handlers exist.
// errno is left as the call found it: what the driver does inside (a file it
// looks for and does not find, a system call it retries) is not the
// program's.
class DriverCall {
 public:
  DriverCall() noexcept;
  ~DriverCall();
  DriverCall(const DriverCall&) = delete;
  DriverCall& operator=(const DriverCall&) = delete;

  bool ok() const noexcept { return api_ != nullptr; }
  // Why ok() is false: the driver's answer to getting the device, retaining
  // its context (retaining or creating it) or pushing it;
  // CUDA_ERROR_NOT_SUPPORTED when an own context needs a newer driver;
  // CUDA_ERROR_NOT_INITIALIZED when the
  // driver is unavailable.
  CUresult error() const noexcept { return error_; }
  const DriverApi& api() const noexcept { return *api_; }
  CUdevice device() const noexcept { return device_; }
  // The device ordinal whose heap context is current (device_ordinal(),
  // frozen by the first DriverCall).
  int ordinal() const noexcept { return ordinal_; }

 private:
  const DriverApi* api_ = nullptr;
  CUdevice device_ = 0;
  int ordinal_ = 0;
  CUresult error_ = CUDA_SUCCESS;
  bool pushed_ = false;
  bool outer_flag_ = false;
  int saved_errno_ = 0;
  bool blocked_ = false;  // the outermost call blocked the signals
  Os::SignalMask saved_mask_{};
};

// Creates a fresh context on `ordinal` for tests and probes and leaves it
// current on the calling thread (cuCtxCreate_v4). Null on failure.
CUcontext create_temp_context(int ordinal) noexcept;
// Destroys a context from create_temp_context. False on failure.
bool destroy_temp_context(CUcontext ctx) noexcept;

}  // namespace mnemosyne
