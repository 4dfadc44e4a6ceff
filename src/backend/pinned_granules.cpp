// Page-locked host memory committed on demand: CudaHostPinned's reserve,
// commit, decommit and release.
//
// cuMemHostAlloc locks all it returns, at once: a mimalloc segment per thread
// (32 MiB) was 32 MiB of locked RAM for a thread that holds 64 bytes. Here a
// reservation is address space, and only what mimalloc commits is backed by
// locked memory the device reaches, one granule (aligned to its size) at a
// time, by one of two routes (set_pinned_commit, MNEMOSYNE_PIN):
//
//  - registration (PIN=granule): the reservation is anonymous memory of our
//    own; a granule (1 MiB) is page-locked and mapped for the device by
//    cuMemHostRegister(DEVICEMAP | PORTABLE), in every driver since CUDA 4.
//    Each registration is its own range to the driver, which refuses
//    cuMemcpy* of a block spanning two (CUDA_ERROR_INVALID_VALUE on an H200:
//    scripts/gpu-check.sh, "pinned copies").
//  - the virtual-memory API (PIN=vmm): the reservation is cuMemAddressReserve
//    address space; a granule (the driver's allocation granularity for host
//    memory, 2 MiB on an H200) is cuMemCreate'd with a host location
//    (CU_MEM_LOCATION_TYPE_HOST, CUDA 12.2 and later), cuMemMap'ped in place
//    and opened to the device and the CPU with cuMemSetAccess. Granules
//    mapped side by side in one reservation are one range to the driver: on
//    an H200 (`gpu_probe vmm-host`) the CPU, a kernel and cuMemcpyDtoH/HtoD
//    all reached blocks spanning two, at 0.72 ms a granule. The mappings
//    are shared mappings a forked child would inherit and write through
//    (measured there): each granule is marked MADV_DONTFORK once mapped
//    (which the H200 accepted), and a granule the kernel refuses that on is
//    given back and its commit fails. Nothing documents what fresh memory
//    of this kind holds: it is not taken to read zero.
//
// A granule can only be given back whole, so it is the unit of give-back.
// mimalloc commits and decommits in 64 KiB chunks (its MI_COMMIT_SIZE);
// which chunks of a granule are committed is tracked so that a granule none
// of them uses can be given back.
//
// mimalloc commits from inside its allocation path, where the driver must
// not be called: the driver calls malloc, which would re-enter mimalloc
// mid-operation. So commit() succeeds only on granules backed already;
// otherwise it fails, mimalloc returns NULL, and the arena's slow path,
// outside mimalloc, backs the range that failed first (back()) and asks
// again. back() marks no chunk committed: mimalloc, asked again, may serve
// the request from another range, and a chunk it never committed would
// keep its granule locked for good (a buffer grown step by step locked a
// granule at the head of every segment mimalloc tried: gigabytes).
//
// Giving back has the same constraint: mimalloc decommits from inside its
// free path. A decommit only marks chunks unused; a thread of mnemosyne's
// own (the give-back thread, started the first time a commit needs the
// driver, every asynchronous signal blocked) gives back a granule that has
// stayed wholly unused for one pass (kPassNs) to the next: unregistered and
// its pages returned to the OS, or unmapped and released to the driver. It
// sleeps while no granule is unused. The delay lets a program that frees and
// allocates again find its granules still backed; but it holds at most
// kKeepUnused of them: a free that leaves more backed and unused (a huge
// block, a growing realloc's old blocks) wakes the thread at once, and that
// pass gives back the excess without waiting, as the OS takes back the pages
// mimalloc decommits on the host heap (a realloc growing to 1.5 GiB on an
// H200 peaked at 5.2 GiB resident under PIN=vmm with the delay alone, 3.1x
// glibc, while each freed step waited out its second).
//
// Each granule's state is one atomic word: which chunks are committed,
// whether it is backed, or being backed or given back by a thread (busy),
// whether the last give-back pass saw it unused (idle), and whether the
// driver refused to give it back (kept). No lock is held across a driver
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

