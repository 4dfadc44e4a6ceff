// The option table and read_options(): one pass over envp, each MNEMOSYNE_
// entry looked up in the table by name (case-insensitively), parsed by its
// type, and either stored or reported in one warning line.
#include <cstdarg>
#include <cstdint>
#include <cstdio>

#include "config/internal.hpp"
#include "config/options.hpp"
#include "platform/platform.hpp"

namespace mnemosyne::config {
namespace {

using detail::equals_ci;

// Rows of the table; the enumerators name positions, the table names options.
enum Row : std::size_t {
  kBackend,
  kDevice,
  kSize,
  kArenaSize,
  kLimit,
  kFallback,
  kContext,
  kZeroed,
  kPin,
  kForkKeepMs,
  kForkPullMs,
  kVerbose,
  kShowStats,
  kStatsFile,
  kCudaDriver,
  kPrograms,
  kExclude,
  kWarned,
  kDisable,
  kRowCount
};

// PIN's values as a user writes them; the table's default text is
// kDefaultPin's (options.hpp), which differs by platform.
constexpr const char* pin_name(Pin pin) {
  switch (pin) {
    case Pin::arena:
      return "arena";
    case Pin::granule:
      return "granule";
    case Pin::vmm:
      return "vmm";
  }
  return "";
}

constexpr OptionInfo kTable[kRowCount] = {
    {"BACKEND", Type::choice, "unified",
     "Memory the heap comes from: unified (managed memory), device (managed memory preferring "
     "DEVICE), hbm or gddr (as device, as separate pools), pinned (page-locked host memory "
     "mapped into the device) or host (anonymous mmap, no driver).",
     "MNEMOSYNE_BACKEND=pinned"},
    {"DEVICE", Type::integer_or_word, "0",
     "Device ordinal (0 to 1023) the CUDA backends allocate on and advise for, or local-rank "
     "for the rank's index on its node (from OMPI_COMM_WORLD_LOCAL_RANK, "
     "MV2_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, PMI_LOCAL_RANK or SLURM_LOCALID) modulo the "
     "device count.",
     "MNEMOSYNE_DEVICE=local-rank"},
    {"SIZE", Type::size_range, "all sizes",
     "Only allocations whose size lies in min[:max] (inclusive; 4K is min only, :1G max only) "
     "come from the backend, the others from host memory.",
     "MNEMOSYNE_SIZE=1M:64M"},
    {"ARENA_SIZE", Type::size, "64MiB",
     "Size of the first arena reserved from the backend, at least 32MiB.",
     "MNEMOSYNE_ARENA_SIZE=256MiB"},
    {"LIMIT", Type::size, "0 = no limit", "Cap on the bytes taken from the backend (0 = no limit).",
     "MNEMOSYNE_LIMIT=8G"},
    {"FALLBACK", Type::choice, "host",
     "What a request the backend cannot serve gets: host (memory from the system allocator) or "
     "fail (the allocation fails).",
     "MNEMOSYNE_FALLBACK=fail"},
    {"CONTEXT", Type::choice, "primary",
     "The CUDA context the heap is allocated in: primary (the device's primary context, shared "
     "with the CUDA runtime; cudaDeviceReset frees the heap with it) or own (one context of "
     "mnemosyne's, which a reset leaves alone, at the device memory of one more context; needs "
     "a CUDA 12.5 driver).",
     "MNEMOSYNE_CONTEXT=own"},
    {"ZEROED", Type::choice, "auto",
     "Whether memory fresh from the backend reads zero: auto (host: yes; pinned: what the "
     "nvidia module's InitializeSystemMemoryAllocations says, no when it cannot be read; "
     "managed: no, as the driver documents), yes or no. Where it is not zero, mnemosyne clears "
     "what must be zero itself; yes on a driver that does not zero crashes the process.",
     "MNEMOSYNE_ZEROED=no"},
    {"PIN", Type::choice, pin_name(kDefaultPin),
     "What the pinned backend page-locks: vmm (only the granules in use, 2 MiB on current "
     "GPUs, host memory of the driver's virtual-memory API, given back when unused; the driver "
     "copies any block; needs a CUDA 12.2 driver, else as arena), arena (each arena whole, as "
     "cuMemHostAlloc does: the driver copies any block with cuMemcpy) or granule (only the 1 MiB "
     "granules in use, registered with cuMemHostRegister, given back when unused; kernels reach "
     "every block, but the driver refuses cuMemcpy of a block that spans two granules, "
     "CUDA_ERROR_INVALID_VALUE).",
     "MNEMOSYNE_PIN=arena"},
    {"FORK_KEEP_MS", Type::milliseconds, "2000",
     "Linux, CUDA backends: how long the copy of the heap a fork made is kept after the last "
     "fork, for a later fork to share (it then writes only the pages that changed) at the cost "
     "of that copy held in memory (shared memory, up to the live heap); 0 keeps none, and every "
     "fork copies the whole heap.",
     "MNEMOSYNE_FORK_KEEP_MS=120000"},
    {"FORK_PULL_MS", Type::milliseconds, "0",
     "Linux, CUDA backends, where this user may use userfaultfd (root, CAP_SYS_PTRACE, "
     "vm.unprivileged_userfaultfd=1 or a usable /dev/userfaultfd): how long a forked child may "
     "take its parent's heap page by page, as it touches it, before the parent copies the rest; "
     "a child that runs a command or exits within it copies only the pages it touched. Only in a "
     "process with no thread of its own besides the forking one. 0: every fork copies the heap "
     "before fork() returns.",
     "MNEMOSYNE_FORK_PULL_MS=100"},
    {"VERBOSE", Type::boolean, "off",
     "Print every effective option and the backend's state on stderr at start.",
     "MNEMOSYNE_VERBOSE=1"},
    {"SHOW_STATS", Type::boolean, "off", "Print a summary of the backend's use on stderr at exit.",
     "MNEMOSYNE_SHOW_STATS=1"},
    {"STATS_FILE", Type::path, "none",
     "Write the statistics as JSON to this file at exit (%p becomes the process id, %% a "
     "percent sign); ignored in set-uid/set-gid programs.",
     "MNEMOSYNE_STATS_FILE=/tmp/mnemosyne.%p.json"},
    {"CUDA_DRIVER", Type::path, "libcuda.so.1, then libcuda.so",
     "Path of the CUDA driver library to open; ignored in set-uid/set-gid programs.",
     "MNEMOSYNE_CUDA_DRIVER=/usr/lib/x86_64-linux-gnu/libcuda.so.1"},
    {"PROGRAMS", Type::program_list, "every program",
     "Only processes whose program matches one of these comma-separated names or globs (*, ?, "
     "[a-z]) move their heap; the others of the process tree keep the system allocator and never "
     "load the driver. Matched against the executable's file name (after symlinks), the file "
     "the process was started as (a #! script's own path) and argv[0]; an item with a / against "
     "the whole path.",
     "MNEMOSYNE_PROGRAMS=python3*,train.py"},
    {"EXCLUDE", Type::program_list, kDefaultExclude,
     "Processes whose program matches one of these names or globs keep the system allocator and "
     "never load the driver, whatever PROGRAMS says; empty for none. The default names programs "
     "that need a single-threaded process (user namespaces, per-thread credentials), which the "
     "driver's threads would make fail.",
     "MNEMOSYNE_EXCLUDE=unshare,nsenter,setpriv,my-sandbox"},
    {"WARNED", Type::word, "none",
     "Set by mnemosyne for the rest of a process tree once a process of it printed why the "
     "backend is unavailable: that line's key (the backend and a digest of the reason). A process "
     "whose line has the same key prints nothing; its statistics still give the reason.",
     "MNEMOSYNE_WARNED=unified:3c9d2f1a"},
    {"DISABLE", Type::boolean, "off", "Pass every allocation straight to the system allocator.",
     "MNEMOSYNE_DISABLE=1"},
};

// The rows must be where the enumerators say (a compile-time check only;
// lookups go through the table's names).
constexpr bool row_is(Row row, const char* name) {
  return equals_ci(kTable[row].name, detail::length(kTable[row].name), name);
}
static_assert(row_is(kBackend, "BACKEND") && row_is(kDevice, "DEVICE") && row_is(kSize, "SIZE") &&
              row_is(kArenaSize, "ARENA_SIZE") && row_is(kLimit, "LIMIT") &&
              row_is(kFallback, "FALLBACK") && row_is(kContext, "CONTEXT") &&
              row_is(kZeroed, "ZEROED") && row_is(kPin, "PIN") &&
              row_is(kForkKeepMs, "FORK_KEEP_MS") && row_is(kForkPullMs, "FORK_PULL_MS") &&
              row_is(kVerbose, "VERBOSE") && row_is(kShowStats, "SHOW_STATS") &&
              row_is(kStatsFile, "STATS_FILE") && row_is(kCudaDriver, "CUDA_DRIVER") &&
              row_is(kPrograms, "PROGRAMS") && row_is(kExclude, "EXCLUDE") &&
              row_is(kWarned, "WARNED") && row_is(kDisable, "DISABLE"));

constexpr char kPrefix[] = "MNEMOSYNE_";
constexpr std::size_t kPrefixLen = sizeof kPrefix - 1;
constexpr char kReservedPrefix[] = "MNEMOSYNE_TEST_";  // the project's tests and tools
constexpr std::size_t kMinArenaSize = std::size_t{32} << 20;
constexpr int kMaxDevice = 1023;
constexpr int kShown = 80;  // most characters of a name or value a warning shows

// Writes the names of `items` (name_of(item)), separated by ", ", into
// out[0, size); stops before an item that does not fit.
template <typename Items, typename NameOf>
void join(char* out, std::size_t size, const Items& items, NameOf name_of) noexcept {
  std::size_t used = 0;
  out[0] = '\0';
  for (const auto& item : items) {
    const int n = std::snprintf(out + used, size - used, "%s%s", used ? ", " : "", name_of(item));
    if (n < 0 || static_cast<std::size_t>(n) >= size - used) {
      out[used] = '\0';
      return;
    }
    used += static_cast<std::size_t>(n);
  }
}

// One MNEMOSYNE_ entry of envp.
struct Entry {
  const char* name;  // the whole name as written, prefix included
  int name_len;      // clipped to kShown
  const char* value;
  int value_len;        // clipped to kShown
  const char* clipped;  // "..." when the value was clipped, else ""
};

class Reader {
 public:
  Reader(bool secure, Options* out, void (*warn)(const char*)) noexcept
      : secure_(secure), out_(out), warn_(warn) {}

