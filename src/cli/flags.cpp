// `mnemosyne run`'s flags, derived from config::option_table() (flags.hpp).
#include "cli/flags.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstddef>

#include "backend/backend_id.hpp"

namespace mnemosyne::cli {
namespace {

// Paths as the OS spells them: the injector (interpose/windows) uses these
// flags on Windows.
#if defined(_WIN32)
constexpr const char* kSeparators = "/\\";
constexpr const char* kDriverFile = "nvcuda.dll";
bool is_absolute(const std::string& p) {
  return (p.size() > 1 && p[1] == ':') || (!p.empty() && (p[0] == '\\' || p[0] == '/'));
}
#else
constexpr const char* kSeparators = "/";
constexpr const char* kDriverFile = "libcuda.so.1";
bool is_absolute(const std::string& p) {
  return !p.empty() && p[0] == '/';
}
#endif

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Flag names that differ from the variable's name.
std::string flag_name(std::string_view option) {
  if (option == "SHOW_STATS") return "--stats";
  std::string name = "--" + lower(option);
  for (char& c : name) {
    if (c == '_') c = '-';
  }
  return name;
}

std::string metavar_of(const config::OptionInfo& info) {
  const std::string_view name = info.name;
  if (name == "BACKEND") return "NAME";
  if (name == "DEVICE") return "N|local-rank";
  if (name == "FALLBACK") return "host|fail";
  if (name == "CONTEXT") return "primary|own";
  if (name == "ZEROED") return "auto|yes|no";
  if (name == "PIN") return "arena|granule|vmm";
  switch (info.type) {
    case config::Type::boolean:
      return "";
    case config::Type::size:
      return "SIZE";
    case config::Type::size_range:
      return "MIN[:MAX]";
    case config::Type::path:
      return "PATH";
    case config::Type::program_list:
      return "NAME[,NAME...]";
    case config::Type::word:
      return "KEY";
    case config::Type::milliseconds:
      return "MS";
    case config::Type::integer_or_word:
    case config::Type::choice:
      break;
  }
  return "VALUE";
}

std::string syntax_of(const config::OptionInfo& info) {
  const std::string_view name = info.name;
  if (name == "BACKEND") return "a backend: " + backend_list();
  if (name == "DEVICE") return "a device ordinal (0, 1, ...) or local-rank";
  if (name == "FALLBACK") return "host or fail";
  if (name == "CONTEXT") return "primary or own";
  if (name == "ZEROED") return "auto, yes or no";
  if (name == "PIN") return "arena, granule or vmm";
  switch (info.type) {
    case config::Type::boolean:
      return "a boolean: 1/0, true/false, yes/no, on/off";
    case config::Type::size:
      return "a size: bytes with an optional K, M, G or T suffix (1024-based), like 64K, 256MiB, "
             "1G";
    case config::Type::size_range:
      return "a size range MIN[:MAX] with MIN <= MAX, like 1M:64M, 4K (MIN only), :1G (MAX only)";
    case config::Type::path:
      return "a path";
    case config::Type::program_list:
      return "a comma-separated list of program names or globs (*, ?, [a-z]), like "
             "python3,train*.py";
    case config::Type::word:
      return "a key, as mnemosyne writes it";
    case config::Type::milliseconds:
      return "a whole number of milliseconds, 0 to 2147483647";
    case config::Type::integer_or_word:
    case config::Type::choice:
      break;
  }
  return "a value";
}

// The line read_options() warned with, if any.
std::string g_library_warning;
void keep_warning(const char* line) {
  if (g_library_warning.empty()) g_library_warning = line;
}

// Runs the library's reader on MNEMOSYNE_<NAME>=value alone; empty when it
// accepts the value, else its complaint as one clause.
std::string library_complaint(const Flag& flag, const std::string& value) {
  std::string entry = flag.env + "=" + value;
  char* envp[] = {entry.data(), nullptr};
  config::Options options;
  g_library_warning.clear();
  config::read_options(envp, false, &options, keep_warning);
  std::string line = g_library_warning;
  if (line.empty()) return line;
  if (line.rfind("mnemosyne: ", 0) == 0) line.erase(0, 11);
  if (const std::size_t cut = line.find("; using "); cut != std::string::npos) line.erase(cut);
  // "MNEMOSYNE_X=v is ..." reads better as "--x=v is ..." here.
  if (line.rfind(entry, 0) == 0) line.replace(0, entry.size(), flag.name + "=" + value);
  return line;
}

bool is_directory(std::string path) {
#if defined(_WIN32)
  // The C runtime's stat() refuses a trailing separator, except on "C:\".
  while (path.size() > 3 && (path.back() == '\\' || path.back() == '/')) path.pop_back();
#endif
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

std::string backend_list() {
  std::string names;
  for (const BackendRow& row : kBackends) {  // the driver's first, host last
    if (!names.empty()) names += ", ";
    names += row.name;
  }
  return names;
}

const std::vector<Flag>& run_flags() {
  static const std::vector<Flag> flags = [] {
    std::vector<Flag> out;
    std::size_t count = 0;
    const config::OptionInfo* table = config::option_table(&count);
    for (std::size_t i = 0; i < count; ++i) {
      const config::OptionInfo& info = table[i];
      out.push_back({&info, flag_name(info.name), std::string("MNEMOSYNE_") + info.name,
                     metavar_of(info), syntax_of(info)});
    }
    return out;
  }();
  return flags;
}

const Flag* find_flag(std::string_view name) {
  for (const Flag& f : run_flags()) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::string flag_example(const Flag& flag) {
  std::string_view example = flag.info->example;
  const std::size_t eq = example.find('=');
  const std::string_view value = eq == std::string_view::npos ? "" : example.substr(eq + 1);
  if (flag.info->type == config::Type::boolean) {
    bool on = false;
    const std::string v(value);
    if (config::parse_bool(v.c_str(), &on) && on) return flag.name;
  }
  return flag.name + "=" + std::string(value);
}

bool check_flag_value(const Flag& flag, const std::string& value, std::string* exported,
                      std::string* why) {
  const std::string shown = flag.name + "=" + value;
  auto reject = [&](const std::string& what) {
    *why = shown + " is not " + what;
    return false;
  };
  std::string out = value;
  switch (flag.info->type) {
    case config::Type::boolean: {
      bool on = false;
      if (!config::parse_bool(value.c_str(), &on)) return reject(flag.syntax);
      out.assign(1, on ? '1' : '0');
      break;
    }
    case config::Type::size: {
      std::size_t size = 0;
      if (!config::parse_size(value.c_str(), &size)) return reject(flag.syntax);
      break;
    }
    case config::Type::size_range: {
      std::size_t min = 0;
      std::size_t max = 0;
      if (!config::parse_size_range(value.c_str(), &min, &max)) return reject(flag.syntax);
      break;
    }
    case config::Type::choice:
      if (std::string_view(flag.info->name) == "BACKEND") {
        BackendId id = BackendId::none;
        if (!parse_backend_name(lower(value), &id)) return reject(flag.syntax);
      }
      break;
    case config::Type::program_list:
    case config::Type::word:
    case config::Type::milliseconds:
      break;  // the library's own reader checks it below
    case config::Type::integer_or_word:
      // DEVICE=local-rank is resolved in COMMAND's environment (an MPI or
      // Slurm launcher above this one sets the rank variables).
      if (lower(value) == "local-rank") {
        *exported = value;
        return true;
      }
      break;
    case config::Type::path: {
      if (value.empty()) {
        *why = flag.name + " needs a path";
        return false;
      }
      const std::string_view name = flag.info->name;
      if (name == "CUDA_DRIVER" && value.find_first_of(kSeparators) != std::string::npos &&
          access(value.c_str(), F_OK) != 0) {
        *why = shown + ": no such file (give the path of " + std::string(kDriverFile) +
               ", or a name the dynamic linker finds)";
        return false;
      }
      if (name == "STATS_FILE") {
        // Absolute, so a COMMAND that changes directory writes it here.
        if (!is_absolute(value)) {
          char cwd[4096];
          if (getcwd(cwd, sizeof cwd) != nullptr) out = std::string(cwd) + "/" + value;
        }
        const std::size_t slash = value.find_last_of(kSeparators);
        const std::string dir = slash == std::string::npos ? "." : value.substr(0, slash + 1);
        if (dir.find('%') == std::string::npos && !is_directory(dir)) {
          *why = shown + ": the directory " + dir + " does not exist";
          return false;
        }
        if (is_directory(value)) {
          *why = shown + " is a directory; give a file name (%p becomes the process id)";
          return false;
        }
      }
      break;
    }
  }
  if (std::string complaint = library_complaint(flag, out); !complaint.empty()) {
    *why = complaint;
    return false;
  }
  *exported = out;
  return true;
}

}  // namespace mnemosyne::cli
