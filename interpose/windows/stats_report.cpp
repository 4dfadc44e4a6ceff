#include "stats_report.hpp"

#include <windows.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/exit_report.hpp"
#include "mode.hpp"
#include "platform/platform.hpp"
#include "start.hpp"
#include "stats/report.hpp"

namespace mnemosyne::win {
namespace {

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

bool write_file(const char* path, const char* text, std::size_t len, char* why,
                std::size_t why_len) {
  HANDLE f =
      CreateFileA(path, GENERIC_WRITE, 0, nullptr, CREATE_ALWAYS, FILE_ATTRIBUTE_NORMAL, nullptr);
  if (f == INVALID_HANDLE_VALUE) {
    std::snprintf(why, why_len, "error %lu", GetLastError());
    return false;
  }
  write_all(f, text, len);
  CloseHandle(f);
  return true;
}

void report_at_exit() {
  const ReportSinks sinks{[](const char* text, std::size_t len) {
                            write_all(GetStdHandle(STD_ERROR_HANDLE), text, len);
                          },
                          &write_file, &warn_line};
  write_exit_reports(start_options(), context(), sinks);
}

}  // namespace

void install_exit_report() noexcept {
  std::atexit(&report_at_exit);
}

std::size_t stats_json(char* buf, std::size_t len) noexcept {
  return stats::format_json(context(), buf, len);
}

}  // namespace mnemosyne::win
