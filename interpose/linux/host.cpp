#include <dlfcn.h>

#include <atomic>

#include "libc.hpp"

namespace mnemosyne::linux_host {
namespace {
using UsableFn = std::size_t (*)(void*);
std::atomic<UsableFn> g_usable{nullptr};
}  // namespace

void resolve() noexcept {
  g_usable.store(reinterpret_cast<UsableFn>(dlsym(RTLD_NEXT, "malloc_usable_size")));
}

std::size_t usable_size(void* ptr) noexcept {
  const UsableFn fn = g_usable.load(std::memory_order_acquire);
  return fn != nullptr ? fn(ptr) : 0;
}

}  // namespace mnemosyne::linux_host
