// What a GPU does with memory plain malloc returned: the probe that
// scripts/gpu-check.sh runs on a real driver, tried against the test double
// first (tests/gpu/meson.build).
//
//   gpu_probe kernel malloc|new|vector   a kernel adds 7 to every int of a
//                                        4 MiB block from that allocator,
//                                        with no cudaMalloc and no copy
//   gpu_probe attributes                 the driver's pointer attributes and
//                                        preferred location of a 64-byte
//                                        and a 64 MiB malloc
//   gpu_probe costs                      cuInit, the primary context, and
//                                        each allocation call and
//                                        cuMemAdvise at 4 KiB, 2 MiB, 64 MiB
//   gpu_probe zero                       whether fresh and reused driver
//                                        memory reads zero, and what a
//                                        256 MiB calloc costs under this heap
//   gpu_probe fork                       the smaps flags and mincore answer
//                                        of a malloc'd block, before and
//                                        after a kernel wrote it, and what
//                                        a forked child reads there
//   gpu_probe touch                      first-touch bandwidth of two
//                                        256 MiB mallocs: one from the CPU,
//                                        one from a kernel
//   gpu_probe context-cost               the device memory one more process's
//                                        context takes (a child holds one)
//   gpu_probe gains                      what the heap buys a program that
//                                        moves data to the GPU: copy
//                                        bandwidth of a 256 MiB malloc'd
//                                        block (and of a cuMemHostAlloc
//                                        buffer), whether an async copy
//                                        overlaps a running kernel, a
//                                        kernel on the block in place
//                                        against one on a device copy
//   gpu_probe reset                      cuDevicePrimaryCtxReset (what
//                                        cudaDeviceReset does) under a live
//                                        heap: one line per step survived
//
// The driver is MNEMOSYNE_CUDA_DRIVER, else libcuda.so.1, opened at run
// time (no CUDA library is linked); the kernel is PTX text, compiled by the
// driver, so no nvcc is needed anywhere. One line per finding on stdout,
// "key=value" pairs for the script to read. Exit status: 0 when the probe
// ran (whatever it found), 1 when it could not (no driver, cuInit failed).
#include <dlfcn.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <new>
#include <string>
#include <vector>

#include <cuda.h>

namespace {

// The kernel, data[i] += delta for i < n: tests/gpu/probe_add.ptx, made a
// string by tests/gpu/embed_ptx.py.
#include "probe_add_ptx.h"

struct Driver {
  CUresult (*init)(unsigned);
  CUresult (*device_get)(CUdevice*, int);
  CUresult (*device_count)(int*);
  CUresult (*device_attribute)(int*, CUdevice_attribute, CUdevice);
  CUresult (*ctx_retain)(CUcontext*, CUdevice);
  CUresult (*ctx_set)(CUcontext);
  CUresult (*module_load)(CUmodule*, const void*);
  CUresult (*module_function)(CUfunction*, CUmodule, const char*);
  CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                     unsigned, CUstream, void**, void**);
  CUresult (*synchronize)();
  CUresult (*pointer_attribute)(void*, CUpointer_attribute, CUdeviceptr);
  CUresult (*mem_info)(size_t*, size_t*);
  CUresult (*alloc_managed)(CUdeviceptr*, size_t, unsigned);
  CUresult (*mem_free)(CUdeviceptr);
  CUresult (*alloc_host)(void**, size_t, unsigned);
  CUresult (*free_host)(void*);
  CUresult (*error_name)(CUresult, const char**);
  CUresult (*range_attribute)(void*, size_t, CUmem_range_attribute, CUdeviceptr, size_t);
  CUresult (*advise)(CUdeviceptr, size_t, CUmem_advise, CUmemLocation);  // _v2; optional
  CUresult (*host_register)(void*, size_t, unsigned);                    // _v2; optional
  CUresult (*host_unregister)(void*);                                    // optional
  CUresult (*ctx_reset)(CUdevice);                                       // optional
  CUresult (*memcpy_dtoh)(void*, CUdeviceptr, size_t);                   // _v2
  CUresult (*mem_alloc)(CUdeviceptr*, size_t);                           // _v2; optional
  CUresult (*memcpy_htod)(CUdeviceptr, const void*, size_t);             // _v2; optional
};

Driver g_cu;
CUdevice g_device = 0;
void* g_lib = nullptr;  // the driver library, for entries resolved later

template <typename Fn>
bool resolve(void* lib, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*out == nullptr) std::printf("probe error=missing-entry name=%s\n", name);
  return *out != nullptr;
}

