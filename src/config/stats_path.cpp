// STATS_FILE patterns: %p is the process id, %% a percent sign.
#include <cstdio>

#include "config/options.hpp"

namespace mnemosyne::config {

bool expand_stats_path(const char* pattern, long pid, char* out, std::size_t out_len) noexcept {
  if (out == nullptr || out_len == 0) return false;
  out[0] = '\0';
  if (pattern == nullptr) return false;

  std::size_t used = 0;  // out[0, used) written, out[used] kept for the NUL
  auto append = [&](const char* text, std::size_t len) noexcept {
    if (len >= out_len - used) return false;
    for (std::size_t i = 0; i < len; ++i) out[used + i] = text[i];
    used += len;
    out[used] = '\0';
    return true;
  };

  for (const char* p = pattern; *p != '\0'; ++p) {
    bool ok = true;
    if (p[0] == '%' && p[1] == 'p') {
      char digits[32];
      const int n = std::snprintf(digits, sizeof digits, "%ld", pid);
      ok = n > 0 && append(digits, static_cast<std::size_t>(n));
      ++p;
    } else if (p[0] == '%' && p[1] == '%') {
      ok = append("%", 1);
      ++p;
    } else {
      ok = append(p, 1);
    }
    if (!ok) {
      out[0] = '\0';
      return false;
    }
  }
  return true;
}

}  // namespace mnemosyne::config
