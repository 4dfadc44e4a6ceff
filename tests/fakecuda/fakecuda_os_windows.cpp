// Fake CUDA driver, OS layer for Windows (see fakecuda_os.h), and the
// residency functions of fakecuda_internal.h, which fakecuda_residency.cpp
// implements on Linux only (it needs mincore, mremap and SIGSEGV).
#include <string.h>
#include <windows.h>

#include <atomic>

#include "fakecuda_internal.h"
#include "fakecuda_os.h"

namespace fakecuda::os {

std::size_t page_size() noexcept {
  SYSTEM_INFO si;
  GetSystemInfo(&si);
  return std::size_t(si.dwPageSize);
}

void* map_pages(std::size_t len) noexcept {
  return VirtualAlloc(nullptr, len, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
}

// Windows cannot release part of a reservation: reserve more than needed to
// find an aligned address, release it all, and map exactly there. Another
// thread may take the address in between; then try again.
void* map_aligned(std::size_t len, std::size_t align, std::size_t avoid) noexcept {
  if (len > SIZE_MAX - 2 * align) return nullptr;
  for (int attempt = 0; attempt < 64; ++attempt) {
    void* m = VirtualAlloc(nullptr, len + 2 * align, MEM_RESERVE, PAGE_NOACCESS);
    if (m == nullptr) return nullptr;
    const auto base = reinterpret_cast<std::uintptr_t>(m);
    std::uintptr_t a = (base + align - 1) / align * align;
    if (a % avoid == 0) a += align;
    VirtualFree(m, 0, MEM_RELEASE);
    void* p =
        VirtualAlloc(reinterpret_cast<void*>(a), len, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
    if (p != nullptr) return p;
    if (GetLastError() != ERROR_INVALID_ADDRESS) return nullptr;  // not a race: out of memory
  }
  return nullptr;
}

void unmap(void* p, std::size_t) noexcept {
  VirtualFree(p, 0, MEM_RELEASE);
}

void* map_shared(std::size_t len) noexcept {
  return map_pages(len);
}

bool dont_fork(void*, std::size_t) noexcept {
  return true;
}

namespace {

// Serialises the log writes of all processes of the session. Windows appends
// a FILE_APPEND_DATA write atomically, but wine finds the end of the file and
// writes there in two steps, so concurrent lines overwrite each other.
std::atomic<HANDLE> g_log_mutex{nullptr};

}  // namespace

// FILE_APPEND_DATA without FILE_WRITE_DATA: every write goes to the end of the
// file, as with O_APPEND. Handles are not inherited by default.
LogHandle log_open(const char* path) noexcept {
  HANDLE h =
      CreateFileA(path, FILE_APPEND_DATA, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE,
                  nullptr, OPEN_ALWAYS, FILE_ATTRIBUTE_NORMAL, nullptr);
  if (h == INVALID_HANDLE_VALUE) return kNoLog;
  if (g_log_mutex.load() == nullptr) {
    HANDLE m = CreateMutexW(nullptr, FALSE, L"Local\\mnemosyne-fakecuda-log");
    HANDLE expected = nullptr;
    if (m != nullptr && !g_log_mutex.compare_exchange_strong(expected, m)) CloseHandle(m);
  }
  return reinterpret_cast<LogHandle>(h);
}

void log_close(LogHandle h) noexcept {
  CloseHandle(reinterpret_cast<HANDLE>(h));
}

void log_write(LogHandle h, const char* buf, std::size_t len) noexcept {
  HANDLE m = g_log_mutex.load();
  // WAIT_ABANDONED (a writer died holding it) grants the mutex too.
  const DWORD w = m != nullptr ? WaitForSingleObject(m, INFINITE) : WAIT_FAILED;
  DWORD written = 0;
  WriteFile(reinterpret_cast<HANDLE>(h), buf, DWORD(len), &written, nullptr);
  if (w == WAIT_OBJECT_0 || w == WAIT_ABANDONED) ReleaseMutex(m);
}

void write_stderr(const char* buf, std::size_t len) noexcept {
  DWORD written = 0;
  WriteFile(GetStdHandle(STD_ERROR_HANDLE), buf, DWORD(len), &written, nullptr);
}

int pid() noexcept {
  return int(GetCurrentProcessId());
}

void sleep_us(std::int64_t us) noexcept {
  if (us > 0) Sleep(DWORD((us + 999) / 1000));
}

std::uint64_t monotonic_ns() noexcept {
  LARGE_INTEGER f, c;
  QueryPerformanceFrequency(&f);
  QueryPerformanceCounter(&c);
  const auto freq = std::uint64_t(f.QuadPart);
  const auto count = std::uint64_t(c.QuadPart);
  return count / freq * 1000000000u + count % freq * 1000000000u / freq;
}

namespace {

DWORD WINAPI thread_main(void* fn) {
  reinterpret_cast<void* (*)(void*)>(fn)(nullptr);
  return 0;
}

}  // namespace

bool start_thread(void* (*fn)(void*)) noexcept {
  // Pinned: FreeLibrary never unmaps the code the thread runs (-z nodelete).
  HMODULE self = nullptr;
  if (!GetModuleHandleExW(GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS | GET_MODULE_HANDLE_EX_FLAG_PIN,
                          reinterpret_cast<LPCWSTR>(&thread_main), &self))
    return false;
  HANDLE t = CreateThread(nullptr, 0, thread_main, reinterpret_cast<void*>(fn), 0, nullptr);
  if (t == nullptr) return false;
  CloseHandle(t);
  return true;
}

void at_fork(void (*)(), void (*)(), void (*)()) noexcept {}

// The virtual-memory API's host memory is not modelled on Windows.
void* vmm_create(std::size_t, int) noexcept {
  return nullptr;
}
void vmm_close(void*, std::size_t) noexcept {}
void* vmm_reserve(std::size_t, std::size_t) noexcept {
  return nullptr;
}
bool vmm_map(void*, std::size_t, void*) noexcept {
  return false;
}
bool vmm_protect(void*, std::size_t, bool, bool) noexcept {
  return false;
}
bool vmm_unmap(void*, std::size_t) noexcept {
  return false;
}

}  // namespace fakecuda::os

namespace fakecuda {

// Residency is not simulated on Windows: every page is on the CPU.

long migrate_to_device(std::uintptr_t, std::size_t, std::uintptr_t, std::size_t) noexcept {
  return -1;
}

bool on_device(std::uintptr_t) noexcept {
  return false;
}

void read_where_it_lives(void* dst, std::uintptr_t src, std::size_t n) noexcept {
  memcpy(dst, reinterpret_cast<const void*>(src), n);
}

void set_where_it_lives(std::uintptr_t dst, std::size_t n, unsigned char value, bool) noexcept {
  memset(reinterpret_cast<void*>(dst), value, n);  // no residency: every page is the CPU's
}
void forget_device_range(std::uintptr_t) noexcept {}

}  // namespace fakecuda
