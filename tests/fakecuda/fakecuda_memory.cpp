// Fake CUDA driver: managed and pinned memory, advice, pointer attributes.
// Blocks are anonymous mappings (Linux: marked MADV_DONTFORK); each live block
// has a malloc'd record in an address-sorted, realloc'd index. The allocation
// calls call malloc/realloc/free while holding the driver lock, as the real
// one does.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda_internal.h"
#include "fakecuda_os.h"

namespace fakecuda {

namespace {

// kDevice: cuMemAlloc_v2's memory, which in the double is an anonymous
// mapping only the copies and kernels below touch, as on a GPU.
enum Kind : int { kManaged = 1, kHost = 2, kDevice = 3 };

struct Block {
  std::uintptr_t addr;
  std::size_t size;     // as requested
  std::size_t map_len;  // mapped, page rounded
  int kind;
  bool registered = false;  // the caller's memory, registered (kHost), not ours to unmap
  // A mapping of the virtual-memory API (kHost; fakecuda_vmm.cpp owns it):
  // the start of its reservation, its allocation, and whether the devices
  // were given access (cuMemSetAccess).
  std::uintptr_t vmm_reservation = 0;
  void* vmm_handle = nullptr;
  bool device_access = false;
  unsigned flags;
  int device;
  const Ctx* ctx;
  int advice_count = 0;
  int last_advice = -1;
  int last_loc_type = -1;
  int last_loc_id = -1;
  // The latest SET_PREFERRED_LOCATION still in force, and the range it
  // covered (one range a block: a later advice replaces it).
  int preferred = CU_DEVICE_INVALID;  // a device ordinal, CU_DEVICE_CPU, or none
  std::uintptr_t preferred_start = 0;
  std::uintptr_t preferred_end = 0;
};

// All g_lock.
Block** g_blocks = nullptr;
std::size_t g_nblocks = 0;
std::size_t g_cap = 0;

constexpr std::size_t kManagedAlign = 2 * kMiB;
constexpr std::size_t kAvoidAlign = 32 * kMiB;
constexpr std::size_t kMaxAlloc = std::size_t{1} << 46;

const char* kind_name(int kind) {
  return kind == kManaged ? "managed" : kind == kDevice ? "device" : "host";
}

std::size_t page_size() noexcept {
  return os::page_size();
}

std::size_t round_up(std::size_t v, std::size_t a) noexcept {
  return (v + a - 1) / a * a;
}

// Index of the last block whose start is <= p, or -1.
long index_le(std::uintptr_t p) noexcept {
  long lo = 0;
  long hi = long(g_nblocks) - 1;
  long found = -1;
  while (lo <= hi) {
    long mid = lo + (hi - lo) / 2;
    if (g_blocks[mid]->addr <= p) {
      found = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return found;
}

Block* containing(std::uintptr_t p) noexcept {
  long i = index_le(p);
  if (i < 0) return nullptr;
  Block* b = g_blocks[i];
  return p - b->addr < b->size ? b : nullptr;
}

// Whether [p, p + n) lies in block `b` (which holds p, or is null), up to
// its page-rounded end: what the driver's copy, memset and kernel accept.
bool lies_in(const Block* b, std::uintptr_t p, std::size_t n) noexcept {
  return b != nullptr && n <= b->map_len - (p - b->addr);
}

// Whether a device may touch block b (a vmm mapping: once given access).
bool device_reaches(const Block* b) noexcept {
  return b->vmm_reservation == 0 || b->device_access;
}

// Whether every byte of [p, p + n) lies in some block, blocks that touch
// end to end included: a device maps each allocation or registration at its
// own address, so a kernel may run across neighbours (registered granules).
bool mapped_for_device(std::uintptr_t p, std::size_t n) noexcept {
  const std::uintptr_t end = p + n;
  while (p < end) {
    const Block* b = containing(p);
    if (b == nullptr || !device_reaches(b)) return false;
    if (lies_in(b, p, end - p)) return true;
    p = b->addr + b->map_len;
  }
  return true;
}

// Whether the copy engine takes [p, p + n): it lies in one block, or in
// mappings side by side in one reservation of the virtual-memory API, all
// open to the device (an H200 copied across two: `gpu_probe vmm-host`).
// Registrations side by side are separate ranges: refused, as on an H200.
bool copyable(const Block* b, std::uintptr_t p, std::size_t n) noexcept {
  if (b == nullptr || !device_reaches(b)) return false;
  if (lies_in(b, p, n)) return true;
  const std::uintptr_t reservation = b->vmm_reservation;
  if (reservation == 0) return false;
  const std::uintptr_t end = p + n;
  while (p < end) {
    b = containing(p);
    if (b == nullptr || b->vmm_reservation != reservation || !device_reaches(b)) return false;
    p = b->addr + b->map_len;
  }
  return true;
}

// The managed block that holds all of [p, p + count), count > 0 (up to its
// page-rounded end), or nullptr: what the advice and range calls accept.
Block* managed_holding(std::uintptr_t p, std::size_t count) noexcept {
  Block* b = containing(p);
  return count != 0 && lies_in(b, p, count) && b->kind == kManaged ? b : nullptr;
}

// The block that starts at p, of the given kind, allocated (not registered)
// or registered as asked.
long index_of_start(std::uintptr_t p, int kind, bool registered = false) noexcept {
  long i = index_le(p);
  if (i < 0 || g_blocks[i]->addr != p || g_blocks[i]->kind != kind ||
      g_blocks[i]->registered != registered) {
    return -1;
  }
  return i;
}

bool index_insert(Block* b) noexcept {
  if (g_nblocks == g_cap) {
    std::size_t cap = g_cap == 0 ? 16 : g_cap * 2;
    auto* n = static_cast<Block**>(realloc(g_blocks, cap * sizeof(Block*)));
    if (n == nullptr) return false;
    g_blocks = n;
    g_cap = cap;
  }
  std::size_t pos = std::size_t(index_le(b->addr) + 1);
  memmove(&g_blocks[pos + 1], &g_blocks[pos], (g_nblocks - pos) * sizeof(Block*));
  g_blocks[pos] = b;
  ++g_nblocks;
  return true;
}

void index_remove(std::size_t i) noexcept {
  memmove(&g_blocks[i], &g_blocks[i + 1], (g_nblocks - i - 1) * sizeof(Block*));
  --g_nblocks;
}

// Maps len bytes at a 2 MiB aligned address that is not 32 MiB aligned.
void* map_managed(std::size_t len) noexcept {
  return os::map_aligned(len, kManagedAlign, kAvoidAlign);
}

void* map_host(std::size_t len) noexcept {
  return os::map_pages(len);
}

// A slow allocation, on purpose: busy (a driver populating pages on a
// loaded machine, using CPU) or stalled (a driver waiting on a lock, using
// none). Lock held, as the real driver's would be.
void slow_allocation() noexcept {
  if (g_config.alloc_busy_ms > 0) {
    const std::uint64_t end =
        os::monotonic_ns() + static_cast<std::uint64_t>(g_config.alloc_busy_ms) * 1000000u;
    while (os::monotonic_ns() < end) {
    }
  }
  if (g_config.alloc_stall_ms > 0) os::sleep_us(std::int64_t{g_config.alloc_stall_ms} * 1000);
}

// Lock held. Allocates a block of the given kind for the current context.
CUresult allocate(int kind, std::size_t size, unsigned flags, const Ctx* ctx, void** out) noexcept {
  if (CUresult rc = admit(size); rc != CUDA_SUCCESS) return rc;
  slow_allocation();
  const std::size_t len = round_up(size, page_size());
  // FAKECUDA_PINNED_SHARED: pinned memory as the nvidia kernel module maps
  // it (VM_SHARED, not VM_DONTCOPY: nv-mmap.c), a child of fork() sharing
  // its pages unless the caller marks them MADV_DONTFORK. Otherwise a
  // forked child never inherits the driver's memory.
  const bool shared = kind == kHost && g_config.pinned_shared;
  void* p = kind == kManaged ? map_managed(len) : shared ? os::map_shared(len) : map_host(len);
  if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!shared && !os::dont_fork(p, len)) {
    os::unmap(p, len);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  // A driver that does not clear what it hands out (managed memory is
  // documented "not cleared"; pinned memory is cleared only by the nvidia
  // module's InitializeSystemMemoryAllocations=1): every byte reads 0xa5, a
  // pointer no program can follow and a length no loop survives.
  if (g_config.dirty) memset(p, 0xa5, len);
  auto* b = static_cast<Block*>(malloc(sizeof(Block)));
  if (b == nullptr) {
    os::unmap(p, len);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *b = Block{.addr = reinterpret_cast<std::uintptr_t>(p),
             .size = size,
             .map_len = len,
             .kind = kind,
             .flags = flags,
             .device = ctx->device,
             .ctx = ctx};
  if (!index_insert(b)) {
    free(b);
    os::unmap(p, len);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  add_live_bytes(size);
  *out = p;
  return CUDA_SUCCESS;
}

// Lock held. Unmaps and forgets block i.
void release(std::size_t i) noexcept {
  Block* b = g_blocks[i];
  index_remove(i);
  if (b->vmm_reservation != 0) {  // the caller unmaps and accounts for it
    free(b);
    return;
  }
  if (b->kind == kManaged) forget_device_range(b->addr);
  if (b->registered) {
    g_counters.registered_bytes.fetch_sub(b->size);
  } else {
    os::unmap(reinterpret_cast<void*>(b->addr), b->map_len);
  }
  g_counters.live_bytes.fetch_sub(b->size);
  free(b);
}

// Lock held: the current context when it can allocate, else nullptr.
const Ctx* usable_current() noexcept {
  const Ctx* c = current_ctx();
  return ctx_usable(c) ? c : nullptr;
}

}  // namespace

CUresult admit(std::size_t size) noexcept {
  long seen = g_alloc_seen.fetch_add(1) + 1;
  long after = g_fail_alloc_after.load();
  if (after >= 0 && seen > after) return CUDA_ERROR_OUT_OF_MEMORY;
  unsigned long long limit = g_mem_limit.load();
  if (limit != 0 && g_counters.live_bytes.load() + size > limit) return CUDA_ERROR_OUT_OF_MEMORY;
  if (size > kMaxAlloc) return CUDA_ERROR_OUT_OF_MEMORY;
  return CUDA_SUCCESS;
}

bool vmm_index_add(const VmmMapping& m, const Ctx* ctx) noexcept {
  auto* b = static_cast<Block*>(malloc(sizeof(Block)));
  if (b == nullptr) return false;
  *b = Block{.addr = m.addr,
             .size = m.len,
             .map_len = m.len,
             .kind = kHost,
             .vmm_reservation = m.reservation,
             .vmm_handle = m.handle,
             .flags = 0,
             .device = ctx != nullptr ? ctx->device : 0,
             .ctx = ctx};
  if (!index_insert(b)) {
    free(b);
    return false;
  }
  return true;
}

bool vmm_index_find(std::uintptr_t addr, VmmMapping* out) noexcept {
  const long i = index_le(addr);
  if (i < 0 || g_blocks[i]->addr != addr || g_blocks[i]->vmm_reservation == 0) return false;
  const Block* b = g_blocks[i];
  *out = VmmMapping{b->addr, b->map_len, b->vmm_reservation, b->vmm_handle};
  return true;
}

void vmm_index_remove(std::uintptr_t addr) noexcept {
  const long i = index_le(addr);
  if (i >= 0 && g_blocks[i]->addr == addr && g_blocks[i]->vmm_reservation != 0) {
    release(std::size_t(i));
  }
}

void vmm_index_set_device_access(std::uintptr_t addr, bool on) noexcept {
  const long i = index_le(addr);
  if (i >= 0 && g_blocks[i]->addr == addr && g_blocks[i]->vmm_reservation != 0) {
    g_blocks[i]->device_access = on;
  }
}

bool index_overlaps(std::uintptr_t addr, std::size_t len) noexcept {
  const long i = index_le(addr + len - 1);
  return i >= 0 && g_blocks[i]->addr + g_blocks[i]->map_len > addr;
}

void free_ctx_blocks(const Ctx* ctx) noexcept {
  for (std::size_t i = g_nblocks; i-- > 0;) {
    Block* b = g_blocks[i];
    // Mappings of the virtual-memory API belong to their allocation, not
    // to a context.
    if (b->ctx != ctx || b->vmm_reservation != 0) continue;
    log_line("ctx-free kind=%s ptr=0x%llx size=%zu", kind_name(b->kind),
             static_cast<unsigned long long>(b->addr), b->size);
    g_counters.ctx_freed_blocks.fetch_add(1);
    release(i);
  }
}

}  // namespace fakecuda

using namespace fakecuda;

namespace {

// The allocation calls' one course: a usable context, the arguments
// (`valid`: the call's own checks of its pointer and flags), the block, the
// count and the log line. `out` receives the block.
CUresult allocate_call(const char* call, int kind, std::size_t bytesize, unsigned flags, bool valid,
                       void** out) noexcept {
  if (CUresult rc = enter(call); rc != CUDA_SUCCESS) return rc;
  lock(call);
  CUresult rc = CUDA_SUCCESS;
  const Ctx* ctx = usable_current();
  void* p = nullptr;
  if (ctx == nullptr) {
    rc = CUDA_ERROR_INVALID_CONTEXT;
  } else if (!valid || bytesize == 0) {
    rc = CUDA_ERROR_INVALID_VALUE;
  } else {
    rc = allocate(kind, bytesize, flags, ctx, &p);
  }
  unlock();
  if (rc != CUDA_SUCCESS) return fail(call, rc);
  if (kind == kManaged) g_counters.alloc_managed.fetch_add(1);
  if (kind == kHost) g_counters.alloc_host.fetch_add(1);
  log_line("alloc kind=%s ptr=0x%llx size=%zu flags=%u dev=%d rc=0", kind_name(kind),
           static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(p)), bytesize, flags,
           ctx->device);
  *out = p;
  return CUDA_SUCCESS;
}

}  // namespace

FAKECUDA_API CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  void* p = nullptr;
  const bool valid =
      dptr != nullptr && (flags == CU_MEM_ATTACH_GLOBAL || flags == CU_MEM_ATTACH_HOST);
  const CUresult rc = allocate_call("cuMemAllocManaged", kManaged, bytesize, flags, valid, &p);
  if (rc == CUDA_SUCCESS) *dptr = reinterpret_cast<CUdeviceptr>(p);
  return rc;
}

FAKECUDA_API CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  constexpr unsigned kKnown =
      CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  void* p = nullptr;
  const bool valid = pp != nullptr && (Flags & ~kKnown) == 0;
  const CUresult rc = allocate_call("cuMemHostAlloc", kHost, bytesize, Flags, valid, &p);
  if (rc == CUDA_SUCCESS) *pp = p;
  return rc;
}

namespace {

CUresult free_block(const char* call, std::uintptr_t p, int kind) noexcept {
  if (CUresult rc = enter(call); rc != CUDA_SUCCESS) return rc;
  lock(call);
  CUresult rc = CUDA_SUCCESS;
  std::size_t size = 0;
  if (usable_current() == nullptr) {
    rc = CUDA_ERROR_INVALID_CONTEXT;
  } else if (long i = index_of_start(p, kind);
             i < 0 && (kind != kManaged || (i = index_of_start(p, kDevice)) < 0)) {
    rc = CUDA_ERROR_INVALID_VALUE;  // cuMemFree_v2 frees managed and device memory
  } else {
    size = g_blocks[i]->size;
    kind = g_blocks[i]->kind;
    release(std::size_t(i));
  }
  unlock();
  if (rc != CUDA_SUCCESS) return fail(call, rc);
  (kind == kManaged ? g_counters.free_managed : g_counters.free_host).fetch_add(1);
  log_line("free kind=%s ptr=0x%llx size=%zu rc=0", kind_name(kind),
           static_cast<unsigned long long>(p), size);
  return CUDA_SUCCESS;
}

}  // namespace

FAKECUDA_API CUresult cuMemFree_v2(CUdeviceptr dptr) {
  return free_block("cuMemFree_v2", std::uintptr_t(dptr), kManaged);
}

FAKECUDA_API CUresult cuMemFreeHost(void* p) {
  return free_block("cuMemFreeHost", reinterpret_cast<std::uintptr_t>(p), kHost);
}

// Page-locking the caller's memory: the double records the range (which
// then counts as pinned memory: fakecuda_owns says host, live_bytes and
// registered_bytes hold it) and touches every page, as pinning populates
// them. It neither maps nor clears anything: the bytes stay the caller's.
FAKECUDA_API CUresult cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int Flags) {
  static const char kCall[] = "cuMemHostRegister_v2";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  constexpr unsigned kKnown = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                              CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  lock(kCall);
  CUresult rc = CUDA_SUCCESS;
  const Ctx* ctx = usable_current();
  if (ctx == nullptr) {
    rc = CUDA_ERROR_INVALID_CONTEXT;
  } else if (p == nullptr || bytesize == 0 || (Flags & ~kKnown) != 0 || a % page_size() != 0 ||
             bytesize % page_size() != 0) {
    rc = CUDA_ERROR_INVALID_VALUE;
  } else if (long i = index_le(a + bytesize - 1);
             i >= 0 && g_blocks[i]->addr + g_blocks[i]->map_len > a) {
    rc = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;  // overlaps a block the driver knows
  } else if (rc = admit(bytesize); rc == CUDA_SUCCESS) {
    auto* b = static_cast<Block*>(malloc(sizeof(Block)));
    if (b == nullptr) {
      rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
      *b = Block{.addr = a,
                 .size = bytesize,
                 .map_len = bytesize,
                 .kind = kHost,
                 .registered = true,
                 .flags = Flags,
                 .device = ctx->device,
                 .ctx = ctx};
      if (!index_insert(b)) {
        free(b);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
      } else {
        for (std::size_t off = 0; off < bytesize; off += page_size()) {
          static_cast<volatile char*>(p)[off] = static_cast<volatile char*>(p)[off];
        }
        add_live_bytes(bytesize);
        g_counters.registered_bytes.fetch_add(bytesize);
      }
    }
  }
  unlock();
  if (rc != CUDA_SUCCESS) return fail(kCall, rc);
  g_counters.register_calls.fetch_add(1);
  log_line("register kind=host ptr=0x%llx size=%zu flags=%u dev=%d rc=0",
           static_cast<unsigned long long>(a), bytesize, Flags, ctx->device);
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuMemHostUnregister(void* p) {
  static const char kCall[] = "cuMemHostUnregister";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  lock(kCall);
  CUresult rc = CUDA_SUCCESS;
  std::size_t size = 0;
  if (usable_current() == nullptr) {
    rc = CUDA_ERROR_INVALID_CONTEXT;
  } else if (long i = index_of_start(a, kHost, /*registered=*/true); i < 0) {
    rc = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  } else if (const int refused = g_unregister_error.load(); refused != 0) {
    rc = static_cast<CUresult>(refused);  // stays registered
  } else {
    size = g_blocks[i]->size;
    release(std::size_t(i));
  }
  unlock();
  if (rc != CUDA_SUCCESS) return fail(kCall, rc);
  g_counters.unregister_calls.fetch_add(1);
  log_line("unregister kind=host ptr=0x%llx size=%zu rc=0", static_cast<unsigned long long>(a),
           size);
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                                     CUmemLocation location) {
  static const char kCall[] = "cuMemAdvise_v2";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  g_counters.advise_calls.fetch_add(1);
  const auto p = std::uintptr_t(devPtr);
  lock(kCall);
  CUresult rc = CUDA_SUCCESS;
  bool recorded = false;
  Block* b = nullptr;
  if (usable_current() == nullptr) {
    rc = CUDA_ERROR_INVALID_CONTEXT;
  } else if (b = managed_holding(p, count); b == nullptr) {
    rc = CUDA_ERROR_INVALID_VALUE;
  } else if (advice < CU_MEM_ADVISE_SET_READ_MOSTLY || advice > CU_MEM_ADVISE_UNSET_ACCESSED_BY) {
    rc = CUDA_ERROR_INVALID_VALUE;
  } else {
    // Only these advices use the location; the others ignore it.
    const bool uses_location = advice == CU_MEM_ADVISE_SET_PREFERRED_LOCATION ||
                               advice == CU_MEM_ADVISE_SET_ACCESSED_BY ||
                               advice == CU_MEM_ADVISE_UNSET_ACCESSED_BY;
    if (uses_location) {
      switch (location.type) {
        case CU_MEM_LOCATION_TYPE_DEVICE:
          if (!valid_device(location.id)) rc = CUDA_ERROR_INVALID_DEVICE;
          break;
        case CU_MEM_LOCATION_TYPE_HOST:
        case CU_MEM_LOCATION_TYPE_HOST_NUMA:
        case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
          break;
        default:
          rc = CUDA_ERROR_INVALID_VALUE;
          break;
      }
    }
    if (rc == CUDA_SUCCESS) {
      recorded = true;
      ++b->advice_count;
      b->last_advice = int(advice);
      b->last_loc_type = int(location.type);
      b->last_loc_id = location.id;
      g_counters.advise_last_device.store(location.type == CU_MEM_LOCATION_TYPE_DEVICE ? location.id
                                                                                       : -1);
      g_counters.advise_last_advice.store(int(advice));
      g_counters.advise_last_loc_type.store(int(location.type));
      rc = static_cast<CUresult>(g_advise_error.load());
      if (rc == CUDA_SUCCESS && advice == CU_MEM_ADVISE_SET_PREFERRED_LOCATION) {
        b->preferred = location.type == CU_MEM_LOCATION_TYPE_DEVICE ? location.id : CU_DEVICE_CPU;
        b->preferred_start = p;
        b->preferred_end = p + count;
      } else if (rc == CUDA_SUCCESS && advice == CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION) {
        b->preferred = CU_DEVICE_INVALID;
      }
    }
  }
  unlock();
  if (recorded) {
    log_line("advise ptr=0x%llx size=%zu advice=%d loc_type=%d loc_id=%d rc=%d",
             static_cast<unsigned long long>(p), count, int(advice), int(location.type),
             location.id, int(rc));
  }
  return rc == CUDA_SUCCESS ? rc : fail(kCall, rc);
}

FAKECUDA_API CUresult cuMemRangeGetAttribute(void* data, size_t dataSize,
                                             CUmem_range_attribute attribute, CUdeviceptr devPtr,
                                             size_t count) {
  static const char kCall[] = "cuMemRangeGetAttribute";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  if (attribute != CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION) {
    return fail(kCall, CUDA_ERROR_NOT_SUPPORTED);  // the double answers only this one
  }
  if (data == nullptr || dataSize != sizeof(int)) return fail(kCall, CUDA_ERROR_INVALID_VALUE);
  const auto p = std::uintptr_t(devPtr);
  lock(kCall);
  CUresult rc = CUDA_SUCCESS;
  const Block* b = managed_holding(p, count);
  if (b == nullptr) {
    rc = CUDA_ERROR_INVALID_VALUE;  // managed memory only, inside one block
  } else {
    const bool covered = b->preferred_start <= p && p + count <= b->preferred_end;
    *static_cast<int*>(data) = covered ? b->preferred : int(CU_DEVICE_INVALID);
  }
  unlock();
  return rc == CUDA_SUCCESS ? rc : fail(kCall, rc);
}

FAKECUDA_API CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute,
                                            CUdeviceptr ptr) {
  static const char kCall[] = "cuPointerGetAttribute";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  if (data == nullptr) return fail(kCall, CUDA_ERROR_INVALID_VALUE);
  lock(kCall);
  CUresult rc = CUDA_SUCCESS;
  const Block* b = containing(std::uintptr_t(ptr));
  if (b == nullptr) {
    rc = CUDA_ERROR_INVALID_VALUE;
  } else {
    switch (attribute) {
      case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *static_cast<unsigned int*>(data) = b->kind == kManaged ? 1u : 0u;
        break;
      case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *static_cast<unsigned int*>(data) =
            b->kind == kHost ? unsigned(CU_MEMORYTYPE_HOST) : unsigned(CU_MEMORYTYPE_DEVICE);
        break;
      case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *static_cast<int*>(data) = b->device;
        break;
      case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *static_cast<CUdeviceptr*>(data) = CUdeviceptr(b->addr);
        break;
      case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *static_cast<size_t*>(data) = b->size;
        break;
      case CU_POINTER_ATTRIBUTE_CONTEXT:
        *static_cast<CUcontext*>(data) = reinterpret_cast<CUcontext>(const_cast<Ctx*>(b->ctx));
        break;
      case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *static_cast<CUdeviceptr*>(data) = ptr;
        break;
      case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        *static_cast<void**>(data) = reinterpret_cast<void*>(std::uintptr_t(ptr));
        break;
      default:
        rc = CUDA_ERROR_INVALID_VALUE;
        break;
    }
  }
  unlock();
  return rc == CUDA_SUCCESS ? rc : fail(kCall, rc);
}

