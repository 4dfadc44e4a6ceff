// The CRT heap functions, redirected: one instance of each per runtime
// (template parameter C), so that a block mnemosyne does not own goes back
// to the runtime whose function was called: memory allocated before
// injection, blocks the runtime allocated internally, requests outside
// MNEMOSYNE_SIZE, and what the arena's host fallback took from that runtime.
//
// Fast path (Mode::arena): one mode check, then mimalloc (allocations) or
// one ownership-map load (frees), as in interpose/linux/malloc_api.cpp.
#include <errno.h>
#include <windows.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <cwchar>

#include "arena/arena.hpp"
#include "arena/ownership_map.hpp"
#include "crt.hpp"
#include "mode.hpp"
#include "stats/counters.hpp"
#include "stats/earlier.hpp"

namespace mnemosyne::win {

constinit CrtHeap g_crt[kCrtCount] = {};
constinit std::atomic<Mode> g_mode{Mode::host};
constinit Policy g_policy{};

namespace {

#define MN_LIKELY(x) __builtin_expect(!!(x), 1)

// The runtime whose function is running on this thread, for the arena's host
// heap (host_heap_*): set on the slow paths only.
constinit thread_local int t_caller = kMsvcrt;

class CallerScope {
 public:
  explicit CallerScope(int crt) noexcept : saved_(t_caller) { t_caller = crt; }
  ~CallerScope() { t_caller = saved_; }
  CallerScope(const CallerScope&) = delete;
  CallerScope& operator=(const CallerScope&) = delete;

