// The Host backend: anonymous pages from the OS (mmap, VirtualAlloc), registered, counted.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend/backends.hpp"
#include "backend/counters.hpp"
#include "platform/platform.hpp"
#include "test_os.hpp"

namespace mnemosyne {
namespace {

constexpr std::size_t kSize = 1u << 20;

TEST(BackendHost, RoundTrip) {
  BackendCounters& c = backend_counters(BackendId::host);
  const auto allocations = c.allocations.load();
  const auto deallocations = c.deallocations.load();
  const auto live = c.bytes_live.load();
  const auto calls = c.driver_calls.load();

  void* p = Host::allocate(kSize);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % test::page_size(), 0u);
  EXPECT_TRUE(Host::registry().contains(p));
  std::memset(p, 0xab, kSize);
  EXPECT_EQ(static_cast<unsigned char*>(p)[kSize - 1], 0xab);
  EXPECT_EQ(c.allocations.load(), allocations + 1);
  EXPECT_EQ(c.bytes_live.load(), live + kSize);

  EXPECT_TRUE(Host::deallocate(p, kSize));
  EXPECT_FALSE(Host::registry().contains(p));
  EXPECT_EQ(c.deallocations.load(), deallocations + 1);
  EXPECT_EQ(c.bytes_live.load(), live);
  EXPECT_EQ(c.driver_calls.load(), calls + 2);
  EXPECT_FALSE(Host::deallocate(p, kSize)) << "double release";
}

TEST(BackendHost, ForeignPointerAndZeroSize) {
  BackendCounters& c = backend_counters(BackendId::host);
  const auto calls = c.driver_calls.load();
  int local = 0;
  EXPECT_FALSE(Host::deallocate(&local, sizeof local));
  EXPECT_FALSE(Host::deallocate(nullptr, kSize));
  EXPECT_EQ(Host::allocate(0), nullptr);
  EXPECT_EQ(c.driver_calls.load(), calls) << "no mmap/munmap for refused requests";
}

TEST(BackendHost, RegistryFullRollsBack) {
  BackendCounters& c = backend_counters(BackendId::host);
  ASSERT_EQ(Host::registry().size(), 0u);
  const auto full = c.registry_full.load();
  const auto live = c.bytes_live.load();
  Host::registry().set_limit_for_testing(1);
  void* first = Host::allocate(kSize);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(Host::allocate(kSize), nullptr);
  EXPECT_EQ(c.registry_full.load(), full + 1);
  EXPECT_EQ(c.bytes_live.load(), live + kSize);
  Host::registry().set_limit_for_testing(AllocationRegistry::kCapacity);
  EXPECT_TRUE(Host::deallocate(first, kSize));
  EXPECT_EQ(c.bytes_live.load(), live);
}

TEST(BackendHost, ConcurrentRoundTrips) {
  constexpr int kThreads = 8;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        void* p = Host::allocate(64 * 1024);
        if (p == nullptr) {
          failures.fetch_add(1);
          continue;
        }
        static_cast<char*>(p)[0] = 1;
        if (!Host::deallocate(p, 64 * 1024)) failures.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(Host::registry().size(), 0u);
}

TEST(BackendHost, Traits) {
  static_assert(sizeof(Host) == 1 && std::is_empty_v<Host>);
  EXPECT_EQ(Host::kId, BackendId::host);
  EXPECT_STREQ(Host::kName, backend_name(BackendId::host));
  EXPECT_TRUE(Host::inherited_by_fork);
  EXPECT_TRUE(Host::fresh_memory_zero());
  EXPECT_FALSE(CudaUnified::fresh_memory_zero()) << "documented as not cleared";
}

// Every row of the backends' table names a backend that parses back to it,
// and with_backend reaches the type that implements that row's memory.
TEST(BackendTable, EveryRowIsItsBackend) {
  for (const BackendRow& row : kBackends) {
    SCOPED_TRACE(row.name);
    BackendId parsed = BackendId::none;
    EXPECT_TRUE(parse_backend_name(row.name, &parsed));
    EXPECT_EQ(parsed, row.id);
    EXPECT_STREQ(backend_name(row.id), row.name);
    EXPECT_EQ(is_cuda_backend(row.id), row.memory != MemoryKind::host);
    with_backend(row.id, [&]<MemoryBackend B>() {
      EXPECT_EQ(B::kId, row.id);
      EXPECT_STREQ(B::kName, row.name);
      EXPECT_EQ(B::data_off_cpu, row.memory == MemoryKind::managed);
      EXPECT_EQ(B::inherited_by_fork, row.memory == MemoryKind::host);
    });
  }
  BackendId id = BackendId::host;
  EXPECT_FALSE(parse_backend_name("none", &id));
  EXPECT_FALSE(parse_backend_name("Unified", &id)) << "the options lower-case names first";
  EXPECT_EQ(id, BackendId::host);
}

#if !defined(_WIN32)
// What the nvidia module says about zeroing pinned memory, from its params
// file (MNEMOSYNE_TEST_NVIDIA_PARAMS stands in for /proc/driver/nvidia/params).
TEST(PlatformLinux, NvidiaPinnedZeroSetting) {
  const std::string dir = ::testing::TempDir();
  auto setting = [&](const char* text) {
    const std::string path = dir + "/nvidia-params";
    if (text != nullptr) {
      FILE* f = std::fopen(path.c_str(), "w");
      std::fputs(text, f);
      std::fclose(f);
    } else {
      std::remove(path.c_str());
    }
    setenv("MNEMOSYNE_TEST_NVIDIA_PARAMS", path.c_str(), 1);
    char source[256];
    const int v = Os::nvidia_zeroes_pinned_memory(source, sizeof source);
    unsetenv("MNEMOSYNE_TEST_NVIDIA_PARAMS");
    return std::make_pair(v, std::string(source));
  };
  EXPECT_EQ(setting("ResmanDebugLevel: 4294967295\nInitializeSystemMemoryAllocations: 1\n").first,
            1);
  const auto off = setting("InitializeSystemMemoryAllocations: 0\nRegistryDwords: \"\"\n");
  EXPECT_EQ(off.first, 0);
  EXPECT_NE(off.second.find("InitializeSystemMemoryAllocations 0"), std::string::npos)
      << off.second;
  EXPECT_EQ(setting("EnableMSI: 1\n").first, -1) << "no such line: unknown";
  EXPECT_EQ(setting("InitializeSystemMemoryAllocations: \n").first, -1);
  const auto missing = setting(nullptr);
  EXPECT_EQ(missing.first, -1);
  EXPECT_NE(missing.second.find("not readable"), std::string::npos) << missing.second;
}
#endif

}  // namespace
}  // namespace mnemosyne
