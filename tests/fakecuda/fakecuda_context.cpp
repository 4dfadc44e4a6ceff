// Fake CUDA driver: contexts. A per-thread stack of current contexts, primary
// contexts retained with a count, created contexts. Handles are pointers to
// Ctx; they are only dereferenced once found in the registry of live ones.
#include <stdlib.h>

#include "fakecuda_internal.h"

namespace fakecuda {

namespace {

Ctx* g_ctx_list = nullptr;  // registry of live contexts; g_lock
Ctx* g_primary = nullptr;   // one per device, never freed; g_lock
int g_primary_count = 0;

// The calling thread's context stack (top = t_stack[t_depth - 1]).
__attribute__((tls_model("initial-exec"))) thread_local Ctx* t_stack[kCtxStackDepth];
__attribute__((tls_model("initial-exec"))) thread_local int t_depth = 0;

void registry_add(Ctx* c) noexcept {
  c->next = g_ctx_list;
  g_ctx_list = c;
}

void registry_remove(Ctx* c) noexcept {
  for (Ctx** p = &g_ctx_list; *p != nullptr; p = &(*p)->next) {
    if (*p == c) {
      *p = c->next;
      c->next = nullptr;
      return;
    }
  }
}

bool registered(const Ctx* c) noexcept {
  for (const Ctx* p = g_ctx_list; p != nullptr; p = p->next)
    if (p == c) return true;
  return false;
}

// Removes every occurrence of c from the calling thread's stack.
void unstack(const Ctx* c) noexcept {
  int out = 0;
  for (int i = 0; i < t_depth; ++i)
    if (t_stack[i] != c) t_stack[out++] = t_stack[i];
  for (int i = out; i < t_depth; ++i) t_stack[i] = nullptr;
  t_depth = out;
}

}  // namespace

bool contexts_init(int devices) noexcept {
  if (g_primary != nullptr || devices == 0) return true;
  auto* p = static_cast<Ctx*>(calloc(std::size_t(devices), sizeof(Ctx)));
  if (p == nullptr) return false;
  for (int i = 0; i < devices; ++i) {
    p[i].magic = kCtxMagic;
    p[i].device = i;
    p[i].flags = 0;
    p[i].primary = true;
    p[i].refcount = 0;
    registry_add(&p[i]);
  }
  g_primary = p;
  g_primary_count = devices;
  return true;
}

Ctx* current_ctx() noexcept {
  return t_depth > 0 ? t_stack[t_depth - 1] : nullptr;
}

bool ctx_valid(const Ctx* c) noexcept {
  return c != nullptr && registered(c) && c->magic == kCtxMagic;
}

bool ctx_usable(const Ctx* c) noexcept {
  return ctx_valid(c) && (!c->primary || c->refcount > 0);
}

}  // namespace fakecuda

using namespace fakecuda;

FAKECUDA_API CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  static const char kCall[] = "cuDevicePrimaryCtxRetain";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  if (pctx == nullptr) return fail(kCall, CUDA_ERROR_INVALID_VALUE);
  if (!valid_device(dev)) return fail(kCall, CUDA_ERROR_INVALID_DEVICE);
  lock(kCall);
  Ctx* c = &g_primary[dev];
  ++c->refcount;
  unlock();
  *pctx = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  static const char kCall[] = "cuDevicePrimaryCtxRelease_v2";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  if (!valid_device(dev)) return fail(kCall, CUDA_ERROR_INVALID_DEVICE);
  lock(kCall);
  Ctx* c = &g_primary[dev];
  CUresult rc = CUDA_SUCCESS;
  if (c->refcount <= 0) {
    rc = CUDA_ERROR_INVALID_CONTEXT;
  } else if (--c->refcount == 0) {
    // The primary context is destroyed with its last release, and all the
    // memory allocated in it with it.
    free_ctx_blocks(c);
  }
  unlock();
  return rc == CUDA_SUCCESS ? rc : fail(kCall, rc);
}

