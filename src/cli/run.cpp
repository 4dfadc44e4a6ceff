// `mnemosyne run [OPTIONS] [--] COMMAND [ARGS...]`: checks the options,
// exports them as MNEMOSYNE_* variables, prepends libmnemosyne.so to
// LD_PRELOAD and execs COMMAND.
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include "cli/cli.hpp"
#include "cli/flags.hpp"

namespace mnemosyne::cli {
namespace {

constexpr std::string_view kCommand = "run";
constexpr int kExitNoLibrary = 125;
constexpr int kExitCannotExecute = 126;
constexpr int kExitNotFound = 127;

bool is_directory(const char* path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

// Reports why execvp(command) failed and returns the shell's status for it.
int exec_failed(const char* command, int err) {
  const bool has_slash = strchr(command, '/') != nullptr;
  const std::string quoted = std::string("'") + command + "'";
  if (err == ENOENT || err == ENOTDIR) {
    print_error(kCommand, has_slash ? quoted + ": no such file; check the path"
                                    : quoted +
                                          ": command not found in PATH; check its name or give "
                                          "its path (./" +
                                          command + ")");
    return kExitNotFound;
  }
  if (err == EACCES && is_directory(command)) {
    print_error(kCommand, quoted + " is a directory, not a program");
  } else if (err == EACCES || err == EPERM) {
    print_error(kCommand, quoted +
                              ": permission denied; make it executable (chmod +x) or run it "
                              "through its interpreter");
  } else {
    print_error(kCommand, quoted + ": cannot execute: " + strerror(err));
  }
  return kExitCannotExecute;
}

}  // namespace

int run_command(int argc, char** argv) {
  std::vector<std::pair<std::string, std::string>> exports;  // name, value
  int i = 0;
  for (; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (help_or_version(kCommand, arg)) return 0;
    if (arg.size() < 2 || arg[0] != '-') break;  // COMMAND starts here ("-" too)
    if (arg[1] != '-') {
      return usage_error(kCommand, "unknown option '" + std::string(arg) +
                                       "' (options are long: --backend, --device, ...)");
    }
    std::string_view name;
    std::string_view inline_value;
    bool has_value = false;
    split_option(arg, &name, &inline_value, &has_value);
    const Flag* flag = find_flag(name);
    if (flag == nullptr) {
      return usage_error(kCommand, "unknown option '" + std::string(name) + "'");
    }
    std::string value(inline_value);
    if (!has_value && !flag->metavar.empty()) {
      if (i + 1 >= argc || std::string_view(argv[i + 1]) == "--") {
        return usage_error(kCommand, flag->name + " needs a value: " + flag->syntax);
      }
      value = argv[++i];
    }
    std::string exported;
    std::string why;
    if (!check_flag_value(*flag, value, &exported, &why)) return usage_error(kCommand, why);
    exports.emplace_back(flag->env, exported);
  }
  if (i >= argc) {
    return usage_error(kCommand,
                       "no COMMAND given: write mnemosyne run [OPTIONS] -- COMMAND [ARGS...]");
  }

  const Located lib = find_preload_library();
  if (lib.path.empty()) {
    print_error(kCommand, "libmnemosyne.so not found (looked at " + lib.tried +
                              "); build it (ninja -C <build>) or reinstall mnemosyne");
    return kExitNoLibrary;
  }
  if (lib.path.find_first_of(" :\t\n") != std::string::npos) {
    print_error(kCommand, "the library path '" + lib.path +
                              "' contains a space or ':', which LD_PRELOAD cannot name; "
                              "install mnemosyne under another prefix");
    return kExitNoLibrary;
  }

  std::string preload = lib.path;
  if (const char* old = getenv("LD_PRELOAD"); old != nullptr && old[0] != '\0') {
    preload += ":";
    preload += old;
  }
  for (const auto& [name, value] : exports) setenv(name.c_str(), value.c_str(), 1);
  setenv("LD_PRELOAD", preload.c_str(), 1);

  execvp(argv[i], argv + i);
  return exec_failed(argv[i], errno);
}

}  // namespace mnemosyne::cli
