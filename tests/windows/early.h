// early.dll: allocates in its DllMain, before an injected DLL arrives.
#pragma once

#include <cstddef>

extern "C" __declspec(dllimport) void* early_block(int index);
extern "C" __declspec(dllimport) void early_keep(void* block);
