#include "start_report.hpp"

#include <cstdio>

#include "backend/loader.hpp"

namespace mnemosyne {

int choose_device(const config::Options& o) noexcept {
  if (!o.device_local_rank) return o.device;
  if (!is_cuda_backend(o.backend) || o.local_rank < 0 || driver_api() == nullptr) return 0;
  const int count = driver_info().device_count;
  return count > 0 ? o.local_rank % count : 0;
}

void print_verbose(const config::Options& o, const arena::StartReport& report, int device, long pid,
                   const char* flavour, void (*warn)(const char* line)) noexcept {
  char line[1024];
  std::snprintf(line, sizeof line, "mnemosyne: version %s, pid %ld%s", MNEMOSYNE_VERSION, pid,
                flavour);
  warn(line);
  std::snprintf(line, sizeof line,
                "mnemosyne: BACKEND=%s DEVICE=%d%s SIZE=%zu:%zu%s ARENA_SIZE=%zu LIMIT=%zu%s "
                "FALLBACK=%s",
                backend_name(o.backend), device, o.device_local_rank ? " (local-rank)" : "",
                o.size_min, o.size_max, o.size_routing ? "" : " (all sizes)", o.arena_size, o.limit,
                o.limit == 0 ? " (none)" : "",
                o.fallback == config::Fallback::fail ? "fail" : "host");
  warn(line);
  std::snprintf(line, sizeof line,
                "mnemosyne: SHOW_STATS=%d STATS_FILE=%.200s CUDA_DRIVER=%.200s DISABLE=0 VERBOSE=1",
                o.show_stats ? 1 : 0, o.stats_file[0] ? o.stats_file : "(none)",
                o.cuda_driver[0] ? o.cuda_driver : "(default search)");
  warn(line);
  const DriverState state = driver_state();
  if (state == DriverState::ready) {
    const DriverInfo& info = driver_info();
    std::snprintf(line, sizeof line, "mnemosyne: driver %.300s, CUDA %d.%d, %d device(s)",
                  info.path, info.version / 1000, (info.version % 1000) / 10, info.device_count);
  } else if (state == DriverState::unavailable) {
    std::snprintf(line, sizeof line, "mnemosyne: driver unavailable: %.700s", driver_info().reason);
  } else {
    std::snprintf(line, sizeof line, "mnemosyne: driver not loaded (the %s backend needs none)",
                  backend_name(o.backend));
  }
  warn(line);
  std::snprintf(line, sizeof line, "mnemosyne: heap on %s%s%.300s", backend_name(report.active),
                report.reason[0] ? ": " : "", report.reason);
  warn(line);
}

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
  return ctx;
}

}  // namespace mnemosyne
