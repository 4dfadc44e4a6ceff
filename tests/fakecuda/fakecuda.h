/* Test-only control and observation API of the fake CUDA driver
 * (libfakecuda.so / libfakecuda-noproc.so; fakecuda.dll on Windows). Plain C so
 * that any test can use it.
 *
 * Tests do not link the library: they dlopen it by path (the same path the
 * product is given in MNEMOSYNE_CUDA_DRIVER, so both get the same instance) and
 * look these functions up with dlsym; the *_fn typedefs below are for that.
 * See README.md next to this file for the driver's behaviour, the environment
 * variables and the log format. */
#ifndef MNEMOSYNE_TESTS_FAKECUDA_FAKECUDA_H
#define MNEMOSYNE_TESTS_FAKECUDA_FAKECUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Exported from the library; for its users (which never link it) plain
 * declarations. */
#if defined(_WIN32)
#if defined(FAKECUDA_BUILDING)
#define FAKECUDA_EXPORT __declspec(dllexport)
#else
#define FAKECUDA_EXPORT
#endif
#elif defined(__GNUC__)
#define FAKECUDA_EXPORT __attribute__((visibility("default")))
#else
#define FAKECUDA_EXPORT
#endif

/* A snapshot of the driver's counters. All counts are since library load or the
 * last fakecuda_reset_counters(); live_bytes is state and is never reset. */
struct fakecuda_counters {
  uint64_t init_calls;            /* cuInit calls, any result */
  uint64_t alloc_managed;         /* successful cuMemAllocManaged */
  uint64_t alloc_host;            /* successful cuMemHostAlloc */
  uint64_t free_managed;          /* successful cuMemFree_v2 */
  uint64_t free_host;             /* successful cuMemFreeHost */
  uint64_t advise_calls;          /* cuMemAdvise_v2 calls past the init check, any result */
  int64_t advise_last_device;     /* location id of the last recorded advice with a
                                     DEVICE location; -1 for none or a host location */
  uint64_t legacy_free_calls;     /* calls of the legacy 32-bit cuMemFree */
  uint64_t live_bytes;            /* bytes (as requested) of live managed + pinned blocks */
  uint64_t failed_calls;          /* cu* calls that returned anything but CUDA_SUCCESS */
  uint64_t invalid_context_calls; /* cu* calls that returned CUDA_ERROR_INVALID_CONTEXT */
  uint64_t thread_allocs;         /* malloc/free pairs done by the driver's internal thread */
  uint64_t total_calls;           /* all cu* calls */
  /* Additions beyond the minimum: */
  uint64_t legacy_calls;        /* calls of any unversioned legacy export (cuMemFree,
                                   cuMemAdvise, cuCtxCreate, cuCtxDestroy, cuCtxPushCurrent,
                                   cuCtxPopCurrent, cuDeviceTotalMem,
                                   cuDevicePrimaryCtxRelease, cuGetProcAddress) */
  uint64_t ctx_freed_blocks;    /* blocks freed because their context was destroyed
                                   (cuCtxDestroy_v2, last cuDevicePrimaryCtxRelease_v2) */
  int64_t advise_last_advice;   /* CUmem_advise of the last recorded advice, -1 none */
  int64_t advise_last_loc_type; /* CUmemLocationType of the last recorded advice, -1 none */
  uint64_t thread_finished;     /* 1 once the internal thread has run all its iterations */
  uint64_t pages_to_device;     /* pages fakecuda_migrate_to_device moved to the device */
  uint64_t cpu_migrations;      /* device pages a CPU touch migrated back */
  uint64_t dtoh_calls;          /* successful cuMemcpyDtoH_v2 and cuMemcpyDtoHAsync_v2 */
  uint64_t dtoh_bytes;          /* bytes they copied */
  uint64_t memset_calls;        /* successful cuMemsetD8Async */
  uint64_t memset_bytes;        /* bytes they set */
  uint64_t live_streams;        /* streams created and not destroyed (state, not reset) */
  uint64_t register_calls;      /* successful cuMemHostRegister_v2 */
  uint64_t unregister_calls;    /* successful cuMemHostUnregister */
  uint64_t registered_bytes;    /* bytes registered now (state, not reset; in live_bytes too) */
  uint64_t discard_calls;       /* successful cuMemDiscardBatchAsync */
  uint64_t discard_bytes;       /* bytes they discarded */
  uint64_t vmm_map_calls;       /* successful cuMemMap */
  uint64_t vmm_unmap_calls;     /* successful cuMemUnmap */
  uint64_t vmm_bytes;           /* bytes of cuMemCreate handles alive now (state, not reset;
                                   in live_bytes too) */
  uint64_t peak_live_bytes;     /* the most live_bytes has been (reset: to live_bytes now) */
  uint64_t htod_calls;          /* successful cuMemcpyHtoD_v2 and cuMemcpyHtoDAsync_v2 */
  uint64_t htod_bytes;          /* bytes they copied */
};

