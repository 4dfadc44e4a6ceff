// Finding libmnemosyne.so and plot_stats.py from the launcher's own location,
// never from a path fixed at build time: a build tree and an installed tree
// (under any prefix or DESTDIR) both work, and so does a moved one.
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "cli/cli.hpp"

#ifndef MNEMOSYNE_LIBDIR
#error "MNEMOSYNE_LIBDIR (meson's libdir, relative to the prefix) must be defined"
#endif
#ifndef MNEMOSYNE_BINDIR
#error "MNEMOSYNE_BINDIR (meson's bindir, relative to the prefix) must be defined"
#endif
#ifndef MNEMOSYNE_DATADIR
#error "MNEMOSYNE_DATADIR (meson's datadir, relative to the prefix) must be defined"
#endif

namespace mnemosyne::cli {
namespace {

bool is_file(const std::string& path) {
  return access(path.c_str(), R_OK) == 0;
}

// dir/rel, or rel itself when meson's option was an absolute path.
std::string under(const std::string& dir, const char* rel) {
  if (rel[0] == '/') return rel;
  return dir + "/" + rel;
}

std::string canonical(const std::string& path) {
  char real[PATH_MAX];
  if (realpath(path.c_str(), real) == nullptr) return path;
  return real;
}

// Removes "." and "dir/.." segments without asking the file system, for
// messages (the launcher's own directory is already free of links).
std::string lexically_normal(const std::string& path) {
  if (path.empty()) return ".";
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (start <= path.size()) {
    std::size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    const std::string part = path.substr(start, end - start);
    if (part == "..") {
      if (!parts.empty() && parts.back() != "..") {
        parts.pop_back();
      } else if (path[0] != '/') {
        parts.push_back(part);
      }
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    start = end + 1;
  }
  std::string out = path[0] == '/' ? "/" : "";
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += "/";
    out += parts[i];
  }
  return out.empty() ? "." : out;
}

Located first_of(std::initializer_list<std::string> candidates) {
  Located found;
  for (const std::string& c : candidates) {
    if (!found.tried.empty()) found.tried += ", ";
    found.tried += lexically_normal(c);
    if (found.path.empty() && is_file(c)) found.path = canonical(c);
  }
  return found;
}

}  // namespace

std::string launcher_directory() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return {};
  buf[n] = '\0';
  std::string path(buf);
  const std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {};
  return slash == 0 ? "/" : path.substr(0, slash);
}

bool in_build_tree() {
  const std::string dir = launcher_directory();
  return !dir.empty() && is_file(dir + "/../../build.ninja");
}

// The installed prefix: the launcher's directory less bindir's components
// ("bin" is one level). An absolute bindir says nothing; then its parent.
std::string installed_prefix(const std::string& dir) {
  std::string prefix = dir + "/..";
  const std::string_view bindir = MNEMOSYNE_BINDIR;
  if (bindir.empty() || bindir[0] == '/') return prefix;
  prefix = dir;
  std::size_t pos = 0;
  while (pos < bindir.size()) {
    std::size_t end = bindir.find('/', pos);
    if (end == std::string_view::npos) end = bindir.size();
    const std::string_view part = bindir.substr(pos, end - pos);
    if (!part.empty() && part != ".") prefix += "/..";
    pos = end + 1;
  }
  return prefix;
}

Located find_preload_library() {
  const std::string dir = launcher_directory();
  if (dir.empty()) return {{}, "(cannot read /proc/self/exe)"};
  const std::string build = dir + "/../../interpose/libmnemosyne.so";
  const std::string installed = under(installed_prefix(dir), MNEMOSYNE_LIBDIR) + "/libmnemosyne.so";
  if (in_build_tree()) return first_of({build});
  return first_of({installed});
}

Located find_plot_script() {
  const std::string dir = launcher_directory();
  if (dir.empty()) return {{}, "(cannot read /proc/self/exe)"};
  const std::string build = dir + "/plot_stats.py";
  const std::string installed =
      under(installed_prefix(dir), MNEMOSYNE_DATADIR) + "/mnemosyne/plot_stats.py";
  if (in_build_tree()) return first_of({build});
  return first_of({installed});
}

}  // namespace mnemosyne::cli
