#include <dlfcn.h>
#include <gnu/libc-version.h>

#include <atomic>

#include "libc.hpp"

namespace mnemosyne::linux_host {
namespace {
using UsableFn = std::size_t (*)(void*);
using MallinfoFn = struct mallinfo2 (*)();
std::atomic<UsableFn> g_usable{nullptr};
std::atomic<MallinfoFn> g_mallinfo2{nullptr};
}  // namespace

// glibc's own, from libc itself rather than RTLD_NEXT: whatever else is
// loaded between mnemosyne and libc (another interposer, a sanitizer's
// runtime) may define malloc_usable_size or mallinfo2 for blocks that are
// not glibc's, and the blocks asked about here came from __libc_malloc.
void resolve() noexcept {
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  void* usable = libc != nullptr ? dlsym(libc, "malloc_usable_size") : nullptr;
  void* info = libc != nullptr ? dlsym(libc, "mallinfo2") : nullptr;
  g_usable.store(reinterpret_cast<UsableFn>(usable));
  g_mallinfo2.store(reinterpret_cast<MallinfoFn>(info));
}

bool mallinfo2(struct mallinfo2* out) noexcept {
  const MallinfoFn fn = g_mallinfo2.load(std::memory_order_acquire);
  if (fn == nullptr) return false;
  *out = fn();
  return true;
}

std::size_t usable_size(void* ptr) noexcept {
  const UsableFn fn = g_usable.load(std::memory_order_acquire);
  return fn != nullptr ? fn(ptr) : 0;
}

// gnu_get_libc_version() is a static string ("2.36"): parsed by hand, as
// this runs inside aligned_alloc.
bool aligned_alloc_is_strict() noexcept {
  static std::atomic<int> strict{-1};
  int known = strict.load(std::memory_order_relaxed);
  if (known < 0) {
    const char* v = gnu_get_libc_version();
    int major = 0;
    int minor = 0;
    while (*v >= '0' && *v <= '9') major = major * 10 + (*v++ - '0');
    if (*v == '.') ++v;
    while (*v >= '0' && *v <= '9') minor = minor * 10 + (*v++ - '0');
    known = major > 2 || (major == 2 && minor >= 38) ? 1 : 0;
    strict.store(known, std::memory_order_relaxed);
  }
  return known == 1;
}

}  // namespace mnemosyne::linux_host
