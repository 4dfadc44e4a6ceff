// AllocationRegistry: the bounded lock-free set of live blocks.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "backend/registry.hpp"

namespace mnemosyne {
namespace {

// Distinct page-aligned fake pointers: the registry never dereferences them.
void* fake_ptr(std::uintptr_t i) {
  return reinterpret_cast<void*>((i + 1) << 21);
}

TEST(BackendRegistry, InsertContainsErase) {
  auto reg = std::make_unique<AllocationRegistry>();
  void* a = fake_ptr(1);
  void* b = fake_ptr(2);
  EXPECT_EQ(reg->size(), 0u);
  EXPECT_FALSE(reg->contains(a));
  EXPECT_TRUE(reg->insert(a));
  EXPECT_TRUE(reg->contains(a));
  EXPECT_FALSE(reg->contains(b));
  EXPECT_EQ(reg->size(), 1u);
  EXPECT_TRUE(reg->insert(b));
  EXPECT_EQ(reg->size(), 2u);
  EXPECT_TRUE(reg->erase(a));
  EXPECT_FALSE(reg->contains(a));
  EXPECT_TRUE(reg->contains(b));
  EXPECT_FALSE(reg->erase(a)) << "a second erase finds nothing";
  EXPECT_TRUE(reg->erase(b));
  EXPECT_EQ(reg->size(), 0u);
}

TEST(BackendRegistry, RejectsNullAndUnknown) {
  auto reg = std::make_unique<AllocationRegistry>();
  EXPECT_FALSE(reg->insert(nullptr));
  EXPECT_FALSE(reg->contains(nullptr));
  EXPECT_FALSE(reg->erase(nullptr));
  int local = 0;
  EXPECT_FALSE(reg->erase(&local));
  EXPECT_EQ(reg->size(), 0u);
}

TEST(BackendRegistry, FullAtCapacity) {
  auto reg = std::make_unique<AllocationRegistry>();
  for (std::uintptr_t i = 0; i < AllocationRegistry::kCapacity; ++i) {
    ASSERT_TRUE(reg->insert(fake_ptr(i))) << i;
  }
  EXPECT_EQ(reg->size(), AllocationRegistry::kCapacity);
  EXPECT_FALSE(reg->insert(fake_ptr(AllocationRegistry::kCapacity)));
  EXPECT_EQ(reg->size(), AllocationRegistry::kCapacity);
  // Every entry is still found in a completely full table.
  for (std::uintptr_t i = 0; i < AllocationRegistry::kCapacity; ++i) {
    ASSERT_TRUE(reg->contains(fake_ptr(i))) << i;
  }
  EXPECT_FALSE(reg->contains(fake_ptr(AllocationRegistry::kCapacity)));
  // One erase makes room for exactly one insert.
  EXPECT_TRUE(reg->erase(fake_ptr(7)));
  EXPECT_TRUE(reg->insert(fake_ptr(AllocationRegistry::kCapacity)));
  EXPECT_FALSE(reg->insert(fake_ptr(AllocationRegistry::kCapacity + 1)));
}

TEST(BackendRegistry, LimitForTesting) {
  auto reg = std::make_unique<AllocationRegistry>();
  reg->set_limit_for_testing(3);
  EXPECT_TRUE(reg->insert(fake_ptr(0)));
  EXPECT_TRUE(reg->insert(fake_ptr(1)));
  EXPECT_TRUE(reg->insert(fake_ptr(2)));
  EXPECT_FALSE(reg->insert(fake_ptr(3)));
  EXPECT_EQ(reg->size(), 3u);
  EXPECT_TRUE(reg->erase(fake_ptr(1)));
  EXPECT_TRUE(reg->insert(fake_ptr(3)));
  reg->set_limit_for_testing(AllocationRegistry::kCapacity * 2);  // clamped
  for (std::uintptr_t i = 4; i < AllocationRegistry::kCapacity + 1; ++i) reg->insert(fake_ptr(i));
  EXPECT_EQ(reg->size(), AllocationRegistry::kCapacity);
}

TEST(BackendRegistry, ManyCyclesKeepLookupsCorrect) {
  // Erased slots become tombstones; reuse must never hide a live entry.
  auto reg = std::make_unique<AllocationRegistry>();
  std::vector<void*> live;
  for (std::uintptr_t round = 0; round < 20000; ++round) {
    void* p = fake_ptr(round);
    ASSERT_TRUE(reg->insert(p));
    live.push_back(p);
    if (live.size() > 300) {
      const std::size_t victim = (round * 7919) % live.size();
      ASSERT_TRUE(reg->erase(live[victim]));
      ASSERT_FALSE(reg->contains(live[victim]));
      live[victim] = live.back();
      live.pop_back();
    }
  }
  EXPECT_EQ(reg->size(), live.size());
  for (void* p : live) ASSERT_TRUE(reg->contains(p));
  EXPECT_FALSE(reg->contains(fake_ptr(1u << 30)));
}

TEST(BackendRegistry, ConcurrentInsertEraseFromEightThreads) {
  auto reg = std::make_unique<AllocationRegistry>();
  constexpr int kThreads = 8;
  constexpr std::uintptr_t kPerThread = 256;
  constexpr int kRounds = 40;
  std::atomic<int> failures{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      const std::uintptr_t base = static_cast<std::uintptr_t>(t) * kPerThread;
      for (int r = 0; r < kRounds; ++r) {
        for (std::uintptr_t i = 0; i < kPerThread; ++i) {
          if (!reg->insert(fake_ptr(base + i))) failures.fetch_add(1);
        }
        for (std::uintptr_t i = 0; i < kPerThread; ++i) {
          if (!reg->contains(fake_ptr(base + i))) failures.fetch_add(1);
        }
        for (std::uintptr_t i = 0; i < kPerThread; ++i) {
          if (!reg->erase(fake_ptr(base + i))) failures.fetch_add(1);
          if (reg->contains(fake_ptr(base + i))) failures.fetch_add(1);
        }
      }
    });
  }
  go.store(true, std::memory_order_release);
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(reg->size(), 0u);
}

TEST(BackendRegistry, ConcurrentInsertsNeverExceedLimit) {
  auto reg = std::make_unique<AllocationRegistry>();
  reg->set_limit_for_testing(100);
  constexpr int kThreads = 8;
  std::atomic<int> accepted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (std::uintptr_t i = 0; i < 50; ++i) {
        if (reg->insert(fake_ptr(static_cast<std::uintptr_t>(t) * 1000 + i))) accepted.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(accepted.load(), 100);
  EXPECT_EQ(reg->size(), 100u);
}

TEST(BackendRegistry, RacingErasersOfOnePointerOnlyOneWins) {
  auto reg = std::make_unique<AllocationRegistry>();
  for (int round = 0; round < 200; ++round) {
    void* p = fake_ptr(static_cast<std::uintptr_t>(round));
    ASSERT_TRUE(reg->insert(p));
    std::atomic<int> wins{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        if (reg->erase(p)) wins.fetch_add(1);
      });
    }
    for (auto& th : threads) th.join();
    ASSERT_EQ(wins.load(), 1);
  }
  EXPECT_EQ(reg->size(), 0u);
}

}  // namespace
}  // namespace mnemosyne
