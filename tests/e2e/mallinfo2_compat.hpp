// mallinfo2 for the probes where glibc is older than 2.33 and declares
// neither the function nor its struct: the struct as glibc 2.33 declares it,
// and the function looked up when called (mnemosyne's preload library
// exports it; without it, such a glibc has none and every field reads 0).
#pragma once

#include <malloc.h>

#if !__GLIBC_PREREQ(2, 33)
#include <dlfcn.h>

#include <cstddef>

struct mallinfo2 {
  std::size_t arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks, fordblks, keepcost;
};

inline struct mallinfo2 mallinfo2() {
  using Fn = struct mallinfo2 (*)();
  struct mallinfo2 info {};
  if (const auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "mallinfo2"))) info = fn();
  return info;
}
#endif
