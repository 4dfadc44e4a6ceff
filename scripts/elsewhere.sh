#!/usr/bin/env bash
# Beyond Debian 12: mnemosyne from a fresh clone, built and run in root
# filesystems of Debian 13 and Debian 11 (scripts/rootfs.sh) by a user
# without root, as a new user on those machines would; and the library this
# machine built, run there. The phase "builds elsewhere" of scripts/test.sh
# (docs/testing.md lists the rows). Prints one line per row and exits 1 when
# any row failed, with the end of that row's log.
#
#   scripts/elsewhere.sh [BUILD]   BUILD: this machine's release build
#                                   (default build/), whose preload library
#                                   the last rows load in the other releases
#
# Debian 13's apt has no mimalloc 2.0.9 and Debian 11's none at all: there
# the source comes from upstream's repository, which is the git bundle in
# ../shared/fixtures (scripts/find-fixtures.sh) standing in for the network;
# without it the rows that need it fail, saying so. Needs root (chroot).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
host_build=$(cd "${1:-$root/build}" && pwd)

fail=0
work=$(mktemp -d /var/tmp/mnemosyne-elsewhere.XXXXXX)
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"

fixtures=$("$root/scripts/find-fixtures.sh") || fixtures=""
bundle="$fixtures/mimalloc-v2.0.9.bundle"
cuda13=$(readlink -f "$("$root/scripts/find-cuda-headers.sh")") || cuda13=""

# A fresh clone (what is committed) for each release, writable by builder;
# and the steps that run inside (scripts/elsewhere-steps.sh).
for clone in src13 src11; do git clone -q "$root" "$work/$clone"; done
cp "$root/scripts/elsewhere-steps.sh" "$work/steps.sh"
chown -R 1500:1500 "$work/src13" "$work/src11"

binds="$work"
[ -n "$fixtures" ] && binds="$binds:$fixtures"
[ -n "$cuda13" ] && binds="$binds:$cuda13"

row() {  # suite, title, step args...
  local suite=$1 title=$2; shift 2
  local log="$work/row.log" start=$SECONDS src="$work/src13"
  [ "$suite" = bullseye ] && src="$work/src11"
  if BIND_DIRS="$binds:$host_build" AS_BUILDER=1 "$root/scripts/rootfs.sh" run "$suite" \
       env SRC="$src" CUDA13="${cuda13%/include}" BUNDLE="$bundle" \
       bash "$work/steps.sh" "$@" >"$log" 2>&1; then
    printf 'elsewhere: %-58s ok (%d s)%s\n' "$title" $((SECONDS - start)) \
      "$(sed -n 's/^result: /; /p' "$log" | tr -d '\n')"
  else
    printf 'elsewhere: %-58s FAILED (%d s):\n' "$title" $((SECONDS - start))
    tail -30 "$log" | sed 's/^/    /'
    fail=1
  fi
}

for suite in trixie bullseye; do
  if ! "$root/scripts/rootfs.sh" make "$suite" >/dev/null; then
    echo "elsewhere: no $suite root filesystem (scripts/rootfs.sh make $suite): FAILED"
    exit 1
  fi
done
[ -n "$fixtures" ] || echo "elsewhere: ../shared/fixtures is absent: mimalloc's upstream source has no stand-in"

row trixie "Debian 13, CUDA 13.0: the README's first command" first-use
row trixie "Debian 13, CUDA 13.0: unit tests" unit build
row trixie "Debian 13, CUDA 13.0: a forked python3 over the double" fork build
row trixie "Debian 13, CUDA 12.4 (nvidia-cuda-dev): build, unit tests" unit build-124 /opt/cuda-12.4
row trixie "Debian 13, CUDA 12.4: a forked python3 over the double" fork build-124
row trixie "Debian 12's library in Debian 13: a forked python3" preload "$host_build" build

# This machine's library built to load on an older glibc too
# (-Dglibc_compat=true), from a fresh clone, for the last row.
compat_start=$SECONDS
git clone -q "$root" "$work/src12"
if (cd "$work/src12" && export CCACHE_BASEDIR="$work/src12" CCACHE_NOHASHDIR=true &&
      meson setup "$work/build12" -Dtests=false -Dglibc_compat=true &&
      ninja -C "$work/build12" interpose/libmnemosyne.so) >"$work/build12.log" 2>&1; then
  printf 'elsewhere: %-58s ok (%d s)\n' "Debian 12, -Dglibc_compat=true: the library" \
    $((SECONDS - compat_start))
else
  printf 'elsewhere: %-58s FAILED (%d s):\n' "Debian 12, -Dglibc_compat=true: the library" \
    $((SECONDS - compat_start))
  tail -30 "$work/build12.log" | sed 's/^/    /'
  fail=1
fi
row bullseye "Debian 11, CUDA 13.0: the README's first command" first-use
row bullseye "Debian 11, CUDA 13.0: unit tests" unit build
row bullseye "Debian 11, CUDA 13.0: a forked python3 over the double" fork build
row bullseye "Debian 12's library (glibc_compat) in Debian 11: a forked python3" preload "$work/build12" build
exit $fail
