// Linked into the harness: its DllMain runs before mnemosyne.dll is
// injected, so its blocks are the C runtime's own.
#include <windows.h>

#include <cstdlib>
#include <cstring>

namespace {
void* g_blocks[3];
void* g_kept[64];
int g_kept_count = 0;
}  // namespace

extern "C" __declspec(dllexport) void* early_block(int index) {
  return g_blocks[index];
}

// Blocks freed in this DLL's DLL_PROCESS_DETACH: it was loaded before any
// injected DLL, so it detaches after it, at the very end of the process.
extern "C" __declspec(dllexport) void early_keep(void* block) {
  if (g_kept_count < 64) g_kept[g_kept_count++] = block;
}

extern "C" BOOL WINAPI DllMain(HINSTANCE, DWORD reason, LPVOID) {
  if (reason == DLL_PROCESS_ATTACH) {
    for (void*& b : g_blocks) {
      b = std::malloc(64);
      std::strcpy(static_cast<char*>(b), "early");
    }
  } else if (reason == DLL_PROCESS_DETACH) {
    for (int i = 0; i < g_kept_count; ++i) std::free(g_kept[i]);
  }
  return TRUE;
}
