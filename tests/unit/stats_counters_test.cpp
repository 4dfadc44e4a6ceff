// src/stats/counters: what threads count adds up exactly in totals(), and
// the peak tracks the live bytes to within the publishing step per thread.
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "stats/counters.hpp"

namespace mnemosyne::stats {
namespace {

constexpr int kPool = 3;  // a backend's pool, not the system one

PoolTotals pool_totals(int pool) {
  PoolTotals all[kPools];
  totals(all);
  return all[pool];
}

TEST(StatsCounters, ThreadsAddUpExactly) {
  const PoolTotals before = pool_totals(kPool);
  constexpr int kThreads = 8;
  constexpr int kOps = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < kOps; ++i) {
        count_alloc(kPool, 100 + t, 112);
        if (i % 2 == 0) count_free(kPool, 112);  // half stay live
      }
    });
  }
  for (auto& th : threads) th.join();
  const PoolTotals after = pool_totals(kPool);
  EXPECT_EQ(after.allocations - before.allocations, std::uint64_t{kThreads} * kOps);
  EXPECT_EQ(after.frees - before.frees, std::uint64_t{kThreads} * kOps / 2);
  std::uint64_t requested = 0;
  for (int t = 0; t < kThreads; ++t) requested += std::uint64_t{kOps} * (100 + t);
  EXPECT_EQ(after.bytes_requested - before.bytes_requested, requested);
  const std::int64_t live = std::int64_t{kThreads} * kOps / 2 * 112;
  EXPECT_EQ(after.bytes_live - before.bytes_live, live);
  // Every thread kept allocating: the peak reached the final live total.
  EXPECT_GE(after.bytes_peak, static_cast<std::uint64_t>(after.bytes_live));
}

// The forms a counted malloc or free ends with (count_alloc_then,
// count_free_then, which take the pool scaled) count what count_alloc and
// count_free do: a thread's first count (no slot yet), blocks large enough
// that every few counts publish, and the block handed back.
TEST(StatsCounters, EndingFormsAddUpExactly) {
  constexpr int kThenPool = 2;
  const PoolTotals before = pool_totals(kThenPool);
  constexpr int kThreads = 4;
  constexpr int kOps = 5000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      int block = 0;
      for (int i = 0; i < kOps; ++i) {
        const std::size_t usable = (i % 3 == 0) ? 40000 : 48 + t;
        EXPECT_EQ(count_alloc_then(&block, kThenPool * kPoolScale, usable - 8, usable), &block);
        if (i % 2 == 0) count_free_then(kThenPool * kPoolScale, usable);
      }
    });
  }
  for (auto& th : threads) th.join();
  const PoolTotals after = pool_totals(kThenPool);
  EXPECT_EQ(after.allocations - before.allocations, std::uint64_t{kThreads} * kOps);
  EXPECT_EQ(after.frees - before.frees, std::uint64_t{kThreads} * kOps / 2);
  std::uint64_t requested = 0;
  std::int64_t live = 0;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kOps; ++i) {
      const std::size_t usable = (i % 3 == 0) ? 40000 : 48 + t;
      requested += usable - 8;
      if (i % 2 != 0) live += static_cast<std::int64_t>(usable);
    }
  }
  EXPECT_EQ(after.bytes_requested - before.bytes_requested, requested);
  EXPECT_EQ(after.bytes_live - before.bytes_live, live);
}

TEST(StatsCounters, PeakSurvivesFrees) {
  constexpr int kPeakPool = 4;
  std::thread([] {
    for (int i = 0; i < 1000; ++i) count_alloc(kPeakPool, 4096, 4096);  // 4 MiB live
    for (int i = 0; i < 1000; ++i) count_free(kPeakPool, 4096);
  }).join();
  const PoolTotals t = pool_totals(kPeakPool);
  EXPECT_EQ(t.bytes_live, 0);
  // Published every 64 KiB of change: exact to within one step.
  EXPECT_GE(t.bytes_peak, std::uint64_t{1000} * 4096 - 64 * 1024);
  EXPECT_LE(t.bytes_peak, std::uint64_t{1000} * 4096);
}

// A thread that allocates and frees in turn publishes what it allocated and
// what it freed apart, 64 KiB at a time: its peak stays within one step of
// the true one either way, and the live total is exact.
TEST(StatsCounters, PeakOfChurnIsWithinOneStep) {
  constexpr int kChurnPool = 1;
  const PoolTotals before = pool_totals(kChurnPool);
  constexpr std::uint64_t kBase = 1 << 20;
  std::thread([] {
    count_alloc(kChurnPool, kBase, kBase);
    for (int i = 0; i < 100000; ++i) {
      count_alloc(kChurnPool, 100, 112);
      count_free(kChurnPool, 112);
    }
  }).join();
  const PoolTotals after = pool_totals(kChurnPool);
  EXPECT_EQ(after.bytes_live - before.bytes_live, static_cast<std::int64_t>(kBase));
  const std::uint64_t true_peak = static_cast<std::uint64_t>(before.bytes_live) + kBase + 112;
  EXPECT_GE(after.bytes_peak + 64 * 1024, true_peak);
  EXPECT_LE(after.bytes_peak, true_peak + 64 * 1024);
}

// Threads beyond the kSlots own slots count in the shared overflow slot: the
// totals stay exact, live bytes included.
TEST(StatsCounters, ThreadsBeyondTheSlotsAddUpExactly) {
  constexpr int kOverflowPool = 5;
  const PoolTotals before = pool_totals(kOverflowPool);
  constexpr int kThreads = detail::kSlots + 300;
  constexpr int kBatch = 64;
  for (int started = 0; started < kThreads; started += kBatch) {
    std::vector<std::thread> batch;
    for (int t = started; t < started + kBatch && t < kThreads; ++t) {
      batch.emplace_back([t] {
        count_alloc(kOverflowPool, 10, 16);
        count_alloc(kOverflowPool, 20, 32);
        if (t % 2 == 0) count_free(kOverflowPool, 32);
      });
    }
    for (auto& th : batch) th.join();
  }
  const PoolTotals after = pool_totals(kOverflowPool);
  EXPECT_EQ(after.allocations - before.allocations, std::uint64_t{2} * kThreads);
  EXPECT_EQ(after.frees - before.frees, std::uint64_t{kThreads} / 2);
  EXPECT_EQ(after.bytes_requested - before.bytes_requested, std::uint64_t{30} * kThreads);
  EXPECT_EQ(after.bytes_live - before.bytes_live,
            std::int64_t{16} * kThreads + std::int64_t{32} * (kThreads / 2));
}

}  // namespace
}  // namespace mnemosyne::stats
