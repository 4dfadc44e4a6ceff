// platform::fork_image on Linux: memfd_create, pwrite/pread, mmap MAP_FIXED,
// mincore, RLIMIT_FSIZE, pthread_sigmask.
#include "platform/fork_image.hpp"

#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

namespace mnemosyne::platform::fork_image {

int create(const char* name, std::uint64_t size) noexcept {
  const int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void close(int fd) noexcept {
  ::close(fd);
}

long write_at(int fd, const void* src, std::size_t n, std::uint64_t offset, int* err) noexcept {
  for (;;) {
    const ssize_t done = pwrite(fd, src, n, static_cast<off_t>(offset));
    if (done >= 0) return done;
    if (errno != EINTR) {
      *err = errno;
      return -1;
    }
  }
}

long read_at(int fd, void* dst, std::size_t n, std::uint64_t offset) noexcept {
  for (;;) {
    const ssize_t done = pread(fd, dst, n, static_cast<off_t>(offset));
    if (done >= 0 || errno != EINTR) return done;
  }
}

const unsigned char* map_view(int fd, std::size_t size, std::uint64_t offset) noexcept {
  void* view =
      mmap(nullptr, size, PROT_READ, MAP_SHARED | MAP_NORESERVE, fd, static_cast<off_t>(offset));
  if (view == MAP_FAILED) return nullptr;
  madvise(view, size, MADV_DONTFORK);  // refused: a child inherits it, read-only, unused
  return static_cast<const unsigned char*>(view);
}

void unmap_view(const unsigned char* view, std::size_t size) noexcept {
  munmap(const_cast<unsigned char*>(view), size);
}

bool map_at(int fd, void* at, std::size_t size, std::uint64_t offset) noexcept {
  return mmap(at, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE, fd,
              static_cast<off_t>(offset)) != MAP_FAILED;
}

bool map_zero_at(void* at, std::size_t size) noexcept {
  return mmap(at, size, PROT_READ | PROT_WRITE,
              MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) != MAP_FAILED;
}

void reserve_inaccessible(void* at, std::size_t size) noexcept {
  mmap(at, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
}

bool resident_pages(void* at, std::size_t size, unsigned char* vec) noexcept {
  return mincore(at, size, vec) == 0;
}

bool file_size_limit(std::uint64_t* soft, std::uint64_t* hard) noexcept {
  struct rlimit lim {};
  if (getrlimit(RLIMIT_FSIZE, &lim) != 0) return false;
  *soft = lim.rlim_cur == RLIM_INFINITY ? kUnlimited : lim.rlim_cur;
  *hard = lim.rlim_max == RLIM_INFINITY ? kUnlimited : lim.rlim_max;
  return true;
}

bool set_file_size_soft_limit(std::uint64_t soft, std::uint64_t hard) noexcept {
  struct rlimit lim {};
  lim.rlim_cur = soft == kUnlimited ? RLIM_INFINITY : soft;
  lim.rlim_max = hard == kUnlimited ? RLIM_INFINITY : hard;
  return setrlimit(RLIMIT_FSIZE, &lim) == 0;
}

void block_all_signals(Os::SignalMask* saved) noexcept {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, saved);
}

}  // namespace mnemosyne::platform::fork_image
