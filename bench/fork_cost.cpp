// What a fork() costs with a given live heap: allocates MiB megabytes in
// blocks of 64 KiB (each written), forks COUNT children that each read one
// byte of every block and exit, and prints the median fork-to-exit time. Run
// it with and without the interposer to see what the heap copy costs.
//
//   fork_cost MIB [COUNT]
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

double now_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

}  // namespace

int main(int argc, char** argv) {
  const long mib = argc > 1 ? std::atol(argv[1]) : 256;
  const int count = argc > 2 ? std::atoi(argv[2]) : 5;
  constexpr std::size_t kBlock = 64 * 1024;
  std::vector<unsigned char*> blocks;
  for (long i = 0; i < mib * 16; ++i) {
    auto* b = static_cast<unsigned char*>(std::malloc(kBlock));
    if (b == nullptr) return 1;
    std::memset(b, static_cast<int>(i), kBlock);
    blocks.push_back(b);
  }
  std::vector<double> times;
  for (int c = 0; c < count; ++c) {
    const double start = now_ms();
    const pid_t pid = fork();
    if (pid == 0) {
      unsigned sum = 0;
      for (unsigned char* b : blocks) sum += b[kBlock / 2];
      _exit(sum == 0xffffffffu ? 1 : 0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    times.push_back(now_ms() - start);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 1;
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  std::printf("live heap %ld MiB: fork + child + exit %.1f ms (median of %d)\n", mib, median,
              count);
  for (unsigned char* b : blocks) std::free(b);
  return 0;
}
