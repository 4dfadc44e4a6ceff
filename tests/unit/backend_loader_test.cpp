// Driver loading scenarios. The loader keeps one state per process, so each
// scenario runs in a fresh re-executed process (threadsafe death test) with
// its own environment and must exit 0.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "backend/backends.hpp"
#include "backend/counters.hpp"
#include "backend/driver_call.hpp"
#include "backend/loader.hpp"
#include "backend/probe.hpp"
#include "backend_test_support.hpp"

namespace mnemosyne {
namespace {

constexpr std::size_t kSize = 2u << 20;

// Every backend refuses to allocate and nothing falls back to host memory.
bool all_cuda_backends_refuse() {
  return CudaUnified::allocate(kSize) == nullptr && CudaDevice::allocate(kSize) == nullptr &&
         CudaHbm::allocate(kSize) == nullptr && CudaGddr::allocate(kSize) == nullptr &&
         CudaHostPinned::allocate(kSize) == nullptr;
}

class BackendLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(test::fake_path(), nullptr) << "MNEMOSYNE_TEST_FAKECUDA is not set";
    ASSERT_NE(test::fake_noproc_path(), nullptr) << "MNEMOSYNE_TEST_FAKECUDA_NOPROC is not set";
  }
};

TEST_F(BackendLoaderTest, MissingDriverLibrary) {
  EXPECT_SCENARIO([] {
    test::set_env("MNEMOSYNE_CUDA_DRIVER", test::kMissingDriverPath);
    SCENARIO_CHECK(driver_state() == DriverState::uninitialized);
    SCENARIO_CHECK(!is_cuda_available());
    SCENARIO_CHECK(driver_state() == DriverState::unavailable);
    SCENARIO_CHECK(driver_api() == nullptr);
    SCENARIO_CHECK(all_cuda_backends_refuse());
    SCENARIO_CHECK(std::strcmp(driver_info().path, test::kMissingDriverPath) == 0);
    SCENARIO_CHECK(std::strstr(driver_info().reason, test::kMissingDriverPath) != nullptr);
#if defined(_WIN32)
    SCENARIO_CHECK(std::strstr(driver_info().reason, test::kMissingDriverError) != nullptr);
#endif
    SCENARIO_CHECK(create_temp_context(0) == nullptr);
    auto report = std::make_unique<DriverReport>();
    probe_driver(report.get());
    SCENARIO_CHECK(!report->available);
    SCENARIO_CHECK(report->device_count == 0);
    SCENARIO_CHECK(std::strstr(report->reason, test::kMissingDriverDir) != nullptr);
    // The Host backend does not need the driver.
    void* p = Host::allocate(kSize);
    SCENARIO_CHECK(p != nullptr && Host::deallocate(p, kSize));
  });
}

TEST_F(BackendLoaderTest, CuInitFailureNamesTheError) {
  EXPECT_SCENARIO([] {
    test::set_env("FAKECUDA_INIT_ERROR", "100");  // CUDA_ERROR_NO_DEVICE
    SCENARIO_CHECK(!is_cuda_available());
    SCENARIO_CHECK(driver_state() == DriverState::unavailable);
    SCENARIO_CHECK(driver_info().init_result == CUDA_ERROR_NO_DEVICE);
    SCENARIO_CHECK(std::strstr(driver_info().reason, "CUDA_ERROR_NO_DEVICE") != nullptr);
    SCENARIO_CHECK(std::strstr(driver_info().reason, "100") != nullptr);
    SCENARIO_CHECK(all_cuda_backends_refuse());
    fakecuda_counters c{};
    SCENARIO_CHECK(test::fake_counters_at(test::fake_path(), &c));
    SCENARIO_CHECK(c.init_calls == 1);
    SCENARIO_CHECK(c.alloc_managed == 0 && c.alloc_host == 0);
  });
}

TEST_F(BackendLoaderTest, MissingRequiredEntryPoint) {
  EXPECT_SCENARIO([] {
    test::set_env("FAKECUDA_MISSING", "cuMemAllocManaged");
    SCENARIO_CHECK(!is_cuda_available());
    SCENARIO_CHECK(driver_state() == DriverState::unavailable);
    SCENARIO_CHECK(std::strstr(driver_info().reason, "cuMemAllocManaged") != nullptr);
    SCENARIO_CHECK(all_cuda_backends_refuse());
    fakecuda_counters c{};
    SCENARIO_CHECK(test::fake_counters_at(test::fake_path(), &c));
    SCENARIO_CHECK(c.init_calls == 0);  // found missing before cuInit
    SCENARIO_CHECK(driver_info().version > 0);
  });
  EXPECT_SCENARIO([] {
    test::set_env("FAKECUDA_MISSING", "cuMemFree");
    SCENARIO_CHECK(!is_cuda_available());
    SCENARIO_CHECK(std::strstr(driver_info().reason, "cuMemFree") != nullptr);
  });
}

