// The documented mnemosyne_* C API (include/mnemosyne.h).
#include "mnemosyne.h"

#include "arena/arena.hpp"
#include "arena/ownership_map.hpp"

using namespace mnemosyne;

extern "C" {

__attribute__((visibility("default"))) int mnemosyne_owns(const void* ptr) {
  return owner_tag(ptr) != 0 ? 1 : 0;
}

__attribute__((visibility("default"))) const char* mnemosyne_backend_of(const void* ptr) {
  const std::uint8_t tag = owner_tag(ptr);
  return tag == 0 ? "system" : backend_name(owner_backend(tag));
}

__attribute__((visibility("default"))) const char* mnemosyne_active_backend(void) {
  return backend_name(arena::active_backend());
}

__attribute__((visibility("default"))) const char* mnemosyne_version(void) {
  return MNEMOSYNE_VERSION;
}

}  // extern "C"
