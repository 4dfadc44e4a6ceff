// fork() handling of the preload library (see fork.cpp).
#pragma once

namespace mnemosyne {

// Registers the atfork handlers. Called first thing at start-up, so that the
// prepare handler runs after every prepare handler registered later.
void install_fork_handling() noexcept;

}  // namespace mnemosyne
