// `mnemosyne stats [--plot OUT.png] FILE...`: statistics files
// ("mnemosyne-stats/1", docs/stats-schema.md) as tables, and as a bar chart
// drawn by plot_stats.py with /usr/bin/python3 and matplotlib.
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli.hpp"

namespace mnemosyne::cli {
namespace {

using Json = nlohmann::ordered_json;  // ordered: pools in the file's order

constexpr std::string_view kCommand = "stats";
// A statistics file is a few KiB: anything far larger is not one, and is not
// read into memory whole.
constexpr std::uintmax_t kMaxFileBytes = std::uintmax_t{16} << 20;
// JSON nested deeper than this is not a statistics file (which nests 3 deep).
constexpr int kMaxDepth = 32;
constexpr std::string_view kSchema = "mnemosyne-stats/1";
constexpr const char* kPython = "/usr/bin/python3";
// plot_stats.py's exit status when matplotlib cannot be imported.
constexpr int kExitNoMatplotlib = 3;

// The pool counters, in table order. `label` heads the column.
struct Counter {
  const char* key;
  const char* label;
  bool real;  // driver_ms: a decimal number
};
constexpr Counter kCounters[] = {
    {"allocations", "allocations", false},
    {"frees", "frees", false},
    {"bytes_requested", "requested", false},
    {"bytes_live", "live", false},
    {"bytes_peak", "peak", false},
    {"segments", "segments", false},
    // What the pool took from the driver (backed), at exit and at its peak:
    // the memory a user pays. Reserved is address space, most never backed.
    {"bytes_backed", "memory", false},
    {"bytes_backed_peak", "memory_peak", false},
    {"bytes_reserved", "reserved_va", false},
    {"driver_calls", "drv_calls", false},
    {"driver_failures", "drv_failures", false},
    {"driver_ms", "drv_ms", true},
};
constexpr std::size_t kCounterCount = sizeof kCounters / sizeof kCounters[0];

struct Pool {
  std::string name;
  std::uint64_t n[kCounterCount] = {};
  bool present[kCounterCount] = {};
  double ms = 0;
};

struct StatsFile {
  std::string path;
  std::string program;
  std::int64_t pid = -1;
  std::string requested_backend;
  std::string active_backend;
  std::int64_t device = -1;
  bool counting = true;
  bool counting_known = false;
  std::uint64_t fallbacks = 0;
  bool fallbacks_known = false;
  std::string fallback_reason;
  std::vector<Pool> pools;
};

std::string read_whole(const std::string& path, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = path + ": cannot open: " + strerror(errno);
    return {};
  }
  std::string text;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
    text.append(chunk, static_cast<std::size_t>(in.gcount()));
    if (text.size() > kMaxFileBytes) {
      *error = path + ": not a mnemosyne statistics file (larger than " +
               std::to_string(kMaxFileBytes >> 20) + " MiB)";
      return {};
    }
  }
  if (in.bad()) {
    *error = path + ": cannot read: " + strerror(errno);
    return {};
  }
  return text;
}

const Json* member(const Json& obj, const char* key) {
  const auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

std::string string_member(const Json& obj, const char* key) {
  const Json* v = member(obj, key);
  return v != nullptr && v->is_string() ? v->get<std::string>() : std::string();
}

// A non-negative integer that fits in 64 bits (JSON numbers with a fraction
// or an exponent, and negative ones, are not).
std::optional<std::uint64_t> as_u64(const Json& v) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0) return v.get<std::uint64_t>();
  return std::nullopt;
}

std::optional<std::int64_t> as_i64(const Json& v) {
  if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<std::int64_t>();
  if (v.is_number_unsigned() && v.get<std::uint64_t>() <= INT64_MAX) return v.get<std::int64_t>();
  return std::nullopt;
}

struct TooDeep {};

