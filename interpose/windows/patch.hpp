// Import address table patching: every module's slots that hold a
// redirected function are pointed at ours, by value, so imports through the
// api-ms-win-crt-* forwarders (which resolve to ucrtbase's exports) are
// caught too. Modules loaded later are patched as they load.
#pragma once

namespace mnemosyne::win {

// Slots of `module` holding an original get its replacement (crt.hpp's
// hooks, plus the process hooks of process_hooks.hpp). Never ntdll,
// kernel32, kernelbase (wine's kernel32 calls kernelbase through its own
// table: patching it recurses) nor this DLL, which calls the originals.
void patch_module(void* module) noexcept;

// Resolves the runtimes already loaded, patches every loaded module, and
// registers for DLL load notifications (LdrRegisterDllNotification) so
// that later modules get the same. Called once, from DllMain.
void patch_process(void* self) noexcept;

}  // namespace mnemosyne::win
