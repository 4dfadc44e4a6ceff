// Linked into the harness: its DllMain runs before mnemosyne.dll is
// injected, so its blocks are the C runtime's own.
#include <windows.h>

#include <cstdlib>
#include <cstring>

namespace {
void* g_blocks[3];
}

extern "C" __declspec(dllexport) void* early_block(int index) {
  return g_blocks[index];
}

extern "C" BOOL WINAPI DllMain(HINSTANCE, DWORD reason, LPVOID) {
  if (reason == DLL_PROCESS_ATTACH) {
    for (void*& b : g_blocks) {
      b = std::malloc(64);
      std::strcpy(static_cast<char*>(b), "early");
    }
  }
  return TRUE;
}
