// The segment provider: whole 32 MiB aligned segments from one backend.
//
// Backends return page-aligned blocks (the CUDA driver: 2 MiB aligned, rarely
// 32 MiB aligned), and a misaligned mimalloc arena silently fails, so the
// provider asks for `size + align - page` bytes and uses the aligned interior.
// The slack stays reserved with the block (managed memory is only backed when
// touched; for pinned memory it is real RAM, under one alignment per segment).
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/backend_id.hpp"

namespace mnemosyne {

struct Segment {
  void* start = nullptr;     // aligned start, what the arena uses
  std::size_t size = 0;      // usable bytes from start, a multiple of 32 MiB
  void* raw = nullptr;       // what the backend returned
  std::size_t raw_size = 0;  // what was asked of the backend
  BackendId backend = BackendId::none;
  bool fresh_zero = false;  // the backend says fresh memory reads zero
  bool on_demand = false;   // reserved: backed only where committed (commit_range)
  // A growable block's room (acquire_growable): `size` may grow in place up
  // to it. 0 for every other segment.
  std::size_t capacity = 0;
};

// How a segment is acquired from a backend that commits on demand.
enum class Reserve : std::uint8_t {
  no,           // the backend's memory, backed whole
  if_possible,  // a reservation when the backend gives one, else as `no`
  only,         // a reservation or nothing (a room must never be backed whole)
};

// Acquires at least `size` bytes (rounded up to 32 MiB) aligned to `align`
// (a power of two, at least 32 MiB) from `backend`. A reservation
// (on_demand: nothing backed until commit_range commits it; fresh memory
// reads zero) as `reserve` says. False when the backend returned nothing or
// memory the ownership map cannot describe.
bool acquire_segment(BackendId backend, std::size_t size, std::size_t align, Reserve reserve,
                     Segment* out) noexcept;

// A block that may grow in place (a realloc's): `capacity` bytes of room
// (at least `size`; rounded up to 32 MiB), of which [start, start + size)
// is in use, `size` rounded up to the page size. With `reserve`, from a
// backend that commits on demand, a reservation: the room is address space
// and only the part in use is committed; never the room backed whole (a
// backend out of reservations, pinned's table full: false). Otherwise the
// backend's memory, which had better be backed only where touched (managed
// memory): the caller asks room only of such backends. False when the
// backend refused.
bool acquire_growable(BackendId backend, std::size_t size, std::size_t capacity, bool reserve,
                      Segment* out) noexcept;

// Commits [start, start + size) of a segment from outside mimalloc, which
// may call the driver: backs it where it is a reservation, and marks it in
// use. False when the backend refused (nothing committed then). Memory
// committed whole needs nothing: true.
bool commit_now(void* start, std::size_t size) noexcept;
// Marks [start, start + size) of a reservation unused, as mimalloc's
// decommit does: the backend gives it back in its own time. Memory
// committed whole: nothing.
void decommit_now(void* start, std::size_t size) noexcept;

// mimalloc's commit, decommit and reset (op: MNEMOSYNE_MI_COMMIT, _DECOMMIT,
// _RESET of mimalloc-live.h) of the page-aligned range [start, start +
// size): -1 when it is not memory of a segment, else 1 done or 0 failed.
// Called from inside mimalloc, so it never calls a driver (which calls
// malloc): a commit of reserved memory the backend has not backed yet fails
// and is left pending for this thread, for back_pending. Decommit marks
// the range unused. Memory not reserved is always backed and never goes to
// madvise (driver memory must not): nothing to do. In a forked child the
// child's copy is backed already.
int commit_range(void* start, std::size_t size, int op) noexcept;

// The range of a commit that failed.
struct BackedRange {
  void* start = nullptr;
  std::size_t size = 0;
};
enum class Backing : std::uint8_t { none, backed, refused };
// The commit that failed first on this thread since the last call (or
// forget_pending), from outside mimalloc: backs its range (a driver call)
// for mimalloc to commit when asked again, clears it, and returns it in
// *backed; the backend keeps it backed until end_backed, which the caller
// calls once it asked again. `none` when no commit failed, `refused` when
// the backend would not back it (cleared too; *backed empty then).
Backing back_pending(BackedRange* backed) noexcept;
// After mimalloc was asked again: what of *backed it did not commit is
// unused memory again, which the backend gives back in its time. Empties
// *backed; does nothing when it is empty.
void end_backed(BackedRange* backed) noexcept;
// Forgets this thread's failed commit without backing it: one left from an
// allocation that succeeded in the end (mimalloc tried another range after
// it) is memory no one is about to use.
void forget_pending() noexcept;

// Whether memory fresh from `backend` reads zero, as the backend says.
bool backend_fresh_zero(BackendId backend) noexcept;

// Whether memory `backend` gave is backed only where it is touched (managed
// memory, which lives where it is used: MemoryBackend's data_off_cpu), so
// that room nobody touches costs nothing.
bool backend_backs_where_touched(BackendId backend) noexcept;

// Whether `backend` gives reservations (memory backed, and given back,
// where mimalloc commits and decommits it).
bool backend_commits_on_demand(BackendId backend) noexcept;
// Whether the backend's decommit only marks memory unused and gives it back
// after a delay of its own (MemoryBackend's defers_release).
bool backend_defers_release(BackendId backend) noexcept;

// Sets `size` bytes at `ptr`, memory of `backend`, to zero the way that
// backend clears it (the device for managed memory, the CPU otherwise).
void clear_memory(BackendId backend, void* ptr, std::size_t size) noexcept;

// Tells `backend` that the free memory [ptr, ptr + size) of an arena holds
// nothing (managed memory: discard_managed); its contents are indeterminate
// afterwards. False when the backend cannot, or did not.
bool discard_memory(BackendId backend, void* ptr, std::size_t size) noexcept;

// Gives a segment back to its backend. In a forked child, segments that came
// from a CUDA backend are the child's own copies (see fork_copy.hpp) and are
// unmapped instead: the driver is never called there.
void release_segment(const Segment& segment) noexcept;

// Whether [start, start + size) of a segment may be read now: false for
// parts of a reservation its backend has not backed, where reading could
// fault (MemoryBackend's readable). mimalloc's walks ask first
// (mnemosyne_mi_set_readable_hook); the fork copy too.
bool segment_readable(const void* start, std::size_t size) noexcept;
// While held (by one or more walks over the heap), what segment_readable
// says is readable stays backed: the backends give nothing back meanwhile.
void hold_backing(bool on) noexcept;

// Called in a forked child: from now on release_segment never calls a driver.
void provider_enter_forked_child() noexcept;

inline constexpr std::size_t round_up(std::size_t n, std::size_t to) noexcept {
  return (n + to - 1) / to * to;
}

}  // namespace mnemosyne
