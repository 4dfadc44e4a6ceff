// The value parsers: booleans, byte sizes and size ranges.
#include <cstdint>

#include "config/internal.hpp"
#include "config/options.hpp"

namespace mnemosyne::config {
namespace {

using detail::ascii_lower;
using detail::equals_ci;
using detail::is_digit;

// Parses text[0, len) as a size: digits, then optionally one of K M G T
// (1024-based) followed by nothing, "i", "iB" or "B", or a lone "B"; all
// case-insensitive. No sign, blank or fraction. False on overflow.
bool parse_size_n(const char* text, std::size_t len, std::size_t* out) noexcept {
  std::size_t digits = 0;
  while (digits < len && is_digit(text[digits])) ++digits;
  std::uint64_t value = 0;
  if (!detail::parse_decimal(text, digits, SIZE_MAX, &value)) return false;

  const char* unit = text + digits;
  const std::size_t unit_len = len - digits;
  unsigned shift = 0;
  const char* rest = unit;
  std::size_t rest_len = unit_len;
  if (unit_len > 0) {
    switch (ascii_lower(unit[0])) {
      case 'k':
        shift = 10;
        break;
      case 'm':
        shift = 20;
        break;
      case 'g':
        shift = 30;
        break;
      case 't':
        shift = 40;
        break;
      default:
        break;
    }
    if (shift != 0) {
      ++rest;
      --rest_len;
    }
  }
  if (rest_len != 0) {
    const bool suffix_ok =
        equals_ci(rest, rest_len, "b") ||
        (shift != 0 && (equals_ci(rest, rest_len, "i") || equals_ci(rest, rest_len, "ib")));
    if (!suffix_ok) return false;
  }
  if (shift != 0 && value > (std::uint64_t{SIZE_MAX} >> shift)) return false;
  *out = static_cast<std::size_t>(value << shift);
  return true;
}

}  // namespace

bool parse_bool(const char* text, bool* out) noexcept {
  if (text == nullptr) return false;
  const std::size_t len = detail::length(text);
  static constexpr const char* kTrue[] = {"", "1", "true", "yes", "on"};
  static constexpr const char* kFalse[] = {"0", "false", "no", "off"};
  for (const char* word : kTrue) {
    if (equals_ci(text, len, word)) {
      *out = true;
      return true;
    }
  }
  for (const char* word : kFalse) {
    if (equals_ci(text, len, word)) {
      *out = false;
      return true;
    }
  }
  return false;
}

bool parse_size(const char* text, std::size_t* out) noexcept {
  if (text == nullptr) return false;
  return parse_size_n(text, detail::length(text), out);
}

bool parse_size_range(const char* text, std::size_t* min, std::size_t* max) noexcept {
  if (text == nullptr) return false;
  const std::size_t len = detail::length(text);
  std::size_t colon = 0;
  while (colon < len && text[colon] != ':') ++colon;

  std::size_t lo = 0;
  std::size_t hi = SIZE_MAX;
  if (colon == len) {  // "min"
    if (!parse_size_n(text, len, &lo)) return false;
  } else {  // "min:max" or ":max"; "min:" and ":" are malformed
    if (colon > 0 && !parse_size_n(text, colon, &lo)) return false;
    if (!parse_size_n(text + colon + 1, len - colon - 1, &hi)) return false;
  }
  if (lo > hi) return false;
  *min = lo;
  *max = hi;
  return true;
}

}  // namespace mnemosyne::config