// As cudaDeviceReset(): the primary context's memory is freed whatever its
// retain count; it stays retained, and works again for new allocations.
FAKECUDA_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  static const char kCall[] = "cuDevicePrimaryCtxReset_v2";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  if (!valid_device(dev)) return fail(kCall, CUDA_ERROR_INVALID_DEVICE);
  lock(kCall);
  free_ctx_blocks(&g_primary[dev]);
  unlock();
  log_line("ctx-reset dev=%d", int(dev));
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  static const char kCall[] = "cuCtxPushCurrent_v2";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  auto* c = reinterpret_cast<Ctx*>(ctx);
  lock(kCall);
  bool ok = ctx_valid(c);
  unlock();
  if (!ok) return fail(kCall, CUDA_ERROR_INVALID_CONTEXT);
  if (t_depth >= kCtxStackDepth) return fail(kCall, CUDA_ERROR_OUT_OF_MEMORY);
  t_stack[t_depth++] = c;
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
  static const char kCall[] = "cuCtxPopCurrent_v2";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  if (t_depth == 0) return fail(kCall, CUDA_ERROR_INVALID_CONTEXT);
  Ctx* c = t_stack[--t_depth];
  t_stack[t_depth] = nullptr;
  if (pctx != nullptr) *pctx = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuCtxGetCurrent(CUcontext* pctx) {
  static const char kCall[] = "cuCtxGetCurrent";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  if (pctx == nullptr) return fail(kCall, CUDA_ERROR_INVALID_VALUE);
  *pctx = reinterpret_cast<CUcontext>(current_ctx());
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuCtxSetCurrent(CUcontext ctx) {
  static const char kCall[] = "cuCtxSetCurrent";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  auto* c = reinterpret_cast<Ctx*>(ctx);
  if (c == nullptr) {  // unbinds: pops the top, if any
    if (t_depth > 0) t_stack[--t_depth] = nullptr;
    return CUDA_SUCCESS;
  }
  lock(kCall);
  bool ok = ctx_valid(c);
  unlock();
  if (!ok) return fail(kCall, CUDA_ERROR_INVALID_CONTEXT);
  if (t_depth == 0) t_depth = 1;
  t_stack[t_depth - 1] = c;
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* params, unsigned int flags,
                                     CUdevice dev) {
  static const char kCall[] = "cuCtxCreate_v4";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  if (pctx == nullptr || (flags & ~unsigned(CU_CTX_FLAGS_MASK)) != 0)
    return fail(kCall, CUDA_ERROR_INVALID_VALUE);
  if (!valid_device(dev)) return fail(kCall, CUDA_ERROR_INVALID_DEVICE);
  if (params != nullptr && (params->numExecAffinityParams != 0 || params->cigParams != nullptr))
    return fail(kCall, CUDA_ERROR_NOT_SUPPORTED);
  if (t_depth >= kCtxStackDepth) return fail(kCall, CUDA_ERROR_OUT_OF_MEMORY);
  lock(kCall);
  auto* c = static_cast<Ctx*>(malloc(sizeof(Ctx)));
  if (c != nullptr) {
    c->magic = kCtxMagic;
    c->device = dev;
    c->flags = flags;
    c->primary = false;
    c->refcount = 1;
    registry_add(c);
  }
  unlock();
  if (c == nullptr) return fail(kCall, CUDA_ERROR_OUT_OF_MEMORY);
  t_stack[t_depth++] = c;
  *pctx = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}

FAKECUDA_API CUresult cuCtxDestroy_v2(CUcontext ctx) {
  static const char kCall[] = "cuCtxDestroy_v2";
  if (CUresult rc = enter(kCall); rc != CUDA_SUCCESS) return rc;
  auto* c = reinterpret_cast<Ctx*>(ctx);
  lock(kCall);
  // Primary contexts are not destroyed with cuCtxDestroy.
  bool ok = ctx_valid(c) && !c->primary;
  if (ok) {
    registry_remove(c);
    c->magic = kCtxDeadMagic;
    unstack(c);  // popped if current to this thread
    free_ctx_blocks(c);
    free(c);
  }
  unlock();
  if (!ok) return fail(kCall, CUDA_ERROR_INVALID_CONTEXT);
  return CUDA_SUCCESS;
}
