// detours_layout_inject.exe --dll=PATH [--no-payload] [--earlier-guid] [--show-layout]
//                           [--] PROGRAM [ARGS...]
//
// Starts PROGRAM with DLL loaded the way Microsoft Detours' withdll.exe
// (DetourCreateProcessWithDllEx) leaves a suspended process, so that
// mnemosyne.dll is tested against Detours' layout without Detours itself,
// which cannot be fetched here. Written from reading Detours' sources
// (src/creatwth.cpp: DetourUpdateProcessWithDllEx, RecordExeRestore,
// FindAndAllocateNearBase, DetourCopyPayloadToProcessEx; src/uimports.cpp:
// UpdateImports64); no code of theirs is in this file. What it does:
//  - records the image's DOS header, NT headers and section headers (the
//    DETOUR_EXE_RESTORE record DetourRestoreAfterWith copies back);
//  - builds a new import table: DLL's descriptor first (importing ordinal
//    1), then the image's own descriptors, 8-byte padding, the thunks, the
//    name; puts it at the start of a fresh 64 KiB-aligned allocation in the
//    first free region at or after the end of the image's code and data,
//    so the bytes before the table are usually not mapped at all;
//  - points the header's import directory at it, clears the bound-import
//    directory, sets the IAT directory when the image had none, zeroes the
//    checksum;
//  - copies the record into the process as Detours' payload: a small block
//    shaped like an image whose one section, ".detour", holds a section
//    header and a GUID-tagged record (--no-payload leaves it out: the
//    layout of a foreign injector mnemosyne.dll knows nothing of;
//    --earlier-guid tags it as earlier versions of Detours did);
//  - resumes the program with the standard handles passed on and returns
//    its exit code.
// --show-layout writes one line to stderr, "detours-layout: ...", saying
// where the table went and whether the bytes before it are mapped.
#include <windows.h>
#include <winternl.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "command_line.hpp"

using mnemosyne::win::append_quoted;
using mnemosyne::win::narrow;