const char* name_of(CUresult rc) {
  const char* name = nullptr;
  if (g_cu.error_name == nullptr || g_cu.error_name(rc, &name) != CUDA_SUCCESS || !name) {
    return "CUDA_ERROR_UNKNOWN";
  }
  return name;
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// Opens the driver and resolves every entry the probe uses.
bool open_driver() {
  const char* path = std::getenv("MNEMOSYNE_CUDA_DRIVER");
  if (path == nullptr || *path == '\0') path = "libcuda.so.1";
  void* lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  g_lib = lib;
  if (lib == nullptr) {
    std::printf("probe error=no-driver path=%s\n", path);
    return false;
  }
  bool ok = resolve(lib, "cuInit", &g_cu.init) & resolve(lib, "cuDeviceGet", &g_cu.device_get) &
            resolve(lib, "cuDeviceGetCount", &g_cu.device_count) &
            resolve(lib, "cuDeviceGetAttribute", &g_cu.device_attribute) &
            resolve(lib, "cuDevicePrimaryCtxRetain", &g_cu.ctx_retain) &
            resolve(lib, "cuCtxSetCurrent", &g_cu.ctx_set) &
            resolve(lib, "cuModuleLoadData", &g_cu.module_load) &
            resolve(lib, "cuModuleGetFunction", &g_cu.module_function) &
            resolve(lib, "cuLaunchKernel", &g_cu.launch) &
            resolve(lib, "cuCtxSynchronize", &g_cu.synchronize) &
            resolve(lib, "cuPointerGetAttribute", &g_cu.pointer_attribute) &
            resolve(lib, "cuMemGetInfo_v2", &g_cu.mem_info) &
            resolve(lib, "cuMemAllocManaged", &g_cu.alloc_managed) &
            resolve(lib, "cuMemFree_v2", &g_cu.mem_free) &
            resolve(lib, "cuMemHostAlloc", &g_cu.alloc_host) &
            resolve(lib, "cuMemFreeHost", &g_cu.free_host) &
            resolve(lib, "cuGetErrorName", &g_cu.error_name) &
            resolve(lib, "cuMemRangeGetAttribute", &g_cu.range_attribute) &
            resolve(lib, "cuMemcpyDtoH_v2", &g_cu.memcpy_dtoh);
  // Device memory and host-to-device copies: optional (a driver without
  // them gets "no-device-memory" rows).
  g_cu.mem_alloc = reinterpret_cast<decltype(g_cu.mem_alloc)>(dlsym(lib, "cuMemAlloc_v2"));
  g_cu.memcpy_htod = reinterpret_cast<decltype(g_cu.memcpy_htod)>(dlsym(lib, "cuMemcpyHtoD_v2"));
  // Drivers before CUDA 12.2 have only the CUdevice form of cuMemAdvise.
  g_cu.advise = reinterpret_cast<decltype(g_cu.advise)>(dlsym(lib, "cuMemAdvise_v2"));
  g_cu.ctx_reset =
      reinterpret_cast<CUresult (*)(CUdevice)>(dlsym(lib, "cuDevicePrimaryCtxReset_v2"));
  g_cu.host_register =
      reinterpret_cast<decltype(g_cu.host_register)>(dlsym(lib, "cuMemHostRegister_v2"));
  g_cu.host_unregister =
      reinterpret_cast<decltype(g_cu.host_unregister)>(dlsym(lib, "cuMemHostUnregister"));
  return ok;
}

// cuInit, then the device's primary context, made current. Times both.
bool start_driver(double* init_ms, double* ctx_ms) {
  auto t = std::chrono::steady_clock::now();
  CUresult rc = g_cu.init(0);
  if (init_ms != nullptr) *init_ms = ms_since(t);
  if (rc != CUDA_SUCCESS) {
    std::printf("probe error=cuInit rc=%s\n", name_of(rc));
    return false;
  }
  const char* ordinal = std::getenv("MNEMOSYNE_DEVICE");
  const int dev = ordinal != nullptr ? std::atoi(ordinal) : 0;
  CUcontext ctx = nullptr;
  t = std::chrono::steady_clock::now();
  rc = g_cu.device_get(&g_device, dev);
  if (rc == CUDA_SUCCESS) rc = g_cu.ctx_retain(&ctx, g_device);
  if (rc == CUDA_SUCCESS) rc = g_cu.ctx_set(ctx);
  if (ctx_ms != nullptr) *ctx_ms = ms_since(t);
  if (rc != CUDA_SUCCESS) {
    std::printf("probe error=context device=%d rc=%s\n", dev, name_of(rc));
    return false;
  }
  return true;
}

std::string attributes_of(const void* p) {
  unsigned managed = 0;
  unsigned type = 0;
  int ordinal = -1;
  const auto dp = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
  CUresult rc = g_cu.pointer_attribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, dp);
  if (rc != CUDA_SUCCESS) return std::string("driver_memory=0 rc=") + name_of(rc);
  g_cu.pointer_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dp);
  g_cu.pointer_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dp);
  const char* type_name = type == CU_MEMORYTYPE_HOST     ? "host"
                          : type == CU_MEMORYTYPE_DEVICE ? "device"
                                                         : "other";
  return "driver_memory=1 is_managed=" + std::to_string(managed) + " memory_type=" + type_name +
         " device=" + std::to_string(ordinal);
}

// cuMemRangeGetAttribute's PREFERRED_LOCATION of [p, p + size): a device
// ordinal, "cpu", "none" (CU_DEVICE_INVALID: not advised, or mixed), or
// the error (pinned memory is not managed, so the driver refuses).
std::string preferred_location(const void* p, std::size_t size) {
  int where = 0;
  const auto dp = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
  const CUresult rc = g_cu.range_attribute(&where, sizeof where,
                                           CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, dp, size);
  if (rc != CUDA_SUCCESS) return name_of(rc);
  if (where == CU_DEVICE_CPU) return "cpu";
  if (where == CU_DEVICE_INVALID) return "none";
  return std::to_string(where);
}

// The probe kernel, compiled by the driver from kPtx.
CUresult load_kernel(CUfunction* add) {
  CUmodule module = nullptr;
  CUresult rc = g_cu.module_load(&module, kPtx);
  if (rc == CUDA_SUCCESS) rc = g_cu.module_function(add, module, "mnemosyne_probe_add");
  return rc;
}

// data[i] += delta on the GPU for i < n, then waits for it.
CUresult add_on_gpu(CUfunction add, int* data, unsigned n, int delta) {
  void* params[] = {&data, &n, &delta};
  CUresult rc = g_cu.launch(add, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, params, nullptr);
  return rc == CUDA_SUCCESS ? g_cu.synchronize() : rc;
}

// The index pattern data[i] = i, and whether data[i] == i + delta after the
// kernel added delta.
void fill_index(int* data, unsigned n) {
  for (unsigned i = 0; i < n; ++i) data[i] = static_cast<int>(i);
}
bool holds_index_plus(const int* data, unsigned n, int delta) {
  for (unsigned i = 0; i < n; ++i) {
    if (data[i] != static_cast<int>(i) + delta) return false;
  }
  return true;
}

// cuMemAdvise_v2 SET_PREFERRED_LOCATION to the probe's device;
// CUDA_ERROR_NOT_FOUND on a driver without it.
CUresult prefer_device(CUdeviceptr dp, std::size_t size) {
  if (g_cu.advise == nullptr) return CUDA_ERROR_NOT_FOUND;
  CUmemLocation device{};
  device.type = CU_MEM_LOCATION_TYPE_DEVICE;
  device.id = g_device;
  return g_cu.advise(dp, size, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, device);
}

// start_driver, then the kernel; on failure one "WHAT result=no-kernel" line.
bool start_with_kernel(const char* what, CUfunction* add) {
  if (!start_driver(nullptr, nullptr)) return false;
  if (CUresult rc = load_kernel(add); rc != CUDA_SUCCESS) {
    std::printf("%s result=no-kernel rc=%s\n", what, name_of(rc));
    return false;
  }
  return true;
}

