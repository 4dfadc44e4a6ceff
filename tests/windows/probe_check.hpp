// The failure count of the Windows probes (api_probe, crt_probe): a failed
// check prints one line and the probe exits 1 at the end.
#pragma once

#include <cstdio>

namespace probe {

inline int failures = 0;

inline void check(bool ok, const char* what) {
  if (!ok) {
    std::printf("FAILED %s\n", what);
    ++failures;
  }
}

}  // namespace probe
