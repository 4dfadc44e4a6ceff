#include "exit_report.hpp"

#include <cstdio>

#include "backend/loader.hpp"
#include "start_heap.hpp"

namespace mnemosyne {

stats::ReportContext report_context(const config::Options& o, long pid, const char* program,
                                    bool counting) noexcept {
  stats::ReportContext ctx;
  ctx.pid = pid;
  ctx.program = program;
  ctx.requested = o.backend;
  ctx.device = device_ordinal();
  ctx.counting = counting;
  ctx.size_min = o.size_min;
  ctx.size_max = o.size_max;
  ctx.limit = o.limit;
  ctx.fallback = o.fallback == config::Fallback::fail ? "fail" : "host";
  ctx.unavailable = backend_unavailable_reason();
  return ctx;
}

namespace {
constinit char g_report[64 * 1024];  // used at exit only, by the exiting thread
}  // namespace

void write_exit_reports(const config::Options& o, const stats::ReportContext& ctx,
                        const ReportSinks& sinks) noexcept {
  const stats::Snapshot snap = stats::take_snapshot(ctx);
  constexpr std::size_t kRoom = sizeof g_report - 1;  // the text, without its NUL
  if (o.show_stats) {
    const std::size_t n = stats::format_table(ctx, snap, g_report, sizeof g_report);
    sinks.to_stderr(g_report, n < kRoom ? n : kRoom);
  }
  if (o.stats_file[0] == '\0') return;
  char path[600];
  if (!config::expand_stats_path(o.stats_file, ctx.pid, path, sizeof path)) {
    sinks.warn("mnemosyne: MNEMOSYNE_STATS_FILE is too long after expanding %p; no file written");
    return;
  }
  const std::size_t n = stats::format_json(ctx, snap, g_report, sizeof g_report);
  char why[200];
  if (!sinks.to_file(path, g_report, n < kRoom ? n : kRoom, why, sizeof why)) {
    char line[800];
    std::snprintf(line, sizeof line, "mnemosyne: cannot write the statistics to %.500s: %s", path,
                  why);
    sinks.warn(line);
  }
}

}  // namespace mnemosyne
