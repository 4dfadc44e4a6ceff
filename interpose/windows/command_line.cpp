#include "command_line.hpp"

#include <windows.h>

namespace mnemosyne::win {

std::string narrow(const wchar_t* w) {
  const int n = WideCharToMultiByte(CP_UTF8, 0, w, -1, nullptr, 0, nullptr, nullptr);
  std::string s(n > 0 ? n - 1 : 0, '\0');
  if (n > 1) WideCharToMultiByte(CP_UTF8, 0, w, -1, s.data(), n, nullptr, nullptr);
  return s;
}

void append_quoted(std::wstring& cmd, const std::wstring& arg) {
  if (!cmd.empty()) cmd += L' ';
  if (!arg.empty() && arg.find_first_of(L" \t\n\v\"") == std::wstring::npos) {
    cmd += arg;
    return;
  }
  cmd += L'"';
  std::size_t backslashes = 0;
  for (wchar_t c : arg) {
    if (c == L'\\') {
      ++backslashes;
      continue;
    }
    if (c == L'"')
      cmd.append(2 * backslashes + 1, L'\\');
    else
      cmd.append(backslashes, L'\\');
    backslashes = 0;
    cmd += c;
  }
  cmd.append(2 * backslashes, L'\\');
  cmd += L'"';
}

}  // namespace mnemosyne::win