  void read(char* const* envp) noexcept;

 private:
  void entry(const char* text) noexcept;
  void apply(Row row, const Entry& e) noexcept;
  void invalid(Row row, const Entry& e, const char* what) noexcept;
  // A choice: `dest` takes the value of the first of `names` the entry's
  // value matches (case-insensitively); otherwise one warning naming
  // `expected`, and `dest` keeps its default.
  template <typename T, std::size_t N>
  void choose(Row row, const Entry& e, const char* const (&names)[N], const T (&values)[N],
              const char* expected, T* dest) noexcept {
    const std::size_t len = detail::length(e.value);
    for (std::size_t i = 0; i < N; ++i) {
      if (equals_ci(e.value, len, names[i])) {
        *dest = values[i];
        return;
      }
    }
    invalid(row, e, expected);
  }
  void path(Row row, const Entry& e, char* dest, std::size_t dest_size) noexcept;
  void say(const char* format, ...) noexcept MNEMOSYNE_PRINTF(2, 3);

  bool secure_;
  Options* out_;
  void (*warn_)(const char*);
  char* const* envp_ = nullptr;
  bool seen_[kRowCount] = {};
};

void Reader::say(const char* format, ...) noexcept {
  if (warn_ == nullptr) return;
  char line[1024];
  std::va_list args;
  va_start(args, format);
  std::vsnprintf(line, sizeof line, format, args);
  va_end(args);
  warn_(line);
}

void Reader::read(char* const* envp) noexcept {
  envp_ = envp;
  if (envp == nullptr) return;
  for (char* const* p = envp; *p != nullptr; ++p) entry(*p);
}

void Reader::entry(const char* text) noexcept {
  if (!detail::starts_with_ci(text, kPrefix)) return;
  if (detail::starts_with_ci(text, kReservedPrefix)) return;
  std::size_t name_len = 0;
  while (text[name_len] != '\0' && text[name_len] != '=') ++name_len;
  if (text[name_len] != '=') return;  // not NAME=VALUE

  const char* value = text + name_len + 1;
  std::size_t value_len = 0;
  while (value_len <= static_cast<std::size_t>(kShown) && value[value_len] != '\0') ++value_len;
  Entry e;
  e.name = text;
  e.name_len = name_len > kShown ? kShown : static_cast<int>(name_len);
  e.value = value;
  e.value_len = value_len > kShown ? kShown : static_cast<int>(value_len);
  e.clipped = value_len > kShown ? "..." : "";

  const char* option = text + kPrefixLen;
  const std::size_t option_len = name_len - kPrefixLen;
  for (std::size_t row = 0; row < kRowCount; ++row) {
    if (!equals_ci(option, option_len, kTable[row].name)) continue;
    if (seen_[row]) {
      say("mnemosyne: %.*s=%.*s%s is ignored: MNEMOSYNE_%s is set more than once (the first "
          "one counts)",
          e.name_len, e.name, e.value_len, e.value, e.clipped, kTable[row].name);
      return;
    }
    seen_[row] = true;
    apply(static_cast<Row>(row), e);
    return;
  }

  char names[256];
  join(names, sizeof names, kTable, [](const OptionInfo& info) { return info.name; });
  say("mnemosyne: unknown option %.*s=%.*s%s (ignored); options are %s", e.name_len, e.name,
      e.value_len, e.value, e.clipped, names);
}

void Reader::invalid(Row row, const Entry& e, const char* what) noexcept {
  say("mnemosyne: %.*s=%.*s%s is not %s; using the default (%s)", e.name_len, e.name, e.value_len,
      e.value, e.clipped, what, kTable[row].default_text);
}

void Reader::path(Row row, const Entry& e, char* dest, std::size_t dest_size) noexcept {
  if (secure_) {
    say("mnemosyne: %.*s is ignored in a set-uid/set-gid program", e.name_len, e.name);
    return;
  }
  const std::size_t len = detail::length(e.value);
  if (len >= dest_size) {
    say("mnemosyne: %.*s=%.*s%s is longer than %zu bytes; using the default (%s)", e.name_len,
        e.name, e.value_len, e.value, e.clipped, dest_size - 1, kTable[row].default_text);
    return;
  }
  for (std::size_t i = 0; i <= len; ++i) dest[i] = e.value[i];
}

void Reader::apply(Row row, const Entry& e) noexcept {
  Options& o = *out_;
  switch (row) {
    case kBackend: {
      char lower[16];
      const std::size_t len = detail::length(e.value);
      bool ok = len < sizeof lower;
      if (ok) {
        for (std::size_t i = 0; i < len; ++i) lower[i] = detail::ascii_lower(e.value[i]);
        BackendId id = BackendId::none;
        ok = parse_backend_name(std::string_view(lower, len), &id);
        if (ok) o.backend = id;
      }
      if (!ok) {
        char names[128];
        join(names, sizeof names, kBackends, [](const BackendRow& row) { return row.name; });
        char what[160];
        std::snprintf(what, sizeof what, "a backend (%s)", names);
        invalid(row, e, what);
      }
      return;
    }
    case kDevice: {
      const std::size_t len = detail::length(e.value);
      if (equals_ci(e.value, len, "local-rank")) {
        const int rank = local_rank(envp_);
        if (rank < 0) {
          char vars[256];
          join(vars, sizeof vars, detail::kLocalRankVariables, [](const char* v) { return v; });
          say("mnemosyne: %.*s=%.*s%s but no launcher's local rank variable is set to a rank "
              "(%s); using device 0 (the default)",
              e.name_len, e.name, e.value_len, e.value, e.clipped, vars);
          return;
        }
        o.device_local_rank = true;
        o.local_rank = rank;
        return;
      }
      std::uint64_t ordinal = 0;
      if (!detail::parse_decimal(e.value, len, kMaxDevice, &ordinal)) {
        invalid(row, e, "a device ordinal (0 to 1023) or local-rank");
        return;
      }
      o.device = static_cast<int>(ordinal);
      return;
    }
    case kSize: {
      if (!parse_size_range(e.value, &o.size_min, &o.size_max)) {
        invalid(row, e, "a size range (min[:max] with min <= max, like 1M:64M, 4K, :1G)");
        return;
      }
      o.size_routing = true;
      return;
    }
    case kArenaSize: {
      std::size_t size = 0;
      if (!parse_size(e.value, &size)) {
        invalid(row, e, "a size (like 4096, 64K, 256MiB, 1G)");
      } else if (size < kMinArenaSize) {
        say("mnemosyne: %.*s=%.*s%s is below the minimum of 32MiB; using the default (%s)",
            e.name_len, e.name, e.value_len, e.value, e.clipped, kTable[row].default_text);
      } else {
        o.arena_size = size;
      }
      return;
    }
    case kLimit:
      if (!parse_size(e.value, &o.limit)) invalid(row, e, "a size (like 4096, 64K, 256MiB, 1G)");
      return;
    case kFallback:
      choose(row, e, {"host", "fail"}, {Fallback::host, Fallback::fail}, "host or fail",
             &o.fallback);
      return;
    case kContext:
      choose(row, e, {"primary", "own"}, {Context::primary, Context::own}, "primary or own",
             &o.context);
      return;
    case kZeroed:
      choose(row, e, {"auto", "yes", "no"}, {Zeroed::automatic, Zeroed::yes, Zeroed::no},
             "auto, yes or no", &o.zeroed);
      return;
    case kPin:
      choose(row, e, {pin_name(Pin::arena), pin_name(Pin::granule), pin_name(Pin::vmm)},
             {Pin::arena, Pin::granule, Pin::vmm}, "arena, granule or vmm", &o.pin);
      return;
    case kForkKeepMs: {
      std::uint64_t ms = 0;
      if (!detail::parse_decimal(e.value, detail::length(e.value), kMaxForkKeepMs, &ms)) {
        invalid(row, e, "a whole number of milliseconds (0 to 2147483647)");
        return;
      }
      o.fork_keep_ms = static_cast<std::uint32_t>(ms);
      return;
    }
    case kForkPullMs: {
      std::uint64_t ms = 0;
      if (!detail::parse_decimal(e.value, detail::length(e.value), kMaxForkPullMs, &ms)) {
        invalid(row, e, "a whole number of milliseconds (0 to 60000)");
        return;
      }
      o.fork_pull_ms = static_cast<std::uint32_t>(ms);
      return;
    }
    case kVerbose:
    case kShowStats:
    case kDisable: {
      bool* dest = row == kVerbose ? &o.verbose : row == kShowStats ? &o.show_stats : &o.disable;
      if (!parse_bool(e.value, dest)) {
        invalid(row, e, "a boolean (1/0, true/false, yes/no, on/off)");
      }
      return;
    }
    case kStatsFile:
      path(row, e, o.stats_file, sizeof o.stats_file);
      return;
    case kCudaDriver:
      path(row, e, o.cuda_driver, sizeof o.cuda_driver);
      return;
    case kExclude:
      if (e.value[0] == '\0') {
        o.exclude[0] = '\0';
        return;
      }
      [[fallthrough]];
    case kPrograms: {
      char* dest = row == kExclude ? o.exclude : o.programs;
      const std::size_t len = detail::length(e.value);
      if (!parse_program_list(e.value)) {
        invalid(row, e,
                "a list of program names or globs (like python3,train*.py: comma-separated, no "
                "empty item, no blank, every [ closed)");
      } else if (len >= sizeof o.programs) {
        say("mnemosyne: %.*s=%.*s%s is longer than %zu bytes; using the default (%s)", e.name_len,
            e.name, e.value_len, e.value, e.clipped, sizeof o.programs - 1,
            kTable[row].default_text);
      } else {
        for (std::size_t i = 0; i <= len; ++i) dest[i] = e.value[i];
      }
      return;
    }
    case kWarned: {
      const std::size_t len = detail::length(e.value);
      if (len >= sizeof o.warned) {
        invalid(row, e, "a key as mnemosyne writes it (backend:digest)");
        return;
      }
      for (std::size_t i = 0; i <= len; ++i) o.warned[i] = e.value[i];
      return;
    }
    case kRowCount:
      break;
  }
}

}  // namespace

const OptionInfo* option_table(std::size_t* count) noexcept {
  if (count != nullptr) *count = kRowCount;
  return kTable;
}

void read_options(char* const* envp, bool secure, Options* out,
                  void (*warn)(const char* line)) noexcept {
  if (out == nullptr) return;
  *out = Options{};
  static_assert(sizeof kDefaultExclude <= sizeof out->exclude);
  for (std::size_t i = 0; i < sizeof kDefaultExclude; ++i) out->exclude[i] = kDefaultExclude[i];
  out->local_rank = local_rank(envp);
  Reader reader(secure, out, warn);
  reader.read(envp);
}

}  // namespace mnemosyne::config
