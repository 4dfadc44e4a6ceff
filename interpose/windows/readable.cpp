#include "readable.hpp"

#include <cstdint>

namespace mnemosyne::win {

bool readable(const MEMORY_BASIC_INFORMATION& region) noexcept {
  constexpr DWORD kReadable = PAGE_READONLY | PAGE_READWRITE | PAGE_WRITECOPY | PAGE_EXECUTE_READ |
                              PAGE_EXECUTE_READWRITE | PAGE_EXECUTE_WRITECOPY;
  return region.State == MEM_COMMIT && (region.Protect & kReadable) != 0 &&
         (region.Protect & (PAGE_GUARD | PAGE_NOACCESS)) == 0;
}

bool readable(const void* at, std::size_t n) noexcept {
  auto p = reinterpret_cast<std::uintptr_t>(at);
  const std::uintptr_t end = p + n;
  if (end < p) return false;
  // Region by region: a range may span several with different protections.
  while (p < end) {
    MEMORY_BASIC_INFORMATION region{};
    if (VirtualQuery(reinterpret_cast<const void*>(p), &region, sizeof region) != sizeof region ||
        !readable(region) || region.RegionSize == 0) {
      return false;
    }
    p = reinterpret_cast<std::uintptr_t>(region.BaseAddress) + region.RegionSize;
  }
  return true;
}

}  // namespace mnemosyne::win
