// The operating system's part of a child that pulls its heap (issue 47,
// src/arena/fork/pull.cpp): userfaultfd, with which the parent serves the
// child's first touch of each page, whether the child touches it or the
// kernel does for it (execve's argv, a write() of a heap buffer). A fault
// handler in the child could serve only its own touches: a kernel's gets
// EFAULT. userfaultfd serves the kernel's only where the user may
// (CAP_SYS_PTRACE, vm.unprivileged_userfaultfd = 1, or /dev/userfaultfd
// readable and writable); elsewhere a fork copies the heap as before.
//
// The child registers its heap, mapped from the fork's image, and passes
// the descriptor to the parent over a socket; the parent's
// UFFDIO_COPY then fills the child's pages from its own (the descriptor
// works on the child's memory from any process). Linux only; nothing here
// allocates, and what the child calls is async-signal-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mnemosyne::platform::page_pull {

// Whether this process may create a userfaultfd that serves the kernel's
// faults too (its child, with the same credentials, then may).
bool available() noexcept;

// A new userfaultfd (close-on-exec, non-blocking), its API handshake done;
// -1 when refused.
int open_faults() noexcept;
// The child's pages [at, at + size) now fault to the descriptor where they
// are missing from their mapping's file.
bool watch(int faults, void* at, std::size_t size) noexcept;
// The parent's side: no more faults there (those waiting retry, and find
// what the file now holds). False when refused.
bool unwatch(int faults, void* at, std::size_t size) noexcept;

// Descriptor passing over a Unix socket, with one byte of message.
bool send_with_fd(int socket, char byte, int fd) noexcept;
// The byte, and the descriptor in *fd when one came (else -1). False on end
// of file or an error.
bool receive_with_fd(int socket, char* byte, int* fd) noexcept;
bool send_byte(int socket, char byte) noexcept;
// Waits for a byte; false on end of file or error.
bool receive_byte(int socket, char* byte) noexcept;
// A pair of connected Unix sockets, close-on-exec; false when refused.
bool socket_pair(int out[2]) noexcept;

// What one wait of the parent's found.
enum class Event {
  fault,    // *address: the page the child needs
  message,  // the socket has a byte, or ended (the child exec'd or exited,
            // or closed it: see alive())
  timeout,
  error,
};
// Waits at most timeout_ms for a fault on `faults` or input on `socket`
// (-1: the socket is not watched).
Event wait(int faults, int socket, int timeout_ms, std::uintptr_t* address) noexcept;

// Fills the child's pages [at, at + size) with the parent's at the same
// addresses. Returns the bytes filled (pages the child has already are
// skipped, those after them not filled), 0 when the child has none to
// fill there, -1 when the child's memory is gone (it exec'd or exited).
long fill(int faults, std::uintptr_t at, std::size_t size) noexcept;

// Maps the zero page at the child's pages [at, at + size) that it has not
// got yet (free space: a later write of the child's copies it, and adds
// nothing to the file its heap maps).
void zero(int faults, std::uintptr_t at, std::size_t size) noexcept;

void close(int fd) noexcept;

// Which file a descriptor is (its device and inode), 0 when it is not open;
// a program may close ours and reuse the number (Python's close_fds).
std::uint64_t file_id(int fd) noexcept;
// Whether [at, at + size) is watched by some userfaultfd now (another one
// cannot watch it then); false when it cannot be told.
bool watched(void* at, std::size_t size) noexcept;

// The threads of this process now (/proc/self/status); -1 when unknown.
long threads_in_process() noexcept;
// mnemosyne's own threads (Os::start_thread's; they never end).
std::size_t own_threads() noexcept;

}  // namespace mnemosyne::platform::page_pull
