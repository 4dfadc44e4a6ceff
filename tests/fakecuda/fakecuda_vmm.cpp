// Fake CUDA driver: the virtual-memory API, for host memory only (what
// mnemosyne's MNEMOSYNE_PIN=vmm uses): cuMemGetAllocationGranularity,
// cuMemAddressReserve/Free, cuMemCreate/Release, cuMemMap/Unmap and
// cuMemSetAccess.
//
// As on the driver an H200 ran (`gpu_probe vmm-host`): the granularity is
// 2 MiB; an allocation is memory of its own that a
// mapping shows at an address of a reservation, as a shared mapping a
// forked child inherits and writes through unless it is marked
// MADV_DONTFORK; the CPU reaches a mapping only once cuMemSetAccess opened
// it to a host location, and the devices only once it named them; copies
// and kernels run across mappings side by side in one reservation
// (fakecuda_memory.cpp, copyable). An allocation is shared anonymous memory
// (not a file, which the program's RLIMIT_FSIZE would limit). With FAKECUDA_DIRTY fresh allocations
// read 0xa5, as no documentation promises they read zero. Stricter than
// the driver where that catches mistakes: a mapping covers a whole
// allocation (offset 0), a reservation is freed only once nothing is mapped
// in it, and an unmap names whole mappings.
#include <stdlib.h>

#include "fakecuda_internal.h"
#include "fakecuda_os.h"

namespace fakecuda {
namespace {

constexpr std::uint64_t kHandleMagic = 0x6d6e656d6f566d6dull;  // "mnemoVmm"

// An allocation of cuMemCreate; the handle given out is its address.
struct Allocation {
  std::uint64_t magic;
  void* memory;  // the double's own view of it (os::vmm_create)
  std::size_t size;
  int maps;       // mappings alive
  bool released;  // cuMemRelease called: gone once unmapped
  Allocation* next;
};

struct Reservation {
  std::uintptr_t addr;
  std::size_t size;
  Reservation* next;
};

// All g_lock.
Allocation* g_allocations = nullptr;
Reservation* g_reservations = nullptr;

Allocation* find_allocation(CUmemGenericAllocationHandle h) noexcept {
  for (Allocation* a = g_allocations; a != nullptr; a = a->next) {
    if (reinterpret_cast<CUmemGenericAllocationHandle>(a) == h && a->magic == kHandleMagic &&
        !a->released) {
      return a;
    }
  }
  return nullptr;
}

// Frees an allocation released and no longer mapped.
void maybe_free(Allocation* a) noexcept {
  if (!a->released || a->maps > 0) return;
  for (Allocation** p = &g_allocations; *p != nullptr; p = &(*p)->next) {
    if (*p == a) {
      *p = a->next;
      break;
    }
  }
  os::vmm_close(a->memory, a->size);
  g_counters.live_bytes.fetch_sub(a->size);
  g_counters.vmm_bytes.fetch_sub(a->size);
  a->magic = 0;
  free(a);
}

Reservation* reservation_holding(std::uintptr_t p, std::size_t n) noexcept {
  for (Reservation* r = g_reservations; r != nullptr; r = r->next) {
    if (p >= r->addr && p - r->addr < r->size && n <= r->size - (p - r->addr)) return r;
  }
  return nullptr;
}

bool host_location(const CUmemLocation& l) noexcept {
  return l.type == CU_MEM_LOCATION_TYPE_HOST ||
         (l.type == CU_MEM_LOCATION_TYPE_HOST_NUMA && l.id == 0);
}

// What cuMemCreate and the granularity query accept: pinned host memory,
// no shareable handle (a host allocation is not IPC capable).
CUresult check_prop(const CUmemAllocationProp* prop) noexcept {
  if (prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!host_location(prop->location))
    return CUDA_ERROR_NOT_SUPPORTED;                        // device memory: not modelled
  if (!g_config.vmm_host) return CUDA_ERROR_INVALID_VALUE;  // before CUDA 12.2: an unknown type
  return CUDA_SUCCESS;
}

// Calls fn(mapping) for the whole mappings that tile [p, p + n) exactly;
// false (nothing called) when they do not.
template <class F>
bool each_mapping(std::uintptr_t p, std::size_t n, F&& fn) noexcept {
  for (std::uintptr_t at = p; at < p + n;) {
    VmmMapping m;
    if (!vmm_index_find(at, &m) || m.len > p + n - at) return false;
    at += m.len;
  }
  for (std::uintptr_t at = p; at < p + n;) {
    VmmMapping m;
    vmm_index_find(at, &m);
    at += m.len;
    fn(m);
  }
  return true;
}

}  // namespace
}  // namespace fakecuda

