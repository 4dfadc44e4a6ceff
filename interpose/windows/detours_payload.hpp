// Microsoft Detours' payloads in this process: what DetourCreateProcessWithDllEx
// (withdll.exe) leaves for the injected DLL, found as Detours' own
// DetourFindPayloadEx finds it (src/modules.cpp), but reading nothing it
// has not checked is readable (readable.hpp), where Detours relies on
// catching the fault. Layouts as Detours' detours.h declares them (64-bit).
#pragma once

#include <windows.h>

#include <cstddef>

namespace mnemosyne::win::detours {

#pragma pack(push, 8)
// At the start of a ".detour" section.
struct SectionHeader {
  DWORD header_size;  // at least sizeof(SectionHeader)
  DWORD signature;    // kSectionSignature
  DWORD data_offset;  // the first record, from the header (0: header_size)
  DWORD data_size;    // the header and its records
  DWORD unused[12];
};
// One payload: `bytes` (this record and its data) then the data.
struct SectionRecord {
  DWORD bytes;
  DWORD reserved;
  GUID guid;
};
// The start of the CLR header (IMAGE_COR20_HEADER).
struct ClrHeader {
  ULONG cb;
  USHORT major, minor;
  IMAGE_DATA_DIRECTORY metadata;
  ULONG flags;
};
// DETOUR_EXE_RESTORE: the main image's headers as they were before Detours
// rewrote its imports, and where they go back (DetourRestoreAfterWith).
struct ExeRestore {
  DWORD cb;  // sizeof(ExeRestore)
  DWORD dos_bytes, nt_bytes, clr_bytes;
  BYTE* dos_at;
  BYTE* nt_at;
  BYTE* clr_at;
  IMAGE_DOS_HEADER dos;
  union {
    IMAGE_NT_HEADERS64 nt;  // followed by the section headers, nt_bytes in all
    BYTE raw[sizeof(IMAGE_NT_HEADERS64) + 32 * sizeof(IMAGE_SECTION_HEADER)];
  };
  ClrHeader clr;
};
#pragma pack(pop)
static_assert(sizeof(SectionHeader) == 64 && sizeof(SectionRecord) == 24);
static_assert(sizeof(ExeRestore) == 0x688, "detours.h asserts this size for 64-bit");

constexpr DWORD kSectionSignature = 0x00727444;  // "Dtr\0"

// DETOUR_EXE_RESTORE_GUID as Detours' current sources define it, and as
// earlier versions of the same sources did, with the same 0x688-byte record.
constexpr GUID kExeRestoreGuid = {
    0xbda26f34, 0xbc82, 0x4829, {0x9e, 0x64, 0x74, 0x2c, 0x04, 0xc8, 0x4f, 0xa0}};
constexpr GUID kExeRestoreGuidEarlier = {
    0x2ed7a3ff, 0x3339, 0x4a8d, {0x80, 0x5c, 0xd4, 0x98, 0x15, 0x3f, 0xc2, 0x8f}};

// The data of the first payload tagged `guid` in any module of this process
// (a real one, or the image-shaped block DetourCopyPayloadToProcess
// writes), with its size in `bytes`; every byte of it readable. nullptr if
// none.
const void* find_payload(const GUID& guid, std::size_t* bytes) noexcept;

}  // namespace mnemosyne::win::detours