// The parser's message quotes what it read last, which may be any bytes of
// the file: control and non-ASCII bytes become \xNN, and it is cut short, so
// the error stays one readable line.
std::string printable(std::string_view text) {
  constexpr std::size_t kMax = 200;
  std::string out;
  for (const char ch : text) {
    if (out.size() >= kMax) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f) {
      out += ch;
    } else {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  return out;
}

// Parses `text`; on error *error says where and what, in one line.
// nlohmann's message without its "[json.exception.parse_error.101] parse
// error " prefix: "at line 1, column 2: syntax error ...".
std::string parser_message(const std::exception& e) {
  std::string what = e.what();
  if (what.rfind("[json.exception.", 0) == 0) {
    if (const std::size_t end = what.find("] "); end != std::string::npos) what.erase(0, end + 2);
  }
  if (what.rfind("parse error ", 0) == 0) what.erase(0, 12);
  return printable(what);
}

// Parses `text`; on error *error says where and what, in one line.
std::optional<Json> parse(const std::string& path, const std::string& text, std::string* error) {
  try {
    return Json::parse(text, [](int depth, Json::parse_event_t, Json&) {
      if (depth > kMaxDepth) throw TooDeep{};
      return true;
    });
  } catch (const TooDeep&) {
    *error = path + ": not a mnemosyne statistics file (nested deeper than " +
             std::to_string(kMaxDepth) + " levels)";
  } catch (const std::exception& e) {
    *error = path + ": not valid JSON (" + parser_message(e) + ")";
  }
  return std::nullopt;
}

// Loads and checks one file; false with *error set to one line.
bool load(const std::string& path, StatsFile* out, std::string* error) {
  std::string read_error;
  const std::string text = read_whole(path, &read_error);
  if (!read_error.empty()) {
    *error = read_error;
    return false;
  }
  const std::optional<Json> parsed = parse(path, text, error);
  if (!parsed) return false;
  const Json& doc = *parsed;
  if (!doc.is_object()) {
    *error = path + ": not a mnemosyne statistics file (the JSON is not an object)";
    return false;
  }
  const Json* schema = member(doc, "schema");
  if (schema == nullptr || !schema->is_string()) {
    *error = path + ": not a mnemosyne statistics file (no \"schema\" string; expected \"" +
             std::string(kSchema) + "\")";
    return false;
  }
  if (schema->get<std::string>() != kSchema) {
    *error = path + ": schema " + schema->dump(-1, ' ', false, Json::error_handler_t::replace) +
             " is not supported; this mnemosyne reads \"" + std::string(kSchema) +
             "\" (use the mnemosyne that wrote the file)";
    return false;
  }
  const Json* pools = member(doc, "pools");
  if (pools == nullptr || !pools->is_object()) {
    *error = path + ": \"pools\" is missing or not an object";
    return false;
  }

  out->path = path;
  out->program = string_member(doc, "program");
  out->requested_backend = string_member(doc, "requested_backend");
  out->active_backend = string_member(doc, "active_backend");
  if (const Json* v = member(doc, "pid"); v != nullptr && as_i64(*v)) out->pid = *as_i64(*v);
  if (const Json* v = member(doc, "device"); v != nullptr && as_i64(*v)) {
    out->device = *as_i64(*v);
  }
  if (const Json* v = member(doc, "counting"); v != nullptr && v->is_boolean()) {
    out->counting = v->get<bool>();
    out->counting_known = true;
  }
  if (const Json* f = member(doc, "fallbacks"); f != nullptr && f->is_object()) {
    if (const Json* c = member(*f, "count"); c != nullptr && as_u64(*c)) {
      out->fallbacks = *as_u64(*c);
      out->fallbacks_known = true;
    }
    out->fallback_reason = string_member(*f, "reason");
  }

  for (const auto& [name, obj] : pools->items()) {
    Pool pool;
    pool.name = name;
    if (!obj.is_object()) {
      *error = path + ": pools." + pool.name + " is not an object";
      return false;
    }
    for (std::size_t c = 0; c < kCounterCount; ++c) {
      const Json* v = member(obj, kCounters[c].key);
      if (v == nullptr) continue;  // shown as "-"
      if (kCounters[c].real) {
        const std::optional<double> d =
            v->is_number() ? std::optional<double>(v->get<double>()) : std::nullopt;
        if (!d || !(*d >= 0)) {
          *error = path + ": pools." + pool.name + "." + kCounters[c].key +
                   " is not a non-negative number";
          return false;
        }
        pool.ms = *d;
      } else {
        const std::optional<std::uint64_t> n = as_u64(*v);
        if (!n) {
          *error = path + ": pools." + pool.name + "." + kCounters[c].key +
                   " is not a non-negative integer";
          return false;
        }
        pool.n[c] = *n;
      }
      pool.present[c] = true;
    }
    out->pools.push_back(std::move(pool));
  }
  return true;
}

std::string cell(const Pool& pool, std::size_t c) {
  if (!pool.present[c]) return "-";
  if (kCounters[c].real) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3f", pool.ms);
    return buf;
  }
  return std::to_string(pool.n[c]);
}

