/* The naive GPU-memory interposer, built only for the benchmark: what a
 * user would write in an afternoon. Every malloc is one cuMemAllocManaged,
 * every free one cuMemFree; a 64-byte header remembers the size. Mallocs made
 * while it is inside the driver (the driver allocates too) go to glibc, with
 * another header mark. It shows what mnemosyne's arenas buy; it is not
 * installed, tested or used anywhere else. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void* __libc_malloc(size_t);
void __libc_free(void*);

typedef int (*init_fn)(unsigned);
typedef int (*device_get_fn)(int*, int);
typedef int (*retain_fn)(void**, int);
typedef int (*set_current_fn)(void*);
typedef int (*alloc_managed_fn)(uintptr_t*, size_t, unsigned);
typedef int (*mem_free_fn)(uintptr_t);

enum { kHeader = 64, kDriver = 0x6e616976, kGlibc = 0x676c6962 };
struct header {
  uint32_t magic;
  uint32_t offset; /* from the allocation's start to the user pointer */
  size_t size;
};

static alloc_managed_fn g_alloc;
static mem_free_fn g_free;
static set_current_fn g_set_current;
static void* g_ctx;
static int g_state; /* 0 not loaded, 1 loading, 2 ready, 3 unavailable */
static __thread int t_inside;
static __thread int t_has_ctx;

static void load(void) {
  t_inside = 1;
  const char* path = getenv("MNEMOSYNE_CUDA_DRIVER");
  void* h = dlopen(path != NULL && *path ? path : "libcuda.so.1", RTLD_NOW);
  init_fn init = h ? (init_fn)dlsym(h, "cuInit") : NULL;
  device_get_fn device_get = h ? (device_get_fn)dlsym(h, "cuDeviceGet") : NULL;
  retain_fn retain = h ? (retain_fn)dlsym(h, "cuDevicePrimaryCtxRetain") : NULL;
  g_set_current = h ? (set_current_fn)dlsym(h, "cuCtxSetCurrent") : NULL;
  g_alloc = h ? (alloc_managed_fn)dlsym(h, "cuMemAllocManaged") : NULL;
  g_free = h ? (mem_free_fn)dlsym(h, "cuMemFree_v2") : NULL;
  int dev = 0;
  int ok = init && device_get && retain && g_set_current && g_alloc && g_free && init(0) == 0 &&
           device_get(&dev, 0) == 0 && retain(&g_ctx, dev) == 0;
  __atomic_store_n(&g_state, ok ? 2 : 3, __ATOMIC_RELEASE);
  t_inside = 0;
}

static int ready(void) {
  int s = __atomic_load_n(&g_state, __ATOMIC_ACQUIRE);
  if (s == 0) {
    int expected = 0;
    if (__atomic_compare_exchange_n(&g_state, &expected, 1, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
      load();
    }
    while ((s = __atomic_load_n(&g_state, __ATOMIC_ACQUIRE)) == 1) {
    }
  }
  return s == 2;
}

static void* with_header(char* base, size_t align, size_t size, uint32_t magic) {
  uintptr_t user = ((uintptr_t)base + kHeader + align - 1) & ~(uintptr_t)(align - 1);
  struct header* h = (struct header*)(user - sizeof(struct header));
  h->magic = magic;
  h->offset = (uint32_t)(user - (uintptr_t)base);
  h->size = size;
  return (void*)user;
}

static void* allocate(size_t size, size_t align) {
  if (align < 16) align = 16;
  const size_t total = size + kHeader + align;
  if (total < size) return NULL;
  if (t_inside || !ready()) {
    char* p = __libc_malloc(total);
    return p ? with_header(p, align, size, kGlibc) : NULL;
  }
  t_inside = 1;
  if (!t_has_ctx) {
    g_set_current(g_ctx);
    t_has_ctx = 1;
  }
  uintptr_t dptr = 0;
  const int rc = g_alloc(&dptr, total, 1 /* CU_MEM_ATTACH_GLOBAL */);
  t_inside = 0;
  if (rc != 0) {
    errno = ENOMEM;
    return NULL;
  }
  return with_header((char*)dptr, align, size, kDriver);
}

static struct header* header_of(void* p) {
  return (struct header*)((char*)p - sizeof(struct header));
}

void* malloc(size_t size) {
  return allocate(size, 16);
}

void free(void* p) {
  if (p == NULL) return;
  struct header* h = header_of(p);
  char* base = (char*)p - h->offset;
  if (h->magic == kGlibc) {
    __libc_free(base);
  } else {
    t_inside = 1;
    if (!t_has_ctx) {
      g_set_current(g_ctx);
      t_has_ctx = 1;
    }
    g_free((uintptr_t)base);
    t_inside = 0;
  }
}

void* calloc(size_t n, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(n, size, &total)) return NULL;
  void* p = allocate(total, 16);
  if (p) memset(p, 0, total);
  return p;
}

void* realloc(void* p, size_t size) {
  if (p == NULL) return malloc(size);
  void* q = malloc(size);
  if (q == NULL) return NULL;
  const size_t old = header_of(p)->size;
  memcpy(q, p, old < size ? old : size);
  free(p);
  return q;
}

int posix_memalign(void** out, size_t align, size_t size) {
  void* p = allocate(size, align);
  if (p == NULL) return ENOMEM;
  *out = p;
  return 0;
}

void* aligned_alloc(size_t align, size_t size) {
  return allocate(size, align);
}

void* memalign(size_t align, size_t size) {
  return allocate(size, align);
}

size_t malloc_usable_size(void* p) {
  return p ? header_of(p)->size : 0;
}
