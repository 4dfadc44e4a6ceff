// The mnemosyne launcher: what the subcommands share.
#pragma once

#include <string>
#include <string_view>

namespace mnemosyne::cli {

inline constexpr int kExitUsage = 2;

// Subcommands; argv[0] is the first argument after the subcommand's name.
int run_command(int argc, char** argv);
int info_command(int argc, char** argv);
int stats_command(int argc, char** argv);

// Help and version (help.cpp). `command` is "" for the top level, else
// "run", "info" or "stats"; false when there is no such command.
bool print_help(std::string_view command);
void print_version();
// Handles -h/--help and --version, which every subcommand takes: prints
// them and returns true (the caller exits 0); false for any other argument.
bool help_or_version(std::string_view command, std::string_view arg);

// "mnemosyne[ CMD]: MESSAGE; see 'mnemosyne[ CMD] --help'" on stderr; returns
// kExitUsage.
int usage_error(std::string_view command, const std::string& message);
// "mnemosyne[ CMD]: MESSAGE" on stderr.
void print_error(std::string_view command, const std::string& message);

// Splits "--name=value" into name "--name" and value; *has_value tells
// whether there was an '='.
void split_option(std::string_view arg, std::string_view* name, std::string_view* value,
                  bool* has_value);

// Where the launcher's companions are (paths.cpp), found from the launcher's
// own location: in a build tree (a build.ninja two levels up) the build's
// interpose/ and the launcher's own directory; installed, <prefix>/<libdir>
// and <prefix>/<datadir>/mnemosyne, where <prefix> is the launcher's
// directory less <bindir>, all three as meson was configured
// (MNEMOSYNE_BINDIR, MNEMOSYNE_LIBDIR, MNEMOSYNE_DATADIR).
struct Located {
  std::string path;   // empty when not found
  std::string tried;  // the candidates looked at, for messages
};
std::string launcher_directory();  // empty when /proc/self/exe cannot be read
bool in_build_tree();
Located find_preload_library();
Located find_plot_script();

}  // namespace mnemosyne::cli
