// dlopens a library that allocates in its constructor, uses what it kept,
// and closes it (its destructor frees the block).
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  void* lib = dlopen(argv[1], RTLD_NOW);
  if (lib == nullptr) {
    printf("dlopen failed: %s\n", dlerror());
    return 1;
  }
  auto message = reinterpret_cast<const char* (*)()>(dlsym(lib, "ctor_alloc_message"));
  printf("%s\n", message != nullptr && message() != nullptr ? message() : "(none)");
  dlclose(lib);
  printf("closed\n");
  return 0;
}
