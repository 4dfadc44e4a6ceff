// Giving back committed arenas: memory a backend can only free whole (managed
// memory: the driver frees a managed allocation whole, and madvise frees
// nothing in it), once no block of it is in use.
#pragma once

#include <cstddef>

namespace mnemosyne::arena {

// Set up at start: mimalloc tells when a committed arena has no block in
// use any more (mimalloc-live.h).
void install_retire_hook() noexcept;

// Starts the thread that gives such arenas back, if it is not running and
// the process has a committed arena besides the first. Outside mimalloc and
// every lock of the arena: creating a thread may call malloc.
void start_retiring() noexcept;

// Under grow_lock: the slot of a retired arena that a new arena of at least
// `need` bytes (ideally `want`) should reuse, and its size; 0 when none fits.
int pick_retired_locked(std::size_t need, std::size_t want, std::size_t* size) noexcept;

// Under grow_lock: slot `slot` serves again (mnemosyne_mi_arena_revive done).
void revived_locked(int slot) noexcept;

}  // namespace mnemosyne::arena
