// The ucrt heap functions that wine's own ucrtbase.dll does not implement
// (_aligned_recalloc, _aligned_offset_recalloc, _aligned_msize: calling them
// without mnemosyne aborts there), checked for their documented behaviour
// when mnemosyne serves them. Run injected only (run_windows.py, case ucrt).
#include <malloc.h>

#include <cstdint>
#include <cstdio>

#include "probe_check.hpp"

// In ucrtbase.dll; mingw-w64's malloc.h does not declare it.
extern "C" std::size_t __cdecl _aligned_msize(void* block, std::size_t alignment,
                                              std::size_t offset);

using probe::check;

int main() {
  auto* p = static_cast<unsigned char*>(_aligned_recalloc(nullptr, 10, 10, 128));
  check(p != nullptr && (reinterpret_cast<std::uintptr_t>(p) & 127) == 0, "aligned");
  bool zero = true;
  for (int i = 0; i < 100; ++i) zero = zero && p[i] == 0;
  check(zero, "_aligned_recalloc zeroes a new block");
  for (int i = 0; i < 100; ++i) p[i] = static_cast<unsigned char>(i + 1);
  p = static_cast<unsigned char*>(_aligned_recalloc(p, 50, 10, 128));
  bool kept = (reinterpret_cast<std::uintptr_t>(p) & 127) == 0;
  for (int i = 0; i < 100; ++i) kept = kept && p[i] == static_cast<unsigned char>(i + 1);
  for (int i = 100; i < 500; ++i) kept = kept && p[i] == 0;
  check(kept, "_aligned_recalloc keeps the data and zeroes the rest");
  check(_aligned_msize(p, 128, 0) >= 500, "_aligned_msize covers the block");
  std::printf("block aligned_recalloc %p 500\n", static_cast<void*>(p));
  _aligned_free(p);
  auto* q = static_cast<unsigned char*>(_aligned_offset_recalloc(nullptr, 4, 50, 32, 16));
  check(q != nullptr && ((reinterpret_cast<std::uintptr_t>(q) + 16) & 31) == 0,
        "_aligned_offset_recalloc aligns at the offset");
  zero = true;
  for (int i = 0; i < 200; ++i) zero = zero && q[i] == 0;
  check(zero, "_aligned_offset_recalloc zeroes");
  std::printf("block aligned_offset_recalloc %p 200\n", static_cast<void*>(q));
  _aligned_free(q);
  std::printf("%s %d\n", probe::failures == 0 ? "crt_probe: ok" : "crt_probe: failures",
              probe::failures);
  return probe::failures == 0 ? 0 : 1;
}
