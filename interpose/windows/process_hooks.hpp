// The process-level functions the DLL redirects besides the heap:
// GetProcAddress (a runtime's heap function asked for by name comes back as
// ours), CreateProcessW/A (children start suspended and get the DLL before
// they run, as LD_PRELOAD is inherited on Linux) and CreateThread (threads
// the driver starts are marked, as pthread_create does on Linux).
#pragma once

namespace mnemosyne::win {

// Resolves the originals from kernel32 (and kernelbase, where wine and
// Windows keep the code the kernel32 exports forward to). Once.
void resolve_process_hooks() noexcept;

// Ours for `original` (GetProcAddress, CreateProcessW/A or CreateThread as
// the process sees them), or nullptr.
void* process_replacement_for(const void* original) noexcept;

}  // namespace mnemosyne::win