int run_kernel(const std::string& kind) {
  CUfunction add = nullptr;
  if (!start_with_kernel("kernel", &add)) return 1;
  int pageable = 0;
  g_cu.device_attribute(&pageable, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, g_device);
  constexpr unsigned kCount = 1u << 20;  // 4 MiB of ints
  std::vector<int> from_vector;
  int* data = nullptr;
  if (kind == "malloc") {
    data = static_cast<int*>(std::malloc(kCount * sizeof(int)));
  } else if (kind == "new") {
    data = new int[kCount];
  } else if (kind == "vector") {
    from_vector.resize(kCount);
    data = from_vector.data();
  } else {
    std::fprintf(stderr, "gpu_probe: kernel malloc|new|vector\n");
    return 2;
  }
  fill_index(data, kCount);
  const auto t = std::chrono::steady_clock::now();
  const CUresult rc = add_on_gpu(add, data, kCount, 7);
  const double ms = ms_since(t);
  const char* result = rc != CUDA_SUCCESS                  ? name_of(rc)
                       : holds_index_plus(data, kCount, 7) ? "ok"
                                                           : "wrong-data";
  std::printf("kernel kind=%s result=%s ms=%.3f pageable_memory_access=%d %s\n", kind.c_str(),
              result, ms, pageable, attributes_of(data).c_str());
  if (kind == "malloc") std::free(data);
  if (kind == "new") delete[] data;
  return 0;
}

int run_attributes() {
  if (!start_driver(nullptr, nullptr)) return 1;
  for (std::size_t size : {std::size_t{64}, std::size_t{64} << 20}) {
    void* p = std::malloc(size);
    std::printf("attributes size=%zu %s preferred_location=%s\n", size, attributes_of(p).c_str(),
                preferred_location(p, size).c_str());
    std::free(p);
  }
  return 0;
}

// The median of a non-empty set of timings.
double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The median in ms, or "failed" when no call succeeded.
std::string median_ms(const std::vector<double>& v) {
  if (v.empty()) return "failed";
  char text[32];
  std::snprintf(text, sizeof text, "%.4f", median_of(v));
  return text;
}

// What the pinned backend's reservations rely on: whether the device reaches
// registered memory at its host address (CAN_USE_HOST_POINTER_FOR_
// REGISTERED_MEM), and what registering one 1 MiB granule of anonymous
// memory marked MADV_DONTFORK, as a reservation is, and unregistering it
// cost (median of 20).
int run_register_costs() {
  int same_address = -1;
  CUdevice dev = 0;
  g_cu.device_get(&dev, 0);
  g_cu.device_attribute(&same_address, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
                        dev);
  if (g_cu.host_register == nullptr || g_cu.host_unregister == nullptr) {
    std::printf("register-cost host_pointer=%d register_ms=missing unregister_ms=missing\n",
                same_address);
    return 0;
  }
  constexpr std::size_t kGranule = std::size_t{1} << 20;
  void* p =
      mmap(nullptr, 20 * kGranule, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return 1;
  const int dontfork = madvise(p, 20 * kGranule, MADV_DONTFORK);
  std::vector<double> reg;
  std::vector<double> unreg;
  CUresult last = CUDA_SUCCESS;
  for (int i = 0; i < 20; ++i) {
    char* g = static_cast<char*>(p) + i * kGranule;
    auto t = std::chrono::steady_clock::now();
    last =
        g_cu.host_register(g, kGranule, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE);
    if (last != CUDA_SUCCESS) continue;
    reg.push_back(ms_since(t));
    t = std::chrono::steady_clock::now();
    if (g_cu.host_unregister(g) == CUDA_SUCCESS) unreg.push_back(ms_since(t));
  }
  munmap(p, 20 * kGranule);
  std::printf("register-cost host_pointer=%d dontfork=%s register_ms=%s unregister_ms=%s last=%s\n",
              same_address, dontfork == 0 ? "yes" : "refused", median_ms(reg).c_str(),
              median_ms(unreg).c_str(), name_of(last));
  return 0;
}

int run_costs() {
  double init_ms = 0;
  double ctx_ms = 0;
  if (!start_driver(&init_ms, &ctx_ms)) return 1;
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  int devices = 0;
  g_cu.mem_info(&free_bytes, &total_bytes);
  g_cu.device_count(&devices);
  std::printf("costs cuinit_ms=%.3f context_ms=%.3f device_free=%zu device_total=%zu devices=%d\n",
              init_ms, ctx_ms, free_bytes, total_bytes, devices);
  for (std::size_t size : {std::size_t{4} << 10, std::size_t{2} << 20, std::size_t{64} << 20}) {
    std::vector<double> managed;
    std::vector<double> advise;
    std::vector<double> host;
    for (int i = 0; i < 10; ++i) {
      CUdeviceptr dp = 0;
      auto t = std::chrono::steady_clock::now();
      CUresult rc = g_cu.alloc_managed(&dp, size, CU_MEM_ATTACH_GLOBAL);
      if (rc == CUDA_SUCCESS) {
        managed.push_back(ms_since(t));
        t = std::chrono::steady_clock::now();
        if (prefer_device(dp, size) == CUDA_SUCCESS) advise.push_back(ms_since(t));
        g_cu.mem_free(dp);
      }
      void* hp = nullptr;
      t = std::chrono::steady_clock::now();
      rc = g_cu.alloc_host(&hp, size, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE);
      if (rc == CUDA_SUCCESS) {
        host.push_back(ms_since(t));
        g_cu.free_host(hp);
      }
    }
    std::printf("alloc-cost size=%zu managed_ms=%s advise_ms=%s pinned_ms=%s\n", size,
                median_ms(managed).c_str(), median_ms(advise).c_str(), median_ms(host).c_str());
  }
  return run_register_costs();
}

// This process's resident set (VmRSS), in KiB; 0 when unreadable.
long rss_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  }
  return 0;
}

bool all_equal(const int* data, std::size_t count, int value) {
  return std::all_of(data, data + count, [value](int v) { return v == value; });
}

// One kind of driver memory for run_zero: managed, managed that prefers
// the device and is first touched by the GPU, or pinned host memory.
struct ZeroKind {
  const char* name;
  bool managed;
  bool gpu_first;
};

void* driver_alloc(const ZeroKind& kind, std::size_t bytes) {
  if (!kind.managed) {
    void* p = nullptr;
    return g_cu.alloc_host(&p, bytes, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE) ==
                   CUDA_SUCCESS
               ? p
               : nullptr;
  }
  CUdeviceptr dp = 0;
  if (g_cu.alloc_managed(&dp, bytes, CU_MEM_ATTACH_GLOBAL) != CUDA_SUCCESS) return nullptr;
  if (kind.gpu_first) prefer_device(dp, bytes);
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(dp));
}

