// platform::System on Windows: LoadLibrary, VirtualAlloc, the process environment.
#include <windows.h>

#include <cstdio>
#include <cstdlib>

#include "platform/platform.hpp"

namespace mnemosyne::platform {

void* System::open_library(const char* path, char* error, std::size_t len) noexcept {
  HMODULE h = LoadLibraryA(path);
  if (h == nullptr) {
    const DWORD code = GetLastError();
    char text[256] = {};
    const DWORD n = FormatMessageA(FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS,
                                   nullptr, code, 0, text, sizeof text, nullptr);
    for (DWORD i = n; i > 0 && (text[i - 1] == '\n' || text[i - 1] == '\r' || text[i - 1] == '.');
         --i) {
      text[i - 1] = '\0';
    }
    std::snprintf(error, len, "LoadLibrary failed: error %lu%s%s", static_cast<unsigned long>(code),
                  text[0] != '\0' ? ", " : "", text);
  }
  return reinterpret_cast<void*>(h);
}

void* System::find_symbol(void* library, const char* name) noexcept {
  return reinterpret_cast<void*>(GetProcAddress(static_cast<HMODULE>(library), name));
}

void* System::map_pages(std::size_t size, int* error) noexcept {
  void* p = VirtualAlloc(nullptr, size, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
  if (p == nullptr) *error = static_cast<int>(GetLastError());
  return p;
}

// VirtualFree releases a whole reservation only: `ptr` is always the base
// map_pages returned, and the size is the reservation's.
bool System::unmap_pages(void* ptr, std::size_t) noexcept {
  return VirtualFree(ptr, 0, MEM_RELEASE) != 0;
}

std::size_t System::page_size() noexcept {
  SYSTEM_INFO info;
  GetSystemInfo(&info);
  return info.dwPageSize;
}

// Windows has no set-uid programs: a process's environment is its caller's.
const char* System::secure_env(const char* name) noexcept {
  return std::getenv(name);
}

void System::pause(std::size_t spins) noexcept {
  if (spins < 64) {
    SwitchToThread();
  } else {
    Sleep(1);
  }
}

void System::sleep_ns(std::uint64_t ns) noexcept {
  Sleep(static_cast<DWORD>((ns + 999999) / 1000000));
}

// MEM_RESET: the pages leave the working set without being written to the
// page file; they stay committed.
bool System::discard_pages(void* ptr, std::size_t size) noexcept {
  return VirtualAlloc(ptr, size, MEM_RESET, PAGE_READWRITE) != nullptr;
}

// ntdll's RtlDllShutdownInProgress: true once ExitProcess has stopped every
// other thread and is detaching DLLs (wine implements it too). Looked up
// once; no function-local static (its guard would be a lock).
bool System::process_exiting() noexcept {
  using Fn = BOOLEAN(NTAPI*)();
  static std::atomic<Fn> fn{nullptr};
  static std::atomic<bool> looked{false};
  if (!looked.load(std::memory_order_acquire)) {
    HMODULE ntdll = GetModuleHandleA("ntdll.dll");
    FARPROC p = ntdll != nullptr ? GetProcAddress(ntdll, "RtlDllShutdownInProgress") : nullptr;
    fn.store(reinterpret_cast<Fn>(reinterpret_cast<void*>(p)), std::memory_order_relaxed);
    looked.store(true, std::memory_order_release);
  }
  const Fn f = fn.load(std::memory_order_relaxed);
  return f != nullptr && f() != 0;
}

// WaitOnAddress (Windows 8 and later; libsynchronization).
void System::wait_while_equal(std::atomic<std::uint32_t>* word, std::uint32_t seen,
                              std::uint64_t timeout_ns) noexcept {
  const DWORD ms =
      timeout_ns == kNoTimeout ? INFINITE : static_cast<DWORD>((timeout_ns + 999999) / 1000000);
  WaitOnAddress(reinterpret_cast<volatile VOID*>(word), &seen, sizeof seen, ms);
}

void System::wake_all(std::atomic<std::uint32_t>* word) noexcept {
  WakeByAddressAll(reinterpret_cast<PVOID>(word));
}

namespace {
struct ThreadStart {
  void (*fn)(void*);
  void* arg;
};
DWORD WINAPI thread_main(LPVOID raw) {
  const ThreadStart start = *static_cast<ThreadStart*>(raw);
  VirtualFree(raw, 0, MEM_RELEASE);
  start.fn(start.arg);
  return 0;
}
}  // namespace

std::size_t System::cpu_count() noexcept {
  const DWORD n = GetActiveProcessorCount(ALL_PROCESSOR_GROUPS);
  return n > 0 ? static_cast<std::size_t>(n) : 1;
}

// Windows has no signals to block.
bool System::start_thread(void (*fn)(void*), void* arg) noexcept {
  int err = 0;
  auto* start = static_cast<ThreadStart*>(map_pages(sizeof(ThreadStart), &err));
  if (start == nullptr) return false;
  *start = ThreadStart{fn, arg};
  HANDLE thread = CreateThread(nullptr, 256 * 1024, &thread_main, start,
                               STACK_SIZE_PARAM_IS_A_RESERVATION, nullptr);
  if (thread == nullptr) {
    VirtualFree(start, 0, MEM_RELEASE);
    return false;
  }
  CloseHandle(thread);
  return true;
}

std::uint64_t System::monotonic_ns() noexcept {
  static LARGE_INTEGER frequency = [] {
    LARGE_INTEGER f;
    QueryPerformanceFrequency(&f);
    return f;
  }();
  LARGE_INTEGER now;
  QueryPerformanceCounter(&now);
  const auto ticks = static_cast<std::uint64_t>(now.QuadPart);
  const auto hz = static_cast<std::uint64_t>(frequency.QuadPart);
  return ticks / hz * 1000000000u + ticks % hz * 1000000000u / hz;
}

long System::process_id() noexcept {
  return static_cast<long>(GetCurrentProcessId());
}

long System::thread_id() noexcept {
  return static_cast<long>(GetCurrentThreadId());
}

std::uint64_t System::thread_cpu_ns(long tid) noexcept {
  HANDLE thread = OpenThread(THREAD_QUERY_LIMITED_INFORMATION, FALSE, static_cast<DWORD>(tid));
  if (thread == nullptr) return 0;
  FILETIME created, exited, kernel, user;
  const BOOL ok = GetThreadTimes(thread, &created, &exited, &kernel, &user);
  CloseHandle(thread);
  if (!ok) return 0;
  const auto ticks = [](const FILETIME& t) {
    return (static_cast<std::uint64_t>(t.dwHighDateTime) << 32) | t.dwLowDateTime;
  };
  return (ticks(kernel) + ticks(user)) * 100;  // 100 ns units
}

// The Windows driver publishes no such setting: unknown.
int System::nvidia_zeroes_pinned_memory(char* source, std::size_t len) noexcept {
  std::snprintf(source, len, "no setting published on Windows");
  return -1;
}

// No fork on Windows: nothing to exclude.
bool System::exclude_from_fork(void*, std::size_t, int*) noexcept {
  return true;
}

// No signals on Windows: nothing to block.
void System::block_async_signals(SignalMask*) noexcept {}
void System::restore_signals(const SignalMask&) noexcept {}

}  // namespace mnemosyne::platform
