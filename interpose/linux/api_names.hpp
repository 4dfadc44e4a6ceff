// The names the C allocation API is defined under. The preload library
// exports malloc, free, ...; the fuzzing harness (tests/fuzz) compiles the
// same code with MNEMOSYNE_API_PREFIX set, so it runs under other names
// beside the process's own allocator.
#pragma once

#ifdef MNEMOSYNE_API_PREFIX
#define MNEMOSYNE_API_CAT2(a, b) a##b
#define MNEMOSYNE_API_CAT(a, b) MNEMOSYNE_API_CAT2(a, b)
#define MNEMOSYNE_API(name) MNEMOSYNE_API_CAT(MNEMOSYNE_API_PREFIX, name)
#define MNEMOSYNE_API_VISIBILITY
#else
#define MNEMOSYNE_API(name) name
#define MNEMOSYNE_API_VISIBILITY __attribute__((visibility("default")))
#endif
