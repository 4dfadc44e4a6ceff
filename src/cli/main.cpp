// mnemosyne: run a command with its heap in GPU-reachable memory, or report
// what the CUDA driver and devices offer.
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "backend/backend_id.hpp"
#include "backend/backends.hpp"
#include "backend/loader.hpp"
#include "backend/probe.hpp"

namespace mnemosyne::cli {
namespace {

constexpr const char* kUsage =
    "usage: mnemosyne run [--backend B] [--device N] -- COMMAND [ARGS...]\n"
    "       mnemosyne info\n"
    "       mnemosyne --help | --version\n"
    "\n"
    "run   runs COMMAND with libmnemosyne.so preloaded: its malloc/new heap comes from\n"
    "      the chosen backend (unified, device, hbm, gddr, pinned, host; default unified)\n"
    "      on device N (default 0). Exits with COMMAND's exit status.\n"
    "info  prints the CUDA driver found (or why none was), its devices, and which\n"
    "      backends can allocate. Exit 0 when a CUDA backend works, 1 otherwise.\n";

std::string self_dir() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  buf[n] = '\0';
  std::string path(buf);
  return path.substr(0, path.rfind('/'));
}

// The preload library next to this launcher: build tree, then install tree.
std::string find_library() {
  const std::string dir = self_dir();
  for (const char* rel :
       {"/../../interpose/libmnemosyne.so", "/../lib/libmnemosyne.so",
        "/../lib/x86_64-linux-gnu/libmnemosyne.so", "/../lib64/libmnemosyne.so"}) {
    std::string candidate = dir + rel;
    char real[PATH_MAX];
    if (realpath(candidate.c_str(), real) != nullptr && access(real, R_OK) == 0) return real;
  }
  return {};
}

int fail(const char* message) {
  std::fprintf(stderr, "mnemosyne: %s\n", message);
  return 2;
}

int cmd_run(int argc, char** argv) {
  std::string backend = "unified";
  std::string device;
  int i = 0;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) return nullptr;
      (void)name;
      return argv[++i];
    };
    if (arg == "--backend") {
      const char* v = value("--backend");
      if (v == nullptr)
        return fail("--backend needs a value (unified, device, hbm, gddr, pinned, host)");
      BackendId id;
      if (!parse_backend_name(v, &id)) {
        std::fprintf(stderr,
                     "mnemosyne: unknown backend '%s'; choose unified, device, hbm, gddr, pinned "
                     "or host\n",
                     v);
        return 2;
      }
      backend = v;
    } else if (arg == "--device") {
      const char* v = value("--device");
      char* end = nullptr;
      if (v == nullptr || (strtol(v, &end, 10), *end != '\0') || v[0] == '\0' || v[0] == '-') {
        return fail("--device needs a device ordinal (0, 1, ...)");
      }
      device = v;
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg.rfind("-", 0) == 0) {
      std::fprintf(stderr, "mnemosyne: unknown option '%s' for run\n%s", arg.c_str(), kUsage);
      return 2;
    } else {
      break;  // the command starts here (no "--")
    }
  }
  if (i >= argc) return fail("run needs a command: mnemosyne run [options] -- COMMAND [ARGS...]");

  const std::string lib = find_library();
  if (lib.empty()) {
    return fail("libmnemosyne.so not found next to the launcher; rebuild with scripts/mnemosyne");
  }
  std::string preload = lib;
  if (const char* old = getenv("LD_PRELOAD"); old != nullptr && old[0] != '\0') {
    preload += ":";
    preload += old;
  }
  setenv("LD_PRELOAD", preload.c_str(), 1);
  setenv("MNEMOSYNE_BACKEND", backend.c_str(), 1);
  if (!device.empty()) setenv("MNEMOSYNE_DEVICE", device.c_str(), 1);
  execvp(argv[i], argv + i);
  const int err = errno;
  std::fprintf(stderr, "mnemosyne: cannot run '%s': %s\n", argv[i], strerror(err));
  return err == ENOENT ? 127 : 126;
}

bool backend_works(BackendId id) {
  constexpr std::size_t kProbeSize = std::size_t{2} << 20;
  return with_backend(id, [&]<MemoryBackend B>() {
    void* p = B::allocate(kProbeSize);
    if (p == nullptr) return false;
    static_cast<volatile char*>(p)[0] = 1;
    return B::deallocate(p, kProbeSize);
  });
}

int cmd_info() {
  static DriverReport report;
  probe_driver(&report);
  if (report.available) {
    std::printf("driver: %s (CUDA %d.%d)\n", report.path, report.version / 1000,
                (report.version % 1000) / 10);
  } else {
    std::printf("driver: none (%s)\n", report.reason);
  }
  std::printf("devices: %d\n", report.device_count);
  bool pageable_everywhere = report.device_count > 0;
  for (int d = 0; d < report.device_count && d < DriverReport::kMaxDevices; ++d) {
    const DeviceReport& dev = report.devices[d];
    std::printf(
        "  %d: %s, %.1f GiB, compute %d.%d, concurrentManagedAccess=%d, "
        "pageableMemoryAccess=%d\n",
        dev.ordinal, dev.name, static_cast<double>(dev.total_memory) / (1 << 30), dev.compute_major,
        dev.compute_minor, dev.concurrent_managed_access, dev.pageable_memory_access);
    pageable_everywhere = pageable_everywhere && dev.pageable_memory_access != 0;
  }
  if (pageable_everywhere) {
    std::printf(
        "note: every device can access pageable host memory (HMM/ATS): plain malloc "
        "memory is already GPU-accessible, mnemosyne is not needed for access\n");
  }
  std::printf("backends:\n");
  bool any_cuda = false;
  for (int i = 1; i < kBackendCount; ++i) {
    const auto id = static_cast<BackendId>(i);
    const bool ok = backend_works(id);
    any_cuda = any_cuda || (ok && is_cuda_backend(id));
    std::printf("  %-8s %s\n", backend_name(id), ok ? "works" : "cannot allocate");
  }
  if (!any_cuda) {
    std::fprintf(stderr, "mnemosyne: no CUDA backend can allocate: %s\n",
                 report.available ? "the driver refused every allocation" : report.reason);
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace mnemosyne::cli

int main(int argc, char** argv) {
  using namespace mnemosyne::cli;
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "run") return cmd_run(argc - 2, argv + 2);
  if (cmd == "info") return cmd_info();
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (cmd == "--version") {
    std::printf("mnemosyne %s\n", MNEMOSYNE_VERSION);
    return 0;
  }
  std::fprintf(stderr, "mnemosyne: unknown command '%s'\n%s", cmd.c_str(), kUsage);
  return 2;
}
