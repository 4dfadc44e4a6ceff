// The statistics report: JSON (docs/stats-schema.md, "mnemosyne-stats/1")
// and a short human table. Formatting writes into a caller's buffer and
// never allocates, so it can run at exit or inside a signal-free context of
// the allocator itself.
#pragma once

#include <cstddef>
#include <cstdint>

#include "arena/arena.hpp"
#include "backend/backend_id.hpp"
#include "stats/counters.hpp"
#include "stats/earlier.hpp"

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
  const char* unavailable = "";  // why the requested backend is not active ("" when it is)
};

// One pool's figures: counts (when counting) and the backend's own.
struct Pool {
  const char* name;
  PoolTotals counts;
  std::uint64_t segments;
  std::uint64_t reserved;
  std::uint64_t backed;       // the backend's memory held now (registered, allocated)
  std::uint64_t backed_peak;  // the most of it held at once
  std::uint64_t driver_calls;
  std::uint64_t driver_failures;
  double driver_ms;
  std::uint64_t advice_failures;
};

// Every figure of a report, read at one moment: the table and the JSON file
// written at exit come from one snapshot, so they agree even while other
// threads (the driver's) still allocate.
struct Snapshot {
  Pool pools[kPools];
  int count = 0;
  arena::Stats arena;
  EarlierFrees earlier;  // bytes include what the system pool's live bytes fell below zero by
};
Snapshot take_snapshot(const ReportContext& ctx) noexcept;

// Return the length the full text needs (like snprintf); the text is
// truncated, and still NUL-terminated, when that is >= len. Without a
// snapshot, each takes its own.
std::size_t format_json(const ReportContext& ctx, const Snapshot& snap, char* buf,
                        std::size_t len) noexcept;
std::size_t format_table(const ReportContext& ctx, const Snapshot& snap, char* buf,
                         std::size_t len) noexcept;
std::size_t format_json(const ReportContext& ctx, char* buf, std::size_t len) noexcept;
std::size_t format_table(const ReportContext& ctx, char* buf, std::size_t len) noexcept;

}  // namespace mnemosyne::stats
