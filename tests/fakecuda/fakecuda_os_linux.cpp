// Fake CUDA driver, OS layer for Linux (see fakecuda_os.h).
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fakecuda_os.h"

namespace fakecuda::os {

std::size_t page_size() noexcept {
  return std::size_t(sysconf(_SC_PAGESIZE));
}

void* map_pages(std::size_t len) noexcept {
  void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return m == MAP_FAILED ? nullptr : m;
}

void* map_shared(std::size_t len) noexcept {
  void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  return m == MAP_FAILED ? nullptr : m;
}

// Maps more than needed and trims both ends.
void* map_aligned(std::size_t len, std::size_t align, std::size_t avoid) noexcept {
  const std::size_t reserve = len + 2 * align;
  void* m = mmap(nullptr, reserve, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<std::uintptr_t>(m);
  std::uintptr_t a = (base + align - 1) / align * align;
  if (a % avoid == 0) a += align;
  if (a > base) munmap(m, a - base);
  const std::uintptr_t end = base + reserve;
  if (a + len < end) munmap(reinterpret_cast<void*>(a + len), end - (a + len));
  return reinterpret_cast<void*>(a);
}

void unmap(void* p, std::size_t len) noexcept {
  munmap(p, len);
}

bool dont_fork(void* p, std::size_t len) noexcept {
  return madvise(p, len, MADV_DONTFORK) == 0;
}

void* vmm_create(std::size_t len, int fill) noexcept {
  void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  if (madvise(m, len, MADV_DONTFORK) != 0) {
    munmap(m, len);
    return nullptr;
  }
  if (fill >= 0) memset(m, fill, len);
  return m;
}

void vmm_close(void* memory, std::size_t len) noexcept {
  munmap(memory, len);
}

void* vmm_reserve(std::size_t len, std::size_t align) noexcept {
  const std::size_t span = len + align;
  void* m = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<std::uintptr_t>(m);
  const std::uintptr_t a = (base + align - 1) / align * align;
  if (a > base) munmap(m, a - base);
  if (a + len < base + span) munmap(reinterpret_cast<void*>(a + len), base + span - (a + len));
  return reinterpret_cast<void*>(a);
}

// mremap with an old size of 0 maps the same pages of a shared mapping
// again. The copy inherits the original's MADV_DONTFORK, which the
// driver's mappings lack: cleared.
bool vmm_map(void* at, std::size_t len, void* memory) noexcept {
  void* m = mremap(memory, 0, len, MREMAP_MAYMOVE | MREMAP_FIXED, at);
  if (m == MAP_FAILED) return false;
  if (madvise(m, len, MADV_DOFORK) != 0 || mprotect(m, len, PROT_NONE) != 0) {
    vmm_unmap(m, len);
    return false;
  }
  return true;
}

bool vmm_protect(void* at, std::size_t len, bool read, bool write) noexcept {
  return mprotect(at, len, (read ? PROT_READ : 0) | (write ? PROT_WRITE : 0)) == 0;
}

bool vmm_unmap(void* at, std::size_t len) noexcept {
  return mmap(at, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) !=
         MAP_FAILED;
}

LogHandle log_open(const char* path) noexcept {
  const int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  return fd < 0 ? kNoLog : LogHandle{fd};
}

void log_close(LogHandle h) noexcept {
  close(int(h));
}

void log_write(LogHandle h, const char* buf, std::size_t len) noexcept {
  ssize_t w = write(int(h), buf, len);  // O_APPEND: one write is one whole line
  (void)w;
}

void write_stderr(const char* buf, std::size_t len) noexcept {
  ssize_t w = write(2, buf, len);
  (void)w;
}

int pid() noexcept {
  return int(getpid());
}

void sleep_us(std::int64_t us) noexcept {
  timespec ts{time_t(us / 1000000), long(us % 1000000) * 1000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

std::uint64_t monotonic_ns() noexcept {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return std::uint64_t(now.tv_sec) * 1000000000u + std::uint64_t(now.tv_nsec);
}

bool start_thread(void* (*fn)(void*)) noexcept {
  pthread_t t;
  if (pthread_create(&t, nullptr, fn, nullptr) != 0) return false;
  pthread_detach(t);
  return true;
}

void at_fork(void (*prepare)(), void (*parent)(), void (*child)()) noexcept {
  pthread_atfork(prepare, parent, child);
}

}  // namespace fakecuda::os
