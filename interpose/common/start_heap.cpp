#include "start_heap.hpp"

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "backend/backends.hpp"
#include "backend/loader.hpp"
#include "platform/platform.hpp"

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
                "FALLBACK=%s CONTEXT=%s ZEROED=%s PIN=%s FORK_KEEP_MS=%u FORK_PULL_MS=%u",
                backend_name(o.backend), device, o.device_local_rank ? " (local-rank)" : "",
                o.size_min, o.size_max, o.size_routing ? "" : " (all sizes)", o.arena_size, o.limit,
                o.limit == 0 ? " (none)" : "",
                o.fallback == config::Fallback::fail ? "fail" : "host",
                o.context == config::Context::own ? "own" : "primary",
                o.zeroed == config::Zeroed::yes  ? "yes"
                : o.zeroed == config::Zeroed::no ? "no"
                                                 : "auto",
                o.pin == config::Pin::granule ? "granule"
                : o.pin == config::Pin::vmm   ? "vmm"
                                              : "arena",
                static_cast<unsigned>(o.fork_keep_ms), static_cast<unsigned>(o.fork_pull_ms));
  warn(line);
  std::snprintf(line, sizeof line,
                "mnemosyne: SHOW_STATS=%d STATS_FILE=%.200s CUDA_DRIVER=%.200s PROGRAMS=%.200s "
                "DISABLE=0 VERBOSE=1",
                o.show_stats ? 1 : 0, o.stats_file[0] ? o.stats_file : "(none)",
                o.cuda_driver[0] ? o.cuda_driver : "(default search)",
                o.programs[0] ? o.programs : "(every program)");
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
  char why[300];
  const bool zero = fresh_memory_reads_zero(o, report.active, why, sizeof why);
  // Who clears what must be zero (calloc, mimalloc's metadata): the device
  // for managed memory (Backend::clear), the CPU otherwise.
  const bool managed = is_managed_backend(report.active);
  std::snprintf(line, sizeof line, "mnemosyne: fresh %s memory reads zero: %s (%s)%s",
                backend_name(report.active), zero ? "yes" : "no", why,
                zero      ? ""
                : managed ? "; mnemosyne clears what must be zero, large blocks on the device"
                          : "; mnemosyne clears what must be zero");
  warn(line);
}

bool fresh_memory_reads_zero(const config::Options& o, BackendId backend, char* why,
                             std::size_t len) noexcept {
  // The answer is the arena's (MNEMOSYNE_ZEROED, else the backend's); the
  // evidence is said here.
  if (o.zeroed != config::Zeroed::automatic) {
    std::snprintf(why, len, "MNEMOSYNE_ZEROED=%s", o.zeroed == config::Zeroed::yes ? "yes" : "no");
  } else if (const BackendRow* row = backend_row(backend); row && row->zero_evidence) {
    std::snprintf(why, len, "%s", row->zero_evidence);
  } else {  // pinned: the nvidia module's setting
    Os::nvidia_zeroes_pinned_memory(why, len);
  }
  return arena::fresh_memory_reads_zero(backend);
}

namespace {

// Why the requested backend is not active, for the statistics of every
// process (the warning itself is printed once per tree).
constinit char g_unavailable[arena::kReasonLen] = {};

// The warning's key: the backend, and a digest (32-bit FNV-1a) of the
// reason: the same line, printed by another process of the tree, has the
// same key.
void warning_key(BackendId backend, const char* reason, char* key, std::size_t len) noexcept {
  std::uint32_t h = 2166136261u;
  for (const char* p = reason; *p != '\0'; ++p) {
    h ^= static_cast<unsigned char>(*p);
    h *= 16777619u;
  }
  std::snprintf(key, len, "%s:%08x", backend_name(backend), static_cast<unsigned>(h));
}

}  // namespace

const char* backend_unavailable_reason() noexcept {
  return g_unavailable;
}

bool start_heap(const config::Options& o, const StartPlatform& platform) noexcept {
  set_driver_path(o.cuda_driver);
  const int device = choose_device(o);
  set_device_ordinal(device);
  set_own_context(o.context == config::Context::own);

  arena::Config cfg;
  cfg.backend = o.backend;
  cfg.first_segment = o.arena_size;
  cfg.limit = o.limit;
  cfg.fallback =
      o.fallback == config::Fallback::fail ? arena::Fallback::fail : arena::Fallback::host;
  cfg.zeroed = o.zeroed == config::Zeroed::yes  ? arena::Zeroed::yes
               : o.zeroed == config::Zeroed::no ? arena::Zeroed::no
                                                : arena::Zeroed::automatic;
  cfg.pin = o.pin == config::Pin::vmm       ? PinnedCommit::vmm
            : o.pin == config::Pin::granule ? PinnedCommit::registration
                                            : PinnedCommit::whole;
  cfg.fork_keep_ns = std::uint64_t{o.fork_keep_ms} * 1'000'000;
  cfg.fork_pull_ms = o.fork_pull_ms;
  cfg.host = platform.host;
  cfg.warn = platform.warn;

  arena::StartReport report;
  char line[1200];
  if (!arena::start(cfg, &report)) {
    std::snprintf(line, sizeof line,
                  "mnemosyne: no memory for the heap (%.300s); %s serves this process",
                  report.reason, platform.system);
    platform.warn(line);
    return false;
  }
  if (report.reason[0] != '\0') {
    std::snprintf(g_unavailable, sizeof g_unavailable, "%s", report.reason);
    char key[sizeof o.warned];
    warning_key(report.requested, report.reason, key, sizeof key);
    if (std::strcmp(key, o.warned) != 0) {
      std::snprintf(line, sizeof line, "mnemosyne: the %s backend is unavailable (%.700s); %s",
                    backend_name(report.requested), report.reason,
                    report.active == BackendId::host
                        ? "the heap uses host memory"
                        : "allocations fail (MNEMOSYNE_FALLBACK=fail)");
      platform.warn(line);
      platform.mark_warned(key);
    }
  }
  if (o.verbose) print_verbose(o, report, device, platform.pid, platform.flavour, platform.warn);
  return true;
}

}  // namespace mnemosyne
