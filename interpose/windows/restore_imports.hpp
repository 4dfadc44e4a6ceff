// Putting the program's own import directory back after mnemosyne.dll was
// loaded through a rewritten import table, so that a program (or a tool)
// that reads its imports sees its own.
#pragma once

namespace mnemosyne::win {

// In DllMain. Two layouts are known: mnemosyne's injector's (inject.hpp's
// ImportPayload just before the new table) and Microsoft Detours'
// (withdll.exe: the DETOUR_EXE_RESTORE payload, which
// DetourRestoreAfterWith copies back). Reads only memory it has checked is
// readable; with neither found, the image is left alone. True when the
// directory was put back.
bool restore_import_directory() noexcept;

}  // namespace mnemosyne::win
