// The documented mnemosyne_* C API (include/mnemosyne.h).
#include "mnemosyne.h"

#include "arena/arena.hpp"
#include "arena/ownership_map.hpp"
#include "stats_report.hpp"

#include <cstdlib>

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

__attribute__((visibility("default"))) char* mnemosyne_stats_json(void) {
  const std::size_t needed = mnemosyne::stats_json(nullptr, 0) + 1;
  auto* text = static_cast<char*>(std::malloc(needed));
  if (text != nullptr) mnemosyne::stats_json(text, needed);
  return text;
}

__attribute__((visibility("default"))) const char* mnemosyne_version(void) {
  return MNEMOSYNE_VERSION;
}

}  // extern "C"
