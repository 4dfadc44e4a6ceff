// The CUDA backends against the fake driver, in one process: the driver is
// loaded once (MNEMOSYNE_CUDA_DRIVER = the fake, 2 devices, no faults).
#include <gtest/gtest.h>
#if !defined(_WIN32)
#include <sys/wait.h>
#include <unistd.h>
#endif

#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#include "backend/backends.hpp"
#include "backend/counters.hpp"
#include "backend/driver_call.hpp"
#include "backend/loader.hpp"
#include "backend/probe.hpp"
#include "backend_test_support.hpp"

namespace mnemosyne {
namespace {

using test::Fake;

constexpr std::size_t kSize = 4u << 20;

// What the fake reports for a pointer of each backend (fakecuda_owns).
template <class B>
constexpr int kOwnerKind = std::is_same_v<B, CudaHostPinned> ? 2 : 1;
template <class B>
constexpr bool kAdvised =
    std::is_same_v<B, CudaDevice> || std::is_same_v<B, CudaHbm> || std::is_same_v<B, CudaGddr>;

std::uint64_t driver_allocs(const fakecuda_counters& c) {
  return c.alloc_managed + c.alloc_host;
}
std::uint64_t driver_frees(const fakecuda_counters& c) {
  return c.free_managed + c.free_host;
}

CUcontext current_context() {
  CUcontext ctx = nullptr;
  EXPECT_EQ(driver_api()->cuCtxGetCurrent(&ctx), CUDA_SUCCESS);
  return ctx;
}

class BackendCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(test::fake_path(), nullptr) << "MNEMOSYNE_TEST_FAKECUDA is not set";
    ASSERT_TRUE(is_cuda_available()) << driver_info().reason;
    fake_ = test::loaded_fake();
    ASSERT_NE(fake_, nullptr) << "fakecuda control functions not found in " << driver_info().path;
  }
  void TearDown() override {
    if (fake_ == nullptr) return;
    fake_->set_fail_alloc_after(-1);
    fake_->set_mem_limit(0);
    fake_->set_advise_error(0);
    const fakecuda_counters c = fake_->counters();
    EXPECT_EQ(c.legacy_free_calls, 0u) << "the legacy 32-bit cuMemFree was called";
    EXPECT_EQ(c.legacy_calls, 0u) << "an unversioned legacy export was called";
    EXPECT_EQ(c.invalid_context_calls, 0u) << "a driver call ran without a current context";
  }
  const Fake* fake_ = nullptr;
};

template <class B>
class BackendCudaTyped : public BackendCudaTest {};

using CudaBackends = ::testing::Types<CudaUnified, CudaDevice, CudaHbm, CudaGddr, CudaHostPinned>;
TYPED_TEST_SUITE(BackendCudaTyped, CudaBackends);