void print_table(const StatsFile& f) {
  std::string head = f.path + ":";
  if (!f.program.empty()) head += " " + f.program;
  if (f.pid >= 0) head += " (pid " + std::to_string(f.pid) + ")";
  if (!f.requested_backend.empty()) {
    head += ", backend " + f.requested_backend;
    if (!f.active_backend.empty() && f.active_backend != f.requested_backend) {
      head += " (active: " + f.active_backend + ")";
    }
  }
  if (f.device >= 0) head += ", device " + std::to_string(f.device);
  std::printf("%s\n", head.c_str());

  std::vector<Pool> rows = f.pools;
  if (rows.size() > 1) {
    Pool total;
    total.name = "total";
    for (const Pool& p : f.pools) {
      for (std::size_t c = 0; c < kCounterCount; ++c) {
        total.n[c] += p.n[c];
        total.present[c] = total.present[c] || p.present[c];
      }
      total.ms += p.ms;
    }
    rows.push_back(total);
  }

  std::size_t widths[kCounterCount + 1];
  widths[0] = 4;  // "pool"
  for (std::size_t c = 0; c < kCounterCount; ++c) widths[c + 1] = strlen(kCounters[c].label);
  for (const Pool& p : rows) {
    widths[0] = std::max(widths[0], p.name.size());
    for (std::size_t c = 0; c < kCounterCount; ++c) {
      widths[c + 1] = std::max(widths[c + 1], cell(p, c).size());
    }
  }
  std::string line = "  " + std::string("pool") + std::string(widths[0] - 4, ' ');
  for (std::size_t c = 0; c < kCounterCount; ++c) {
    const std::string label = kCounters[c].label;
    line += "  " + std::string(widths[c + 1] - label.size(), ' ') + label;
  }
  std::printf("%s\n", line.c_str());
  for (const Pool& p : rows) {
    line = "  " + p.name + std::string(widths[0] - p.name.size(), ' ');
    for (std::size_t c = 0; c < kCounterCount; ++c) {
      const std::string v = cell(p, c);
      line += "  " + std::string(widths[c + 1] - v.size(), ' ') + v;
    }
    std::printf("%s\n", line.c_str());
  }
  if (rows.empty()) {
    std::printf("  (no pool served or reserved anything)\n");
  } else {
    std::printf(
        "  memory: bytes the backend took from the driver (at exit; memory_peak: the most at "
        "once); reserved_va: address space, not memory\n");
  }
  std::string fallbacks = "  fallbacks to the system allocator: ";
  fallbacks += f.fallbacks_known ? std::to_string(f.fallbacks) : "-";
  if (!f.fallback_reason.empty()) fallbacks += " (first reason: " + f.fallback_reason + ")";
  std::printf("%s\n", fallbacks.c_str());
  if (f.counting_known && !f.counting) {
    std::printf(
        "  counting was off in this run: allocations, frees and requested/live/peak bytes are "
        "0 (set --stats or --stats-file at start to count them)\n");
  }
}

