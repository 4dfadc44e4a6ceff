// Whether the program's import directory, as it reads it once running, is
// the one in its file: an injector that loads a DLL through a rewritten
// import table must leave the program's own back (Detours' restore
// payload, or mnemosyne's injector's marker), and a program that walks its
// imports must not see the rewrite. Prints the data directories it compares
// and the DLLs the in-memory import directory names, allocates one block
// and prints it (the runner checks where it landed), and exits 1 when the
// headers differ from the file's.
//
// Built twice (tests/windows/meson.build): as is, and with IMPORT_PROBE_BIG,
// which adds megabytes of .rdata, .data and .bss so that the image ends
// elsewhere and a new import table lands at another distance from it.
#include <windows.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#ifdef IMPORT_PROBE_BIG
// Visible outside this file and read through volatile pointers, so that
// neither the compiler nor the linker drops them.
extern const unsigned char g_rodata[(3 << 20) + 12345] = {1, 2, 3};
unsigned char g_data[(1 << 20) + 777] = {7};
unsigned char g_bss[40 << 20];

unsigned big_sections_sum() {
  volatile unsigned char* bss = g_bss;
  bss[sizeof g_bss - 1] = 5;
  const volatile unsigned char* ro = g_rodata;
  const volatile unsigned char* data = g_data;
  return ro[0] + ro[sizeof g_rodata - 1] + data[0] + bss[sizeof g_bss - 1];
}
#endif

namespace {

// The NT headers as the file holds them. False when the file cannot be read.
bool file_headers(IMAGE_NT_HEADERS64* out) {
  wchar_t path[MAX_PATH * 2];
  const DWORD n = GetModuleFileNameW(nullptr, path, MAX_PATH * 2);
  if (n == 0 || n >= MAX_PATH * 2) return false;
  HANDLE f = CreateFileW(path, GENERIC_READ, FILE_SHARE_READ | FILE_SHARE_DELETE, nullptr,
                         OPEN_EXISTING, 0, nullptr);
  if (f == INVALID_HANDLE_VALUE) return false;
  static unsigned char head[64 * 1024];
  DWORD got = 0;
  const bool read = ReadFile(f, head, sizeof head, &got, nullptr);
  CloseHandle(f);
  IMAGE_DOS_HEADER dos;
  if (!read || got < sizeof dos) return false;
  std::memcpy(&dos, head, sizeof dos);
  if (dos.e_lfanew < 0 || static_cast<DWORD>(dos.e_lfanew) + sizeof *out > got) return false;
  std::memcpy(out, head + dos.e_lfanew, sizeof *out);
  return true;
}

}  // namespace

int main() {
  auto* base = reinterpret_cast<const unsigned char*>(GetModuleHandleW(nullptr));
  IMAGE_DOS_HEADER dos;
  std::memcpy(&dos, base, sizeof dos);
  IMAGE_NT_HEADERS64 mem;
  std::memcpy(&mem, base + dos.e_lfanew, sizeof mem);
  IMAGE_NT_HEADERS64 file;
  if (!file_headers(&file)) {
    std::printf("import_probe: the executable's file could not be read\n");
    return 2;
  }

  int differences = 0;
  static const struct {
    int index;
    const char* name;
  } kDirs[] = {{IMAGE_DIRECTORY_ENTRY_IMPORT, "import"},
               {IMAGE_DIRECTORY_ENTRY_BOUND_IMPORT, "bound import"},
               {IMAGE_DIRECTORY_ENTRY_IAT, "IAT"}};
  for (const auto& d : kDirs) {
    const IMAGE_DATA_DIRECTORY m = mem.OptionalHeader.DataDirectory[d.index];
    const IMAGE_DATA_DIRECTORY f = file.OptionalHeader.DataDirectory[d.index];
    const bool same = m.VirtualAddress == f.VirtualAddress && m.Size == f.Size;
    std::printf("import_probe: %s directory rva 0x%lx size 0x%lx%s\n", d.name,
                static_cast<unsigned long>(m.VirtualAddress), static_cast<unsigned long>(m.Size),
                same ? "" : " (the file has another)");
    differences += same ? 0 : 1;
  }
  for (int i = 0; i < IMAGE_NUMBEROF_DIRECTORY_ENTRIES; ++i) {
    const IMAGE_DATA_DIRECTORY m = mem.OptionalHeader.DataDirectory[i];
    const IMAGE_DATA_DIRECTORY f = file.OptionalHeader.DataDirectory[i];
    if (m.VirtualAddress != f.VirtualAddress || m.Size != f.Size) ++differences;
  }
  if (mem.OptionalHeader.CheckSum != file.OptionalHeader.CheckSum) {
    std::printf("import_probe: checksum 0x%lx, the file's 0x%lx\n",
                static_cast<unsigned long>(mem.OptionalHeader.CheckSum),
                static_cast<unsigned long>(file.OptionalHeader.CheckSum));
    ++differences;
  }

  // The DLLs the in-memory directory names: the loader has just walked it.
  std::printf("import_probe: imports");
  const DWORD at = mem.OptionalHeader.DataDirectory[IMAGE_DIRECTORY_ENTRY_IMPORT].VirtualAddress;
  if (at != 0) {
    for (auto* d = reinterpret_cast<const IMAGE_IMPORT_DESCRIPTOR*>(base + at);
         d->Name != 0 || d->FirstThunk != 0; ++d) {
      std::printf(" %s", reinterpret_cast<const char*>(base + d->Name));
    }
  }
  std::printf("\n");

  const std::size_t size = 4000;
  char* p = static_cast<char*>(std::malloc(size));
  std::memset(p, 'x', size);
  std::printf("block probe %p %zu\n", static_cast<void*>(p), size);
  std::free(p);
#ifdef IMPORT_PROBE_BIG
  std::printf("import_probe: big sections %u\n", big_sections_sum());
#endif
  std::printf("import_probe: %s\n", differences == 0 ? "the headers are the file's"
                                                     : "the headers differ from the file's");
  return differences == 0 ? 0 : 1;
}
