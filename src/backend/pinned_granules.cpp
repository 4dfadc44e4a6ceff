// Page-locked host memory committed on demand: CudaHostPinned's reserve,
// commit, decommit and release.
//
// cuMemHostAlloc locks all it returns, at once: a mimalloc segment per thread
// (32 MiB) was 32 MiB of locked RAM for a thread that holds 64 bytes. Here a
// reservation is anonymous memory of our own, and only what mimalloc commits
// is page-locked and mapped for the device, by cuMemHostRegister(DEVICEMAP |
// PORTABLE), one granule (kGranule, aligned to its size) at a time: a
// registration can only be undone whole, so the granule is the unit that can
// be given back. mimalloc commits and decommits in 64 KiB chunks (its
// MI_COMMIT_SIZE); which chunks of a granule are committed is tracked so
// that a granule none of them uses can be given back.
//
// mimalloc commits from inside its allocation path, where the driver must
// not be called: the driver calls malloc, which would re-enter mimalloc
// mid-operation. So a commit there succeeds only on granules registered
// already (commit with may_call_driver false); otherwise it fails, mimalloc
// returns NULL, and the arena's slow path, outside mimalloc, registers the
// range (may_call_driver true) and asks again.
//
// The other route, the driver's virtual-memory API with host-located
// physical memory (cuMemCreate with CU_MEM_LOCATION_TYPE_HOST, CUDA 12.2 and
// later), needs a handle, a map and an access call per granule and a recent
// driver; registration needs one call and is in every driver since CUDA 4.
// A driver without it leaves reserve() null, and the arena falls back to
// cuMemHostAlloc.
//
// Giving back has the same constraint: mimalloc decommits from inside its
// free path. A decommit only marks chunks unused; a thread of mnemosyne's
// own (the give-back thread, started the first time a commit needs the
// driver, every asynchronous signal blocked) unregisters a granule that has
// stayed wholly unused for one pass (kPassNs) to the next, and gives its
// pages back to the OS. It sleeps while no granule is unused.
//
// Each granule's state is one atomic word: which chunks are committed,
// whether it is registered, or being (un)registered by a thread (busy),
// whether the last give-back pass saw it unused (idle), and whether the
// driver refused to unregister it (kept). No lock is held across a driver
// call that a malloc could wait for: the driver calls malloc, and a malloc
// may need a commit.
#include <atomic>
#include <cstdint>

#include "backend/backends.hpp"
#include "backend/counters.hpp"
#include "backend/driver_call.hpp"
#include "backend/internal.hpp"
#include "backend/loader.hpp"

