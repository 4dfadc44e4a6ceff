// Helpers of the backend tests that run against the fake driver
// (tests/fakecuda): access to its control functions, and "scenarios" that
// run in a fresh process (a death test) with their own environment.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/loader.hpp"
#include "fakecuda.h"
#include "test_os.hpp"

namespace mnemosyne::test {

// The fake's control functions, looked up in the library the product loaded
// (driver_info().path) without loading a second copy.
struct Fake {
  fakecuda_get_counters_fn get_counters = nullptr;
  fakecuda_reset_counters_fn reset_counters = nullptr;
  fakecuda_owns_fn owns = nullptr;
  fakecuda_get_advice_fn get_advice = nullptr;
  fakecuda_set_fail_alloc_after_fn set_fail_alloc_after = nullptr;
  fakecuda_set_mem_limit_fn set_mem_limit = nullptr;
  fakecuda_set_advise_error_fn set_advise_error = nullptr;

  fakecuda_counters counters() const {
    fakecuda_counters c{};
    get_counters(&c);
    return c;
  }
};

// Null until the product has loaded the fake (call driver_api() first).
inline const Fake* loaded_fake() {
  static Fake fake;
  static bool found = false;
  if (found) return &fake;
  if (driver_state() != DriverState::ready) return nullptr;
  void* h = loaded_library(driver_info().path);
  if (h == nullptr) return nullptr;
  auto sym = [h](auto* out, const char* name) {
    *out = reinterpret_cast<std::remove_pointer_t<decltype(out)>>(library_symbol(h, name));
    return *out != nullptr;
  };
  found = sym(&fake.get_counters, "fakecuda_get_counters") &&
          sym(&fake.reset_counters, "fakecuda_reset_counters") &&
          sym(&fake.owns, "fakecuda_owns") && sym(&fake.get_advice, "fakecuda_get_advice") &&
          sym(&fake.set_fail_alloc_after, "fakecuda_set_fail_alloc_after") &&
          sym(&fake.set_mem_limit, "fakecuda_set_mem_limit") &&
          sym(&fake.set_advise_error, "fakecuda_set_advise_error");
  return found ? &fake : nullptr;
}

// The counters of a library loaded at `path` by the product (any state).
inline bool fake_counters_at(const char* path, fakecuda_counters* out) {
  void* h = loaded_library(path);
  if (h == nullptr) return false;
  auto get = reinterpret_cast<fakecuda_get_counters_fn>(library_symbol(h, "fakecuda_get_counters"));
  if (get == nullptr) return false;
  get(out);
  return true;
}

inline const char* fake_path() {
  return std::getenv("MNEMOSYNE_TEST_FAKECUDA");
}
inline const char* fake_noproc_path() {
  return std::getenv("MNEMOSYNE_TEST_FAKECUDA_NOPROC");
}

// Inside a scenario (a child process): a failed check prints and exits 1.
#define SCENARIO_CHECK(cond)                                                                 \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "%s:%d: scenario check failed: %s\n", __FILE__, __LINE__, #cond); \
      ::mnemosyne::test::exit_now(1);                                                        \
    }                                                                                        \
  } while (0)

// Runs `body` in a fresh re-executed process (threadsafe death test) and
// expects it to finish with exit code 0. `body` sets its environment first.
template <class F>
[[noreturn]] void run_scenario_and_exit(F body) {
  body();
  std::fflush(nullptr);
  exit_now(0);
}
#define EXPECT_SCENARIO(...)                                                                       \
  EXPECT_EXIT(::mnemosyne::test::run_scenario_and_exit(__VA_ARGS__), ::testing::ExitedWithCode(0), \
              "")

}  // namespace mnemosyne::test