void driver_free(const ZeroKind& kind, void* p) {
  if (kind.managed) {
    g_cu.mem_free(static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p)));
  } else {
    g_cu.free_host(p);
  }
}

// Whether a fresh block reads zero: from the CPU, or (gpu_first) as the GPU
// sees it, by a kernel adding 1 to what it reads there.
const char* reads_zero(CUfunction add, const ZeroKind& kind, int* data, unsigned count) {
  if (!kind.gpu_first) return all_equal(data, count, 0) ? "1" : "0";
  if (add_on_gpu(add, data, count, 1) != CUDA_SUCCESS) return "kernel-failed";
  return all_equal(data, count, 1) ? "1" : "0";
}

// Whether the driver hands out memory that reads zero, first in this
// process and again after a block written by the CPU and the GPU was freed
// (mnemosyne trusts only what the module's setting or this says); then
// what a calloc of 256 MiB and of 1100 MiB costs under the heap this runs with.
int run_zero() {
  CUfunction add = nullptr;
  if (!start_with_kernel("zero", &add)) return 1;
  constexpr std::size_t kBytes = std::size_t{64} << 20;
  constexpr unsigned kCount = kBytes / sizeof(int);
  for (const ZeroKind& kind : {ZeroKind{"managed", true, false}, ZeroKind{"device", true, true},
                               ZeroKind{"pinned", false, false}}) {
    auto* first = static_cast<int*>(driver_alloc(kind, kBytes));
    if (first == nullptr) {
      std::printf("zero kind=%s fresh=alloc-failed\n", kind.name);
      continue;
    }
    const char* fresh = reads_zero(add, kind, first, kCount);
    std::memset(first, 0xa5, kBytes);
    add_on_gpu(add, first, kCount, 7);
    driver_free(kind, first);
    auto* again = static_cast<int*>(driver_alloc(kind, kBytes));
    const char* reused = again != nullptr ? reads_zero(add, kind, again, kCount) : "alloc-failed";
    std::printf("zero kind=%s fresh=%s reused=%s same_address=%d\n", kind.name, fresh, reused,
                again == first ? 1 : 0);
    if (again != nullptr) driver_free(kind, again);
  }
  // calloc of a huge arena block and of a dedicated one: its time, the host
  // RAM it took (before anything reads it), and its zeros (one int per MiB,
  // at an offset that moves through the pages: reading every page would
  // bring managed memory to the CPU, and populate it on some kernels).
  for (const std::size_t bytes : {std::size_t{256} << 20, std::size_t{1100} << 20}) {
    const long rss_before = rss_kib();
    const auto t = std::chrono::steady_clock::now();
    auto* block = static_cast<int*>(std::calloc(bytes, 1));
    const double ms = ms_since(t);
    const long rss_mib = (rss_kib() - rss_before) >> 10;
    bool zero = block != nullptr;
    constexpr std::size_t kMiBInts = (std::size_t{1} << 20) / sizeof(int);
    for (std::size_t i = 0; zero && i < bytes / sizeof(int); i += kMiBInts) {
      zero = block[i + (i / 1024 * 1027) % kMiBInts] == 0;
    }
    if (zero) zero = block[bytes / sizeof(int) - 1] == 0;
    std::printf("zero calloc_bytes=%zu calloc_ms=%.2f calloc_rss_mib=%ld calloc_zero=%d %s\n",
                bytes, ms, rss_mib, zero ? 1 : 0, attributes_of(block).c_str());
    std::free(block);
  }
  return 0;
}

// The VmFlags line of the /proc/self/smaps mapping that holds p.
std::string smaps_flags(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long start = 0;
    unsigned long end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &start, &end) == 2 && line.find(':') > 8) {
      inside = start <= addr && addr < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      std::string flags = line.substr(8);
      while (!flags.empty() && flags.front() == ' ') flags.erase(0, 1);
      while (!flags.empty() && flags.back() == ' ') flags.pop_back();
      for (char& c : flags) c = c == ' ' ? ',' : c;
      return flags;
    }
  }
  return "unknown";
}

// "resident/pages" by mincore, or the error.
std::string resident(const void* p, std::size_t len) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<std::uintptr_t>(p) / page * page;
  const std::size_t pages = (reinterpret_cast<std::uintptr_t>(p) + len - start + page - 1) / page;
  std::vector<unsigned char> vec(pages);
  if (mincore(reinterpret_cast<void*>(start), pages * page, vec.data()) != 0) {
    return std::string("error:") + std::strerror(errno);
  }
  std::size_t in = 0;
  for (unsigned char v : vec) in += v & 1;
  return std::to_string(in) + "/" + std::to_string(pages);
}

int run_fork() {
  CUfunction add = nullptr;
  if (!start_with_kernel("fork", &add)) return 1;
  constexpr unsigned kCount = 2u << 20;  // 8 MiB of ints
  int* data = static_cast<int*>(std::malloc(kCount * sizeof(int)));
  fill_index(data, kCount);
  std::printf("fork smaps_vmflags=%s\n", smaps_flags(data).c_str());
  std::printf("fork mincore_after_cpu_write=%s\n", resident(data, kCount * sizeof(int)).c_str());
  const CUresult rc = add_on_gpu(add, data, kCount, 7);
  std::printf("fork kernel=%s mincore_after_gpu_write=%s\n", name_of(rc),
              resident(data, kCount * sizeof(int)).c_str());
  const pid_t child = fork();
  if (child == 0) _exit(holds_index_plus(data, kCount, 7) ? 0 : 1);
  int status = 0;
  waitpid(child, &status, 0);
  const char* seen =
      WIFEXITED(status) ? (WEXITSTATUS(status) == 0 ? "same-data" : "wrong-data") : "killed";
  std::printf("fork child=%s signal=%d\n", seen, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  std::free(data);
  return 0;
}

int run_touch() {
  CUfunction add = nullptr;
  if (!start_with_kernel("touch", &add)) return 1;
  constexpr std::size_t kBytes = std::size_t{256} << 20;
  constexpr unsigned kCount = kBytes / sizeof(int);
  int* cpu = static_cast<int*>(std::malloc(kBytes));
  int* gpu = static_cast<int*>(std::malloc(kBytes));
  auto t = std::chrono::steady_clock::now();
  std::memset(cpu, 0, kBytes);
  const double cpu_ms = ms_since(t);
  add_on_gpu(add, gpu, 256, 0);  // the kernel's own start-up, not the memory's
  t = std::chrono::steady_clock::now();
  const CUresult rc = add_on_gpu(add, gpu, kCount, 1);
  const double gpu_ms = ms_since(t);
  std::printf("touch bytes=%zu cpu_first_touch_gbs=%.2f gpu_first_touch_gbs=%.2f kernel=%s\n",
              kBytes, kBytes / cpu_ms / 1e6, kBytes / gpu_ms / 1e6, name_of(rc));
  std::free(cpu);
  std::free(gpu);
  return 0;
}

// ---- gains: what a heap in driver memory buys (scripts/gpu-check.sh's
// "What the heap buys" table, issue 48)

struct Streams {
  CUresult (*create)(CUstream*, unsigned) = nullptr;
  CUresult (*sync)(CUstream) = nullptr;
  CUresult (*destroy)(CUstream) = nullptr;
  CUresult (*htod_async)(CUdeviceptr, const void*, size_t, CUstream) = nullptr;
};

template <typename Fn>
void optional_entry(const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(g_lib, name));
}

