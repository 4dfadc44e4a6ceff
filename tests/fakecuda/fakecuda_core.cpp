// Fake CUDA driver: state, log, cuInit and its internal thread, fork handling,
// devices, error names and the fakecuda_* control functions.
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <initializer_list>

#include "fakecuda_internal.h"
#include "fakecuda_os.h"

namespace fakecuda {

Counters g_counters;
Config g_config;
std::atomic<long> g_fail_alloc_after{-1};
std::atomic<long> g_alloc_seen{0};
std::atomic<unsigned long long> g_mem_limit{0};
std::atomic<int> g_advise_error{0};
std::atomic<int> g_unregister_error{0};
std::atomic<int> g_copy_error{0};
std::atomic<int> g_vmm_map_error{0};
std::atomic<bool> g_initialized{false};
std::atomic<bool> g_forked{false};
std::atomic<bool> g_stub{false};

namespace {

pthread_mutex_t g_lock = FAKECUDA_ERRORCHECK_MUTEX_INITIALIZER;
// Serialises cuInit (taken before g_lock, never after it).
pthread_mutex_t g_init_lock = FAKECUDA_ERRORCHECK_MUTEX_INITIALIZER;
std::atomic<os::LogHandle> g_log{os::kNoLog};
void* g_init_keep = nullptr;  // the block cuInit mallocs and keeps
void* g_init_small[3] = {};   // small bookkeeping cuInit mallocs and keeps

void open_log() noexcept {
  if (g_log.load(std::memory_order_acquire) != os::kNoLog) return;
  const char* path = getenv("FAKECUDA_LOG");
  if (path == nullptr || path[0] == '\0') return;
  const os::LogHandle h = os::log_open(path);
  if (h == os::kNoLog) return;
  os::LogHandle expected = os::kNoLog;
  if (!g_log.compare_exchange_strong(expected, h, std::memory_order_acq_rel)) os::log_close(h);
}

bool env_long(const char* name, long* out) noexcept {
  const char* s = getenv(name);
  if (s == nullptr || s[0] == '\0') return false;
  char* end = nullptr;
  errno = 0;
  long v = strtol(s, &end, 0);
  if (errno != 0 || end == s) return false;
  *out = v;
  return true;
}

bool env_ull(const char* name, unsigned long long* out) noexcept {
  const char* s = getenv(name);
  if (s == nullptr || s[0] == '\0') return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (errno != 0 || end == s) return false;
  *out = v;
  return true;
}

void sleep_ms(long ms) noexcept {
  if (ms > 0) os::sleep_us(std::int64_t{ms} * 1000);
}

void read_config() noexcept {
  Config c;
  long v = 0;
  if (env_long("FAKECUDA_DEVICES", &v))
    c.devices = v < 0 ? 0 : (v > kMaxDevices ? kMaxDevices : int(v));
  if (env_long("FAKECUDA_PAGEABLE", &v)) c.pageable = int(v);
  if (env_long("FAKECUDA_CONCURRENT_MANAGED", &v)) c.concurrent_managed = int(v);
  unsigned long long u = 0;
  if (env_ull("FAKECUDA_THREAD_ALLOC_MAX", &u)) c.thread_alloc_max = std::size_t(u);
  if (env_ull("FAKECUDA_THREAD_FIRST_ALLOC", &u)) c.thread_first_alloc = std::size_t(u);
  if (env_long("FAKECUDA_THREAD_ITERS", &v)) c.thread_iters = v < 0 ? 0 : int(v);
  if (env_long("FAKECUDA_EVENT_THREAD", &v)) c.event_thread = v != 0;
  if (env_long("FAKECUDA_ALLOC_BUSY_MS", &v)) c.alloc_busy_ms = v < 0 ? 0 : v;
  if (env_long("FAKECUDA_ALLOC_STALL_MS", &v)) c.alloc_stall_ms = v < 0 ? 0 : v;
  if (env_long("FAKECUDA_DIRTY", &v)) c.dirty = v != 0;
  if (env_long("FAKECUDA_PINNED_SHARED", &v)) c.pinned_shared = v != 0;
  if (env_long("FAKECUDA_HOST_POINTER_REGISTERED", &v)) c.host_pointer_registered = v != 0;
  if (env_long("FAKECUDA_VMM_HOST", &v)) c.vmm_host = v != 0;
  g_config = c;

  if (env_long("FAKECUDA_FAIL_ALLOC_AFTER", &v)) {
    g_fail_alloc_after.store(v < 0 ? -1 : v);
    g_alloc_seen.store(0);
  }
  if (env_ull("FAKECUDA_MEM_LIMIT", &u)) g_mem_limit.store(u);
  if (env_long("FAKECUDA_ADVISE_ERROR", &v)) g_advise_error.store(int(v));
  if (env_long("FAKECUDA_COPY_ERROR", &v)) g_copy_error.store(int(v));
  if (env_long("FAKECUDA_VMM_MAP_ERROR", &v)) g_vmm_map_error.store(int(v));
  if (env_long("FAKECUDA_UNREGISTER_ERROR", &v)) g_unregister_error.store(int(v));
}

void lock_or_die(pthread_mutex_t* m, const char* call) noexcept {
  int e = pthread_mutex_lock(m);
  if (e == 0) return;
  char buf[256];
  int n = snprintf(buf, sizeof buf,
                   "fakecuda: %s: driver lock failed (%s): the driver was re-entered from a "
                   "malloc called while it held its own lock\n",
                   call, e == EDEADLK ? "self-deadlock" : strerror(e));
  log_line("deadlock call=%s err=%d", call, e);
  if (n > 0) os::write_stderr(buf, size_t(n) < sizeof buf ? size_t(n) : sizeof buf - 1);
  abort();
}

// xorshift64*: the internal thread's sizes; no libc state, no locks.
std::uint64_t next_random(std::uint64_t* s) noexcept {
  std::uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545f4914f6cdd1dull;
}

// What a real driver's helper threads do to a malloc interposer: take the
// driver's lock, then call malloc (sometimes for a big block) while holding it.
void* internal_thread(void*) {
  std::uint64_t seed =
      os::monotonic_ns() ^ (std::uint64_t(os::pid()) << 32) ^ 0x9e3779b97f4a7c15ull;
  if (seed == 0) seed = 1;
  const std::size_t max = g_config.thread_alloc_max;
  const int iters = g_config.thread_iters;
  for (int i = 0; i < iters; ++i) {
    os::sleep_us(std::int64_t(2000 + next_random(&seed) % 2000));
    if (g_forked.load(std::memory_order_relaxed)) break;
    std::size_t size;
    const std::uint64_t r = next_random(&seed);
    if (i == 0 && g_config.thread_first_alloc != 0) {
      size = g_config.thread_first_alloc;
    } else if (max >= kMiB && (r & 3) == 0) {
      size = kMiB + std::size_t((r >> 8) % (max - kMiB + 1));
    } else {
      const std::size_t small = max < 256 * 1024 ? max : 256 * 1024;
      size = 1 + std::size_t((r >> 8) % (small == 0 ? 1 : small));
    }
    lock("internal-thread");
    auto* p = static_cast<unsigned char*>(malloc(size));
    if (p != nullptr) {
      for (std::size_t off = 0; off < size; off += 4096)
        p[off] = static_cast<unsigned char>(off >> 12);
      p[size - 1] = 0x5a;
      free(p);
      g_counters.thread_allocs.fetch_add(1, std::memory_order_relaxed);
    }
    unlock();
  }
  g_counters.thread_finished.store(1, std::memory_order_release);
  log_line(
      "thread-exit allocs=%llu",
      static_cast<unsigned long long>(g_counters.thread_allocs.load(std::memory_order_relaxed)));
  return nullptr;
}

// As a real driver's event-handling thread: started by cuInit, alive for the
// rest of the process, asleep. It blocks no signal itself: its mask is the
// one its creator had, as with the real driver, so a signal the program's own
// threads block is delivered here unless whoever called cuInit blocked it.
void* event_thread(void*) {
  for (;;) os::sleep_us(1000000);
  return nullptr;
}

// As a real driver may: the prepare handler takes the driver's lock, so no
// driver call can be made from later prepare handlers (an allocator that
// tried would deadlock; this one aborts with a message instead).
void on_fork_prepare() {
  lock("fork-prepare");
}

void on_fork_parent() {
  unlock();
}

void on_fork_child() {
  pthread_mutex_t fresh = FAKECUDA_ERRORCHECK_MUTEX_INITIALIZER;
  g_lock = fresh;  // held by the parent's thread, which this child does not have
  g_forked.store(true, std::memory_order_release);
  log_line("fork-child");
}

__attribute__((constructor)) void fakecuda_load() {
  const char* stub = getenv("FAKECUDA_STUB");
  g_stub.store(stub != nullptr && stub[0] == '1');
  open_log();
  os::at_fork(on_fork_prepare, on_fork_parent, on_fork_child);
}

}  // namespace

void lock(const char* call) noexcept {
  lock_or_die(&g_lock, call);
}

void unlock() noexcept {
  pthread_mutex_unlock(&g_lock);
}

void log_line(const char* fmt, ...) noexcept {
  const os::LogHandle h = g_log.load(std::memory_order_acquire);
  if (h == os::kNoLog) return;
  char buf[512];
  int n = snprintf(buf, sizeof buf, "%d ", os::pid());
  if (n < 0) return;
  va_list ap;
  va_start(ap, fmt);
#if defined(_WIN32)
  int m = __mingw_vsnprintf(buf + n, sizeof buf - std::size_t(n), fmt, ap);
#else
  int m = vsnprintf(buf + n, sizeof buf - std::size_t(n), fmt, ap);
#endif
  va_end(ap);
  if (m < 0) return;
  std::size_t len = std::size_t(n) + std::size_t(m);
  if (len > sizeof buf - 2) len = sizeof buf - 2;
  buf[len++] = '\n';
  os::log_write(h, buf, len);
}

CUresult fail(const char* call, CUresult rc) noexcept {
  g_counters.failed_calls.fetch_add(1, std::memory_order_relaxed);
  if (rc == CUDA_ERROR_INVALID_CONTEXT)
    g_counters.invalid_context_calls.fetch_add(1, std::memory_order_relaxed);
  log_line("fail call=%s rc=%d", call, int(rc));
  return rc;
}

CUresult enter_no_init(const char* call) noexcept {
  g_counters.total_calls.fetch_add(1, std::memory_order_relaxed);
  if (g_stub.load(std::memory_order_relaxed)) return fail(call, CUDA_ERROR_STUB_LIBRARY);
  if (g_forked.load(std::memory_order_acquire)) return fail(call, CUDA_ERROR_NOT_INITIALIZED);
  return CUDA_SUCCESS;
}

CUresult enter(const char* call) noexcept {
  g_counters.total_calls.fetch_add(1, std::memory_order_relaxed);
  if (g_stub.load(std::memory_order_relaxed)) return fail(call, CUDA_ERROR_STUB_LIBRARY);
  if (g_forked.load(std::memory_order_acquire) || !g_initialized.load(std::memory_order_acquire))
    return fail(call, CUDA_ERROR_NOT_INITIALIZED);
  return CUDA_SUCCESS;
}

void note_legacy_call(const char* name) noexcept {
  g_counters.total_calls.fetch_add(1, std::memory_order_relaxed);
  g_counters.legacy_calls.fetch_add(1, std::memory_order_relaxed);
  log_line("legacy-call name=%s", name);
}

bool valid_device(CUdevice dev) noexcept {
  return dev >= 0 && dev < g_config.devices;
}

}  // namespace fakecuda