/* What cuMemAdvise_v2 last recorded for the managed block containing a pointer. */
struct fakecuda_advice {
  int count;    /* recorded advise calls on this block */
  int advice;   /* last CUmem_advise */
  int loc_type; /* last CUmemLocation.type */
  int loc_id;   /* last CUmemLocation.id */
};

/* From now on the first n allocation calls (cuMemAllocManaged and cuMemHostAlloc
 * together) succeed and every later one fails with CUDA_ERROR_OUT_OF_MEMORY.
 * n = -1 disables. Restarts the count. */
FAKECUDA_EXPORT void fakecuda_set_fail_alloc_after(long n);
/* Allocations that would take the live bytes over this cap fail with
 * CUDA_ERROR_OUT_OF_MEMORY; 0 disables. */
FAKECUDA_EXPORT void fakecuda_set_mem_limit(unsigned long long bytes);
/* cuMemAdvise_v2 returns rc (after recording the attempt); 0 disables. */
FAKECUDA_EXPORT void fakecuda_set_advise_error(int rc);
/* cuMemcpyDtoH_v2 fails with rc (after the argument checks); 0 disables. */
FAKECUDA_EXPORT void fakecuda_set_copy_error(int rc);
/* Moves the pages of [p, p + n), inside one live managed block, to the device:
 * their data moves into the driver, the CPU mapping is dropped (mincore: not
 * resident). A CPU touch migrates a page back (counted in cpu_migrations);
 * cuMemcpyDtoH_v2 reads it in place. Returns the pages moved, -1 when p is not
 * in a managed block (or in a forked child). */
FAKECUDA_EXPORT long fakecuda_migrate_to_device(const void* p, size_t n);
/* 1 when the page holding p has its data on the device, else 0. */
FAKECUDA_EXPORT int fakecuda_on_device(const void* p);
/* Zeroes the counters (not live_bytes); advise_last_* back to -1. */
FAKECUDA_EXPORT void fakecuda_reset_counters(void);
FAKECUDA_EXPORT void fakecuda_get_counters(struct fakecuda_counters* out);
/* 1: p lies inside a live managed block; 2: inside a live pinned block; 0: neither
 * (always 0 in a forked child, which does not inherit the blocks). */
FAKECUDA_EXPORT int fakecuda_owns(const void* p);
/* 1 and *out filled when p lies in a live managed block that has been advised,
 * else 0. */
FAKECUDA_EXPORT int fakecuda_get_advice(const void* p, struct fakecuda_advice* out);

typedef void (*fakecuda_set_fail_alloc_after_fn)(long);
typedef void (*fakecuda_set_mem_limit_fn)(unsigned long long);
typedef void (*fakecuda_set_advise_error_fn)(int);
typedef void (*fakecuda_reset_counters_fn)(void);
typedef void (*fakecuda_get_counters_fn)(struct fakecuda_counters*);
typedef int (*fakecuda_owns_fn)(const void*);
typedef int (*fakecuda_get_advice_fn)(const void*, struct fakecuda_advice*);
typedef void (*fakecuda_set_copy_error_fn)(int);
typedef long (*fakecuda_migrate_to_device_fn)(const void*, size_t);
typedef int (*fakecuda_on_device_fn)(const void*);

#ifdef __cplusplus
}
#endif

#endif /* MNEMOSYNE_TESTS_FAKECUDA_FAKECUDA_H */
