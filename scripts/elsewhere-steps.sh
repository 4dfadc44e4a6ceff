#!/usr/bin/env bash
# The steps scripts/elsewhere.sh runs inside another release's root
# filesystem, as the user builder (not root), in the fresh clone $SRC:
#   first-use                the README's first command, on a fresh clone
#   unit DIR [CUDA]          configure DIR with the tests (CUDA: the toolkit
#                            whose headers to build against; default CUDA13),
#                            build what the unit tests need, run them
#   fork DIR                 a forked python3 under DIR's launcher, over DIR's
#                            test-double driver: the child reads the heap
#   preload LIBDIR DIR       the same with LIBDIR's libmnemosyne.so preloaded
#                            directly (another machine's build), DIR's double
# A line "result: ..." is what scripts/elsewhere.sh prints beside the row.
# Environment: SRC, CUDA13 (the CUDA 13 toolkit: its include/ is bound
# here), BUNDLE (upstream mimalloc's git bundle, standing in for the network).
set -euo pipefail
cd "$SRC"
# ccache (installed there): compiled objects are reused across fresh clones,
# from builder's cache, which outlives the rows.
export CCACHE_BASEDIR="$SRC" CCACHE_NOHASHDIR=true CCACHE_DIR="$HOME/.cache/ccache"
# Everything else a row writes in a home of its own, as a new user's: the
# root filesystem is cached across runs, and a setting one run left in
# builder's home (the bundle's path in another checkout, which is not bound
# in this run) would decide what this one fetches.
HOME=$(mktemp -d /tmp/home.XXXXXX)
export HOME
# Upstream's repository is the bundle here: git itself redirects, so the
# build fetches as it would from the network.
git config --global url."$BUNDLE".insteadOf https://github.com/microsoft/mimalloc.git

# On a failure, the end of the log that says why.
tail_log() {  # file
  echo "--- the end of $1:"
  tail -25 "$1" 2>/dev/null || echo "(none)"
}

# What a forked child must read: 64 MiB of heap the parent filled.
FORK_PY='
import os, sys
blocks = [bytes([i % 251]) * (1 << 20) for i in range(64)]
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    ok = all(b == bytes([i % 251]) * (1 << 20) for i, b in enumerate(blocks))
    os.write(w, b"1" if ok else b"0")
    sys.exit(0 if ok else 1)  # a normal exit, which writes the statistics of the child
os.close(w)
got = os.read(r, 1)
_, status = os.waitpid(pid, 0)
print("child read the heap:", got == b"1" and status == 0)
'

# The child's and the parent's statistics: the heap was the driver's, and
# the child had it.
check_stats() {  # folder of %p.json files
  python3 - "$1" <<'PY'
import json, os, sys
docs = [json.load(open(os.path.join(sys.argv[1], f))) for f in os.listdir(sys.argv[1])]
parents = [d for d in docs if not d["forked_child"]]
children = [d for d in docs if d["forked_child"]]
assert len(parents) == 1 and len(children) == 1, f"{len(parents)} parents, {len(children)} children"
p = parents[0]
assert p["active_backend"] == "unified", p["active_backend"]
pool = p["pools"].get("unified", {})
assert pool.get("segments", 0) > 0, f"no unified segment: {p['pools']}"
print(f"result: the heap in {pool['segments']} driver segments "
      f"({pool['bytes_reserved'] >> 20} MiB), the child read it")
PY
}

case "$1" in
  first-use)
    export CUDA_PATH="$CUDA13"
    out=$(scripts/mnemosyne run --backend host -- python3 -c 'print("ran under mnemosyne")') ||
      { tail_log build-first-use.log; exit 1; }
    [ "$out" = "ran under mnemosyne" ] || { echo "output: $out"; exit 1; }
    grep 'setup: mimalloc source:' build-first-use.log | head -1
    echo "result: built by $(c++ --version | head -1), meson $(meson --version); $(grep -o 'mimalloc source: [a-z]*' build-first-use.log | head -1)"
    ;;
  unit)
    dir=$2
    export CUDA_PATH="${3:-$CUDA13}"
    if [ -f "$dir/build.ninja" ]; then set -- --reconfigure; else set --; fi
    meson setup "$@" "$dir" -Dtests=true >"$dir.log" 2>&1 || { tail_log "$dir.log"; exit 1; }
    headers=$(sed -n 's/^Message: CUDA headers: //p' "$dir.log")
    version=$(sed -n 's/^#define CUDA_VERSION \([0-9]*\).*/\1/p' "$headers/cuda.h")
    # What the unit tests run and what they load (their depends: the
    # doubles), not the whole tree; meson 0.56 builds no test's depends.
    meson introspect "$dir" --targets >"$dir/targets.json"
    targets=$(meson introspect "$dir" --tests | python3 -c '
import json, os, sys
build = os.path.realpath(sys.argv[1])
files = {t["id"]: t["filename"] for t in json.load(open(sys.argv[2]))}
for t in json.load(sys.stdin):
    if not any(s.split(":")[-1] == "unit" for s in t["suite"]):
        continue
    for exe in [t["cmd"][0]] + [f for d in t.get("depends", []) for f in files.get(d, [])]:
        exe = os.path.realpath(exe)
        if exe.startswith(build + "/"):
            print(os.path.relpath(exe, build))
' "$dir" "$dir/targets.json" | sort -u)
    ninja -C "$dir" $targets tests/fakecuda/libfakecuda.so src/cli/mnemosyne interpose/libmnemosyne.so
    meson test -C "$dir" --no-rebuild --suite unit --num-processes 2 --print-errorlogs
    echo "result: CUDA_VERSION $version ($headers), $(meson test -C "$dir" --list --suite unit 2>/dev/null | wc -l) unit tests"
    ;;
  fork)
    dir=$2
    stats=$(mktemp -d)
    out=$(MNEMOSYNE_CUDA_DRIVER="$PWD/$dir/tests/fakecuda/libfakecuda.so" \
          "$dir/src/cli/mnemosyne" run --backend unified --stats-file "$stats/%p.json" -- \
          python3 -c "$FORK_PY")
    [ "$out" = "child read the heap: True" ] || { echo "output: $out"; exit 1; }
    check_stats "$stats"
    ;;
  preload)
    lib=$2/interpose/libmnemosyne.so dir=$3
    stats=$(mktemp -d)
    out=$(MNEMOSYNE_CUDA_DRIVER="$PWD/$dir/tests/fakecuda/libfakecuda.so" MNEMOSYNE_BACKEND=unified \
          MNEMOSYNE_STATS_FILE="$stats/%p.json" LD_PRELOAD="$lib" python3 -c "$FORK_PY")
    [ "$out" = "child read the heap: True" ] || { echo "output: $out"; exit 1; }
    check_stats "$stats"
    echo "result: glibc $(ldd --version | head -1 | grep -o '[0-9.]*$')"
    ;;
  *) echo "elsewhere-steps: unknown step $1" >&2; exit 2 ;;
esac
