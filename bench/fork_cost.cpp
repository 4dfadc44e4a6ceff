// What a fork() costs with a given live heap: allocates MiB megabytes of
// live blocks, each written, of one SHAPE: "large", blocks of 64 KiB, or
// "small", objects of 16 to 256 bytes with a tenth of them freed again (a
// key-value server's heap); forks COUNT children one after the other, each
// doing CHILD:
//   read   read one byte of every block, then exit (the default)
//   read1  read one byte of every hundredth block (1% of the heap), then exit
//   exec   execv("/bin/true") at once (a launcher's child)
//   exit   _exit(0) at once
// and prints the median time of the fork() call in the parent (what a
// server's latest_fork_usec reports) and of fork to the child's end, and on
// a second line the first fork's (the first of a series: no earlier image
// to share) apart from the median of the others. Run it with and without
// the interposer to see what the heap copy costs.
//
//   fork_cost MIB [COUNT] [large|small] [read|read1|exec|exit]
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
  const bool small = argc > 3 && std::strcmp(argv[3], "small") == 0;
  const char* child = argc > 4 ? argv[4] : "read";
  const int stride = std::strcmp(child, "read1") == 0 ? 100 : 1;
  const std::size_t target = static_cast<std::size_t>(mib) << 20;
  std::vector<unsigned char*> blocks;
  std::vector<std::size_t> sizes;
  std::size_t live = 0;
  unsigned seed = 12345;
  while (live < target) {
    const std::size_t size = small ? 16 + static_cast<std::size_t>(rand_r(&seed)) % 241 : 64 * 1024;
    auto* b = static_cast<unsigned char*>(std::malloc(size));
    if (b == nullptr) return 1;
    std::memset(b, static_cast<int>(blocks.size()), size);
    blocks.push_back(b);
    sizes.push_back(size);
    live += size;
    if (small && rand_r(&seed) % 10 == 0) {  // holes, as a server's deletes leave them
      const std::size_t victim = static_cast<std::size_t>(rand_r(&seed)) % blocks.size();
      live -= sizes[victim];
      std::free(blocks[victim]);
      blocks[victim] = blocks.back();
      sizes[victim] = sizes.back();
      blocks.pop_back();
      sizes.pop_back();
    }
  }
  std::vector<double> calls;
  std::vector<double> totals;
  for (int c = 0; c < count; ++c) {
    const double start = now_ms();
    const pid_t pid = fork();
    if (pid == 0) {
      if (std::strcmp(child, "exec") == 0) {
        execl("/bin/true", "true", static_cast<char*>(nullptr));
        _exit(127);
      }
      if (std::strcmp(child, "exit") == 0) _exit(0);
      unsigned sum = 0;
      for (std::size_t i = 0; i < blocks.size(); i += stride) sum += blocks[i][sizes[i] / 2];
      _exit(sum == 0xffffffffu ? 1 : 0);
    }
    calls.push_back(now_ms() - start);
    int status = 0;
    waitpid(pid, &status, 0);
    totals.push_back(now_ms() - start);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 1;
  }
  // The first fork apart, then the others' medians.
  const double first_call = calls[0];
  const double first_total = totals[0];
  std::vector<double> rest_calls(calls.begin() + 1, calls.end());
  std::vector<double> rest_totals(totals.begin() + 1, totals.end());
  std::sort(calls.begin(), calls.end());
  std::sort(totals.begin(), totals.end());
  std::sort(rest_calls.begin(), rest_calls.end());
  std::sort(rest_totals.begin(), rest_totals.end());
  std::printf(
      "live heap %ld MiB of %s blocks (%zu): fork() %.1f ms, fork + child + exit %.1f ms "
      "(median of %d)\n",
      mib, small ? "16-256 byte" : "64 KiB", blocks.size(), calls[calls.size() / 2],
      totals[totals.size() / 2], count);
  if (!rest_calls.empty()) {
    std::printf(
        "child %s: first fork() %.1f ms, to its end %.1f ms; the other %zu: fork() %.1f ms, "
        "to the end %.1f ms (median)\n",
        child, first_call, first_total, rest_calls.size(), rest_calls[rest_calls.size() / 2],
        rest_totals[rest_totals.size() / 2]);
  }
  for (unsigned char* b : blocks) std::free(b);
  return 0;
}
