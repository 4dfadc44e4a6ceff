// The memory backends: zero-size types satisfying MemoryBackend.
//
// CUDA backends return nullptr when the driver is unavailable, when the
// driver call fails, or when their registry is full (the fresh allocation is
// released first). None falls back to host memory: the caller chooses.
#pragma once

#include <cstddef>
#include <type_traits>

#include "backend/memory_backend.hpp"
#include "backend/registry.hpp"

namespace mnemosyne {

// What every CUDA managed-memory backend shares: the memory is not inherited
// by a forked child, and its data may live on a device, where a CPU read
// would migrate it back.
struct ManagedMemory {
  static constexpr bool inherited_by_fork = false;
  static constexpr bool data_off_cpu = true;
  // The driver cannot free part of a managed allocation, and pages are only
  // backed where touched: nothing to commit.
  static constexpr bool commits_on_demand = false;
  static bool copy_out(void* dst, const void* src, std::size_t size) noexcept;
  // cuMemAllocManaged is documented "The memory is not cleared". NVIDIA's
  // open kernel modules do zero the pages UVM populates (__GFP_ZERO CPU
  // chunks, a copy-engine memset of new GPU chunks: uvm_va_block.c,
  // uvm_pmm_sysmem.c), with no setting to turn it off, but nothing promises
  // it: not relied on (MNEMOSYNE_ZEROED=yes asserts it; scripts/gpu-check.sh
  // measures it on hardware).
  static bool fresh_memory_zero() noexcept { return false; }
  // clear(): cuMemsetD8Async on a stream of mnemosyne's own, then waits for
  // it; the CPU clears instead where the driver cannot (no usable driver,
  // a driver call on this thread, or the call failed).
};

// Tells the driver that the managed memory [ptr, ptr + size) of backend `id`
// holds nothing of use (cuMemDiscardBatchAsync, CUDA 13, on a stream of
// mnemosyne's own, waited for): it may drop the pages, in host RAM and on
// the device. Its contents are indeterminate afterwards. False when the
// driver lacks the call, cannot be called here, or failed (after a failure
// it is not asked again).
bool discard_managed(BackendId id, void* ptr, std::size_t size) noexcept;

namespace detail {
// The managed backends' calls (cuda_backends.cpp), by id: the registry, the
// counters and the advice are the id's (kBackends' prefers_device).
void* managed_allocate(BackendId id, std::size_t size) noexcept;
bool managed_deallocate(BackendId id, void* ptr, std::size_t size) noexcept;
void managed_clear(BackendId id, void* ptr, std::size_t size) noexcept;
AllocationRegistry& cuda_registry(BackendId id) noexcept;
}  // namespace detail

// CUDA managed memory, cuMemAllocManaged(..., CU_MEM_ATTACH_GLOBAL), one type
// per managed row of kBackends. Those that prefer a device are advised to
// (cuMemAdvise_v2 SET_PREFERRED_LOCATION, CU_MEM_LOCATION_TYPE_DEVICE); a
// failed advice leaves the allocation valid and is counted. Each has its
// own registry and counters.
template <BackendId Id>
struct CudaManaged : ManagedMemory {
  static_assert(is_managed_backend(Id));
  static constexpr BackendId kId = Id;
  static constexpr const char* kName = backend_name(Id);
  static void* allocate(std::size_t size) noexcept { return detail::managed_allocate(Id, size); }
  static bool deallocate(void* ptr, std::size_t size) noexcept {
    return detail::managed_deallocate(Id, ptr, size);
  }
  static void clear(void* ptr, std::size_t size) noexcept { detail::managed_clear(Id, ptr, size); }
  static AllocationRegistry& registry() noexcept { return detail::cuda_registry(Id); }
};

using CudaUnified = CudaManaged<BackendId::unified>;
using CudaDevice = CudaManaged<BackendId::device>;
using CudaHbm = CudaManaged<BackendId::hbm>;
using CudaGddr = CudaManaged<BackendId::gddr>;

// Memory the CPU reads in place: a plain copy reads it without moving it.
struct CpuMemory {
  static constexpr bool data_off_cpu = false;
  static bool copy_out(void* dst, const void* src, std::size_t size) noexcept;
};

// How pinned arenas are backed (MNEMOSYNE_PIN; set before the first arena):
// whole, each arena locked at once by cuMemHostAlloc, with no reservation
// (MNEMOSYNE_PIN=arena); or reserved and backed where mimalloc commits
// (pinned_granules.cpp) by registration, anonymous memory of our own
// registered with the driver (cuMemHostRegister, DEVICEMAP | PORTABLE) one
// 1 MiB granule at a time (MNEMOSYNE_PIN=granule), or by vmm, host memory of
// the driver's virtual-memory API (cuMemCreate, cuMemMap) one granule of the
// driver's granularity at a time (MNEMOSYNE_PIN=vmm).
enum class PinnedCommit : unsigned char { whole, registration, vmm };
void set_pinned_commit(PinnedCommit how) noexcept;
PinnedCommit pinned_commit() noexcept;
// Bytes of granules given back as excess: while more than the give-back
// delay may hold was backed and unused, by a pass woken at once.
std::uint64_t pinned_bytes_given_back_early() noexcept;

// Page-locked host memory. allocate(): cuMemHostAlloc(..., DEVICEMAP |
// PORTABLE), locked whole. reserve()/commit(): backed granule by granule
// where mimalloc commits (PinnedCommit); null from reserve() when the driver
// cannot back memory that way. Neither is inherited by a forked child
// (MADV_DONTFORK).
struct CudaHostPinned : CpuMemory {
  static constexpr BackendId kId = BackendId::pinned;
  static constexpr const char* kName = backend_name(kId);
  static constexpr bool inherited_by_fork = false;
  static constexpr bool commits_on_demand = true;
  // Not while arenas are locked whole (PinnedCommit::whole).
  static bool reserves_arenas() noexcept { return pinned_commit() != PinnedCommit::whole; }
  // decommit() marks chunks; the give-back thread unregisters a granule
  // unused for a pass (pinned_granules.cpp).
  static constexpr bool defers_release = true;
  // The unit of registration: a granule is locked while any part of it is
  // committed.
  static constexpr std::size_t kGranule = std::size_t{1} << 20;
  // Zero while the nvidia module's InitializeSystemMemoryAllocations is 1
  // (its default); read once (platform layer), no when it cannot be read.
  static bool fresh_memory_zero() noexcept;
  // Whether a reservation's memory reads zero where first committed
  // (pinned_granules.cpp says why, per route).
  static bool reservation_zero() noexcept;
  static void* allocate(std::size_t size) noexcept;
  static bool deallocate(void* ptr, std::size_t size) noexcept;
  static void* reserve(std::size_t size) noexcept;
  static bool commit(void* ptr, std::size_t size) noexcept;
  static bool back(void* ptr, std::size_t size) noexcept;
  static void back_done(void* ptr, std::size_t size) noexcept;
  static void decommit(void* ptr, std::size_t size) noexcept;
  static bool release(void* ptr, std::size_t size) noexcept;
  static void start_give_back() noexcept;
  // Registration: always (anonymous memory). vmm: where the granules are
  // mapped; the rest of the reservation is the driver's inaccessible
  // address space.
  static bool readable(const void* ptr, std::size_t size) noexcept;
  static void hold_backing(bool on) noexcept;
  static void clear(void* ptr, std::size_t size) noexcept;
  static AllocationRegistry& registry() noexcept;
};

// Anonymous private mmap, for machines without a driver.
struct Host : CpuMemory {
  static constexpr BackendId kId = BackendId::host;
  static constexpr const char* kName = backend_name(kId);
  static constexpr bool inherited_by_fork = true;
  // The kernel backs pages where they are touched and takes back those
  // given up: a reservation is mapped memory (commit has nothing to do),
  // decommit hands the pages back (Os::discard_pages), as mimalloc does with
  // its own OS memory.
  static constexpr bool commits_on_demand = true;
  static bool reserves_arenas() noexcept { return true; }
  // decommit() is a system call, as with mimalloc's own memory: mimalloc's
  // delay batches them.
  static constexpr bool defers_release = false;
  // Anonymous mmap (and VirtualAlloc) memory is documented zero-filled.
  static bool fresh_memory_zero() noexcept { return true; }
  static void* allocate(std::size_t size) noexcept;
  static bool deallocate(void* ptr, std::size_t size) noexcept;
  static void clear(void* ptr, std::size_t size) noexcept;
  static AllocationRegistry& registry() noexcept;
  static void* reserve(std::size_t size) noexcept { return allocate(size); }
  static bool reservation_zero() noexcept { return true; }
  static bool commit(void*, std::size_t) noexcept { return true; }
  static bool back(void*, std::size_t) noexcept { return true; }
  static void back_done(void*, std::size_t) noexcept {}
  static void decommit(void* ptr, std::size_t size) noexcept;
  static bool release(void* ptr, std::size_t size) noexcept { return deallocate(ptr, size); }
  static void start_give_back() noexcept {}
  static bool readable(const void*, std::size_t) noexcept { return true; }
  static void hold_backing(bool) noexcept {}
};

// with_backend's fallback for `none` is the last row.
static_assert(kBackends[std::size(kBackends) - 1].id == BackendId::host);

// The type that implements backend `id`, from its row's kind of memory.
template <BackendId Id>
using BackendType = std::conditional_t<
    backend_memory(Id) == MemoryKind::managed, CudaManaged<Id>,
    std::conditional_t<backend_memory(Id) == MemoryKind::pinned, CudaHostPinned, Host>>;

// Calls f.template operator()<B>() with the backend type for `id`: the
// caller's code is instantiated once per backend, no virtual dispatch.
// `id` must not be BackendId::none (it gets Host, the last row).
template <std::size_t Row = 0, class F>
decltype(auto) with_backend(BackendId id, F&& f) {
  constexpr BackendId kRowId = kBackends[Row].id;
  static_assert(MemoryBackend<BackendType<kRowId>>);
  if constexpr (Row + 1 < std::size(kBackends)) {
    if (id != kRowId) return with_backend<Row + 1>(id, static_cast<F&&>(f));
  }
  return f.template operator()<BackendType<kRowId>>();
}

// True when the driver loads, initializes and has the allocation entry points.
bool is_cuda_available() noexcept;

}  // namespace mnemosyne
