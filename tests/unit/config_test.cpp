// src/config: the option table, the value parsers, read_options() (names,
// values, warnings, secure mode, no allocation), local_rank() and
// expand_stats_path().
#include <gtest/gtest.h>

#include <malloc.h>
#if defined(_WIN32)
#include <windows.h>
#endif

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "config/options.hpp"

// The allocation check replaces malloc and its relatives in this executable
// with counting forwarders to the C library's own (glibc's __libc_*; on
// Windows the C runtime DLL's). Sanitizer runtimes intercept malloc
// themselves, so there the check is skipped.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define CONFIG_TEST_COUNTS_MALLOC 0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer) || \
    __has_feature(memory_sanitizer)
#define CONFIG_TEST_COUNTS_MALLOC 0
#endif
#endif
#ifndef CONFIG_TEST_COUNTS_MALLOC
#define CONFIG_TEST_COUNTS_MALLOC 1
#endif

#if CONFIG_TEST_COUNTS_MALLOC && !defined(_WIN32)
namespace {
thread_local bool t_counting = false;
thread_local long t_allocations = 0;
inline void count_one() noexcept {
  if (t_counting) ++t_allocations;
}
void start_counting() noexcept {
  t_allocations = 0;
  t_counting = true;
}
long stop_counting() noexcept {
  t_counting = false;
  return t_allocations;
}
}  // namespace

extern "C" {
void* __libc_malloc(std::size_t size);
void* __libc_calloc(std::size_t n, std::size_t size);
void* __libc_realloc(void* p, std::size_t size);
void* __libc_memalign(std::size_t alignment, std::size_t size);
void* __libc_valloc(std::size_t size);
void __libc_free(void* p);

void* malloc(std::size_t size) noexcept {
  count_one();
  return __libc_malloc(size);
}
void* calloc(std::size_t n, std::size_t size) noexcept {
  count_one();
  return __libc_calloc(n, size);
}
void* realloc(void* p, std::size_t size) noexcept {
  count_one();
  return __libc_realloc(p, size);
}
void* memalign(std::size_t alignment, std::size_t size) noexcept {
  count_one();
  return __libc_memalign(alignment, size);
}
void* aligned_alloc(std::size_t alignment, std::size_t size) noexcept {
  count_one();
  return __libc_memalign(alignment, size);
}
void* valloc(std::size_t size) noexcept {
  count_one();
  return __libc_valloc(size);
}
int posix_memalign(void** out, std::size_t alignment, std::size_t size) noexcept {
  count_one();
  if (alignment < sizeof(void*) || (alignment & (alignment - 1)) != 0) return EINVAL;
  void* p = __libc_memalign(alignment, size);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}
void free(void* p) noexcept {
  __libc_free(p);
}
}  // extern "C"
#elif CONFIG_TEST_COUNTS_MALLOC  // Windows
// mingw-w64 links malloc and its relatives by name from the C runtime's
// import library: defined here, they replace them for everything linked into
// this executable (the product's code, libstdc++, GoogleTest), and forward to
// the runtime's own, looked up in its DLL (what glibc's __libc_* are on
// Linux). The runtime's allocations inside itself (its strdup) do not pass
// through here. Thread-locals are emulated with malloc on mingw, so the
// counting thread is told by its id instead.
namespace {
#if defined(_UCRT)
constexpr const char* kCrtDll = "ucrtbase.dll";
#else
constexpr const char* kCrtDll = "msvcrt.dll";
#endif

std::atomic<DWORD> g_counting_thread{0};
std::atomic<long> g_allocations{0};
inline void count_one() noexcept {
  if (g_counting_thread.load(std::memory_order_relaxed) == GetCurrentThreadId()) {
    g_allocations.fetch_add(1, std::memory_order_relaxed);
  }
}
void start_counting() noexcept {
  g_allocations.store(0);
  g_counting_thread.store(GetCurrentThreadId());
}
long stop_counting() noexcept {
  g_counting_thread.store(0);
  return g_allocations.load();
}

// The runtime's `name`, looked up once (a racing second lookup finds the same).
template <class Fn>
Fn crt_function(std::atomic<Fn>& cache, const char* name) noexcept {
  Fn fn = cache.load(std::memory_order_acquire);
  if (fn != nullptr) return fn;
  HMODULE crt = GetModuleHandleA(kCrtDll);
  fn = crt != nullptr ? reinterpret_cast<Fn>(reinterpret_cast<void*>(GetProcAddress(crt, name)))
                      : nullptr;
  if (fn == nullptr) ExitProcess(3);  // nothing to forward to: no output is possible either
  cache.store(fn, std::memory_order_release);
  return fn;
}
std::atomic<void* (*)(std::size_t)> g_crt_malloc{nullptr};
std::atomic<void* (*)(std::size_t, std::size_t)> g_crt_calloc{nullptr};
std::atomic<void* (*)(void*, std::size_t)> g_crt_realloc{nullptr};
std::atomic<void (*)(void*)> g_crt_free{nullptr};
}  // namespace

extern "C" {
void* malloc(std::size_t size) {
  count_one();
  return crt_function(g_crt_malloc, "malloc")(size);
}
void* calloc(std::size_t n, std::size_t size) {
  count_one();
  return crt_function(g_crt_calloc, "calloc")(n, size);
}
void* realloc(void* p, std::size_t size) {
  count_one();
  return crt_function(g_crt_realloc, "realloc")(p, size);
}
void free(void* p) {
  crt_function(g_crt_free, "free")(p);
}
}  // extern "C"
#endif  // CONFIG_TEST_COUNTS_MALLOC

namespace mnemosyne::config {
namespace {

// A NULL-terminated envp over owned strings.
class Env {
 public:
  Env(std::initializer_list<std::string> entries) : strings_(entries) { rebuild(); }
  explicit Env(std::vector<std::string> entries) : strings_(std::move(entries)) { rebuild(); }
  char* const* envp() { return pointers_.data(); }

