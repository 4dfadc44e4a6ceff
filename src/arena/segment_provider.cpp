#include "arena/segment_provider.hpp"

#include <atomic>
#include <cstdint>

#include "arena/ownership_map.hpp"
#include "backend/backends.hpp"
#include "platform/platform.hpp"

namespace mnemosyne {
namespace {

std::atomic<bool> g_forked_child{false};

std::size_t page_size() noexcept {
  return Os::page_size();
}

}  // namespace

bool acquire_segment(BackendId backend, std::size_t size, std::size_t align,
                     Segment* out) noexcept {
  if (align < kSegmentAlign || (align & (align - 1)) != 0) return false;
  size = round_up(size, kSegmentAlign);
  const std::size_t raw_size = size + align - page_size();
  if (size == 0 || raw_size < size) return false;  // overflow

  void* raw = with_backend(backend, [&]<MemoryBackend B>() { return B::allocate(raw_size); });
  if (raw == nullptr) return false;

  const auto raw_addr = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t start = (raw_addr + align - 1) & ~(std::uintptr_t{align} - 1);
  const std::size_t usable = (raw_addr + raw_size - start) / kSegmentAlign * kSegmentAlign;
  if (!owner_map_covers(reinterpret_cast<void*>(start), usable)) {
    with_backend(backend, [&]<MemoryBackend B>() { return B::deallocate(raw, raw_size); });
    return false;
  }
  *out = Segment{reinterpret_cast<void*>(start), usable, raw, raw_size, backend,
                 backend_fresh_zero(backend)};
  return true;
}

bool backend_fresh_zero(BackendId backend) noexcept {
  return with_backend(backend, []<MemoryBackend B>() { return B::fresh_memory_zero(); });
}

void clear_memory(BackendId backend, void* ptr, std::size_t size) noexcept {
  with_backend(backend, [&]<MemoryBackend B>() { B::clear(ptr, size); });
}

void release_segment(const Segment& segment) noexcept {
  owner_map_set(segment.start, segment.size, 0);
  if (g_forked_child.load(std::memory_order_relaxed) && is_cuda_backend(segment.backend)) {
    // The child's copy (fork_copy.cpp, Linux), mapped by the provider at the
    // segment's own address; the slack was never copied.
    Os::unmap_pages(segment.start, segment.size);
    return;
  }
  with_backend(segment.backend,
               [&]<MemoryBackend B>() { return B::deallocate(segment.raw, segment.raw_size); });
}

void provider_enter_forked_child() noexcept {
  g_forked_child.store(true, std::memory_order_relaxed);
}

}  // namespace mnemosyne
