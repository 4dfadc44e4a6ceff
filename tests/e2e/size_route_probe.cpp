// Allocates inside and outside a MNEMOSYNE_SIZE range and prints where each
// block lives (mnemosyne_backend_of, found with dlsym), and that realloc
// across the range boundary keeps the contents.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

using BackendOf = const char* (*)(const void*);

int main() {
  auto backend_of = reinterpret_cast<BackendOf>(dlsym(RTLD_DEFAULT, "mnemosyne_backend_of"));
  if (backend_of == nullptr) {
    printf("mnemosyne_backend_of not found (not preloaded)\n");
    return 2;
  }
  void* small = malloc(100);
  void* inside = malloc(4096);
  void* large = malloc(100000);
  void* zeroed = calloc(10, 200);  // 2000 bytes: inside
  printf("malloc(100) %s\n", backend_of(small));
  printf("malloc(4096) %s\n", backend_of(inside));
  printf("malloc(100000) %s\n", backend_of(large));
  printf("calloc(10, 200) %s\n", backend_of(zeroed));

  memset(inside, 0x11, 4096);
  void* moved_out = realloc(inside, 200000);
  bool kept = true;
  for (int i = 0; i < 4096; ++i) kept = kept && static_cast<unsigned char*>(moved_out)[i] == 0x11;
  printf("realloc(4096 -> 200000) %s, contents %s\n", backend_of(moved_out),
         kept ? "kept" : "LOST");

  memset(small, 0x22, 100);
  void* moved_in = realloc(small, 8192);
  kept = true;
  for (int i = 0; i < 100; ++i) kept = kept && static_cast<unsigned char*>(moved_in)[i] == 0x22;
  printf("realloc(100 -> 8192) %s, contents %s\n", backend_of(moved_in), kept ? "kept" : "LOST");

  free(moved_out);
  free(moved_in);
  free(large);
  free(zeroed);
  return 0;
}
