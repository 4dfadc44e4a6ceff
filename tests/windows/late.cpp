// late.dll: loaded by the harness with LoadLibrary, after injection.
#include <cstdlib>

extern "C" __declspec(dllexport) void* late_alloc(std::size_t size) {
  return std::malloc(size);
}
