#include "stats_report.hpp"

#include <windows.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/start_report.hpp"
#include "mode.hpp"
#include "platform/platform.hpp"
#include "start.hpp"
#include "stats/report.hpp"

namespace mnemosyne::win {
namespace {

constinit char g_report[64 * 1024];  // used at exit only, by the exiting thread
constinit char g_program[MAX_PATH] = {};

const char* program_name() noexcept {
  char path[MAX_PATH] = {};
  GetModuleFileNameA(nullptr, path, sizeof path);
  const char* base = path;
  for (const char* p = path; *p != '\0'; ++p) {
    if (*p == '\\' || *p == '/') base = p + 1;
  }
  std::snprintf(g_program, sizeof g_program, "%s", base);
  return g_program;
}

stats::ReportContext context() noexcept {
  return report_context(start_options(), Os::process_id(), program_name(), g_policy.counting);
}

void write_all(HANDLE h, const char* text, std::size_t len) noexcept {
  while (len > 0) {
    DWORD n = 0;
    if (!WriteFile(h, text, static_cast<DWORD>(len), &n, nullptr) || n == 0) return;
    text += n;
    len -= n;
  }
}

void report_at_exit() {
  const config::Options& o = start_options();
  const stats::ReportContext ctx = context();
  const stats::Snapshot snap = stats::take_snapshot(ctx);  // one moment for both reports
  if (o.show_stats) {
    const std::size_t n = stats::format_table(ctx, snap, g_report, sizeof g_report);
    write_all(GetStdHandle(STD_ERROR_HANDLE), g_report,
              n < sizeof g_report ? n : sizeof g_report - 1);
  }
  if (o.stats_file[0] != '\0') {
    char path[600];
    if (!config::expand_stats_path(o.stats_file, ctx.pid, path, sizeof path)) {
      warn_line("mnemosyne: MNEMOSYNE_STATS_FILE is too long after expanding %p; no file written");
      return;
    }
    const std::size_t n = stats::format_json(ctx, snap, g_report, sizeof g_report);
    HANDLE f =
        CreateFileA(path, GENERIC_WRITE, 0, nullptr, CREATE_ALWAYS, FILE_ATTRIBUTE_NORMAL, nullptr);
    if (f == INVALID_HANDLE_VALUE) {
      char line[700];
      std::snprintf(line, sizeof line,
                    "mnemosyne: cannot write the statistics to %.500s: error %lu", path,
                    GetLastError());
      warn_line(line);
      return;
    }
    write_all(f, g_report, n < sizeof g_report ? n : sizeof g_report - 1);
    CloseHandle(f);
  }
}

}  // namespace

void install_exit_report() noexcept {
  std::atexit(&report_at_exit);
}

std::size_t stats_json(char* buf, std::size_t len) noexcept {
  return stats::format_json(context(), buf, len);
}

}  // namespace mnemosyne::win