FAKECUDA_API CUresult cuMemcpyDtoH_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  static const char kCall[] = "cuMemcpyDtoH_v2";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  const auto src = std::uintptr_t(srcDevice);
  lock(kCall);
  CUresult rc = CUDA_SUCCESS;
  const Block* b = containing(src);
  if (usable_current() == nullptr) {
    rc = CUDA_ERROR_INVALID_CONTEXT;
  } else if (dstHost == nullptr || !copyable(b, src, ByteCount)) {
    rc = CUDA_ERROR_INVALID_VALUE;  // the source must lie in one range the driver handed out
    if (b == nullptr) {             // e.g. freed meanwhile: tests tell that race from a bad address
      log_line("dtoh-unknown ptr=0x%llx size=%zu", static_cast<unsigned long long>(src), ByteCount);
    }
  } else if (int e = g_copy_error.load(); e != 0) {
    rc = static_cast<CUresult>(e);
  } else {
    read_where_it_lives(dstHost, src, ByteCount);
  }
  unlock();
  if (rc != CUDA_SUCCESS) return fail(kCall, rc);
  g_counters.dtoh_calls.fetch_add(1);
  g_counters.dtoh_bytes.fetch_add(ByteCount);
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- streams
//
// A stream is a handle for ordering: the double runs every operation at
// once, so synchronizing only checks the handle and the sticky error.
// Handles are checked against a fixed table of live streams before use.

