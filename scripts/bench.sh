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
  tests/fakecuda/libfakecuda.so >/dev/null
# The windows table, where the mingw build is configured (scripts/test.sh
# --windows configures it) and wine is installed.
windows=()
if [ -f build-win/build.ninja ] && command -v wine >/dev/null; then
  ninja -C build-win bench/workloads.exe bench/workloads-mimalloc.exe interpose/windows/mnemosyne.dll \
    interpose/windows/mnemosyne-inject.exe tests/fakecuda/fakecuda.dll >/dev/null
  windows=(--windows-build build-win)
fi
out=bench/results
for arg in "$@"; do [ "$arg" = "--quick" ] && out=build/bench-quick; done
exec /usr/bin/python3 bench/run_bench.py --build build --out "$out" "${windows[@]}" "$@"
