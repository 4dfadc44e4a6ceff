// The C allocation API, exported in place of glibc's.
//
// Fast path (Mode::arena): one mode check, then mimalloc (malloc) or one
// ownership-map load (free). Mode::managed adds MNEMOSYNE_SIZE routing and
// statistics counting on a separate path. Pointers the arena does not own
// (allocated by glibc before our start, by glibc-internal __libc_* calls,
// outside the size range, or while the driver was calling malloc) go back
// to glibc.
#include <errno.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include <mimalloc-live.h>

#include "api_names.hpp"
#include "arena/arena.hpp"
#include "fast_path.hpp"
#include "hold.hpp"
#include "libc.hpp"
#include "mode.hpp"
#include "stats/counters.hpp"
#include "stats/earlier.hpp"

namespace mnemosyne {
namespace {

inline void* nomem() noexcept {
  errno = ENOMEM;
  return nullptr;
}

inline bool is_power_of_two(std::size_t n) noexcept {
  return n != 0 && (n & (n - 1)) == 0;
}

std::size_t page_size() noexcept {
  return static_cast<std::size_t>(sysconf(_SC_PAGESIZE));  // glibc keeps it: no system call
}

// ---- Mode::managed helpers: routing and counting

// An entry's backend bits are the pool the counted paths take, scaled.
static_assert(std::size_t{1} << kOwnerBackendShift == stats::kPoolScale);
static_assert(stats::kPoolScale * stats::pool_of(BackendId::host) ==
              owner_entry(0, BackendId::host));

std::size_t usable_of(void* p, std::uint8_t tag) noexcept {
  return tag != 0 ? arena::usable_size(p, tag) : linux_host::usable_size(p);
}

int pool_of_tag(std::uint8_t tag) noexcept {
  return tag != 0 ? stats::pool_of(owner_backend(tag)) : stats::kSystemPool;
}

void* counted(void* p, std::size_t requested) noexcept {
  if (p != nullptr && g_policy.counting) {
    const std::uint8_t tag = owner_tag(p);
    stats::count_alloc(pool_of_tag(tag), requested, usable_of(p, tag));
  }
  return p;
}

void count_release(void* p, std::uint8_t tag, std::size_t usable) noexcept {
  if (tag == 0) {
    stats::count_system_free(p, usable);  // apart when allocated before the start
  } else {
    stats::count_free(stats::pool_of(owner_backend(tag)), usable);
  }
}

// A block of the system allocator served in host mode: remembered when the
// start-up is not over yet (its allocation is never counted).
inline void* host_block(void* p) noexcept {
  if (__builtin_expect(g_before_start.load(std::memory_order_relaxed), 0) && p != nullptr) {
    stats::remember_earlier(p);
  }
  return p;
}

// The system allocator serves: a size outside MNEMOSYNE_SIZE, or a fork
// between its copy and its end (Mode::diverted, hold.hpp). Counted when
// statistics are on.
void* system_alloc(std::size_t size, std::size_t alignment, bool zero) noexcept {
  void* p = alignment != 0 ? __libc_memalign(alignment, size)
                           : (zero ? __libc_calloc(1, size) : __libc_malloc(size));
  if (p == nullptr) return nomem();
  return counted(p, size);
}

void* managed_alloc(std::size_t size, std::size_t alignment, bool zero) noexcept {
  if (!g_policy.to_arena(size)) return system_alloc(size, alignment, zero);
  void* p;
  if (alignment != 0) {
    p = arena::alloc_aligned(size, alignment);
  } else {
    p = zero ? arena::alloc_zeroed(size) : arena::alloc(size);
  }
  if (p == nullptr) return nomem();
  return counted(p, size);
}

// The mode for a request outside the fast path: waits out a fork's copy.
Mode settled_mode() noexcept {
  Mode mode = current_mode();
  while (mode == Mode::held) {
    wait_while_held();
    mode = current_mode();
  }
  return mode;
}

void* aligned(std::size_t alignment, std::size_t size) noexcept {
  Mode mode = current_mode();
  if (__builtin_expect(mode == Mode::arena, 1)) {
    void* p = arena::alloc_aligned(size, alignment);
    return p != nullptr ? p : nomem();
  }
  mode = settled_mode();
  if (mode == Mode::arena) return aligned(alignment, size);
  if (managed_mode(mode)) return managed_alloc(size, alignment, false);
  if (mode == Mode::diverted) return system_alloc(size, alignment, false);
  return host_block(__libc_memalign(alignment, size));
}

// A block glibc owns: move it into the arena so the heap ends up in backend
// memory, unless its size is unknown (then glibc keeps it).
void* realloc_foreign(void* ptr, std::size_t size) noexcept {
  const std::size_t old_size = linux_host::usable_size(ptr);
  if (old_size == 0) return __libc_realloc(ptr, size);
  void* p = arena::alloc(size);
  if (p == nullptr) return nomem();
  std::memcpy(p, ptr, old_size < size ? old_size : size);
  __libc_free(ptr);
  return p;
}

// realloc outside the fast path. `size` > 0, `ptr` non-null.
void* realloc_slow(Mode mode, void* ptr, std::uint8_t tag, std::size_t size) noexcept {
  if (mode == Mode::host) {
    // A forked child that lost its heap cannot read an arena block any more.
    if (tag != 0) return __libc_malloc(size);
    void* p = __libc_realloc(ptr, size);
    if (p != nullptr) {  // before the start: the new block replaces the remembered one
      stats::forget_earlier(ptr);
      host_block(p);
    }
    return p;
  }
  const bool counting = g_policy.counting;
  const std::size_t old_usable = counting ? usable_of(ptr, tag) : 0;
  void* p;
  if (mode != Mode::diverted && g_policy.to_arena(size)) {
    p = tag != 0 ? arena::realloc(ptr, tag, size) : realloc_foreign(ptr, size);
  } else if (tag == 0) {
    p = __libc_realloc(ptr, size);
  } else {  // out of the size range, or a fork under way: to the system allocator
    const std::size_t old_size = arena::usable_size(ptr, tag);
    p = __libc_malloc(size);
    if (p != nullptr) {
      std::memcpy(p, ptr, old_size < size ? old_size : size);
      free_arena_block(ptr, tag);
    }
  }
  if (p == nullptr) return nomem();  // the old block is untouched
  if (!counting) return p;
  count_release(ptr, tag, old_usable);
  return counted(p, size);
}

}  // namespace

namespace {

// Every malloc that mimalloc did not serve (Mode::arena: the arena grows),
// that counted_malloc leaves, or of another mode.
[[gnu::noinline]] void* malloc_other(std::size_t size) noexcept {
  const Mode mode = settled_mode();
  if (mode == Mode::arena || mode == Mode::counted) {
    // mimalloc returned NULL (or the mode was held): grow, or fall back;
    // counted when statistics are on.
    void* p = arena::alloc_slow(size, 0, false);
    if (p == nullptr) return nomem();
    return mode == Mode::counted ? counted(p, size) : p;
  }
  if (managed_mode(mode)) return managed_alloc(size, 0, false);
  if (mode == Mode::diverted) return system_alloc(size, 0, false);
  return host_block(__libc_malloc(size));
}

// Statistics on, no routing, what malloc_slow's counted case leaves:
// mimalloc's generic path (a page to refill, a large block), then the
// count; the arena's growth and any failure as in Mode::arena.
[[gnu::noinline]] void* counted_malloc_generic(std::size_t size) noexcept {
  if (arena::is_dedicated_request(size)) return malloc_other(size);
  const mnemosyne_mi_sized_t block = mnemosyne_mi_malloc_generic_sized(size);
  if (__builtin_expect(block.p == nullptr, 0)) return malloc_other(size);
  stats::count_alloc(pool_of_tag(owner_tag(block.p)), size, block.usable);
  return block.p;
}

// Mode::arena, what mimalloc's fast case left: its generic path (a page to
// refill, a large block), then the arena's growth.
[[gnu::noinline]] void* arena_malloc_generic(std::size_t size) noexcept {
  if (arena::is_dedicated_request(size)) return malloc_other(size);
  void* p = mnemosyne_mi_malloc_generic(size);
  if (__builtin_expect(p != nullptr, 1)) return p;
  return malloc_other(size);
}

}  // namespace

// Counting first: every counted malloc comes here, a plain one only when
// its page's free list is empty.
//
// Statistics on, no routing (Mode::counted): a small block from its page's
// free list, whose usable size the page says on the way, then the count.
// Every call is a tail call, so nothing is saved across one; the count is
// about 10 instructions (stats/counters.hpp).
void* malloc_slow(std::size_t size) noexcept {
  if (__builtin_expect(mode_is<Mode::counted>(), 1)) {
    const mnemosyne_mi_sized_t block = mnemosyne_mi_malloc_fast_sized(size);
    if (__builtin_expect(block.p == nullptr, 0)) return counted_malloc_generic(size);
    const std::size_t tag = arena_block_tag(block.p);  // zero-extended once: the pool indexes
    return stats::count_alloc_then(block.p, tag & kOwnerBackendMask, size, block.usable);
  }
  if (__builtin_expect(mode_is<Mode::arena>(), 1)) return arena_malloc_generic(size);
  return malloc_other(size);
}

namespace {

// Statistics on, an arena block that is not the common case below (another
// thread's, its page's last): mimalloc frees it and says its usable size,
// found on the page it goes back to; then the count.
[[gnu::noinline]] void counted_free_generic(void* ptr) noexcept {
  const std::uint8_t tag = arena_block_tag(ptr);
  stats::count_free(stats::pool_of(owner_backend(tag)), mnemosyne_mi_free_sized(ptr));
}

// Every free that its route does not count: waits while a fork holds
// frees, counts while statistics are on, frees where the block came from.
[[gnu::noinline]] void free_checked(void* ptr) noexcept {
  if (ptr == nullptr) return;
  std::uint8_t checks = g_free_checks.load(std::memory_order_relaxed);
  while ((checks & kFreeHeld) != 0) {
    wait_while_held();
    checks = g_free_checks.load(std::memory_order_relaxed);
  }
  const std::uint8_t tag = owner_tag(ptr);
  if ((checks & kFreeCounting) != 0) count_release(ptr, tag, usable_of(ptr, tag));
  if (tag != 0) {
    free_arena_block(ptr, tag);
  } else {
    __libc_free(ptr);
  }
}

}  // namespace

// Every free the fast path leaves: its entry's route says counted (the
// common case while statistics are on), or it has none: a fork holds frees,
// a dedicated block, one of the system allocator's, nullptr, and an arena's
// whose entry has no route yet (while set_free_route walks the map).
void free_slow(void* ptr, std::uintptr_t chunk) noexcept {
  // The entry fast_free tested, read again.
  const std::size_t tag = g_owner_map[chunk].load(std::memory_order_acquire);
  if (__builtin_expect((tag & kOwnerCountedFree) == 0, 0)) return free_checked(ptr);
  // A block of this thread's page: freed and counted with no call but
  // tail calls.
  const std::size_t usable = mnemosyne_mi_free_local_sized(ptr);
  if (__builtin_expect(usable == 0, 0)) return counted_free_generic(ptr);
  stats::count_free_then(tag & kOwnerBackendMask, usable);
}

}  // namespace mnemosyne

