#include "stats/report.hpp"

#include <cstdarg>
#include <cstdint>
#include <cstdio>

#include "arena/arena.hpp"
#include "backend/counters.hpp"
#include "platform/platform.hpp"
#include "stats/counters.hpp"

namespace mnemosyne::stats {
namespace {

// Appends formatted text to a fixed buffer, remembering the full length.
class Writer {
 public:
  Writer(char* buf, std::size_t len) noexcept : buf_(buf), len_(len) {
    if (len_ > 0) buf_[0] = '\0';
  }
  MNEMOSYNE_PRINTF(2, 3) void put(const char* fmt, ...) noexcept {
    va_list args;
    va_start(args, fmt);
    const std::size_t room = used_ < len_ ? len_ - used_ : 0;
    const int n = std::vsnprintf(room > 0 ? buf_ + used_ : nullptr, room, fmt, args);
    va_end(args);
    if (n > 0) used_ += static_cast<std::size_t>(n);
  }
  // A JSON string body: quotes, backslashes and control characters escaped.
  void json_string(const char* s) noexcept {
    put("\"");
    for (; *s != '\0'; ++s) {
      const auto c = static_cast<unsigned char>(*s);
      if (c == '"' || c == '\\') {
        put("\\%c", c);
      } else if (c < 0x20) {
        put("\\u%04x", c);
      } else {
        put("%c", c);
      }
    }
    put("\"");
  }
  std::size_t used() const noexcept { return used_; }

