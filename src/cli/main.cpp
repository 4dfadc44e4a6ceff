// mnemosyne: run a command with its heap in GPU-reachable memory, report what
// the CUDA driver and devices offer, summarize a run's statistics.
// This file only dispatches; each subcommand lives in its own file.
#include <cstdio>
#include <string>
#include <string_view>

#include "cli/cli.hpp"

int main(int argc, char** argv) {
  using namespace mnemosyne::cli;
  if (argc < 2) {
    return usage_error("", "no command given (run, info, stats or help)");
  }
  const std::string_view cmd = argv[1];
  if (cmd == "run") return run_command(argc - 2, argv + 2);
  if (cmd == "info") return info_command(argc - 2, argv + 2);
  if (cmd == "stats") return stats_command(argc - 2, argv + 2);
  if (cmd == "-h" || cmd == "--help") {
    print_help("");
    return 0;
  }
  if (cmd == "help") {
    if (argc < 3) {
      print_help("");
      return 0;
    }
    if (print_help(argv[2])) return 0;
    return usage_error(
        "", "no help for '" + std::string(argv[2]) + "': commands are run, info and stats");
  }
  if (cmd == "--version") {
    print_version();
    return 0;
  }
  if (cmd.size() > 1 && cmd[0] == '-') {
    return usage_error("", "unknown option '" + std::string(cmd) + "'");
  }
  return usage_error("", "unknown command '" + std::string(cmd) +
                             "' (commands are run, info, "
                             "stats and help)");
}
