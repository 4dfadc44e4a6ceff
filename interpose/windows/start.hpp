// Start-up of the injected DLL: options, the arena, the exit report.
#pragma once

#include "config/options.hpp"

namespace mnemosyne::win {

// Called from DllMain: remembers this DLL's path, patches the process.
void attach(void* self) noexcept;

// The options read at start (defaults before).
const config::Options& start_options() noexcept;

// One line on stderr (a newline is added).
void warn_line(const char* line) noexcept;

// This DLL's full path, for injecting children.
const wchar_t* self_path() noexcept;

// False under MNEMOSYNE_DISABLE: children are then left alone too.
bool inject_children() noexcept;

}  // namespace mnemosyne::win