namespace {

// CUDA_ERROR_ILLEGAL_ADDRESS once a launch faulted (see kernels below).
std::atomic<int> g_sticky{0};

CUresult sticky(const char* call) noexcept {
  const int e = g_sticky.load();
  return e != 0 ? fail(call, static_cast<CUresult>(e)) : CUDA_SUCCESS;
}

struct Stream {
  std::atomic<const Ctx*> ctx{nullptr};  // nullptr: free slot
};
constexpr int kMaxStreams = 256;
Stream g_streams[kMaxStreams];

// Lock held. Whether `s` is a live stream handle (nullptr: the legacy
// stream, valid while a context is current).
bool stream_valid(CUstream s) noexcept {
  if (s == nullptr) return true;
  for (Stream& st : g_streams) {
    if (reinterpret_cast<CUstream>(&st) == s) return st.ctx.load() != nullptr;
  }
  return false;
}

}  // namespace

FAKECUDA_API CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  static const char kCall[] = "cuStreamCreate";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  if (phStream == nullptr || (Flags & ~unsigned(CU_STREAM_NON_BLOCKING)) != 0)
    return fail(kCall, CUDA_ERROR_INVALID_VALUE);
  lock(kCall);
  const Ctx* ctx = usable_current();
  CUresult rc = ctx == nullptr ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_OUT_OF_MEMORY;
  if (ctx != nullptr) {
    for (Stream& st : g_streams) {
      if (st.ctx.load() != nullptr) continue;
      st.ctx.store(ctx);
      *phStream = reinterpret_cast<CUstream>(&st);
      g_counters.live_streams.fetch_add(1);
      rc = CUDA_SUCCESS;
      break;
    }
  }
  unlock();
  return rc == CUDA_SUCCESS ? rc : fail(kCall, rc);
}

