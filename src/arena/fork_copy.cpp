// Keeping a forked child's heap: memory of CUDA backends is not inherited by
// a child created with fork() (the driver marks it MADV_DONTFORK, or the
// child cannot use it), yet the child's heap, mimalloc's metadata included,
// lives there. Before the fork, every CPU-resident page of such segments is
// copied into private anonymous memory; in the child that copy is moved to
// the segment's address (mremap), so the child continues with plain host
// memory at the same addresses. The parent drops the copy after the fork.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "arena/arena.hpp"
#include "arena/segment_provider.hpp"
#include "arena/state.hpp"
#include "backend/backends.hpp"
#include "backend/loader.hpp"

namespace mnemosyne::arena {
namespace {

struct Shadow {
  void* copy;
  void* target;
  std::size_t size;
};

constexpr std::size_t kMaxShadows = SegmentTable::kCapacity;
constinit Shadow g_shadows[kMaxShadows] = {};
constinit std::size_t g_shadow_count = 0;
constinit bool g_shadow_failed = false;

bool inherited(BackendId id) noexcept {
  return with_backend(id, []<MemoryBackend B>() { return B::inherited_by_fork; });
}

// Copies the pages of [src, src+size) that are resident on the CPU. Pages
// that are not (never touched, or only on the GPU) stay zero in the copy.
std::size_t copy_resident(void* dst, const void* src, std::size_t size) noexcept {
  static unsigned char residency[1 << 16];  // under the table lock
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t window = sizeof residency * page;
  std::size_t copied = 0;
  for (std::size_t off = 0; off < size; off += window) {
    const std::size_t len = size - off < window ? size - off : window;
    auto* s = static_cast<const unsigned char*>(src) + off;
    auto* d = static_cast<unsigned char*>(dst) + off;
    if (mincore(const_cast<unsigned char*>(s), len, residency) != 0) {
      std::memcpy(d, s, len);  // residency unknown: copy everything
      copied += len;
      continue;
    }
    for (std::size_t i = 0; i < len / page;) {
      if (!(residency[i] & 1)) {
        ++i;
        continue;
      }
      std::size_t j = i;
      while (j < len / page && (residency[j] & 1)) ++j;
      std::memcpy(d + i * page, s + i * page, (j - i) * page);
      copied += (j - i) * page;
      i = j;
    }
  }
  return copied;
}

// Private memory for a copy of `size` bytes (a multiple of 32 MiB), 2 MiB
// aligned and backed by transparent huge pages where the system allows: a
// copy faulted in 4 KiB pages costs several times the memcpy itself.
void* map_shadow(std::size_t size) noexcept {
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  void* raw = mmap(nullptr, size + kHuge, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t start = (base + kHuge - 1) & ~(kHuge - 1);
  if (start > base) munmap(raw, start - base);
  const std::uintptr_t end = start + size;
  if (base + size + kHuge > end) munmap(reinterpret_cast<void*>(end), base + size + kHuge - end);
  madvise(reinterpret_cast<void*>(start), size, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(start);
}

}  // namespace

void prepare_fork() noexcept {
  g_state.table.lock().lock();  // released in parent_after_fork / child_after_fork
  g_shadow_count = 0;
  g_shadow_failed = false;
  SegmentTable::Entry* entries = g_state.table.entries();
  for (std::size_t i = 0; i < g_state.table.high_water(); ++i) {
    const SegmentTable::Entry& e = entries[i];
    if (!e.used || inherited(e.segment.backend)) continue;
    void* copy = map_shadow(e.segment.size);
    if (copy == nullptr) {
      g_shadow_failed = true;
      break;
    }
    const std::size_t copied = copy_resident(copy, e.segment.start, e.segment.size);
    g_state.fork_bytes_copied.fetch_add(copied, std::memory_order_relaxed);
    g_shadows[g_shadow_count++] = Shadow{copy, e.segment.start, e.segment.size};
  }
}

void parent_after_fork() noexcept {
  for (std::size_t i = 0; i < g_shadow_count; ++i) munmap(g_shadows[i].copy, g_shadows[i].size);
  g_shadow_count = 0;
  g_state.table.lock().unlock();
}

bool child_after_fork() noexcept {
  // The driver must never be called here, and segments are the child's own
  // memory from now on: new ones come from the host backend.
  driver_mark_forked_child();
  provider_enter_forked_child();
  g_state.backend.store(BackendId::host);
  g_state.exhausted.store(false);
  pthread_mutex_init(&g_state.grow_lock, nullptr);
  bool ok = !g_shadow_failed;
  for (std::size_t i = 0; i < g_shadow_count; ++i) {
    const Shadow& s = g_shadows[i];
    if (mremap(s.copy, s.size, s.size, MREMAP_MAYMOVE | MREMAP_FIXED, s.target) == MAP_FAILED) {
      ok = false;
    }
  }
  g_shadow_count = 0;
  if (!ok) {
    // Some of the heap could not be restored: no arena block may be touched
    // again. Re-tag every segment as an unknown dedicated block, so that a
    // free of one is ignored and its usable size reads 0.
    SegmentTable::Entry* entries = g_state.table.entries();
    for (std::size_t i = 0; i < g_state.table.high_water(); ++i) {
      SegmentTable::Entry& e = entries[i];
      if (!e.used) continue;
      owner_map_set(e.segment.start, e.segment.size,
                    static_cast<std::uint8_t>(kOwnerDedicated | std::uint8_t(e.segment.backend)));
      e.used = false;
    }
  }
  g_state.table.lock().reset();
  return ok;
}

}  // namespace mnemosyne::arena
