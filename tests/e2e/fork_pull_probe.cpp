// Children that take little of a big heap, as the end-to-end tests run them
// with and without the interposer (with MNEMOSYNE_FORK_PULL_MS, such a child
// pulls only the pages it touches: src/arena/fork/pull.cpp). The parent holds
// 256 self-checking blocks of 1 MiB; the same output is expected from both
// runs. A child that finds anything wrong says so on stderr and exits
// non-zero, which the parent reports. After each fork() returns, the parent
// overwrites every block (new seeds): a child must read the heap of the
// moment of its fork, never the parent's later writes.
//
//   fork_pull_probe exec        the child execs echo with argv strings built in the heap
//                               (the kernel reads them), by execv and by execvp
//   fork_pull_probe write       the child write()s heap buffers to a pipe (the kernel reads
//                               them) and exits; the parent reads what came
//   fork_pull_probe read1       the child checks 1% of the blocks and exits
//   fork_pull_probe late        the child waits on a pipe the parent writes only after fork()
//                               returns (and after overwriting the heap), then checks every
//                               block: it has pulled nothing when the parent's wait ends
//   fork_pull_probe nested      the child checks a few blocks, then forks a grandchild (and
//                               calls _Fork, and posix_spawn) that checks every block
//   fork_pull_probe closefds    the child closes every descriptor above 2 (as Python's
//                               subprocess does), opens files in their place, forks a
//                               grandchild that checks every block, sleeps, checks every
//                               block, then execs
//   fork_pull_probe signal      forks from a SIGALRM handler while the main thread allocates;
//                               each child execs true
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "pattern_block.hpp"

extern char** environ;
extern "C" pid_t _Fork();

namespace {

constexpr int kBlocks = 256;
constexpr std::size_t kBlockBytes = std::size_t{1} << 20;
void* g_blocks[kBlocks];

void fill_all(std::uint64_t round) {
  for (int i = 0; i < kBlocks; ++i) test::fill_block(g_blocks[i], kBlockBytes, round * 100000 + i);
}

// In a child: block i as it was at the fork (round `round`).
bool check(int i, std::uint64_t round) {
  bool checked = false;
  const auto* h = static_cast<const test::Header*>(g_blocks[i]);
  if (!test::block_ok(g_blocks[i], &checked) || !checked || h->seed != round * 100000 + i) {
    std::fprintf(stderr, "child %d: block %d wrong (seed %llu, expected %llu)\n", getpid(), i,
                 static_cast<unsigned long long>(h->seed),
                 static_cast<unsigned long long>(round * 100000 + i));
    return false;
  }
  return true;
}

bool check_all(std::uint64_t round, int step = 1) {
  bool ok = true;
  for (int i = 0; i < kBlocks; i += step) ok = check(i, round) && ok;
  return ok;
}

bool child_ok(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) {
    std::perror("waitpid");
    return false;
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  std::fprintf(stderr, "child %d ended with status %#x\n", pid, status);
  return false;
}

// The bytes a descriptor gives until its end.
std::string drain(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  return out;
}

int mode_exec() {
  bool ok = true;
  for (int round = 1; round <= 4; ++round) {
    fill_all(round);
    // argv and its strings in the heap, as a launcher builds them.
    char** argv = static_cast<char**>(std::malloc(4 * sizeof(char*)));
    argv[0] = strdup("echo");
    argv[1] = strdup(("round-" + std::to_string(round)).c_str());
    argv[2] = strdup("from-the-heap");
    argv[3] = nullptr;
    int out[2];
    if (pipe(out) != 0) return 1;
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(out[1], 1);
      if (round % 2 == 1)
        execv("/bin/echo", argv);
      else
        execvp(argv[0], argv);
      std::perror("exec");
      _exit(3);
    }
    close(out[1]);
    fill_all(round + 50);
    const std::string got = drain(out[0]);
    close(out[0]);
    const std::string want = "round-" + std::to_string(round) + " from-the-heap\n";
    if (got != want) {
      std::fprintf(stderr, "exec round %d: child printed '%s'\n", round, got.c_str());
      ok = false;
    }
    ok = child_ok(pid) && ok;
    for (int i = 0; i < 3; ++i) std::free(argv[i]);
    std::free(argv);
  }
  std::printf("exec: %s\n", ok ? "every child printed its heap's argv" : "FAILED");
  return ok ? 0 : 1;
}

int mode_write() {
  bool ok = true;
  for (int round = 1; round <= 3; ++round) {
    fill_all(round);
    int out[2];
    if (pipe(out) != 0) return 1;
    const pid_t pid = fork();
    if (pid == 0) {
      close(out[0]);
      // Whole blocks, straight from the heap into the pipe.
      for (int i = round; i < kBlocks; i += 64) {
        const char* p = static_cast<const char*>(g_blocks[i]);
        for (std::size_t done = 0; done < kBlockBytes;) {
          const ssize_t n = write(out[1], p + done, kBlockBytes - done);
          if (n <= 0) {
            std::perror("child write");
            _exit(2);
          }
          done += static_cast<std::size_t>(n);
        }
      }
      _exit(0);
    }
    close(out[1]);
    fill_all(round + 50);
    const std::string got = drain(out[0]);
    close(out[0]);
    std::size_t at = 0;
    for (int i = round; i < kBlocks; i += 64, at += kBlockBytes) {
      bool checked = false;
      const void* b = got.data() + at;
      if (got.size() < at + kBlockBytes || !test::block_ok(b, &checked) || !checked ||
          static_cast<const test::Header*>(b)->seed != std::uint64_t(round) * 100000 + i) {
        std::fprintf(stderr, "write round %d: block %d came wrong\n", round, i);
        ok = false;
      }
    }
    ok = child_ok(pid) && ok;
  }
  std::printf("write: %s\n", ok ? "every block the children wrote came intact" : "FAILED");
  return ok ? 0 : 1;
}