constexpr std::size_t kRegisterGranule = CudaHostPinned::kGranule;
constexpr std::size_t kChunk = std::size_t{64} << 10;  // mimalloc's MI_COMMIT_SIZE
// The largest granule whose chunks one word tracks (2 MiB).
constexpr std::size_t kMaxGranule = kChunk * 32;
using Word = std::uint64_t;
constexpr Word kChunkBits = 0xffff'ffffu;
constexpr Word kBacked = Word{1} << 32;
constexpr Word kBusy = Word{1} << 33;
constexpr Word kIdle = Word{1} << 34;
constexpr Word kKept = Word{1} << 35;
// Backed for a commit that failed inside mimalloc and is about to be asked
// again (back()), no chunk committed yet: no give-back pass takes it, so
// the retry finds it backed however busy the passes are, until the retry
// is over (back_done()). If mimalloc then committed elsewhere, the granule
// is given back like any unused one, a pass or two later.
constexpr Word kFresh = Word{1} << 36;
// A give-back pass marks the backed granules no chunk uses (idle) and gives
// back those the pass before marked: a granule goes back between one and
// two passes after mimalloc stopped using it. mimalloc's own delay before
// it decommits a freed segment (segment_decommit_delay) is 500 ms, and set
// to 0 for arenas (arena.cpp): this delay takes its place.
constexpr std::uint64_t kPassNs = 500'000'000;
// Backed bytes no committed chunk uses that may wait for the delay; beyond
// them, a pass gives unused granules back at once.
constexpr std::int64_t kKeepUnused = std::int64_t{64} << 20;
constexpr unsigned kRegisterFlags = CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE;

constinit std::atomic<PinnedCommit> g_route{PinnedCommit::whole};

// One reservation. `base` is 0 for a free slot, 1 while a thread fills it.
struct Reservation {
  std::atomic<std::uintptr_t> base{0};
  std::size_t size = 0;              // as asked for (release() checks it)
  std::size_t span = 0;              // reserved: size, rounded up to granules under vmm
  std::size_t granule = 0;           // bytes, a power of two
  bool vmm = false;                  // the virtual-memory route
  std::uintptr_t first_granule = 0;  // address of the granule holding base
  std::atomic<Word>* granules = nullptr;
  CUmemGenericAllocationHandle* handles = nullptr;  // vmm: one per granule, after the words
  std::size_t state_bytes = 0;
};

// Reservations are arenas (at most 64, mimalloc's limit) and growable
// blocks (a realloc's, arena.cpp): a fixed table, no allocation. With the
// table full a growable block is an arena block again (it moves as it
// grows).
constexpr std::size_t kMaxReservations = 128;
constinit Reservation g_reservations[kMaxReservations];

// Bumped (and the give-back thread woken) when a backed granule becomes
// unused.
constinit std::atomic<std::uint32_t> g_idle_events{0};
// Bytes of backed granules, and committed chunks in them: their difference
// is what is backed and unused.
constinit std::atomic<std::int64_t> g_backed_bytes{0};
// Bytes of fresh granules: backed for a retry under way, not unused.
constinit std::atomic<std::int64_t> g_fresh_bytes{0};
constinit std::atomic<std::int64_t> g_committed_chunks{0};
// Bumped (and the give-back thread woken from its wait between passes) when
// more than kKeepUnused is backed and unused; g_prompt_pending keeps a burst
// of frees to one wake until the thread's next pass.
constinit std::atomic<std::uint32_t> g_prompt_events{0};
constinit std::atomic<bool> g_prompt_pending{false};
constinit std::atomic<std::uint64_t> g_given_back_early{0};
// Whether the give-back thread sleeps on g_idle_events: a free that makes a
// granule idle wakes it (a system call) only then.
constinit std::atomic<bool> g_give_back_sleeping{false};
// The give-back thread: 0 not started, 1 started, -1 the OS refused.
constinit std::atomic<int> g_give_back_thread{0};
// Walks over the heap reading it now (hold_backing): a give-back pass gives
// no granule back meanwhile. With the granule's busy mark, sequentially
// consistent on both sides: either the pass sees the reader and keeps the
// granule, or the reader sees the granule busy and does not read it.
constinit std::atomic<int> g_readers{0};
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

std::size_t granule_index(const Reservation& r, std::uintptr_t g) noexcept {
  return (g - r.first_granule) / r.granule;
}

// The part of granule `g` (its address) inside the reservation.
void granule_span(const Reservation& r, std::uintptr_t g, std::uintptr_t* start,
                  std::size_t* size) noexcept {
  const std::uintptr_t base = r.base.load(std::memory_order_relaxed);
  const std::uintptr_t lo = g < base ? base : g;
  const std::uintptr_t end = base + r.span;
  const std::uintptr_t hi = g + r.granule < end ? g + r.granule : end;
  *start = lo;
  *size = hi - lo;
}