// The chart's data, as plot_stats.py reads it on stdin.
std::string plot_input(const std::vector<StatsFile>& files, const std::string& output) {
  Json doc = {{"output", output}, {"files", Json::array()}};
  for (const StatsFile& f : files) {
    std::string label = f.path;
    if (const std::size_t slash = label.rfind('/'); slash != std::string::npos) {
      label.erase(0, slash + 1);
    }
    Json pools = Json::array();
    for (const Pool& p : f.pools) {
      Json pool = {{"name", p.name}};
      for (std::size_t c = 0; c < kCounterCount; ++c) {
        if (kCounters[c].real) {
          pool[kCounters[c].key] = p.ms;
        } else {
          pool[kCounters[c].key] = p.n[c];
        }
      }
      pools.push_back(std::move(pool));
    }
    doc["files"].push_back({{"label", label}, {"pools", std::move(pools)}});
  }
  return doc.dump(-1, ' ', false, Json::error_handler_t::replace);
}

bool write_all(int fd, const std::string& data) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

// Runs /usr/bin/python3 plot_stats.py with the data on stdin; 0 on success.
int plot(const std::vector<StatsFile>& files, const std::string& output) {
  const Located script = find_plot_script();
  if (script.path.empty()) {
    print_error(kCommand,
                "plot_stats.py not found (looked at " + script.tried + "); reinstall mnemosyne");
    return 1;
  }
  if (access(kPython, X_OK) != 0) {
    print_error(kCommand, std::string("--plot needs ") + kPython +
                              " with matplotlib; install the Debian package python3-matplotlib");
    return 1;
  }
  int fds[2];
  if (pipe(fds) != 0) {
    print_error(kCommand, std::string("cannot create a pipe: ") + strerror(errno));
    return 1;
  }
  const pid_t pid = fork();
  if (pid < 0) {
    print_error(kCommand, std::string("cannot fork: ") + strerror(errno));
    return 1;
  }
  if (pid == 0) {
    dup2(fds[0], STDIN_FILENO);
    close(fds[0]);
    close(fds[1]);
    execl(kPython, kPython, script.path.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[0]);
  // A script that exits early must not kill the launcher with SIGPIPE.
  struct sigaction ignore = {};
  struct sigaction old = {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &old);
  write_all(fds[1], plot_input(files, output));
  close(fds[1]);
  sigaction(SIGPIPE, &old, nullptr);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    std::printf("chart written to %s\n", output.c_str());
    return 0;
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == kExitNoMatplotlib) {
    return 1;  // the script said which package to install
  }
  print_error(kCommand, "the chart could not be drawn (" + script.path + " failed, see above)");
  return 1;
}

}  // namespace

int stats_command(int argc, char** argv) {
  std::vector<std::string> paths;
  std::string plot_path;
  bool options_done = false;
  for (int i = 0; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (options_done || arg.size() < 2 || arg[0] != '-') {
      paths.emplace_back(arg);
      continue;
    }
    if (arg == "--") {
      options_done = true;
      continue;
    }
    if (help_or_version(kCommand, arg)) return 0;
    std::string_view name;
    std::string_view value;
    bool has_value = false;
    split_option(arg, &name, &value, &has_value);
    if (name != "--plot")
      return usage_error(kCommand, "unknown option '" + std::string(name) + "'");
    plot_path = value;
    if (!has_value) {
      if (i + 1 >= argc) return usage_error(kCommand, "--plot needs an output file (OUT.png)");
      plot_path = argv[++i];
    }
    if (plot_path.empty()) return usage_error(kCommand, "--plot needs an output file (OUT.png)");
  }
  if (paths.empty()) {
    return usage_error(kCommand, "no FILE given: write mnemosyne stats FILE... [--plot OUT.png]");
  }

  std::vector<StatsFile> files;
  std::vector<std::string> errors;
  for (const std::string& path : paths) {
    StatsFile f;
    std::string error;
    if (load(path, &f, &error)) {
      files.push_back(std::move(f));
    } else {
      errors.push_back(error);
    }
  }
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (i > 0) std::printf("\n");
    print_table(files[i]);
  }
  std::fflush(stdout);
  for (const std::string& e : errors) print_error(kCommand, e);
  if (!errors.empty()) {
    if (!plot_path.empty()) print_error(kCommand, "no chart drawn: a file could not be read");
    return 1;
  }
  if (!plot_path.empty()) return plot(files, plot_path);
  return 0;
}

}  // namespace mnemosyne::cli
