#include "inject.hpp"

#include <winternl.h>

#include <cstdio>
#include <cstring>
#include <cwchar>
#include <vector>

namespace mnemosyne::win {
namespace {

using QueryFn = NTSTATUS(NTAPI*)(HANDLE, PROCESSINFOCLASS, PVOID, ULONG, PULONG);

bool read(HANDLE process, std::uintptr_t at, void* out, std::size_t n) noexcept {
  SIZE_T got = 0;
  return ReadProcessMemory(process, reinterpret_cast<void*>(at), out, n, &got) && got == n;
}

// The main image's base in a suspended process: PEB.ImageBaseAddress.
std::uintptr_t image_base(HANDLE process) noexcept {
  auto query = reinterpret_cast<QueryFn>(reinterpret_cast<void*>(
      GetProcAddress(GetModuleHandleA("ntdll.dll"), "NtQueryInformationProcess")));
  PROCESS_BASIC_INFORMATION info{};
  if (query == nullptr || query(process, ProcessBasicInformation, &info, sizeof info, nullptr) != 0)
    return 0;
  std::uintptr_t base = 0;
  if (!read(process, reinterpret_cast<std::uintptr_t>(info.PebBaseAddress) + 0x10, &base,
            sizeof base)) {
    return 0;
  }
  return base;
}

// Memory for the new table within 2 GiB above the image: import RVAs are
// 32-bit offsets from the image base.
std::uintptr_t alloc_near(HANDLE process, std::uintptr_t base, std::uint32_t image_size,
                          std::size_t bytes) noexcept {
  constexpr std::uintptr_t kGranule = 64 * 1024;
  const std::uintptr_t limit = base + 0x7fff0000u - bytes;
  for (std::uintptr_t at = (base + image_size + kGranule - 1) & ~(kGranule - 1); at < limit;
       at += kGranule) {
    void* p = VirtualAllocEx(process, reinterpret_cast<void*>(at), bytes, MEM_RESERVE | MEM_COMMIT,
                             PAGE_READWRITE);
    if (p != nullptr) return reinterpret_cast<std::uintptr_t>(p);
  }
  return 0;
}

bool inject_by_imports(HANDLE process, const wchar_t* dll, char* why, std::size_t len) noexcept {
  const std::uintptr_t base = image_base(process);
  IMAGE_DOS_HEADER dos{};
  IMAGE_NT_HEADERS64 nt{};
  if (base == 0 || !read(process, base, &dos, sizeof dos) || dos.e_magic != IMAGE_DOS_SIGNATURE ||
      !read(process, base + dos.e_lfanew, &nt, sizeof nt) || nt.Signature != IMAGE_NT_SIGNATURE) {
    std::snprintf(why, len, "the new process's image headers could not be read (error %lu)",
                  GetLastError());
    return false;
  }
  if (nt.OptionalHeader.Magic != IMAGE_NT_OPTIONAL_HDR64_MAGIC) {
    std::snprintf(why, len, "it is not a 64-bit image; mnemosyne.dll is 64-bit");
    return false;
  }
  IMAGE_DATA_DIRECTORY* dirs = nt.OptionalHeader.DataDirectory;
  const IMAGE_DATA_DIRECTORY imports = dirs[IMAGE_DIRECTORY_ENTRY_IMPORT];

  // The original descriptors, up to their null terminator.
  std::vector<IMAGE_IMPORT_DESCRIPTOR> descs;
  if (imports.VirtualAddress != 0) {
    for (std::uintptr_t at = base + imports.VirtualAddress;;
         at += sizeof(IMAGE_IMPORT_DESCRIPTOR)) {
      IMAGE_IMPORT_DESCRIPTOR d{};
      if (!read(process, at, &d, sizeof d)) {
        std::snprintf(why, len, "the image's import table could not be read");
        return false;
      }
      if (d.Name == 0 && d.FirstThunk == 0) break;
      descs.push_back(d);
    }
  }

  // The name as the loader reads it: the system code page.
  char name[MAX_PATH * 2] = {};
  if (WideCharToMultiByte(CP_ACP, 0, dll, -1, name, sizeof name, nullptr, nullptr) == 0) {
    std::snprintf(why, len, "the DLL's path does not fit the system code page");
    return false;
  }
  // Layout: payload | descriptors (ours first) + terminator | INT[2] | IAT[2] | name.
  const std::size_t desc_off = sizeof(ImportPayload);
  const std::size_t desc_bytes = (descs.size() + 2) * sizeof(IMAGE_IMPORT_DESCRIPTOR);
  const std::size_t int_off = (desc_off + desc_bytes + 15) & ~std::size_t{15};
  const std::size_t iat_off = int_off + 2 * sizeof(std::uint64_t);
  const std::size_t name_off = iat_off + 2 * sizeof(std::uint64_t);
  const std::size_t total = name_off + std::strlen(name) + 1;
  const std::uintptr_t block = alloc_near(process, base, nt.OptionalHeader.SizeOfImage, total);
  if (block == 0) {
    std::snprintf(why, len, "no memory within 2 GiB of the image for a new import table");
    return false;
  }
  const auto rva = [&](std::size_t off) { return static_cast<DWORD>(block + off - base); };

  std::vector<unsigned char> image(total, 0);
  ImportPayload payload{ImportPayload::kMagic, imports.VirtualAddress, imports.Size,
                        dirs[IMAGE_DIRECTORY_ENTRY_BOUND_IMPORT].VirtualAddress,
                        dirs[IMAGE_DIRECTORY_ENTRY_BOUND_IMPORT].Size};
  std::memcpy(image.data(), &payload, sizeof payload);
  IMAGE_IMPORT_DESCRIPTOR ours{};
  ours.OriginalFirstThunk = rva(int_off);
  ours.Name = rva(name_off);
  ours.FirstThunk = rva(iat_off);
  std::memcpy(image.data() + desc_off, &ours, sizeof ours);
  if (!descs.empty()) {
    std::memcpy(image.data() + desc_off + sizeof ours, descs.data(),
                descs.size() * sizeof(IMAGE_IMPORT_DESCRIPTOR));
  }
  const std::uint64_t by_ordinal_1[2] = {IMAGE_ORDINAL_FLAG64 | 1, 0};
  std::memcpy(image.data() + int_off, by_ordinal_1, sizeof by_ordinal_1);
  std::memcpy(image.data() + iat_off, by_ordinal_1, sizeof by_ordinal_1);
  std::memcpy(image.data() + name_off, name, std::strlen(name) + 1);
  if (!WriteProcessMemory(process, reinterpret_cast<void*>(block), image.data(), total, nullptr)) {
    std::snprintf(why, len, "WriteProcessMemory failed (error %lu)", GetLastError());
    VirtualFreeEx(process, reinterpret_cast<void*>(block), 0, MEM_RELEASE);
    return false;
  }

  // Point the header at the new table; bound imports would bypass it.
  dirs[IMAGE_DIRECTORY_ENTRY_IMPORT].VirtualAddress = rva(desc_off);
  dirs[IMAGE_DIRECTORY_ENTRY_IMPORT].Size = static_cast<DWORD>(desc_bytes);
  dirs[IMAGE_DIRECTORY_ENTRY_BOUND_IMPORT] = IMAGE_DATA_DIRECTORY{0, 0};
  auto* header = reinterpret_cast<void*>(base + dos.e_lfanew);
  DWORD old = 0;
  bool ok = VirtualProtectEx(process, header, sizeof nt, PAGE_READWRITE, &old) &&
            WriteProcessMemory(process, header, &nt, sizeof nt, nullptr);
  if (!ok)
    std::snprintf(why, len, "the image header could not be changed (error %lu)", GetLastError());
  if (old != 0) VirtualProtectEx(process, header, sizeof nt, old, &old);
  if (!ok) VirtualFreeEx(process, reinterpret_cast<void*>(block), 0, MEM_RELEASE);
  return ok;
}

bool inject_by_thread(HANDLE process, const wchar_t* dll, char* why, std::size_t len) noexcept {
  const std::size_t bytes = (std::wcslen(dll) + 1) * sizeof(wchar_t);
  void* remote = VirtualAllocEx(process, nullptr, bytes, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
  if (remote == nullptr) {
    std::snprintf(why, len, "VirtualAllocEx failed (error %lu)", GetLastError());
    return false;
  }
  bool ok = false;
  if (!WriteProcessMemory(process, remote, dll, bytes, nullptr)) {
    std::snprintf(why, len, "WriteProcessMemory failed (error %lu)", GetLastError());
  } else {
    // kernel32 is mapped at the same address in every process of a session.
    auto* load = reinterpret_cast<LPTHREAD_START_ROUTINE>(
        reinterpret_cast<void*>(GetProcAddress(GetModuleHandleA("kernel32.dll"), "LoadLibraryW")));
    HANDLE thread = CreateRemoteThread(process, nullptr, 0, load, remote, 0, nullptr);
    if (thread == nullptr) {
      std::snprintf(why, len, "CreateRemoteThread failed (error %lu)", GetLastError());
    } else {
      DWORD module = 0;  // the low 32 bits of the HMODULE: 0 when it failed
      if (WaitForSingleObject(thread, 60 * 1000) != WAIT_OBJECT_0) {
        std::snprintf(why, len, "LoadLibraryW did not return within 60 s in the new process");
      } else if (!GetExitCodeThread(thread, &module) || module == 0) {
        std::snprintf(why, len, "LoadLibraryW(%ls) failed in the new process", dll);
      } else {
        ok = true;
      }
      CloseHandle(thread);
    }
  }
  if (ok) VirtualFreeEx(process, remote, 0, MEM_RELEASE);
  return ok;
}

}  // namespace

bool inject_dll(HANDLE process, const wchar_t* dll, Method method, char* why,
                std::size_t len) noexcept {
  BOOL wow64 = FALSE;
  if (IsWow64Process(process, &wow64) && wow64) {
    std::snprintf(why, len,
                  "it is a 32-bit program; mnemosyne.dll is 64-bit (a 32-bit build is not made)");
    return false;
  }
  if (method != Method::thread) {
    if (inject_by_imports(process, dll, why, len)) return true;
    if (method == Method::imports) return false;
  }
  return inject_by_thread(process, dll, why, len);
}

}  // namespace mnemosyne::win