// `launches` launches of the kernel over `count` ints at `data`, on `stream`.
CUresult add_launches(CUfunction add, CUstream stream, CUdeviceptr data, unsigned count,
                      int launches) {
  int delta = 1;
  void* params[] = {&data, &count, &delta};
  for (int i = 0; i < launches; ++i) {
    const CUresult rc =
        g_cu.launch(add, (count + 255) / 256, 1, 1, 256, 1, 1, 0, stream, params, nullptr);
    if (rc != CUDA_SUCCESS) return rc;
  }
  return CUDA_SUCCESS;
}

// One buffer's row: synchronous copies both ways (median of 3), then an
// asynchronous copy to the device beside kernels on another stream, sized
// to take about as long: overlap 1 when the two ran together, 0 when one
// waited for the other (a pageable buffer's copy is staged by the CPU, and
// its call returns only once the data is staged).
void gains_row(const char* name, void* buf, std::size_t bytes, CUdeviceptr dev, CUdeviceptr busy,
               CUfunction add, const Streams& st) {
  std::vector<double> to, from;
  CUresult rc = CUDA_SUCCESS;
  for (int i = 0; i < 3 && rc == CUDA_SUCCESS; ++i) {
    auto t = std::chrono::steady_clock::now();
    rc = g_cu.memcpy_htod(dev, buf, bytes);
    to.push_back(ms_since(t));
    t = std::chrono::steady_clock::now();
    if (rc == CUDA_SUCCESS) rc = g_cu.memcpy_dtoh(buf, dev, bytes);
    from.push_back(ms_since(t));
  }
  if (rc != CUDA_SUCCESS) {
    std::printf("gains buffer=%s rc=%s\n", name, name_of(rc));
    return;
  }
  const double htod_ms = median_of(to);
  const double dtoh_ms = median_of(from);
  std::string overlap = "no-streams";
  if (st.create != nullptr && st.sync != nullptr && st.htod_async != nullptr) {
    CUstream copy_s = nullptr;
    CUstream work_s = nullptr;
    st.create(&copy_s, CU_STREAM_NON_BLOCKING);
    st.create(&work_s, CU_STREAM_NON_BLOCKING);
    const auto count = static_cast<unsigned>(bytes / sizeof(int));
    auto t = std::chrono::steady_clock::now();
    rc = st.htod_async(dev, buf, bytes, copy_s);
    const double call_ms = ms_since(t);
    if (rc == CUDA_SUCCESS) rc = st.sync(copy_s);
    const double copy_ms = ms_since(t);
    add_launches(add, work_s, busy, count, 1);  // the kernel's own start-up
    st.sync(work_s);
    t = std::chrono::steady_clock::now();
    if (rc == CUDA_SUCCESS) rc = add_launches(add, work_s, busy, count, 1);
    if (rc == CUDA_SUCCESS) rc = st.sync(work_s);
    const double one_ms = std::max(ms_since(t), 0.001);
    const int launches = std::clamp(static_cast<int>(copy_ms / one_ms + 0.5), 1, 1000);
    t = std::chrono::steady_clock::now();
    if (rc == CUDA_SUCCESS) rc = add_launches(add, work_s, busy, count, launches);
    if (rc == CUDA_SUCCESS) rc = st.sync(work_s);
    const double kernels_ms = ms_since(t);
    t = std::chrono::steady_clock::now();
    if (rc == CUDA_SUCCESS) rc = add_launches(add, work_s, busy, count, launches);
    if (rc == CUDA_SUCCESS) rc = st.htod_async(dev, buf, bytes, copy_s);
    if (rc == CUDA_SUCCESS) rc = st.sync(copy_s);
    if (rc == CUDA_SUCCESS) rc = st.sync(work_s);
    const double both_ms = ms_since(t);
    if (st.destroy != nullptr) {
      st.destroy(copy_s);
      st.destroy(work_s);
    }
    char line[160];
    const double shorter = std::max(std::min(copy_ms, kernels_ms), 0.001);
    const double gained = std::clamp((copy_ms + kernels_ms - both_ms) / shorter, 0.0, 1.0);
    std::snprintf(line, sizeof line,
                  "%.2f async_call_ms=%.2f copy_ms=%.2f kernels_ms=%.2f both_ms=%.2f", gained,
                  call_ms, copy_ms, kernels_ms, both_ms);
    overlap = rc == CUDA_SUCCESS ? line : name_of(rc);
  }
  std::printf("gains buffer=%s htod_gbs=%.2f dtoh_gbs=%.2f overlap=%s\n", name,
              bytes / htod_ms / 1e6, bytes / dtoh_ms / 1e6, overlap.c_str());
}

