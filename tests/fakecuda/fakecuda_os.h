// What the fake CUDA driver needs from the operating system: memory, the log
// file, the process id, sleeping, its internal thread and fork handling.
// fakecuda_os_linux.cpp and fakecuda_os_windows.cpp implement it; everything
// else is shared. None of these functions calls malloc.
#pragma once

#include <pthread.h>

#include <cstddef>
#include <cstdint>

// A statically initialised error-checking mutex (winpthreads lacks the _NP name).
#if defined(_WIN32)
#define FAKECUDA_ERRORCHECK_MUTEX_INITIALIZER PTHREAD_ERRORCHECK_MUTEX_INITIALIZER
#else
#define FAKECUDA_ERRORCHECK_MUTEX_INITIALIZER PTHREAD_ERRORCHECK_MUTEX_INITIALIZER_NP
#endif

namespace fakecuda::os {

// The page size: the granularity of the blocks' mapped lengths.
std::size_t page_size() noexcept;

// len (page rounded) bytes of zeroed read/write memory, or nullptr.
void* map_pages(std::size_t len) noexcept;
// Like map_pages, but a shared mapping (MAP_SHARED | MAP_ANONYMOUS): a
// forked child inherits it and shares its pages with the parent, as the
// nvidia module's pinned mappings (VM_SHARED, not VM_DONTCOPY). Windows:
// map_pages.
void* map_shared(std::size_t len) noexcept;
// Like map_pages, at an address that is a multiple of align but not of avoid
// (a multiple of align); address space only where the OS allows (Linux
// MAP_NORESERVE).
void* map_aligned(std::size_t len, std::size_t align, std::size_t avoid) noexcept;
// Releases memory of map_pages / map_aligned; len as given to them.
void unmap(void* p, std::size_t len) noexcept;
// Keeps a forked child from inheriting [p, p + len) (MADV_DONTFORK). Windows
// has no fork: always true there.
bool dont_fork(void* p, std::size_t len) noexcept;

// The virtual-memory API's pieces (Linux; on Windows each fails, and the
// double's API refuses host memory). A physical allocation: shared
// anonymous memory of len bytes (the driver's own view of it, not
// inherited by a child), every byte `fill` (-1: left zero); nullptr on
// failure. Not a file: the program's RLIMIT_FSIZE must not apply.
void* vmm_create(std::size_t len, int fill) noexcept;
void vmm_close(void* memory, std::size_t len) noexcept;
// Address space of len bytes aligned to align, inaccessible; nullptr on
// failure (release with unmap).
void* vmm_reserve(std::size_t len, std::size_t align) noexcept;
// Maps the allocation `memory` at `at` inside a reservation, shared (as
// nvidia's mappings are: a forked child inherits them unless marked
// MADV_DONTFORK) and inaccessible until vmm_protect.
bool vmm_map(void* at, std::size_t len, void* memory) noexcept;
// Opens a mapping to the CPU: read and write, read only, or nothing.
bool vmm_protect(void* at, std::size_t len, bool read, bool write) noexcept;
// Puts reserved, inaccessible address space back in place of a mapping.
bool vmm_unmap(void* at, std::size_t len) noexcept;

// The log: an append-only file that several processes may share.
using LogHandle = std::intptr_t;
inline constexpr LogHandle kNoLog = -1;
// Opens (creates) path for appending; kNoLog on failure. The handle is not
// inherited by child processes.
LogHandle log_open(const char* path) noexcept;
void log_close(LogHandle h) noexcept;
// Appends buf in one write, so lines of concurrent processes do not mix.
void log_write(LogHandle h, const char* buf, std::size_t len) noexcept;
void write_stderr(const char* buf, std::size_t len) noexcept;

int pid() noexcept;
void sleep_us(std::int64_t us) noexcept;
// A monotonic clock in nanoseconds (seeds the internal thread's sizes).
std::uint64_t monotonic_ns() noexcept;

// Starts fn on a detached thread; false if that failed. The library stays
// loaded for as long as the process lives, as the thread may outlive an unload
// (Linux: linked with -z nodelete; Windows: the module is pinned here).
bool start_thread(void* (*fn)(void*)) noexcept;

// Registers fork handlers (pthread_atfork). Windows has no fork: does nothing.
void at_fork(void (*prepare)(), void (*parent)(), void (*child)()) noexcept;

}  // namespace fakecuda::os