TYPED_TEST(BackendCudaTyped, RoundTrip) {
  using B = TypeParam;
  const Fake& fake = *this->fake_;
  BackendCounters& bc = backend_counters(B::kId);
  const fakecuda_counters before = fake.counters();
  const auto allocations = bc.allocations.load();
  const auto deallocations = bc.deallocations.load();
  const auto live = bc.bytes_live.load();
  const auto calls = bc.driver_calls.load();
  const auto ns = bc.driver_ns.load();
  const auto reg_size = B::registry().size();

  void* p = B::allocate(kSize);
  ASSERT_NE(p, nullptr) << driver_info().reason;
  EXPECT_TRUE(B::registry().contains(p));
  EXPECT_EQ(B::registry().size(), reg_size + 1);
  EXPECT_EQ(fake.owns(p), kOwnerKind<B>) << "the block must be driver memory";
  EXPECT_EQ(fake.owns(static_cast<char*>(p) + kSize - 1), kOwnerKind<B>);
  std::memset(p, 0x5c, kSize);
  EXPECT_EQ(static_cast<unsigned char*>(p)[kSize / 2], 0x5c);

  const fakecuda_counters mid = fake.counters();
  EXPECT_EQ(driver_allocs(mid), driver_allocs(before) + 1);
  EXPECT_EQ(mid.live_bytes, before.live_bytes + kSize);
  EXPECT_EQ(bc.allocations.load(), allocations + 1);
  EXPECT_EQ(bc.bytes_live.load(), live + kSize);
  EXPECT_GT(bc.driver_ns.load(), ns);
  if constexpr (kAdvised<B>) {
    EXPECT_EQ(mid.advise_calls, before.advise_calls + 1);
    EXPECT_EQ(mid.advise_last_device, 0);
    fakecuda_advice advice{};
    ASSERT_EQ(fake.get_advice(p, &advice), 1);
    EXPECT_EQ(advice.advice, CU_MEM_ADVISE_SET_PREFERRED_LOCATION);
    EXPECT_EQ(advice.loc_type, CU_MEM_LOCATION_TYPE_DEVICE);
    EXPECT_EQ(advice.loc_id, 0);
    EXPECT_EQ(bc.driver_calls.load(), calls + 2);
  } else {
    EXPECT_EQ(mid.advise_calls, before.advise_calls);
    EXPECT_EQ(bc.driver_calls.load(), calls + 1);
  }

  EXPECT_TRUE(B::deallocate(p, kSize));
  const fakecuda_counters after = fake.counters();
  EXPECT_EQ(driver_frees(after), driver_frees(before) + 1);
  EXPECT_EQ(after.live_bytes, before.live_bytes);
  EXPECT_EQ(fake.owns(p), 0);
  EXPECT_FALSE(B::registry().contains(p));
  EXPECT_EQ(bc.deallocations.load(), deallocations + 1);
  EXPECT_EQ(bc.bytes_live.load(), live);
  EXPECT_EQ(after.failed_calls, before.failed_calls);

  EXPECT_FALSE(B::deallocate(p, kSize)) << "a second release of the same block";
  EXPECT_EQ(fake.counters().total_calls, after.total_calls);
}

TYPED_TEST(BackendCudaTyped, RegistryFullReleasesTheDriverAllocation) {
  using B = TypeParam;
  const Fake& fake = *this->fake_;
  BackendCounters& bc = backend_counters(B::kId);
  B::registry().set_limit_for_testing(B::registry().size() + 1);
  void* kept = B::allocate(kSize);
  ASSERT_NE(kept, nullptr);
  const fakecuda_counters before = fake.counters();
  const auto full = bc.registry_full.load();
  const auto live = bc.bytes_live.load();

  EXPECT_EQ(B::allocate(kSize), nullptr);
  const fakecuda_counters after = fake.counters();
  EXPECT_EQ(driver_allocs(after), driver_allocs(before) + 1) << "the driver allocation happened";
  EXPECT_EQ(driver_frees(after), driver_frees(before) + 1) << "and was rolled back";
  EXPECT_EQ(after.live_bytes, before.live_bytes);
  EXPECT_EQ(bc.registry_full.load(), full + 1);
  EXPECT_EQ(bc.bytes_live.load(), live);

  B::registry().set_limit_for_testing(AllocationRegistry::kCapacity);
  EXPECT_TRUE(B::deallocate(kept, kSize));
}

TYPED_TEST(BackendCudaTyped, ForeignPointerMakesNoDriverCall) {
  using B = TypeParam;
  const Fake& fake = *this->fake_;
  // A live driver block of another CUDA backend, and a host block.
  void* other =
      std::is_same_v<B, CudaUnified> ? CudaDevice::allocate(kSize) : CudaUnified::allocate(kSize);
  ASSERT_NE(other, nullptr);
  void* host = Host::allocate(kSize);
  ASSERT_NE(host, nullptr);
  int local = 0;

  const fakecuda_counters before = fake.counters();
  EXPECT_FALSE(B::deallocate(&local, sizeof local));
  EXPECT_FALSE(B::deallocate(nullptr, kSize));
  EXPECT_FALSE(B::deallocate(host, kSize));
  EXPECT_FALSE(B::deallocate(other, kSize));
  EXPECT_EQ(fake.counters().total_calls, before.total_calls);
  EXPECT_EQ(fake.owns(other), 1) << "the other backend's block is untouched";

  EXPECT_TRUE(Host::deallocate(host, kSize));
  const bool released = std::is_same_v<B, CudaUnified> ? CudaDevice::deallocate(other, kSize)
                                                       : CudaUnified::deallocate(other, kSize);
  EXPECT_TRUE(released);
}

