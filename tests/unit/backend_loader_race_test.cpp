// 16 threads race the first allocation while cuInit is slow: exactly one
// load and one cuInit, every thread gets a block. Runs in its own process
// (no death tests), so it is usable under ThreadSanitizer.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <set>
#include <thread>
#include <vector>

#include "backend/backends.hpp"
#include "backend/loader.hpp"
#include "backend_test_support.hpp"

namespace mnemosyne {
namespace {

TEST(BackendLoaderRace, SixteenThreadsOneCuInit) {
  ASSERT_NE(test::fake_path(), nullptr) << "MNEMOSYNE_TEST_FAKECUDA is not set";
  ASSERT_EQ(driver_state(), DriverState::uninitialized);
  test::set_env("FAKECUDA_INIT_DELAY_MS", "150");

  constexpr int kThreads = 16;
  constexpr std::size_t kSize = 2u << 20;
  std::atomic<int> arrived{0};
  std::atomic<bool> go{false};
  std::atomic<int> saw_initializing{0};
  void* blocks[kThreads] = {};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      arrived.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      blocks[t] = (t % 2 == 0) ? CudaUnified::allocate(kSize) : CudaHostPinned::allocate(kSize);
    });
  }
  while (arrived.load() != kThreads) std::this_thread::yield();
  go.store(true, std::memory_order_release);
  // While the winner sits in cuInit the others wait in "initializing". Polled
  // for 2 s at most, by the clock: the number of polls is no measure of time
  // (mingw's sleep_for of 100 us may return at once).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (driver_state() != DriverState::ready && std::chrono::steady_clock::now() < deadline) {
    if (driver_state() == DriverState::initializing) saw_initializing.fetch_add(1);
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  for (auto& th : threads) th.join();

  ASSERT_EQ(driver_state(), DriverState::ready) << driver_info().reason;
  EXPECT_GT(saw_initializing.load(), 0);
  const test::Fake* fake = test::loaded_fake();
  ASSERT_NE(fake, nullptr);
  const fakecuda_counters c = fake->counters();
  EXPECT_EQ(c.init_calls, 1u);
  EXPECT_EQ(c.alloc_managed + c.alloc_host, static_cast<std::uint64_t>(kThreads));
  EXPECT_EQ(c.invalid_context_calls, 0u);

  std::set<void*> distinct;
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_NE(blocks[t], nullptr) << "thread " << t;
    distinct.insert(blocks[t]);
  }
  EXPECT_EQ(distinct.size(), static_cast<std::size_t>(kThreads));
  for (int t = 0; t < kThreads; ++t) {
    const bool ok = (t % 2 == 0) ? CudaUnified::deallocate(blocks[t], kSize)
                                 : CudaHostPinned::deallocate(blocks[t], kSize);
    EXPECT_TRUE(ok) << "thread " << t;
  }
  EXPECT_EQ(fake->counters().live_bytes, 0u);
  EXPECT_EQ(fake->counters().legacy_free_calls, 0u);

  // However many threads raced to retain the primary context, mnemosyne holds
  // exactly one reference: dropping one destroys the context and its blocks.
  // (This breaks the backends for the rest of the process: keep it last.)
  void* kept = CudaUnified::allocate(kSize);
  ASSERT_NE(kept, nullptr);
  const std::uint64_t freed = fake->counters().ctx_freed_blocks;
  const DriverApi* api = driver_api();
  CUdevice dev = 0;
  ASSERT_EQ(api->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
  ASSERT_EQ(api->cuDevicePrimaryCtxRelease(dev), CUDA_SUCCESS);
  EXPECT_EQ(fake->counters().ctx_freed_blocks, freed + 1);
  EXPECT_EQ(fake->owns(kept), 0);
}

}  // namespace
}  // namespace mnemosyne
