#!/usr/bin/env bash
# Installs everything mnemosyne's build and tests need on a Debian 12 machine,
# and fetches Debian's mimalloc source package for the private static copy.
# Idempotent: installs only what is missing, fetches only when absent.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
say() { printf 'setup: %s\n' "$*"; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    say "need root to run: $*"; exit 1
  fi
}

# Build: compilers, meson, GoogleTest. Tests: the unmodified programs the
# end-to-end tests run under the interposer (python3, gcc, git, sort, xz).
packages=(
  build-essential g++ gcc meson ninja-build pkg-config
  libgtest-dev googletest
  python3 python3-matplotlib git xz-utils coreutils
  clang-format
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

# CUDA Toolkit headers: only cuda.h and cudaTypedefs.h are used.
cuda_inc="${CUDA_PATH:+$CUDA_PATH/include}"
if [ -n "$cuda_inc" ] && [ -f "$cuda_inc/cudaTypedefs.h" ]; then
  say "CUDA headers: $cuda_inc"
elif [ -f /usr/local/cuda/include/cudaTypedefs.h ]; then
  say "CUDA headers: /usr/local/cuda/include"
else
  say "CUDA Toolkit headers not found in \$CUDA_PATH/include nor /usr/local/cuda/include;"
  say "install the CUDA Toolkit (headers suffice) or set CUDA_PATH. The build will stop."
fi

# mimalloc 2.0.9: Debian's source package, as the wrap file names it.
pkgfiles="$root/subprojects/packagefiles"
tarball="mimalloc_2.0.9+ds.orig.tar.xz"
want_hash=$(sed -n 's/^source_hash *= *//p' "$root/subprojects/mimalloc.wrap")
if [ -f "$pkgfiles/$tarball" ] && echo "$want_hash  $pkgfiles/$tarball" | sha256sum -c --quiet 2>/dev/null; then
  say "mimalloc source: present"
else
  say "fetching Debian's mimalloc source package (apt-get source)"
  work=$(mktemp -d); chmod 755 "$work"
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/parts" "$work/lists/partial" "$work/dl"
  # Derive a deb-src list from this machine's own apt sources, in a private
  # directory, so the system's apt configuration and state stay untouched.
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    sed -n 's/^[[:space:]]*deb[[:space:]]/deb-src /p' "$f" >>"$work/parts/derived.list"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    sed 's/^Types:[[:space:]]*deb[[:space:]]*$/Types: deb-src/' "$f" >"$work/parts/$(basename "$f")"
  done
  apt_opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$work/parts"
            -o "Dir::State::Lists=$work/lists" -o Debug::NoLocking=1)
  apt-get "${apt_opts[@]}" update -qq
  (cd "$work/dl" && apt-get "${apt_opts[@]}" source --download-only -qq mimalloc=2.0.9+ds-2 2>&1 |
     grep -v 'unsandboxed' || true)
  if [ ! -f "$work/dl/$tarball" ]; then
    say "apt-get source did not produce $tarball"; exit 1
  fi
  mkdir -p "$pkgfiles"
  cp "$work/dl/$tarball" "$pkgfiles/$tarball"
  echo "$want_hash  $pkgfiles/$tarball" | sha256sum -c --quiet
  say "mimalloc source: $pkgfiles/$tarball"
fi
say "done"
