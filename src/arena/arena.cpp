#include "arena/arena.hpp"

#include <errno.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

#include <mimalloc-live.h>

#include "arena/retire.hpp"
#include "arena/segment_provider.hpp"
#include "arena/segment_table.hpp"
#include "arena/state.hpp"
#include "backend/counters.hpp"
#include "backend/driver_call.hpp"
#include "backend/loader.hpp"
#include "platform/platform.hpp"

namespace mnemosyne::arena {

constinit State g_state;

namespace {

// Requests this large get a segment of their own, given back on free. From
// backends whose arenas give back what mimalloc decommits (reservations:
// pinned, host), only the largest. From backends whose arenas the driver
// can only free whole (managed memory: madvise frees nothing there), a
// huge block freed would stay allocated until the process ends, so every
// block mimalloc would give a segment of its own (above 16 MiB, its
// MI_LARGE_OBJ_SIZE_MAX) is one driver allocation instead, freed with it
// (mimalloc never sees them: mnemosyne_mi_set_huge_limit). glibc's
// threshold for an mmap of its own is at most 32 MiB.
constexpr std::size_t kDedicatedLargest = std::size_t{1} << 30;
constexpr std::size_t kDedicatedHuge = (std::size_t{16} << 20) + 1;
// mimalloc 2.0.9 accepts 64 arenas per process; keep a few for the user.
constexpr int kMaxArenas = 60;
// How long a thread waits for another thread's growth that makes no
// progress before it serves the request from the host heap instead
// (deadlock insurance: the growing thread may wait inside the driver for a
// lock the waiting thread holds, when the program's own driver call
// mallocs). Progress is CPU time used by the grower or by the driver's own
// threads (the grower often waits inside the driver for a lock one of them
// holds while it works), or a driver call finished by any thread (200
// threads backing their first granules queue in the driver's locks ahead of
// the grower: over the double, under PIN=granule, waiters gave up while the
// grower waited its turn), however slowly a busy machine lets them run; none
// for kGrowStallNs is taken as stuck. kGrowWaitCapNs bounds the wait
// whatever they do.
constexpr std::uint64_t kGrowStallNs = std::uint64_t{2} * 1000000000u;
constexpr std::uint64_t kGrowWaitCapNs = std::uint64_t{60} * 1000000000u;
constexpr std::uint64_t kGrowPollNs = 100 * 1000 * 1000;
constexpr std::size_t kMaxArenaSize = std::size_t{1} << 40;

void warn(const char* line) noexcept {
  if (g_state.cfg.warn != nullptr) g_state.cfg.warn(line);
}

// `counter`: host_fallbacks or driver_allocations.
void* host_alloc(std::size_t size, std::size_t alignment, bool zero,
                 std::atomic<std::uint64_t>& counter) noexcept {
  const HostHeap& h = g_state.cfg.host;
  if (h.malloc == nullptr) return nullptr;
  counter.fetch_add(1, std::memory_order_relaxed);
  void* p = alignment != 0 ? h.memalign(alignment, size) : h.malloc(size);
  if (p != nullptr && zero) std::memset(p, 0, size);
  return p;
}

// The allocation slow path's share in a fork's driver gate. glibc's fork()
// runs the driver's atfork prepare handler, which may hold the driver's
// locks until the fork is over, and then waits for the stdio list's lock
// (fork.cpp): a thread holding that lock may wait for a FILE's lock, whose
// holder may be in malloc, growing the heap through the driver. Once a
// fork() has closed the gate, the slow path serves from the host heap
// instead (as an allocation inside a driver call is), and the fork waits,
// before any atfork handler runs, for the threads already past the check:
// those need nothing the forking thread holds (it holds only the fork lock
// then), so they finish. A thread in the slow path counts itself (here and
// in State::slow_paths) before it reads the gate, and the fork closes the
// gate before it reads the count: one of the two sees the other.
// Initial-exec TLS on Linux: a preloaded library has it, and it never
// allocates.
#if defined(_WIN32)
constinit thread_local int t_slow_paths = 0;
#else
__attribute__((tls_model("initial-exec"))) constinit thread_local int t_slow_paths = 0;
#endif

// This thread's growth gave way to a fork (lock_grow): its request is served
// from the host heap, without the warning of a refused growth, even if the
// fork is over by then.
#if defined(_WIN32)
constinit thread_local bool t_gave_way = false;
#else
__attribute__((tls_model("initial-exec"))) constinit thread_local bool t_gave_way = false;
#endif

class SlowPath {
 public:
  SlowPath() noexcept {
    ++t_slow_paths;
    g_state.slow_paths.fetch_add(1, std::memory_order_seq_cst);
  }
  ~SlowPath() {
    g_state.slow_paths.fetch_sub(1, std::memory_order_seq_cst);
    --t_slow_paths;
  }
  SlowPath(const SlowPath&) = delete;
  SlowPath& operator=(const SlowPath&) = delete;
};

bool fork_gate_closed() noexcept {
  return g_state.fork_gate.load(std::memory_order_seq_cst);
}

// Dedicated segments of a CUDA backend freed while the gate was closed: the
// free returns at once, and the forking thread gives them back once the
// fork is over (open_fork_gate). Fixed room, no allocation: past it a
// segment is given back at once, as before the gate.
constexpr std::size_t kDeferredMax = 64;
constinit Segment g_deferred[kDeferredMax] = {};
constinit std::size_t g_deferred_count = 0;  // under g_deferred_lock
constinit SpinLock g_deferred_lock;

bool defer_release(const Segment& seg) noexcept {
  SpinGuard guard(g_deferred_lock);
  if (g_deferred_count == kDeferredMax) return false;
  g_deferred[g_deferred_count++] = seg;
  return true;
}

void* mi_retry(std::size_t size, std::size_t alignment, bool zero) noexcept {
  if (alignment != 0) {
    return zero ? mi_zalloc_aligned_at(size, alignment, 0)
                : mi_malloc_aligned_at(size, alignment, 0);
  }
  return zero ? mi_zalloc(size) : mi_malloc(size);
}

// True when `bytes` more may be taken from `backend` under the limit.
bool within_limit(BackendId backend, std::size_t bytes) noexcept {
  const std::size_t limit = g_state.cfg.limit;
  if (limit == 0 || !is_cuda_backend(backend)) return true;
  const std::uint64_t used = g_state.backend_bytes.load(std::memory_order_relaxed);
  return used <= limit && bytes <= limit - used;
}

// Why `backend` refused a segment of `bytes`, in one clause.
void describe_refusal(BackendId backend, std::size_t bytes, char* why,
                      std::size_t why_len) noexcept {
  char detail[200];
  describe_last_failure(backend, detail, sizeof detail);
  if (is_cuda_backend(backend) && driver_state() != DriverState::ready) {
    std::snprintf(why, why_len, "the CUDA driver is unavailable: %.470s", driver_info().reason);
  } else if (detail[0] != '\0') {
    std::snprintf(why, why_len, "%s", detail);
  } else {
    std::snprintf(why, why_len, "the %s backend could not allocate %zu MiB", backend_name(backend),
                  bytes >> 20);
  }
}

// Whether the segment's fresh memory reads zero, MNEMOSYNE_ZEROED applied.
bool reads_zero_given(bool backend_says) noexcept {
  switch (g_state.cfg.zeroed) {
    case Zeroed::yes:
      return true;
    case Zeroed::no:
      return false;
    case Zeroed::automatic:
      break;
  }
  return backend_says;
}

bool reads_zero(const Segment& seg) noexcept {
  return reads_zero_given(seg.fresh_zero);
}

// mimalloc clears a huge calloc block that is not known zero with this
// (mimalloc-huge-calloc.patch): the way its backend clears memory, which for
// managed memory is the device, so no page of the block enters host RAM.
void clear_huge_block(void* p, std::size_t size) noexcept {
  clear_memory(owner_backend(owner_tag(p)), p, size);
}

bool arena_added_locked(BackendId backend, const Segment& seg) noexcept;

// Puts a new arena into the segment table and its chunks into the ownership
// map, tagged with the free route of the moment, under the table's lock:
// set_free_route changes the route and walks the table under the same lock,
// so an arena is either entered after a change (and takes the new route) or
// found by the change's walk. False when the table is full.
bool enter_arena(const Segment& seg, std::uint8_t tag) noexcept {
  SpinGuard guard(g_state.table.lock());
  if (!g_state.table.add_locked(seg, /*dedicated=*/false)) return false;
  const std::uint8_t route = g_state.free_route.load(std::memory_order_relaxed);
  owner_map_set(seg.start, seg.size, static_cast<std::uint8_t>(tag | route));
  return true;
}

// Whether arenas of `backend` are reservations, backed where mimalloc
// commits (host; pinned under MNEMOSYNE_PIN=granule), rather than memory
// the backend commits whole (managed memory; pinned by default). A
// registration is one range to the driver, which refuses cuMemcpy* of a
// block spanning two (CUDA_ERROR_INVALID_VALUE, measured on an H200 with
// 1 MiB granules: scripts/gpu-check.sh, "pinned copies"): pinned arenas are
// locked whole unless the user trades that for the smaller footprint.
bool arenas_reserve(BackendId backend) noexcept {
  return with_backend(backend, []<MemoryBackend B>() {
    if constexpr (B::commits_on_demand) {
      return B::reserves_arenas();
    } else {
      return false;
    }
  });
}

// Memory of the size of a retired arena (retire.cpp), from a backend whose
// arenas are committed, put in place of that arena; the caller holds
// grow_lock and has entered nothing yet. False when none fits or the backend
// refused: the caller adds an arena as usual.
bool revive_arena_locked(BackendId backend, std::size_t need, std::size_t want,
                         Segment* out) noexcept {
  if (g_state.retired_count == 0 || arenas_reserve(backend)) return false;
  std::size_t size = 0;
  const int slot = pick_retired_locked(need, want, &size);
  if (slot == 0 || !within_limit(backend, size + kSegmentAlign)) return false;
  Segment seg;
  if (!acquire_segment(backend, size, kSegmentAlign, Reserve::no, &seg)) return false;
  if (seg.on_demand || seg.size != size || !enter_arena(seg, owner_entry(kOwnerArena, backend))) {
    release_segment(seg);
    return false;
  }
  if (!mnemosyne_mi_arena_revive(slot, seg.start, seg.size, reads_zero(seg))) {
    Segment removed;
    g_state.table.remove(seg.start, /*dedicated=*/false, &removed);
    release_segment(seg);
    return false;
  }
  revived_locked(slot);
  *out = seg;
  return true;
}

// Adds an arena of at least `min_bytes`; the caller holds grow_lock.
bool add_arena_locked(std::size_t min_bytes, char* why, std::size_t why_len) noexcept {
  const BackendId backend = g_state.backend.load(std::memory_order_relaxed);
  // A huge object needs its blocks contiguous in one arena, plus the
  // segment's own metadata: leave one 32 MiB block of room.
  const std::size_t need = round_up(min_bytes, kSegmentAlign) + kSegmentAlign;
  std::size_t want = std::max(g_state.next_arena_size, need);
  Segment seg;
  if (revive_arena_locked(backend, need, want, &seg)) return arena_added_locked(backend, seg);
  if (g_state.arenas >= kMaxArenas) {
    std::snprintf(why, why_len, "mimalloc's arena table is full (%d arenas)", g_state.arenas);
    return false;
  }
  const std::size_t slack = kSegmentAlign;  // what the provider adds for alignment
  if (!within_limit(backend, want + slack)) {
    const std::size_t room = g_state.cfg.limit - g_state.backend_bytes.load();
    want = room > slack ? (room - slack) / kSegmentAlign * kSegmentAlign : 0;
    if (want < need) {
      std::snprintf(why, why_len, "the limit of %zu bytes is reached", g_state.cfg.limit);
      return false;
    }
  }
  // A backend that refuses the geometric size may still have room for a
  // smaller arena (managed memory near the device's capacity, pinned memory
  // under the locked-memory limit): halve down to what the request needs.
  const Reserve reserve = arenas_reserve(backend) ? Reserve::if_possible : Reserve::no;
  bool got = acquire_segment(backend, want, kSegmentAlign, reserve, &seg);
  while (!got && want > need) {
    want = std::max(need, want / 2 / kSegmentAlign * kSegmentAlign);
    got = acquire_segment(backend, want, kSegmentAlign, reserve, &seg);
  }
  if (!got) {
    describe_refusal(backend, want, why, why_len);
    return false;
  }
  // Into the table (which a fork's copy walks) and the ownership map before
  // mimalloc can hand out a block of it.
  if (!enter_arena(
          seg, owner_entry(seg.on_demand ? kOwnerArena | kOwnerOnDemand : kOwnerArena, backend))) {
    release_segment(seg);
    std::snprintf(why, why_len, "mnemosyne's segment table is full (%zu segments)",
                  SegmentTable::kCapacity);
    return false;
  }
  // Memory not known zero is declared so: mimalloc then clears the
  // metadata of each segment it carves from it (its arena.c, as patched by
  // subprojects/mimalloc/patches/mimalloc-arena-is-zero.patch) and zeroes calloc's
  // blocks (huge ones with clear_huge_block). Memory known zero spares a
  // huge calloc block on never-used memory any clearing
  // (mimalloc-huge-calloc.patch). A reservation is declared uncommitted:
  // mimalloc then commits what it uses, through commit_range, and decommits
  // what it frees after its purge delay.
  if (!mi_manage_os_memory_ex(seg.start, seg.size, /*is_committed=*/!seg.on_demand,
                              /*is_large=*/false, reads_zero(seg), /*numa_node=*/-1,
                              /*exclusive=*/false, nullptr)) {
    Segment removed;
    g_state.table.remove(seg.start, /*dedicated=*/false, &removed);
    release_segment(seg);
    std::snprintf(why, why_len, "mimalloc refused a new arena");
    return false;
  }
  g_state.arenas++;
  return arena_added_locked(backend, seg);
}

// The bookkeeping of an arena added or revived; true.
bool arena_added_locked(BackendId backend, const Segment& seg) noexcept {
  if (g_state.first_arena.load(std::memory_order_relaxed) == nullptr) {
    g_state.first_arena.store(seg.start, std::memory_order_relaxed);
  }
  // By backend, not by arena: under MNEMOSYNE_PIN=granule, pinned arenas
  // from cuMemHostAlloc (where the driver would not register memory) are
  // not given back either, but a block of their own would lock up to 32 MiB
  // of alignment slack. Arenas committed whole give huge blocks their own
  // driver allocation, freed with them (pinned: slack locked included).
  const bool gives_back = arenas_reserve(backend);
  g_state.dedicated_threshold.store(gives_back ? kDedicatedLargest : kDedicatedHuge,
                                    std::memory_order_relaxed);
  mnemosyne_mi_set_huge_limit(gives_back ? 0 : kDedicatedHuge);
  g_state.backend_bytes.fetch_add(is_cuda_backend(backend) ? seg.raw_size : 0);
  g_state.reserved[static_cast<int>(backend)].fetch_add(seg.raw_size, std::memory_order_relaxed);
  g_state.total_arena_bytes += seg.size;
  // Geometric growth: each arena as large as all before it together, so the
  // 64-arena cap is never what stops a process before its backend is full.
  g_state.next_arena_size = std::min(g_state.total_arena_bytes, kMaxArenaSize);
  g_state.generation.fetch_add(1, std::memory_order_release);
  return true;
}

bool lock_grow() noexcept {
  const std::uint64_t start = Os::monotonic_ns();
  std::uint64_t progress_at = start;
  long grower = -1;
  std::uint64_t work = 0;  // CPU ns of the grower and the driver's threads, driver calls
  for (;;) {
    if (g_state.grow_lock.lock_within(kGrowPollNs)) {
      g_state.grower.store(Os::thread_id(), std::memory_order_relaxed);
      return true;
    }
    // A fork waits for this thread to leave the slow path; the grower may be
    // the forking thread itself (its signal handler forks).
    if (fork_gate_closed()) {
      t_gave_way = true;
      return false;
    }
    const std::uint64_t now = Os::monotonic_ns();
    const long holder = g_state.grower.load(std::memory_order_relaxed);
    const std::uint64_t done = (holder >= 0 ? Os::thread_cpu_ns(holder) : 0) +
                               driver_threads_cpu_ns() + driver_calls_done();
    if (holder != grower || done != work) {  // another grower, or work was done
      grower = holder;
      work = done;
      progress_at = now;
    }
    if (now - progress_at >= kGrowStallNs || now - start >= kGrowWaitCapNs) break;
  }
  g_state.grow_waits_timed_out.fetch_add(1, std::memory_order_relaxed);
  return false;
}

// Grows unless another thread did since `seen`. False when nothing was added
// and nothing will be: the caller falls back.
bool grow(std::size_t min_bytes, std::uint32_t seen) noexcept {
  if (g_state.exhausted.load(std::memory_order_acquire)) return false;
  if (!lock_grow()) return false;
  bool ok = true;
  if (g_state.generation.load(std::memory_order_acquire) == seen) {
    char why[kReasonLen];
    ok = add_arena_locked(min_bytes, why, sizeof why);
    if (!ok) {
      // The backend said no: stop asking it (each attempt is a driver call).
      g_state.exhausted.store(true, std::memory_order_release);
      std::snprintf(g_state.exhausted_reason, sizeof g_state.exhausted_reason, "%s", why);
    }
  }
  g_state.grow_lock.unlock();
  // Arenas the backend frees only whole are given back when unused: a thread
  // does that, started here, outside mimalloc and the lock.
  if (ok) start_retiring();
  return ok;
}

// The backend could not serve this request. With the host fallback the host
// heap serves it, and the first time that happens one line says why.
void* fallback(std::size_t size, std::size_t alignment, bool zero, const char* why) noexcept {
  if (g_state.cfg.fallback == Fallback::fail) return nullptr;
  void* p = host_alloc(size, alignment, zero, g_state.host_fallbacks);
  if (p != nullptr && !g_state.warned_fallback.exchange(true)) {
    std::snprintf(g_state.fallback_reason, sizeof g_state.fallback_reason, "%s", why);
    char line[kReasonLen + 128];
    std::snprintf(line, sizeof line,
                  "mnemosyne: the %s backend could not serve a request (%s); "
                  "such requests now use host memory",
                  backend_name(g_state.backend.load()), why);
    warn(line);
  }
  return p;
}

// Raises `peak` to `value` if it is less.
void raise_to(std::atomic<std::uint64_t>& peak, std::uint64_t value) noexcept {
  std::uint64_t seen = peak.load(std::memory_order_relaxed);
  while (seen < value && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

// Counts `added` usable bytes more (or fewer) of dedicated blocks.
void count_dedicated_bytes(std::int64_t added) noexcept {
  const std::uint64_t now = g_state.dedicated_bytes.fetch_add(static_cast<std::uint64_t>(added),
                                                              std::memory_order_relaxed) +
                            static_cast<std::uint64_t>(added);
  if (added > 0) raise_to(g_state.dedicated_bytes_peak, now);
}

// Puts a dedicated segment in the table, the ownership map (`entry`) and the
// counts; false (the segment given back) when the table is full.
bool add_dedicated(const Segment& seg, std::uint8_t entry) noexcept {
  owner_map_set(seg.start, seg.capacity != 0 ? seg.capacity : seg.size, entry);
  if (!g_state.table.add(seg, /*dedicated=*/true)) {
    release_segment(seg);
    return false;
  }
  if (is_cuda_backend(seg.backend)) g_state.backend_bytes.fetch_add(seg.raw_size);
  g_state.reserved[static_cast<int>(seg.backend)].fetch_add(seg.raw_size,
                                                            std::memory_order_relaxed);
  raise_to(g_state.dedicated_peak,
           g_state.dedicated_live.fetch_add(1, std::memory_order_relaxed) + 1);
  g_state.dedicated_total.fetch_add(1, std::memory_order_relaxed);
  count_dedicated_bytes(static_cast<std::int64_t>(seg.size));
  return true;
}

// A block with a segment of its own; null with `why` set when there is none.
void* alloc_dedicated(std::size_t size, std::size_t alignment, bool zero, char* why,
                      std::size_t why_len) noexcept {
  if (g_state.exhausted.load(std::memory_order_acquire)) {
    std::snprintf(why, why_len, "%s", g_state.exhausted_reason);
    return nullptr;
  }
  const BackendId backend = g_state.backend.load(std::memory_order_relaxed);
  const std::size_t align = std::max(alignment, kSegmentAlign);
  const std::size_t rounded = round_up(size, kSegmentAlign);
  // Larger than the address space the ownership map describes: no backend
  // call can succeed, so none is made.
  constexpr std::size_t kAddressSpace = std::size_t{1} << kAddressBits;
  if (rounded < size || rounded > kAddressSpace || align > kAddressSpace) {
    std::snprintf(why, why_len, "%zu bytes aligned to %zu exceed the address space", size,
                  alignment);
    return nullptr;
  }
  if (!within_limit(backend, rounded + align)) {
    std::snprintf(why, why_len, "the limit of %zu bytes is reached", g_state.cfg.limit);
    return nullptr;
  }
  Segment seg;
  if (!acquire_segment(backend, rounded, align, Reserve::no, &seg)) {
    describe_refusal(backend, rounded, why, why_len);
    return nullptr;
  }
  if (!add_dedicated(seg, owner_entry(kOwnerDedicated, backend))) {
    std::snprintf(why, why_len, "mnemosyne's segment table is full (%zu segments)",
                  SegmentTable::kCapacity);
    return nullptr;
  }
  if (zero && !reads_zero(seg)) clear_memory(backend, seg.start, size);
  return seg.start;
}

// A growable block of `size` bytes (a realloc growing a block to
// kGrowableMin or more), with room to grow in place (realloc_in_place), as
// glibc's mremap grows its mmapped chunks without a copy. Null when the
// backend has no room to give that costs nothing until used, or refused:
// the caller allocates as usual. Room (4 times the size, at least 1 GiB)
// costs nothing where arenas are reservations (address space) and in
// managed memory (backed where touched); pinned arenas locked whole would
// lock it, and get none.
void* alloc_growable(std::size_t size) noexcept {
  if (g_state.exhausted.load(std::memory_order_acquire) || g_state.forked_child) return nullptr;
  const BackendId backend = g_state.backend.load(std::memory_order_relaxed);
  const bool reserve = arenas_reserve(backend);
  // Managed memory: each growable block is a driver allocation of its own,
  // as every block above 16 MiB already is; smaller ones stay in arenas.
  if (!reserve && (!backend_backs_where_touched(backend) || size < kDedicatedHuge)) {
    return nullptr;
  }
  constexpr std::size_t kMaxRoom = std::size_t{256} << 30;
  // Managed room is address space too, but the driver keeps a range for it:
  // at most 16 GiB more than the block.
  constexpr std::size_t kMaxManagedRoom = std::size_t{16} << 30;
  const std::size_t need = round_up(size, kSegmentAlign);
  if (need < size || need > kMaxRoom) return nullptr;
  std::size_t room = std::max(need * 4, std::size_t{1} << 30);
  if (!reserve) room = std::min(room, need + kMaxManagedRoom);
  room = std::min(room, need + kMaxRoom);
  // Less room where the limit or the backend would not give that much.
  while (room > need && !within_limit(backend, room + kSegmentAlign)) {
    room = std::max(need, room / 2 / kSegmentAlign * kSegmentAlign);
  }
  if (!within_limit(backend, room + kSegmentAlign)) return nullptr;
  Segment seg;
  bool got = acquire_growable(backend, size, room, reserve, &seg);
  while (!got && room > need) {
    room = std::max(need, room / 2 / kSegmentAlign * kSegmentAlign);
    got = acquire_growable(backend, size, room, reserve, &seg);
  }
  if (!got) return nullptr;
  const std::uint8_t kind = seg.on_demand ? kOwnerDedicated | kOwnerOnDemand : kOwnerDedicated;
  return add_dedicated(seg, owner_entry(kind, backend)) ? seg.start : nullptr;
}

// Resizes the growable block at `ptr` to `size` where it stands: commits
// what it grows by, gives back what it shrinks by. False when it is not a
// growable block, has not the room, or the backend would not back more;
// and below kGrowableMin, where the block goes back to the arena (a small
// block does not keep a reservation, or managed room, of its own).
bool realloc_in_place(void* ptr, std::size_t size) noexcept {
  Segment seg;
  if (size < kGrowableMin || g_state.forked_child || !g_state.table.find_dedicated(ptr, &seg) ||
      seg.capacity == 0) {
    return false;
  }
  const std::size_t want = round_up(size, Os::page_size());
  if (want < size || want > seg.capacity) return false;
  auto* start = static_cast<unsigned char*>(ptr);
  if (want > seg.size) {
    if (!commit_now(start + seg.size, want - seg.size)) return false;
    g_state.table.resize_dedicated(ptr, want);
  } else if (want < seg.size) {
    g_state.table.resize_dedicated(ptr, want);
    if (seg.on_demand) decommit_now(start + want, seg.size - want);
  }
  count_dedicated_bytes(static_cast<std::int64_t>(want) - static_cast<std::int64_t>(seg.size));
  return true;
}

}  // namespace

// mimalloc's OS layer asks the segment provider first (mimalloc-os-hooks.patch).
// A driver call may set errno; a successful malloc must not.
static int os_hook(void* start, std::size_t size, int op) {
  const int saved = errno;
  const int r = commit_range(start, size, op);
  errno = saved;
  return r;
}

// The walks of mimalloc-live.h ask before reading an arena block's header.
static int readable_hook(const void* start, std::size_t size) {
  return segment_readable(start, size) ? 1 : 0;
}

bool start(const Config& cfg, StartReport* report) noexcept {
  g_state.cfg = cfg;
  set_pinned_commit(cfg.pin);
  g_state.pid.store(Os::process_id(), std::memory_order_relaxed);
  // Every user byte comes from arenas this file adds; options a user could
  // set through MIMALLOC_* that would take OS memory behind the backend's
  // back, or release arena memory at exit, are forced off.
  mi_option_set(mi_option_limit_os_alloc, 1);
  mi_option_set(mi_option_reserve_os_memory, 0);
  mi_option_set(mi_option_reserve_huge_os_pages, 0);
  mi_option_set(mi_option_reserve_huge_os_pages_at, -1);
  mi_option_set(mi_option_large_os_pages, 0);
  mi_option_set(mi_option_page_reset, 0);
  mi_option_set(mi_option_destroy_on_exit, 0);
  // Segments of reserved memory commit what they use, as they use it (a
  // thread's first 64 bytes commit about 1 MiB of its segment, not 32):
  // committed arenas ignore this.
  mi_option_set(mi_option_eager_commit, 0);
  // A freed segment's commits go back at once: for reserved memory that
  // only marks its chunks unused (the backend gives a granule back after a
  // delay of its own, pinned_granules.cpp), for committed arenas it does
  // nothing.
  mi_option_set(mi_option_segment_decommit_delay, 0);
  // mimalloc decommits a freed span once decommit_delay (25 ms) has passed,
  // and only when a later free or allocation touches the same segment: a
  // program that frees its working set in one burst, then stops allocating,
  // keeps the last spans of each segment committed. Where a decommit costs
  // no system call and the backend waits before giving memory back anyway
  // (pinned: marked chunks, a granule unregistered a pass later), the delay
  // only strands memory. Measured on an H200 (scripts/gpu-check.sh: python3
  // frees 2 GiB of 1 MiB blocks): with it 823 MiB stayed page-locked 3 s
  // later, 287 MiB after 6 s; without it 88 MiB after 1 s.
  if (arenas_reserve(cfg.backend) && backend_defers_release(cfg.backend)) {
    mi_option_set(mi_option_decommit_delay, 0);
  }
  mnemosyne_mi_set_huge_clear(&clear_huge_block);
  mnemosyne_mi_set_os_hook(&os_hook);
  mnemosyne_mi_set_readable_hook(&readable_hook);
  install_retire_hook();
  mnemosyne_mi_load();

  report->requested = cfg.backend;
  g_state.backend.store(cfg.backend);
  g_state.next_arena_size = std::max(round_up(cfg.first_segment, kSegmentAlign), kSegmentAlign);
  char why[kReasonLen] = {};
  g_state.grow_lock.lock();
  g_state.grower.store(Os::thread_id(), std::memory_order_relaxed);
  bool ok = add_arena_locked(0, why, sizeof why);
  if (!ok && cfg.backend != BackendId::host) {
    std::snprintf(report->reason, sizeof report->reason, "%s", why);
    if (cfg.fallback == Fallback::fail) {
      // The user asked for failures rather than host memory: every request
      // the (empty) arena cannot serve now ends in NULL / ENOMEM.
      std::snprintf(g_state.exhausted_reason, sizeof g_state.exhausted_reason, "%s", why);
      g_state.exhausted.store(true);
      ok = true;
    } else {
      g_state.backend.store(BackendId::host);
      ok = add_arena_locked(0, why, sizeof why);
      if (!ok) {  // both failed: the report names the two reasons
        const std::size_t used = std::strlen(report->reason);
        std::snprintf(report->reason + used, sizeof report->reason - used,
                      "; the host fallback failed too: %s", why);
      }
    }
  }
  g_state.grow_lock.unlock();
  report->active = g_state.backend.load();
  return ok;
}

bool fresh_memory_reads_zero(BackendId backend) noexcept {
  return reads_zero_given(backend_fresh_zero(backend));
}

BackendId active_backend() noexcept {
  return g_state.backend.load(std::memory_order_relaxed);
}

void* alloc_slow(std::size_t size, std::size_t alignment, bool zero) noexcept {
  // A size no allocator serves: glibc refuses any above PTRDIFF_MAX, and no
  // mapping is larger than the address space a process is given without
  // asking (x86-64: 2^47 bytes; the kernel maps above only for a hint
  // above). No reason to build, no growth, no fallback to try, no system
  // call: the caller sets ENOMEM, at less than glibc's cost.
  constexpr std::size_t kAddressSpace = std::size_t{1} << kAddressBits;
  if (size >= kAddressSpace - alignment) return nullptr;
  const int saved_errno = errno;
  // The driver is calling malloc (inside a call of ours, or on a thread it
  // started during one): asking it for memory now could deadlock.
  if (in_driver_call()) return host_alloc(size, alignment, zero, g_state.driver_allocations);
  // The process is being torn down (Os::process_exiting): no driver call.
  if (Os::process_exiting()) return host_alloc(size, alignment, zero, g_state.driver_allocations);
  // A vfork child (or a clone sharing our memory) runs in the parent's
  // address space with the parent's heap: it may not call the driver, and
  // what it allocates before exec is short-lived. Served quietly from the
  // host heap (the growth and backing below would call the driver).
  if (Os::process_id() != g_state.pid.load(std::memory_order_relaxed)) {
    return host_alloc(size, alignment, zero, g_state.driver_allocations);
  }
  // A fork is under way: no driver call until it is over (SlowPath).
  const SlowPath in_slow_path;
  if (fork_gate_closed()) return host_alloc(size, alignment, zero, g_state.driver_allocations);
  t_gave_way = false;

  void* p = nullptr;
  const char* why = g_state.exhausted_reason;
  char dedicated_why[kReasonLen] = {};
  // An aligned request asks mimalloc for size + alignment - 1 bytes.
  const std::size_t asked = alignment != 0 ? size + alignment - 1 : size;
  if (alignment > kMaxArenaAlign ||
      asked >= g_state.dedicated_threshold.load(std::memory_order_relaxed)) {
    p = alloc_dedicated(size, alignment, zero, dedicated_why, sizeof dedicated_why);
    why = dedicated_why;
  } else {
    // Retry for as long as the arena grows: other threads may take the room
    // each growth adds before this one gets to it, but each arena is as large
    // as all before it, and their number is capped (kMaxArenas), so this
    // ends. It stops early only when the backend said no, or when the wait
    // for another thread's growth timed out.
    //
    // mimalloc may also stop at memory the backend has reserved but not
    // backed yet (it cannot call the driver from inside mimalloc): the range
    // it tried first is backed here and asked again, for as long as backing
    // succeeds. mimalloc, asked again, tries that range first again; another
    // thread may take it meanwhile, which is progress too, so no thread goes
    // to the host heap because others were faster. A backend that refuses
    // (the driver would not page-lock more) would refuse a larger arena the
    // same way.
    // A failed commit left from an earlier allocation is not backed: mimalloc
    // tries its ranges in turn, and one that failed before the range that
    // served is stale. Backing it here locked memory nothing used (a realloc
    // growing to 1.5 GiB held twice its size, 4.3 GiB resident on an H200).
    forget_pending();
    BackedRange backed;
    Backing backing = Backing::none;
    for (;;) {
      const std::uint32_t seen = g_state.generation.load(std::memory_order_acquire);
      p = mi_retry(size, alignment, zero);
      end_backed(&backed);
      if (p != nullptr) break;
      backing = back_pending(&backed);
      if (backing == Backing::backed) continue;
      if (backing == Backing::refused || !grow(size + alignment, seen)) break;
    }
    const bool refused = backing == Backing::refused;
    if (refused) {
      describe_refusal(g_state.backend.load(std::memory_order_relaxed), size, dedicated_why,
                       sizeof dedicated_why);
      why = dedicated_why;
    } else if (p == nullptr && !g_state.exhausted.load()) {
      why = "another thread's arena growth did not finish in time";
    }
  }
  // The growth gave way to a fork (lock_grow): not the backend's refusal.
  if (p == nullptr && (t_gave_way || fork_gate_closed())) {
    p = host_alloc(size, alignment, zero, g_state.driver_allocations);
  }
  if (p == nullptr) p = fallback(size, alignment, zero, why);
#if !defined(_WIN32)
  // The heap grew: past 256 MiB, a fork's copy gets threads of its own.
  start_fork_copy_helpers();
#endif
  if (p != nullptr) errno = saved_errno;
  return p;
}

void close_fork_gate() noexcept {
  g_state.fork_gate.store(true, std::memory_order_seq_cst);
  // Less this thread's own: a signal handler that forks may have
  // interrupted it in the slow path.
  for (std::size_t spins = 0; g_state.slow_paths.load(std::memory_order_seq_cst) > t_slow_paths;
       ++spins) {
    Os::pause(spins);
  }
}

void open_fork_gate() noexcept {
  g_state.fork_gate.store(false, std::memory_order_seq_cst);
  // What was freed meanwhile, and anything a free deferred just before this.
  for (;;) {
    Segment seg;
    {
      SpinGuard guard(g_deferred_lock);
      if (g_deferred_count == 0) break;
      seg = g_deferred[--g_deferred_count];
    }
    release_segment(seg);
  }
}

void open_fork_gate_in_child() noexcept {
  g_state.slow_paths.store(t_slow_paths, std::memory_order_relaxed);  // the only thread here
  g_state.fork_gate.store(false, std::memory_order_relaxed);
  // The parent's segments: none of them is mapped here (or each is a copy
  // the child keeps, like every segment it inherited).
  g_deferred_count = 0;
  g_deferred_lock.reset();
}

std::size_t dedicated_threshold() noexcept {
  return g_state.dedicated_threshold.load(std::memory_order_relaxed);
}

void free_dedicated(void* ptr) noexcept {
  Segment seg;
  if (!g_state.table.remove(ptr, /*dedicated=*/true, &seg)) return;  // not a block start: ignore
  g_state.dedicated_live.fetch_sub(1, std::memory_order_relaxed);
  count_dedicated_bytes(-static_cast<std::int64_t>(seg.size));
  if (is_cuda_backend(seg.backend)) g_state.backend_bytes.fetch_sub(seg.raw_size);
  g_state.reserved[static_cast<int>(seg.backend)].fetch_sub(seg.raw_size,
                                                            std::memory_order_relaxed);
  // Giving driver memory back is a driver call: not while a fork is under
  // way (see SlowPath).
  const SlowPath in_slow_path;
  if (is_cuda_backend(seg.backend) && fork_gate_closed() && defer_release(seg)) {
    // No longer a block of ours (a second free of it is ignored), though
    // its memory stays the driver's until the fork is over.
    owner_map_set(seg.start, seg.capacity != 0 ? seg.capacity : seg.size, 0);
    return;
  }
  release_segment(seg);
}

std::size_t dedicated_size(const void* ptr) noexcept {
  return g_state.table.dedicated_size(ptr);
}

// Copies `size` bytes of the block at `src` (owner tag `src_tag`), about to
// be freed, to `dst`. A dedicated block of managed memory is discarded part
// by part as it is copied (what a part held is gone; the block is freed
// next), so that a growing block that moves is not resident twice: the
// move of a 1 GiB block held 2 GiB at once.
void move_contents(void* dst, void* src, std::uint8_t src_tag, std::size_t size) noexcept {
  constexpr std::size_t kPart = std::size_t{64} << 20;
  const BackendId backend = owner_backend(src_tag);
  // Discarding is a driver call: not while a fork is under way (SlowPath).
  const SlowPath in_slow_path;
  bool discard = (src_tag & kOwnerDedicated) != 0 && backend_backs_where_touched(backend) &&
                 !fork_gate_closed();
  auto* to = static_cast<unsigned char*>(dst);
  auto* from = static_cast<unsigned char*>(src);
  for (std::size_t off = 0; off < size; off += kPart) {
    const std::size_t n = std::min(kPart, size - off);
    std::memcpy(to + off, from + off, n);
    if (discard && n == kPart) discard = discard_memory(backend, from + off, n);
  }
}

void* realloc_slow(void* ptr, std::uint8_t tag, std::size_t size) noexcept {
  const std::size_t old_size = usable_size(ptr, tag);
  // Growing or shrinking in place, and a growable block, are driver calls:
  // not while a fork is under way (see SlowPath). The block moves instead
  // (alloc serves it from the host heap then).
  bool driver = true;
  {
    const SlowPath in_slow_path;
    driver = !fork_gate_closed();
    if (driver && (tag & kOwnerDedicated) != 0 && realloc_in_place(ptr, size)) return ptr;
  }
  if ((tag & kOwnerDedicated) != 0 && size <= old_size && size > old_size / 2) return ptr;
  void* p = nullptr;
  if (driver && size > old_size && size >= kGrowableMin) {
    const SlowPath in_slow_path;
    if (!fork_gate_closed()) p = alloc_growable(size);
  }
  if (p == nullptr) p = alloc(size);
  if (p == nullptr) return nullptr;
  move_contents(p, ptr, tag, std::min(old_size, size));
  free(ptr, tag);
  return p;
}

const char* fallback_reason() noexcept {
  return g_state.fallback_reason;
}

void set_free_route(std::uint8_t route) noexcept {
  SpinGuard guard(g_state.table.lock());  // see enter_arena
  g_state.free_route.store(route, std::memory_order_relaxed);
  const SegmentTable::Entry* entries = g_state.table.entries();
  for (std::size_t i = 0; i < g_state.table.high_water(); ++i) {
    const SegmentTable::Entry& e = entries[i];
    if (e.used && !e.dedicated) owner_map_set_route(e.segment.start, e.segment.size, route);
  }
}

void stats(Stats* out) noexcept {
  out->segments = static_cast<std::uint64_t>(g_state.arenas) -
                  g_state.arenas_retired.load(std::memory_order_relaxed);
  out->dedicated_live = g_state.dedicated_live.load(std::memory_order_relaxed);
  out->dedicated_total = g_state.dedicated_total.load(std::memory_order_relaxed);
  for (int i = 0; i < kBackendCount; ++i) {
    out->bytes_reserved[i] = g_state.reserved[i].load(std::memory_order_relaxed);
  }
  out->host_fallbacks = g_state.host_fallbacks.load(std::memory_order_relaxed);
  out->driver_allocations = g_state.driver_allocations.load(std::memory_order_relaxed);
  out->grow_waits_timed_out = g_state.grow_waits_timed_out.load(std::memory_order_relaxed);
  out->fork_bytes_copied = g_state.fork_bytes_copied.load(std::memory_order_relaxed);
  out->fork_bytes_via_driver = g_state.fork_bytes_via_driver.load(std::memory_order_relaxed);
  out->fork_copy_workers = g_state.fork_copy_workers.load(std::memory_order_relaxed);
  out->forked_child = g_state.forked_child;
}

void usage(Usage* out) noexcept {
  *out = Usage{};
  SpinGuard guard(g_state.table.lock());
  // The walks read segment headers: nothing they may read is given back
  // meanwhile (pinned granules under PIN=vmm).
  hold_backing(true);
  const SegmentTable::Entry* entries = g_state.table.entries();
  for (std::size_t i = 0; i < g_state.table.high_water(); ++i) {
    const SegmentTable::Entry& e = entries[i];
    if (!e.used) continue;
    if (e.dedicated) {
      out->dedicated_blocks += 1;
      out->dedicated_in_use += e.segment.size;
      // A growable block in a reservation holds what is committed of it.
      out->dedicated_held += e.segment.on_demand ? e.segment.size : e.segment.raw_size;
    } else {
      out->arena_held += e.segment.raw_size;
      out->arena_in_use += mnemosyne_mi_arena_in_use(e.segment.start);
    }
  }
  hold_backing(false);
  out->dedicated_max_blocks = g_state.dedicated_peak.load(std::memory_order_relaxed);
  out->dedicated_max_bytes = g_state.dedicated_bytes_peak.load(std::memory_order_relaxed);
}

}  // namespace mnemosyne::arena
