// main() of the backend unit tests. The driver loader keeps one state per
// process, so scenarios that need a fresh process or another environment run
// as death tests in the "threadsafe" style, which re-executes this binary.
// MNEMOSYNE_TEST_FAKECUDA (set by meson) names the test-double driver; it
// becomes MNEMOSYNE_CUDA_DRIVER before any test runs.
#include <gtest/gtest.h>

#include <cstdlib>

#include "test_os.hpp"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
#ifdef GTEST_FLAG_SET
  GTEST_FLAG_SET(death_test_style, "threadsafe");
#else  // GoogleTest before 1.11 (Debian 11)
  ::testing::GTEST_FLAG(death_test_style) = "threadsafe";
#endif
  if (const char* fake = std::getenv("MNEMOSYNE_TEST_FAKECUDA"); fake != nullptr && *fake) {
    mnemosyne::test::set_env("MNEMOSYNE_CUDA_DRIVER", fake);
  }
  return RUN_ALL_TESTS();
}
