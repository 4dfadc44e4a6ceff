// errno across successful allocation calls, as the end-to-end tests run it
// with and without the interposer: a program's errno must survive every
// malloc, free and fork that succeeds. Sets errno to EINVAL before each call
// and names every call after which it changed; prints one summary line.
// Under the interposer the calls include growing the arena (a driver call),
// a thread's first allocation, blocks of their own segment, and fork.
#include <errno.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

namespace {

int g_changed = 0;

void expect_kept(const char* what) {
  if (errno != EINVAL) {
    std::printf("errno changed to %d (%s) by %s\n", errno, std::strerror(errno), what);
    ++g_changed;
  }
  errno = EINVAL;
}

void* first_allocations(void*) {
  errno = EINVAL;
  void* p = std::malloc(100);  // the thread's first
  expect_kept("a thread's first malloc");
  std::free(p);
  expect_kept("a thread's first free");
  p = std::calloc(100, 100);
  expect_kept("a thread's calloc");
  std::free(p);
  expect_kept("a thread's free");
  return nullptr;
}

}  // namespace

int main() {
  errno = EINVAL;
  std::vector<void*> blocks;
  for (int i = 0; i < 3000; ++i) {  // 300 MB: the arena grows several times
    blocks.push_back(std::malloc(100000));
    expect_kept("a malloc that grows the heap");
  }
  for (void* p : blocks) {
    std::free(p);
    expect_kept("free");
  }
  void* big = std::malloc(std::size_t{1} << 30);  // a segment of its own
  expect_kept("malloc of 1 GiB");
  std::free(big);
  expect_kept("free of 1 GiB");
  void* aligned = nullptr;
  if (posix_memalign(&aligned, std::size_t{32} << 20, 4096) != 0) return 2;
  expect_kept("posix_memalign to 32 MiB");
  std::free(aligned);
  expect_kept("free of an aligned block");
  void* r = nullptr;
  for (std::size_t mib = 1; mib < 200; mib += 7) {
    r = std::realloc(r, mib << 20);
    expect_kept("realloc growing a block");
  }
  std::free(r);
  expect_kept("free after realloc");
  for (int i = 0; i < 10000; ++i) {
    delete[] new (std::nothrow) char[64 + i % 500];
    expect_kept("new and delete");
  }
  pthread_t thread;
  if (pthread_create(&thread, nullptr, first_allocations, nullptr) != 0) return 2;
  pthread_join(thread, nullptr);
  errno = EINVAL;
  std::fflush(stdout);
  const int before_fork = g_changed;
  const pid_t pid = fork();
  if (pid == 0) {
    expect_kept("fork, in the child");
    std::fflush(stdout);
    _exit(g_changed - before_fork);
  }
  expect_kept("fork, in the parent");
  int status = 0;
  waitpid(pid, &status, 0);
  const int child = WIFEXITED(status) ? WEXITSTATUS(status) : 100;
  std::printf("errno: %d calls changed it\n", g_changed + child);
  return g_changed + child == 0 ? 0 : 1;
}
