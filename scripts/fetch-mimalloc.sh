#!/usr/bin/env bash
# Fetches Debian's mimalloc source package (2.0.9+ds-2), the tarball the wrap
# file subprojects/mimalloc.wrap names, into subprojects/packagefiles/.
# Needs apt-get and the machine's Debian sources; no root: apt's lists go to a
# private directory, the system's apt state is not touched. Does nothing when
# the tarball is present with the right hash. Run by scripts/setup.sh and by
# meson setup (meson.build) on a fresh clone.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
say() { printf 'setup: %s\n' "$*" >&2; }
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