using namespace mnemosyne;

extern "C" {

MNEMOSYNE_API_VISIBILITY void* MNEMOSYNE_API(malloc)(std::size_t size) noexcept {
  return fast_malloc(size);
}

MNEMOSYNE_API_VISIBILITY void MNEMOSYNE_API(free)(void* ptr) noexcept {
  fast_free(ptr);
}

MNEMOSYNE_API_VISIBILITY void MNEMOSYNE_API(cfree)(void* ptr) noexcept {
  MNEMOSYNE_API(free)(ptr);
}

MNEMOSYNE_API_VISIBILITY void* MNEMOSYNE_API(calloc)(std::size_t count, std::size_t size) noexcept {
  std::size_t total;
  if (__builtin_mul_overflow(count, size, &total)) return nomem();
  Mode mode = current_mode();
  if (__builtin_expect(mode == Mode::arena, 1)) {
    void* p = arena::alloc_zeroed(total);
    return p != nullptr ? p : nomem();
  }
  mode = settled_mode();
  if (mode == Mode::arena) return MNEMOSYNE_API(calloc)(count, size);
  if (managed_mode(mode)) return managed_alloc(total, 0, true);
  if (mode == Mode::diverted) return system_alloc(total, 0, true);
  return host_block(__libc_calloc(count, size));
}

MNEMOSYNE_API_VISIBILITY void* MNEMOSYNE_API(realloc)(void* ptr, std::size_t size) noexcept {
  if (ptr == nullptr) return MNEMOSYNE_API(malloc)(size);
  if (size == 0) {  // as glibc: frees the block and returns NULL
    MNEMOSYNE_API(free)(ptr);
    return nullptr;
  }
  const std::uint8_t tag = owner_tag(ptr);
  Mode mode = current_mode();
  if (__builtin_expect(mode == Mode::arena, 1)) {
    void* p = tag != 0 ? arena::realloc(ptr, tag, size) : realloc_foreign(ptr, size);
    return p != nullptr ? p : nomem();
  }
  mode = settled_mode();
  if (mode == Mode::arena) return MNEMOSYNE_API(realloc)(ptr, size);
  return realloc_slow(mode, ptr, tag, size);
}

MNEMOSYNE_API_VISIBILITY void* MNEMOSYNE_API(reallocarray)(void* ptr, std::size_t count,
                                                           std::size_t size) noexcept {
  std::size_t total;
  if (__builtin_mul_overflow(count, size, &total)) return nomem();
  return MNEMOSYNE_API(realloc)(ptr, total);
}

MNEMOSYNE_API_VISIBILITY int MNEMOSYNE_API(posix_memalign)(void** out, std::size_t alignment,
                                                           std::size_t size) noexcept {
  if (!is_power_of_two(alignment) || alignment % sizeof(void*) != 0) return EINVAL;
  void* p = aligned(alignment, size);
  // The result says ENOMEM; glibc's leaves errno at ENOMEM too.
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}

// glibc's memalign accepts any alignment: one up to alignof(max_align_t)
// is malloc's, one above SIZE_MAX / 2 + 1 (no power of two) is EINVAL, any
// other is rounded up to a power of two (whose padding may then not fit:
// ENOMEM). malloc's alignment is glibc's 16 bytes for every block, but
// mimalloc's only for blocks over 8 bytes (smaller ones come 8-aligned): a
// smaller request is served at the alignment's size, so that
// aligned_alloc(16, 0) is 16-aligned as with glibc.
MNEMOSYNE_API_VISIBILITY void* MNEMOSYNE_API(memalign)(std::size_t alignment,
                                                       std::size_t size) noexcept {
  if (alignment <= alignof(std::max_align_t)) {
    return MNEMOSYNE_API(malloc)(size < alignment ? alignment : size);
  }
  if (alignment > (SIZE_MAX >> 1) + 1) {
    errno = EINVAL;
    return nullptr;
  }
  if (!is_power_of_two(alignment)) alignment = std::size_t{1} << (64 - __builtin_clzl(alignment));
  return aligned(alignment, size);
}

// glibc's aligned_alloc is memalign up to 2.37; 2.38 made it refuse an
// alignment that is not a power of two with EINVAL (glibc bug 20137). The
// program gets what the glibc it runs on would give it.
MNEMOSYNE_API_VISIBILITY void* MNEMOSYNE_API(aligned_alloc)(std::size_t alignment,
                                                            std::size_t size) noexcept {
  if (!is_power_of_two(alignment) && linux_host::aligned_alloc_is_strict()) {
    errno = EINVAL;
    return nullptr;
  }
  return MNEMOSYNE_API(memalign)(alignment, size);
}

MNEMOSYNE_API_VISIBILITY void* MNEMOSYNE_API(valloc)(std::size_t size) noexcept {
  return aligned(page_size(), size);
}

MNEMOSYNE_API_VISIBILITY void* MNEMOSYNE_API(pvalloc)(std::size_t size) noexcept {
  const std::size_t page = page_size();
  if (size > SIZE_MAX - page) return nomem();
  return aligned(page, size == 0 ? page : (size + page - 1) / page * page);
}

MNEMOSYNE_API_VISIBILITY std::size_t MNEMOSYNE_API(malloc_usable_size)(void* ptr) noexcept {
  if (ptr == nullptr) return 0;
  const std::uint8_t tag = owner_tag(ptr);
  if (tag == 0) return linux_host::usable_size(ptr);
  if (!arena_mode()) return 0;
  return arena::usable_size(ptr, tag);
}

}  // extern "C"