int run_gains() {
  CUfunction add = nullptr;
  if (!start_with_kernel("gains", &add)) return 1;
  if (g_cu.mem_alloc == nullptr || g_cu.memcpy_htod == nullptr) {
    std::printf("gains result=no-device-memory\n");
    return 0;
  }
  Streams st;
  optional_entry("cuStreamCreate", &st.create);
  optional_entry("cuStreamSynchronize", &st.sync);
  optional_entry("cuStreamDestroy_v2", &st.destroy);
  optional_entry("cuMemcpyHtoDAsync_v2", &st.htod_async);
  constexpr std::size_t kBytes = std::size_t{256} << 20;
  constexpr unsigned kCount = kBytes / sizeof(int);
  int* heap = static_cast<int*>(std::malloc(kBytes));
  void* reference = nullptr;
  CUdeviceptr dev = 0;
  CUdeviceptr busy = 0;
  CUresult rc = heap == nullptr ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
  if (rc == CUDA_SUCCESS) rc = g_cu.alloc_host(&reference, kBytes, 0);
  if (rc == CUDA_SUCCESS) rc = g_cu.mem_alloc(&dev, kBytes);
  if (rc == CUDA_SUCCESS) rc = g_cu.mem_alloc(&busy, kBytes);
  if (rc != CUDA_SUCCESS) {
    std::printf("gains result=no-memory rc=%s\n", name_of(rc));
    return 0;
  }
  fill_index(heap, kCount);
  std::memcpy(reference, heap, kBytes);
  std::printf("gains bytes=%zu heap=%s\n", kBytes, attributes_of(heap).c_str());
  gains_row("malloc", heap, kBytes, dev, busy, add, st);
  gains_row("cuMemHostAlloc", reference, kBytes, dev, busy, add, st);

  // The kernel on the heap block in place (median of 3 launches after a
  // first, which may migrate it), against the block copied into device
  // memory first and the kernel there: what a program gains by not copying.
  // Memory the device cannot reach is not launched on (the fault would end
  // the context).
  int pageable = 0;
  g_cu.device_attribute(&pageable, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, g_device);
  unsigned type = 0;
  const bool driver_memory =
      g_cu.pointer_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                             static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(heap))) ==
      CUDA_SUCCESS;
  std::string inplace = "unreachable";
  int added = 0;
  if (driver_memory || pageable != 0) {
    std::vector<double> runs;
    rc = CUDA_SUCCESS;
    for (int i = 0; i < 4 && rc == CUDA_SUCCESS; ++i) {
      const auto t = std::chrono::steady_clock::now();
      rc = add_on_gpu(add, heap, kCount, 1);
      if (i > 0) runs.push_back(ms_since(t));
      ++added;
    }
    char ms[64];
    std::snprintf(ms, sizeof ms, "%.2f", rc == CUDA_SUCCESS ? median_of(runs) : -1.0);
    inplace = rc == CUDA_SUCCESS ? ms : name_of(rc);
  }
  std::vector<double> copied;
  rc = CUDA_SUCCESS;
  for (int i = 0; i < 3 && rc == CUDA_SUCCESS; ++i) {
    const auto t = std::chrono::steady_clock::now();
    rc = g_cu.memcpy_htod(dev, heap, kBytes);
    if (rc == CUDA_SUCCESS) rc = add_on_gpu(add, reinterpret_cast<int*>(dev), kCount, 1);
    copied.push_back(ms_since(t));
  }
  const bool correct = holds_index_plus(heap, kCount, added);
  std::printf("gains kernel_inplace_ms=%s kernel_copied_ms=%.2f inplace_correct=%d\n",
              inplace.c_str(), rc == CUDA_SUCCESS ? median_of(copied) : -1.0, correct ? 1 : 0);
  g_cu.mem_free(dev);
  g_cu.mem_free(busy);
  g_cu.free_host(reference);
  std::free(heap);
  return 0;
}

// Driver copies of malloc'd blocks (what cudaMemcpy and torch's .cuda() do
// with a program's buffers): each block is copied out by cuMemcpyDtoH (its
// host address is its device address, UVA) into memory of the probe's own
// (mmap, outside the heap) and, where the driver has device memory, to the
// device and back (cuMemcpyHtoD, cuMemcpyDtoH). Sizes cross the 1 MiB
// granules MNEMOSYNE_PIN=granule registers one by one: the driver refuses a
// copy of a block spanning two registrations.
int run_copy() {
  if (!start_driver(nullptr, nullptr)) return 1;
  for (const std::size_t size : {std::size_t{64} << 10, std::size_t{900} << 10,
                                 std::size_t{3} << 20, std::size_t{64} << 20}) {
    auto* block = static_cast<unsigned char*>(std::malloc(size));
    void* out = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (block == nullptr || out == MAP_FAILED) return 1;
    for (std::size_t i = 0; i < size; ++i) block[i] = static_cast<unsigned char>(i * 7 + 1);
    const auto at = reinterpret_cast<std::uintptr_t>(block);
    const bool spans = at >> 20 != (at + size - 1) >> 20;
    CUresult rc = g_cu.memcpy_dtoh(out, at, size);
    const bool out_ok = rc == CUDA_SUCCESS && std::memcmp(out, block, size) == 0;
    const char* out_rc = name_of(rc);
    const char* device_rc = "no-device-memory";
    bool device_ok = false;
    CUdeviceptr dev = 0;
    if (g_cu.mem_alloc != nullptr && g_cu.memcpy_htod != nullptr &&
        g_cu.mem_alloc(&dev, size) == CUDA_SUCCESS) {
      std::memset(out, 0, size);
      rc = g_cu.memcpy_htod(dev, block, size);
      if (rc == CUDA_SUCCESS) rc = g_cu.memcpy_dtoh(out, dev, size);
      device_rc = name_of(rc);
      device_ok = rc == CUDA_SUCCESS && std::memcmp(out, block, size) == 0;
      g_cu.mem_free(dev);
    }
    std::printf(
        "copy size_kib=%zu spans_mib_boundary=%d copy_out=%s copy_out_ok=%d device=%s "
        "device_ok=%d\n",
        size >> 10, spans ? 1 : 0, out_rc, out_ok ? 1 : 0, device_rc, device_ok ? 1 : 0);
    munmap(out, size);
    std::free(block);
  }
  return 0;
}

// The driver's virtual-memory API with host-located memory (CUDA 12.2 and
// later): the route MNEMOSYNE_PIN=granule could take instead of one
// registration per granule. Granules are created (cuMemCreate, a host
// location), mapped side by side into one reserved range and made
// accessible to the device and the host (cuMemSetAccess). Reported per
// location type: the granularity, what one granule costs, whether the CPU
// and a kernel reach the range, whether the driver copies a block spanning
// two granules, the mapping's smaps flags, what a forked child sees (and
// whether its write reaches the parent), and whether MADV_DONTFORK applies.
struct Vmm {
  CUresult (*granularity)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags);
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                     unsigned long long);
  CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
  CUresult (*unmap)(CUdeviceptr, size_t);
  CUresult (*release)(CUmemGenericAllocationHandle);
  CUresult (*address_free)(CUdeviceptr, size_t);
};