using namespace fakecuda;

// ---------------------------------------------------------------- init

FAKECUDA_API CUresult cuInit(unsigned int flags) {
  g_counters.total_calls.fetch_add(1, std::memory_order_relaxed);
  g_counters.init_calls.fetch_add(1, std::memory_order_relaxed);
  CUresult rc = CUDA_SUCCESS;
  if (const char* crash = getenv("FAKECUDA_INIT_CRASH"); crash != nullptr && crash[0] == '1') {
    // A driver that dereferences garbage in cuInit, before taking any lock.
    // Through a volatile pointer so that the compiler emits the store itself
    // (an access violation / SIGSEGV), not a trap instruction instead.
    log_line("init-crash");
    int* volatile bad = nullptr;
    *bad = 1;
  }
  if (g_stub.load(std::memory_order_relaxed)) {
    rc = CUDA_ERROR_STUB_LIBRARY;
  } else if (g_forked.load(std::memory_order_acquire)) {
    rc = CUDA_ERROR_NOT_INITIALIZED;
  } else if (flags != 0) {
    rc = CUDA_ERROR_INVALID_VALUE;
  } else if (!g_initialized.load(std::memory_order_acquire)) {
    lock_or_die(&g_init_lock, "cuInit");
    if (!g_initialized.load(std::memory_order_acquire)) {
      open_log();
      long v = 0;
      if (env_long("FAKECUDA_INIT_DELAY_MS", &v)) sleep_ms(v);
      if (env_long("FAKECUDA_INIT_ERROR", &v) && v != 0) rc = static_cast<CUresult>(v);
      if (rc == CUDA_SUCCESS) {
        read_config();
        lock("cuInit");
        // A few small allocations and one of a few MiB that the driver keeps,
        // all while holding its lock, as the real one does.
        static const std::size_t kSmall[3] = {48, 200, 1024};
        for (int i = 0; i < 3 && rc == CUDA_SUCCESS; ++i) {
          if (g_init_small[i] == nullptr) g_init_small[i] = malloc(kSmall[i]);
          if (g_init_small[i] == nullptr)
            rc = CUDA_ERROR_OUT_OF_MEMORY;
          else
            memset(g_init_small[i], i + 1, kSmall[i]);
        }
        if (rc == CUDA_SUCCESS && g_init_keep == nullptr) {
          g_init_keep = malloc(4 * kMiB);
          if (g_init_keep == nullptr)
            rc = CUDA_ERROR_OUT_OF_MEMORY;
          else
            memset(g_init_keep, 0xcd, 4 * kMiB);
        }
        if (rc == CUDA_SUCCESS && !contexts_init(g_config.devices)) rc = CUDA_ERROR_OUT_OF_MEMORY;
        unlock();
        if (rc == CUDA_SUCCESS) {
          g_initialized.store(true, std::memory_order_release);
          if (g_config.thread_iters > 0) os::start_thread(internal_thread);
          if (g_config.event_thread) os::start_thread(event_thread);
        }
      }
    }
    pthread_mutex_unlock(&g_init_lock);
  }
  log_line("init rc=%d", int(rc));
  if (rc != CUDA_SUCCESS) return fail("cuInit", rc);
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuDriverGetVersion(int* driverVersion) {
  if (CUresult rc = enter_no_init("cuDriverGetVersion"); rc != CUDA_SUCCESS) return rc;
  if (driverVersion == nullptr) return fail("cuDriverGetVersion", CUDA_ERROR_INVALID_VALUE);
  *driverVersion = kDriverVersion;
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- devices

FAKECUDA_API CUresult cuDeviceGetCount(int* count) {
  if (CUresult rc = enter("cuDeviceGetCount"); rc != CUDA_SUCCESS) return rc;
  if (count == nullptr) return fail("cuDeviceGetCount", CUDA_ERROR_INVALID_VALUE);
  *count = g_config.devices;
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (CUresult rc = enter("cuDeviceGet"); rc != CUDA_SUCCESS) return rc;
  if (device == nullptr) return fail("cuDeviceGet", CUDA_ERROR_INVALID_VALUE);
  if (!valid_device(ordinal)) return fail("cuDeviceGet", CUDA_ERROR_INVALID_DEVICE);
  *device = ordinal;
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  if (CUresult rc = enter("cuDeviceGetName"); rc != CUDA_SUCCESS) return rc;
  if (name == nullptr || len <= 0) return fail("cuDeviceGetName", CUDA_ERROR_INVALID_VALUE);
  if (!valid_device(dev)) return fail("cuDeviceGetName", CUDA_ERROR_INVALID_DEVICE);
  snprintf(name, std::size_t(len), "mnemosyne fake GPU %d", int(dev));
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  if (CUresult rc = enter("cuDeviceTotalMem_v2"); rc != CUDA_SUCCESS) return rc;
  if (bytes == nullptr) return fail("cuDeviceTotalMem_v2", CUDA_ERROR_INVALID_VALUE);
  if (!valid_device(dev)) return fail("cuDeviceTotalMem_v2", CUDA_ERROR_INVALID_DEVICE);
  *bytes = 16 * kGiB;
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  if (CUresult rc = enter("cuDeviceGetAttribute"); rc != CUDA_SUCCESS) return rc;
  if (pi == nullptr || int(attrib) <= 0 || int(attrib) >= int(CU_DEVICE_ATTRIBUTE_MAX))
    return fail("cuDeviceGetAttribute", CUDA_ERROR_INVALID_VALUE);
  if (!valid_device(dev)) return fail("cuDeviceGetAttribute", CUDA_ERROR_INVALID_DEVICE);
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
      *pi = g_config.concurrent_managed;
      break;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS:
      *pi = g_config.pageable;
      break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      *pi = 9;
      break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM:
      *pi = g_config.host_pointer_registered;
      break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
      *pi = 1;
      break;
    default:
      *pi = 0;
      break;
  }
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- errors

namespace {

struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};

#define FAKECUDA_ERR(code, text) \
  { code, #code, text }
constexpr ErrorText kErrors[] = {
    FAKECUDA_ERR(CUDA_SUCCESS, "no error"),
    FAKECUDA_ERR(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    FAKECUDA_ERR(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    FAKECUDA_ERR(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    FAKECUDA_ERR(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    FAKECUDA_ERR(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library"),
    // CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER: 36 in 13.0's cuda.h, unnamed before.
    {static_cast<CUresult>(36), "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER",
     "call requires a newer driver"},
    FAKECUDA_ERR(CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA-capable device(s) busy or unavailable"),
    FAKECUDA_ERR(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
    FAKECUDA_ERR(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    FAKECUDA_ERR(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    FAKECUDA_ERR(CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "context already current"),
    FAKECUDA_ERR(CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed"),
    FAKECUDA_ERR(CUDA_ERROR_UNMAP_FAILED, "unmapping of buffer object failed"),
    FAKECUDA_ERR(CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported"),
    FAKECUDA_ERR(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    FAKECUDA_ERR(CUDA_ERROR_ILLEGAL_STATE, "the operation is not permitted in this state"),
    FAKECUDA_ERR(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    FAKECUDA_ERR(CUDA_ERROR_NOT_READY, "device not ready"),
    FAKECUDA_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
    FAKECUDA_ERR(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"),
    FAKECUDA_ERR(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "primary context is already active"),
    FAKECUDA_ERR(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed"),
    FAKECUDA_ERR(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "host memory is already registered"),
    FAKECUDA_ERR(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "host memory is not registered"),
    FAKECUDA_ERR(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"),
    FAKECUDA_ERR(CUDA_ERROR_NOT_PERMITTED, "operation not permitted"),
    FAKECUDA_ERR(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    FAKECUDA_ERR(CUDA_ERROR_SYSTEM_NOT_READY, "system not yet initialized"),
    FAKECUDA_ERR(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
                 "system has unsupported display driver / cuda driver combination"),
    FAKECUDA_ERR(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,
                 "forward compatibility not supported on this device"),
    FAKECUDA_ERR(CUDA_ERROR_TIMEOUT, "wait operation timed out"),
    FAKECUDA_ERR(CUDA_ERROR_UNKNOWN, "unknown error"),
};
#undef FAKECUDA_ERR

const ErrorText* find_error(CUresult code) noexcept {
  for (const ErrorText& e : kErrors)
    if (e.code == code) return &e;
  return nullptr;
}

}  // namespace

FAKECUDA_API CUresult cuGetErrorName(CUresult error, const char** pStr) {
  g_counters.total_calls.fetch_add(1, std::memory_order_relaxed);
  if (pStr == nullptr) return fail("cuGetErrorName", CUDA_ERROR_INVALID_VALUE);
  const ErrorText* e = find_error(error);
  *pStr = e != nullptr ? e->name : nullptr;
  if (e == nullptr) return fail("cuGetErrorName", CUDA_ERROR_INVALID_VALUE);
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuGetErrorString(CUresult error, const char** pStr) {
  g_counters.total_calls.fetch_add(1, std::memory_order_relaxed);
  if (pStr == nullptr) return fail("cuGetErrorString", CUDA_ERROR_INVALID_VALUE);
  const ErrorText* e = find_error(error);
  *pStr = e != nullptr ? e->text : nullptr;
  if (e == nullptr) return fail("cuGetErrorString", CUDA_ERROR_INVALID_VALUE);
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- control API

FAKECUDA_API void fakecuda_set_fail_alloc_after(long n) {
  g_alloc_seen.store(0);
  g_fail_alloc_after.store(n < 0 ? -1 : n);
}

FAKECUDA_API void fakecuda_set_mem_limit(unsigned long long bytes) {
  g_mem_limit.store(bytes);
}

FAKECUDA_API void fakecuda_set_advise_error(int rc) {
  g_advise_error.store(rc);
}

FAKECUDA_API void fakecuda_set_copy_error(int rc) {
  g_copy_error.store(rc);
}

FAKECUDA_API void fakecuda_reset_counters(void) {
  Counters& c = g_counters;
  for (auto* a : {&c.init_calls,        &c.alloc_managed,   &c.alloc_host,
                  &c.free_managed,      &c.free_host,       &c.advise_calls,
                  &c.legacy_free_calls, &c.failed_calls,    &c.invalid_context_calls,
                  &c.thread_allocs,     &c.total_calls,     &c.legacy_calls,
                  &c.ctx_freed_blocks,  &c.pages_to_device, &c.cpu_migrations,
                  &c.dtoh_calls,        &c.dtoh_bytes,      &c.memset_calls,
                  &c.memset_bytes,      &c.register_calls,  &c.unregister_calls,
                  &c.discard_calls,     &c.discard_bytes,   &c.vmm_map_calls,
                  &c.vmm_unmap_calls,   &c.htod_calls,      &c.htod_bytes})
    a->store(0);
  c.peak_live_bytes.store(c.live_bytes.load());
  c.advise_last_device.store(-1);
  c.advise_last_advice.store(-1);
  c.advise_last_loc_type.store(-1);
}

FAKECUDA_API void fakecuda_get_counters(struct fakecuda_counters* out) {
  if (out == nullptr) return;
  const Counters& c = g_counters;
  out->init_calls = c.init_calls.load();
  out->alloc_managed = c.alloc_managed.load();
  out->alloc_host = c.alloc_host.load();
  out->free_managed = c.free_managed.load();
  out->free_host = c.free_host.load();
  out->advise_calls = c.advise_calls.load();
  out->advise_last_device = c.advise_last_device.load();
  out->legacy_free_calls = c.legacy_free_calls.load();
  out->live_bytes = c.live_bytes.load();
  out->failed_calls = c.failed_calls.load();
  out->invalid_context_calls = c.invalid_context_calls.load();
  out->thread_allocs = c.thread_allocs.load();
  out->total_calls = c.total_calls.load();
  out->legacy_calls = c.legacy_calls.load();
  out->ctx_freed_blocks = c.ctx_freed_blocks.load();
  out->advise_last_advice = c.advise_last_advice.load();
  out->advise_last_loc_type = c.advise_last_loc_type.load();
  out->thread_finished = c.thread_finished.load();
  out->pages_to_device = c.pages_to_device.load();
  out->cpu_migrations = c.cpu_migrations.load();
  out->dtoh_calls = c.dtoh_calls.load();
  out->dtoh_bytes = c.dtoh_bytes.load();
  out->memset_calls = c.memset_calls.load();
  out->memset_bytes = c.memset_bytes.load();
  out->live_streams = c.live_streams.load();
  out->register_calls = c.register_calls.load();
  out->unregister_calls = c.unregister_calls.load();
  out->registered_bytes = c.registered_bytes.load();
  out->discard_calls = c.discard_calls.load();
  out->discard_bytes = c.discard_bytes.load();
  out->vmm_map_calls = c.vmm_map_calls.load();
  out->vmm_unmap_calls = c.vmm_unmap_calls.load();
  out->vmm_bytes = c.vmm_bytes.load();
  out->peak_live_bytes = c.peak_live_bytes.load();
  out->htod_calls = c.htod_calls.load();
  out->htod_bytes = c.htod_bytes.load();
}
