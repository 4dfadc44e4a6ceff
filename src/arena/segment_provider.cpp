#include "arena/segment_provider.hpp"

#include <atomic>
#include <cstdint>

#include <mimalloc-live.h>

#include "arena/ownership_map.hpp"
#include "backend/backends.hpp"
#include "platform/platform.hpp"

namespace mnemosyne {
namespace {

std::atomic<bool> g_forked_child{false};
// What a new reservation backs to learn whether the driver will: mimalloc's
// unit of commit (MI_COMMIT_SIZE).
constexpr std::size_t kProbeBytes = std::size_t{64} << 10;
// The range of this thread's first commit that needed the driver since the
// last back_pending or forget_pending. The first, not the last: when a
// commit fails mimalloc tries other ranges (a fresh segment, the next
// arena), whose commits fail too; the one it tried first is the one it
// tries first again.
thread_local BackedRange t_pending;

std::size_t page_size() noexcept {
  return Os::page_size();
}

// Returns a segment's memory to its backend, the way it was acquired.
void give_back(const Segment& segment) noexcept {
  with_backend(segment.backend, [&]<MemoryBackend B>() {
    if constexpr (B::commits_on_demand) {
      if (segment.on_demand) return B::release(segment.raw, segment.raw_size);
    }
    return B::deallocate(segment.raw, segment.raw_size);
  });
}

}  // namespace

bool acquire_segment(BackendId backend, std::size_t size, std::size_t align, Reserve reserve,
                     Segment* out) noexcept {
  if (align < kSegmentAlign || (align & (align - 1)) != 0) return false;
  size = round_up(size, kSegmentAlign);
  const std::size_t raw_size = size + align - page_size();
  if (size == 0 || raw_size < size) return false;  // overflow

  void* raw = nullptr;
  bool on_demand = false;
  if (reserve != Reserve::no) {
    raw = with_backend(backend, [&]<MemoryBackend B>() -> void* {
      if constexpr (B::commits_on_demand) {
        // A reservation serves only if the driver backs it: the granule
        // where mimalloc will commit first is backed (it stays backed, unused,
        // until the backend gives unused granules back), so a driver that
        // refuses is found here, where the arena can still take memory the
        // other way, and not at the first malloc.
        void* r = B::reserve(raw_size);
        if (r == nullptr) return nullptr;
        void* first = reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(r) + align - 1) &
                                              ~(std::uintptr_t{align} - 1));
        if (!B::back(first, kProbeBytes)) {
          B::release(r, raw_size);
          return nullptr;
        }
        B::back_done(first, kProbeBytes);
        return r;
      } else {
        return nullptr;
      }
    });
    on_demand = raw != nullptr;
  }
  if (raw == nullptr && reserve != Reserve::only) {
    raw = with_backend(backend, [&]<MemoryBackend B>() { return B::allocate(raw_size); });
  }
  if (raw == nullptr) return false;

  const auto raw_addr = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t start = (raw_addr + align - 1) & ~(std::uintptr_t{align} - 1);
  const std::size_t usable = (raw_addr + raw_size - start) / kSegmentAlign * kSegmentAlign;
  const bool zero = with_backend(backend, [&]<MemoryBackend B>() {
    if constexpr (B::commits_on_demand) {
      if (on_demand) return B::reservation_zero();
    }
    return B::fresh_memory_zero();
  });
  *out = Segment{reinterpret_cast<void*>(start), usable, raw, raw_size, backend, zero, on_demand};
  if (!owner_map_covers(reinterpret_cast<void*>(start), usable)) {
    give_back(*out);
    return false;
  }
  return true;
}

namespace {

// Backs and marks in use [start, start + size) of a reservation of `backend`,
// from outside mimalloc.
bool commit_reserved(BackendId backend, void* start, std::size_t size) noexcept {
  return with_backend(backend, [&]<MemoryBackend B>() {
    if constexpr (B::commits_on_demand) {
      if (!B::back(start, size)) return false;
      const bool ok = B::commit(start, size);
      B::back_done(start, size);
      if (ok) B::start_give_back();
      return ok;
    } else {
      return true;
    }
  });
}

}  // namespace

bool acquire_growable(BackendId backend, std::size_t size, std::size_t capacity, bool reserve,
                      Segment* out) noexcept {
  size = round_up(size, page_size());
  if (size == 0 || capacity < size) return false;
  Segment seg;
  if (!acquire_segment(backend, capacity, kSegmentAlign, reserve ? Reserve::only : Reserve::no,
                       &seg)) {
    return false;
  }
  if (seg.on_demand && !commit_reserved(backend, seg.start, size)) {
    give_back(seg);
    return false;
  }
  seg.capacity = seg.size;
  seg.size = size;
  *out = seg;
  return true;
}

bool commit_now(void* start, std::size_t size) noexcept {
  const std::uint8_t tag = owner_tag(start);
  if ((tag & kOwnerOnDemand) == 0) return true;
  return commit_reserved(owner_backend(tag), start, size);
}

void decommit_now(void* start, std::size_t size) noexcept {
  const std::uint8_t tag = owner_tag(start);
  if ((tag & kOwnerOnDemand) == 0) return;
  with_backend(owner_backend(tag), [&]<MemoryBackend B>() {
    if constexpr (B::commits_on_demand) B::decommit(start, size);
  });
}

