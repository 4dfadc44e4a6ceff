// The fault matrix's program: what each allocation API gives it, one line
// each, whatever the driver does underneath.
//
//   fault_probe MALLOCS ALIGNED
//
// keeps MALLOCS blocks of 1 MiB from malloc (each written), then ALIGNED
// blocks of 4 KiB aligned to 32 MiB (each a segment of its own under the
// interposer), then tries calloc, posix_memalign, realloc and operator new of
// 1 MiB, and reports how many succeeded and the errno of the first failure.
#include <errno.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

namespace {

const char* errno_name(int e) {
  return e == ENOMEM ? "ENOMEM" : (e == 0 ? "0" : "other");
}

// What the probe holds: static, so that it needs no allocation of its own.
constexpr long kMaxKept = 20000;
void* g_kept[kMaxKept];
long g_count = 0;

// Keeps `count` blocks from `get`; prints "<what>: N of COUNT[, then errno]".
template <class Get>
void keep(const char* what, long count, Get get) {
  long ok = 0;
  int first_errno = 0;
  for (long i = 0; i < count; ++i) {
    errno = 0;
    void* p = get();
    if (p == nullptr) {
      if (first_errno == 0) first_errno = errno;
      continue;
    }
    std::memset(p, static_cast<int>(i), 4096);
    if (g_count < kMaxKept) g_kept[g_count++] = p;
    ++ok;
  }
  std::printf("%s: %ld of %ld", what, ok, count);
  if (ok < count) std::printf(", then %s", errno_name(first_errno));
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  static char out[4096];
  std::setvbuf(stdout, out, _IOLBF, sizeof out);  // no malloc for stdout's buffer
  const long mallocs = argc > 1 ? std::atol(argv[1]) : 200;
  const long aligned = argc > 2 ? std::atol(argv[2]) : 4;
  keep("malloc", mallocs, [] { return std::malloc(1 << 20); });
  keep("aligned_alloc", aligned, [] { return std::aligned_alloc(std::size_t{32} << 20, 4096); });
  keep("calloc", 1, [] { return std::calloc(1024, 1024); });
  keep("posix_memalign", 1, [] {
    void* p = nullptr;
    const int rc = posix_memalign(&p, 64, 1 << 20);
    errno = rc;
    return rc == 0 ? p : nullptr;
  });
  keep("realloc", 1, [] { return std::realloc(nullptr, 1 << 20); });
  try {
    char* p = new char[1 << 20];
    std::memset(p, 1, 4096);
    std::printf("new: ok\n");
    delete[] p;
  } catch (const std::bad_alloc&) {
    std::printf("new: bad_alloc\n");
  }
  for (long i = 0; i < g_count; ++i) std::free(g_kept[i]);
  return 0;
}