using namespace fakecuda;

FAKECUDA_API CUresult cuMemGetAllocationGranularity(size_t* granularity,
                                                    const CUmemAllocationProp* prop,
                                                    CUmemAllocationGranularity_flags option) {
  static const char kCall[] = "cuMemGetAllocationGranularity";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  if (granularity == nullptr || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                                 option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)) {
    return fail(kCall, CUDA_ERROR_INVALID_VALUE);
  }
  if (CUresult rc = check_prop(prop); rc != CUDA_SUCCESS) return fail(kCall, rc);
  *granularity = kVmmGranule;
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                          CUdeviceptr addr, unsigned long long flags) {
  static const char kCall[] = "cuMemAddressReserve";
  (void)addr;  // a hint
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  if (ptr == nullptr || size == 0 || size % kVmmGranule != 0 || flags != 0 ||
      (alignment & (alignment - 1)) != 0) {
    return fail(kCall, CUDA_ERROR_INVALID_VALUE);
  }
  lock(kCall);
  CUresult rc = CUDA_SUCCESS;
  void* p = os::vmm_reserve(size, alignment > kVmmGranule ? alignment : kVmmGranule);
  auto* r = p == nullptr ? nullptr : static_cast<Reservation*>(malloc(sizeof(Reservation)));
  if (r == nullptr) {
    if (p != nullptr) os::unmap(p, size);
    rc = CUDA_ERROR_OUT_OF_MEMORY;
  } else {
    *r = Reservation{reinterpret_cast<std::uintptr_t>(p), size, g_reservations};
    g_reservations = r;
  }
  unlock();
  if (rc != CUDA_SUCCESS) return fail(kCall, rc);
  log_line("vmm-reserve ptr=0x%llx size=%zu",
           static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(p)), size);
  *ptr = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  static const char kCall[] = "cuMemAddressFree";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  const auto p = std::uintptr_t(ptr);
  lock(kCall);
  CUresult rc = CUDA_ERROR_INVALID_VALUE;
  for (Reservation** r = &g_reservations; *r != nullptr; r = &(*r)->next) {
    if ((*r)->addr != p || (*r)->size != size) continue;
    if (!index_overlaps(p, size)) {  // still mapped: refused
      Reservation* gone = *r;
      *r = gone->next;
      free(gone);
      os::unmap(reinterpret_cast<void*>(p), size);
      rc = CUDA_SUCCESS;
    }
    break;
  }
  unlock();
  if (rc != CUDA_SUCCESS) return fail(kCall, rc);
  log_line("vmm-free ptr=0x%llx size=%zu", static_cast<unsigned long long>(p), size);
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                  const CUmemAllocationProp* prop, unsigned long long flags) {
  static const char kCall[] = "cuMemCreate";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  if (handle == nullptr || size == 0 || size % kVmmGranule != 0 || flags != 0) {
    return fail(kCall, CUDA_ERROR_INVALID_VALUE);
  }
  if (CUresult rc = check_prop(prop); rc != CUDA_SUCCESS) return fail(kCall, rc);
  lock(kCall);
  CUresult rc = admit(size);
  Allocation* a = nullptr;
  if (rc == CUDA_SUCCESS) {
    // FAKECUDA_DIRTY: fresh memory is not zero (see the file's comment).
    void* memory = os::vmm_create(size, g_config.dirty ? 0xa5 : -1);
    a = memory == nullptr ? nullptr : static_cast<Allocation*>(malloc(sizeof(Allocation)));
    if (a == nullptr) {
      if (memory != nullptr) os::vmm_close(memory, size);
      rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
      *a = Allocation{kHandleMagic, memory, size, 0, false, g_allocations};
      g_allocations = a;
      add_live_bytes(size);
      g_counters.vmm_bytes.fetch_add(size);
    }
  }
  unlock();
  if (rc != CUDA_SUCCESS) return fail(kCall, rc);
  *handle = reinterpret_cast<CUmemGenericAllocationHandle>(a);
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  static const char kCall[] = "cuMemRelease";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  lock(kCall);
  Allocation* a = find_allocation(handle);
  if (a != nullptr) {
    a->released = true;
    maybe_free(a);
  }
  unlock();
  return a == nullptr ? fail(kCall, CUDA_ERROR_INVALID_VALUE) : CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                               CUmemGenericAllocationHandle handle, unsigned long long flags) {
  static const char kCall[] = "cuMemMap";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  const auto p = std::uintptr_t(ptr);
  lock(kCall);
  CUresult rc = CUDA_SUCCESS;
  Allocation* a = find_allocation(handle);
  const Reservation* r = reservation_holding(p, size);
  if (a == nullptr || offset != 0 || flags != 0 || size != a->size || r == nullptr) {
    rc = CUDA_ERROR_INVALID_VALUE;
  } else if (const int e = g_vmm_map_error.load(); e != 0) {
    rc = static_cast<CUresult>(e);  // FAKECUDA_VMM_MAP_ERROR: a driver out of host memory
  } else if (index_overlaps(p, size)) {
    rc = CUDA_ERROR_ALREADY_MAPPED;
  } else if (!os::vmm_map(reinterpret_cast<void*>(p), size, a->memory)) {
    rc = CUDA_ERROR_OUT_OF_MEMORY;
  } else if (!vmm_index_add(VmmMapping{p, size, r->addr, a}, current_ctx())) {
    os::vmm_unmap(reinterpret_cast<void*>(p), size);
    rc = CUDA_ERROR_OUT_OF_MEMORY;
  } else {
    ++a->maps;
  }
  unlock();
  if (rc != CUDA_SUCCESS) return fail(kCall, rc);
  g_counters.vmm_map_calls.fetch_add(1);
  log_line("vmm-map kind=host ptr=0x%llx size=%zu rc=0", static_cast<unsigned long long>(p), size);
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  static const char kCall[] = "cuMemUnmap";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  const auto p = std::uintptr_t(ptr);
  lock(kCall);
  const bool ok = size != 0 && each_mapping(p, size, [](const VmmMapping& m) {
                    os::vmm_unmap(reinterpret_cast<void*>(m.addr), m.len);
                    vmm_index_remove(m.addr);
                    auto* a = static_cast<Allocation*>(m.handle);
                    --a->maps;
                    maybe_free(a);
                  });
  unlock();
  if (!ok) return fail(kCall, CUDA_ERROR_INVALID_VALUE);
  g_counters.vmm_unmap_calls.fetch_add(1);
  log_line("vmm-unmap kind=host ptr=0x%llx size=%zu rc=0", static_cast<unsigned long long>(p),
           size);
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                                     size_t count) {
  static const char kCall[] = "cuMemSetAccess";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  if (desc == nullptr || count == 0) return fail(kCall, CUDA_ERROR_INVALID_VALUE);
  for (std::size_t i = 0; i < count; ++i) {
    const CUmemAccessDesc& d = desc[i];
    const bool place =
        host_location(d.location) ||
        (d.location.type == CU_MEM_LOCATION_TYPE_DEVICE && valid_device(d.location.id));
    if (!place ||
        (d.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && d.flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
         d.flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)) {
      return fail(kCall, CUDA_ERROR_INVALID_VALUE);
    }
  }
  const auto p = std::uintptr_t(ptr);
  lock(kCall);
  bool ok = true;
  const bool tiled =
      size != 0 && each_mapping(p, size, [&](const VmmMapping& m) {
        for (std::size_t i = 0; i < count; ++i) {
          const CUmemAccessDesc& d = desc[i];
          if (d.location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
            vmm_index_set_device_access(m.addr, d.flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
          } else {
            ok = os::vmm_protect(reinterpret_cast<void*>(m.addr), m.len,
                                 d.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE,
                                 d.flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) &&
                 ok;
          }
        }
      });
  unlock();
  if (!tiled) return fail(kCall, CUDA_ERROR_INVALID_VALUE);
  if (!ok) return fail(kCall, CUDA_ERROR_OUT_OF_MEMORY);
  return CUDA_SUCCESS;
}