 private:
  char* buf_;
  std::size_t len_;
  std::size_t used_ = 0;
};

// Every pool worth reporting: the system allocator always, a backend when it
// served, reserved or called anything, or was the one asked for.
}  // namespace

Snapshot take_snapshot(const ReportContext& ctx) noexcept {
  Snapshot snap;
  PoolTotals counts[kPools];
  totals(counts);
  arena::stats(&snap.arena);
  const arena::Stats& a = snap.arena;
  Pool* pools = snap.pools;
  int n = 0;
  for (int i = 1; i < kPools; ++i) {
    const auto id = static_cast<BackendId>(i);
    const BackendCounters& c = backend_counters(id);
    Pool p{backend_name(id),
           counts[i],
           c.allocations.load(std::memory_order_relaxed),
           a.bytes_reserved[i],
           c.bytes_live.load(std::memory_order_relaxed),
           c.bytes_live_peak.load(std::memory_order_relaxed),
           c.driver_calls.load(std::memory_order_relaxed),
           c.driver_failures.load(std::memory_order_relaxed),
           static_cast<double>(c.driver_ns.load(std::memory_order_relaxed)) / 1e6,
           c.advice_failures.load(std::memory_order_relaxed)};
    if (id == ctx.requested || p.counts.allocations != 0 || p.reserved != 0 ||
        p.driver_calls != 0) {
      pools[n++] = p;
    }
  }
  // Frees of system blocks whose allocation was never counted and that were
  // not remembered (past the table, or allocated inside the runtime out of
  // mnemosyne's sight) would show as negative live bytes: counted apart.
  snap.earlier = earlier_frees();
  PoolTotals system = counts[kSystemPool];
  if (system.bytes_live < 0) {
    snap.earlier.bytes += static_cast<std::uint64_t>(-system.bytes_live);
    system.bytes_live = 0;
  }
  pools[n++] = Pool{"system", system, 0, 0, 0, 0, 0, 0, 0.0, 0};
  snap.count = n;
  return snap;
}

std::size_t format_json(const ReportContext& ctx, char* buf, std::size_t len) noexcept {
  return format_json(ctx, take_snapshot(ctx), buf, len);
}

std::size_t format_table(const ReportContext& ctx, char* buf, std::size_t len) noexcept {
  return format_table(ctx, take_snapshot(ctx), buf, len);
}

std::size_t format_json(const ReportContext& ctx, const Snapshot& snap, char* buf,
                        std::size_t len) noexcept {
  const arena::Stats& a = snap.arena;
  Writer w(buf, len);
  w.put("{\n  \"schema\": \"mnemosyne-stats/1\",\n  \"pid\": %ld,\n  \"program\": ", ctx.pid);
  w.json_string(ctx.program);
  w.put(",\n  \"requested_backend\": \"%s\",\n  \"active_backend\": \"%s\",\n",
        backend_name(ctx.requested), backend_name(arena::active_backend()));
  w.put("  \"forked_child\": %s,\n", snap.arena.forked_child ? "true" : "false");
  w.put("  \"device\": %d,\n  \"counting\": %s,\n", ctx.device, ctx.counting ? "true" : "false");
  w.put("  \"size_range\": {\"min\": %zu, \"max\": %zu},\n", ctx.size_min, ctx.size_max);
  w.put("  \"limit\": %zu,\n  \"fallback\": \"%s\",\n  \"backend_unavailable\": ", ctx.limit,
        ctx.fallback);
  w.json_string(ctx.unavailable);
  w.put(",\n  \"pools\": {\n");
  for (int i = 0; i < snap.count; ++i) {
    const Pool& p = snap.pools[i];
    w.put("    \"%s\": {\n", p.name);
    w.put("      \"allocations\": %llu, \"frees\": %llu,\n",
          static_cast<unsigned long long>(p.counts.allocations),
          static_cast<unsigned long long>(p.counts.frees));
    w.put("      \"bytes_requested\": %llu, \"bytes_live\": %lld, \"bytes_peak\": %llu,\n",
          static_cast<unsigned long long>(p.counts.bytes_requested),
          static_cast<long long>(p.counts.bytes_live),
          static_cast<unsigned long long>(p.counts.bytes_peak));
    w.put(
        "      \"segments\": %llu, \"bytes_reserved\": %llu, \"bytes_backed\": %llu, "
        "\"bytes_backed_peak\": %llu,\n",
        static_cast<unsigned long long>(p.segments), static_cast<unsigned long long>(p.reserved),
        static_cast<unsigned long long>(p.backed), static_cast<unsigned long long>(p.backed_peak));
    w.put("      \"driver_calls\": %llu, \"driver_failures\": %llu, \"driver_ms\": %.3f,\n",
          static_cast<unsigned long long>(p.driver_calls),
          static_cast<unsigned long long>(p.driver_failures), p.driver_ms);
    w.put("      \"advice_failures\": %llu\n    }%s\n",
          static_cast<unsigned long long>(p.advice_failures), i + 1 < snap.count ? "," : "");
  }
  w.put("  },\n  \"fallbacks\": {\"count\": %llu, \"reason\": ",
        static_cast<unsigned long long>(a.host_fallbacks));
  w.json_string(arena::fallback_reason());
  w.put("},\n  \"earlier_frees\": {\"count\": %llu, \"bytes\": %llu},\n",
        static_cast<unsigned long long>(snap.earlier.count),
        static_cast<unsigned long long>(snap.earlier.bytes));
  w.put(
      "  \"driver_allocations\": %llu,\n  \"fork_bytes_copied\": %llu,\n"
      "  \"fork_bytes_via_driver\": %llu,\n  \"fork_copy_workers\": %llu\n}\n",
      static_cast<unsigned long long>(a.driver_allocations),
      static_cast<unsigned long long>(a.fork_bytes_copied),
      static_cast<unsigned long long>(a.fork_bytes_via_driver),
      static_cast<unsigned long long>(a.fork_copy_workers));
  return w.used();
}

std::size_t format_table(const ReportContext& ctx, const Snapshot& snap, char* buf,
                         std::size_t len) noexcept {
  const arena::Stats& a = snap.arena;
  Writer w(buf, len);
  w.put("mnemosyne: pid %ld (%s), backend %s (active %s), device %d\n", ctx.pid, ctx.program,
        backend_name(ctx.requested), backend_name(arena::active_backend()), ctx.device);
  if (ctx.unavailable[0] != '\0') {
    w.put("mnemosyne: the %s backend was unavailable: %s\n", backend_name(ctx.requested),
          ctx.unavailable);
  }
  // "memory" is what the backend holds (backed: registered or allocated
  // from the driver), now and at its peak; "reserved VA" is address space,
  // most of it never backed: a pool reserves far more than it uses.
  w.put("mnemosyne: %-8s %12s %12s %14s %14s %14s %5s %14s %14s %14s %7s %10s\n", "pool", "allocs",
        "frees", "requested", "live", "peak", "segs", "memory", "memory peak", "reserved VA",
        "calls", "driver ms");
  for (int i = 0; i < snap.count; ++i) {
    const Pool& p = snap.pools[i];
    if (ctx.counting) {
      w.put("mnemosyne: %-8s %12llu %12llu %14llu %14lld %14llu", p.name,
            static_cast<unsigned long long>(p.counts.allocations),
            static_cast<unsigned long long>(p.counts.frees),
            static_cast<unsigned long long>(p.counts.bytes_requested),
            static_cast<long long>(p.counts.bytes_live),
            static_cast<unsigned long long>(p.counts.bytes_peak));
    } else {
      w.put("mnemosyne: %-8s %12s %12s %14s %14s %14s", p.name, "-", "-", "-", "-", "-");
    }
    w.put(" %5llu %14llu %14llu %14llu %7llu %10.3f\n", static_cast<unsigned long long>(p.segments),
          static_cast<unsigned long long>(p.backed), static_cast<unsigned long long>(p.backed_peak),
          static_cast<unsigned long long>(p.reserved),
          static_cast<unsigned long long>(p.driver_calls), p.driver_ms);
  }
  if (a.host_fallbacks != 0) {
    w.put("mnemosyne: %llu requests fell back to the system allocator: %s\n",
          static_cast<unsigned long long>(a.host_fallbacks), arena::fallback_reason());
  }
  if (snap.earlier.count != 0 || snap.earlier.bytes != 0) {
    w.put(
        "mnemosyne: %llu frees (%llu bytes) of blocks the system allocator handed out before "
        "mnemosyne started, not counted in its pool\n",
        static_cast<unsigned long long>(snap.earlier.count),
        static_cast<unsigned long long>(snap.earlier.bytes));
  }
  return w.used();
}

}  // namespace mnemosyne::stats
