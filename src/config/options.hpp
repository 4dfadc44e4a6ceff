// mnemosyne's options: one table of name, type, default and description
// (mimalloc's options.c idea), read once from MNEMOSYNE_<NAME> variables.
//
// Reading never allocates (it runs inside malloc's start-up) and never
// fails: an invalid value or an unknown MNEMOSYNE_ name gets one warning
// line naming the variable, the value and the default used.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/backend_id.hpp"

namespace mnemosyne::config {

enum class Fallback : std::uint8_t { host, fail };
enum class Context : std::uint8_t { primary, own };
enum class Zeroed : std::uint8_t { automatic, yes, no };
enum class Pin : std::uint8_t { arena, granule, vmm };

// PIN's default. Linux: only the granules in use, from the driver's
// virtual-memory API (run as a heap on an H200: scripts/gpu-check.sh); a
// driver without host memory there (before CUDA 12.2) gets arenas locked
// whole, as PIN=arena. Windows: arenas locked whole, the vmm route's host
// memory being untried there (the test double does not model it either).
#ifdef _WIN32
inline constexpr Pin kDefaultPin = Pin::arena;
#else
inline constexpr Pin kDefaultPin = Pin::vmm;
#endif

// FORK_KEEP_MS's default and its largest value (about 24.8 days).
inline constexpr std::uint32_t kDefaultForkKeepMs = 2000;
inline constexpr std::uint32_t kMaxForkKeepMs = 2147483647;
// FORK_PULL_MS's default and its largest value (a minute: the parent's
// forking thread waits that long at most, and the program's other threads'
// allocations with it).
inline constexpr std::uint32_t kDefaultForkPullMs = 0;
inline constexpr std::uint32_t kMaxForkPullMs = 60000;

struct Options {
  bool disable = false;                    // DISABLE
  BackendId backend = BackendId::unified;  // BACKEND
  int device = 0;                          // DEVICE (an ordinal)
  bool device_local_rank = false;          // DEVICE=local-rank
  int local_rank = -1;                     // the rank found, -1 when none
  bool size_routing = false;               // SIZE given
  std::size_t size_min = 0;                // SIZE=min[:max]
  std::size_t size_max = SIZE_MAX;
  std::size_t arena_size = std::size_t{64} << 20;   // ARENA_SIZE
  std::size_t limit = 0;                            // LIMIT, 0 = none
  Fallback fallback = Fallback::host;               // FALLBACK
  Context context = Context::primary;               // CONTEXT
  Zeroed zeroed = Zeroed::automatic;                // ZEROED
  Pin pin = kDefaultPin;                            // PIN
  std::uint32_t fork_keep_ms = kDefaultForkKeepMs;  // FORK_KEEP_MS
  std::uint32_t fork_pull_ms = kDefaultForkPullMs;  // FORK_PULL_MS
  bool verbose = false;                             // VERBOSE
  bool show_stats = false;                          // SHOW_STATS
  char stats_file[512] = {};                        // STATS_FILE ("" = none), %p not yet replaced
  char cuda_driver[512] = {};                       // CUDA_DRIVER ("" = default search)
  char programs[512] = {};                          // PROGRAMS ("" = every program)
  char exclude[512] = {};                           // EXCLUDE ("" = none); read_options sets
                                                    // the default, kDefaultExclude
  char warned[64] = {};                             // WARNED ("" = none)
};

// EXCLUDE's default: programs that need a single-threaded process, which the
// driver's threads (started in the constructor, before main) would break:
// user namespaces (unshare -U/-r, nsenter -U, bwrap, firejail, runc, crun,
// lxc-usernsexec) and per-thread credentials (setpriv keeps its capabilities
// on one thread while glibc changes the IDs of all: the others' setresgid
// fails and glibc aborts).
inline constexpr char kDefaultExclude[] =
    "unshare,nsenter,setpriv,bwrap,firejail,runc,crun,lxc-usernsexec";

// What PROGRAMS and EXCLUDE say of a process known by `names` (the names it
// was started by, see program_matches; null entries are skipped).
enum class Selection : std::uint8_t { moves, not_named, excluded };
Selection select_process(const Options& o, const char* const* names, std::size_t count,
                         bool windows) noexcept;

enum class Type : std::uint8_t {
  boolean,
  size,
  size_range,
  integer_or_word,
  milliseconds,  // a whole number of milliseconds
  choice,
  path,
  program_list,
  word,  // a short token written by mnemosyne itself (WARNED)
};

struct OptionInfo {
  const char* name;  // without the MNEMOSYNE_ prefix, upper case
  Type type;
  const char* default_text;  // as a user would write it
  const char* description;   // one sentence
  const char* example;       // e.g. "MNEMOSYNE_SIZE=1M:64M"
};

// The table, in documentation order.
const OptionInfo* option_table(std::size_t* count) noexcept;

// Reads MNEMOSYNE_* from `envp` (names match case-insensitively). `secure`
// is true in set-uid/set-gid processes (getauxval(AT_SECURE)): options that
// name a file or a library are then ignored with a warning. `warn` receives
// one line at a time, without a newline (nullptr: no warnings).
//
// *out is reset to the defaults first. local_rank is always filled (see
// local_rank()); device_local_rank is true only for DEVICE=local-rank with a
// rank found, and then the caller picks local_rank % device count (device
// stays 0). When an option appears more than once (in any case), the first
// entry counts and the others are ignored with a warning. Names starting
// with MNEMOSYNE_TEST_ are reserved for the project's tests and tools and
// never warn. envp may be nullptr; entries without '=' are skipped.
//
// Warning lines (names and values as written, each clipped to 80 characters),
// for example:
//   mnemosyne: MNEMOSYNE_LIMIT=12Q is not a size (like 4096, 64K, 256MiB, 1G);
//     using the default (0 = no limit)
//   mnemosyne: MNEMOSYNE_ARENA_SIZE=1M is below the minimum of 32MiB; using the
//     default (64MiB)
//   mnemosyne: MNEMOSYNE_DEVICE=local-rank but no launcher's local rank variable
//     is set to a rank (LOCAL_RANK, ...); using device 0 (the default)
//   mnemosyne: unknown option MNEMOSYNE_BAKEND=host (ignored); options are
//     BACKEND, DEVICE, ...
//   mnemosyne: MNEMOSYNE_STATS_FILE is ignored in a set-uid/set-gid program
//   mnemosyne: mnemosyne_backend=host is ignored: MNEMOSYNE_BACKEND is set more
//     than once (the first one counts)
// (each on one line).
void read_options(char* const* envp, bool secure, Options* out,
                  void (*warn)(const char* line)) noexcept;

// The parsers, exposed for tests. Each returns false on malformed input and
// leaves *out untouched then.
bool parse_bool(const char* text, bool* out) noexcept;  // 1/0 true/false yes/no on/off, "" = on
bool parse_size(const char* text, std::size_t* out) noexcept;  // 4096, 64K, 256MiB, 1g, 2TB
bool parse_size_range(const char* text, std::size_t* min, std::size_t* max) noexcept;  // min[:max]

// PROGRAMS: a comma-separated list of names or globs ('*' any run of
// characters, '?' any one, '[a-z]', '[!x]' a set), no item empty, no blank.
bool parse_program_list(const char* text) noexcept;

// True when an item of `list` (well-formed, see parse_program_list) matches
// `name`, one of the names a process was started by: an item without a path
// separator is matched against name's last component, an item with one
// against all of name. `windows`: '\\' also separates and ASCII case is
// ignored. False for an empty name.
bool program_matches(const char* list, const char* name, bool windows) noexcept;

// The local rank from the usual MPI/Slurm variables of `envp` (names matched
// exactly), in the order OMPI_COMM_WORLD_LOCAL_RANK, MV2_COMM_WORLD_LOCAL_RANK,
// MPI_LOCALRANKID, PMI_LOCAL_RANK, SLURM_LOCALID: the first that holds a
// plain non-negative decimal int wins; -1 when none does. No PMIX_ variable
// is read: PMIx's local rank is a key (PMIX_LOCAL_RANK) queried through the
// PMIx library, not a variable known to be exported, and PMIX_RANK is the
// global rank; Open MPI's mpirun exports OMPI_COMM_WORLD_LOCAL_RANK over PMIx.
int local_rank(char* const* envp) noexcept;

// Expands a STATS_FILE pattern into out (size out_len): %p becomes `pid`,
// %% a '%', anything else (a lone '%' too) is copied as is. False when the
// result does not fit (or pattern is nullptr); out is then "" (if out_len > 0).
bool expand_stats_path(const char* pattern, long pid, char* out, std::size_t out_len) noexcept;

}  // namespace mnemosyne::config
