// Where the exported malloc API sends requests, decided once at start.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "arena/ownership_map.hpp"
#include "common/policy.hpp"

namespace mnemosyne {

enum class Mode : std::uint8_t {
  host = 0,      // before start-up, MNEMOSYNE_DISABLE, or a forked child that lost its heap
  arena = 1,     // every request to the arena: the fast path
  managed = 2,   // the arena, with MNEMOSYNE_SIZE routing and/or statistics counting
  held = 3,      // a fork is copying the heap: requests wait in the slow paths (hold.hpp)
  diverted = 4,  // a fork's copy is made, the fork not over: allocations come from the
                 // system allocator, frees go on (hold.hpp)
  counted = 5,   // Mode::managed with statistics and no routing, its common case:
                 // malloc_slow's first test
};

// Mode::managed or Mode::counted: the arena behind the policy's checks.
inline bool managed_mode(Mode mode) noexcept {
  return mode == Mode::managed || mode == Mode::counted;
}

// What free_slow must do besides freeing, in one load. The fast path of
// free() reads none of it but the free route of the block's ownership-map
// entry, which bootstrap.cpp and hold.cpp keep in step (free_route_of).
inline constexpr std::uint8_t kFreeCounting = 1;  // statistics count every free
inline constexpr std::uint8_t kFreeHeld = 2;      // Mode::held: frees wait
inline constexpr std::uint8_t kFreeDeferred = 4;  // a child pulls: arena frees wait in a list

// The free route arena entries carry (arena::set_free_route) while
// g_free_checks is `checks`: straight to mimalloc, counted, or none (the
// fast path then leaves every free to free_slow).
inline std::uint8_t free_route_of(std::uint8_t checks) noexcept {
  if (checks == 0) return kOwnerFastFree;
  if (checks == kFreeCounting) return kOwnerCountedFree;
  return 0;
}

extern std::atomic<Mode> g_mode;
extern std::atomic<std::uint8_t> g_free_checks;  // kFree* bits
extern Policy g_policy;                          // written before g_mode leaves host
// True until the constructor's start-up is over: what the system allocator
// hands out meanwhile is remembered (stats/earlier.hpp), its frees counted
// apart.
extern std::atomic<bool> g_before_start;

// While a fork on another thread copies the heap (Mode::held), waits until it
// is done. The copy takes milliseconds; what is allocated or freed after it
// starts would reach the child torn.
void wait_while_held() noexcept;

inline Mode current_mode() noexcept {
  return g_mode.load(std::memory_order_acquire);
}

// current_mode() == M as one compare of the byte in memory (fast_path.hpp
// says why), relaxed: for the slow paths' dispatch.
template <Mode M>
inline bool mode_is() noexcept {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  asm goto("cmpb %[m], %[mode]\n\tje %l[yes]"
           :
           : [mode] "m"(g_mode), [m] "i"(static_cast<int>(M))
           : "cc"
           : yes);
  return false;
yes:
  return true;
#else
  return g_mode.load(std::memory_order_relaxed) == M;
#endif
}

inline bool arena_mode() noexcept {
  return current_mode() != Mode::host;
}

}  // namespace mnemosyne
