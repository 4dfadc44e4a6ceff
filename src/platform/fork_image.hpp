// The operating system's part of the fork copy (src/arena/fork/): an
// image file whose offsets are addresses, written and read at them, mapped
// privately in the child; the residency of pages; the file-size limit the
// image is subject to; every signal blocked while the child maps it. Linux
// only (Windows has no fork). Nothing here allocates, and every function is
// async-signal-safe: the child's mapping runs in a fault handler.
#pragma once

#include <cstddef>
#include <cstdint>

#include "platform/platform.hpp"

namespace mnemosyne::platform::fork_image {

// "No limit" for file_size_limit.
inline constexpr std::uint64_t kUnlimited = ~std::uint64_t{0};

// A new image file of `size` bytes (sparse: only what is written takes
// memory), closed on exec; -1 when the OS refused.
int create(const char* name, std::uint64_t size) noexcept;
void close(int fd) noexcept;

// Writes [src, src + n) at `offset`; the bytes written, or -1 with the OS
// error in *err (EFAULT: the kernel could not read src). EINTR is retried.
long write_at(int fd, const void* src, std::size_t n, std::uint64_t offset, int* err) noexcept;
// Reads at most n bytes at `offset` into dst; the bytes read, or -1.
long read_at(int fd, void* dst, std::size_t n, std::uint64_t offset) noexcept;
// A read-only view of [offset, offset + size) of the file, shared (its own
// pages: nothing copied), which a child does not inherit; null when the OS
// refused. A page the file does not hold must not be read through it: on
// tmpfs that read adds a page of zeros to the file (read_at does not).
const unsigned char* map_view(int fd, std::size_t size, std::uint64_t offset) noexcept;
void unmap_view(const unsigned char* view, std::size_t size) noexcept;

// Maps [offset, offset + size) of the file at `at`, replacing what is there,
// private and copy-on-write, read-write. False when the OS refused.
bool map_at(int fd, void* at, std::size_t size, std::uint64_t offset) noexcept;
// Replaces [at, at + size) with fresh private memory that reads zero,
// read-write. False when the OS refused (what was there stays).
bool map_zero_at(void* at, std::size_t size) noexcept;
// Replaces [at, at + size) with an inaccessible reservation (a touch faults).
void reserve_inaccessible(void* at, std::size_t size) noexcept;

// Whether each page of [at, at + size) is resident (bit 0 of each byte of
// vec, one byte a page); false when it cannot be told.
bool resident_pages(void* at, std::size_t size, unsigned char* vec) noexcept;

// The file-size limit (RLIMIT_FSIZE), soft and hard; kUnlimited for none.
// False when it cannot be read.
bool file_size_limit(std::uint64_t* soft, std::uint64_t* hard) noexcept;
// Sets the soft limit (the hard one is kept); false when refused.
bool set_file_size_soft_limit(std::uint64_t soft, std::uint64_t hard) noexcept;

// Every signal blocked on the calling thread, and the mask put back.
void block_all_signals(Os::SignalMask* saved) noexcept;

}  // namespace mnemosyne::platform::fork_image