FAKECUDA_API CUresult cuStreamSynchronize(CUstream hStream) {
  static const char kCall[] = "cuStreamSynchronize";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  lock(kCall);
  const bool ok = stream_valid(hStream) && (hStream != nullptr || current_ctx() != nullptr);
  unlock();
  if (!ok) return fail(kCall, CUDA_ERROR_INVALID_HANDLE);
  return sticky(kCall);
}

FAKECUDA_API CUresult cuStreamDestroy_v2(CUstream hStream) {
  static const char kCall[] = "cuStreamDestroy_v2";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  lock(kCall);
  const bool ok = hStream != nullptr && stream_valid(hStream);
  if (ok) {
    reinterpret_cast<Stream*>(hStream)->ctx.store(nullptr);
    g_counters.live_streams.fetch_sub(1);
  }
  unlock();
  return ok ? CUDA_SUCCESS : fail(kCall, CUDA_ERROR_INVALID_HANDLE);
}

// Sets the range at once, as a device memset that has finished: managed
// memory set to zero is not populated in host RAM (set_where_it_lives).
// The range must lie in one block the driver handed out.
FAKECUDA_API CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                                      CUstream hStream) {
  static const char kCall[] = "cuMemsetD8Async";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  if (CUresult rc = sticky(kCall); rc != CUDA_SUCCESS) return rc;
  const auto dst = std::uintptr_t(dstDevice);
  lock(kCall);
  CUresult rc = CUDA_SUCCESS;
  const Block* b = containing(dst);
  if (usable_current() == nullptr) {
    rc = CUDA_ERROR_INVALID_CONTEXT;
  } else if (!stream_valid(hStream)) {
    rc = CUDA_ERROR_INVALID_HANDLE;
  } else if (!lies_in(b, dst, N)) {
    rc = CUDA_ERROR_INVALID_VALUE;
  } else {
    set_where_it_lives(dst, N, uc, b->kind == kManaged);
    log_line("memset kind=%s ptr=0x%llx size=%zu value=%u",
             b->kind == kManaged ? "managed" : "host", static_cast<unsigned long long>(dst), N,
             unsigned(uc));
  }
  unlock();
  if (rc != CUDA_SUCCESS) return fail(kCall, rc);
  g_counters.memset_calls.fetch_add(1);
  g_counters.memset_bytes.fetch_add(N);
  return CUDA_SUCCESS;
}