TYPED_TEST(BackendCudaTyped, DriverAllocationFailureReturnsNull) {
  using B = TypeParam;
  const Fake& fake = *this->fake_;
  BackendCounters& bc = backend_counters(B::kId);
  const auto failures = bc.driver_failures.load();
  const auto reg_size = B::registry().size();

  fake.set_fail_alloc_after(0);
  EXPECT_EQ(B::allocate(kSize), nullptr);
  EXPECT_TRUE(is_cuda_available()) << "a failed allocation does not make the driver unavailable";
  EXPECT_EQ(bc.driver_failures.load(), failures + 1);
  EXPECT_EQ(B::registry().size(), reg_size);
  fake.set_fail_alloc_after(-1);

  fake.set_mem_limit(fake.counters().live_bytes + kSize / 2);
  EXPECT_EQ(B::allocate(kSize), nullptr);
  fake.set_mem_limit(0);

  void* p = B::allocate(kSize);
  ASSERT_NE(p, nullptr) << "allocations work again once the driver recovers";
  EXPECT_TRUE(B::deallocate(p, kSize));
}

TYPED_TEST(BackendCudaTyped, KeepsTheCallersCurrentContext) {
  using B = TypeParam;
  // No context current: none is left behind.
  EXPECT_EQ(current_context(), nullptr);
  void* p = B::allocate(kSize);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(current_context(), nullptr);
  EXPECT_TRUE(B::deallocate(p, kSize));
  EXPECT_EQ(current_context(), nullptr);

  // The application's own context stays current across every call.
  CUcontext own = create_temp_context(1);
  ASSERT_NE(own, nullptr);
  EXPECT_EQ(current_context(), own);
  p = B::allocate(kSize);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(current_context(), own);
  void* q = B::allocate(kSize);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(current_context(), own);
  EXPECT_TRUE(B::deallocate(p, kSize));
  EXPECT_EQ(current_context(), own);
  EXPECT_FALSE(B::deallocate(p, kSize));
  EXPECT_EQ(current_context(), own);

  // The block belongs to the retained primary context, not to `own`.
  const auto freed_with_ctx = this->fake_->counters().ctx_freed_blocks;
  EXPECT_TRUE(destroy_temp_context(own));
  EXPECT_EQ(this->fake_->counters().ctx_freed_blocks, freed_with_ctx);
  EXPECT_EQ(this->fake_->owns(q), kOwnerKind<B>);
  EXPECT_TRUE(B::deallocate(q, kSize));
  EXPECT_EQ(current_context(), nullptr);
}

TYPED_TEST(BackendCudaTyped, ZeroSizeIsRefused) {
  using B = TypeParam;
  const auto total = this->fake_->counters().total_calls;
  EXPECT_EQ(B::allocate(0), nullptr);
  EXPECT_EQ(this->fake_->counters().total_calls, total);
}

TEST_F(BackendCudaTest, AdviceFailureLeavesTheAllocationValid) {
  BackendCounters& bc = backend_counters(BackendId::device);
  const auto advice_failures = bc.advice_failures.load();
  fake_->set_advise_error(CUDA_ERROR_INVALID_VALUE);
  void* p = CudaDevice::allocate(kSize);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(bc.advice_failures.load(), advice_failures + 1);
  EXPECT_EQ(fake_->owns(p), 1);
  std::memset(p, 1, kSize);
  fake_->set_advise_error(0);
  EXPECT_TRUE(CudaDevice::deallocate(p, kSize));
}

TEST_F(BackendCudaTest, TiersKeepSeparateRegistriesAndCounters) {
  void* hbm = CudaHbm::allocate(kSize);
  void* gddr = CudaGddr::allocate(kSize);
  ASSERT_NE(hbm, nullptr);
  ASSERT_NE(gddr, nullptr);
  EXPECT_TRUE(CudaHbm::registry().contains(hbm));
  EXPECT_FALSE(CudaHbm::registry().contains(gddr));
  EXPECT_FALSE(CudaDevice::registry().contains(hbm));
  EXPECT_NE(&CudaHbm::registry(), &CudaGddr::registry());
  EXPECT_NE(&backend_counters(BackendId::hbm), &backend_counters(BackendId::gddr));
  EXPECT_FALSE(CudaGddr::deallocate(hbm, kSize));
  EXPECT_TRUE(CudaHbm::deallocate(hbm, kSize));
  EXPECT_TRUE(CudaGddr::deallocate(gddr, kSize));
  static_assert(std::is_empty_v<CudaHbm> && std::is_empty_v<CudaGddr>);
}

