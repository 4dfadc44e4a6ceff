// The documented mnemosyne_* C API (include/mnemosyne.h), exported by
// mnemosyne.def; programs find it with GetProcAddress(GetModuleHandle(
// "mnemosyne.dll"), ...).
#include "mnemosyne.h"

#include "arena/arena.hpp"
#include "arena/ownership_map.hpp"
#include "crt.hpp"
#include "mode.hpp"
#include "stats_report.hpp"

using namespace mnemosyne;

extern "C" {

int mnemosyne_owns(const void* ptr) {
  return owner_tag(ptr) != 0 ? 1 : 0;
}

const char* mnemosyne_backend_of(const void* ptr) {
  const std::uint8_t tag = owner_tag(ptr);
  return tag == 0 ? "system" : backend_name(owner_backend(tag));
}

const char* mnemosyne_active_backend(void) {
  return backend_name(arena::active_backend());
}

// From the arena when it runs, so that any runtime's free() takes it back;
// before start (or disabled) from msvcrt, whose free() the caller reaches
// through the same redirected functions.
char* mnemosyne_stats_json(void) {
  const std::size_t needed = win::stats_json(nullptr, 0) + 1;
  void* p = win::current_mode() != win::Mode::host ? arena::alloc(needed)
                                                   : win::g_crt[win::kMsvcrt].malloc(needed);
  auto* text = static_cast<char*>(p);
  if (text != nullptr) win::stats_json(text, needed);
  return text;
}

const char* mnemosyne_version(void) {
  return MNEMOSYNE_VERSION;
}

}  // extern "C"
