#!/usr/bin/env bash
# Makes sure what mnemosyne's build (and, without --build, its tests) needs is
# here, and puts mimalloc's source in place (scripts/fetch-mimalloc.sh).
# Idempotent: installs only what is missing, fetches only when absent.
# Usage: scripts/setup.sh [--build]
#   --build: only what building the library and the launcher needs (what
#   scripts/mnemosyne runs on first use), on any Linux: checked by command
#   and header; installed with apt-get, dnf, yum or zypper when something is
#   missing and this is root (or has sudo without a password), else named in
#   one message. Without --build: the whole test toolchain of scripts/test.sh,
#   Debian 12's packages, installed with apt-get as root.
set -euo pipefail
build_only=0
case "${1:-}" in
  "") ;;
  --build) build_only=1 ;;
  *) echo "usage: scripts/setup.sh [--build]" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
say() { printf 'setup: %s\n' "$*"; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    say "need root to run: $*"; exit 1
  fi
}

if [ $build_only -eq 1 ]; then
  # What building the library and the launcher needs, checked by the commands
  # and headers the build uses rather than by package names: on any
  # distribution, and for a user without root who has them all, nothing is
  # installed. Each: what is missing, the check, and its package with apt, dnf
  # (and yum) and zypper.
  missing_build=()
  need() {  # description, check command, apt package, dnf package, zypper package
    if ! eval "$2" >/dev/null 2>&1; then missing_build+=("$1|$3|$4|$5"); fi
  }
  meson_new_enough() {  # meson 0.56 or later
    local v; v=$(meson --version 2>/dev/null) || return 1
    [ "$(printf '0.56.0\n%s\n' "$v" | sort -V | head -1)" = 0.56.0 ]
  }
  cxx=$(command -v c++ || command -v g++ || command -v clang++ || true)
  need "a C compiler (cc)" "command -v cc || command -v gcc" gcc gcc gcc
  need "a C++ compiler (c++: GCC 10 or Clang 11 and later)" "[ -n '$cxx' ]" g++ gcc-c++ gcc-c++
  need "meson 0.56 or later" meson_new_enough meson meson meson
  need "ninja" "command -v ninja || command -v samu" ninja-build ninja-build ninja
  need "pkg-config" "command -v pkg-config || command -v pkgconf" pkg-config pkgconf-pkg-config pkg-config
  need "nlohmann-json's headers (nlohmann/json.hpp)" \
    "[ -n '$cxx' ] && printf '#include <nlohmann/json.hpp>\\nint main() {}\\n' | '$cxx' -x c++ -E - -o /dev/null" \
    nlohmann-json3-dev json-devel nlohmann_json-devel
  need "tar and xz (to unpack mimalloc's source)" "command -v tar && command -v xz" xz-utils xz xz

  if [ ${#missing_build[@]} -gt 0 ]; then
    manager=""
    for m in apt-get dnf yum zypper; do
      if command -v "$m" >/dev/null; then manager=$m; break; fi
    done
    column=2
    case "$manager" in apt-get) column=2 ;; dnf|yum) column=3 ;; zypper) column=4 ;; esac
    what=() pkgs=()
    for entry in "${missing_build[@]}"; do
      IFS='|' read -r -a f <<<"$entry"
      what+=("${f[0]}"); pkgs+=("${f[$column - 1]}")
    done
    can_root=0
    if [ "$(id -u)" -eq 0 ]; then can_root=1
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then can_root=1; fi
    if [ -n "$manager" ] && [ $can_root -eq 1 ]; then
      say "installing what building needs: ${pkgs[*]}"
      case "$manager" in
        apt-get) DEBIAN_FRONTEND=noninteractive as_root apt-get update -qq
                 DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "${pkgs[@]}" ;;
        dnf|yum) as_root "$manager" install -y "${pkgs[@]}" ;;
        zypper) as_root zypper --non-interactive install "${pkgs[@]}" ;;
      esac
    else
      {
        echo "setup: building mnemosyne needs what this machine lacks:"
        for w in "${what[@]}"; do echo "setup:   $w"; done
        if [ -n "$manager" ]; then
          echo "setup: as root: $manager install ${pkgs[*]}"
          case "$manager" in dnf|yum)
            echo "setup: (on RHEL and its rebuilds, meson and json-devel come from CRB and EPEL)" ;; esac
        fi
        echo "setup: or put them on PATH (a compiler, meson, ninja from a module or conda) and run again."
      } >&2
      exit 1
    fi
  else
    say "what building needs: all present"
  fi
fi

if [ $build_only -eq 0 ]; then
  # The test toolchain (scripts/test.sh, on Debian 12): GoogleTest; the
  # unmodified programs the end-to-end tests run under the interposer
  # (python3, gcc, git, sort, xz, gdb, OpenMPI's mpirun), clang with libFuzzer
  # and the sanitizer runtimes, valgrind. Windows: the mingw-w64 cross
  # compilers (posix threads: the win32 model lacks std::mutex) and wine, which
  # runs the Windows tests (about 1.1 GB, 30 s). Benchmarks (scripts/bench.sh):
  # Debian's mimalloc, jemalloc and tcmalloc libraries, preloaded side by side,
  # and redis-server for the fork benchmark's BGSAVE case.
  # Signals (tests/e2e, case signals): catatonit reads them from a signalfd,
  # dumb-init with sigwait. A forking database server and a JVM launching
  # children (cases postgres, jvm-launch): PostgreSQL 15 and OpenJDK 17.
  # The library and the launcher: compilers, meson, nlohmann-json, and xz to
  # unpack mimalloc's source. Other Debian releases' root filesystems for the
  # builds-elsewhere phase: debootstrap. ccache, which meson uses when it is
  # there: a run after the first compiles only what changed.
  build_packages=(build-essential g++ gcc meson ninja-build pkg-config nlohmann-json3-dev xz-utils)
  packages=(
    "${build_packages[@]}"
    libgtest-dev googletest
    python3 python3-matplotlib git coreutils
    clang-format clang libclang-rt-14-dev valgrind
    gdb openmpi-bin libopenmpi-dev catatonit dumb-init postgresql-15 openjdk-17-jdk-headless
    g++-mingw-w64-x86-64-posix gcc-mingw-w64-x86-64-posix mingw-w64-x86-64-dev wine wine64
    libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0 time redis-server
    debootstrap ccache
  )

  missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -qq
    as_root apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    say "Debian packages: all present"
  fi
fi

# CUDA Toolkit headers: only cuda.h and cudaTypedefs.h are used.
if cuda_inc=$("$root/scripts/find-cuda-headers.sh"); then
  say "CUDA headers: $cuda_inc"
else
  say "CUDA Toolkit headers (12.0 or later) not found; looked in: $cuda_inc."
  say "install the CUDA Toolkit (headers suffice) or set CUDA_PATH. The build will stop."
fi

# mimalloc 2.0.9's source, patched (meson setup puts it in place too).
"$root/scripts/fetch-mimalloc.sh"
say "done"
