// `mnemosyne info [--json]`: the driver, its devices and which backends can
// allocate (2 MiB allocated, touched and released per backend).
#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "backend/backend_id.hpp"
#include "backend/backends.hpp"
#include "backend/probe.hpp"
#include "cli/cli.hpp"

namespace mnemosyne::cli {
namespace {

constexpr std::string_view kCommand = "info";

bool backend_works(BackendId id) {
  constexpr std::size_t kProbeSize = std::size_t{2} << 20;
  return with_backend(id, [&]<MemoryBackend B>() {
    void* p = B::allocate(kProbeSize);
    if (p == nullptr) return false;
    static_cast<volatile char*>(p)[0] = 1;
    return B::deallocate(p, kProbeSize);
  });
}

struct Report {
  DriverReport driver;
  int listed = 0;  // devices with a DeviceReport
  bool pageable_everywhere = false;
  bool works[kBackendCount] = {};
  bool ok = false;
  std::string reason;
};

std::string version_text(int version) {
  if (version <= 0) return "";
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

void gather(Report* r) {
  probe_driver(&r->driver);
  r->listed = r->driver.device_count < DriverReport::kMaxDevices ? r->driver.device_count
                                                                 : DriverReport::kMaxDevices;
  if (r->listed < 0) r->listed = 0;
  r->pageable_everywhere = r->listed > 0;
  for (int d = 0; d < r->listed; ++d) {
    r->pageable_everywhere =
        r->pageable_everywhere && r->driver.devices[d].pageable_memory_access != 0;
  }
  for (const BackendRow& row : kBackends) {  // the documentation's order
    const BackendId id = row.id;
    const int i = static_cast<int>(id);
    r->works[i] = backend_works(id);
    r->ok = r->ok || (r->works[i] && is_cuda_backend(id));
  }
  if (r->ok) return;
  if (!r->driver.available) {
    r->reason = std::string("no CUDA driver: ") + r->driver.reason;
  } else if (r->driver.device_count <= 0) {
    r->reason = "the CUDA driver reports no device";
  } else {
    r->reason = "the CUDA driver refused a 2 MiB allocation on every CUDA backend (device 0)";
  }
}

void print_text(const Report& r) {
  const DriverReport& d = r.driver;
  if (d.available) {
    std::printf("driver: %s (CUDA %s)\n", d.path, version_text(d.version).c_str());
  } else {
    std::printf("driver: none (%s)\n", d.reason);
  }
  std::printf("devices: %d\n", d.device_count);
  for (int i = 0; i < r.listed; ++i) {
    const DeviceReport& dev = d.devices[i];
    std::printf(
        "  %d: %s, %.1f GiB, compute capability %d.%d, concurrentManagedAccess=%d, "
        "pageableMemoryAccess=%d\n",
        dev.ordinal, dev.name, static_cast<double>(dev.total_memory) / (1 << 30), dev.compute_major,
        dev.compute_minor, dev.concurrent_managed_access, dev.pageable_memory_access);
  }
  if (d.device_count > r.listed) {
    std::printf("  (%d more not listed)\n", d.device_count - r.listed);
  }
  if (r.pageable_everywhere) {
    std::printf(
        "note: every device reports pageableMemoryAccess=1: this system already gives its GPUs "
        "access to pageable host memory (HMM or ATS), so plain malloc memory is GPU-accessible "
        "and the interposer is not needed for access\n");
  }
  std::printf("backends:\n");
  for (const BackendRow& row : kBackends) {  // the documentation's order
    const BackendId id = row.id;
    const int i = static_cast<int>(id);
    std::printf("  %-8s %s%s\n", backend_name(id), r.works[i] ? "works" : "cannot allocate",
                is_cuda_backend(id) ? "" : " (host memory, no driver)");
  }
}

void print_json(const Report& r) {
  using Json = nlohmann::ordered_json;  // keys in the order written here
  const DriverReport& d = r.driver;
  Json devices = Json::array();
  for (int i = 0; i < r.listed; ++i) {
    const DeviceReport& dev = d.devices[i];
    devices.push_back({
        {"ordinal", dev.ordinal},
        {"name", dev.name},
        {"total_memory", static_cast<std::uint64_t>(dev.total_memory)},
        {"compute_capability",
         std::to_string(dev.compute_major) + "." + std::to_string(dev.compute_minor)},
        {"compute_major", dev.compute_major},
        {"compute_minor", dev.compute_minor},
        {"concurrent_managed_access", dev.concurrent_managed_access != 0},
        {"pageable_memory_access", dev.pageable_memory_access != 0},
    });
  }
  Json backends = Json::object();
  for (const BackendRow& row : kBackends) {  // the documentation's order
    const BackendId id = row.id;
    const int i = static_cast<int>(id);
    backends[backend_name(id)] = {{"cuda", is_cuda_backend(id)}, {"works", r.works[i]}};
  }
  const Json doc = {
      {"schema", "mnemosyne-info/1"},
      {"version", MNEMOSYNE_VERSION},
      {"driver",
       {{"available", d.available},
        {"path", d.path},
        {"version", d.version},
        {"version_text", version_text(d.version)},
        {"reason", d.available ? "" : d.reason}}},
      {"device_count", d.device_count},
      {"devices", std::move(devices)},
      {"pageable_memory_access_everywhere", r.pageable_everywhere},
      {"backends", std::move(backends)},
      {"ok", r.ok},
      {"reason", r.reason},
  };
  // Driver and device names come from the driver: invalid UTF-8 in them is
  // replaced, so the output is always valid JSON.
  std::puts(doc.dump(2, ' ', false, Json::error_handler_t::replace).c_str());
}

}  // namespace

int info_command(int argc, char** argv) {
  bool as_json = false;
  for (int i = 0; i < argc; ++i) {
    const std::string_view arg = argv[i];
    std::string_view name;
    std::string_view value;
    bool has_value = false;
    split_option(arg, &name, &value, &has_value);
    if (help_or_version(kCommand, arg)) return 0;
    if (arg == "--json") {
      as_json = true;
    } else if (name == "--cuda-driver") {
      std::string path(value);
      if (!has_value) {
        if (i + 1 >= argc) return usage_error(kCommand, "--cuda-driver needs a path");
        path = argv[++i];
      }
      if (path.empty()) return usage_error(kCommand, "--cuda-driver needs a path");
      setenv("MNEMOSYNE_CUDA_DRIVER", path.c_str(), 1);
    } else if (arg.size() > 1 && arg[0] == '-') {
      return usage_error(kCommand, "unknown option '" + std::string(name) + "'");
    } else {
      return usage_error(
          kCommand, "unexpected argument '" + std::string(arg) + "' (info takes no arguments)");
    }
  }

  static Report report;  // DriverReport is large
  gather(&report);
  if (as_json) {
    print_json(report);
  } else {
    print_text(report);
  }
  std::fflush(stdout);
  if (!report.ok) {
    print_error(kCommand, report.reason);
    return 1;
  }
  return 0;
}

}  // namespace mnemosyne::cli