TEST_F(BackendLoaderTest, MissingOptionalEntryPoints) {
  EXPECT_SCENARIO([] {
    test::set_env("FAKECUDA_MISSING", "cuGetErrorName,cuCtxCreate,cuMemAdvise");
    SCENARIO_CHECK(is_cuda_available());
    SCENARIO_CHECK(driver_api()->cuGetErrorName == nullptr);
    SCENARIO_CHECK(create_temp_context(0) == nullptr);
    SCENARIO_CHECK(
        std::strcmp(cu_result_name(CUDA_ERROR_INVALID_VALUE), "CUDA_ERROR_INVALID_VALUE") == 0);
    // Without cuMemAdvise the device tier still allocates; the advice is
    // counted as failed.
    BackendCounters& bc = backend_counters(BackendId::device);
    void* p = CudaDevice::allocate(kSize);
    SCENARIO_CHECK(p != nullptr);
    SCENARIO_CHECK(bc.advice_failures.load() == 1);
    SCENARIO_CHECK(CudaDevice::deallocate(p, kSize));
  });
}

// The variant without cuGetProcAddress: entry points come from dlsym (Windows:
// GetProcAddress) of the versioned exports, and the legacy 32-bit cuMemFree is
// never used.
TEST_F(BackendLoaderTest, DlsymPathUsesVersionedExports) {
  EXPECT_SCENARIO([] {
    test::set_env("MNEMOSYNE_CUDA_DRIVER", test::fake_noproc_path());
    SCENARIO_CHECK(is_cuda_available());
    SCENARIO_CHECK(std::strcmp(driver_info().path, test::fake_noproc_path()) == 0);
    void* u = CudaUnified::allocate(kSize);
    void* d = CudaDevice::allocate(kSize);
    void* h = CudaHbm::allocate(kSize);
    void* g = CudaGddr::allocate(kSize);
    void* pin = CudaHostPinned::allocate(kSize);
    SCENARIO_CHECK(u && d && h && g && pin);
    CUcontext own = create_temp_context(0);
    SCENARIO_CHECK(own != nullptr);
    SCENARIO_CHECK(CudaUnified::deallocate(u, kSize));
    SCENARIO_CHECK(CudaDevice::deallocate(d, kSize));
    SCENARIO_CHECK(CudaHbm::deallocate(h, kSize));
    SCENARIO_CHECK(CudaGddr::deallocate(g, kSize));
    SCENARIO_CHECK(CudaHostPinned::deallocate(pin, kSize));
    CUcontext cur = nullptr;
    SCENARIO_CHECK(driver_api()->cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == own);
    SCENARIO_CHECK(destroy_temp_context(own));
    fakecuda_counters c{};
    SCENARIO_CHECK(test::fake_counters_at(test::fake_noproc_path(), &c));
    SCENARIO_CHECK(c.init_calls == 1);
    SCENARIO_CHECK(c.alloc_managed == 4 && c.free_managed == 4);
    SCENARIO_CHECK(c.alloc_host == 1 && c.free_host == 1);
    SCENARIO_CHECK(c.advise_calls == 3);
    SCENARIO_CHECK(c.legacy_free_calls == 0);
    SCENARIO_CHECK(c.legacy_calls == 0);
    SCENARIO_CHECK(c.invalid_context_calls == 0);
    SCENARIO_CHECK(c.live_bytes == 0);
  });
}

TEST_F(BackendLoaderTest, AdviceUsesTheConfiguredDevice) {
  EXPECT_SCENARIO([] {
    set_device_ordinal(1);
    SCENARIO_CHECK(device_ordinal() == 1);
    void* p = CudaDevice::allocate(kSize);
    SCENARIO_CHECK(p != nullptr);
    const test::Fake* fake = test::loaded_fake();
    SCENARIO_CHECK(fake != nullptr);
    SCENARIO_CHECK(fake->counters().advise_last_device == 1);
    fakecuda_advice advice{};
    SCENARIO_CHECK(fake->get_advice(p, &advice) == 1);
    SCENARIO_CHECK(advice.loc_type == CU_MEM_LOCATION_TYPE_DEVICE && advice.loc_id == 1);
    // Fixed by the first allocation.
    set_device_ordinal(0);
    SCENARIO_CHECK(device_ordinal() == 1);
    void* q = CudaGddr::allocate(kSize);
    SCENARIO_CHECK(q != nullptr);
    SCENARIO_CHECK(fake->counters().advise_last_device == 1);
    SCENARIO_CHECK(CudaDevice::deallocate(p, kSize));
    SCENARIO_CHECK(CudaGddr::deallocate(q, kSize));
    SCENARIO_CHECK(fake->counters().invalid_context_calls == 0);
  });
}