 private:
  int saved_;
};

inline void* nomem() noexcept {
  errno = ENOMEM;
  return nullptr;
}

inline bool is_power_of_two(std::size_t n) noexcept {
  return n != 0 && (n & (n - 1)) == 0;
}

// The mode, starting mnemosyne when this is the first call that can.
inline Mode settled_mode() noexcept {
  const Mode m = current_mode();
  return m != Mode::host ? m : start_if_possible();
}

template <int C>
std::size_t foreign_size(void* p) noexcept {
  const CrtHeap& crt = g_crt[C];
  if (crt.msize == nullptr) return 0;
  const std::size_t n = crt.msize(p);
  return n == static_cast<std::size_t>(-1) ? 0 : n;
}

template <int C>
std::size_t usable_of(void* p, std::uint8_t tag) noexcept {
  return tag != 0 ? arena::usable_size(p, tag) : foreign_size<C>(p);
}

// The _recalloc family: everything from `old` (the block's usable size
// before) to the end of the new block reads as zero, as mimalloc's own
// rezalloc and zalloc keep it (its _msize is the usable size, so a later
// _recalloc zeroes from there).
template <int C>
void* zero_tail(void* q, std::size_t old) noexcept {
  if (q == nullptr) return q;
  const std::size_t now = usable_of<C>(q, owner_tag(q));
  if (now > old) std::memset(static_cast<char*>(q) + old, 0, now - old);
  return q;
}

int pool_of_tag(std::uint8_t tag) noexcept {
  return tag != 0 ? stats::pool_of(owner_backend(tag)) : stats::kSystemPool;
}

// A counted free: a block of the runtime that was there before the start
// (see start.cpp, remember_runtime_blocks) is counted apart.
void count_release(void* p, std::uint8_t tag, std::size_t usable) noexcept {
  if (tag == 0) {
    stats::count_system_free(p, usable);
  } else {
    stats::count_free(pool_of_tag(tag), usable);
  }
}

template <int C>
void* counted(void* p, std::size_t requested) noexcept {
  if (p != nullptr && g_policy.counting) {
    const std::uint8_t tag = owner_tag(p);
    stats::count_alloc(pool_of_tag(tag), requested, usable_of<C>(p, tag));
  }
  return p;
}

// Every allocation outside the fast path. `alignment` 0 for plain blocks.
template <int C>
[[gnu::noinline]] void* alloc_slow(std::size_t size, std::size_t alignment, bool zero) noexcept {
  const CrtHeap& crt = g_crt[C];
  const Mode mode = settled_mode();
  if (mode == Mode::host || (mode == Mode::managed && !g_policy.to_arena(size))) {
    void* p = alignment != 0 ? crt.aligned_malloc(size, alignment)
                             : (zero ? crt.calloc(1, size) : crt.malloc(size));
    return mode == Mode::host ? p : counted<C>(p, size);
  }
  CallerScope caller(C);
  void* p = alignment != 0 ? arena::alloc_aligned(size, alignment)
                           : (zero ? arena::alloc_zeroed(size) : arena::alloc(size));
  if (p == nullptr) return nomem();
  return mode == Mode::managed ? counted<C>(p, size) : p;
}

// Every free the fast test leaves; the entry is read again here, so the
// fast path keeps nothing for it.
template <int C>
[[gnu::noinline]] void free_slow(void* p, bool aligned) noexcept {
  if (p == nullptr) return;
  const std::uint8_t tag = owner_tag(p);
  if (g_policy.counting && current_mode() == Mode::managed) {
    count_release(p, tag, usable_of<C>(p, tag));
  }
  if (tag != 0) {
    arena::free(p, tag);
  } else if (aligned) {
    g_crt[C].aligned_free(p);
  } else {
    g_crt[C].free(p);
  }
}

template <int C>
void* crt_malloc(std::size_t size) noexcept {
  if (MN_LIKELY(current_mode() == Mode::arena)) {
    void* p = mi_malloc(size);
    if (MN_LIKELY(p != nullptr)) return p;
  }
  return alloc_slow<C>(size, 0, false);
}

template <int C>
void crt_free(void* p) noexcept {
  // An arena block while statistics are off (arena::set_free_route): one
  // test of its ownership-map entry, with no bounds test (Windows x64 gives
  // user mode addresses below 2^47 only, so every block an allocator
  // returned has its entry; ownership_map.hpp): two instructions fewer.
  if (MN_LIKELY((owner_entry_unchecked(p).load(std::memory_order_relaxed) & kOwnerFastFree) != 0)) {
    mi_free(p);
    return;
  }
  free_slow<C>(p, false);
}

template <int C>
void* crt_calloc(std::size_t count, std::size_t size) noexcept {
  std::size_t total;
  if (__builtin_mul_overflow(count, size, &total)) return nomem();
  if (MN_LIKELY(current_mode() == Mode::arena)) {
    void* p = mi_zalloc(total);
    if (MN_LIKELY(p != nullptr)) return p;
  }
  return alloc_slow<C>(total, 0, true);
}

template <int C>
std::size_t crt_msize(void* p) noexcept {
  if (p == nullptr) return static_cast<std::size_t>(-1);
  const std::uint8_t tag = owner_tag(p);
  if (tag != 0) return arena::usable_size(p, tag);
  return g_crt[C].msize(p);
}

// Resizes `p` (non-null, size > 0) in the arena: a block of ours in place
// when mimalloc can, a foreign one moved into the arena (its runtime frees
// the old copy), or with the runtime when mnemosyne does not serve the size.
template <int C>
void* resize(void* p, std::size_t size, std::size_t alignment) noexcept {
  const CrtHeap& crt = g_crt[C];
  const std::uint8_t tag = owner_tag(p);
  const Mode mode = settled_mode();
  if (tag == 0 && (mode == Mode::host || (mode == Mode::managed && !g_policy.to_arena(size)))) {
    void* q = alignment != 0 ? crt.aligned_realloc(p, size, alignment) : crt.realloc(p, size);
    return q;
  }
  const bool counting = mode == Mode::managed && g_policy.counting;
  const std::size_t old_usable = tag != 0 ? arena::usable_size(p, tag)
                                          : (alignment != 0 && crt.aligned_msize != nullptr
                                                 ? crt.aligned_msize(p, alignment, 0)
                                                 : foreign_size<C>(p));
  void* q = nullptr;
  if (tag != 0 && alignment == 0 && g_policy.to_arena(size)) {
    CallerScope caller(C);
    q = arena::realloc(p, tag, size);
  } else if (tag == 0 && old_usable == 0) {
    return alignment != 0 ? crt.aligned_realloc(p, size, alignment) : crt.realloc(p, size);
  } else {
    q = alignment != 0 ? alloc_slow<C>(size, alignment, false) : alloc_slow<C>(size, 0, false);
    if (q == nullptr) return nomem();
    std::memcpy(q, p, old_usable < size ? old_usable : size);
    if (counting) count_release(p, tag, old_usable);
    if (tag != 0) {
      arena::free(p, tag);
    } else if (alignment != 0) {
      crt.aligned_free(p);
    } else {
      crt.free(p);
    }
    return q;  // counted by alloc_slow
  }
  if (q == nullptr) return nomem();
  if (counting) {
    count_release(p, tag, old_usable);
    counted<C>(q, size);
  }
  return q;
}

template <int C>
void* crt_realloc(void* p, std::size_t size) noexcept {
  if (p == nullptr) return crt_malloc<C>(size);
  if (size == 0) {  // the CRT frees the block and returns NULL
    crt_free<C>(p);
    return nullptr;
  }
  const std::uint8_t tag = owner_tag(p);
  if (MN_LIKELY((tag & kOwnerArena) != 0 && current_mode() == Mode::arena)) {
    void* q = mi_realloc(p, size);
    if (MN_LIKELY(q != nullptr)) return q;
  }
  return resize<C>(p, size, 0);
}

template <int C>
void* crt_expand(void* p, std::size_t size) noexcept {
  if (p == nullptr) return nullptr;
  const std::uint8_t tag = owner_tag(p);
  if (tag == 0) return g_crt[C].expand != nullptr ? g_crt[C].expand(p, size) : nullptr;
  if ((tag & kOwnerArena) != 0) return mi_expand(p, size);
  return size <= arena::usable_size(p, tag) ? p : nullptr;
}

template <int C>
void* crt_recalloc(void* p, std::size_t count, std::size_t size) noexcept {
  std::size_t total;
  if (__builtin_mul_overflow(count, size, &total)) return nomem();
  if (p == nullptr) return crt_calloc<C>(1, total);
  const std::size_t old = usable_of<C>(p, owner_tag(p));
  return zero_tail<C>(crt_realloc<C>(p, total), old);
}

template <int C>
void* crt_aligned_malloc(std::size_t size, std::size_t alignment) noexcept {
  if (!is_power_of_two(alignment)) {
    errno = EINVAL;
    return nullptr;
  }
  if (alignment < sizeof(void*)) alignment = sizeof(void*);
  if (MN_LIKELY(current_mode() == Mode::arena)) {
    void* p = arena::alloc_aligned(size, alignment);
    return p != nullptr ? p : nomem();
  }
  return alloc_slow<C>(size, alignment, false);
}

template <int C>
void crt_aligned_free(void* p) noexcept {
  if (MN_LIKELY((owner_tag(p) & kOwnerFastFree) != 0)) {
    mi_free(p);
    return;
  }
  free_slow<C>(p, true);
}

template <int C>
void* crt_aligned_realloc(void* p, std::size_t size, std::size_t alignment) noexcept {
  if (!is_power_of_two(alignment)) {
    errno = EINVAL;
    return nullptr;
  }
  if (p == nullptr) return crt_aligned_malloc<C>(size, alignment);
  if (size == 0) {
    crt_aligned_free<C>(p);
    return nullptr;
  }
  if (alignment < sizeof(void*)) alignment = sizeof(void*);
  return resize<C>(p, size, alignment);
}

template <int C>
void* crt_aligned_recalloc(void* p, std::size_t count, std::size_t size,
                           std::size_t alignment) noexcept {
  std::size_t total;
  if (__builtin_mul_overflow(count, size, &total)) return nomem();
  const std::uint8_t tag = owner_tag(p);
  std::size_t old = 0;
  if (p != nullptr) {
    old = tag != 0
              ? arena::usable_size(p, tag)
              : (g_crt[C].aligned_msize != nullptr ? g_crt[C].aligned_msize(p, alignment, 0) : 0);
  }
  return zero_tail<C>(crt_aligned_realloc<C>(p, total, alignment), old);
}

template <int C>
std::size_t crt_aligned_msize(void* p, std::size_t alignment, std::size_t offset) noexcept {
  const std::uint8_t tag = owner_tag(p);
  if (tag != 0) return arena::usable_size(p, tag);
  return g_crt[C].aligned_msize(p, alignment, offset);
}

// Blocks whose address + offset is aligned: mimalloc's own aligned_at. When
// the arena has no room for one, the runtime serves it (the arena grows on
// the next plain request); _aligned_free sends it back there.
template <int C>
void* crt_aligned_offset_malloc(std::size_t size, std::size_t alignment,
                                std::size_t offset) noexcept {
  if (!is_power_of_two(alignment) || (size != 0 && offset >= size)) {
    errno = EINVAL;
    return nullptr;
  }
  if (alignment < sizeof(void*)) alignment = sizeof(void*);
  const Mode mode = settled_mode();
  if (mode != Mode::host && g_policy.to_arena(size) && alignment <= arena::kMaxArenaAlign) {
    void* p = mi_malloc_aligned_at(size, alignment, offset);
    if (p != nullptr) return mode == Mode::managed ? counted<C>(p, size) : p;
  }
  return counted<C>(g_crt[C].aligned_offset_malloc(size, alignment, offset), size);
}

template <int C>
void* crt_aligned_offset_realloc(void* p, std::size_t size, std::size_t alignment,
                                 std::size_t offset) noexcept {
  if (p == nullptr) return crt_aligned_offset_malloc<C>(size, alignment, offset);
  if (size == 0) {
    crt_aligned_free<C>(p);
    return nullptr;
  }
  const std::uint8_t tag = owner_tag(p);
  if (tag == 0 && current_mode() == Mode::host) {
    return g_crt[C].aligned_offset_realloc(p, size, alignment, offset);
  }
  const std::size_t old =
      tag != 0 ? arena::usable_size(p, tag) : g_crt[C].aligned_msize(p, alignment, offset);
  void* q = crt_aligned_offset_malloc<C>(size, alignment, offset);
  if (q == nullptr) return nullptr;
  std::memcpy(q, p, old < size ? old : size);
  crt_aligned_free<C>(p);
  return q;
}

template <int C>
void* crt_aligned_offset_recalloc(void* p, std::size_t count, std::size_t size,
                                  std::size_t alignment, std::size_t offset) noexcept {
  std::size_t total;
  if (__builtin_mul_overflow(count, size, &total)) return nomem();
  const std::uint8_t tag = owner_tag(p);
  std::size_t old = 0;
  if (p != nullptr) {
    old = tag != 0 ? arena::usable_size(p, tag) : g_crt[C].aligned_msize(p, alignment, offset);
  }
  return zero_tail<C>(crt_aligned_offset_realloc<C>(p, total, alignment, offset), old);
}

template <int C>
char* crt_strdup(const char* s) noexcept {
  if (s == nullptr) return nullptr;
  const std::size_t n = std::strlen(s) + 1;
  auto* p = static_cast<char*>(crt_malloc<C>(n));
  if (p != nullptr) std::memcpy(p, s, n);
  return p;
}

template <int C>
wchar_t* crt_wcsdup(const wchar_t* s) noexcept {
  if (s == nullptr) return nullptr;
  const std::size_t n = std::wcslen(s) + 1;
  auto* p = static_cast<wchar_t*>(crt_malloc<C>(n * sizeof(wchar_t)));
  if (p != nullptr) std::memcpy(p, s, n * sizeof(wchar_t));
  return p;
}

// ---- The table: every name, its slot in CrtHeap, ours per runtime.

template <class T>
void* erase(T fn) noexcept {
  return reinterpret_cast<void*>(fn);
}

#define MN_OURS(fn) \
  { erase(&fn<kMsvcrt>), erase(&fn<kUcrt>) }

struct Name {
  const char* name;
  std::size_t offset;  // of the CrtHeap member it fills; SIZE_MAX: none (an alias)
  void* ours[kCrtCount];
};

#define MN_SLOT(member) offsetof(CrtHeap, member)
constexpr std::size_t kAlias = SIZE_MAX;

const Name kNames[] = {
    {"malloc", MN_SLOT(malloc), MN_OURS(crt_malloc)},
    {"free", MN_SLOT(free), MN_OURS(crt_free)},
    {"calloc", MN_SLOT(calloc), MN_OURS(crt_calloc)},
    {"realloc", MN_SLOT(realloc), MN_OURS(crt_realloc)},
    {"_msize", MN_SLOT(msize), MN_OURS(crt_msize)},
    {"_expand", MN_SLOT(expand), MN_OURS(crt_expand)},
    {"_recalloc", MN_SLOT(recalloc), MN_OURS(crt_recalloc)},
    {"_aligned_malloc", MN_SLOT(aligned_malloc), MN_OURS(crt_aligned_malloc)},
    {"_aligned_free", MN_SLOT(aligned_free), MN_OURS(crt_aligned_free)},
    {"_aligned_realloc", MN_SLOT(aligned_realloc), MN_OURS(crt_aligned_realloc)},
    {"_aligned_recalloc", MN_SLOT(aligned_recalloc), MN_OURS(crt_aligned_recalloc)},
    {"_aligned_msize", MN_SLOT(aligned_msize), MN_OURS(crt_aligned_msize)},
    {"_aligned_offset_malloc", MN_SLOT(aligned_offset_malloc), MN_OURS(crt_aligned_offset_malloc)},
    {"_aligned_offset_realloc", MN_SLOT(aligned_offset_realloc),
     MN_OURS(crt_aligned_offset_realloc)},
    {"_aligned_offset_recalloc", MN_SLOT(aligned_offset_recalloc),
     MN_OURS(crt_aligned_offset_recalloc)},
    {"_strdup", MN_SLOT(strdup), MN_OURS(crt_strdup)},
    {"_wcsdup", MN_SLOT(wcsdup), MN_OURS(crt_wcsdup)},
    // ucrt's internal names for the same functions, exported too.
    {"_malloc_base", kAlias, MN_OURS(crt_malloc)},
    {"_free_base", kAlias, MN_OURS(crt_free)},
    {"_calloc_base", kAlias, MN_OURS(crt_calloc)},
    {"_realloc_base", kAlias, MN_OURS(crt_realloc)},
    {"_msize_base", kAlias, MN_OURS(crt_msize)},
    {"_expand_base", kAlias, MN_OURS(crt_expand)},
    {"_recalloc_base", kAlias, MN_OURS(crt_recalloc)},
};
constexpr std::size_t kNameCount = sizeof kNames / sizeof kNames[0];

// Appended under g_table_lock, read without it: entries are complete before
// the count that publishes them.
constinit Hook g_hooks[kCrtCount * kNameCount] = {};
constinit std::atomic<std::size_t> g_hook_count{0};
constinit std::atomic<bool> g_resolved[kCrtCount] = {};
constinit SRWLOCK g_table_lock = SRWLOCK_INIT;

}  // namespace

bool resolve_crt(int crt, void* module) noexcept {
  if (module == nullptr || g_resolved[crt].load(std::memory_order_acquire)) return false;
  AcquireSRWLockExclusive(&g_table_lock);
  bool done = false;
  if (!g_resolved[crt].load(std::memory_order_relaxed)) {
    CrtHeap& heap = g_crt[crt];
    std::size_t n = g_hook_count.load(std::memory_order_relaxed);
    for (const Name& name : kNames) {
      void* fn = reinterpret_cast<void*>(GetProcAddress(static_cast<HMODULE>(module), name.name));
      if (name.offset != kAlias) {
        std::memcpy(reinterpret_cast<char*>(&heap) + name.offset, &fn, sizeof fn);
      }
      if (fn != nullptr) g_hooks[n++] = Hook{name.name, fn, name.ours[crt]};
    }
    g_hook_count.store(n, std::memory_order_release);
    g_resolved[crt].store(true, std::memory_order_release);
    done = true;
  }
  ReleaseSRWLockExclusive(&g_table_lock);
  return done;
}

const Hook* hooks(std::size_t* count) noexcept {
  *count = g_hook_count.load(std::memory_order_acquire);
  return g_hooks;
}

void* replacement_for(const void* original) noexcept {
  std::size_t n = 0;
  const Hook* h = hooks(&n);
  for (std::size_t i = 0; i < n; ++i) {
    if (h[i].original == original) return h[i].replacement;
  }
  return nullptr;
}

// The arena's host heap (arena::HostHeap): the runtime of the call that
// reached the arena, so that the same runtime's free (or _aligned_free, for
// the aligned requests memalign serves) takes the block back.
void* host_heap_malloc(std::size_t size) {
  const CrtHeap& crt = g_crt[t_caller];
  return crt.malloc != nullptr ? crt.malloc(size) : nullptr;
}

void* host_heap_memalign(std::size_t alignment, std::size_t size) {
  const CrtHeap& crt = g_crt[t_caller];
  return crt.aligned_malloc != nullptr ? crt.aligned_malloc(size, alignment) : nullptr;
}

}  // namespace mnemosyne::win
