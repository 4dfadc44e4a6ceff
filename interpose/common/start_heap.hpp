// Starting the heap, the same way for the Linux preload library and the
// Windows DLL (interpose/linux/bootstrap.cpp, interpose/windows/start.cpp):
// options to a running arena, and what is said about it at start.
#pragma once

#include "arena/arena.hpp"
#include "config/options.hpp"

namespace mnemosyne {

// The device to use: DEVICE, or for DEVICE=local-rank the rank's local index
// modulo the device count (which loads the driver, when it would be anyway).
int choose_device(const config::Options& o) noexcept;

// MNEMOSYNE_VERBOSE's lines at start, each through `warn`. `flavour` names
// the build after the pid ("" or " (Windows DLL)").
void print_verbose(const config::Options& o, const arena::StartReport& report, int device, long pid,
                   const char* flavour, void (*warn)(const char* line)) noexcept;

// Whether fresh memory of `backend` reads zero, MNEMOSYNE_ZEROED applied (as
// the arena decides), with the evidence in `why`.
bool fresh_memory_reads_zero(const config::Options& o, BackendId backend, char* why,
                             std::size_t len) noexcept;

// What a start-up needs of its platform.
struct StartPlatform {
  arena::HostHeap host;  // the arena's host heap
  const char* system;    // what serves the process without a heap: "the system allocator"
  long pid;
  const char* flavour;  // for print_verbose
  void (*warn)(const char* line);
  // Records in the process's environment, for the processes it starts, the
  // key of the warning it printed (MNEMOSYNE_WARNED).
  void (*mark_warned)(const char* key);
};

// From read options to a running arena: the driver path and device, the
// arena, one line when the requested backend is unavailable (once per
// process tree: a process whose MNEMOSYNE_WARNED holds that line's key
// stays quiet, and one that prints it sets the key for its children), the
// verbose lines. False when not even host memory could start a heap (one line says
// so): the platform's allocator then serves the process.
bool start_heap(const config::Options& o, const StartPlatform& platform) noexcept;

// Why the requested backend is not active; "" when it is.
const char* backend_unavailable_reason() noexcept;

}  // namespace mnemosyne
