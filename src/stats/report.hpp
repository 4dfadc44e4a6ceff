// The statistics report: JSON (docs/stats-schema.md, "mnemosyne-stats/1")
// and a short human table. Formatting writes into a caller's buffer and
// never allocates, so it can run at exit or inside a signal-free context of
// the allocator itself.
#pragma once

#include <cstddef>

#include "backend/backend_id.hpp"

namespace mnemosyne::stats {

struct ReportContext {
  long pid = 0;
  const char* program = "";
  BackendId requested = BackendId::none;
  int device = 0;
  bool counting = false;
  std::size_t size_min = 0;
  std::size_t size_max = 0;
  std::size_t limit = 0;
  const char* fallback = "host";
};

// Return the length the full text needs (like snprintf); the text is
// truncated, and still NUL-terminated, when that is >= len.
std::size_t format_json(const ReportContext& ctx, char* buf, std::size_t len) noexcept;
std::size_t format_table(const ReportContext& ctx, char* buf, std::size_t len) noexcept;

}  // namespace mnemosyne::stats
