// userfaultfd for a child that pulls its heap: see page_pull.hpp. System
// calls only (no libc wrapper allocates here; userfaultfd has none).
#include "platform/page_pull.hpp"

#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

// /dev/userfaultfd's one request (Linux 6.1); older headers lack it.
#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)
#endif

namespace mnemosyne::platform::page_pull {

namespace {

constexpr int kFlags = O_CLOEXEC | O_NONBLOCK;  // poll() needs O_NONBLOCK

// Without UFFD_USER_MODE_ONLY: the kernel's own touches must fault to us
// too, which the user may not be allowed.
int create() noexcept {
  const long fd = syscall(SYS_userfaultfd, kFlags);
  if (fd >= 0) return static_cast<int>(fd);
  if (errno == ENOSYS) return -1;
  const int dev = ::open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
  if (dev < 0) return -1;
  const int made = ::ioctl(dev, USERFAULTFD_IOC_NEW, kFlags);
  ::close(dev);
  return made;
}

}  // namespace

bool available() noexcept {
  const int fd = create();
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

int open_faults() noexcept {
  const int fd = create();
  if (fd < 0) return -1;
  uffdio_api api{};
  api.api = UFFD_API;
  if (::ioctl(fd, UFFDIO_API, &api) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool watch(int faults, void* at, std::size_t size) noexcept {
  uffdio_register r{};
  r.range.start = reinterpret_cast<std::uintptr_t>(at);
  r.range.len = size;
  r.mode = UFFDIO_REGISTER_MODE_MISSING;
  return ::ioctl(faults, UFFDIO_REGISTER, &r) == 0;
}

bool unwatch(int faults, void* at, std::size_t size) noexcept {
  uffdio_range r{};
  r.start = reinterpret_cast<std::uintptr_t>(at);
  r.len = size;
  return ::ioctl(faults, UFFDIO_UNREGISTER, &r) == 0;
}

namespace {

// One byte of message with room for one descriptor beside it.
struct FdMessage {
  explicit FdMessage(char* byte) noexcept : io{byte, 1} {
    m.msg_iov = &io;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof control;
  }
  FdMessage(const FdMessage&) = delete;
  FdMessage& operator=(const FdMessage&) = delete;

  iovec io;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
};

}  // namespace

bool send_with_fd(int socket, char byte, int fd) noexcept {
  FdMessage msg(&byte);
  cmsghdr* h = CMSG_FIRSTHDR(&msg.m);
  h->cmsg_level = SOL_SOCKET;
  h->cmsg_type = SCM_RIGHTS;
  h->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(h), &fd, sizeof fd);
  long n;
  do n = ::sendmsg(socket, &msg.m, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  return n == 1;
}

bool receive_with_fd(int socket, char* byte, int* fd) noexcept {
  *fd = -1;
  FdMessage msg(byte);
  long n;
  do n = ::recvmsg(socket, &msg.m, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n != 1) return false;
  for (cmsghdr* h = CMSG_FIRSTHDR(&msg.m); h != nullptr; h = CMSG_NXTHDR(&msg.m, h)) {
    if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS) {
      std::memcpy(fd, CMSG_DATA(h), sizeof *fd);
    }
  }
  return true;
}

bool send_byte(int socket, char byte) noexcept {
  long n;
  do n = ::send(socket, &byte, 1, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  return n == 1;
}

bool receive_byte(int socket, char* byte) noexcept {
  long n;
  do n = ::recv(socket, byte, 1, 0);
  while (n < 0 && errno == EINTR);
  return n == 1;
}

bool socket_pair(int out[2]) noexcept {
  return ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, out) == 0;
}

Event wait(int faults, int socket, int timeout_ms, std::uintptr_t* address) noexcept {
  pollfd p[2] = {{faults, POLLIN, 0}, {socket, POLLIN, 0}};
  const int n = ::poll(p, socket >= 0 ? 2 : 1, timeout_ms);
  if (n == 0) return Event::timeout;
  if (n < 0) return errno == EINTR ? Event::timeout : Event::error;
  if ((p[0].revents & POLLIN) != 0) {
    uffd_msg msg{};
    const long got = ::read(faults, &msg, sizeof msg);
    if (got == sizeof msg && msg.event == UFFD_EVENT_PAGEFAULT) {
      *address = static_cast<std::uintptr_t>(msg.arg.pagefault.address);
      return Event::fault;
    }
    // Woken and gone (another fill served it), or not a fault: go on.
    if (got < 0 && errno != EAGAIN && errno != EINTR) return Event::error;
  }
  if ((p[0].revents & (POLLERR | POLLNVAL)) != 0) return Event::error;
  if (socket >= 0 && (p[1].revents & (POLLIN | POLLHUP | POLLERR)) != 0) return Event::message;
  return Event::timeout;
}

long fill(int faults, std::uintptr_t at, std::size_t size) noexcept {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  long filled = 0;
  for (std::size_t done = 0; done < size;) {
    uffdio_copy c{};
    c.dst = at + done;
    c.src = at + done;
    c.len = size - done;
    if (::ioctl(faults, UFFDIO_COPY, &c) == 0) return filled + static_cast<long>(size - done);
    const int err = errno;
    if (c.copy > 0) {  // part of it, up to a page the child has
      filled += c.copy;
      done += static_cast<std::size_t>(c.copy);
      continue;
    }
    if (err == EAGAIN || err == EINTR) continue;  // the child's mappings changing
    if (err == EEXIST) {
      done += page;  // the child has this page already
      continue;
    }
    // ESRCH: its memory is gone; anything else: nothing more can be filled.
    return err == ESRCH ? -1 : filled;
  }
  return filled;
}

void zero(int faults, std::uintptr_t at, std::size_t size) noexcept {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  for (std::size_t done = 0; done < size;) {
    uffdio_zeropage z{};
    z.range.start = at + done;
    z.range.len = size - done;
    if (::ioctl(faults, UFFDIO_ZEROPAGE, &z) == 0) return;
    const int err = errno;
    if (z.zeropage > 0) {
      done += static_cast<std::size_t>(z.zeropage);
    } else if (err == EEXIST) {
      done += page;  // the child has it
    } else if (err != EAGAIN && err != EINTR) {
      return;
    }
  }
}

void close(int fd) noexcept {
  if (fd >= 0) ::close(fd);
}

std::uint64_t file_id(int fd) noexcept {
  // The system call, not glibc's fstat: that is a symbol of glibc 2.33
  // (before, __fxstat), which a library built with glibc_compat to load on
  // glibc 2.31 may not need. The kernel's struct stat is glibc's on 64-bit
  // Linux.
  struct stat st {};
  if (fd < 0 || ::syscall(SYS_fstat, fd, &st) != 0) return 0;
  return (static_cast<std::uint64_t>(st.st_dev) << 40) ^ static_cast<std::uint64_t>(st.st_ino);
}

bool watched(void* at, std::size_t size) noexcept {
  const int probe = open_faults();
  if (probe < 0) return false;
  const bool free_to_watch = watch(probe, at, size);
  if (free_to_watch) unwatch(probe, at, size);
  const bool busy = !free_to_watch && errno == EBUSY;
  ::close(probe);
  return busy;
}

long threads_in_process() noexcept {
  const int fd = ::open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char text[8192];
  std::size_t got = 0;
  long n;
  while (got < sizeof text - 1 && (n = ::read(fd, text + got, sizeof text - 1 - got)) > 0) {
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  text[got] = '\0';
  const char* line = std::strstr(text, "\nThreads:");
  if (line == nullptr) return -1;
  line += std::strlen("\nThreads:");
  while (*line == ' ' || *line == '\t') ++line;
  long count = 0;
  bool any = false;
  for (; *line >= '0' && *line <= '9'; ++line, any = true) count = count * 10 + (*line - '0');
  return any ? count : -1;
}

}  // namespace mnemosyne::platform::page_pull
