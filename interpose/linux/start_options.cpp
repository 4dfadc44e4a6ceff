// The options the interposer reads at start (issue scope: backend, device,
// driver path; the driver path is read by the loader itself).
#include <stdlib.h>

#include <cstdio>
#include <cstring>

#include "bootstrap.hpp"

namespace mnemosyne {

void read_start_options(StartOptions* options) noexcept {
  if (const char* v = getenv("MNEMOSYNE_BACKEND"); v != nullptr && v[0] != '\0') {
    BackendId id;
    if (parse_backend_name(v, &id)) {
      options->backend = id;
    } else {
      char line[320];
      std::snprintf(line, sizeof line,
                    "mnemosyne: MNEMOSYNE_BACKEND=%.64s is not a backend (unified, device, hbm, "
                    "gddr, pinned, host); using unified",
                    v);
      warn_line(line);
    }
  }
  if (const char* v = getenv("MNEMOSYNE_DEVICE"); v != nullptr && v[0] != '\0') {
    char* end = nullptr;
    const long n = strtol(v, &end, 10);
    if (*end == '\0' && n >= 0 && n < 1024) {
      options->device = static_cast<int>(n);
    } else {
      char line[256];
      std::snprintf(line, sizeof line,
                    "mnemosyne: MNEMOSYNE_DEVICE=%.64s is not a device ordinal; using 0", v);
      warn_line(line);
    }
  }
}

}  // namespace mnemosyne
