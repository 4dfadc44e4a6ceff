// Command lines of the processes the injectors start, and their names in
// messages. Shared by mnemosyne-inject.exe and the tests' Detours-layout
// injector.
#pragma once

#include <string>

namespace mnemosyne::win {

// `w` in UTF-8, for messages.
std::string narrow(const wchar_t* w);

// Appends `arg` to `cmd` (after a blank), quoted as CommandLineToArgvW reads
// it back.
void append_quoted(std::wstring& cmd, const std::wstring& arg);

}  // namespace mnemosyne::win
