#include "detours_payload.hpp"

#include <cstdint>
#include <cstring>

#include "readable.hpp"

namespace mnemosyne::win::detours {
namespace {

template <class T>
bool copy_checked(std::uintptr_t at, T* out) noexcept {
  if (!readable(reinterpret_cast<const void*>(at), sizeof(T))) return false;
  std::memcpy(out, reinterpret_cast<const void*>(at), sizeof(T));
  return true;
}

// The ".detour" section of what looks like a PE image at `module`, whose
// memory region holds `region_bytes` from there (DetourEnumerateModules'
// test, then GetPayloadSectionFromModule's). 0 when there is none.
std::uintptr_t detour_section(std::uintptr_t module, std::size_t region_bytes) noexcept {
  IMAGE_DOS_HEADER dos;
  if (!copy_checked(module, &dos) || dos.e_magic != IMAGE_DOS_SIGNATURE ||
      dos.e_lfanew < static_cast<LONG>(sizeof dos) ||
      static_cast<std::size_t>(dos.e_lfanew) > region_bytes) {
    return 0;
  }
  struct {
    DWORD signature;
    IMAGE_FILE_HEADER file;
  } nt;
  const std::uintptr_t nt_at = module + static_cast<std::uintptr_t>(dos.e_lfanew);
  if (!copy_checked(nt_at, &nt) || nt.signature != IMAGE_NT_SIGNATURE ||
      nt.file.SizeOfOptionalHeader == 0) {
    return 0;
  }
  const std::uintptr_t sections = nt_at + sizeof nt + nt.file.SizeOfOptionalHeader;
  for (WORD i = 0; i < nt.file.NumberOfSections; ++i) {
    IMAGE_SECTION_HEADER s;
    if (!copy_checked(sections + i * sizeof s, &s)) return 0;
    // Detours compares the name with strcmp: ".detour" and its NUL fill all 8 bytes.
    if (std::memcmp(s.Name, ".detour", 8) == 0) {
      return s.VirtualAddress != 0 && s.SizeOfRawData != 0 ? module + s.VirtualAddress : 0;
    }
  }
  return 0;
}

// The record tagged `guid` in the section at `at` (DetourFindPayload).
const void* find_in_section(std::uintptr_t at, const GUID& guid, std::size_t* bytes) noexcept {
  SectionHeader header;
  if (!copy_checked(at, &header) || header.header_size < sizeof header ||
      header.signature != kSectionSignature) {
    return nullptr;
  }
  const std::uintptr_t end = at + header.data_size;
  for (std::uintptr_t p = at + (header.data_offset != 0 ? header.data_offset : header.header_size);
       p < end;) {
    SectionRecord record;
    // A record shorter than itself would never move p on.
    if (!copy_checked(p, &record) || record.bytes < sizeof record) return nullptr;
    if (std::memcmp(&record.guid, &guid, sizeof guid) == 0) {
      const auto* data = reinterpret_cast<const void*>(p + sizeof record);
      const std::size_t n = record.bytes - sizeof record;
      if (!readable(data, n)) return nullptr;
      *bytes = n;
      return data;
    }
    p += record.bytes;
  }
  return nullptr;
}

}  // namespace

const void* find_payload(const GUID& guid, std::size_t* bytes) noexcept {
  // Every region of the address space from the first 64 KiB on, as
  // DetourEnumerateModules walks it: a module's headers start a region.
  MEMORY_BASIC_INFORMATION region{};
  for (std::uintptr_t at = 64 * 1024;;
       at = reinterpret_cast<std::uintptr_t>(region.BaseAddress) + region.RegionSize) {
    if (VirtualQuery(reinterpret_cast<const void*>(at), &region, sizeof region) != sizeof region ||
        region.RegionSize == 0) {
      return nullptr;
    }
    if (!readable(region)) continue;
    const std::size_t region_bytes =
        reinterpret_cast<std::uintptr_t>(region.BaseAddress) + region.RegionSize - at;
    if (const std::uintptr_t section = detour_section(at, region_bytes)) {
      if (const void* data = find_in_section(section, guid, bytes)) return data;
    }
  }
}

}  // namespace mnemosyne::win::detours
