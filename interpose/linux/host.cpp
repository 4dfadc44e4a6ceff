#include <dlfcn.h>

#include <atomic>

#include "libc.hpp"

namespace mnemosyne::linux_host {
namespace {
using UsableFn = std::size_t (*)(void*);
std::atomic<UsableFn> g_usable{nullptr};
}  // namespace

// glibc's own, from libc itself rather than RTLD_NEXT: whatever else is
// loaded between mnemosyne and libc (another interposer, a sanitizer's
// runtime) may define malloc_usable_size for blocks that are not glibc's,
// and the blocks asked about here came from __libc_malloc.
void resolve() noexcept {
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  void* fn = libc != nullptr ? dlsym(libc, "malloc_usable_size") : nullptr;
  g_usable.store(reinterpret_cast<UsableFn>(fn));
}

std::size_t usable_size(void* ptr) noexcept {
  const UsableFn fn = g_usable.load(std::memory_order_acquire);
  return fn != nullptr ? fn(ptr) : 0;
}

}  // namespace mnemosyne::linux_host
