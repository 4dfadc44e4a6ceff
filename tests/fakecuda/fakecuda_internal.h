// Shared internals of the fake CUDA driver. Everything here has hidden
// visibility (the library is built with -fvisibility=hidden; on Windows only
// dllexport'ed names are exported); only the cu* entry points and the
// fakecuda_* control functions are exported.
#pragma once

#if defined(_WIN32)
#include <cuda.h>
#define FAKECUDA_API extern "C" __declspec(dllexport)
#else
// The driver's entry points must be exported: give every declaration cuda.h
// makes default visibility, so the definitions inherit it.
#pragma GCC visibility push(default)
#include <cuda.h>
#pragma GCC visibility pop
#define FAKECUDA_API extern "C" __attribute__((visibility("default")))
#endif

// What CUDA 13.0's headers declare and a 12.x toolkit's lack: the double
// is a CUDA 13.0 driver whatever headers build it.
#if CUDA_VERSION < 12050
typedef struct CUctxCigParam_st CUctxCigParam;  // only its pointer is looked at
typedef struct CUctxCreateParams_st {
  CUexecAffinityParam* execAffinityParams;
  int numExecAffinityParams;
  CUctxCigParam* cigParams;
} CUctxCreateParams;
FAKECUDA_API CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* params, unsigned int flags,
                                     CUdevice dev);
#endif
#if CUDA_VERSION < 13000
FAKECUDA_API CUresult cuMemDiscardBatchAsync(CUdeviceptr* dptrs, size_t* sizes, size_t count,
                                             unsigned long long flags, CUstream hStream);
#endif

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#define FAKECUDA_BUILDING 1  // fakecuda.h: export the fakecuda_* functions
#include "fakecuda.h"

