// The mnemosyne_* C API from a Windows program, found at run time the way
// include/mnemosyne.h says (GetProcAddress on mnemosyne.dll), so the
// program also runs without it. Run injected (run_windows.py, case api).
#include <windows.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "probe_check.hpp"

using probe::check;

namespace {

template <class Fn>
Fn find(HMODULE dll, const char* name) {
  return reinterpret_cast<Fn>(reinterpret_cast<void*>(GetProcAddress(dll, name)));
}

}  // namespace

int main(int argc, char** argv) {
  HMODULE dll = GetModuleHandleA("mnemosyne.dll");
  if (dll == nullptr) {
    std::printf("api_probe: mnemosyne.dll is not loaded\n");
    return 2;
  }
  auto owns = find<int (*)(const void*)>(dll, "mnemosyne_owns");
  auto backend_of = find<const char* (*)(const void*)>(dll, "mnemosyne_backend_of");
  auto active = find<const char* (*)()>(dll, "mnemosyne_active_backend");
  auto stats_json = find<char* (*)()>(dll, "mnemosyne_stats_json");
  auto version = find<const char* (*)()>(dll, "mnemosyne_version");
  check(owns && backend_of && active && stats_json && version, "every function is exported");
  if (probe::failures != 0) return 1;
  const char* want = argc > 1 ? argv[1] : "unified";
  void* p = std::malloc(1000);
  check(owns(p) == 1, "mnemosyne_owns(malloc'd block) is 1");
  check(std::strcmp(backend_of(p), want) == 0, "mnemosyne_backend_of names the backend");
  int local = 0;
  check(owns(&local) == 0, "mnemosyne_owns(stack) is 0");
  check(std::strcmp(backend_of(&local), "system") == 0, "a stack address is 'system'");
  check(std::strcmp(active(), want) == 0, "mnemosyne_active_backend");
  char* json = stats_json();
  check(json != nullptr && std::strstr(json, "\"schema\": \"mnemosyne-stats/1\"") != nullptr,
        "mnemosyne_stats_json returns the schema");
  std::free(json);  // with the program's own free(), as the header says
  std::free(p);
  std::printf("api_probe %s %s\n", version(), probe::failures == 0 ? "ok" : "failures");
  return probe::failures == 0 ? 0 : 1;
}
