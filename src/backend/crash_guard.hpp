// Calling into the driver where a crash there must not take the process
// with it: cuInit, the first call into a library mnemosyne did not write,
// runs from the preload library's constructor, before the program's main.
#pragma once

namespace mnemosyne {

// Runs fn(arg) on the calling thread. When it faults (SIGSEGV, SIGBUS,
// SIGILL, SIGFPE) the thread jumps back out of it: returns false with
// *signal set. Whatever fn left behind stays as it was (locks it held,
// threads it started): the caller must never call into it again. Faults of
// other threads meanwhile go to their handlers as usual. Not reentrant.
bool call_guarded(void (*fn)(void*), void* arg, int* signal) noexcept;

}  // namespace mnemosyne
