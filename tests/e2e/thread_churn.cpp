// Thousands of short-lived threads, each allocating and freeing, in waves.
// Prints only a deterministic summary; the test checks that the heap stayed
// bounded (thread exits give their memory back to the arena).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  const int total = argc > 1 ? atoi(argv[1]) : 4000;
  const int wave = 32;
  std::atomic<long> bytes{0};
  for (int done = 0; done < total; done += wave) {
    std::vector<std::thread> threads;
    for (int i = 0; i < wave && done + i < total; ++i) {
      threads.emplace_back([&bytes, i] {
        void* blocks[64];
        for (int k = 0; k < 64; ++k) {
          const size_t n = 16 + static_cast<size_t>((k * 977 + i * 131) % 20000);
          blocks[k] = malloc(n);
          memset(blocks[k], k, n);
          bytes += static_cast<long>(n);
        }
        for (void* b : blocks) free(b);
      });
    }
    for (auto& t : threads) t.join();
  }
  printf("threads: %d, bytes: %ld\n", total, bytes.load());
  return 0;
}
