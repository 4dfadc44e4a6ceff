#include "stats_report.hpp"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "backend/loader.hpp"
#include "bootstrap.hpp"
#include "common/start_report.hpp"
#include "mode.hpp"
#include "stats/report.hpp"

namespace mnemosyne {
namespace {

constinit char g_report[64 * 1024];  // used at exit only, by the exiting thread

stats::ReportContext context() noexcept {
  return report_context(start_options(), static_cast<long>(getpid()), program_invocation_short_name,
                        g_policy.counting);
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

void report_at_exit() {
  const config::Options& o = start_options();
  const stats::ReportContext ctx = context();
  const stats::Snapshot snap = stats::take_snapshot(ctx);  // one moment for both reports
  if (o.show_stats) {
    std::size_t n = stats::format_table(ctx, snap, g_report, sizeof g_report);
    write_all(STDERR_FILENO, g_report, n < sizeof g_report ? n : sizeof g_report - 1);
  }
  if (o.stats_file[0] != '\0') {
    char path[600];
    if (!config::expand_stats_path(o.stats_file, ctx.pid, path, sizeof path)) {
      warn_line("mnemosyne: MNEMOSYNE_STATS_FILE is too long after expanding %p; no file written");
      return;
    }
    const std::size_t n = stats::format_json(ctx, snap, g_report, sizeof g_report);
    const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      char line[700];
      std::snprintf(line, sizeof line, "mnemosyne: cannot write the statistics to %.500s: %s", path,
                    std::strerror(errno));
      warn_line(line);
      return;
    }
    write_all(fd, g_report, n < sizeof g_report ? n : sizeof g_report - 1);
    close(fd);
  }
}

}  // namespace

void install_exit_report() noexcept {
  atexit(&report_at_exit);
}

std::size_t stats_json(char* buf, std::size_t len) noexcept {
  return stats::format_json(context(), buf, len);
}

}  // namespace mnemosyne