// Discards managed ranges at once, as a batch that has finished. Their
// contents become indeterminate: with FAKECUDA_DIRTY they read 0xa5 (and stay
// in host RAM), otherwise the pages are given back (they read zero, and
// count no longer in the process's RSS), which is what the driver's "can
// also help reduce memory pressure" is taken to mean; scripts/gpu-check.sh
// measures what a real driver does. Each range must lie in one managed
// block; the stream must be a stream of the caller's (not the legacy one).
FAKECUDA_API CUresult cuMemDiscardBatchAsync(CUdeviceptr* dptrs, size_t* sizes, size_t count,
                                             unsigned long long flags, CUstream hStream) {
  static const char kCall[] = "cuMemDiscardBatchAsync";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  if (CUresult rc = sticky(kCall); rc != CUDA_SUCCESS) return rc;
  if (dptrs == nullptr || sizes == nullptr || count == 0 || flags != 0 || hStream == nullptr ||
      hStream == CU_STREAM_LEGACY) {
    return fail(kCall, CUDA_ERROR_INVALID_VALUE);
  }
  lock(kCall);
  CUresult rc = CUDA_SUCCESS;
  std::size_t bytes = 0;
  if (usable_current() == nullptr) {
    rc = CUDA_ERROR_INVALID_CONTEXT;
  } else if (!stream_valid(hStream)) {
    rc = CUDA_ERROR_INVALID_HANDLE;
  } else {
    for (std::size_t i = 0; i < count && rc == CUDA_SUCCESS; ++i) {
      const auto dst = std::uintptr_t(dptrs[i]);
      const Block* b = containing(dst);
      if (!lies_in(b, dst, sizes[i]) || b->kind != kManaged) rc = CUDA_ERROR_INVALID_VALUE;
    }
    for (std::size_t i = 0; i < count && rc == CUDA_SUCCESS; ++i) {
      const auto dst = std::uintptr_t(dptrs[i]);
      set_where_it_lives(dst, sizes[i], g_config.dirty ? 0xa5 : 0, /*managed=*/true);
      bytes += sizes[i];
      log_line("discard kind=managed ptr=0x%llx size=%zu", static_cast<unsigned long long>(dst),
               sizes[i]);
    }
  }
  unlock();
  if (rc != CUDA_SUCCESS) return fail(kCall, rc);
  g_counters.discard_calls.fetch_add(1);
  g_counters.discard_bytes.fetch_add(bytes);
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- device memory
//
// cuMemAlloc_v2's memory and the copies to and from it (what cudaMalloc,
// cudaMemcpy and torch's .to("cuda") use): gpu_probe gains measures them
// over the double so that scripts/gpu-check.sh's rows are known to run. A
// copy runs at once, on the CPU; the device side must lie in one range the
// driver handed out (managed, pinned or device), the host side may be any
// memory, pageable included, which the real driver stages. The Async forms
// take a live stream handle (or none) and are synchronous here.

FAKECUDA_API CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  void* p = nullptr;
  const CUresult rc = allocate_call("cuMemAlloc_v2", kDevice, bytesize, 0, dptr != nullptr, &p);
  if (rc == CUDA_SUCCESS) *dptr = reinterpret_cast<CUdeviceptr>(p);
  return rc;
}