sigjmp_buf g_fault_jump;
void on_fault(int) {
  siglongjmp(g_fault_jump, 1);
}

// Runs fn with SIGSEGV and SIGBUS caught; false when one arrived.
template <class F>
bool without_fault(F&& fn) {
  struct sigaction sa {};
  struct sigaction old_segv {};
  struct sigaction old_bus {};
  sa.sa_handler = on_fault;
  sigaction(SIGSEGV, &sa, &old_segv);
  sigaction(SIGBUS, &sa, &old_bus);
  bool ok = false;
  if (sigsetjmp(g_fault_jump, 1) == 0) {
    fn();
    ok = true;
  }
  sigaction(SIGSEGV, &old_segv, nullptr);
  sigaction(SIGBUS, &old_bus, nullptr);
  return ok;
}

// Whether the CPU writes and reads back [p, p + count ints): ok,
// wrong-data, or fault (SIGSEGV/SIGBUS caught).
const char* cpu_access(volatile int* p, std::size_t count) {
  const char* result = "ok";
  const bool ran = without_fault([&] {
    for (std::size_t i = 0; i < count; i += 1024) p[i] = static_cast<int>(i);
    for (std::size_t i = 0; i < count && result[0] == 'o'; i += 1024) {
      if (p[i] != static_cast<int>(i)) result = "wrong-data";
    }
  });
  return ran ? result : "fault";
}

// Whether [p, p + n) reads zero (yes, no), or "fault" when the CPU cannot read it.
const char* fresh_zero(const unsigned char* p, std::size_t n) {
  const char* result = "yes";
  const bool ran = without_fault([&] {
    for (std::size_t i = 0; i < n; ++i) {
      if (static_cast<const volatile unsigned char*>(p)[i] != 0) {
        result = "no";
        break;
      }
    }
  });
  return ran ? result : "fault";
}

