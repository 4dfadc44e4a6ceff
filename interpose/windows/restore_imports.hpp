// Putting the program's own import directory back after mnemosyne.dll was
// loaded through a rewritten import table, so that a program (or a tool)
// that reads its imports sees its own.
#pragma once

namespace mnemosyne::win {

// In DllMain. The layout known is mnemosyne's injector's (inject.hpp's
// ImportPayload just before the new table). Reads only memory it has
// checked is readable: another injector's table may start a fresh
// allocation with nothing mapped before it. Without the marker the image
// is left alone. True when the directory was put back.
bool restore_import_directory() noexcept;

}  // namespace mnemosyne::win