namespace mnemosyne {
namespace {

constexpr std::size_t kGranule = CudaHostPinned::kGranule;
constexpr std::size_t kChunk = std::size_t{64} << 10;  // mimalloc's MI_COMMIT_SIZE
constexpr std::uint32_t kChunks = kGranule / kChunk;
static_assert(kChunks <= 16);
constexpr std::uint32_t kChunkBits = (std::uint32_t{1} << kChunks) - 1;
constexpr std::uint32_t kRegistered = std::uint32_t{1} << 16;
constexpr std::uint32_t kBusy = std::uint32_t{1} << 17;
constexpr std::uint32_t kIdle = std::uint32_t{1} << 18;
constexpr std::uint32_t kKept = std::uint32_t{1} << 19;
// A give-back pass marks the registered granules no chunk uses (idle) and
// unregisters those the pass before marked: a granule goes back between one
// and two passes after mimalloc stopped using it. mimalloc's own delay
// before it decommits a freed segment (segment_decommit_delay) is 500 ms,
// and set to 0 for arenas (arena.cpp): this delay takes its place.
constexpr std::uint64_t kPassNs = 500'000'000;
constexpr unsigned kRegisterFlags = CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE;

// One reservation. `base` is 0 for a free slot, 1 while a thread fills it.
struct Reservation {
  std::atomic<std::uintptr_t> base{0};
  std::size_t size = 0;
  std::uintptr_t first_granule = 0;  // address of the granule holding base
  std::atomic<std::uint32_t>* granules = nullptr;
  std::size_t state_bytes = 0;
};

// Reservations are arenas (at most 64, mimalloc's limit) and rare
// replacements: a fixed table, no allocation.
constexpr std::size_t kMaxReservations = 128;
constinit Reservation g_reservations[kMaxReservations];

// Bumped (and the give-back thread woken) when a registered granule becomes
// unused.
constinit std::atomic<std::uint32_t> g_idle_events{0};
// Whether the give-back thread sleeps on g_idle_events: a free that makes a
// granule idle wakes it (a system call) only then.
constinit std::atomic<bool> g_give_back_sleeping{false};
// The give-back thread: 0 not started, 1 started, -1 the OS refused.
constinit std::atomic<int> g_give_back_thread{0};
// A give-back pass and release() exclude each other: release unmaps the
// granule words a pass reads. Held across driver calls only by those two,
// neither of which a malloc waits for.
constinit std::atomic<bool> g_table_lock{false};

class TableGuard {
 public:
  TableGuard() noexcept {
    for (std::size_t spins = 0; g_table_lock.exchange(true, std::memory_order_acquire);) {
      Os::pause(spins++);
    }
  }
  ~TableGuard() { g_table_lock.store(false, std::memory_order_release); }
  TableGuard(const TableGuard&) = delete;
  TableGuard& operator=(const TableGuard&) = delete;
};

Reservation* find(std::uintptr_t p, std::size_t size) noexcept {
  for (Reservation& r : g_reservations) {
    const std::uintptr_t base = r.base.load(std::memory_order_acquire);
    if (base > 1 && p >= base && p - base <= r.size && size <= r.size - (p - base)) return &r;
  }
  return nullptr;
}

BackendCounters& counters() noexcept {
  return backend_counters(BackendId::pinned);
}

// The part of granule `g` (its address) inside the reservation.
void granule_span(const Reservation& r, std::uintptr_t g, std::uintptr_t* start,
                  std::size_t* size) noexcept {
  const std::uintptr_t base = r.base.load(std::memory_order_relaxed);
  const std::uintptr_t lo = g < base ? base : g;
  const std::uintptr_t hi = g + kGranule < base + r.size ? g + kGranule : base + r.size;
  *start = lo;
  *size = hi - lo;
}

// One driver call on [start, start + size): register or unregister.
bool driver_register(std::uintptr_t start, std::size_t size, bool lock) noexcept {
  const DriverApi* api = driver_api();
  // Inside a driver call on this thread (the driver is calling malloc),
  // calling it again could deadlock: the caller's commit fails instead.
  if (api == nullptr || in_driver_call()) return false;
  BackendCounters& c = counters();
  const std::uint64_t t0 = detail::monotonic_ns();
  bool ok = false;
  {
    DriverCall call;
    if (call.ok()) {
      count_event(c.driver_calls);
      void* p = reinterpret_cast<void*>(start);
      const CUresult rc =
          lock ? api->cuMemHostRegister(p, size, kRegisterFlags) : api->cuMemHostUnregister(p);
      ok = rc == CUDA_SUCCESS;
      if (!ok && lock) c.failed(kRegisterFailed, rc, size);
    }
    if (!ok) count_event(c.driver_failures);
  }
  count_event(c.driver_ns, detail::monotonic_ns() - t0);
  if (ok && lock) {
    count_event(c.bytes_allocated, size);
    count_event(c.bytes_live, size);
  } else if (ok) {
    c.bytes_live.fetch_sub(size, std::memory_order_relaxed);
  }
  return ok;
}

// Chunk bits of granule `g` that [lo, hi) touches (liberal) or covers
// wholly (conservative).
std::uint32_t chunk_bits(std::uintptr_t g, std::uintptr_t lo, std::uintptr_t hi,
                         bool liberal) noexcept {
  const std::uintptr_t a = lo < g ? g : lo;
  const std::uintptr_t b = hi > g + kGranule ? g + kGranule : hi;
  if (a >= b) return 0;
  std::uintptr_t first = (a - g) / kChunk;
  std::uintptr_t end = (b - g + kChunk - 1) / kChunk;
  if (!liberal) {
    first = (a - g + kChunk - 1) / kChunk;
    end = (b - g) / kChunk;
  }
  if (first >= end) return 0;
  return ((std::uint32_t{1} << end) - 1) & ~((std::uint32_t{1} << first) - 1);
}

std::atomic<std::uint32_t>& word(Reservation& r, std::uintptr_t g) noexcept {
  return r.granules[(g - r.first_granule) / kGranule];
}

// Marks `bits` of granule g uncommitted. The granule stays registered even
// when none of its chunks is committed: mimalloc decommits from inside its
// free and allocation paths, where the driver must not be called (it calls
// malloc and free, which would re-enter mimalloc mid-operation). The
// give-back thread is woken to unregister it later.
void drop_bits(Reservation& r, std::uintptr_t g, std::uint32_t bits) noexcept {
  const std::uint32_t before = word(r, g).fetch_and(~bits, std::memory_order_acq_rel);
  const std::uint32_t after = before & ~bits;
  if ((before & bits) != 0 && (after & (kChunkBits | kBusy | kKept)) == 0 &&
      (after & kRegistered) != 0) {
    // Both sequentially consistent, as the thread's store and load are: either
    // it sees this event before sleeping, or this sees it sleeping.
    g_idle_events.fetch_add(1, std::memory_order_seq_cst);
    if (g_give_back_sleeping.load(std::memory_order_seq_cst)) Os::wake_all(&g_idle_events);
  }
}

// Marks `bits` of granule g committed (none: only in use, no longer idle),
// registering it first when it is not and `may_call_driver`; false when it
// is not registered and cannot be now.
bool add_bits(Reservation& r, std::uintptr_t g, std::uint32_t bits, bool may_call_driver) noexcept {
  std::atomic<std::uint32_t>& w = word(r, g);
  std::uint32_t s = w.load(std::memory_order_acquire);
  for (std::size_t spins = 0;; s = w.load(std::memory_order_acquire)) {
    if ((s & kBusy) != 0) {
      // The driver, registering this granule for this thread, calls malloc:
      // that request goes to the host heap.
      if (in_driver_call()) return false;
      Os::pause(spins++);
      continue;
    }
    // A forked child (no driver) has its own copy of the memory: using it
    // needs no registration.
    if ((s & kRegistered) != 0 || driver_api() == nullptr) {
      if (w.compare_exchange_weak(s, (s & ~kIdle) | bits, std::memory_order_acq_rel)) return true;
      continue;
    }
    if (!may_call_driver) return false;
    if (!w.compare_exchange_weak(s, s | kBusy, std::memory_order_acq_rel)) continue;
    std::uintptr_t start = 0;
    std::size_t size = 0;
    granule_span(r, g, &start, &size);
    const bool ok = driver_register(start, size, /*lock=*/true);
    w.store(ok ? (s | bits | kRegistered) : s, std::memory_order_release);
    return ok;
  }
}

// Number of granule words of a reservation.
std::size_t granule_count(const Reservation& r) noexcept {
  const std::uintptr_t base = r.base.load(std::memory_order_relaxed);
  return (base + r.size - r.first_granule + kGranule - 1) / kGranule;
}

// One give-back pass over every reservation; true when it left a granule
// marked idle (the next pass may give it back).
bool give_back_pass() noexcept {
  bool marked = false;
  TableGuard guard;
  for (Reservation& r : g_reservations) {
    if (r.base.load(std::memory_order_acquire) <= 1) continue;
    const std::size_t count = granule_count(r);
    for (std::size_t i = 0; i < count; ++i) {
      std::atomic<std::uint32_t>& w = r.granules[i];
      std::uint32_t s = w.load(std::memory_order_acquire);
      if (s == kRegistered) {
        w.compare_exchange_strong(s, kRegistered | kIdle, std::memory_order_acq_rel);
        marked = true;  // either idle now, or in use again: looked at next pass
        continue;
      }
      if (s != (kRegistered | kIdle)) continue;
      if (!w.compare_exchange_strong(s, kRegistered | kBusy, std::memory_order_acq_rel)) {
        marked = true;
        continue;
      }
      std::uintptr_t start = 0;
      std::size_t size = 0;
      granule_span(r, r.first_granule + i * kGranule, &start, &size);
      // Refused (the granule stays registered): kept, never tried again.
      const bool ok = driver_register(start, size, /*lock=*/false);
      // Unlocked, the pages are still resident: their contents are dead (no
      // chunk is committed), so the OS takes them back, as mimalloc's own
      // decommit would (a registration later locks fresh pages).
      if (ok) Os::discard_pages(reinterpret_cast<void*>(start), size);
      w.store(ok ? 0 : (kRegistered | kKept), std::memory_order_release);
    }
  }
  return marked;
}

void give_back_thread(void*) {
  for (;;) {
    const std::uint32_t seen = g_idle_events.load(std::memory_order_acquire);
    if (!give_back_pass()) {
      g_give_back_sleeping.store(true, std::memory_order_seq_cst);
      if (g_idle_events.load(std::memory_order_seq_cst) == seen) {
        Os::wait_while_equal(&g_idle_events, seen);
      }
      g_give_back_sleeping.store(false, std::memory_order_relaxed);
    }
    Os::sleep_ns(kPassNs);
  }
}

}  // namespace

void CudaHostPinned::start_give_back() noexcept {
  if (g_give_back_thread.load(std::memory_order_relaxed) != 0) return;
  int expected = 0;
  if (!g_give_back_thread.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) return;
  // Refused: unused granules stay registered until their reservation goes.
  if (!Os::start_thread(&give_back_thread, nullptr)) g_give_back_thread.store(-1);
}

void* CudaHostPinned::reserve(std::size_t size) noexcept {
  const DriverApi* api = driver_api();
  if (size == 0 || api == nullptr || api->cuMemHostRegister == nullptr ||
      api->cuMemHostUnregister == nullptr) {
    return nullptr;
  }
  // Memory that no commit could back is no arena: without a usable device
  // (no context can be made current) reserve nothing, and the caller's
  // cuMemHostAlloc reports why, as for every other backend. Nor where the
  // device reaches registered memory only at an address of its own
  // (cuMemHostGetDevicePointer): a program hands a kernel the pointer
  // malloc gave it. CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM says which
  // (cuMemHostRegister's documentation); unknown counts as no.
  {
    DriverCall call;
    if (!call.ok()) {
      counters().failed(kContextFailed, call.error(), size);
      return nullptr;
    }
    int same_address = 0;
    if (api->cuDeviceGetAttribute == nullptr ||
        api->cuDeviceGetAttribute(&same_address,
                                  CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
                                  call.device()) != CUDA_SUCCESS ||
        same_address != 1) {
      return nullptr;
    }
  }
  Reservation* slot = nullptr;
  for (Reservation& r : g_reservations) {
    std::uintptr_t expected = 0;
    if (r.base.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
      slot = &r;
      break;
    }
  }
  if (slot == nullptr) return nullptr;
  int err = 0;
  void* p = Os::map_pages(size, &err);
  const auto base = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t first = base / kGranule * kGranule;
  const std::size_t count = (base + size - first + kGranule - 1) / kGranule;
  const std::size_t state_bytes =
      (count * sizeof(std::atomic<std::uint32_t>) + Os::page_size() - 1) / Os::page_size() *
      Os::page_size();
  void* state = p == nullptr ? nullptr : Os::map_pages(state_bytes, &err);
  // Registered pages in memory a child inherits copy-on-write would break
  // the registration at the parent's next write: never inherited (the fork
  // copy gives a child its heap, fork_copy.cpp).
  if (state == nullptr || !Os::exclude_from_fork(p, size, &err)) {
    if (state != nullptr) Os::unmap_pages(state, state_bytes);
    if (p != nullptr) Os::unmap_pages(p, size);
    counters().failed(p == nullptr || state == nullptr ? kReserveFailed : kInheritable, err, size);
    slot->base.store(0, std::memory_order_release);
    return nullptr;
  }
  slot->size = size;
  slot->first_granule = first;
  slot->granules = static_cast<std::atomic<std::uint32_t>*>(state);  // zero: nothing committed
  slot->state_bytes = state_bytes;
  slot->base.store(base, std::memory_order_release);
  count_event(counters().allocations);
  return p;
}

bool CudaHostPinned::commit(void* ptr, std::size_t size, bool may_call_driver) noexcept {
  const auto lo = reinterpret_cast<std::uintptr_t>(ptr);
  Reservation* r = find(lo, size);
  if (r == nullptr) return false;
  const std::uintptr_t hi = lo + size;
  // mimalloc commits whole ranges of which some chunks may be committed
  // already (and hold live data), so a failed commit must not clear any
  // bit: first every granule is registered (or the commit fails having
  // changed nothing), and marked in use (no longer idle), then the chunks
  // are marked. A give-back pass that unregisters one of the granules in
  // between (it would need two passes) makes the second loop fail: the
  // chunks marked by then stay marked, which only keeps their granules
  // registered until mimalloc decommits them.
  const std::uintptr_t first = lo / kGranule * kGranule;
  for (std::uintptr_t g = first; g < hi; g += kGranule) {
    if (!add_bits(*r, g, 0, may_call_driver)) return false;
  }
  for (std::uintptr_t g = first; g < hi; g += kGranule) {
    if (!add_bits(*r, g, chunk_bits(g, lo, hi, /*liberal=*/true), may_call_driver)) return false;
  }
  return true;
}

void CudaHostPinned::decommit(void* ptr, std::size_t size) noexcept {
  const auto lo = reinterpret_cast<std::uintptr_t>(ptr);
  Reservation* r = find(lo, size);
  if (r == nullptr) return;
  const std::uintptr_t hi = lo + size;
  for (std::uintptr_t g = lo / kGranule * kGranule; g < hi; g += kGranule) {
    if (const std::uint32_t bits = chunk_bits(g, lo, hi, /*liberal=*/false); bits != 0) {
      drop_bits(*r, g, bits);
    }
  }
}

bool CudaHostPinned::release(void* ptr, std::size_t size) noexcept {
  const auto base = reinterpret_cast<std::uintptr_t>(ptr);
  Reservation* r = find(base, size);
  if (r == nullptr || r->base.load(std::memory_order_relaxed) != base || r->size != size) {
    return false;
  }
  TableGuard guard;
  const std::size_t count = granule_count(*r);
  for (std::size_t i = 0; i < count; ++i) {
    const std::uintptr_t g = r->first_granule + i * kGranule;
    if ((r->granules[i].load(std::memory_order_acquire) & kRegistered) == 0) continue;
    std::uintptr_t start = 0;
    std::size_t span = 0;
    granule_span(*r, g, &start, &span);
    driver_register(start, span, /*lock=*/false);
  }
  Os::unmap_pages(r->granules, r->state_bytes);
  Os::unmap_pages(ptr, size);
  r->base.store(0, std::memory_order_release);
  count_event(counters().deallocations);
  return true;
}

}  // namespace mnemosyne