TEST_F(BackendCudaTest, DriverInfoDescribesTheFake) {
  EXPECT_EQ(driver_state(), DriverState::ready);
  const DriverInfo& info = driver_info();
  EXPECT_STREQ(info.path, test::fake_path());
  EXPECT_GT(info.version, 0);
  EXPECT_EQ(info.device_count, 2);
  EXPECT_EQ(info.init_result, CUDA_SUCCESS);
  EXPECT_STREQ(info.reason, "");
  EXPECT_EQ(fake_->counters().init_calls, 1u);
  EXPECT_STREQ(cu_result_name(CUDA_ERROR_OUT_OF_MEMORY), "CUDA_ERROR_OUT_OF_MEMORY");
  EXPECT_NE(cu_result_name(static_cast<CUresult>(123456)), nullptr);
}

TEST_F(BackendCudaTest, ProbeReportsEveryDevice) {
  auto report = std::make_unique<DriverReport>();
  probe_driver(report.get());
  EXPECT_TRUE(report->available);
  EXPECT_STREQ(report->path, test::fake_path());
  EXPECT_EQ(report->version, driver_info().version);
  EXPECT_STREQ(report->reason, "");
  ASSERT_EQ(report->device_count, 2);
  for (int i = 0; i < report->device_count; ++i) {
    const DeviceReport& d = report->devices[i];
    EXPECT_EQ(d.ordinal, i);
    EXPECT_GT(std::strlen(d.name), 0u);
    EXPECT_GT(d.total_memory, 0u);
    EXPECT_GT(d.compute_major, 0);
    EXPECT_GE(d.concurrent_managed_access, 0);
    EXPECT_GE(d.pageable_memory_access, 0);
  }
}

TEST_F(BackendCudaTest, InDriverFlagNestsAndDriverThreadsAreMarked) {
  EXPECT_FALSE(in_driver_call());
  {
    DriverCall outer;
    EXPECT_TRUE(outer.ok());
    EXPECT_TRUE(in_driver_call());
    {
      DriverCall inner;
      EXPECT_TRUE(inner.ok());
      EXPECT_TRUE(in_driver_call());
    }
    EXPECT_TRUE(in_driver_call()) << "the inner scope keeps the outer flag";
  }
  EXPECT_FALSE(in_driver_call());
  EXPECT_EQ(current_context(), nullptr);

  bool seen_before = true;
  bool seen_after = false;
  std::thread([&] {
    seen_before = in_driver_call();
    mark_thread_as_driver_owned();
    seen_after = in_driver_call();
  }).join();
  EXPECT_FALSE(seen_before);
  EXPECT_TRUE(seen_after);
  EXPECT_FALSE(in_driver_call()) << "the mark is per thread";
}

TEST_F(BackendCudaTest, ConcurrentAllocationsFromEightThreads) {
  const fakecuda_counters before = fake_->counters();
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 16; ++i) {
        void* p = (t & 1) ? CudaDevice::allocate(2u << 20) : CudaUnified::allocate(2u << 20);
        if (p == nullptr) {
          failures.fetch_add(1);
          continue;
        }
        static_cast<char*>(p)[0] = 1;
        const bool ok =
            (t & 1) ? CudaDevice::deallocate(p, 2u << 20) : CudaUnified::deallocate(p, 2u << 20);
        if (!ok) failures.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  const fakecuda_counters after = fake_->counters();
  EXPECT_EQ(after.alloc_managed, before.alloc_managed + 128);
  EXPECT_EQ(after.free_managed, before.free_managed + 128);
  EXPECT_EQ(after.live_bytes, before.live_bytes);
}