int commit_range(void* start, std::size_t size, int op) noexcept {
  const std::uint8_t tag = owner_tag(start);
  if (tag == 0) return -1;
  if ((tag & kOwnerOnDemand) == 0) return 1;
  // A forked child's CUDA segments are its own copies (src/arena/fork/): backed.
  if (g_forked_child.load(std::memory_order_relaxed) && is_cuda_backend(owner_backend(tag))) {
    return 1;
  }
  return with_backend(owner_backend(tag), [&]<MemoryBackend B>() -> int {
    if constexpr (B::commits_on_demand) {
      if (op == MNEMOSYNE_MI_COMMIT) {
        if (B::commit(start, size)) return 1;
        if (t_pending.start == nullptr) t_pending = BackedRange{start, size};
        return 0;
      }
      if (op == MNEMOSYNE_MI_DECOMMIT) B::decommit(start, size);
      // A reset (the contents may go, the memory stays committed) does
      // nothing: page-locked pages must keep their frames while registered.
    }
    return 1;
  });
}

bool backend_fresh_zero(BackendId backend) noexcept {
  return with_backend(backend, []<MemoryBackend B>() { return B::fresh_memory_zero(); });
}

bool backend_backs_where_touched(BackendId backend) noexcept {
  return with_backend(backend, []<MemoryBackend B>() { return B::data_off_cpu; });
}

bool backend_commits_on_demand(BackendId backend) noexcept {
  return with_backend(backend, []<MemoryBackend B>() { return B::commits_on_demand; });
}

bool backend_defers_release(BackendId backend) noexcept {
  return with_backend(backend, []<MemoryBackend B>() {
    if constexpr (B::commits_on_demand) {
      return B::defers_release;
    } else {
      return false;
    }
  });
}

void clear_memory(BackendId backend, void* ptr, std::size_t size) noexcept {
  with_backend(backend, [&]<MemoryBackend B>() { B::clear(ptr, size); });
}

bool discard_memory(BackendId backend, void* ptr, std::size_t size) noexcept {
  if (g_forked_child.load(std::memory_order_relaxed) || Os::process_exiting()) return false;
  return with_backend(backend, [&]<MemoryBackend B>() {
    if constexpr (B::data_off_cpu) {
      return discard_managed(B::kId, ptr, size);
    } else {
      return false;
    }
  });
}

void release_segment(const Segment& segment) noexcept {
  owner_map_set(segment.start, segment.capacity != 0 ? segment.capacity : segment.size, 0);
  // A free during the teardown of the process (a DLL's detach on Windows,
  // after ExitProcess stopped every other thread, the driver's included,
  // perhaps inside one of its locks): the driver may not be called, and the
  // memory goes with the process.
  if (is_cuda_backend(segment.backend) && Os::process_exiting()) return;
  if (g_forked_child.load(std::memory_order_relaxed) && is_cuda_backend(segment.backend)) {
    // The child's copy (src/arena/fork/, Linux), mapped by the provider at the
    // segment's own address; the slack was never copied.
    Os::unmap_pages(segment.start, segment.size);
    return;
  }
  give_back(segment);
}

void forget_pending() noexcept {
  t_pending = BackedRange{};
}

Backing back_pending(BackedRange* backed) noexcept {
  *backed = t_pending;
  t_pending = BackedRange{};
  if (backed->start == nullptr) return Backing::none;
  return with_backend(owner_backend(owner_tag(backed->start)), [&]<MemoryBackend B>() {
    if constexpr (B::commits_on_demand) {
      if (!B::back(backed->start, backed->size)) {
        *backed = BackedRange{};
        return Backing::refused;
      }
      // Here, outside mimalloc and every lock of the arena, is where the
      // backend's give-back may start (a thread: its creation may call
      // malloc).
      B::start_give_back();
    }
    return Backing::backed;
  });
}

void end_backed(BackedRange* backed) noexcept {
  if (backed->start == nullptr) return;
  with_backend(owner_backend(owner_tag(backed->start)), [&]<MemoryBackend B>() {
    if constexpr (B::commits_on_demand) B::back_done(backed->start, backed->size);
  });
  *backed = BackedRange{};
}

bool segment_readable(const void* start, std::size_t size) noexcept {
  const std::uint8_t tag = owner_tag(start);
  // Memory committed whole, or a forked child's copies (src/arena/fork/: mapped
  // whole): readable.
  if ((tag & kOwnerOnDemand) == 0 || g_forked_child.load(std::memory_order_relaxed)) return true;
  return with_backend(owner_backend(tag), [&]<MemoryBackend B>() {
    if constexpr (B::commits_on_demand) {
      return B::readable(start, size);
    } else {
      return true;
    }
  });
}

void hold_backing(bool on) noexcept {
  for (const BackendId id : {BackendId::pinned, BackendId::host}) {
    with_backend(id, [&]<MemoryBackend B>() {
      if constexpr (B::commits_on_demand) B::hold_backing(on);
    });
  }
}

void provider_enter_forked_child() noexcept {
  g_forked_child.store(true, std::memory_order_relaxed);
}

}  // namespace mnemosyne
