#include "stats_report.hpp"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "bootstrap.hpp"
#include "common/exit_report.hpp"
#include "mode.hpp"
#include "stats/report.hpp"

namespace mnemosyne {
namespace {

// The program's name as it started: some programs write over their argv to
// show their state in ps (PostgreSQL's backends do), and glibc's
// program_invocation_short_name points into it.
constinit char g_program[64] = {};

stats::ReportContext context() noexcept {
  return report_context(start_options(), static_cast<long>(getpid()), g_program, g_policy.counting);
}

void write_all(int fd, const char* text, std::size_t len) noexcept {
  while (len > 0) {
    const ssize_t n = write(fd, text, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text += n;
    len -= static_cast<std::size_t>(n);
  }
}

bool write_file(const char* path, const char* text, std::size_t len, char* why,
                std::size_t why_len) {
  const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::snprintf(why, why_len, "%s", std::strerror(errno));
    return false;
  }
  write_all(fd, text, len);
  close(fd);
  return true;
}

void report_at_exit() {
  const ReportSinks sinks{
      [](const char* text, std::size_t len) { write_all(STDERR_FILENO, text, len); }, &write_file,
      &warn_line};
  write_exit_reports(start_options(), context(), sinks);
}

}  // namespace

void install_exit_report() noexcept {
  std::snprintf(g_program, sizeof g_program, "%s", program_invocation_short_name);
  atexit(&report_at_exit);
}

std::size_t stats_json(char* buf, std::size_t len) noexcept {
  return stats::format_json(context(), buf, len);
}

}  // namespace mnemosyne