 private:
  void rebuild() {
    pointers_.clear();
    for (auto& s : strings_) pointers_.push_back(s.data());
    pointers_.push_back(nullptr);
  }
  std::vector<std::string> strings_;
  std::vector<char*> pointers_;
};

std::vector<std::string> g_lines;
void collect(const char* line) {
  g_lines.emplace_back(line);
}

// read_options over `entries`; the warnings land in g_lines.
Options read(std::initializer_list<std::string> entries, bool secure = false) {
  Env env(entries);
  g_lines.clear();
  Options o;
  o.device = 77;  // read_options resets to the defaults
  read_options(env.envp(), secure, &o, collect);
  return o;
}

bool contains(const std::string& line, const std::string& part) {
  return line.find(part) != std::string::npos;
}

void expect_defaults(const Options& o) {
  const Options d;
  EXPECT_EQ(o.disable, d.disable);
  EXPECT_EQ(o.backend, d.backend);
  EXPECT_EQ(o.device, d.device);
  EXPECT_EQ(o.device_local_rank, d.device_local_rank);
  EXPECT_EQ(o.size_routing, d.size_routing);
  EXPECT_EQ(o.size_min, d.size_min);
  EXPECT_EQ(o.size_max, d.size_max);
  EXPECT_EQ(o.arena_size, d.arena_size);
  EXPECT_EQ(o.limit, d.limit);
  EXPECT_EQ(o.fallback, d.fallback);
  EXPECT_EQ(o.context, Context::primary);
  EXPECT_EQ(o.zeroed, Zeroed::automatic);
  EXPECT_EQ(o.fork_keep_ms, 2000u);
  EXPECT_EQ(o.verbose, d.verbose);
  EXPECT_EQ(o.show_stats, d.show_stats);
  EXPECT_STREQ(o.stats_file, "");
  EXPECT_STREQ(o.cuda_driver, "");
  EXPECT_STREQ(o.programs, "");
}

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;
constexpr std::size_t TiB = std::size_t{1} << 40;

// ---------------------------------------------------------------- the table

TEST(ConfigTable, NamesTypesAndOrder) {
  std::size_t count = 0;
  const OptionInfo* table = option_table(&count);
  ASSERT_NE(table, nullptr);
  const struct {
    const char* name;
    Type type;
  } expected[] = {
      {"BACKEND", Type::choice},
      {"DEVICE", Type::integer_or_word},
      {"SIZE", Type::size_range},
      {"ARENA_SIZE", Type::size},
      {"LIMIT", Type::size},
      {"FALLBACK", Type::choice},
      {"CONTEXT", Type::choice},
      {"ZEROED", Type::choice},
      {"PIN", Type::choice},
      {"FORK_KEEP_MS", Type::milliseconds},
      {"FORK_PULL_MS", Type::milliseconds},
      {"VERBOSE", Type::boolean},
      {"SHOW_STATS", Type::boolean},
      {"STATS_FILE", Type::path},
      {"CUDA_DRIVER", Type::path},
      {"PROGRAMS", Type::program_list},
      {"EXCLUDE", Type::program_list},
      {"WARNED", Type::word},
      {"DISABLE", Type::boolean},
  };
  ASSERT_EQ(count, std::size(expected));
  for (std::size_t i = 0; i < count; ++i) {
    SCOPED_TRACE(table[i].name);
    EXPECT_STREQ(table[i].name, expected[i].name);
    EXPECT_EQ(table[i].type, expected[i].type);
    ASSERT_NE(table[i].default_text, nullptr);
    EXPECT_NE(table[i].default_text[0], '\0');
    ASSERT_NE(table[i].description, nullptr);
    EXPECT_GT(std::strlen(table[i].description), 20u);
    ASSERT_NE(table[i].example, nullptr);
    const std::string prefix = std::string("MNEMOSYNE_") + table[i].name + "=";
    EXPECT_EQ(std::string(table[i].example).rfind(prefix, 0), 0u) << table[i].example;
  }
  EXPECT_STREQ(table[0].default_text, "unified");
  EXPECT_STREQ(table[3].default_text, "64MiB");
  EXPECT_STREQ(table[5].default_text, "host");
  EXPECT_EQ(option_table(nullptr), table);
}

// Every table example is a valid setting: it reads without a warning.
TEST(ConfigTable, ExamplesReadCleanly) {
  std::size_t count = 0;
  const OptionInfo* table = option_table(&count);
  for (std::size_t i = 0; i < count; ++i) {
    SCOPED_TRACE(table[i].example);
    std::string rank = "SLURM_LOCALID=3";
    read({table[i].example, rank});
    EXPECT_TRUE(g_lines.empty()) << g_lines[0];
  }
}

// ---------------------------------------------------------------- parsers

TEST(ConfigParse, BoolValidForms) {
  for (const char* t : {"", "1", "true", "TRUE", "True", "yes", "YES", "on", "On"}) {
    bool b = false;
    EXPECT_TRUE(parse_bool(t, &b)) << t;
    EXPECT_TRUE(b) << t;
  }
  for (const char* t : {"0", "false", "FALSE", "no", "No", "off", "OFF"}) {
    bool b = true;
    EXPECT_TRUE(parse_bool(t, &b)) << t;
    EXPECT_FALSE(b) << t;
  }
}

TEST(ConfigParse, BoolMalformedLeavesOutput) {
  for (const char* t : {"maybe", "2", " on", "on ", "onn", "tru", "y", "n", "00", "-1"}) {
    bool b = true;
    EXPECT_FALSE(parse_bool(t, &b)) << t;
    EXPECT_TRUE(b) << t;
  }
  bool b = true;
  EXPECT_FALSE(parse_bool(nullptr, &b));
}

TEST(ConfigParse, SizeValidForms) {
  const struct {
    const char* text;
    std::size_t value;
  } cases[] = {
      {"4096", 4096},
      {"0", 0},
      {"007", 7},
      {"4096B", 4096},
      {"4096b", 4096},
      {"64K", 64 * KiB},
      {"64k", 64 * KiB},
      {"64KB", 64 * KiB},
      {"64kb", 64 * KiB},
      {"64Ki", 64 * KiB},
      {"64KiB", 64 * KiB},
      {"64kib", 64 * KiB},
      {"256MiB", 256 * MiB},
      {"256M", 256 * MiB},
      {"256mB", 256 * MiB},
      {"1g", GiB},
      {"1G", GiB},
      {"1GiB", GiB},
      {"2TB", 2 * TiB},
      {"2t", 2 * TiB},
      {"18446744073709551615", SIZE_MAX},
      {"16777215T", std::size_t{16777215} << 40},
  };
  for (const auto& c : cases) {
    std::size_t v = 12345;
    EXPECT_TRUE(parse_size(c.text, &v)) << c.text;
    EXPECT_EQ(v, c.value) << c.text;
  }
}

TEST(ConfigParse, SizeMalformedLeavesOutput) {
  for (const char* t : {"",
                        "abc",
                        "12Q",
                        "-5",
                        "+5",
                        "1.5G",
                        "18446744073709551616",
                        "99999999T",
                        "16777216T",
                        "99999999999999999999999",
                        "4 K",
                        " 4K",
                        "4K ",
                        "K",
                        "B",
                        "KiB",
                        "4KBB",
                        "4iB",
                        "4i",
                        "4Bi",
                        "4KiBx",
                        "4P",
                        "0x10",
                        "4K4",
                        "1e3"}) {
    std::size_t v = 12345;
    EXPECT_FALSE(parse_size(t, &v)) << t;
    EXPECT_EQ(v, 12345u) << t;
  }
  std::size_t v = 12345;
  EXPECT_FALSE(parse_size(nullptr, &v));
}

TEST(ConfigParse, SizeRangeValidForms) {
  const struct {
    const char* text;
    std::size_t min, max;
  } cases[] = {
      {"1M:64M", MiB, 64 * MiB},
      {"4K", 4 * KiB, SIZE_MAX},
      {":1G", 0, GiB},
      {"64M:64M", 64 * MiB, 64 * MiB},
      {"0:0", 0, 0},
      {"0", 0, SIZE_MAX},
      {"1kib:2KB", KiB, 2 * KiB},
  };
  for (const auto& c : cases) {
    std::size_t lo = 7, hi = 7;
    EXPECT_TRUE(parse_size_range(c.text, &lo, &hi)) << c.text;
    EXPECT_EQ(lo, c.min) << c.text;
    EXPECT_EQ(hi, c.max) << c.text;
  }
}

TEST(ConfigParse, SizeRangeMalformedLeavesOutput) {
  for (const char* t : {"5:3", "1M:", ":", "a:b", "", "1M:2M:3M", "1M::2M", "::", "1M:x", "x:1M",
                        "1M :2M", "2G:1G", "-1:5"}) {
    std::size_t lo = 7, hi = 7;
    EXPECT_FALSE(parse_size_range(t, &lo, &hi)) << t;
    EXPECT_EQ(lo, 7u) << t;
    EXPECT_EQ(hi, 7u) << t;
  }
  std::size_t lo = 7, hi = 7;
  EXPECT_FALSE(parse_size_range(nullptr, &lo, &hi));
}

// ---------------------------------------------------------------- read_options

TEST(ConfigRead, EmptyAndNullEnvironmentGiveDefaults) {
  expect_defaults(read({}));
  EXPECT_TRUE(g_lines.empty());
  Options o;
  o.limit = 5;
  read_options(nullptr, false, &o, collect);
  expect_defaults(o);
  EXPECT_EQ(o.local_rank, -1);
  read_options(nullptr, false, nullptr, collect);  // nothing to fill: no crash
}

TEST(ConfigRead, EveryOptionValid) {
  const Options o = read({
      "MNEMOSYNE_BACKEND=pinned",
      "MNEMOSYNE_DEVICE=3",
      "MNEMOSYNE_SIZE=1M:64M",
      "MNEMOSYNE_ARENA_SIZE=256MiB",
      "MNEMOSYNE_LIMIT=8G",
      "MNEMOSYNE_FALLBACK=fail",
      "MNEMOSYNE_CONTEXT=own",
      "MNEMOSYNE_ZEROED=no",
      "MNEMOSYNE_FORK_KEEP_MS=120000",
      "MNEMOSYNE_FORK_PULL_MS=100",
      "MNEMOSYNE_VERBOSE=1",
      "MNEMOSYNE_SHOW_STATS=yes",
      "MNEMOSYNE_STATS_FILE=/tmp/stats.%p.json",
      "MNEMOSYNE_CUDA_DRIVER=/opt/libcuda.so.1",
      "MNEMOSYNE_PROGRAMS=python3*,train.py",
      "MNEMOSYNE_DISABLE=on",
      "PATH=/usr/bin",
  });
  EXPECT_TRUE(g_lines.empty()) << g_lines[0];
  EXPECT_EQ(o.backend, BackendId::pinned);
  EXPECT_EQ(o.device, 3);
  EXPECT_FALSE(o.device_local_rank);
  EXPECT_TRUE(o.size_routing);
  EXPECT_EQ(o.size_min, MiB);
  EXPECT_EQ(o.size_max, 64 * MiB);
  EXPECT_EQ(o.arena_size, 256 * MiB);
  EXPECT_EQ(o.limit, 8 * GiB);
  EXPECT_EQ(o.fallback, Fallback::fail);
  EXPECT_EQ(o.context, Context::own);
  EXPECT_EQ(o.zeroed, Zeroed::no);
  EXPECT_EQ(o.fork_keep_ms, 120000u);
  EXPECT_TRUE(o.verbose);
  EXPECT_TRUE(o.show_stats);
  EXPECT_STREQ(o.stats_file, "/tmp/stats.%p.json");
  EXPECT_STREQ(o.cuda_driver, "/opt/libcuda.so.1");
  EXPECT_STREQ(o.programs, "python3*,train.py");
  EXPECT_TRUE(o.disable);
}

TEST(ConfigRead, EveryBackendName) {
  const struct {
    const char* value;
    BackendId id;
  } cases[] = {{"unified", BackendId::unified}, {"device", BackendId::device},
               {"hbm", BackendId::hbm},         {"gddr", BackendId::gddr},
               {"pinned", BackendId::pinned},   {"host", BackendId::host},
               {"Unified", BackendId::unified}, {"UNIFIED", BackendId::unified},
               {"HoSt", BackendId::host},       {"DEVICE", BackendId::device}};
  for (const auto& c : cases) {
    EXPECT_EQ(read({std::string("MNEMOSYNE_BACKEND=") + c.value}).backend, c.id) << c.value;
    EXPECT_TRUE(g_lines.empty()) << c.value;
  }
}

TEST(ConfigRead, NamesMatchCaseInsensitively) {
  EXPECT_EQ(read({"mnemosyne_backend=host"}).backend, BackendId::host);
  EXPECT_EQ(read({"MNEMOSYNE_Backend=device"}).backend, BackendId::device);
  EXPECT_EQ(read({"Mnemosyne_BACKEND=hbm"}).backend, BackendId::hbm);
  EXPECT_EQ(read({"mnemosyne_arena_size=128m"}).arena_size, 128 * MiB);
  EXPECT_EQ(read({"MNEMOSYNE_Fallback=FAIL"}).fallback, Fallback::fail);
  EXPECT_TRUE(read({"mnemosyne_show_stats=TRUE"}).show_stats);
  EXPECT_TRUE(g_lines.empty());
}

TEST(ConfigRead, ContextChoices) {
  EXPECT_EQ(read({"MNEMOSYNE_CONTEXT=primary"}).context, Context::primary);
  EXPECT_EQ(read({"MNEMOSYNE_CONTEXT=OWN"}).context, Context::own);
  EXPECT_TRUE(g_lines.empty());
  EXPECT_EQ(read({"MNEMOSYNE_CONTEXT=mine"}).context, Context::primary);
  ASSERT_EQ(g_lines.size(), 1u);
  EXPECT_EQ(g_lines[0],
            "mnemosyne: MNEMOSYNE_CONTEXT=mine is not primary or own; using the default (primary)");
}

TEST(ConfigRead, ZeroedChoices) {
  EXPECT_EQ(read({}).zeroed, Zeroed::automatic);
  EXPECT_EQ(read({"MNEMOSYNE_ZEROED=auto"}).zeroed, Zeroed::automatic);
  EXPECT_EQ(read({"MNEMOSYNE_ZEROED=YES"}).zeroed, Zeroed::yes);
  EXPECT_EQ(read({"MNEMOSYNE_ZEROED=no"}).zeroed, Zeroed::no);
  EXPECT_TRUE(g_lines.empty());
  EXPECT_EQ(read({"MNEMOSYNE_ZEROED=maybe"}).zeroed, Zeroed::automatic);
  ASSERT_EQ(g_lines.size(), 1u);
  EXPECT_EQ(g_lines[0],
            "mnemosyne: MNEMOSYNE_ZEROED=maybe is not auto, yes or no; using the default (auto)");
}

TEST(ConfigRead, PinChoices) {
  // Only the granules in use on Linux; arenas locked whole on Windows, where
  // the virtual-memory API's host memory is untried.
#ifdef _WIN32
  const Pin platform_default = Pin::arena;
  const std::string default_text = "arena";
#else
  const Pin platform_default = Pin::vmm;
  const std::string default_text = "vmm";
#endif
  EXPECT_EQ(read({}).pin, platform_default);
  EXPECT_EQ(read({"MNEMOSYNE_PIN=arena"}).pin, Pin::arena);
  EXPECT_EQ(read({"MNEMOSYNE_PIN=Granule"}).pin, Pin::granule);
  EXPECT_EQ(read({"MNEMOSYNE_PIN=vmm"}).pin, Pin::vmm);
  EXPECT_TRUE(g_lines.empty());
  EXPECT_EQ(read({"MNEMOSYNE_PIN=page"}).pin, platform_default);
  ASSERT_EQ(g_lines.size(), 1u);
  EXPECT_EQ(g_lines[0],
            "mnemosyne: MNEMOSYNE_PIN=page is not arena, granule or vmm; using the "
            "default (" +
                default_text + ")");
}

TEST(ConfigRead, EmptyBooleanMeansOn) {
  const Options o = read({"MNEMOSYNE_VERBOSE=", "MNEMOSYNE_SHOW_STATS=", "MNEMOSYNE_DISABLE="});
  EXPECT_TRUE(o.verbose);
  EXPECT_TRUE(o.show_stats);
  EXPECT_TRUE(o.disable);
  EXPECT_TRUE(read({"MNEMOSYNE_VERBOSE=on", "MNEMOSYNE_VERBOSE=off"}).verbose)
      << "the first entry counts";
  ASSERT_EQ(g_lines.size(), 1u);
  EXPECT_TRUE(contains(g_lines[0], "MNEMOSYNE_VERBOSE=off is ignored")) << g_lines[0];
}

TEST(ConfigRead, SizeRoutingForms) {
  Options o = read({"MNEMOSYNE_SIZE=4K"});
  EXPECT_TRUE(o.size_routing);
  EXPECT_EQ(o.size_min, 4 * KiB);
  EXPECT_EQ(o.size_max, SIZE_MAX);
  o = read({"MNEMOSYNE_SIZE=:1G"});
  EXPECT_TRUE(o.size_routing);
  EXPECT_EQ(o.size_min, 0u);
  EXPECT_EQ(o.size_max, GiB);
  EXPECT_TRUE(g_lines.empty());
}

TEST(ConfigRead, DeviceOrdinals) {
  EXPECT_EQ(read({"MNEMOSYNE_DEVICE=0"}).device, 0);
  EXPECT_EQ(read({"MNEMOSYNE_DEVICE=1023"}).device, 1023);
  EXPECT_EQ(read({"MNEMOSYNE_DEVICE=7"}).device, 7);
  EXPECT_TRUE(g_lines.empty());
}

TEST(ConfigRead, ArenaSizeMinimum) {
  EXPECT_EQ(read({"MNEMOSYNE_ARENA_SIZE=32MiB"}).arena_size, 32 * MiB);
  EXPECT_TRUE(g_lines.empty());
  EXPECT_EQ(read({"MNEMOSYNE_ARENA_SIZE=1M"}).arena_size, 64 * MiB);
  ASSERT_EQ(g_lines.size(), 1u);
  EXPECT_EQ(g_lines[0],
            "mnemosyne: MNEMOSYNE_ARENA_SIZE=1M is below the minimum of 32MiB; using the default "
            "(64MiB)");
  EXPECT_EQ(read({"MNEMOSYNE_ARENA_SIZE=33554431"}).arena_size, 64 * MiB);
  EXPECT_EQ(g_lines.size(), 1u);
}

TEST(ConfigRead, ForkKeepMilliseconds) {
  EXPECT_EQ(read({"MNEMOSYNE_FORK_KEEP_MS=0"}).fork_keep_ms, 0u);
  EXPECT_EQ(read({"MNEMOSYNE_FORK_KEEP_MS=2147483647"}).fork_keep_ms, 2147483647u);
  EXPECT_TRUE(g_lines.empty());
  EXPECT_EQ(read({"MNEMOSYNE_FORK_KEEP_MS=2s"}).fork_keep_ms, 2000u);
  ASSERT_EQ(g_lines.size(), 1u);
  EXPECT_EQ(g_lines[0],
            "mnemosyne: MNEMOSYNE_FORK_KEEP_MS=2s is not a whole number of milliseconds (0 to "
            "2147483647); using the default (2000)");
}

TEST(ConfigRead, ForkPullMilliseconds) {
  EXPECT_EQ(read({}).fork_pull_ms, config::kDefaultForkPullMs);
  EXPECT_EQ(read({"MNEMOSYNE_FORK_PULL_MS=0"}).fork_pull_ms, 0u);
  EXPECT_EQ(read({"MNEMOSYNE_FORK_PULL_MS=60000"}).fork_pull_ms, 60000u);
  EXPECT_TRUE(g_lines.empty());
  EXPECT_EQ(read({"MNEMOSYNE_FORK_PULL_MS=60001"}).fork_pull_ms, config::kDefaultForkPullMs);
  ASSERT_EQ(g_lines.size(), 1u);
  EXPECT_TRUE(contains(g_lines[0],
                       "MNEMOSYNE_FORK_PULL_MS=60001 is not a whole number of "
                       "milliseconds (0 to 60000)"))
      << g_lines[0];
}

TEST(ConfigRead, LimitWarningFormat) {
  EXPECT_EQ(read({"MNEMOSYNE_LIMIT=12Q"}).limit, 0u);
  ASSERT_EQ(g_lines.size(), 1u);
  EXPECT_EQ(g_lines[0],
            "mnemosyne: MNEMOSYNE_LIMIT=12Q is not a size (like 4096, 64K, 256MiB, 1G); using the "
            "default (0 = no limit)");
}

// Every invalid value: exactly one warning, naming the variable, the value and
// the default; the option keeps its default.
struct Invalid {
  const char* name;
  const char* value;
};

class ConfigInvalid : public ::testing::TestWithParam<Invalid> {};

TEST_P(ConfigInvalid, OneWarningAndTheDefault) {
  const Invalid c = GetParam();
  const std::string name = c.name;
  const Options o = read({name + "=" + c.value, "SLURM_LOCALID=2"});
  ASSERT_EQ(g_lines.size(), 1u);
  const std::string& line = g_lines[0];
  EXPECT_EQ(line.rfind("mnemosyne: ", 0), 0u) << line;
  EXPECT_TRUE(contains(line, name + "=" + c.value)) << line;
  EXPECT_TRUE(contains(line, "default")) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  expect_defaults(o);
  EXPECT_EQ(o.local_rank, 2);
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, ConfigInvalid,
    ::testing::Values(
        Invalid{"MNEMOSYNE_BACKEND", "cuda"}, Invalid{"MNEMOSYNE_BACKEND", ""},
        Invalid{"MNEMOSYNE_BACKEND", " unified"}, Invalid{"MNEMOSYNE_BACKEND", "none"},
        Invalid{"MNEMOSYNE_BACKEND", "unifiedunifiedunified"}, Invalid{"MNEMOSYNE_DEVICE", "-1"},
        Invalid{"MNEMOSYNE_DEVICE", "x"}, Invalid{"MNEMOSYNE_DEVICE", "1024"},
        Invalid{"MNEMOSYNE_DEVICE", ""}, Invalid{"MNEMOSYNE_DEVICE", "1 "},
        Invalid{"MNEMOSYNE_DEVICE", "local_rank"},
        Invalid{"MNEMOSYNE_DEVICE", "99999999999999999999"}, Invalid{"MNEMOSYNE_SIZE", "5:3"},
        Invalid{"MNEMOSYNE_SIZE", "1M:"}, Invalid{"MNEMOSYNE_SIZE", ":"},
        Invalid{"MNEMOSYNE_SIZE", "a:b"}, Invalid{"MNEMOSYNE_SIZE", ""},
        Invalid{"MNEMOSYNE_ARENA_SIZE", "abc"}, Invalid{"MNEMOSYNE_ARENA_SIZE", "1M"},
        Invalid{"MNEMOSYNE_ARENA_SIZE", "0"}, Invalid{"MNEMOSYNE_ARENA_SIZE", "1.5G"},
        Invalid{"MNEMOSYNE_LIMIT", ""}, Invalid{"MNEMOSYNE_LIMIT", "abc"},
        Invalid{"MNEMOSYNE_LIMIT", "12Q"}, Invalid{"MNEMOSYNE_LIMIT", "-5"},
        Invalid{"MNEMOSYNE_LIMIT", "1.5G"}, Invalid{"MNEMOSYNE_LIMIT", "18446744073709551616"},
        Invalid{"MNEMOSYNE_LIMIT", "99999999T"}, Invalid{"MNEMOSYNE_LIMIT", "4 K"},
        Invalid{"MNEMOSYNE_LIMIT", "K"}, Invalid{"MNEMOSYNE_FALLBACK", "none"},
        Invalid{"MNEMOSYNE_FALLBACK", ""}, Invalid{"MNEMOSYNE_VERBOSE", "maybe"},
        Invalid{"MNEMOSYNE_SHOW_STATS", "2"}, Invalid{"MNEMOSYNE_DISABLE", "enabled"},
        Invalid{"MNEMOSYNE_FORK_KEEP_MS", ""}, Invalid{"MNEMOSYNE_FORK_KEEP_MS", "-1"},
        Invalid{"MNEMOSYNE_FORK_KEEP_MS", "1.5"}, Invalid{"MNEMOSYNE_FORK_KEEP_MS", "2147483648"},
        Invalid{"MNEMOSYNE_FORK_PULL_MS", "-5"}, Invalid{"MNEMOSYNE_FORK_PULL_MS", "100ms"},
        Invalid{"mnemosyne_limit", "12Q"}, Invalid{"MNEMOSYNE_Backend", "CUDA"}));

TEST(ConfigRead, LongValuesAreClippedInWarnings) {
  const std::string value(5000, '7');
  const Options o = read({"MNEMOSYNE_LIMIT=" + value + "Q"});
  EXPECT_EQ(o.limit, 0u);
  ASSERT_EQ(g_lines.size(), 1u);
  EXPECT_LT(g_lines[0].size(), 300u);
  EXPECT_TRUE(contains(g_lines[0], "MNEMOSYNE_LIMIT=" + std::string(80, '7') + "..."))
      << g_lines[0];
  EXPECT_FALSE(contains(g_lines[0], std::string(81, '7')));
  EXPECT_TRUE(contains(g_lines[0], "default"));

  const std::string long_name = "MNEMOSYNE_" + std::string(3000, 'X');
  read({long_name + "=" + value});
  ASSERT_EQ(g_lines.size(), 1u);
  EXPECT_LT(g_lines[0].size(), 500u);
  EXPECT_TRUE(contains(g_lines[0], "unknown option"));
}

// ---------------------------------------------------------------- PROGRAMS

TEST(ConfigPrograms, ListSyntax) {
  for (const char* t :
       {"python3", "python3*,train.py", "a?c", "[a-z]*", "[!x]y", "[]x]", "/usr/bin/*", "*"}) {
    EXPECT_TRUE(parse_program_list(t)) << t;
  }
  for (const char* t : {"", ",", "a,", ",a", "a,,b", "a b", "[abc", "x[", "[!]"}) {
    EXPECT_FALSE(parse_program_list(t)) << t;
  }
}

TEST(ConfigPrograms, NamesAndGlobs) {
  struct Case {
    const char* list;
    const char* name;
    bool hit;
  } cases[] = {
      {"python3", "/usr/bin/python3", true},
      {"python3", "/usr/bin/python3.11", false},
      {"python3*", "/usr/bin/python3.11", true},
      {"python3", "python3", true},
      {"sort,python3", "/usr/bin/python3", true},
      {"sort,xz", "/usr/bin/python3", false},
      {"train.py", "/home/u/job/train.py", true},
      {"train*.py", "./train_big.py", true},
      {"train*.py", "./train_big.pyc", false},
      {"?z", "/usr/bin/xz", true},
      {"?z", "/usr/bin/xzz", false},
      {"[a-c]at", "/bin/cat", true},
      {"[!c]at", "/bin/cat", false},
      {"[]x]", "]", true},
      {"*a*b*c", "xxaxxbxxbxc", true},
      {"*a*b*c", "xxaxxbxxbxcx", false},
      {"/usr/bin/*", "/usr/bin/python3", true},
      {"/usr/bin/*", "python3", false},
      {"/usr/*/python3", "/usr/local/bin/python3", true},  // '*' crosses '/'
      {"bin/python3", "/usr/bin/python3", false},          // with a '/', the whole path
      {"*/bin/python3", "/usr/bin/python3", true},
      {"Python3", "/usr/bin/python3", false},  // Linux names keep their case
      {"python3", "", false},
      {"python3", "/usr/bin/", false},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(program_matches(c.list, c.name, false), c.hit) << c.list << " ~ " << c.name;
  }
  EXPECT_FALSE(program_matches("python3", nullptr, false));
}

TEST(ConfigPrograms, WindowsNames) {
  EXPECT_TRUE(program_matches("python.exe", "C:\\Python\\PYTHON.EXE", true));
  EXPECT_TRUE(program_matches("py*", "C:\\Python\\Python.exe", true));
  EXPECT_TRUE(program_matches("c:\\python\\*", "C:\\Python\\python.exe", true));
  EXPECT_TRUE(program_matches("python.exe", "C:/Python/python.exe", true));
  EXPECT_FALSE(program_matches("python.exe", "C:\\Python\\python.exe", false) &&
               !program_matches("python.exe", "C:\\Python\\python.exe", true));
  EXPECT_FALSE(program_matches("node.exe", "C:\\Python\\python.exe", true));
}

TEST(ConfigPrograms, ExcludeDefaultsToSingleThreadedTools) {
  const Options o = read({});
  EXPECT_STREQ(o.exclude, kDefaultExclude);
  const char* unshare[] = {"/usr/bin/unshare", "unshare"};
  EXPECT_EQ(select_process(o, unshare, 2, false), Selection::excluded);
  const char* python[] = {"/usr/bin/python3.11", "python3"};
  EXPECT_EQ(select_process(o, python, 2, false), Selection::moves);
  // EXCLUDE wins over PROGRAMS; empty excludes nothing.
  Options both = read({"MNEMOSYNE_PROGRAMS=unshare,python3*"});
  EXPECT_EQ(select_process(both, unshare, 2, false), Selection::excluded);
  EXPECT_EQ(select_process(both, python, 2, false), Selection::moves);
  const char* gcc[] = {"/usr/bin/gcc-12", "gcc"};
  EXPECT_EQ(select_process(both, gcc, 2, false), Selection::not_named);
  const Options none = read({"MNEMOSYNE_EXCLUDE="});
  EXPECT_TRUE(g_lines.empty());
  EXPECT_STREQ(none.exclude, "");
  EXPECT_EQ(select_process(none, unshare, 2, false), Selection::moves);
  const Options mine = read({"MNEMOSYNE_EXCLUDE=my-sandbox*"});
  const char* sandbox[] = {"/opt/my-sandbox-2"};
  EXPECT_EQ(select_process(mine, sandbox, 1, false), Selection::excluded);
  EXPECT_EQ(select_process(mine, unshare, 2, false), Selection::moves);
  // Null names (no AT_EXECFN) are skipped.
  const char* partial[] = {nullptr, "nsenter"};
  EXPECT_EQ(select_process(o, partial, 2, false), Selection::excluded);
  // A malformed list warns and keeps the default.
  EXPECT_STREQ(read({"MNEMOSYNE_EXCLUDE=a,,b"}).exclude, kDefaultExclude);
  ASSERT_EQ(g_lines.size(), 1u);
  EXPECT_TRUE(contains(g_lines[0], "MNEMOSYNE_EXCLUDE=a,,b is not")) << g_lines[0];
}

TEST(ConfigRead, WarnedKey) {
  EXPECT_STREQ(read({}).warned, "");
  EXPECT_STREQ(read({"MNEMOSYNE_WARNED=unified:0a1b2c3d"}).warned, "unified:0a1b2c3d");
  EXPECT_TRUE(g_lines.empty());
  const std::string long_key(100, 'k');
  EXPECT_STREQ(read({"MNEMOSYNE_WARNED=" + long_key}).warned, "");
  ASSERT_EQ(g_lines.size(), 1u);
}

TEST(ConfigPrograms, ReadAndWarnings) {
  EXPECT_STREQ(read({"MNEMOSYNE_PROGRAMS=gcc,cc1*"}).programs, "gcc,cc1*");
  EXPECT_TRUE(g_lines.empty());
  for (const char* bad : {"MNEMOSYNE_PROGRAMS=", "MNEMOSYNE_PROGRAMS=a,,b",
                          "MNEMOSYNE_PROGRAMS=python3 gcc", "MNEMOSYNE_PROGRAMS=[ab"}) {
    SCOPED_TRACE(bad);
    EXPECT_STREQ(read({bad}).programs, "");
    ASSERT_EQ(g_lines.size(), 1u);
    EXPECT_TRUE(contains(g_lines[0], "is not a list of program names or globs")) << g_lines[0];
    EXPECT_TRUE(contains(g_lines[0], "using the default (every program)")) << g_lines[0];
  }
  const std::string long_list(600, 'p');
  EXPECT_STREQ(read({"MNEMOSYNE_PROGRAMS=" + long_list}).programs, "");
  ASSERT_EQ(g_lines.size(), 1u);
  EXPECT_TRUE(contains(g_lines[0], "is longer than 511 bytes")) << g_lines[0];
  // Not a file or a library: kept in set-uid programs.
  EXPECT_STREQ(read({"MNEMOSYNE_PROGRAMS=su"}, true).programs, "su");
  EXPECT_TRUE(g_lines.empty());
}

TEST(ConfigRead, PathsTooLongKeepTheDefault) {
  const std::string path = "/" + std::string(511, 'p');  // 512 bytes: one too many
  const Options o = read({"MNEMOSYNE_STATS_FILE=" + path, "MNEMOSYNE_CUDA_DRIVER=" + path});
  EXPECT_STREQ(o.stats_file, "");
  EXPECT_STREQ(o.cuda_driver, "");
  ASSERT_EQ(g_lines.size(), 2u);
  for (const auto& line : g_lines) {
    EXPECT_TRUE(contains(line, "is longer than 511 bytes")) << line;
    EXPECT_TRUE(contains(line, "default")) << line;
  }
  std::string fits(511, 'p');  // 511 bytes
  fits[0] = '/';
  EXPECT_EQ(read({"MNEMOSYNE_STATS_FILE=" + fits}).stats_file, fits);
  EXPECT_TRUE(g_lines.empty());
  EXPECT_STREQ(read({"MNEMOSYNE_STATS_FILE="}).stats_file, "");
  EXPECT_TRUE(g_lines.empty());
}

TEST(ConfigRead, UnknownNamesWarnOnceEach) {
  const Options o = read({"MNEMOSYNE_BAKEND=host", "MNEMOSYNE_BACKEND=host", "mnemosyne_lmit=1",
                          "MNEMOSYNE_=1", "MNEMOSYNE_TEST=1"});
  EXPECT_EQ(o.backend, BackendId::host);
  ASSERT_EQ(g_lines.size(), 4u);
  EXPECT_EQ(g_lines[0],
            "mnemosyne: unknown option MNEMOSYNE_BAKEND=host (ignored); options are BACKEND, "
            "DEVICE, SIZE, ARENA_SIZE, LIMIT, FALLBACK, CONTEXT, ZEROED, PIN, FORK_KEEP_MS, "
            "FORK_PULL_MS, VERBOSE, SHOW_STATS, STATS_FILE, CUDA_DRIVER, PROGRAMS, EXCLUDE, "
            "WARNED, DISABLE");
  EXPECT_TRUE(contains(g_lines[1], "unknown option mnemosyne_lmit=1")) << g_lines[1];
  EXPECT_TRUE(contains(g_lines[2], "unknown option MNEMOSYNE_=1")) << g_lines[2];
  EXPECT_TRUE(contains(g_lines[3], "unknown option MNEMOSYNE_TEST=1")) << g_lines[3];
}

TEST(ConfigRead, ReservedTestNamesAndOtherVariablesAreSilent) {
  expect_defaults(read({"MNEMOSYNE_TEST_FAKECUDA=/x/libfakecuda.so", "mnemosyne_test_anything=1",
                        "MNEMOSYNE_TEST_=", "MNEMOSYNEBACKEND=host", "XMNEMOSYNE_BACKEND=host",
                        "MIMALLOC_VERBOSE=1", "MNEMOSYNE", "MNEMOSYNE_BACKEND", "=", ""}));
  EXPECT_TRUE(g_lines.empty()) << g_lines[0];
}

TEST(ConfigRead, EntriesAfterNullAreNotRead) {
  std::string a = "MNEMOSYNE_BACKEND=host";
  std::string b = "MNEMOSYNE_LIMIT=1G";
  char* envp[] = {a.data(), nullptr, b.data(), nullptr};
  Options o;
  g_lines.clear();
  read_options(envp, false, &o, collect);
  EXPECT_EQ(o.backend, BackendId::host);
  EXPECT_EQ(o.limit, 0u);
}

TEST(ConfigRead, DuplicatesFirstCounts) {
  const Options o = read({"MNEMOSYNE_BACKEND=device", "mnemosyne_backend=host"});
  EXPECT_EQ(o.backend, BackendId::device);
  ASSERT_EQ(g_lines.size(), 1u);
  EXPECT_EQ(g_lines[0],
            "mnemosyne: mnemosyne_backend=host is ignored: MNEMOSYNE_BACKEND is set more than once "
            "(the first one counts)");
  // A first entry that is invalid still counts: the default stays.
  EXPECT_EQ(read({"MNEMOSYNE_BACKEND=cuda", "MNEMOSYNE_BACKEND=host"}).backend, BackendId::unified);
  EXPECT_EQ(g_lines.size(), 2u);
}

TEST(ConfigRead, NullWarnIsAllowed) {
  Env env({"MNEMOSYNE_LIMIT=12Q", "MNEMOSYNE_NOPE=1", "MNEMOSYNE_BACKEND=host"});
  Options o;
  read_options(env.envp(), true, &o, nullptr);
  EXPECT_EQ(o.limit, 0u);
  EXPECT_EQ(o.backend, BackendId::host);
}

// ---------------------------------------------------------------- secure mode

TEST(ConfigSecure, FileAndLibraryOptionsAreIgnored) {
  const Options o = read({"MNEMOSYNE_STATS_FILE=/tmp/s.json", "MNEMOSYNE_CUDA_DRIVER=/tmp/evil.so",
                          "MNEMOSYNE_BACKEND=pinned", "MNEMOSYNE_SHOW_STATS=1"},
                         /*secure=*/true);
  EXPECT_STREQ(o.stats_file, "");
  EXPECT_STREQ(o.cuda_driver, "");
  EXPECT_EQ(o.backend, BackendId::pinned);
  EXPECT_TRUE(o.show_stats);
  ASSERT_EQ(g_lines.size(), 2u);
  EXPECT_EQ(g_lines[0], "mnemosyne: MNEMOSYNE_STATS_FILE is ignored in a set-uid/set-gid program");
  EXPECT_EQ(g_lines[1], "mnemosyne: MNEMOSYNE_CUDA_DRIVER is ignored in a set-uid/set-gid program");
  read({"MNEMOSYNE_BACKEND=host"}, /*secure=*/true);
  EXPECT_TRUE(g_lines.empty()) << "unset path options give no warning";
}

// ---------------------------------------------------------------- local rank

TEST(ConfigLocalRank, EachVariable) {
  for (const char* name :
       {"LOCAL_RANK", "HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
        "MV2_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "PALS_LOCAL_RANKID",
        "FLUX_TASK_LOCAL_ID", "JSM_NAMESPACE_LOCAL_RANK", "SLURM_LOCALID"}) {
    Env env({"HOME=/root", std::string(name) + "=5"});
    EXPECT_EQ(local_rank(env.envp()), 5) << name;
    const Options o = read({std::string(name) + "=6", "MNEMOSYNE_DEVICE=local-rank"});
    EXPECT_TRUE(g_lines.empty()) << name;
    EXPECT_TRUE(o.device_local_rank) << name;
    EXPECT_EQ(o.local_rank, 6) << name;
    EXPECT_EQ(o.device, 0) << name;
  }
}

TEST(ConfigLocalRank, Precedence) {
  Env all({"SLURM_LOCALID=5", "PMI_LOCAL_RANK=4", "MPI_LOCALRANKID=3",
           "MV2_COMM_WORLD_LOCAL_RANK=2", "OMPI_COMM_WORLD_LOCAL_RANK=1"});
  EXPECT_EQ(local_rank(all.envp()), 1);
  Env no_ompi(
      {"SLURM_LOCALID=5", "PMI_LOCAL_RANK=4", "MPI_LOCALRANKID=3", "MV2_COMM_WORLD_LOCAL_RANK=2"});
  EXPECT_EQ(local_rank(no_ompi.envp()), 2);
  Env mpich({"SLURM_LOCALID=5", "PMI_LOCAL_RANK=4", "MPI_LOCALRANKID=3"});
  EXPECT_EQ(local_rank(mpich.envp()), 3);
  Env pmi({"SLURM_LOCALID=5", "PMI_LOCAL_RANK=4"});
  EXPECT_EQ(local_rank(pmi.envp()), 4);
  // The launcher nearest the process wins: torchrun's workers, started by a
  // torchrun that mpirun or srun started once on the node, carry the outer
  // launcher's 0 beside their own LOCAL_RANK.
  Env torchrun_under_mpirun({"OMPI_COMM_WORLD_LOCAL_RANK=0", "SLURM_LOCALID=0", "LOCAL_RANK=3"});
  EXPECT_EQ(local_rank(torchrun_under_mpirun.envp()), 3);
  Env horovod_over_mpi({"OMPI_COMM_WORLD_LOCAL_RANK=0", "HOROVOD_LOCAL_RANK=2"});
  EXPECT_EQ(local_rank(horovod_over_mpi.envp()), 2);
  // An MPI launcher's ranks inside a Slurm job, with their daemon's SLURM_LOCALID.
  for (const char* mpi :
       {"PALS_LOCAL_RANKID", "FLUX_TASK_LOCAL_ID", "JSM_NAMESPACE_LOCAL_RANK", "MPI_LOCALRANKID"}) {
    Env under_slurm({"SLURM_LOCALID=0", std::string(mpi) + "=7"});
    EXPECT_EQ(local_rank(under_slurm.envp()), 7) << mpi;
  }
  // An invalid value is passed over for the next variable.
  Env bad_first({"OMPI_COMM_WORLD_LOCAL_RANK=x", "MV2_COMM_WORLD_LOCAL_RANK=-1",
                 "MPI_LOCALRANKID=", "PMI_LOCAL_RANK=2147483648", "SLURM_LOCALID=9"});
  EXPECT_EQ(local_rank(bad_first.envp()), 9);
  Env max({"SLURM_LOCALID=2147483647"});
  EXPECT_EQ(local_rank(max.envp()), 2147483647);
}

TEST(ConfigLocalRank, NoneSet) {
  Env none({"slurm_localid=3", "PMIX_RANK=2", "PMIX_LOCAL_RANK=1", "SLURM_LOCALIDX=4",
            "SLURM_LOCALID", "local_rank=1", "LOCAL_RANKS=2", "RANK=5"});
  EXPECT_EQ(local_rank(none.envp()), -1);
  EXPECT_EQ(local_rank(nullptr), -1);

  const Options o = read({"MNEMOSYNE_DEVICE=local-rank", "SLURM_LOCALID=x"});
  EXPECT_FALSE(o.device_local_rank);
  EXPECT_EQ(o.device, 0);
  EXPECT_EQ(o.local_rank, -1);
  ASSERT_EQ(g_lines.size(), 1u);
  EXPECT_EQ(g_lines[0],
            "mnemosyne: MNEMOSYNE_DEVICE=local-rank but no launcher's local rank variable is set "
            "to a rank (LOCAL_RANK, HOROVOD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, "
            "MV2_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, PMI_LOCAL_RANK, PALS_LOCAL_RANKID, "
            "FLUX_TASK_LOCAL_ID, JSM_NAMESPACE_LOCAL_RANK, SLURM_LOCALID); using device 0 (the "
            "default)");
}

TEST(ConfigLocalRank, WordIsCaseInsensitiveAndRankAlwaysFilled) {
  const Options o = read({"MNEMOSYNE_DEVICE=Local-Rank", "OMPI_COMM_WORLD_LOCAL_RANK=3"});
  EXPECT_TRUE(g_lines.empty());
  EXPECT_TRUE(o.device_local_rank);
  EXPECT_EQ(o.local_rank, 3);
  const Options plain = read({"MNEMOSYNE_DEVICE=1", "SLURM_LOCALID=4"});
  EXPECT_FALSE(plain.device_local_rank);
  EXPECT_EQ(plain.device, 1);
  EXPECT_EQ(plain.local_rank, 4);
}

// ---------------------------------------------------------------- stats path

std::string expand(const char* pattern, long pid, std::size_t len = 256, bool* ok = nullptr) {
  std::vector<char> out(len + 1, 'Z');
  const bool r = expand_stats_path(pattern, pid, out.data(), len);
  if (ok != nullptr) *ok = r;
  EXPECT_EQ(out[len], 'Z') << "wrote past out_len";
  return r ? std::string(out.data()) : "<false:" + std::string(len ? out.data() : "") + ">";
}

TEST(ConfigStatsPath, Expansion) {
  EXPECT_EQ(expand("/tmp/s.%p.json", 1234), "/tmp/s.1234.json");
  EXPECT_EQ(expand("%p%p", 7), "77");
  EXPECT_EQ(expand("%%p", 7), "%p");
  EXPECT_EQ(expand("100%%", 7), "100%");
  EXPECT_EQ(expand("100%", 7), "100%");
  EXPECT_EQ(expand("%x%", 7), "%x%");
  EXPECT_EQ(expand("%%%p", 42), "%42");
  EXPECT_EQ(expand("", 7), "");
  EXPECT_EQ(expand("plain", 7), "plain");
  EXPECT_EQ(expand("%p", 4194304), "4194304");
}

TEST(ConfigStatsPath, Fit) {
  bool ok = false;
  EXPECT_EQ(expand("s.%p", 1234, 7, &ok), "s.1234");  // 6 characters and the NUL
  EXPECT_TRUE(ok);
  EXPECT_EQ(expand("s.%p", 1234, 6, &ok), "<false:>");  // out is left empty
  EXPECT_FALSE(ok);
  EXPECT_EQ(expand("abc", 1, 3, &ok), "<false:>");
  EXPECT_EQ(expand("", 1, 1, &ok), "");
  EXPECT_TRUE(ok);
  EXPECT_EQ(expand("", 1, 0, &ok), "<false:>");
  EXPECT_FALSE(ok);
  char out[8] = "x";
  EXPECT_FALSE(expand_stats_path(nullptr, 1, out, sizeof out));
  EXPECT_STREQ(out, "");
}

// ---------------------------------------------------------------- robustness

// Random entries built from the characters that matter: no crash, every
// warning one bounded line.
TEST(ConfigRobustness, RandomEnvironments) {
  const char* pieces[] = {
      "MNEMOSYNE_", "mnemosyne_", "BACKEND",    "DEVICE",     "SIZE",        "ARENA_SIZE",
      "LIMIT",      "FALLBACK",   "VERBOSE",    "STATS_FILE", "CUDA_DRIVER", "TEST_",
      "=",          ":",          "%",          "K",          "iB",          "1",
      "9999999999", "-",          "local-rank", "",           "\xff",        "SLURM_LOCALID=",
      " "};
  std::mt19937 rng(12345);
  for (int round = 0; round < 300; ++round) {
    std::vector<std::string> entries;
    const int n = static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) {
      std::string e;
      const int parts = static_cast<int>(rng() % 6);
      for (int j = 0; j < parts; ++j) e += pieces[rng() % std::size(pieces)];
      entries.push_back(e);
    }
    Env env(std::move(entries));
    g_lines.clear();
    Options o;
    read_options(env.envp(), (round & 1) != 0, &o, collect);
    for (const auto& line : g_lines) {
      EXPECT_LT(line.size(), 1024u);
      EXPECT_EQ(line.rfind("mnemosyne: ", 0), 0u) << line;
    }
    EXPECT_GE(o.device, 0);
    EXPECT_LE(o.device, 1023);
    EXPECT_LE(o.size_min, o.size_max);
    EXPECT_GE(o.arena_size, std::size_t{32} << 20);
  }
}

// ---------------------------------------------------------------- no allocation

#if CONFIG_TEST_COUNTS_MALLOC
int g_quiet_lines = 0;
void count_lines(const char* line) {
  if (line != nullptr) ++g_quiet_lines;
}
#endif

TEST(ConfigNoAllocation, ReadOptionsNeverAllocates) {
#if !CONFIG_TEST_COUNTS_MALLOC
  GTEST_SKIP() << "malloc is the sanitizer's here; the check runs in the plain build";
#else
  // Every path of read_options: each option valid and invalid, unknown and
  // reserved names, duplicates, secure mode, local-rank with and without a
  // rank, clipped values, the parsers, expand_stats_path.
  const std::string long_value(2000, 'v');
  Env env({"MNEMOSYNE_BACKEND=Pinned", "MNEMOSYNE_DEVICE=local-rank", "MNEMOSYNE_SIZE=5:3",
           "MNEMOSYNE_ARENA_SIZE=1M", "MNEMOSYNE_LIMIT=" + long_value, "MNEMOSYNE_FALLBACK=x",
           "MNEMOSYNE_VERBOSE=maybe", "MNEMOSYNE_SHOW_STATS=", "MNEMOSYNE_STATS_FILE=/tmp/%p",
           "MNEMOSYNE_CUDA_DRIVER=/tmp/" + long_value, "MNEMOSYNE_DISABLE=0",
           "MNEMOSYNE_PROGRAMS=" + long_value, "mnemosyne_backend=host", "MNEMOSYNE_BAKEND=1",
           "MNEMOSYNE_TEST_X=1", "NOEQUALS", "SLURM_LOCALID=3"});
  Env bad({"MNEMOSYNE_BACKEND=cuda", "MNEMOSYNE_DEVICE=1024", "MNEMOSYNE_DEVICE=local-rank",
           "MNEMOSYNE_SIZE=1M:64M", "MNEMOSYNE_ARENA_SIZE=12Q", "MNEMOSYNE_LIMIT=1G",
           "MNEMOSYNE_FALLBACK=fail", "MNEMOSYNE_STATS_FILE=/tmp/" + long_value,
           "MNEMOSYNE_PROGRAMS=[x,,y"});
  Env local({"MNEMOSYNE_DEVICE=local-rank"});
  Options a, b, c, d;
  char path[64];
  std::size_t lo = 0, hi = 0, sz = 0;
  bool flag = false;

#if defined(_WIN32)
  // The hook sees allocations, also those the C++ runtime makes inside
  // (operator new).
  void* (*volatile make)(std::size_t) = &::operator new;
  start_counting();
  void* made = make(64);
  const long hook_allocations = stop_counting();
  ::operator delete(made);
#else
  // The hook sees allocations, also those glibc makes inside (strdup).
  char* (*volatile dup)(const char*) = strdup;
  start_counting();
  char* copy = dup("hook check");
  const long hook_allocations = stop_counting();
  std::free(copy);
#endif
  ASSERT_GE(hook_allocations, 1) << "the counting malloc is not in use";

  g_quiet_lines = 0;
  start_counting();
  read_options(env.envp(), false, &a, count_lines);
  read_options(env.envp(), true, &b, count_lines);
  read_options(bad.envp(), false, &c, count_lines);
  read_options(local.envp(), false, &d, count_lines);
  const int rank = local_rank(env.envp());
  const bool expanded = expand_stats_path("/tmp/s.%p.%%.json", 99, path, sizeof path);
  const bool parsed = parse_size("256MiB", &sz) && parse_size_range("4K:1G", &lo, &hi) &&
                      parse_bool("on", &flag) && !parse_size("1.5G", &sz) &&
                      program_matches("a*,python3*", "/usr/bin/python3.11", false) &&
                      !program_matches("[a-c]?", "dz", true);
  std::size_t count = 0;
  const OptionInfo* table = option_table(&count);
  const long allocations = stop_counting();

  EXPECT_EQ(allocations, 0);
  EXPECT_GE(g_quiet_lines, 12) << "the warning paths ran";
  EXPECT_EQ(a.backend, BackendId::pinned);
  EXPECT_TRUE(a.device_local_rank);
  EXPECT_EQ(d.device_local_rank, false);
  EXPECT_EQ(c.size_max, 64 * MiB);
  EXPECT_EQ(rank, 3);
  EXPECT_TRUE(expanded);
  EXPECT_STREQ(path, "/tmp/s.99.%.json");
  EXPECT_TRUE(parsed);
  EXPECT_NE(table, nullptr);
#endif
}

}  // namespace
}  // namespace mnemosyne::config