namespace {

// A copy between the host pointer `host` and the device range [dev, dev+n):
// to_device, or back. Lock held by the caller.
CUresult copy_locked(std::uintptr_t dev, void* host, std::size_t n, bool to_device) noexcept {
  if (usable_current() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (host == nullptr || !copyable(containing(dev), dev, n)) return CUDA_ERROR_INVALID_VALUE;
  if (int e = g_copy_error.load(); e != 0) return static_cast<CUresult>(e);
  if (!to_device) {
    read_where_it_lives(host, dev, n);
  } else if (const auto src = reinterpret_cast<std::uintptr_t>(host); containing(src) != nullptr) {
    read_where_it_lives(reinterpret_cast<void*>(dev), src, n);  // from driver memory
  } else {
    memcpy(reinterpret_cast<void*>(dev), host, n);
  }
  return CUDA_SUCCESS;
}

CUresult copy(const char* call, CUdeviceptr dev, const void* host, std::size_t n, bool to_device,
              bool async, CUstream stream) noexcept {
  if (CUresult rc = enter(call); rc != CUDA_SUCCESS) return rc;
  lock(call);
  CUresult rc = async && !stream_valid(stream)
                    ? CUDA_ERROR_INVALID_HANDLE
                    : copy_locked(std::uintptr_t(dev), const_cast<void*>(host), n, to_device);
  unlock();
  if (rc != CUDA_SUCCESS) return fail(call, rc);
  (to_device ? g_counters.htod_calls : g_counters.dtoh_calls).fetch_add(1);
  (to_device ? g_counters.htod_bytes : g_counters.dtoh_bytes).fetch_add(n);
  return CUDA_SUCCESS;
}

}  // namespace

FAKECUDA_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void* srcHost,
                                      size_t ByteCount) {
  return copy("cuMemcpyHtoD_v2", dstDevice, srcHost, ByteCount, true, false, nullptr);
}