// Threads racing the first retain of the primary context: the losers release
// their extra reference, so one release by the test destroys the context.
TEST_F(BackendLoaderTest, PrimaryContextRetainedOnce) {
  EXPECT_SCENARIO([] {
    SCENARIO_CHECK(is_cuda_available());  // loaded, no context retained yet
    constexpr int kThreads = 8;
    std::atomic<int> arrived{0};
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        arrived.fetch_add(1);
        while (arrived.load() < kThreads) {
        }
        void* p = CudaUnified::allocate(kSize);
        if (p == nullptr || !CudaUnified::deallocate(p, kSize)) failures.fetch_add(1);
      });
    }
    for (auto& th : threads) th.join();
    SCENARIO_CHECK(failures.load() == 0);
    void* kept = CudaUnified::allocate(kSize);
    SCENARIO_CHECK(kept != nullptr);
    const test::Fake* fake = test::loaded_fake();
    SCENARIO_CHECK(fake != nullptr);
    const std::uint64_t freed = fake->counters().ctx_freed_blocks;
    CUdevice dev = 0;
    SCENARIO_CHECK(driver_api()->cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
    SCENARIO_CHECK(driver_api()->cuDevicePrimaryCtxRelease(dev) == CUDA_SUCCESS);
    SCENARIO_CHECK(fake->counters().ctx_freed_blocks == freed + 1);
    SCENARIO_CHECK(fake->owns(kept) == 0);
  });
}

// A thread inside the driver (or owned by it) must neither start the load nor
// wait for one in progress: it might hold a lock the loading cuInit needs.
TEST_F(BackendLoaderTest, DriverThreadsNeverLoadNorWait) {
  EXPECT_SCENARIO([] {
    test::set_env("FAKECUDA_INIT_DELAY_MS", "300");
    bool refused = false;
    std::thread([&] {
      mark_thread_as_driver_owned();
      refused = driver_api() == nullptr;
    }).join();
    SCENARIO_CHECK(refused);
    SCENARIO_CHECK(driver_state() == DriverState::uninitialized);

    std::thread loader([] { driver_api(); });
    while (driver_state() == DriverState::uninitialized) std::this_thread::yield();
    const auto start = std::chrono::steady_clock::now();
    bool null_during_load = false;
    std::thread([&] {
      mark_thread_as_driver_owned();
      null_during_load = CudaUnified::allocate(kSize) == nullptr;
    }).join();
    const auto waited = std::chrono::steady_clock::now() - start;
    SCENARIO_CHECK(null_during_load);
    SCENARIO_CHECK(waited < std::chrono::milliseconds(150));
    SCENARIO_CHECK(driver_state() == DriverState::initializing);
    loader.join();
    SCENARIO_CHECK(driver_state() == DriverState::ready);
    const test::Fake* fake = test::loaded_fake();
    SCENARIO_CHECK(fake != nullptr && fake->counters().init_calls == 1);
  });
}

TEST_F(BackendLoaderTest, NonexistentDeviceOrdinal) {
  EXPECT_SCENARIO([] {
    set_device_ordinal(7);  // the fake has 2 devices
    SCENARIO_CHECK(is_cuda_available());
    SCENARIO_CHECK(all_cuda_backends_refuse());
    SCENARIO_CHECK(backend_counters(BackendId::unified).driver_failures.load() == 1);
    const test::Fake* fake = test::loaded_fake();
    SCENARIO_CHECK(fake != nullptr);
    SCENARIO_CHECK(fake->counters().alloc_managed == 0);
  });
}

TEST_F(BackendLoaderTest, ForkedChildMarkBeforeAnyLoad) {
  EXPECT_SCENARIO([] {
    driver_mark_forked_child();
    SCENARIO_CHECK(driver_api() == nullptr);
    SCENARIO_CHECK(!is_cuda_available());
    SCENARIO_CHECK(driver_state() == DriverState::unavailable);
    SCENARIO_CHECK(all_cuda_backends_refuse());
    SCENARIO_CHECK(test::loaded_library(test::fake_path()) == nullptr);
  });
}

TEST_F(BackendLoaderTest, MemoryLimitFromTheEnvironment) {
  EXPECT_SCENARIO([] {
    test::set_env("FAKECUDA_FAIL_ALLOC_AFTER", "1");
    void* p = CudaUnified::allocate(kSize);
    SCENARIO_CHECK(p != nullptr);
    SCENARIO_CHECK(CudaUnified::allocate(kSize) == nullptr);
    SCENARIO_CHECK(CudaHostPinned::allocate(kSize) == nullptr);
    SCENARIO_CHECK(is_cuda_available());
    SCENARIO_CHECK(CudaUnified::deallocate(p, kSize));
  });
}

}  // namespace
}  // namespace mnemosyne
