// Messages and argument splitting shared by the subcommands.
#include <cstdio>
#include <string>
#include <string_view>

#include "cli/cli.hpp"

namespace mnemosyne::cli {

int usage_error(std::string_view command, const std::string& message) {
  const std::string who = command.empty() ? "mnemosyne" : "mnemosyne " + std::string(command);
  std::fprintf(stderr, "%s: %s; see '%s --help'\n", who.c_str(), message.c_str(), who.c_str());
  return kExitUsage;
}

void print_error(std::string_view command, const std::string& message) {
  const std::string who = command.empty() ? "mnemosyne" : "mnemosyne " + std::string(command);
  std::fprintf(stderr, "%s: %s\n", who.c_str(), message.c_str());
}

void split_option(std::string_view arg, std::string_view* name, std::string_view* value,
                  bool* has_value) {
  const std::size_t eq = arg.find('=');
  *has_value = eq != std::string_view::npos;
  *name = arg.substr(0, eq);
  *value = *has_value ? arg.substr(eq + 1) : std::string_view();
}

}  // namespace mnemosyne::cli