FAKECUDA_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void* srcHost,
                                           size_t ByteCount, CUstream hStream) {
  return copy("cuMemcpyHtoDAsync_v2", dstDevice, srcHost, ByteCount, true, true, hStream);
}

FAKECUDA_API CUresult cuMemcpyDtoHAsync_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                           CUstream hStream) {
  return copy("cuMemcpyDtoHAsync_v2", srcDevice, dstHost, ByteCount, false, true, hStream);
}

// ---------------------------------------------------------------- kernels
//
// The double runs one kernel, the GPU probe's (tests/gpu/gpu_probe.cpp):
// any module whose PTX text declares ".entry mnemosyne_probe_add" provides
// mnemosyne_probe_add(int* data, unsigned n, int delta), data[i] += delta for
// every launched thread i < n. Its pointer must lie in one block the driver
// handed out (managed, or pinned host memory, which is device-mapped), or
// anywhere when FAKECUDA_PAGEABLE=1 (a system with pageable memory access);
// otherwise the launch faults as a GPU would: it returns success, and the
// context's error, CUDA_ERROR_ILLEGAL_ADDRESS, is sticky from the next call
// on. The "device" writes are the CPU's; managed pages that were moved to the
// device come back through the residency fault handler.

namespace {

constexpr char kProbeEntry[] = "mnemosyne_probe_add";
struct Module {
  std::uint64_t magic;
};
constexpr std::uint64_t kModuleMagic = 0x6d6e656d6f4d6f64ull;  // "mnemoMod"
Module g_module{kModuleMagic};  // one module handle serves every load
int g_function = 0;             // the probe kernel's handle is &g_function

}  // namespace

