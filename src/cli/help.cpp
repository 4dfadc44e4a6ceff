// Help texts (man-page layout) and the version. The options of `run` and the
// ENVIRONMENT sections come from config::option_table() through flags.hpp.
#include <cstdio>
#include <string>
#include <string_view>

#include "backend/backend_id.hpp"
#include "cli/cli.hpp"
#include "cli/flags.hpp"

#ifndef MNEMOSYNE_VERSION
#error "MNEMOSYNE_VERSION must be defined"
#endif

namespace mnemosyne::cli {
namespace {

constexpr std::size_t kWidth = 80;

// `text` as lines of at most kWidth columns, each indented by `indent`.
std::string wrap(std::string_view text, std::size_t indent) {
  std::string out;
  std::string line(indent, ' ');
  bool line_empty = true;
  std::size_t pos = 0;
  while (pos < text.size()) {
    while (pos < text.size() && text[pos] == ' ') ++pos;
    std::size_t end = pos;
    while (end < text.size() && text[end] != ' ') ++end;
    if (end == pos) break;
    const std::string_view word = text.substr(pos, end - pos);
    if (!line_empty && line.size() + 1 + word.size() > kWidth) {
      out += line + "\n";
      line.assign(indent, ' ');
      line_empty = true;
    }
    if (!line_empty) line += ' ';
    line += word;
    line_empty = false;
    pos = end;
  }
  if (!line_empty) out += line + "\n";
  return out;
}

// Paragraphs separated by blank lines in `text`, each wrapped.
std::string paragraphs(std::string_view text, std::size_t indent) {
  std::string out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find("\n\n", pos);
    if (end == std::string_view::npos) end = text.size();
    std::string para(text.substr(pos, end - pos));
    for (char& c : para) {
      if (c == '\n') c = ' ';
    }
    if (!out.empty()) out += "\n";
    out += wrap(para, indent);
    pos = end + 2;
  }
  return out;
}

// "  TERM" then its description on the following lines, indented further.
// The backends' names, in kBackends' order: "unified, device, ..., host".
std::string item(std::string_view term, std::string_view description) {
  return "    " + std::string(term) + "\n" + wrap(description, 12);
}

// A term and a short description on one line when it fits.
std::string row(std::string_view term, std::string_view description, std::size_t column = 14) {
  std::string head = "    " + std::string(term);
  if (head.size() + 2 <= column + 4) {
    head.resize(column + 4, ' ');
    std::string body = wrap(description, column + 4);
    return head + body.substr(column + 4);
  }
  return head + "\n" + wrap(description, column + 4);
}

std::string environment_section() {
  std::string out = "ENVIRONMENT\n";
  out += paragraphs(
      "libmnemosyne.so reads these variables once at start; `mnemosyne run` sets them from its "
      "options. An invalid value gets one warning line from the library and the default is used; "
      "the launcher rejects it before COMMAND starts.",
      4);
  out += "\n";
  for (const Flag& f : run_flags()) {
    out += row(f.env,
               std::string(f.info->description) + " Default: " + f.info->default_text +
                   ". Flag: " + f.name + ".",
               24);
  }
  out += row("MIMALLOC_*",
             "Reach mnemosyne's private mimalloc (e.g. MIMALLOC_VERBOSE=1), except those that "
             "would take memory behind the backend's back, which mnemosyne forces.",
             24);
  return out;
}

std::string top_help() {
  std::string out;
  out += "NAME\n    mnemosyne - run a program with its heap in GPU-reachable memory\n\n";
  out +=
      "SYNOPSIS\n"
      "    mnemosyne run [OPTIONS] [--] COMMAND [ARGS...]\n"
      "    mnemosyne info [--json] [--cuda-driver PATH]\n"
      "    mnemosyne stats [--plot OUT.png] FILE...\n"
      "    mnemosyne help [COMMAND]\n"
      "    mnemosyne --help | --version\n\n";
  out += "DESCRIPTION\n";
  out += paragraphs(
      "mnemosyne serves an unmodified program's malloc, free, new, delete and the rest of the "
      "allocation API from CUDA driver memory (unified/managed memory, managed memory preferring "
      "one device, or pinned host memory), so that a GPU kernel can read memory that plain malloc "
      "returned. The work is done by the preload library libmnemosyne.so; this launcher finds it, "
      "sets LD_PRELOAD and the MNEMOSYNE_* variables, and reports what the driver offers and what "
      "a run used.",
      4);
  out += "\nCOMMANDS\n";
  out += row("run",
             "Run COMMAND with libmnemosyne.so preloaded; every MNEMOSYNE_* option is a "
             "flag. See 'mnemosyne run --help'.");
  out += row("info",
             "Report the CUDA driver (or why none was found), its devices, and which "
             "backends can allocate. See 'mnemosyne info --help'.");
  out += row("stats",
             "Print the statistics files a run wrote (--stats-file) as a table, or draw "
             "them as a bar chart. See 'mnemosyne stats --help'.");
  out += row("help", "Print the help of COMMAND (the same as 'mnemosyne COMMAND --help').");
  out += "\nOPTIONS\n";
  out += row("-h, --help", "Print this help and exit.");
  out += row("--version", "Print the version and exit.");
  out += "\n";
  out += environment_section();
  out += "\nFILES\n";
  out += item("<prefix>/<libdir>/libmnemosyne.so",
              "The preload library. The launcher finds it from its own location: installed, "
              "<prefix>/" MNEMOSYNE_LIBDIR
              " where <prefix> is the launcher's directory less "
              "<bindir> (" MNEMOSYNE_BINDIR
              "); in a build tree, <build>/interpose/. Never from "
              "a path fixed at build time.");
  const Located lib = find_preload_library();
  out += wrap("This launcher uses: " +
                  (lib.path.empty() ? "(not found; looked at " + lib.tried + ")" : lib.path),
              12);
  out += item("<prefix>/" MNEMOSYNE_DATADIR "/mnemosyne/plot_stats.py",
              "Draws 'mnemosyne stats --plot' charts with matplotlib.");
  out += item("<prefix>/include/mnemosyne.h, <prefix>/<libdir>/pkgconfig/mnemosyne.pc",
              "The C API of the library (mnemosyne_owns, mnemosyne_backend_of, ...) and its "
              "pkg-config file.");
  out += "\nEXIT STATUS\n";
  out += row("0", "Success.", 6);
  out += row("2", "Usage error: unknown command or option, bad value.", 6);
  out += row("other", "See each command's help; run exits with COMMAND's status.", 6);
  out +=
      "\nEXAMPLES\n"
      "    mnemosyne info\n"
      "    mnemosyne run --backend=device --device=1 -- ./simulate input.dat\n"
      "    mnemosyne run --stats-file=/tmp/run.%p.json -- python3 train.py\n"
      "    mnemosyne stats /tmp/run.*.json --plot usage.png\n";
  out += "\nSEE ALSO\n    README.md and docs/ in mnemosyne's sources.\n";
  return out;
}

std::string run_help() {
  std::string out;
  out += "NAME\n    mnemosyne run - run a command with its heap in GPU-reachable memory\n\n";
  out += "SYNOPSIS\n    mnemosyne run [OPTIONS] [--] COMMAND [ARGS...]\n\n";
  out += "DESCRIPTION\n";
  out += paragraphs(
      "Runs COMMAND (searched in PATH as a shell does) with libmnemosyne.so put first in "
      "LD_PRELOAD (before any libraries already there) and each option given exported as its "
      "MNEMOSYNE_* variable. The launcher replaces itself with COMMAND (exec): COMMAND keeps the "
      "process id, receives the signals and its exit status is the launcher's.\n\n"
      "Options end at '--' or at the first argument that does not start with '-'. Each option "
      "is written --name=VALUE or --name VALUE; a boolean option alone means on (--verbose), or "
      "takes =1/0, true/false, yes/no, on/off. Values are checked here with the library's own "
      "parsers, so a bad value stops the launcher before COMMAND starts instead of becoming a "
      "warning and a default. Options not given leave the environment as it is: a MNEMOSYNE_* "
      "variable already set reaches COMMAND unchanged, and the library's default applies when "
      "none is set. When an option is given twice the last one counts. A relative "
      "--stats-file is made absolute here, so a COMMAND that changes directory still writes it "
      "where you asked.\n\n"
      "SIZE is a byte count with an optional K, M, G or T suffix (1024-based; KiB, MB and the "
      "like are accepted too): 4096, 64K, 256MiB, 1G.",
      4);
  out += "\nOPTIONS\n";
  for (const Flag& f : run_flags()) {
    std::string term = f.name;
    if (f.metavar.empty()) {
      term += "[=BOOL]";
    } else {
      term += " " + f.metavar;
    }
    std::string body = f.info->description;
    body += " Sets " + f.env + ". Default: " + f.info->default_text +
            ". Example: " + flag_example(f) + ".";
    out += item(term, body);
  }
  out += item("-h, --help", "Print this help and exit.");
  out += item("--version", "Print the version and exit.");
  out += "\nBACKENDS\n";
  for (const BackendRow& b : kBackends) out += row(b.name, b.summary, 10);
  out += "\nENVIRONMENT\n";
  out += row("LD_PRELOAD", "libmnemosyne.so is prepended to it for COMMAND.", 14);
  out += row("MNEMOSYNE_*",
             "Set from the options above (see 'mnemosyne --help' for the list); "
             "those already set pass through unless an option overrides them.",
             14);
  out += row("MIMALLOC_*", "Passed to mnemosyne's private mimalloc.", 14);
  out += row("PATH", "Searched for COMMAND when it has no '/'.", 14);
  out += "\nFILES\n";
  const Located lib = find_preload_library();
  out += wrap("The preload library, found from the launcher's own location: " +
                  (lib.path.empty() ? "not found (looked at " + lib.tried + ")" : lib.path) + ".",
              4);
  out += "\nEXIT STATUS\n";
  out += row("N",
             "COMMAND's exit status, when COMMAND ran. A signal that ends COMMAND ends the "
             "launcher's process the same way: it became COMMAND.",
             6);
  out += row("2", "Usage error: unknown option, bad value, no COMMAND.", 6);
  out += row("125",
             "libmnemosyne.so was not found next to the launcher, or its path cannot be "
             "written in LD_PRELOAD (it contains a space or ':').",
             6);
  out += row("126", "COMMAND was found but cannot be executed.", 6);
  out += row("127", "COMMAND was not found.", 6);
  out +=
      "\nEXAMPLES\n"
      "    mnemosyne run -- ./my_program --its-own-flag\n"
      "    mnemosyne run --backend pinned --size 1M -- python3 train.py\n"
      "    srun mnemosyne run --backend=device --device=local-rank -- ./solver\n"
      "    mnemosyne run --stats --stats-file=/tmp/run.%p.json -- sort big.txt\n";
  return out;
}

std::string info_help() {
  std::string out;
  out += "NAME\n    mnemosyne info - what the CUDA driver and its devices offer\n\n";
  out += "SYNOPSIS\n    mnemosyne info [--json] [--cuda-driver PATH]\n\n";
  out += "DESCRIPTION\n";
  out += paragraphs(
      "Loads the CUDA driver as libmnemosyne.so would (MNEMOSYNE_CUDA_DRIVER, else libcuda.so.1, "
      "else libcuda.so) and prints: the driver's path and CUDA version, or why no driver could "
      "be used; each device with its name, memory, compute capability, "
      "concurrentManagedAccess (CPU and GPU may touch managed memory at the same time) and "
      "pageableMemoryAccess (the GPU can read plain pageable host memory, through HMM or ATS); "
      "and, for each backend, whether a 2 MiB allocation and its release succeed.\n\n"
      "When every device reports pageableMemoryAccess, the system already gives GPUs access to "
      "pageable memory and the interposer is not needed for access; info says so.",
      4);
  out += "\nOPTIONS\n";
  out += item("--json", "Print the same report as one JSON object on stdout (keys below).");
  out += item("--cuda-driver PATH",
              "Open this driver library instead (sets MNEMOSYNE_CUDA_DRIVER). Default: "
              "libcuda.so.1, then libcuda.so. Example: --cuda-driver=/usr/lib/x86_64-linux-gnu/"
              "libcuda.so.1.");
  out += item("-h, --help", "Print this help and exit.");
  out += item("--version", "Print the version and exit.");
  out +=
      "\nJSON KEYS\n"
      "    schema               \"mnemosyne-info/1\"\n"
      "    version              the launcher's version, \"MAJOR.MINOR.PATCH\"\n"
      "    driver.available     true when the driver loaded and cuInit succeeded\n"
      "    driver.path          the library opened (or the last one tried)\n"
      "    driver.version       cuDriverGetVersion, e.g. 12040; 0 when unknown\n"
      "    driver.version_text  \"12.4\"; \"\" when unknown\n"
      "    driver.reason        why the driver is unavailable; \"\" when available\n"
      "    device_count         the devices the driver reports\n"
      "    devices[]            one object per device listed:\n"
      "      ordinal, name, total_memory (bytes), compute_capability (\"9.0\"),\n"
      "      compute_major, compute_minor, concurrent_managed_access (bool),\n"
      "      pageable_memory_access (bool)\n"
      "    pageable_memory_access_everywhere\n"
      "                         true when there is a device and every one reports it\n"
      "    backends.<name>      for " +
      backend_list() +
      ":\n"
      "      cuda (bool: uses the driver), works (bool: 2 MiB allocated and released)\n"
      "    ok                   true when a CUDA backend works (exit status 0)\n"
      "    reason               why none works; \"\" when ok\n";
  out += "\nENVIRONMENT\n";
  out += row("MNEMOSYNE_CUDA_DRIVER", "The driver library to open (see --cuda-driver).", 24);
  out += row("MNEMOSYNE_DEVICE", "Ignored by info: the device backends are tried on device 0.", 24);
  out += "\nEXIT STATUS\n";
  out += row("0", "At least one CUDA backend can allocate.", 6);
  out += row("1", "None can; the last line on stderr says why in one line.", 6);
  out += row("2", "Usage error: unknown option or argument.", 6);
  out +=
      "\nEXAMPLES\n"
      "    mnemosyne info\n"
      "    mnemosyne info --json | python3 -m json.tool\n";
  return out;
}

std::string stats_help() {
  std::string out;
  out += "NAME\n    mnemosyne stats - summarize the statistics files of mnemosyne runs\n\n";
  out += "SYNOPSIS\n    mnemosyne stats [--plot OUT.png] FILE...\n\n";
  out += "DESCRIPTION\n";
  out += paragraphs(
      "Reads one or more statistics files (JSON, schema \"mnemosyne-stats/1\", written at exit "
      "when MNEMOSYNE_STATS_FILE or 'mnemosyne run --stats-file' is set) and prints, for each "
      "file, one row per pool (each backend that served or reserved memory, and 'system' for the "
      "system allocator) and a total: allocations, frees, bytes requested, live and peak, "
      "segments and bytes reserved from the backend, driver calls, driver failures and "
      "milliseconds spent in the driver. Below each table: the fallbacks to the system "
      "allocator and the first reason. Byte counts are exact numbers of bytes. "
      "Allocation counts and bytes are 0 unless the run asked for statistics at start "
      "(\"counting\": false).\n\n"
      "Files with another schema, or that are not JSON, are reported and skipped; the others "
      "are still printed.",
      4);
  out += "\nOPTIONS\n";
  out += item("--plot OUT.png",
              "Also draw a bar chart to OUT.png: bytes reserved and peak bytes per pool, and "
              "driver calls per pool. Uses /usr/bin/python3 with matplotlib (Debian package "
              "python3-matplotlib). Default: no chart. Example: --plot=usage.png.");
  out += item("-h, --help", "Print this help and exit.");
  out += item("--version", "Print the version and exit.");
  out += "\nENVIRONMENT\n";
  out += row("MPLCONFIGDIR", "Where matplotlib keeps its cache (for --plot).", 16);
  out += "\nEXIT STATUS\n";
  out += row("0", "Every file was read (and the chart drawn).", 6);
  out += row("1",
             "A file could not be read, is not JSON or has another schema, or the chart "
             "could not be drawn (matplotlib missing, OUT.png not writable).",
             6);
  out += row("2", "Usage error: no FILE, unknown option.", 6);
  out +=
      "\nEXAMPLES\n"
      "    mnemosyne run --stats-file=/tmp/run.%p.json -- ./my_program\n"
      "    mnemosyne stats /tmp/run.*.json\n"
      "    mnemosyne stats --plot=usage.png /tmp/run.*.json\n";
  out += "\nSEE ALSO\n    docs/stats-schema.md in mnemosyne's sources (every key of the file).\n";
  return out;
}

}  // namespace

bool print_help(std::string_view command) {
  std::string text;
  if (command.empty()) {
    text = top_help();
  } else if (command == "run") {
    text = run_help();
  } else if (command == "info") {
    text = info_help();
  } else if (command == "stats") {
    text = stats_help();
  } else {
    return false;
  }
  std::fputs(text.c_str(), stdout);
  return true;
}

bool help_or_version(std::string_view command, std::string_view arg) {
  if (arg == "-h" || arg == "--help") {
    print_help(command);
    return true;
  }
  if (arg == "--version") {
    print_version();
    return true;
  }
  return false;
}

void print_version() {
  std::printf("mnemosyne %s\n", MNEMOSYNE_VERSION);
}

}  // namespace mnemosyne::cli