namespace fakecuda {

inline constexpr int kDriverVersion = 13000;
inline constexpr int kMaxDevices = 64;
inline constexpr int kCtxStackDepth = 16;
inline constexpr std::uint64_t kCtxMagic = 0x6d6e656d6f437478ull;  // "mnemoCtx"
inline constexpr std::uint64_t kCtxDeadMagic = 0x64656164436f6e74ull;
inline constexpr std::size_t kMiB = std::size_t{1} << 20;
inline constexpr std::size_t kGiB = std::size_t{1} << 30;

struct Counters {
  std::atomic<std::uint64_t> init_calls{0};
  std::atomic<std::uint64_t> alloc_managed{0};
  std::atomic<std::uint64_t> alloc_host{0};
  std::atomic<std::uint64_t> free_managed{0};
  std::atomic<std::uint64_t> free_host{0};
  std::atomic<std::uint64_t> advise_calls{0};
  std::atomic<std::int64_t> advise_last_device{-1};
  std::atomic<std::uint64_t> legacy_free_calls{0};
  std::atomic<std::uint64_t> live_bytes{0};
  std::atomic<std::uint64_t> failed_calls{0};
  std::atomic<std::uint64_t> invalid_context_calls{0};
  std::atomic<std::uint64_t> thread_allocs{0};
  std::atomic<std::uint64_t> total_calls{0};
  std::atomic<std::uint64_t> legacy_calls{0};
  std::atomic<std::uint64_t> ctx_freed_blocks{0};
  std::atomic<std::int64_t> advise_last_advice{-1};
  std::atomic<std::int64_t> advise_last_loc_type{-1};
  std::atomic<std::uint64_t> thread_finished{0};
  std::atomic<std::uint64_t> pages_to_device{0};
  std::atomic<std::uint64_t> cpu_migrations{0};
  std::atomic<std::uint64_t> dtoh_calls{0};
  std::atomic<std::uint64_t> dtoh_bytes{0};
  std::atomic<std::uint64_t> memset_calls{0};
  std::atomic<std::uint64_t> memset_bytes{0};
  std::atomic<std::uint64_t> live_streams{0};
  std::atomic<std::uint64_t> register_calls{0};
  std::atomic<std::uint64_t> unregister_calls{0};
  std::atomic<std::uint64_t> registered_bytes{0};
  std::atomic<std::uint64_t> discard_calls{0};
  std::atomic<std::uint64_t> discard_bytes{0};
  std::atomic<std::uint64_t> vmm_map_calls{0};
  std::atomic<std::uint64_t> vmm_unmap_calls{0};
  std::atomic<std::uint64_t> vmm_bytes{0};
  std::atomic<std::uint64_t> peak_live_bytes{0};
  std::atomic<std::uint64_t> htod_calls{0};
  std::atomic<std::uint64_t> htod_bytes{0};
};
extern Counters g_counters;

// Counts `size` more live bytes (managed, pinned, registered or vmm), and
// the high-water mark of them.
inline void add_live_bytes(std::uint64_t size) noexcept {
  const std::uint64_t now = g_counters.live_bytes.fetch_add(size) + size;
  std::uint64_t peak = g_counters.peak_live_bytes.load();
  while (now > peak && !g_counters.peak_live_bytes.compare_exchange_weak(peak, now)) {
  }
}

// Configuration read from the environment by the first successful cuInit
// (and by every failing one before it). Stable once g_initialized is set.
struct Config {
  int devices = 2;
  int pageable = 0;
  int concurrent_managed = 1;
  std::size_t thread_alloc_max = 32 * kMiB;
  std::size_t thread_first_alloc = 0;  // the internal thread's first block; 0: drawn
  int thread_iters = 30;
  bool event_thread = true;    // FAKECUDA_EVENT_THREAD
  long alloc_busy_ms = 0;      // FAKECUDA_ALLOC_BUSY_MS
  long alloc_stall_ms = 0;     // FAKECUDA_ALLOC_STALL_MS
  bool dirty = false;          // FAKECUDA_DIRTY: fresh memory is not zero
  bool pinned_shared = false;  // FAKECUDA_PINNED_SHARED: pinned memory as nvidia maps it
  // FAKECUDA_HOST_POINTER_REGISTERED=0: devices that reach registered memory
  // only at another address (CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM 0).
  int host_pointer_registered = 1;
  // FAKECUDA_VMM_HOST=0: a driver before CUDA 12.2, whose virtual-memory API
  // knows no host location (cuMemCreate and the granularity query refuse it).
  bool vmm_host = true;
};
extern Config g_config;

// Fault injection, adjustable at run time.
extern std::atomic<long> g_fail_alloc_after;         // -1: off
extern std::atomic<long> g_alloc_seen;               // allocation calls since the limit was set
extern std::atomic<unsigned long long> g_mem_limit;  // 0: off
extern std::atomic<int> g_unregister_error;          // 0: off
extern std::atomic<int> g_advise_error;              // 0: off
extern std::atomic<int> g_copy_error;                // 0: off
extern std::atomic<int> g_vmm_map_error;  // 0: off (FAKECUDA_VMM_MAP_ERROR: cuMemMap's answer)

extern std::atomic<bool> g_initialized;
extern std::atomic<bool> g_forked;

// A context. Handles given out are pointers to these; a handle is only
// dereferenced after it was found in the registry of live contexts.
struct Ctx {
  std::uint64_t magic;
  int device;
  unsigned flags;
  bool primary;
  int refcount;  // primary contexts: retain count; active while > 0
  Ctx* next;     // registry of live contexts
};

// The driver's internal mutex (error-checking: a thread that re-enters the
// driver while holding it aborts with a message instead of hanging).
void lock(const char* call) noexcept;
void unlock() noexcept;

// mingw's "printf" format checks msvcrt's conversions; log_line formats with
// mingw's C99 one (%zu, %llu), so check against that.
#if defined(_WIN32)
#define FAKECUDA_PRINTF gnu_printf
#else
#define FAKECUDA_PRINTF printf
#endif

// Appends "<pid> <formatted>\n" to FAKECUDA_LOG with one write. No malloc.
void log_line(const char* fmt, ...) noexcept __attribute__((format(FAKECUDA_PRINTF, 1, 2)));

// Counts and logs a failing call; returns rc.
CUresult fail(const char* call, CUresult rc) noexcept;
// Counts a call; CUDA_ERROR_NOT_INITIALIZED (counted and logged) in a forked
// child or before a successful cuInit, else CUDA_SUCCESS.
CUresult enter(const char* call) noexcept;
// Like enter() but without the cuInit requirement.
CUresult enter_no_init(const char* call) noexcept;
// Counts and logs a call of a legacy (unversioned) export.
void note_legacy_call(const char* name) noexcept;

bool valid_device(CUdevice dev) noexcept;

// Contexts (fakecuda_context.cpp).
// Creates the primary contexts of the configured devices; lock held. Mallocs.
bool contexts_init(int devices) noexcept;
// The calling thread's current context, or nullptr.
Ctx* current_ctx() noexcept;
// Lock held: ctx is a live registered handle / and is usable for allocations.
bool ctx_valid(const Ctx* ctx) noexcept;
bool ctx_usable(const Ctx* ctx) noexcept;

// The fault-injection gates every allocation call passes (fakecuda_memory.cpp).
CUresult admit(std::size_t size) noexcept;

// Memory (fakecuda_memory.cpp). Lock held: frees every block of ctx.
void free_ctx_blocks(const Ctx* ctx) noexcept;

// The granularity of the double's virtual-memory API (fakecuda_vmm.cpp).
inline constexpr std::size_t kVmmGranule = 2 * kMiB;

// Mappings of the virtual-memory API (fakecuda_vmm.cpp) in the index of
// blocks (fakecuda_memory.cpp), so that fakecuda_owns, copies and kernels
// see them as pinned host memory. All lock held.
struct VmmMapping {
  std::uintptr_t addr;
  std::size_t len;
  std::uintptr_t reservation;  // the start of the reservation it lies in
  void* handle;                // fakecuda_vmm.cpp's record of the allocation
};
// Records a mapping for ctx's device; false when the index cannot grow.
bool vmm_index_add(const VmmMapping& m, const Ctx* ctx) noexcept;
// The mapping that starts at addr, or false.
bool vmm_index_find(std::uintptr_t addr, VmmMapping* out) noexcept;
// Forgets the mapping that starts at addr.
void vmm_index_remove(std::uintptr_t addr) noexcept;
// Opens (or closes) the mapping at addr to the devices' kernels and copies.
void vmm_index_set_device_access(std::uintptr_t addr, bool on) noexcept;
// Whether any block or mapping overlaps [addr, addr + len).
bool index_overlaps(std::uintptr_t addr, std::size_t len) noexcept;

// Residency of managed memory (fakecuda_residency.cpp).
// Lock held: moves the pages of [p, p + n) in the managed block
// [block, block + block_len) to the device. Returns the pages moved, -1 when
// the driver's table of device ranges is full.
long migrate_to_device(std::uintptr_t block, std::size_t block_len, std::uintptr_t p,
                       std::size_t n) noexcept;
// Whether the page holding p has its data on the device.
bool on_device(std::uintptr_t p) noexcept;
// Lock held: copies n bytes at src into dst from wherever each page's data
// lives, moving nothing.
void read_where_it_lives(void* dst, std::uintptr_t src, std::size_t n) noexcept;
// Lock held: sets n bytes at dst, in one block (`managed`: a managed one), to
// `value` as the device's copy engine would: whole pages of managed memory
// set to zero are not populated in host RAM (their CPU copy is dropped:
// MADV_DONTNEED on this private anonymous memory reads back zero), pages on
// the device are written there, and the rest is written by the CPU.
void set_where_it_lives(std::uintptr_t dst, std::size_t n, unsigned char value,
                        bool managed) noexcept;
// Lock held: the block at `block` is being released.
void forget_device_range(std::uintptr_t block) noexcept;

}  // namespace fakecuda