void vmm_location(const Vmm& v, CUfunction add, CUmemLocationType type, const char* name) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = type;
  prop.location.id = 0;
  std::size_t gmin = 0;
  std::size_t grec = 0;
  CUresult rc = v.granularity(&gmin, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  v.granularity(&grec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (rc != CUDA_SUCCESS || gmin == 0) {
    std::printf("vmm location=%s granularity=%s\n", name, name_of(rc));
    return;
  }
  constexpr int kGranules = 16;
  CUdeviceptr base = 0;
  if (rc = v.reserve(&base, kGranules * gmin, gmin, 0, 0); rc != CUDA_SUCCESS) {
    std::printf("vmm location=%s granularity_min=%zu reserve=%s\n", name, gmin, name_of(rc));
    return;
  }
  CUmemGenericAllocationHandle handles[kGranules] = {};
  CUmemAccessDesc access[2] = {};
  access[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access[0].location.id = g_device;
  access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  access[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  access[1].location.id = 0;
  access[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  std::vector<double> costs;
  const char* failed = "none";
  int mapped = 0;
  int created = 0;
  for (int i = 0; i < kGranules; ++i) {
    const auto t = std::chrono::steady_clock::now();
    const CUdeviceptr at = base + i * gmin;
    if (rc = v.create(&handles[i], gmin, &prop, 0); rc != CUDA_SUCCESS) {
      failed = "cuMemCreate";
      break;
    }
    ++created;
    if (rc = v.map(at, gmin, 0, handles[i], 0); rc != CUDA_SUCCESS) {
      failed = "cuMemMap";
      break;
    }
    ++mapped;
    if (rc = v.set_access(at, gmin, access, 2); rc != CUDA_SUCCESS) {
      failed = "cuMemSetAccess";
      break;
    }
    costs.push_back(ms_since(t));
  }
  std::printf(
      "vmm location=%s granularity_min=%zu granularity_recommended=%zu granule_ms=%s "
      "granules=%zu failed=%s rc=%s\n",
      name, gmin, grec, median_ms(costs).c_str(), costs.size(), failed, name_of(rc));
  if (costs.size() >= 2) {
    auto* p = reinterpret_cast<int*>(base);
    const std::size_t bytes = costs.size() * gmin;
    const unsigned count = static_cast<unsigned>(bytes / sizeof(int));
    // What fresh memory of this kind holds, before anything wrote it
    // (MNEMOSYNE_PIN=vmm takes it as zero only where the nvidia module says
    // it clears the memory it allocates).
    const char* fresh = fresh_zero(reinterpret_cast<const unsigned char*>(base), bytes);
    const char* cpu = cpu_access(p, count);
    const char* kernel = "not-run";
    const char* copy = "not-run";
    const char* htod = "not-run";
    const char* child = "not-run";
    const char* child_write = "not-run";
    int dontfork = -1;
    std::string flags = smaps_flags(p);
    if (std::strcmp(cpu, "ok") == 0) {
      fill_index(p, count);
      rc = add_on_gpu(add, p, count, 7);
      kernel = rc != CUDA_SUCCESS              ? name_of(rc)
               : holds_index_plus(p, count, 7) ? "ok"
                                               : "wrong-data";
      // 8 KiB across the first two granules' boundary.
      const CUdeviceptr span = base + gmin - 4096;
      void* out = mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      rc = g_cu.memcpy_dtoh(out, span, 8192);
      copy = rc != CUDA_SUCCESS                                           ? name_of(rc)
             : std::memcmp(out, reinterpret_cast<void*>(span), 8192) == 0 ? "ok"
                                                                          : "wrong-data";
      CUdeviceptr dev = 0;
      if (g_cu.mem_alloc != nullptr && g_cu.memcpy_htod != nullptr &&
          g_cu.mem_alloc(&dev, 8192) == CUDA_SUCCESS) {
        std::memset(out, 0, 8192);
        rc = g_cu.memcpy_htod(dev, reinterpret_cast<void*>(span), 8192);
        if (rc == CUDA_SUCCESS) rc = g_cu.memcpy_dtoh(out, dev, 8192);
        htod = rc != CUDA_SUCCESS                                           ? name_of(rc)
               : std::memcmp(out, reinterpret_cast<void*>(span), 8192) == 0 ? "ok"
                                                                            : "wrong-data";
        g_cu.mem_free(dev);
      }
      munmap(out, 8192);
      // A child reads the first int, then writes -1 there: does the parent see it?
      p[0] = 12345;
      const pid_t pid = fork();
      if (pid == 0) {
        if (p[0] != 12345) _exit(1);
        p[0] = -1;
        _exit(0);
      }
      int status = 0;
      waitpid(pid, &status, 0);
      child =
          WIFEXITED(status) ? (WEXITSTATUS(status) == 0 ? "same-data" : "wrong-data") : "killed";
      child_write = p[0] == -1 ? "reached-parent" : "stayed-in-child";
      dontfork = madvise(p, bytes, MADV_DONTFORK) == 0 ? 0 : errno;
    }
    std::printf(
        "vmm location=%s fresh_zero=%s cpu=%s kernel=%s copy_spanning=%s htod_spanning=%s "
        "vmflags=%s child=%s child_write=%s dontfork_errno=%d\n",
        name, fresh, cpu, kernel, copy, htod, flags.c_str(), child, child_write, dontfork);
  }
  for (int i = 0; i < mapped; ++i) v.unmap(base + i * gmin, gmin);
  for (int i = 0; i < created; ++i) v.release(handles[i]);
  v.address_free(base, kGranules * gmin);
}

int run_vmm_host() {
  CUfunction add = nullptr;
  if (!start_with_kernel("vmm", &add)) return 1;
  Vmm v{};
  const bool ok =
      resolve(g_lib, "cuMemGetAllocationGranularity", &v.granularity) &
      resolve(g_lib, "cuMemCreate", &v.create) & resolve(g_lib, "cuMemAddressReserve", &v.reserve) &
      resolve(g_lib, "cuMemMap", &v.map) & resolve(g_lib, "cuMemSetAccess", &v.set_access) &
      resolve(g_lib, "cuMemUnmap", &v.unmap) & resolve(g_lib, "cuMemRelease", &v.release) &
      resolve(g_lib, "cuMemAddressFree", &v.address_free);
  if (!ok) {
    std::printf("vmm result=missing-entry\n");
    return 0;
  }
  vmm_location(v, add, CU_MEM_LOCATION_TYPE_HOST_NUMA, "host_numa");
  vmm_location(v, add, CU_MEM_LOCATION_TYPE_HOST, "host");
  return 0;
}

// A child that holds a context until its stdin closes (context-cost).
int run_hold() {
  if (!start_driver(nullptr, nullptr)) return 1;
  std::printf("ready\n");
  std::fflush(stdout);
  char c;
  while (read(STDIN_FILENO, &c, 1) > 0) {
  }
  return 0;
}

int run_context_cost(const char* self) {
  // The child starts before this process initializes the driver: a fork
  // after cuInit is not supported.
  int to_child[2];
  int from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) return 1;
  const pid_t child = fork();
  if (child == 0) {
    dup2(to_child[0], STDIN_FILENO);
    dup2(from_child[1], STDOUT_FILENO);
    close(to_child[1]);
    close(from_child[0]);
    execl(self, self, "hold", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(to_child[0]);
  close(from_child[1]);
  char ready[16] = {};
  const bool held =
      read(from_child[0], ready, sizeof ready - 1) > 0 && std::strncmp(ready, "ready", 5) == 0;
  if (!start_driver(nullptr, nullptr)) return 1;
  size_t with_child = 0;
  size_t total = 0;
  g_cu.mem_info(&with_child, &total);
  close(to_child[1]);  // the child lets go of its context and exits
  int status = 0;
  waitpid(child, &status, 0);
  size_t without_child = with_child;
  for (int i = 0; i < 20 && without_child == with_child; ++i) {  // the driver frees it lazily
    usleep(50 * 1000);
    g_cu.mem_info(&without_child, &total);
  }
  std::printf("context-cost child_held=%d device_bytes=%lld\n", held ? 1 : 0,
              static_cast<long long>(without_child) - static_cast<long long>(with_child));
  return 0;
}

// After the reset the heap may be gone, stdio's buffers with it: each step
// is written with write(2) from the stack.
void step(const char* what, const char* detail = "") {
  char line[160];
  const int n = std::snprintf(line, sizeof line, "reset step=%s%s\n", what, detail);
  if (n > 0) (void)!write(STDOUT_FILENO, line, static_cast<std::size_t>(n));
}

int run_reset() {
  if (!start_driver(nullptr, nullptr)) return 1;
  if (g_cu.ctx_reset == nullptr) {
    std::printf("reset step=none rc=no-entry\n");
    return 1;
  }
  std::vector<char*> blocks;
  for (int i = 0; i < 100; ++i) blocks.push_back(static_cast<char*>(std::malloc(1000)));
  char* big = static_cast<char*>(std::malloc(std::size_t{64} << 20));
  std::memset(big, 1, std::size_t{64} << 20);
  std::fflush(stdout);
  step("allocated");
  const CUresult rc = g_cu.ctx_reset(g_device);
  char detail[64];
  std::snprintf(detail, sizeof detail, " rc=%s", name_of(rc));
  step("reset", detail);
  volatile char seen = big[12345];
  std::snprintf(detail, sizeof detail, " value=%d", int(seen));
  step("read-old-block", detail);
  for (char* b : blocks) std::free(b);
  std::free(big);
  step("freed-old-blocks");
  char* fresh = static_cast<char*>(std::malloc(1 << 20));
  std::memset(fresh, 2, 1 << 20);
  step("new-malloc-works");
  std::free(fresh);
  _exit(0);  // exit() would flush stdio through the lost heap
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  const char* kCommands[] = {"kernel", "attributes",   "costs", "zero", "fork",     "touch",
                             "hold",   "context-cost", "reset", "copy", "vmm-host", "gains"};
  if (std::none_of(std::begin(kCommands), std::end(kCommands),
                   [&](const char* c) { return what == c; })) {
    std::fprintf(stderr,
                 "usage: gpu_probe kernel malloc|new|vector | attributes | costs | zero | fork | "
                 "touch | context-cost | reset | copy | vmm-host | gains\n");
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (!open_driver()) return 1;
  if (what == "kernel") return run_kernel(argc > 2 ? argv[2] : "");
  if (what == "attributes") return run_attributes();
  if (what == "zero") return run_zero();
  if (what == "fork") return run_fork();
  if (what == "touch") return run_touch();
  if (what == "hold") return run_hold();
  if (what == "context-cost") return run_context_cost(argv[0]);
  if (what == "reset") return run_reset();
  if (what == "copy") return run_copy();
  if (what == "vmm-host") return run_vmm_host();
  if (what == "gains") return run_gains();
  return run_costs();
}