namespace {

// Detours' binary structures (detours.h, 64-bit), as it writes them.
#pragma pack(push, 8)
struct SectionHeader {  // DETOUR_SECTION_HEADER
  DWORD header_size;
  DWORD signature;
  DWORD data_offset;
  DWORD data_size;
  DWORD unused[12];  // original import/IAT/image fields, CLR flags, reserved
};
struct SectionRecord {  // DETOUR_SECTION_RECORD: one payload, tagged by GUID
  DWORD bytes;          // this record and its data
  DWORD reserved;
  GUID guid;
};
struct ClrHeader {  // DETOUR_CLR_HEADER: the start of IMAGE_COR20_HEADER
  ULONG cb;
  USHORT major, minor;
  IMAGE_DATA_DIRECTORY metadata;
  ULONG flags;
};
struct ExeRestore {  // DETOUR_EXE_RESTORE
  DWORD cb;
  DWORD dos_bytes, nt_bytes, clr_bytes;
  BYTE* dos_at;
  BYTE* nt_at;
  BYTE* clr_at;
  IMAGE_DOS_HEADER dos;
  union {
    IMAGE_NT_HEADERS64 nt;
    BYTE raw[sizeof(IMAGE_NT_HEADERS64) + 32 * sizeof(IMAGE_SECTION_HEADER)];
  };
  ClrHeader clr;
};
#pragma pack(pop)
static_assert(sizeof(SectionHeader) == 64 && sizeof(SectionRecord) == 24);
static_assert(sizeof(ExeRestore) == 0x688, "Detours asserts this size on 64-bit");

constexpr DWORD kSectionSignature = 0x00727444;  // "Dtr\0"
// DETOUR_EXE_RESTORE_GUID of Detours' current sources (src/modules.cpp),
// and the one earlier versions of them used for the same record.
constexpr GUID kRestoreGuid = {
    0xbda26f34, 0xbc82, 0x4829, {0x9e, 0x64, 0x74, 0x2c, 0x04, 0xc8, 0x4f, 0xa0}};
constexpr GUID kRestoreGuidEarlier = {
    0x2ed7a3ff, 0x3339, 0x4a8d, {0x80, 0x5c, 0xd4, 0x98, 0x15, 0x3f, 0xc2, 0x8f}};
constexpr std::uintptr_t kGranule = 64 * 1024;  // MM_ALLOCATION_GRANULARITY

bool read(HANDLE process, std::uintptr_t at, void* out, std::size_t n) {
  SIZE_T got = 0;
  return ReadProcessMemory(process, reinterpret_cast<void*>(at), out, n, &got) && got == n;
}

bool write(HANDLE process, std::uintptr_t at, const void* from, std::size_t n) {
  SIZE_T put = 0;
  return WriteProcessMemory(process, reinterpret_cast<void*>(at), from, n, &put) && put == n;
}

// PEB.ImageBaseAddress of a suspended process. (Detours finds the image by
// walking the process's memory for the one non-DLL PE image; the address
// is the same, and how it is found changes nothing of the layout.)
std::uintptr_t image_base(HANDLE process) {
  using QueryFn = NTSTATUS(NTAPI*)(HANDLE, PROCESSINFOCLASS, PVOID, ULONG, PULONG);
  auto query = reinterpret_cast<QueryFn>(reinterpret_cast<void*>(
      GetProcAddress(GetModuleHandleA("ntdll.dll"), "NtQueryInformationProcess")));
  PROCESS_BASIC_INFORMATION info{};
  std::uintptr_t base = 0;
  if (query == nullptr ||
      query(process, ProcessBasicInformation, &info, sizeof info, nullptr) != 0 ||
      !read(process, reinterpret_cast<std::uintptr_t>(info.PebBaseAddress) + 0x10, &base,
            sizeof base)) {
    return 0;
  }
  return base;
}

// The headers as they are before anything changes (RecordExeRestore).
bool record_restore(HANDLE process, std::uintptr_t base, ExeRestore& r) {
  std::memset(&r, 0, sizeof r);
  r.cb = sizeof r;
  r.dos_at = reinterpret_cast<BYTE*>(base);
  r.dos_bytes = sizeof r.dos;
  if (!read(process, base, &r.dos, sizeof r.dos)) return false;
  r.nt_at = r.dos_at + r.dos.e_lfanew;
  const std::uintptr_t nt_at = base + r.dos.e_lfanew;
  if (!read(process, nt_at, &r.nt, offsetof(IMAGE_NT_HEADERS64, OptionalHeader))) return false;
  r.nt_bytes = offsetof(IMAGE_NT_HEADERS64, OptionalHeader) + r.nt.FileHeader.SizeOfOptionalHeader +
               r.nt.FileHeader.NumberOfSections * sizeof(IMAGE_SECTION_HEADER);
  if (r.nt_bytes > sizeof r.raw || !read(process, nt_at, r.raw, r.nt_bytes)) return false;
  const IMAGE_DATA_DIRECTORY clr =
      r.nt.OptionalHeader.DataDirectory[IMAGE_DIRECTORY_ENTRY_COM_DESCRIPTOR];
  if (clr.VirtualAddress != 0 && clr.Size != 0) {
    r.clr_at = r.dos_at + clr.VirtualAddress;
    r.clr_bytes = sizeof r.clr;
    if (!read(process, base + clr.VirtualAddress, &r.clr, sizeof r.clr)) return false;
  }
  return true;
}

// The first free region at or after `from`, rounded up to the allocation
// granularity, tried granule by granule; the table must stay within 4 GiB
// of the image (32-bit RVAs). FindAndAllocateNearBase's search.
std::uintptr_t allocate_near(HANDLE process, std::uintptr_t module, std::uintptr_t from,
                             DWORD bytes) {
  MEMORY_BASIC_INFORMATION mbi{};
  for (std::uintptr_t at = from;;
       at = reinterpret_cast<std::uintptr_t>(mbi.BaseAddress) + mbi.RegionSize) {
    if (VirtualQueryEx(process, reinterpret_cast<void*>(at), &mbi, sizeof mbi) == 0) return 0;
    if ((mbi.RegionSize & 0xfff) == 0xfff) return 0;  // the end of the address space
    if (mbi.State != MEM_FREE) continue;
    const std::uintptr_t region = reinterpret_cast<std::uintptr_t>(mbi.BaseAddress);
    std::uintptr_t p = ((region > from ? region : from) + kGranule - 1) & ~(kGranule - 1);
    for (; p < region + mbi.RegionSize; p += kGranule) {
      if (p + bytes - 1 - module > 0xffffffffu) return 0;
      void* got = VirtualAllocEx(process, reinterpret_cast<void*>(p), bytes,
                                 MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
      if (got != nullptr) return reinterpret_cast<std::uintptr_t>(got);
    }
  }
}

struct Rewrite {
  std::uintptr_t table = 0;  // where the new import table starts
  DWORD bytes = 0;
};

// UpdateImports64's rewrite, for one DLL. False with the reason in `why`.
bool rewrite_imports(HANDLE process, std::uintptr_t base, const char* dll, Rewrite& out,
                     std::string& why) {
  IMAGE_DOS_HEADER dos{};
  IMAGE_NT_HEADERS64 nt{};
  if (!read(process, base, &dos, sizeof dos) ||
      !read(process, base + dos.e_lfanew, &nt, sizeof nt)) {
    why = "the image headers could not be read";
    return false;
  }
  if (nt.OptionalHeader.Magic != IMAGE_NT_OPTIONAL_HDR64_MAGIC) {
    why = "not a 64-bit image";
    return false;
  }
  IMAGE_DATA_DIRECTORY* dirs = nt.OptionalHeader.DataDirectory;
  IMAGE_DATA_DIRECTORY& imports = dirs[IMAGE_DIRECTORY_ENTRY_IMPORT];
  IMAGE_DATA_DIRECTORY& iat = dirs[IMAGE_DIRECTORY_ENTRY_IAT];
  dirs[IMAGE_DIRECTORY_ENTRY_BOUND_IMPORT] = IMAGE_DATA_DIRECTORY{0, 0};

  // No IAT directory: the loader would look for the import directory's
  // section, and the new table lies in none; name that section instead.
  const std::uintptr_t sections = base + dos.e_lfanew +
                                  offsetof(IMAGE_NT_HEADERS64, OptionalHeader) +
                                  nt.FileHeader.SizeOfOptionalHeader;
  for (WORD i = 0; i < nt.FileHeader.NumberOfSections; ++i) {
    IMAGE_SECTION_HEADER s{};
    if (!read(process, sections + i * sizeof s, &s, sizeof s)) {
      why = "a section header could not be read";
      return false;
    }
    if (iat.VirtualAddress == 0 && imports.VirtualAddress >= s.VirtualAddress &&
        imports.VirtualAddress < s.VirtualAddress + s.SizeOfRawData) {
      iat = IMAGE_DATA_DIRECTORY{s.VirtualAddress, s.SizeOfRawData};
    }
  }

  // The image's descriptors: as many as the directory's size holds.
  const DWORD old_count = imports.Size / sizeof(IMAGE_IMPORT_DESCRIPTOR);
  std::vector<IMAGE_IMPORT_DESCRIPTOR> old(old_count);
  if (imports.VirtualAddress != 0 && old_count != 0 &&
      !read(process, base + imports.VirtualAddress, old.data(), old_count * sizeof old[0])) {
    why = "the import directory could not be read";
    return false;
  }
  // GNU ld's directory size runs on past the null descriptor into the
  // lookup tables; Detours copies all of it, and the loader stops at the
  // first null descriptor, which must be among what was copied.
  bool ended = false;
  for (const auto& d : old) ended = ended || (d.Name == 0 && d.FirstThunk == 0);
  if (old_count != 0 && !ended) {
    why = "the import directory's size leaves out its null descriptor";
    return false;
  }

  const std::size_t name_len = std::strlen(dll) + 1;
  const DWORD thunks_off =
      static_cast<DWORD>(((1 + old_count) * sizeof(IMAGE_IMPORT_DESCRIPTOR) + 7) & ~std::size_t{7});
  const DWORD name_off = thunks_off + 4 * sizeof(std::uint64_t);
  const DWORD total = static_cast<DWORD>(name_off + ((name_len + 3) & ~std::size_t{3}));
  std::vector<unsigned char> table(total, 0);

  // Detours' first candidate: past the image's code and data.
  std::uintptr_t from = base + nt.OptionalHeader.BaseOfCode + nt.OptionalHeader.SizeOfCode +
                        nt.OptionalHeader.SizeOfInitializedData +
                        nt.OptionalHeader.SizeOfUninitializedData;
  if (from < base) from = base;
  const std::uintptr_t at = allocate_near(process, base, from, total);
  if (at == 0) {
    why = "no free memory within 4 GiB after the image for the new import table";
    return false;
  }
  const DWORD rva = static_cast<DWORD>(at - base);

  IMAGE_IMPORT_DESCRIPTOR ours{};
  ours.OriginalFirstThunk = rva + thunks_off;
  ours.FirstThunk = rva + thunks_off + 2 * sizeof(std::uint64_t);
  ours.Name = rva + name_off;
  std::memcpy(table.data(), &ours, sizeof ours);
  if (old_count != 0)
    std::memcpy(table.data() + sizeof ours, old.data(), old_count * sizeof old[0]);
  const std::uint64_t ordinal_1[4] = {IMAGE_ORDINAL_FLAG64 | 1, 0, IMAGE_ORDINAL_FLAG64 | 1, 0};
  std::memcpy(table.data() + thunks_off, ordinal_1, sizeof ordinal_1);
  std::memcpy(table.data() + name_off, dll, name_len);
  if (!write(process, at, table.data(), table.size())) {
    why = "the new import table could not be written";
    return false;
  }

  if (iat.VirtualAddress == 0) iat = IMAGE_DATA_DIRECTORY{rva, total};
  imports = IMAGE_DATA_DIRECTORY{rva, total};
  nt.OptionalHeader.CheckSum = 0;
  DWORD old_protect = 0;
  auto* headers = reinterpret_cast<void*>(base);
  if (!VirtualProtectEx(process, headers, nt.OptionalHeader.SizeOfHeaders, PAGE_READWRITE,
                        &old_protect)) {
    why = "the image headers could not be made writable";
    return false;
  }
  const bool ok =
      write(process, base, &dos, sizeof dos) && write(process, base + dos.e_lfanew, &nt, sizeof nt);
  VirtualProtectEx(process, headers, nt.OptionalHeader.SizeOfHeaders, old_protect, &old_protect);
  if (!ok) {
    why = "the image headers could not be written";
    return false;
  }
  out.table = at;
  out.bytes = total;
  return true;
}

// DetourCopyPayloadToProcessEx: a block anywhere in the process, shaped as
// a PE image (DOS header, NT headers marking a DLL, one section header)
// whose section ".detour" holds a section header and the record.
std::uintptr_t copy_payload(HANDLE process, const GUID& guid, const void* data, DWORD bytes) {
  const DWORD section_at =
      sizeof(IMAGE_DOS_HEADER) + sizeof(IMAGE_NT_HEADERS64) + sizeof(IMAGE_SECTION_HEADER);
  const DWORD section_bytes = sizeof(SectionHeader) + sizeof(SectionRecord) + bytes;
  std::vector<unsigned char> block(section_at + section_bytes, 0);

  IMAGE_DOS_HEADER dos{};
  dos.e_magic = IMAGE_DOS_SIGNATURE;
  dos.e_lfanew = sizeof dos;
  IMAGE_NT_HEADERS64 nt{};
  nt.Signature = IMAGE_NT_SIGNATURE;
  nt.FileHeader.SizeOfOptionalHeader = sizeof nt.OptionalHeader;
  nt.FileHeader.Characteristics = IMAGE_FILE_DLL;
  nt.FileHeader.NumberOfSections = 1;
  nt.OptionalHeader.Magic = IMAGE_NT_OPTIONAL_HDR64_MAGIC;
  IMAGE_SECTION_HEADER section{};
  std::memcpy(section.Name, ".detour", 8);
  section.VirtualAddress = section_at;
  section.SizeOfRawData = section_bytes;
  SectionHeader header{};
  header.header_size = sizeof header;
  header.signature = kSectionSignature;
  header.data_offset = sizeof header;
  header.data_size = section_bytes;
  SectionRecord record{};
  record.bytes = sizeof record + bytes;
  record.guid = guid;

  unsigned char* p = block.data();
  std::memcpy(p, &dos, sizeof dos);
  std::memcpy(p += sizeof dos, &nt, sizeof nt);
  std::memcpy(p += sizeof nt, &section, sizeof section);
  std::memcpy(p += sizeof section, &header, sizeof header);
  std::memcpy(p += sizeof header, &record, sizeof record);
  std::memcpy(p += sizeof record, data, bytes);

  // MEM_COMMIT alone, as Detours asks: the system reserves the range too.
  void* at = VirtualAllocEx(process, nullptr, block.size(), MEM_COMMIT, PAGE_READWRITE);
  if (at == nullptr) return 0;
  const auto where = reinterpret_cast<std::uintptr_t>(at);
  return write(process, where, block.data(), block.size()) ? where : 0;
}

// "mapped" or "not mapped": what a read of the bytes just before `at` finds.
const char* before(HANDLE process, std::uintptr_t at) {
  MEMORY_BASIC_INFORMATION mbi{};
  if (VirtualQueryEx(process, reinterpret_cast<void*>(at - 1), &mbi, sizeof mbi) == 0 ||
      mbi.State != MEM_COMMIT || (mbi.Protect & (PAGE_NOACCESS | PAGE_GUARD)) != 0) {
    return "not mapped";
  }
  return "mapped";
}

int fail(int code, const std::string& line) {
  std::fprintf(stderr, "detours_layout_inject: %s\n", line.c_str());
  return code;
}

}  // namespace

int wmain(int argc, wchar_t** argv) {
  std::string dll;
  bool payload = true, show = false;
  const GUID* guid = &kRestoreGuid;
  int i = 1;
  for (; i < argc; ++i) {
    const std::wstring arg = argv[i];
    if (arg == L"--") {
      ++i;
      break;
    }
    if (arg.rfind(L"--dll=", 0) == 0) {
      dll = narrow(arg.c_str() + 6);
    } else if (arg == L"--no-payload") {
      payload = false;
    } else if (arg == L"--earlier-guid") {
      guid = &kRestoreGuidEarlier;
    } else if (arg == L"--show-layout") {
      show = true;
    } else {
      break;
    }
  }
  if (dll.empty() || i >= argc) {
    return fail(2,
                "usage: detours_layout_inject --dll=PATH [--no-payload] [--show-layout] "
                "[--] PROGRAM [ARGS...]");
  }
  std::wstring cmd;
  for (int k = i; k < argc; ++k) append_quoted(cmd, argv[k]);
  std::vector<wchar_t> line(cmd.begin(), cmd.end());
  line.push_back(L'\0');

  STARTUPINFOW si{};
  si.cb = sizeof si;
  si.dwFlags = STARTF_USESTDHANDLES;  // without it the child's output vanishes under wine
  si.hStdInput = GetStdHandle(STD_INPUT_HANDLE);
  si.hStdOutput = GetStdHandle(STD_OUTPUT_HANDLE);
  si.hStdError = GetStdHandle(STD_ERROR_HANDLE);
  PROCESS_INFORMATION pi{};
  if (!CreateProcessW(nullptr, line.data(), nullptr, nullptr, TRUE, CREATE_SUSPENDED, nullptr,
                      nullptr, &si, &pi)) {
    return fail(127,
                "cannot start " + narrow(argv[i]) + ": error " + std::to_string(GetLastError()));
  }
  const std::uintptr_t base = image_base(pi.hProcess);
  static ExeRestore restore;  // 1.6 KiB: not on the stack
  std::string why = "the image base could not be found";
  Rewrite rewrite;
  std::uintptr_t payload_at = 0;
  bool ok = base != 0 && record_restore(pi.hProcess, base, restore);
  if (ok) ok = rewrite_imports(pi.hProcess, base, dll.c_str(), rewrite, why);
  if (ok && payload) {
    payload_at = copy_payload(pi.hProcess, *guid, &restore, sizeof restore);
    ok = payload_at != 0;
    if (!ok) why = "the payload could not be copied into the process";
  }
  if (!ok) {
    TerminateProcess(pi.hProcess, 126);
    return fail(126, "cannot lay out " + narrow(argv[i]) + ": " + why);
  }
  if (show) {
    std::fprintf(stderr,
                 "detours-layout: import table at image+0x%llx (%lu bytes), the bytes before it "
                 "%s; payload %s\n",
                 static_cast<unsigned long long>(rewrite.table - base),
                 static_cast<unsigned long>(rewrite.bytes), before(pi.hProcess, rewrite.table),
                 payload_at != 0 ? "copied" : "left out");
    std::fflush(stderr);
  }
  ResumeThread(pi.hThread);
  CloseHandle(pi.hThread);
  WaitForSingleObject(pi.hProcess, INFINITE);
  DWORD code = 1;
  GetExitCodeProcess(pi.hProcess, &code);
  CloseHandle(pi.hProcess);
  return static_cast<int>(code);
}
