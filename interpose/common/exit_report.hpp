// The reports at exit (MNEMOSYNE_SHOW_STATS, MNEMOSYNE_STATS_FILE), the same
// way for the Linux preload library and the Windows DLL
// (interpose/linux/stats_report.cpp, interpose/windows/stats_report.cpp).
#pragma once

#include <cstddef>

#include "config/options.hpp"
#include "stats/report.hpp"

namespace mnemosyne {

// The statistics report's context for this process.
stats::ReportContext report_context(const config::Options& o, long pid, const char* program,
                                    bool counting) noexcept;

// Where the exit report goes, per platform.
struct ReportSinks {
  void (*to_stderr)(const char* text, std::size_t len);
  // Writes `text` as the whole file at `path`; false with the OS's reason.
  bool (*to_file)(const char* path, const char* text, std::size_t len, char* why,
                  std::size_t why_len);
  void (*warn)(const char* line);
};

// At exit: the SHOW_STATS table and the STATS_FILE JSON, both from one
// snapshot, so they agree while other threads (the driver's) still allocate.
// Only the exiting thread calls it: it formats into one static buffer.
void write_exit_reports(const config::Options& o, const stats::ReportContext& ctx,
                        const ReportSinks& sinks) noexcept;

}  // namespace mnemosyne
