// mnemosyne-inject.exe [FLAGS] [--] PROGRAM [ARGS...]: runs PROGRAM with
// mnemosyne.dll (next to this executable) loaded before PROGRAM's own code,
// its stdio inherited, and returns its exit code. FLAGS are those of
// `mnemosyne run` on Linux (src/cli/flags.cpp: one per MNEMOSYNE_* option);
// each sets its variable, which PROGRAM and its children inherit.
// --inject= chooses how the DLL gets in (inject.hpp).
#include <windows.h>

#include <cstdio>
#include <string>
#include <vector>

#include "backend/backend_id.hpp"
#include "cli/flags.hpp"
#include "config/options.hpp"
#include "windows/command_line.hpp"  // interpose/windows: shared with the DLL
#include "windows/inject.hpp"

using mnemosyne::win::append_quoted;
using mnemosyne::win::narrow;

namespace {

int usage(FILE* to) {
  std::fprintf(to,
               "usage: mnemosyne-inject [FLAGS] [--] PROGRAM [ARGS...]\n"
               "Runs PROGRAM with its C runtime heap in mnemosyne's memory (mnemosyne.dll,\n"
               "loaded before PROGRAM's code runs; its child processes get it too).\n"
               "  --inject=imports|thread|auto  how: the DLL added to PROGRAM's import table\n"
               "      before it runs (Detours' method), a remote LoadLibraryW thread, or the\n"
               "      first and then the second (auto, the default)\n"
               "FLAGS (each sets the MNEMOSYNE_* variable named):\n");
  for (const auto& flag : mnemosyne::cli::run_flags()) {
    std::fprintf(to, "  %s%s%s  (%s)\n", flag.name.c_str(), flag.metavar.empty() ? "" : "=",
                 flag.metavar.c_str(), flag.env.c_str());
  }
  return to == stdout ? 0 : 2;
}

// Checked here, before the program starts: with the import-table method a
// DLL the loader refuses would only show as the program failing to start.
// Mapped without running its code; it must be a 64-bit DLL exporting
// ordinal 1 (the import inject_dll writes).
std::string unusable_dll(const std::wstring& dll) {
  HMODULE h = LoadLibraryExW(dll.c_str(), nullptr, DONT_RESOLVE_DLL_REFERENCES);
  if (h == nullptr) {
    return narrow(dll.c_str()) + " cannot be loaded (error " + std::to_string(GetLastError()) +
           "): not a 64-bit Windows DLL, or damaged";
  }
  const bool has_ordinal_1 = GetProcAddress(h, MAKEINTRESOURCEA(1)) != nullptr;
  FreeLibrary(h);
  if (!has_ordinal_1) return narrow(dll.c_str()) + " does not export ordinal 1: not mnemosyne.dll";
  return "";
}

int fail(int code, const std::string& line) {
  std::fprintf(stderr, "mnemosyne-inject: %s\n", line.c_str());
  return code;
}

}  // namespace

int wmain(int argc, wchar_t** argv) {
  auto method = mnemosyne::win::Method::automatic;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = narrow(argv[i]);
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "--help" || arg == "-h") return usage(stdout);
    if (arg.rfind("--inject=", 0) == 0) {
      const std::string how = arg.substr(9);
      if (how == "imports") {
        method = mnemosyne::win::Method::imports;
      } else if (how == "thread") {
        method = mnemosyne::win::Method::thread;
      } else if (how == "auto") {
        method = mnemosyne::win::Method::automatic;
      } else {
        return fail(2, "--inject=" + how + ": give imports, thread or auto");
      }
      continue;
    }
    if (arg.rfind("--", 0) != 0) break;
    const std::size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const mnemosyne::cli::Flag* flag = mnemosyne::cli::find_flag(name);
    if (flag == nullptr) return fail(2, "unknown flag " + name + " (--help lists them)");
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (flag->metavar.empty()) {
      value = "1";
    } else if (i + 1 < argc) {
      value = narrow(argv[++i]);
    } else {
      return fail(2, name + " needs a value: " + flag->syntax);
    }
    std::string exported, why;
    if (!mnemosyne::cli::check_flag_value(*flag, value, &exported, &why)) return fail(2, why);
    SetEnvironmentVariableA(flag->env.c_str(), exported.c_str());
  }
  if (i >= argc) return usage(stderr);
  // Marks the tree: children whose creator replaces their environment are
  // injected only when it still names a MNEMOSYNE_ option (process_hooks.cpp).
  if (GetEnvironmentVariableA("MNEMOSYNE_BACKEND", nullptr, 0) == 0) {
    SetEnvironmentVariableA("MNEMOSYNE_BACKEND",
                            mnemosyne::backend_name(mnemosyne::config::Options{}.backend));
  }

  wchar_t self[MAX_PATH * 2];
  const DWORD len = GetModuleFileNameW(nullptr, self, MAX_PATH * 2);
  std::wstring dll(self, len);
  dll = dll.substr(0, dll.find_last_of(L"\\/") + 1) + L"mnemosyne.dll";
  if (GetFileAttributesW(dll.c_str()) == INVALID_FILE_ATTRIBUTES) {
    return fail(126, "mnemosyne.dll not found next to the injector (" + narrow(dll.c_str()) + ")");
  }
  if (std::string why = unusable_dll(dll); !why.empty()) return fail(126, why);

  std::wstring cmd;
  for (int k = i; k < argc; ++k) append_quoted(cmd, argv[k]);
  const std::string program = narrow(argv[i]);
  DWORD type = 0;
  if (GetBinaryTypeW(argv[i], &type) && type == SCS_32BIT_BINARY) {
    return fail(126, program + " is a 32-bit program; mnemosyne.dll is 64-bit");
  }

  STARTUPINFOW si{};
  si.cb = sizeof si;
  si.dwFlags = STARTF_USESTDHANDLES;  // without it the child's output vanishes under wine
  si.hStdInput = GetStdHandle(STD_INPUT_HANDLE);
  si.hStdOutput = GetStdHandle(STD_OUTPUT_HANDLE);
  si.hStdError = GetStdHandle(STD_ERROR_HANDLE);
  PROCESS_INFORMATION pi{};
  std::vector<wchar_t> line(cmd.begin(), cmd.end());
  line.push_back(L'\0');
  if (!CreateProcessW(nullptr, line.data(), nullptr, nullptr, TRUE, CREATE_SUSPENDED, nullptr,
                      nullptr, &si, &pi)) {
    return fail(127, "cannot start " + program + ": error " + std::to_string(GetLastError()));
  }
  char why[512];
  if (!mnemosyne::win::inject_dll(pi.hProcess, dll.c_str(), method, why, sizeof why)) {
    TerminateProcess(pi.hProcess, 126);
    return fail(126, "cannot load mnemosyne.dll into " + program + ": " + why);
  }
  ResumeThread(pi.hThread);
  CloseHandle(pi.hThread);
  WaitForSingleObject(pi.hProcess, INFINITE);
  DWORD code = 1;
  GetExitCodeProcess(pi.hProcess, &code);
  CloseHandle(pi.hProcess);
  // The loader's own failures, which would otherwise pass for the program's
  // exit code without a word.
  if (code == 0xC0000135u || code == 0xC0000142u || code == 0xC000007Bu) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "0x%08lX", static_cast<unsigned long>(code));
    fail(static_cast<int>(code), program + " did not start: the loader failed (" + hex +
                                     (code == 0xC0000135u   ? ", a DLL was not found)"
                                      : code == 0xC0000142u ? ", a DLL failed to initialize)"
                                                            : ", a DLL is not a valid image)"));
  }
  return static_cast<int>(code);
}
