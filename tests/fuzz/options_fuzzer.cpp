// libFuzzer harness: the option parser (src/config) with arbitrary
// environments. Each line of the input is one environment entry; a line
// without '=' becomes MNEMOSYNE_<a name from the option table>=<the line>, so
// every parser is reached. Checks: no crash, no read past a string, warnings
// are single lines of bounded length, and the options read are within their
// documented ranges.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "config/options.hpp"

namespace {

using namespace mnemosyne;

[[noreturn]] void fail(const char* what, const char* detail = "") {
  std::fprintf(stderr, "options_fuzzer: %s %s\n", what, detail);
  std::abort();
}

void check_warning(const char* line) {
  const std::size_t n = std::strlen(line);
  if (n == 0 || n > 1024) fail("a warning of unexpected length:", line);
  if (std::strchr(line, '\n') != nullptr) fail("a warning spans lines:", line);
  if (std::strncmp(line, "mnemosyne: ", 11) != 0) fail("a warning without the prefix:", line);
}

bool terminated(const char* s, std::size_t size) {
  return std::memchr(s, '\0', size) != nullptr;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::size_t count = 0;
  const config::OptionInfo* table = config::option_table(&count);
  const bool secure = (data[0] & 1) != 0;
  std::vector<std::string> entries;
  std::string line;
  for (std::size_t i = 1; i <= size; ++i) {
    if (i == size || data[i] == '\n') {
      if (line.find('=') == std::string::npos && !line.empty()) {
        const auto pick = static_cast<unsigned char>(line[0]) % count;
        line = std::string("MNEMOSYNE_") + table[pick].name + "=" + line.substr(1);
      }
      entries.push_back(line);
      line.clear();
    } else {
      line.push_back(static_cast<char>(data[i]));  // NUL bytes cut an entry short, as in C
    }
  }
  std::vector<char*> envp;
  for (std::string& e : entries) envp.push_back(e.data());
  envp.push_back(nullptr);

  config::Options o;
  config::read_options(envp.data(), secure, &o, &check_warning);
  if (o.arena_size < (std::size_t{32} << 20)) fail("ARENA_SIZE below its minimum");
  if (o.size_min > o.size_max) fail("SIZE with min above max");
  if (o.device < 0) fail("a negative DEVICE");
  if (static_cast<int>(o.backend) >= kBackendCount || o.backend == BackendId::none) {
    fail("a BACKEND outside the table");
  }
  if (!terminated(o.stats_file, sizeof o.stats_file) ||
      !terminated(o.cuda_driver, sizeof o.cuda_driver) ||
      !terminated(o.programs, sizeof o.programs)) {
    fail("a path option is not terminated");
  }
  if (o.programs[0] != '\0' && !config::parse_program_list(o.programs)) {
    fail("a malformed PROGRAMS list was kept:", o.programs);
  }
  if (secure && (o.stats_file[0] != '\0' || o.cuda_driver[0] != '\0')) {
    fail("a path option was taken in a set-uid program");
  }

  // The parsers on their own, and the stats path pattern.
  for (const std::string& e : entries) {
    const std::size_t eq = e.find('=');
    const char* value = e.c_str() + (eq == std::string::npos ? 0 : eq + 1);
    bool b = false;
    std::size_t n = 0;
    std::size_t lo = 0;
    std::size_t hi = 0;
    config::parse_bool(value, &b);
    config::parse_size(value, &n);
    if (config::parse_size_range(value, &lo, &hi) && lo > hi) fail("a range with min > max", value);
    char path[64];
    if (config::expand_stats_path(value, 12345, path, sizeof path) &&
        !terminated(path, sizeof path)) {
      fail("an expanded path is not terminated");
    }
    // The glob matcher over the other entries as names (a pattern only
    // once parse_program_list accepts it, as the library does).
    if (config::parse_program_list(value)) {
      for (std::size_t k = 0; k < entries.size() && k < 8; ++k) {
        config::program_matches(value, entries[k].c_str(), false);
        config::program_matches(value, entries[k].c_str(), true);
      }
      if (!config::program_matches(value, value, false) &&
          std::strpbrk(value, "*?[/,") == nullptr) {
        fail("a plain name does not match itself:", value);
      }
    }
  }
  config::local_rank(envp.data());
  return 0;
}