int mode_read1() {
  bool ok = true;
  for (int round = 1; round <= 4; ++round) {
    fill_all(round);
    const pid_t pid = fork();
    if (pid == 0) _exit(check_all(round, 100) ? 0 : 1);
    fill_all(round + 50);
    ok = child_ok(pid) && ok;
  }
  std::printf("read1: %s\n", ok ? "children read their fork's blocks" : "FAILED");
  return ok ? 0 : 1;
}

int mode_late() {
  bool ok = true;
  for (int round = 1; round <= 2; ++round) {
    fill_all(round);
    int go[2];
    if (pipe(go) != 0) return 1;
    const pid_t pid = fork();
    if (pid == 0) {
      close(go[1]);
      char c = 0;
      if (read(go[0], &c, 1) != 1) _exit(2);
      _exit(check_all(round) ? 0 : 1);
    }
    close(go[0]);
    fill_all(round + 50);  // after fork() returned: the child must not see it
    if (write(go[1], "g", 1) != 1) ok = false;
    close(go[1]);
    ok = child_ok(pid) && ok;
  }
  std::printf("late: %s\n", ok ? "children that waited read their fork's blocks" : "FAILED");
  return ok ? 0 : 1;
}

int mode_nested() {
  bool ok = true;
  for (int round = 1; round <= 2; ++round) {
    fill_all(round);
    const pid_t pid = fork();
    if (pid == 0) {
      bool good = check(0, round) && check(kBlocks - 1, round);
      const pid_t grandchild = fork();
      if (grandchild == 0) _exit(check_all(round) ? 0 : 1);
      good = child_ok(grandchild) && good;
      const pid_t raw = _Fork();
      if (raw == 0) _exit(check_all(round, 7) ? 0 : 1);
      good = child_ok(raw) && good;
      pid_t spawned = 0;
      char* argv[] = {const_cast<char*>("true"), nullptr};
      if (posix_spawn(&spawned, "/bin/true", nullptr, nullptr, argv, environ) != 0)
        good = false;
      else
        good = child_ok(spawned) && good;
      // The child's own writes stay its own, and the rest still reads right.
      test::fill_block(g_blocks[1], kBlockBytes, round * 100000 + 1);
      _exit(check_all(round) && good ? 0 : 1);
    }
    fill_all(round + 50);
    ok = child_ok(pid) && ok;
  }
  std::printf("nested: %s\n", ok ? "grandchildren read their grandparent's fork" : "FAILED");
  return ok ? 0 : 1;
}

int mode_closefds() {
  bool ok = true;
  fill_all(1);
  const pid_t pid = fork();
  if (pid == 0) {
    for (int fd = 3; fd < 1024; ++fd) close(fd);
    // Numbers the interposer's descriptors had, now the program's files:
    // whatever mnemosyne still does must not write into them.
    int sinks[16];
    for (int& fd : sinks) fd = open("/dev/null", O_WRONLY);
    const pid_t grandchild = fork();
    if (grandchild == 0) _exit(check_all(1) ? 0 : 1);
    if (!child_ok(grandchild)) _exit(1);
    for (int fd : sinks) close(fd);
    usleep(300 * 1000);
    if (!check_all(1)) _exit(1);
    char* argv[] = {const_cast<char*>("true"), nullptr};
    execv("/bin/true", argv);
    _exit(3);
  }
  fill_all(51);
  ok = child_ok(pid) && ok;
  std::printf("closefds: %s\n",
              ok ? "a child that closed every descriptor read its fork's blocks" : "FAILED");
  return ok ? 0 : 1;
}

std::atomic<int> g_signal_children{0};
std::atomic<int> g_signal_failures{0};

void on_alarm(int) {
  const int saved = errno;
  const pid_t pid = fork();
  if (pid == 0) {
    char* argv[] = {const_cast<char*>("true"), nullptr};
    execv("/bin/true", argv);
    _exit(3);
  }
  if (pid < 0) {
    g_signal_failures.fetch_add(1);
  } else {
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
      g_signal_failures.fetch_add(1);
    g_signal_children.fetch_add(1);
  }
  errno = saved;
}

int mode_signal() {
  fill_all(1);
  struct sigaction sa {};
  sa.sa_handler = on_alarm;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGALRM, &sa, nullptr);
  itimerval every{{0, 20000}, {0, 20000}};
  setitimer(ITIMER_REAL, &every, nullptr);
  std::vector<void*> churn;
  while (g_signal_children.load() < 10) {
    for (int i = 0; i < 1000; ++i) churn.push_back(std::malloc(64 + i % 512));
    for (void* p : churn) std::free(p);
    churn.clear();
  }
  itimerval off{};
  setitimer(ITIMER_REAL, &off, nullptr);
  const bool ok = g_signal_failures.load() == 0;
  std::printf("signal: %s\n", ok ? "children forked from a handler ran" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  for (int i = 0; i < kBlocks; ++i) g_blocks[i] = std::malloc(kBlockBytes);
  if (mode == "exec") return mode_exec();
  if (mode == "write") return mode_write();
  if (mode == "read1") return mode_read1();
  if (mode == "late") return mode_late();
  if (mode == "nested") return mode_nested();
  if (mode == "closefds") return mode_closefds();
  if (mode == "signal") return mode_signal();
  std::fprintf(stderr, "usage: fork_pull_probe exec|write|read1|late|nested|closefds|signal\n");
  return 2;
}