FAKECUDA_API CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  static const char kCall[] = "cuModuleLoadData";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  if (CUresult rc = sticky(kCall); rc != CUDA_SUCCESS) return rc;
  if (module == nullptr || image == nullptr) return fail(kCall, CUDA_ERROR_INVALID_VALUE);
  if (current_ctx() == nullptr) return fail(kCall, CUDA_ERROR_INVALID_CONTEXT);
  const char* text = static_cast<const char*>(image);
  if (strstr(text, ".entry") == nullptr) return fail(kCall, CUDA_ERROR_INVALID_IMAGE);
  *module = reinterpret_cast<CUmodule>(&g_module);
  log_line("module-load probe=%d", strstr(text, kProbeEntry) != nullptr ? 1 : 0);
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuModuleGetFunction(CUfunction* function, CUmodule module, const char* name) {
  static const char kCall[] = "cuModuleGetFunction";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  if (function == nullptr || name == nullptr || module != reinterpret_cast<CUmodule>(&g_module))
    return fail(kCall, CUDA_ERROR_INVALID_HANDLE);
  if (strcmp(name, kProbeEntry) != 0) return fail(kCall, CUDA_ERROR_NOT_FOUND);
  *function = reinterpret_cast<CUfunction>(&g_function);
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuModuleUnload(CUmodule module) {
  static const char kCall[] = "cuModuleUnload";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  if (module != reinterpret_cast<CUmodule>(&g_module))
    return fail(kCall, CUDA_ERROR_INVALID_HANDLE);
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuLaunchKernel(CUfunction f, unsigned gridDimX, unsigned gridDimY,
                                     unsigned gridDimZ, unsigned blockDimX, unsigned blockDimY,
                                     unsigned blockDimZ, unsigned sharedMemBytes, CUstream stream,
                                     void** kernelParams, void** extra) {
  static const char kCall[] = "cuLaunchKernel";
  (void)sharedMemBytes;
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  if (CUresult rc = sticky(kCall); rc != CUDA_SUCCESS) return rc;
  if (f != reinterpret_cast<CUfunction>(&g_function)) return fail(kCall, CUDA_ERROR_INVALID_HANDLE);
  if (extra != nullptr || kernelParams == nullptr) return fail(kCall, CUDA_ERROR_INVALID_VALUE);
  if (current_ctx() == nullptr) return fail(kCall, CUDA_ERROR_INVALID_CONTEXT);
  lock(kCall);
  const bool live_stream = stream_valid(stream);
  unlock();
  if (!live_stream) return fail(kCall, CUDA_ERROR_INVALID_HANDLE);
  const unsigned long long threads = static_cast<unsigned long long>(gridDimX) * gridDimY *
                                     gridDimZ * blockDimX * blockDimY * blockDimZ;
  int* data = *static_cast<int**>(kernelParams[0]);
  const unsigned n = *static_cast<unsigned*>(kernelParams[1]);
  const int delta = *static_cast<int*>(kernelParams[2]);
  const std::size_t count = threads < n ? std::size_t(threads) : std::size_t(n);
  const auto start = reinterpret_cast<std::uintptr_t>(data);
  lock(kCall);
  const bool reachable = g_config.pageable != 0 || mapped_for_device(start, count * sizeof(int));
  unlock();
  log_line("launch ptr=0x%llx count=%zu reachable=%d", static_cast<unsigned long long>(start),
           count, reachable ? 1 : 0);
  if (!reachable) {
    g_sticky.store(CUDA_ERROR_ILLEGAL_ADDRESS);
    return CUDA_SUCCESS;  // asynchronous: the fault shows at the next call
  }
  for (std::size_t i = 0; i < count; ++i) data[i] += delta;
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuCtxSynchronize(void) {
  static const char kCall[] = "cuCtxSynchronize";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  if (current_ctx() == nullptr) return fail(kCall, CUDA_ERROR_INVALID_CONTEXT);
  return sticky(kCall);
}

FAKECUDA_API CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  static const char kCall[] = "cuMemGetInfo_v2";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  if (free == nullptr || total == nullptr) return fail(kCall, CUDA_ERROR_INVALID_VALUE);
  if (current_ctx() == nullptr) return fail(kCall, CUDA_ERROR_INVALID_CONTEXT);
  *total = 16 * kGiB;
  const std::uint64_t live = g_counters.live_bytes.load();
  *free = live < *total ? *total - live : 0;
  return CUDA_SUCCESS;
}

FAKECUDA_API long fakecuda_migrate_to_device(const void* p, size_t n) {
  if (g_forked.load(std::memory_order_acquire) || n == 0) return -1;
  lock("fakecuda_migrate_to_device");
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const Block* b = containing(a);
  long moved = -1;
  if (lies_in(b, a, n) && b->kind == kManaged) {
    moved = migrate_to_device(b->addr, b->map_len, a, n);
  }
  unlock();
  return moved;
}

FAKECUDA_API int fakecuda_on_device(const void* p) {
  if (g_forked.load(std::memory_order_acquire)) return 0;
  return on_device(reinterpret_cast<std::uintptr_t>(p)) ? 1 : 0;
}

FAKECUDA_API int fakecuda_owns(const void* p) {
  if (g_forked.load(std::memory_order_acquire)) return 0;
  lock("fakecuda_owns");
  const Block* b = containing(reinterpret_cast<std::uintptr_t>(p));
  int kind = b == nullptr ? 0 : b->kind;
  unlock();
  return kind;
}

FAKECUDA_API int fakecuda_get_advice(const void* p, struct fakecuda_advice* out) {
  if (out == nullptr || g_forked.load(std::memory_order_acquire)) return 0;
  lock("fakecuda_get_advice");
  const Block* b = containing(reinterpret_cast<std::uintptr_t>(p));
  int found = 0;
  if (b != nullptr && b->kind == kManaged && b->advice_count > 0) {
    *out = fakecuda_advice{b->advice_count, b->last_advice, b->last_loc_type, b->last_loc_id};
    found = 1;
  }
  unlock();
  return found;
}