// The access a vmm granule needs: read and write for the device and the CPU
// (as `gpu_probe vmm-host` opened it on an H200).
void vmm_access(CUdevice device, CUmemAccessDesc out[2]) noexcept {
  out[0] = CUmemAccessDesc{};
  out[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  out[0].location.id = device;
  out[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  out[1] = CUmemAccessDesc{};
  out[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  out[1].location.id = 0;
  out[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

CUmemAllocationProp vmm_host_prop() noexcept {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST;  // no NUMA node chosen: id ignored
  prop.location.id = 0;
  return prop;
}

// Backs one vmm granule at `start` (create, map, open, keep from children);
// inside a DriverCall. Undoes what it did when a step fails.
bool vmm_back(const DriverCall& call, Reservation& r, std::uintptr_t start, std::size_t size,
              BackendCounters& c) noexcept {
  const DriverApi& api = call.api();
  const CUmemAllocationProp prop = vmm_host_prop();
  CUmemGenericAllocationHandle h = 0;
  const CUdeviceptr at = static_cast<CUdeviceptr>(start);
  FailureStep step = kVmmCreateFailed;
  CUresult rc = api.cuMemCreate(&h, size, &prop, 0);
  count_event(c.driver_calls);
  if (rc == CUDA_SUCCESS) {
    step = kVmmMapFailed;
    rc = api.cuMemMap(at, size, 0, h, 0);
    count_event(c.driver_calls);
    if (rc == CUDA_SUCCESS) {
      CUmemAccessDesc access[2];
      vmm_access(call.device(), access);
      step = kVmmAccessFailed;
      rc = api.cuMemSetAccess(at, size, access, 2);
      count_event(c.driver_calls);
      int err = 0;
      if (rc == CUDA_SUCCESS) {
        if (Os::exclude_from_fork(reinterpret_cast<void*>(start), size, &err)) {
          r.handles[granule_index(r, start)] = h;
          return true;
        }
        c.failed(kInheritable, err, size);
      }
      api.cuMemUnmap(at, size);
      count_event(c.driver_calls);
    }
    api.cuMemRelease(h);
    count_event(c.driver_calls);
  }
  if (rc != CUDA_SUCCESS) c.failed(step, rc, size);
  return false;
}

// Gives one vmm granule back to the driver; inside a DriverCall.
bool vmm_drop(const DriverCall& call, Reservation& r, std::uintptr_t start, std::size_t size,
              BackendCounters& c) noexcept {
  const DriverApi& api = call.api();
  count_event(c.driver_calls, 2);
  if (api.cuMemUnmap(static_cast<CUdeviceptr>(start), size) != CUDA_SUCCESS) return false;
  // Unmapped, the granule is out of the address space whatever the release
  // answers: given back as far as the process is concerned.
  api.cuMemRelease(r.handles[granule_index(r, start)]);
  r.handles[granule_index(r, start)] = 0;
  return true;
}

// Backs (lock) or gives back [start, start + size), one granule of r.
bool driver_back(Reservation& r, std::uintptr_t start, std::size_t size, bool lock) noexcept {
  const DriverApi* api = driver_api();
  // Inside a driver call on this thread (the driver is calling malloc),
  // calling it again could deadlock: the caller's commit fails instead.
  if (api == nullptr || in_driver_call()) return false;
  BackendCounters& c = counters();
  const std::uint64_t t0 = detail::monotonic_ns();
  // The count never exceeds what the driver holds: a granule is counted
  // once backed, and uncounted before it is given back (added again if the
  // driver keeps it). Its peak is then at most the driver's, short of it by
  // at most a granule for each thread backing one at that moment.
  if (!lock) {
    c.bytes_live.fetch_sub(size, std::memory_order_relaxed);
    g_backed_bytes.fetch_sub(static_cast<std::int64_t>(size), std::memory_order_relaxed);
  }
  bool ok = false;
  {
    DriverCall call;
    if (call.ok()) {
      if (r.vmm) {
        ok = lock ? vmm_back(call, r, start, size, c) : vmm_drop(call, r, start, size, c);
      } else {
        count_event(c.driver_calls);
        void* p = reinterpret_cast<void*>(start);
        const CUresult rc =
            lock ? api->cuMemHostRegister(p, size, kRegisterFlags) : api->cuMemHostUnregister(p);
        ok = rc == CUDA_SUCCESS;
        if (!ok && lock) c.failed(kRegisterFailed, rc, size);
      }
    }
    if (!ok) count_event(c.driver_failures);
  }
  count_event(c.driver_ns, detail::monotonic_ns() - t0);
  if (ok && lock) count_event(c.bytes_allocated, size);
  if (ok == lock) {  // backed now, or still backed
    c.add_live(size);
    g_backed_bytes.fetch_add(static_cast<std::int64_t>(size), std::memory_order_relaxed);
  }
  return ok;
}

// Chunk bits of granule `g` that [lo, hi) touches (liberal) or covers
// wholly (conservative).
Word chunk_bits(const Reservation& r, std::uintptr_t g, std::uintptr_t lo, std::uintptr_t hi,
                bool liberal) noexcept {
  const std::uintptr_t a = lo < g ? g : lo;
  const std::uintptr_t b = hi > g + r.granule ? g + r.granule : hi;
  if (a >= b) return 0;
  std::uintptr_t first = (a - g) / kChunk;
  std::uintptr_t end = (b - g + kChunk - 1) / kChunk;
  if (!liberal) {
    first = (a - g + kChunk - 1) / kChunk;
    end = (b - g) / kChunk;
  }
  if (first >= end) return 0;
  return ((Word{1} << end) - 1) & ~((Word{1} << first) - 1);
}

std::atomic<Word>& word(Reservation& r, std::uintptr_t g) noexcept {
  return r.granules[granule_index(r, g)];
}

// Bytes backed and not committed, over every reservation, less those of
// fresh granules (about to be committed).
std::int64_t unused_bytes() noexcept {
  return g_backed_bytes.load(std::memory_order_relaxed) -
         g_committed_chunks.load(std::memory_order_relaxed) * static_cast<std::int64_t>(kChunk) -
         g_fresh_bytes.load(std::memory_order_relaxed);
}

// Counts a change of granule g's word from `before` to `after` in
// g_fresh_bytes.
void count_fresh(const Reservation& r, Word before, Word after) noexcept {
  if (((before ^ after) & kFresh) == 0) return;
  const auto bytes = static_cast<std::int64_t>(r.granule);
  g_fresh_bytes.fetch_add((after & kFresh) != 0 ? bytes : -bytes, std::memory_order_relaxed);
}

// Tells the give-back thread when a granule's word `s` says it is backed
// and unused (the thread may be asleep for want of one).
void note_if_unused(Word s) noexcept {
  if ((s & (kChunkBits | kBusy | kKept | kFresh)) != 0 || (s & kBacked) == 0) return;
  // Both sequentially consistent, as the thread's store and load are: either
  // it sees this event before sleeping, or this sees it sleeping.
  g_idle_events.fetch_add(1, std::memory_order_seq_cst);
  if (g_give_back_sleeping.load(std::memory_order_seq_cst)) Os::wake_all(&g_idle_events);
}

// Marks `bits` of granule g uncommitted. The granule stays backed even when
// none of its chunks is committed: mimalloc decommits from inside its free
// and allocation paths, where the driver must not be called (it calls
// malloc and free, which would re-enter mimalloc mid-operation). The
// give-back thread is woken to give it back later (at once, beyond
// kKeepUnused).
void drop_bits(Reservation& r, std::uintptr_t g, Word bits) noexcept {
  const Word before = word(r, g).fetch_and(~bits, std::memory_order_acq_rel);
  const Word after = before & ~bits;
  g_committed_chunks.fetch_sub(__builtin_popcountll(before & bits), std::memory_order_relaxed);
  if (unused_bytes() > kKeepUnused && !g_prompt_pending.exchange(true, std::memory_order_acq_rel)) {
    g_prompt_events.fetch_add(1, std::memory_order_seq_cst);
    Os::wake_all(&g_prompt_events);
  }
  if ((before & bits) != 0) note_if_unused(after);
}

// Waits while granule word `w` (read into *s) is busy: another thread backs
// or gives back the granule. False when this thread is inside the driver
// call that backs it (the driver calls malloc: that request goes to the
// host heap).
bool wait_not_busy(const std::atomic<Word>& w, Word* s) noexcept {
  for (std::size_t spins = 0; (*s & kBusy) != 0; *s = w.load(std::memory_order_acquire)) {
    if (in_driver_call()) return false;
    Os::pause(spins++);
  }
  return true;
}

// Marks `bits` of granule g committed (none: only in use, no longer idle);
// false when it is not backed. Never calls the driver.
bool add_bits(Reservation& r, std::uintptr_t g, Word bits) noexcept {
  std::atomic<Word>& w = word(r, g);
  for (Word s = w.load(std::memory_order_acquire);; s = w.load(std::memory_order_acquire)) {
    if (!wait_not_busy(w, &s)) return false;
    // A forked child (no driver) has its own copy of the memory: using it
    // needs no driver.
    if ((s & kBacked) == 0 && driver_api() != nullptr) return false;
    const Word now = (s & ~(kIdle | kFresh)) | bits;
    if (w.compare_exchange_weak(s, now, std::memory_order_acq_rel)) {
      g_committed_chunks.fetch_add(__builtin_popcountll(bits & ~s), std::memory_order_relaxed);
      count_fresh(r, s, now);
      return true;
    }
  }
}

// Backs granule g for a commit about to be asked again, and marks it fresh
// (no give-back pass takes it until back_done); false when the driver
// refused. A granule backed already is only marked (one in use, with
// committed chunks, needs no mark).
bool back_granule(Reservation& r, std::uintptr_t g) noexcept {
  std::atomic<Word>& w = word(r, g);
  for (Word s = w.load(std::memory_order_acquire);; s = w.load(std::memory_order_acquire)) {
    if (!wait_not_busy(w, &s)) return false;
    if ((s & kBacked) != 0) {
      const Word now = (s & ~kIdle) | ((s & kChunkBits) == 0 ? kFresh : 0);
      if (!w.compare_exchange_weak(s, now, std::memory_order_acq_rel)) continue;
      count_fresh(r, s, now);
      return true;
    }
    if (!w.compare_exchange_weak(s, s | kBusy, std::memory_order_acq_rel)) continue;
    std::uintptr_t start = 0;
    std::size_t size = 0;
    granule_span(r, g, &start, &size);
    const bool ok = driver_back(r, start, size, /*lock=*/true);
    if (ok) count_fresh(r, s, s | kFresh);
    w.store(ok ? (s | kBacked | kFresh) : s, std::memory_order_release);
    return ok;
  }
}

// Ends granule g's fresh mark: unused now unless mimalloc committed in it.
void end_fresh(Reservation& r, std::uintptr_t g) noexcept {
  std::atomic<Word>& w = word(r, g);
  Word s = w.load(std::memory_order_acquire);
  while ((s & kFresh) != 0 && !w.compare_exchange_weak(s, s & ~kFresh, std::memory_order_acq_rel)) {
  }
  if ((s & kFresh) == 0) return;
  count_fresh(r, s, s & ~kFresh);
  note_if_unused(s & ~kFresh);
}

// Number of granule words of a reservation.
std::size_t granule_count(const Reservation& r) noexcept {
  const std::uintptr_t base = r.base.load(std::memory_order_relaxed);
  return (base + r.span - r.first_granule + r.granule - 1) / r.granule;
}

// One give-back pass over every reservation; true when it left a granule
// marked idle (the next pass may give it back). Granules unused since the
// last pass go back, and, while more than kKeepUnused is backed and unused,
// unused ones not yet marked too. `excess_only`: only the latter, and no
// marking (a commit about to back granules makes room first).
bool give_back_pass(bool excess_only) noexcept {
  bool marked = false;
  TableGuard guard;
  for (Reservation& r : g_reservations) {
    if (r.base.load(std::memory_order_acquire) <= 1) continue;
    const std::size_t count = granule_count(r);
    for (std::size_t i = 0; i < count; ++i) {
      // Read afresh at each granule: a free decommitting beside the pass
      // makes more unused as it goes, and what lies beyond kKeepUnused goes
      // back in this pass, not after the delay.
      const std::int64_t excess = unused_bytes() - kKeepUnused;
      if (excess_only && excess <= 0) return false;
      std::atomic<Word>& w = r.granules[i];
      Word s = w.load(std::memory_order_acquire);
      if (s == kBacked && excess <= 0) {
        w.compare_exchange_strong(s, kBacked | kIdle, std::memory_order_acq_rel);
        marked = true;  // either idle now, or in use again: looked at next pass
        continue;
      }
      if (s != (kBacked | kIdle) && s != kBacked) continue;
      if (!w.compare_exchange_strong(s, kBacked | kBusy, std::memory_order_seq_cst)) {
        marked = true;
        continue;
      }
      if (g_readers.load(std::memory_order_seq_cst) != 0) {  // a walk may be reading it
        w.store(kBacked | kIdle, std::memory_order_release);
        marked = true;
        continue;
      }
      std::uintptr_t start = 0;
      std::size_t size = 0;
      granule_span(r, r.first_granule + i * r.granule, &start, &size);
      // Refused (the granule stays backed): kept, never tried again.
      const bool ok = driver_back(r, start, size, /*lock=*/false);
      // Unlocked, registered pages are still resident: their contents are
      // dead (no chunk is committed), so the OS takes them back, as
      // mimalloc's own decommit would (a registration later locks fresh
      // pages). An unmapped vmm granule went back to the driver whole.
      if (ok && !r.vmm) Os::discard_pages(reinterpret_cast<void*>(start), size);
      if (ok && excess > 0) g_given_back_early.fetch_add(size, std::memory_order_relaxed);
      w.store(ok ? 0 : (kBacked | kKept), std::memory_order_release);
    }
  }
  return marked;
}

void give_back_thread(void*) {
  for (;;) {
    const std::uint32_t seen = g_idle_events.load(std::memory_order_acquire);
    // Read before the pass: a prompt wake the pass may not have seen ends
    // the wait below at once.
    const std::uint32_t prompt = g_prompt_events.load(std::memory_order_seq_cst);
    g_prompt_pending.store(false, std::memory_order_seq_cst);
    if (!give_back_pass(/*excess_only=*/false)) {
      g_give_back_sleeping.store(true, std::memory_order_seq_cst);
      if (g_idle_events.load(std::memory_order_seq_cst) == seen) {
        Os::wait_while_equal(&g_idle_events, seen);
      }
      g_give_back_sleeping.store(false, std::memory_order_relaxed);
    }
    Os::wait_while_equal(&g_prompt_events, prompt, kPassNs);
  }
}

// The vmm route's granule: the driver's minimum granularity for host memory
// (at least one chunk), or 0 when the driver lacks the route or its
// granule is larger than one word tracks. Asked once.
std::size_t vmm_granule(const DriverCall& call) noexcept {
  static constinit std::atomic<std::size_t> known{1};  // 1: not asked yet
  std::size_t g = known.load(std::memory_order_acquire);
  if (g != 1) return g;
  const DriverApi& api = call.api();
  g = 0;
  if (api.cuMemGetAllocationGranularity != nullptr && api.cuMemAddressReserve != nullptr &&
      api.cuMemAddressFree != nullptr && api.cuMemCreate != nullptr &&
      api.cuMemRelease != nullptr && api.cuMemMap != nullptr && api.cuMemUnmap != nullptr &&
      api.cuMemSetAccess != nullptr) {
    const CUmemAllocationProp prop = vmm_host_prop();
    std::size_t min = 0;
    count_event(counters().driver_calls);
    const CUresult rc =
        api.cuMemGetAllocationGranularity(&min, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (rc != CUDA_SUCCESS) {
      // A driver before CUDA 12.2 knows no host location.
      counters().failed(kVmmFailed, rc, 0);
    } else if (min != 0 && (min & (min - 1)) == 0 && min <= kMaxGranule) {
      g = min < kChunk ? kChunk : min;
    }
  }
  known.store(g, std::memory_order_release);
  return g;
}

// The vmm route's reservation of `span` bytes, aligned to `granule`, or null.
void* vmm_reserve(const DriverCall& call, std::size_t span, std::size_t granule) noexcept {
  CUdeviceptr base = 0;
  count_event(counters().driver_calls);
  const CUresult rc = call.api().cuMemAddressReserve(&base, span, granule, 0, 0);
  if (rc != CUDA_SUCCESS) {
    counters().failed(kVmmFailed, rc, span);
    return nullptr;
  }
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(base));
}

void vmm_unreserve(void* p, std::size_t span) noexcept {
  DriverCall call;
  if (!call.ok()) return;  // the address space goes with the process
  count_event(counters().driver_calls);
  call.api().cuMemAddressFree(static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p)), span);
}

}  // namespace

void set_pinned_commit(PinnedCommit how) noexcept {
  g_route.store(how, std::memory_order_relaxed);
}

PinnedCommit pinned_commit() noexcept {
  return g_route.load(std::memory_order_relaxed);
}

std::uint64_t pinned_bytes_given_back_early() noexcept {
  return g_given_back_early.load(std::memory_order_relaxed);
}

void CudaHostPinned::start_give_back() noexcept {
  if (g_give_back_thread.load(std::memory_order_relaxed) != 0) return;
  int expected = 0;
  if (!g_give_back_thread.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) return;
  // Refused: unused granules stay backed until their reservation goes.
  if (!Os::start_thread(&give_back_thread, nullptr)) g_give_back_thread.store(-1);
}

void CudaHostPinned::hold_backing(bool on) noexcept {
  if (on) {
    g_readers.fetch_add(1, std::memory_order_seq_cst);
  } else {
    g_readers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

bool CudaHostPinned::readable(const void* ptr, std::size_t size) noexcept {
  const auto lo = reinterpret_cast<std::uintptr_t>(ptr);
  Reservation* r = find(lo, size);
  // Not a reservation (cuMemHostAlloc memory is mapped whole), or anonymous
  // memory, which reads zero where nothing is registered.
  if (r == nullptr || !r->vmm || size == 0) return true;
  for (std::uintptr_t g = lo / r->granule * r->granule; g < lo + size; g += r->granule) {
    const Word s = word(*r, g).load(std::memory_order_seq_cst);
    if ((s & kBacked) == 0 || (s & kBusy) != 0) return false;
  }
  return true;
}

bool CudaHostPinned::reservation_zero() noexcept {
  // Registration: anonymous memory, documented zero-filled (and given-back
  // pages are discarded, so they read zero again). vmm: nothing documents
  // it, so what the nvidia module says of the memory it allocates decides,
  // as for cuMemHostAlloc.
  return pinned_commit() == PinnedCommit::registration || fresh_memory_zero();
}

void* CudaHostPinned::reserve(std::size_t size) noexcept {
  const DriverApi* api = driver_api();
  const bool vmm = pinned_commit() == PinnedCommit::vmm;
  if (size == 0 || api == nullptr ||
      (!vmm && (api->cuMemHostRegister == nullptr || api->cuMemHostUnregister == nullptr))) {
    return nullptr;
  }
  // No slot left (growable blocks take one each): no driver call either; a
  // slot freed meanwhile is only missed once.
  bool any_slot = false;
  for (const Reservation& r : g_reservations) {
    any_slot = any_slot || r.base.load(std::memory_order_relaxed) == 0;
  }
  if (!any_slot) return nullptr;
  // Memory that no commit could back is no arena: without a usable device
  // (no context can be made current) reserve nothing, and the caller's
  // cuMemHostAlloc reports why, as for every other backend.
  std::size_t granule = kRegisterGranule;
  std::size_t span = size;
  void* p = nullptr;
  int err = 0;
  {
    DriverCall call;
    if (!call.ok()) {
      counters().failed(kContextFailed, call.error(), size);
      return nullptr;
    }
    if (vmm) {
      // Mapped at one address for the CPU and the device (unified
      // addressing), which the vmm-host probe ran a kernel on.
      granule = vmm_granule(call);
      if (granule == 0) return nullptr;
      span = (size + granule - 1) / granule * granule;
      p = vmm_reserve(call, span, granule);
      if (p == nullptr) return nullptr;
    } else {
      // Nor where the device reaches registered memory only at an address
      // of its own (cuMemHostGetDevicePointer): a program hands a kernel the
      // pointer malloc gave it. CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM says
      // which (cuMemHostRegister's documentation); unknown counts as no.
      int same_address = 0;
      if (api->cuDeviceGetAttribute == nullptr ||
          api->cuDeviceGetAttribute(&same_address,
                                    CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
                                    call.device()) != CUDA_SUCCESS ||
          same_address != 1) {
        return nullptr;
      }
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
  if (slot == nullptr) {
    if (vmm) vmm_unreserve(p, span);
    return nullptr;
  }
  // Registered pages in memory a child inherits copy-on-write would break
  // the registration at the parent's next write: never inherited (the fork
  // copy gives a child its heap, src/arena/fork/). vmm granules are marked
  // one by one as they are mapped (vmm_back).
  if (!vmm) {
    p = Os::map_pages(size, &err);
    if (p != nullptr && !Os::exclude_from_fork(p, size, &err)) {
      Os::unmap_pages(p, size);
      counters().failed(kInheritable, err, size);
      slot->base.store(0, std::memory_order_release);
      return nullptr;
    }
  }
  const auto base = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t first = base / granule * granule;
  const std::size_t count = (base + span - first + granule - 1) / granule;
  const std::size_t words = count * sizeof(std::atomic<Word>);
  const std::size_t handles = vmm ? count * sizeof(CUmemGenericAllocationHandle) : 0;
  const std::size_t state_bytes =
      (words + handles + Os::page_size() - 1) / Os::page_size() * Os::page_size();
  void* state = p == nullptr ? nullptr : Os::map_pages(state_bytes, &err);
  if (state == nullptr) {
    if (p != nullptr) vmm ? vmm_unreserve(p, span) : void(Os::unmap_pages(p, size));
    counters().failed(kReserveFailed, err, size);
    slot->base.store(0, std::memory_order_release);
    return nullptr;
  }
  slot->size = size;
  slot->span = span;
  slot->granule = granule;
  slot->vmm = vmm;
  slot->first_granule = first;
  slot->granules = static_cast<std::atomic<Word>*>(state);  // zero: nothing committed
  slot->handles =
      vmm ? reinterpret_cast<CUmemGenericAllocationHandle*>(static_cast<char*>(state) + words)
          : nullptr;
  slot->state_bytes = state_bytes;
  slot->base.store(base, std::memory_order_release);
  count_event(counters().allocations);
  return p;
}

bool CudaHostPinned::commit(void* ptr, std::size_t size) noexcept {
  const auto lo = reinterpret_cast<std::uintptr_t>(ptr);
  Reservation* r = find(lo, size);
  if (r == nullptr) return false;
  const std::uintptr_t hi = lo + size;
  // mimalloc commits whole ranges of which some chunks may be committed
  // already (and hold live data), so a failed commit must not clear any
  // bit: first every granule is found backed (or the commit fails having
  // changed nothing), and marked in use (no longer idle), then the chunks
  // are marked. A give-back pass that gives back one of the granules in
  // between (marked idle by the pass before, or unused while more than
  // kKeepUnused is) makes the second loop fail: the chunks marked by then
  // stay marked, which only keeps their granules backed until mimalloc
  // decommits them.
  const std::uintptr_t first = lo / r->granule * r->granule;
  for (std::uintptr_t g = first; g < hi; g += r->granule) {
    if (!add_bits(*r, g, 0)) return false;
  }
  for (std::uintptr_t g = first; g < hi; g += r->granule) {
    if (!add_bits(*r, g, chunk_bits(*r, g, lo, hi, /*liberal=*/true))) return false;
  }
  return true;
}

bool CudaHostPinned::back(void* ptr, std::size_t size) noexcept {
  const auto lo = reinterpret_cast<std::uintptr_t>(ptr);
  Reservation* r = find(lo, size);
  // Inside a driver call on this thread (the driver is calling malloc),
  // calling it again could deadlock.
  if (r == nullptr || in_driver_call()) return false;
  // What the heap freed beyond kKeepUnused goes back first, here, so that
  // a realloc growing by copies holds its new block and the old one, not
  // the ones before, however late a busy machine runs the give-back thread.
  if (unused_bytes() > kKeepUnused) give_back_pass(/*excess_only=*/true);
  // Only backed, no chunk marked: mimalloc, asked again, commits what it
  // uses, which need not be this range (it tries other ranges when one
  // fails). Chunks marked here and never committed by mimalloc would keep
  // their granules locked for good.
  const std::uintptr_t hi = lo + size;
  for (std::uintptr_t g = lo / r->granule * r->granule; g < hi; g += r->granule) {
    if (!back_granule(*r, g)) {
      if (g > lo) back_done(ptr, static_cast<std::size_t>(g - lo));  // what this call marked
      return false;
    }
  }
  return true;
}

void CudaHostPinned::back_done(void* ptr, std::size_t size) noexcept {
  const auto lo = reinterpret_cast<std::uintptr_t>(ptr);
  Reservation* r = find(lo, size);
  if (r == nullptr) return;
  const std::uintptr_t hi = lo + size;
  for (std::uintptr_t g = lo / r->granule * r->granule; g < hi; g += r->granule) end_fresh(*r, g);
}

void CudaHostPinned::decommit(void* ptr, std::size_t size) noexcept {
  const auto lo = reinterpret_cast<std::uintptr_t>(ptr);
  Reservation* r = find(lo, size);
  if (r == nullptr) return;
  const std::uintptr_t hi = lo + size;
  for (std::uintptr_t g = lo / r->granule * r->granule; g < hi; g += r->granule) {
    if (const Word bits = chunk_bits(*r, g, lo, hi, /*liberal=*/false); bits != 0) {
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
    const std::uintptr_t g = r->first_granule + i * r->granule;
    const Word state = r->granules[i].load(std::memory_order_acquire);
    g_committed_chunks.fetch_sub(__builtin_popcountll(state & kChunkBits),
                                 std::memory_order_relaxed);
    count_fresh(*r, state, state & ~kFresh);
    if ((state & kBacked) == 0) continue;
    std::uintptr_t start = 0;
    std::size_t span = 0;
    granule_span(*r, g, &start, &span);
    driver_back(*r, start, span, /*lock=*/false);
  }
  Os::unmap_pages(r->granules, r->state_bytes);
  if (r->vmm) {
    vmm_unreserve(ptr, r->span);
  } else {
    Os::unmap_pages(ptr, size);
  }
  r->base.store(0, std::memory_order_release);
  count_event(counters().deallocations);
  return true;
}

}  // namespace mnemosyne
