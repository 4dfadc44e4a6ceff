// mnemosyne.dll's entry points: DllMain, and ordinal 1 for Detours.
#include <windows.h>

#include "start.hpp"

extern "C" BOOL WINAPI DllMain(HINSTANCE self, DWORD reason, LPVOID) {
  if (reason == DLL_PROCESS_ATTACH) mnemosyne::win::attach(self);
  // DLL_PROCESS_DETACH: nothing is unpatched or released. Other modules'
  // exit code (atexit handlers, static destructors, DllMains detaching after
  // this one) still calls the redirected functions, and the heap stays mapped
  // until the process is gone.
  return TRUE;
}

// Detours' DetourCreateProcessWithDllEx and withdll.exe require the injected
// DLL to export ordinal 1; Detours calls it (through rundll32) only to finish
// a helper process of the other bitness, which a 64-bit-only DLL never needs.
extern "C" void CALLBACK DetourFinishHelperProcess(HWND, HINSTANCE, LPSTR, INT) {}
