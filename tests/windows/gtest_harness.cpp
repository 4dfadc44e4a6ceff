// A GoogleTest program that knows nothing of mnemosyne, with death tests:
// GoogleTest runs each in a child process of the same executable, started
// with CreateProcessA, so the child must be injected as well.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

TEST(Heap, ContainersKeepTheirContents) {
  std::map<int, std::string> m;
  for (int i = 0; i < 5000; ++i)
    m[i] = std::string(static_cast<std::size_t>(i % 300), 'a' + i % 26);
  for (int i = 0; i < 5000; i += 97) {
    ASSERT_EQ(m[i].size(), static_cast<std::size_t>(i % 300));
  }
  std::vector<std::unique_ptr<int[]>> arrays;
  for (int i = 0; i < 1000; ++i) arrays.emplace_back(new int[i + 1]());
  EXPECT_EQ(arrays[999][999], 0);
}

TEST(Heap, ThreadsAllocateAndFreeAcross) {
  std::vector<std::vector<char*>> made(4);
  std::vector<std::thread> pool;
  for (int t = 0; t < 4; ++t) {
    pool.emplace_back([&made, t] {
      for (int i = 0; i < 3000; ++i) {
        char* p = static_cast<char*>(std::malloc(16 + i % 500));
        p[0] = static_cast<char>(t);
        made[t].push_back(p);
      }
    });
  }
  for (auto& th : pool) th.join();
  for (int t = 0; t < 4; ++t) {
    for (char* p : made[t]) {
      ASSERT_EQ(p[0], static_cast<char>(t));
      std::free(p);
    }
  }
}

void die_after_allocating() {
  auto* v = new std::vector<int>(100, 1);
  std::fprintf(stderr, "dying with %zu ints\n", v->size());
  std::fflush(stderr);
  std::_Exit(1);
}

TEST(HeapDeathTest, ChildAllocatesThenDies) {
  EXPECT_DEATH(die_after_allocating(), "dying with 100 ints");
}

TEST(HeapDeathTest, ChildExitsWithCode) {
  EXPECT_EXIT(
      {
        std::string s(1000, 'x');
        std::exit(static_cast<int>(s.size() % 7));
      },
      ::testing::ExitedWithCode(1000 % 7), "");
}
