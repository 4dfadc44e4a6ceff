#!/usr/bin/env bash
# Root filesystems of other Debian releases, for the phase of scripts/test.sh
# that builds and runs mnemosyne beyond Debian 12 (docs/testing.md).
#
#   scripts/rootfs.sh make SUITE         make it once (debootstrap), print its path
#   scripts/rootfs.sh run SUITE CMD...   run CMD in it (chroot, private mounts)
#
# SUITE: bullseye (Debian 11: glibc 2.31, GCC 10, meson 0.56, the toolchain
# generation of Ubuntu 20.04/22.04 and RHEL 8/9) or trixie (Debian 13: glibc
# 2.41, GCC 14), or any suite debootstrap knows. Each is debootstrap's
# minbase plus what building mnemosyne and its unit tests needs, and is
# cached under $ROOTFS_CACHE (default /var/cache/mnemosyne/rootfs):
# a few minutes the first time on a machine, nothing after. trixie also keeps
# the CUDA 12.4 headers of its nvidia-cuda-dev package (non-free) in
# /opt/cuda-12.4/include (only the headers, not the 900 MB package).
# The mirror is the one this machine's apt sources name, or ROOTFS_MIRROR
# (a release that has left it, as Debian 11 will for its archive). Not
# MNEMOSYNE_* variables: the preloaded library warns about names it does not
# know, and the suite runs it. Needs root, debootstrap and unshare.
#
# `run` mounts /proc, /dev and /tmp (a tmpfs) in a mount namespace of its
# own, so nothing stays mounted when it ends, and binds BIND_DIRS (a
# colon-separated list of host directories) at the same paths inside. With
# AS_BUILDER=1 the command runs as the user `builder` (uid 1500), who is not
# root, as a user of a shared machine builds.
set -euo pipefail

say() { printf 'rootfs: %s\n' "$*" >&2; }
cache=${ROOTFS_CACHE:-/var/cache/mnemosyne/rootfs}
# ccache: meson uses it when it is there, as on many users' machines; its
# cache (builder's, inside the root filesystem) outlives the clones, so the
# phase's builds after the first compile only what changed.
packages=build-essential,meson,ninja-build,pkg-config,nlohmann-json3-dev,xz-utils,git,python3,libgtest-dev,ca-certificates,ccache
# Bumped when what a root filesystem holds changes in a way that needs it
# made again (a package added is installed into the one there).
version=1

mirror() {  # the Debian mirror this machine's apt uses (not its security one)
  if [ -n "${ROOTFS_MIRROR:-}" ]; then echo "$ROOTFS_MIRROR"; return; fi
  local uri
  uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | sed -n 's/^URIs:[[:space:]]*//p' |
          tr ' ' '\n' | grep -v security | head -1 || true)
  if [ -z "$uri" ]; then
    uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
            sed -n 's/^[[:space:]]*deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p' |
            grep -v security | head -1 || true)
  fi
  [ -n "$uri" ] || { say "no Debian mirror in this machine's apt sources"; exit 1; }
  echo "$uri"
}

make_rootfs() {  # suite
  local suite=$1 dir="$cache/$1" stamp="$cache/$1/.mnemosyne-rootfs"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version $packages" ]; then
    echo "$dir"; return
  fi
  if [ -f "$stamp" ] && [ "$(cut -d' ' -f1 "$stamp")" = "$version" ]; then
    say "installing into $suite: ${packages//,/ }"
    if inside "$dir" apt-get update -qq >>"$cache/$suite.log" 2>&1 &&
       inside "$dir" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
         ${packages//,/ } >>"$cache/$suite.log" 2>&1; then
      inside "$dir" apt-get clean
      echo "$version $packages" >"$stamp"
      echo "$dir"; return
    fi
    say "could not install into $suite; making it again"
  fi
  command -v debootstrap >/dev/null || { say "debootstrap is not installed"; exit 1; }
  local m; m=$(mirror)
  local tmp="$cache/.$suite.partial"
  rm -rf "$tmp" "$dir"
  mkdir -p "$cache"
  say "making $suite in $dir (debootstrap, a few minutes, once)"
  debootstrap --variant=minbase --include="$packages" "$suite" "$tmp" "$m" >"$cache/$suite.log" 2>&1 || {
    say "debootstrap $suite failed:"; tail -20 "$cache/$suite.log" >&2; exit 1; }
  if [ "$suite" = trixie ]; then
    # The CUDA 12.4 toolkit's headers, as Debian 13 packages them.
    echo "deb $m $suite non-free" >"$tmp/etc/apt/sources.list.d/non-free.list"
    inside "$tmp" apt-get update -qq >>"$cache/$suite.log" 2>&1
    inside "$tmp" bash -c 'cd /tmp && apt-get download -qq nvidia-cuda-dev &&
      mkdir -p /opt/cuda-12.4 && dpkg-deb --fsys-tarfile nvidia-cuda-dev_*.deb |
      tar -x -C /opt/cuda-12.4 --strip-components=2 --wildcards "./usr/include/*.h" &&
      test -f /opt/cuda-12.4/include/cuda.h' >>"$cache/$suite.log" 2>&1 || {
      say "nvidia-cuda-dev's headers could not be had:"; tail -20 "$cache/$suite.log" >&2; exit 1; }
    rm -f "$tmp/etc/apt/sources.list.d/non-free.list"
  fi
  inside "$tmp" apt-get clean
  useradd_inside "$tmp"
  echo "$version $packages" >"$tmp/.mnemosyne-rootfs"
  mv "$tmp" "$dir"
  echo "$dir"
}

useradd_inside() {  # dir: a user without root, for builds as a user does them
  chroot "$1" useradd -m -u 1500 builder 2>/dev/null || true
}

inside() {  # dir, command...: run in the root filesystem
  local dir=$1; shift
  local binds=${BIND_DIRS:-} user=()
  if [ "${AS_BUILDER:-0}" = 1 ]; then user=(--userspec=1500:1500); fi
  unshare --mount --propagation private -- bash -c '
    set -e
    dir=$1; binds=$2; user=$3; shift 3
    mount --rbind /dev "$dir/dev"
    mount -t proc proc "$dir/proc"
    mount -t tmpfs -o mode=1777 tmpfs "$dir/tmp"
    cp /etc/resolv.conf "$dir/etc/resolv.conf" 2>/dev/null || true
    IFS=: read -r -a list <<<"$binds"
    for b in "${list[@]}"; do
      [ -n "$b" ] || continue
      mkdir -p "$dir$b"
      mount --bind "$b" "$dir$b"
    done
    home=/root
    if [ -n "$user" ]; then home=/home/builder; fi
    exec chroot $user "$dir" /usr/bin/env -i HOME=$home PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin \
      LANG=C.UTF-8 TERM=dumb "$@"
  ' inside "$dir" "$binds" "${user[*]:-}" "$@"
}

case "${1:-}" in
  make) [ $# -eq 2 ] || { echo "usage: scripts/rootfs.sh make SUITE" >&2; exit 2; }
        make_rootfs "$2" ;;
  run)  [ $# -ge 3 ] || { echo "usage: scripts/rootfs.sh run SUITE COMMAND..." >&2; exit 2; }
        suite=$2; shift 2
        dir=$(make_rootfs "$suite")
        inside "$dir" "$@" ;;
  *) echo "usage: scripts/rootfs.sh make SUITE | run SUITE COMMAND..." >&2; exit 2 ;;
esac
