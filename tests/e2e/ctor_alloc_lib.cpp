// A library that allocates in its constructor, for a program that dlopens it
// under the interposer: the block it keeps must stay valid and be freed by
// whoever owns it.
#include <stdlib.h>
#include <string.h>

namespace {
char* g_kept = nullptr;
__attribute__((constructor)) void grab() {
  g_kept = static_cast<char*>(malloc(4096));
  if (g_kept != nullptr) strcpy(g_kept, "allocated in a constructor");
}
__attribute__((destructor)) void drop() {
  free(g_kept);
}
}  // namespace

extern "C" __attribute__((visibility("default"))) const char* ctor_alloc_message() {
  return g_kept;
}
