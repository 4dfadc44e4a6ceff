#include "restore_imports.hpp"

#include <windows.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "detours_payload.hpp"
#include "inject.hpp"
#include "readable.hpp"

namespace mnemosyne::win {
namespace {

struct Image {
  std::uintptr_t base = 0;
  IMAGE_DOS_HEADER dos{};
  IMAGE_NT_HEADERS64 nt{};
  std::uintptr_t nt_at = 0;
};

bool read_image(Image* image) noexcept {
  image->base = reinterpret_cast<std::uintptr_t>(GetModuleHandleW(nullptr));
  const auto* at = reinterpret_cast<const void*>(image->base);
  if (!readable(at, sizeof image->dos)) return false;
  std::memcpy(&image->dos, at, sizeof image->dos);
  if (image->dos.e_magic != IMAGE_DOS_SIGNATURE || image->dos.e_lfanew <= 0) return false;
  image->nt_at = image->base + static_cast<std::uintptr_t>(image->dos.e_lfanew);
  const auto* nt = reinterpret_cast<const void*>(image->nt_at);
  if (!readable(nt, sizeof image->nt)) return false;
  std::memcpy(&image->nt, nt, sizeof image->nt);
  return image->nt.Signature == IMAGE_NT_SIGNATURE &&
         image->nt.OptionalHeader.Magic == IMAGE_NT_OPTIONAL_HDR64_MAGIC;
}

// Header bytes are read-only: made writable for the copy, then put back.
bool write_header(std::uintptr_t at, const void* from, std::size_t n) noexcept {
  auto* to = reinterpret_cast<void*>(at);
  DWORD old = 0;
  if (!VirtualProtect(to, n, PAGE_READWRITE, &old)) return false;
  std::memcpy(to, from, n);
  VirtualProtect(to, n, old, &old);
  return true;
}

// mnemosyne's injector (inject.cpp) writes ImportPayload just before the
// new descriptors, in the same allocation.
bool restore_from_marker(const Image& image) noexcept {
  const IMAGE_DATA_DIRECTORY* dirs = image.nt.OptionalHeader.DataDirectory;
  const std::uintptr_t at =
      image.base + dirs[IMAGE_DIRECTORY_ENTRY_IMPORT].VirtualAddress - sizeof(ImportPayload);
  if (!readable(reinterpret_cast<const void*>(at), sizeof(ImportPayload))) return false;
  ImportPayload payload;
  std::memcpy(&payload, reinterpret_cast<const void*>(at), sizeof payload);
  const DWORD image_size = image.nt.OptionalHeader.SizeOfImage;
  if (payload.magic != ImportPayload::kMagic || payload.import_rva >= image_size ||
      payload.bound_rva >= image_size) {
    return false;
  }
  const IMAGE_DATA_DIRECTORY restored[2] = {{payload.import_rva, payload.import_size},
                                            {payload.bound_rva, payload.bound_size}};
  const std::uintptr_t dirs_at = image.nt_at + offsetof(IMAGE_NT_HEADERS64, OptionalHeader) +
                                 offsetof(IMAGE_OPTIONAL_HEADER64, DataDirectory);
  return write_header(dirs_at + IMAGE_DIRECTORY_ENTRY_IMPORT * sizeof(IMAGE_DATA_DIRECTORY),
                      &restored[0], sizeof restored[0]) &&
         write_header(dirs_at + IMAGE_DIRECTORY_ENTRY_BOUND_IMPORT * sizeof(IMAGE_DATA_DIRECTORY),
                      &restored[1], sizeof restored[1]);
}

// A Detours restore record that is this image's: its headers, of the same
// shape, going back where they are, inside the image's header bytes.
bool fits(const detours::ExeRestore& r, std::size_t bytes, const Image& image) noexcept {
  const IMAGE_FILE_HEADER& file = image.nt.FileHeader;
  const std::size_t nt_bytes = offsetof(IMAGE_NT_HEADERS64, OptionalHeader) +
                               file.SizeOfOptionalHeader +
                               file.NumberOfSections * sizeof(IMAGE_SECTION_HEADER);
  return r.cb == sizeof r && bytes >= r.cb &&
         reinterpret_cast<std::uintptr_t>(r.dos_at) == image.base && r.dos_bytes == sizeof r.dos &&
         std::memcmp(&r.dos, &image.dos, sizeof r.dos) == 0 &&
         reinterpret_cast<std::uintptr_t>(r.nt_at) == image.nt_at && r.nt_bytes == nt_bytes &&
         r.nt_bytes <= sizeof r.raw && r.nt.Signature == IMAGE_NT_SIGNATURE &&
         r.nt.OptionalHeader.Magic == IMAGE_NT_OPTIONAL_HDR64_MAGIC &&
         std::memcmp(&r.nt.FileHeader, &file, sizeof file) == 0 &&
         r.nt.OptionalHeader.SizeOfImage == image.nt.OptionalHeader.SizeOfImage &&
         r.nt.OptionalHeader.DataDirectory[IMAGE_DIRECTORY_ENTRY_IMPORT].VirtualAddress <
             image.nt.OptionalHeader.SizeOfImage &&
         image.dos.e_lfanew + r.nt_bytes <= image.nt.OptionalHeader.SizeOfHeaders &&
         readable(r.nt_at, r.nt_bytes);
}

// What DetourRestoreAfterWith does: the recorded NT and section headers
// copied back (the import, bound-import and IAT directories and the
// checksum Detours changed). The DOS header, which Detours writes back
// unchanged, is already equal. The CLR header of a .NET program is left:
// Detours itself puts it back only when its flags did not change, that is,
// when there is nothing to put back. The payload is not freed: another DLL
// Detours loaded may look for it too.
bool restore_from_detours(const Image& image) noexcept {
  for (const GUID& guid : {detours::kExeRestoreGuid, detours::kExeRestoreGuidEarlier}) {
    std::size_t bytes = 0;
    const void* found = detours::find_payload(guid, &bytes);
    if (found == nullptr || bytes < sizeof(detours::ExeRestore)) continue;
    static detours::ExeRestore record;  // 1.6 KiB, kept off DllMain's stack
    std::memcpy(&record, found, sizeof record);
    if (!fits(record, bytes, image)) continue;
    return write_header(image.nt_at, record.raw, record.nt_bytes);
  }
  return false;
}

}  // namespace

bool restore_import_directory() noexcept {
  Image image;
  if (!read_image(&image)) return false;
  // Both layouts put the new table outside the image (in memory that was
  // free); a directory inside it is the program's own.
  const DWORD at =
      image.nt.OptionalHeader.DataDirectory[IMAGE_DIRECTORY_ENTRY_IMPORT].VirtualAddress;
  if (at < image.nt.OptionalHeader.SizeOfImage) return false;
  return restore_from_marker(image) || restore_from_detours(image);
}

}  // namespace mnemosyne::win