// MNEMOSYNE_CONTEXT=own: the heap's blocks belong to a context of
// mnemosyne's, not the primary one, so cuDevicePrimaryCtxReset (what
// cudaDeviceReset does) leaves them alone; the calling thread's context is
// as it was. Fresh process: the context is chosen at the first driver call.
TEST(BackendOwnContext, BlocksOutliveAPrimaryContextReset) {
  EXPECT_SCENARIO([] {
    set_own_context(true);
    SCENARIO_CHECK(is_cuda_available());
    const Fake* fake = test::loaded_fake();
    SCENARIO_CHECK(fake != nullptr);
    void* managed = CudaUnified::allocate(kSize);
    void* pinned = CudaHostPinned::allocate(kSize);
    SCENARIO_CHECK(managed != nullptr && pinned != nullptr);
    CUcontext current = nullptr;
    SCENARIO_CHECK(driver_api()->cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == nullptr);
    CUdevice dev = 0;
    CUcontext primary = nullptr;
    CUcontext owner = nullptr;
    SCENARIO_CHECK(driver_api()->cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
    SCENARIO_CHECK(driver_api()->cuDevicePrimaryCtxRetain(&primary, dev) == CUDA_SUCCESS);
    SCENARIO_CHECK(driver_api()->cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT,
                                                       reinterpret_cast<CUdeviceptr>(managed)) ==
                   CUDA_SUCCESS);
    SCENARIO_CHECK(owner != nullptr && owner != primary);
    using Reset = CUresult (*)(CUdevice);
    auto reset = reinterpret_cast<Reset>(test::library_symbol(
        test::loaded_library(driver_info().path), "cuDevicePrimaryCtxReset_v2"));
    SCENARIO_CHECK(reset != nullptr && reset(dev) == CUDA_SUCCESS);
    SCENARIO_CHECK(fake->owns(managed) == 1 && fake->owns(pinned) == 2);
    std::memset(managed, 1, kSize);
    SCENARIO_CHECK(CudaUnified::deallocate(managed, kSize));
    SCENARIO_CHECK(CudaHostPinned::deallocate(pinned, kSize));
    SCENARIO_CHECK(fake->counters().ctx_freed_blocks == 0);
  });
}

// A driver without cuCtxCreate_v4 (before CUDA 12.5): the CUDA backends
// refuse, and the reason names what is missing.
TEST(BackendOwnContext, NeedsCuCtxCreateV4) {
  EXPECT_SCENARIO([] {
    test::set_env("FAKECUDA_MISSING", "cuCtxCreate");
    set_own_context(true);
    SCENARIO_CHECK(is_cuda_available());
    SCENARIO_CHECK(CudaUnified::allocate(kSize) == nullptr);
    char why[512];
    describe_last_failure(BackendId::unified, why, sizeof why);
    SCENARIO_CHECK(std::strstr(why, "MNEMOSYNE_CONTEXT=own needs cuCtxCreate_v4") != nullptr);
  });
}

// Linux only: Windows has no fork().
#if !defined(_WIN32)
TEST_F(BackendCudaTest, ForkedChildNeverCallsTheDriver) {
  void* p = CudaUnified::allocate(kSize);
  ASSERT_NE(p, nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(10);
    driver_mark_forked_child();
    fakecuda_counters before{};
    fake_->get_counters(&before);
    int bad = 0;
    if (driver_api() != nullptr) bad |= 1;
    if (CudaUnified::allocate(kSize) != nullptr) bad |= 2;
    if (CudaDevice::allocate(kSize) != nullptr) bad |= 4;
    if (CudaHostPinned::allocate(kSize) != nullptr) bad |= 8;
    if (CudaUnified::deallocate(p, kSize)) bad |= 16;
    if (is_cuda_available()) bad |= 32;
    if (driver_state() != DriverState::unavailable) bad |= 64;
    fakecuda_counters after{};
    fake_->get_counters(&after);
    if (after.total_calls != before.total_calls) bad |= 128;
    _exit(bad);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "bit mask of failed child checks";
  // The parent is unaffected.
  EXPECT_NE(driver_api(), nullptr);
  EXPECT_TRUE(CudaUnified::registry().contains(p));
  EXPECT_TRUE(CudaUnified::deallocate(p, kSize));
}
#endif  // !_WIN32

}  // namespace
}  // namespace mnemosyne
