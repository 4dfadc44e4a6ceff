#!/usr/bin/env bash
# Installs everything mnemosyne's build and tests need on a Debian 12 machine,
# and fetches Debian's mimalloc source package for the private static copy.
# Idempotent: installs only what is missing, fetches only when absent.
# Usage: scripts/setup.sh [--build]
#   --build: only what building the library and the launcher needs (what
#   scripts/mnemosyne runs on first use); the test toolchain is for
#   scripts/test.sh, which runs this without it.
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

# Tests: GoogleTest; the unmodified programs the end-to-end tests run under the interposer
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
# unpack mimalloc's source.
build_packages=(build-essential g++ gcc meson ninja-build pkg-config nlohmann-json3-dev xz-utils)
packages=(
  "${build_packages[@]}"
  libgtest-dev googletest
  python3 python3-matplotlib git coreutils
  clang-format clang libclang-rt-14-dev valgrind
  gdb openmpi-bin libopenmpi-dev catatonit dumb-init postgresql-15 openjdk-17-jdk-headless
  g++-mingw-w64-x86-64-posix gcc-mingw-w64-x86-64-posix mingw-w64-x86-64-dev wine wine64
  libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0 time redis-server
)

if [ $build_only -eq 1 ]; then packages=("${build_packages[@]}"); fi
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

# CUDA Toolkit headers: only cuda.h and cudaTypedefs.h are used.
if cuda_inc=$("$root/scripts/find-cuda-headers.sh"); then
  say "CUDA headers: $cuda_inc"
else
  say "CUDA Toolkit headers (12.0 or later) not found; looked in: $cuda_inc."
  say "install the CUDA Toolkit (headers suffice) or set CUDA_PATH. The build will stop."
fi

# mimalloc 2.0.9: Debian's source package (meson setup fetches it too).
"$root/scripts/fetch-mimalloc.sh"
say "done"
