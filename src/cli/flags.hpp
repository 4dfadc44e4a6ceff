// `mnemosyne run`'s option flags, one per row of config::option_table():
// --backend for MNEMOSYNE_BACKEND, --arena-size for MNEMOSYNE_ARENA_SIZE,
// and so on (--stats for MNEMOSYNE_SHOW_STATS). The help text and the parser
// both come from here, so a new option in the table is a new flag.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "config/options.hpp"

namespace mnemosyne::cli {

struct Flag {
  const config::OptionInfo* info;
  std::string name;     // "--arena-size"
  std::string env;      // "MNEMOSYNE_ARENA_SIZE"
  std::string metavar;  // "SIZE"; empty for a boolean flag
  std::string syntax;   // what a value looks like, for help and errors
};

// The backends' names, the driver's first and host last: "unified, ..., host".
std::string backend_list();

// Every flag, in the table's order.
const std::vector<Flag>& run_flags();

// The flag called `name` ("--size"), or nullptr.
const Flag* find_flag(std::string_view name);

// "--size=1M:64M", from the table's example ("--verbose" for a boolean on).
std::string flag_example(const Flag& flag);

// Checks `value` with the library's own parsers and rules (config::parse_*,
// parse_backend_name, then read_options itself for the limits it enforces).
// True with *exported set to what MNEMOSYNE_<NAME> gets; false with *why set
// to one line ("--size=x is not a size range (...)").
bool check_flag_value(const Flag& flag, const std::string& value, std::string* exported,
                      std::string* why);

}  // namespace mnemosyne::cli
