#!/usr/bin/env bash
# The side-by-side allocator benchmark: builds the workloads and the naive
# interposer, runs bench/run_bench.py, and writes bench/results/ (CSV, a
# Markdown table with the machine and date, ratios.png).
# Usage: scripts/bench.sh [--quick] [--runs N] [--only w1,w2]
#   --quick: a smoke run under 2 minutes (small scale, one run each)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/setup.sh >/dev/null
# -Dtests=true: the benchmarks and the test double are built with the tests
# (build/ may have been made by scripts/mnemosyne's first use, without them).
if [ -f build/build.ninja ]; then meson setup --reconfigure build -Dtests=true >/dev/null
else meson setup build >/dev/null; fi
ninja -C build bench/workloads bench/fork_cost bench/libnaive-interposer.so interpose/libmnemosyne.so \
  tests/fakecuda/libfakecuda.so tests/e2e/fork_race_probe >/dev/null
# The windows table, where the mingw build is configured (scripts/test.sh
# --windows configures it) and wine is installed.
windows=()
if [ -f build-win/build.ninja ] && command -v wine >/dev/null; then
  ninja -C build-win bench/workloads.exe bench/workloads-mimalloc.exe interpose/windows/mnemosyne.dll \
    interpose/windows/mnemosyne-inject.exe tests/fakecuda/fakecuda.dll >/dev/null
  windows=(--windows-build build-win)
fi
# The fork table's DataLoader case needs PyTorch (about 150 packages):
# installed for a full run, left out of a --quick one without it.
quick=0
for arg in "$@"; do [ "$arg" = "--quick" ] && quick=1; done
if [ $quick -eq 0 ] && ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "bench: installing python3-torch for the DataLoader case" >&2
  if [ "$(id -u)" -eq 0 ]; then sudo_=(); else sudo_=(sudo); fi
  DEBIAN_FRONTEND=noninteractive "${sudo_[@]}" apt-get install -y -qq --no-install-recommends python3-torch >/dev/null
fi
out=bench/results
[ $quick -eq 1 ] && out=build/bench-quick
exec /usr/bin/python3 bench/run_bench.py --build build --out "$out" "${windows[@]}" "$@"
