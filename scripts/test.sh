#!/usr/bin/env bash
# The test command: set-up if needed, configure, build, run every test, then
# the Windows build (mingw-w64) and its tests under wine, the unit tests
# again under AddressSanitizer+UBSan and ThreadSanitizer, the arena and
# backend tests under valgrind, the fuzzers for a bounded time, and the
# README's install line on a fresh clone.
# Usage: scripts/test.sh [--quick | --windows] [--under-load]
#   --quick: only the release build's tests; --windows: only the Windows job
#   --under-load: a busy loop on every core beside the whole run (as on a
#   shared build machine), to show the suite holds there too; the same as
#   MNEMOSYNE_TEST_UNDER_LOAD=1
set -euo pipefail
shopt -s extglob
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
quick=0
windows_only=0
under_load=${MNEMOSYNE_TEST_UNDER_LOAD:-0}
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    --windows) windows_only=1 ;;
    --under-load) under_load=1 ;;
    *) echo "usage: scripts/test.sh [--quick | --windows] [--under-load]" >&2; exit 2 ;;
  esac
done

# Each phase's header; the previous phase's time is printed first, so a
# slow machine shows where the time went.
phase_name=""
phase_start=$SECONDS
phase() {  # header (empty: close the last phase)
  if [ -n "$phase_name" ]; then
    echo "   ($phase_name: $((SECONDS - phase_start)) s)"
  fi
  phase_name=${1#== }
  phase_name=${phase_name%%:*}
  phase_name=${phase_name%% (*}
  phase_start=$SECONDS
  if [ -n "$1" ]; then echo "$1"; fi
}

if [ "$under_load" = 1 ]; then
  # Loops that never sleep, at the suite's own priority: what another job
  # on a shared build machine does to it.
  load_pids=()
  for _ in $(seq "$(nproc)"); do
    (exec -a mnemosyne-load bash -c 'while :; do :; done') &
    load_pids+=($!)
  done
  trap 'kill "${load_pids[@]}" 2>/dev/null || true' EXIT
  echo "== under load: ${#load_pids[@]} busy loops beside the suite (pids ${load_pids[*]})"
fi

phase "== set-up (scripts/setup.sh: packages, mimalloc's source)"
scripts/setup.sh
# meson compiles through ccache when it is installed (setup.sh installs it):
# paths under this clone are hashed relative to it, so a fresh clone (CI's)
# reuses what an earlier clone compiled.
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=true

configure() {  # dir, extra meson options...: the project's builds, with -Werror
  local dir=$1; shift
  if [ -f "$dir/build.ninja" ]; then
    meson setup --reconfigure "$dir" -Dwerror=true "$@" >/dev/null
  else
    meson setup "$dir" -Dwerror=true "$@" >/dev/null
  fi
}

passed=0
failed=0
run_suite() {  # dir, meson test args...
  local dir=$1; shift
  local rc=0 mark
  mark=$(mktemp)
  meson test -C "$dir" --print-errorlogs "$@" || rc=$?
  local counts log
  # meson names the log after a --wrapper (testlog-valgrind.json): the newest
  # one. None when the build failed before any test ran: one failure.
  log=$(ls -t "$dir"/meson-logs/testlog*.json 2>/dev/null | head -1)
  if [ -z "$log" ] || [ ! "$log" -nt "$mark" ]; then
    rm -f "$mark"
    echo "$dir: no test ran (meson test exited $rc: the build failed?)"
    failed=$((failed + 1))
    return 1
  fi
  rm -f "$mark"
  counts=$(python3 - "$log" <<'PY'
import json, sys
ok = bad = 0
for line in open(sys.argv[1]):
    r = json.loads(line)["result"]
    if r in ("OK", "EXPECTEDFAIL", "SKIP"): ok += 1
    else: bad += 1
print(ok, bad)
PY
)
  passed=$((passed + ${counts% *}))
  failed=$((failed + ${counts#* }))
  return $rc
}

status=0
windows_job() {
  phase "== Windows: mnemosyne.dll and the injector (mingw-w64), tests under wine"
  local cross=(--cross-file scripts/cross/mingw-w64.ini)
  if command -v ccache >/dev/null && [ ! -f build-win/build.ninja ]; then
    # meson puts ccache before the compilers it finds, not a cross file's:
    # a second cross file names them through it.
    local through_ccache="$root/build-win.ccache.ini"
    printf "[binaries]\nc = ['ccache', 'x86_64-w64-mingw32-gcc-posix']\ncpp = ['ccache', 'x86_64-w64-mingw32-g++-posix']\n" \
      >"$through_ccache"
    cross+=(--cross-file "$through_ccache")
  fi
  configure build-win "${cross[@]}"
  ninja -C build-win
  # A fresh WINEPREFIX for every run, made once here and shared by the tests
  # (meson runs the double's self-test through wine with it too).
  local prefix="$root/build-win/wine-e2e"
  WINEPREFIX="$prefix" wineserver -k 2>/dev/null || true
  rm -rf "$prefix"
  WINEPREFIX="$prefix" WINEDEBUG=-all wineboot -i >/dev/null 2>&1 || true
  # One persistent wineserver for the whole job: by default it exits a few
  # seconds after its last client, and a test starting wine just then loses
  # its connection ("wine client error:0: recvmsg: Connection reset by
  # peer", exit 1, the program never run): seen in clean CI runs.
  WINEPREFIX="$prefix" wineserver -p 2>/dev/null || true
  WINEPREFIX="$prefix" WINEDEBUG=-all run_suite build-win --num-processes 2 || status=1
  WINEPREFIX="$prefix" wineserver -k 2>/dev/null || true
}
if [ $windows_only -eq 1 ]; then
  windows_job
  phase ""
  echo "$passed passed, $failed failed"
  exit $status
fi

phase "== format (clang-format, .clang-format)"
if ! clang-format --dry-run --Werror $(git ls-files '*.cpp' '*.hpp' '*.h'); then
  echo "format: run clang-format -i on the files above"
  status=1; failed=$((failed + 1))
fi
phase "== build (release)"
# -Dtests=true: build/ may have been made by scripts/mnemosyne's first use,
# which builds no test.
configure build -Dtests=true
ninja -C build
phase "== tests (release): unit and end-to-end"
# Three at a time on two cores: most end-to-end cases wait (on their children,
# on a give-back pass, on a phase's sleep) more than they compute.
run_suite build --num-processes 3 || status=1

if [ $quick -eq 0 ]; then
  windows_job
fi

if [ $quick -eq 0 ]; then
  phase "== unit tests under AddressSanitizer + UndefinedBehaviorSanitizer"
  # No ninja here: meson test builds what the chosen tests need (the unit
  # tests, the launcher, the double), not the probes, workloads and Windows
  # parts only the release suite runs.
  configure build-asan -Dbuildtype=debug -Db_sanitize=address,undefined -Db_lundef=false
  # Sanitizers make the tests several times slower (TSan's shadow memory
  # for arena_test's 1.1 GiB zeroed block alone: 30 s on 2 cores): their
  # time limits scale, as valgrind's do below; no check changes.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    run_suite build-asan --suite unit --timeout-multiplier 3 || status=1
  # The launcher's commands that parse input (stats files, options) under
  # ASan too; run and install preload the library, which an ASan build cannot.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    run_suite build-asan cli-info cli-help cli-stats || status=1
  phase "== registry, loader and arena tests under ThreadSanitizer"
  configure build-tsan -Dbuildtype=debug -Db_sanitize=thread -Db_lundef=false
  TSAN_OPTIONS="halt_on_error=1 allocator_may_return_null=1 suppressions=$root/tests/unit/tsan.supp" \
    run_suite build-tsan --suite tsan --timeout-multiplier 3 || status=1
fi

if [ $quick -eq 0 ]; then
  # Not under valgrind: config_test (its no-allocation check hooks malloc,
  # which valgrind replaces), fakecuda-selftest (valgrind does not honour
  # MADV_DONTFORK, which it checks) and fuzz-replay-alloc (valgrind's own
  # memalign stops at 64 MiB alignments, which the harness asks for).
  phase "== memcheck: the arena, backend and option-fuzz tests under valgrind"
  run_suite build --num-processes 2 --timeout-multiplier 4 \
    --wrapper "valgrind --error-exitcode=99 --trace-children=yes --quiet" \
    arena_test backend_cuda_test backend_host_test backend_loader_test \
    backend_loader_race_test backend_registry_test fuzz-replay-options || status=1

  phase "== fuzzing: libFuzzer with AddressSanitizer + UndefinedBehaviorSanitizer (tests/fuzz)"
  CC=clang CXX=clang++ configure build-fuzz -Dfuzzing=true -Dbuildtype=debugoptimized \
    -Db_sanitize=address,undefined -Db_lundef=false
  ninja -C build-fuzz tests/fuzz/alloc_fuzzer tests/fuzz/options_fuzzer tests/fakecuda/libfakecuda.so
  mkdir -p build-fuzz/artifacts
  for harness in alloc options; do
    fuzzer="build-fuzz/tests/fuzz/${harness}_fuzzer"
    scratch=$(mktemp -d)
    if ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=halt_on_error=1 \
         "$fuzzer" -artifact_prefix=build-fuzz/artifacts/ tests/fuzz/regressions/$harness/* \
         >"$scratch/replay.log" 2>&1 &&
       ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=halt_on_error=1 \
         "$fuzzer" -max_total_time="${FUZZ_SECONDS:-20}" -print_final_stats=1 \
         -artifact_prefix=build-fuzz/artifacts/ "$scratch" tests/fuzz/corpus/$harness \
         >"$scratch/fuzz.log" 2>&1; then
      runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$scratch/fuzz.log")
      rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$scratch/fuzz.log")
      ops=$(sed -n 's/^alloc_fuzzer: \([0-9]*\) operations$/, \1 operations/p' "$scratch/fuzz.log")
      echo "fuzz $harness: ok, $runs runs ($rate per second$ops)"
      passed=$((passed + 1))
    else
      echo "fuzz $harness: FAILED (input saved in build-fuzz/artifacts/):"
      # Whichever logs exist (a failed replay leaves no fuzz.log): a missing
      # one must not end the script before the report is printed.
      for log in "$scratch/replay.log" "$scratch/fuzz.log"; do
        if [ -f "$log" ]; then grep -v '^#[0-9]' "$log" | tail -40 || true; fi
      done
      status=1; failed=$((failed + 1))
    fi
    rm -rf "$scratch"
  done

  phase "== benchmark smoke run (scripts/bench.sh --quick: every workload and allocator once; no figure is checked)"
  if scripts/bench.sh --quick >build/bench-quick.log 2>&1; then
    echo "bench: ok ($(grep -c '^| ' build/bench-quick/results.md) table rows in build/bench-quick/)"
    passed=$((passed + 1))
  else
    echo "bench: FAILED:"; tail -20 build/bench-quick.log
    status=1; failed=$((failed + 1))
  fi

  phase "== builds elsewhere: Debian 13 and Debian 11 root filesystems (scripts/elsewhere.sh)"
  # From fresh clones, as a user without root: the README's first command,
  # the unit tests and a forked python3 over the double, against CUDA 13.0's
  # headers and Debian 13's CUDA 12.4 ones; and this build's library loaded
  # there. The root filesystems are made once a machine (scripts/rootfs.sh).
  if [ "$(id -u)" -ne 0 ]; then
    echo "elsewhere: not run (chroot needs root)"
  else
    elsewhere_log=$(mktemp)
    scripts/elsewhere.sh build 2>&1 | tee "$elsewhere_log" || status=1
    passed=$((passed + $(grep -c '^elsewhere: .* ok (' "$elsewhere_log" || true)))
    failed=$((failed + $(grep -c 'FAILED' "$elsewhere_log" || true)))
    rm -f "$elsewhere_log"
  fi

  phase "== the README's install line, on a fresh clone"
  line=$(sed -n 's/^    \(meson setup build --prefix=[^ ]*\( -D[^ ]*\)* && meson install -C build\)$/\1/p' README.md)
  fresh=$(mktemp -d)
  if [ -z "$line" ]; then
    echo "install: the README has no install line"; status=1; failed=$((failed + 1))
  elif git clone -q "$root" "$fresh/src" &&
       (cd "$fresh/src" && export CCACHE_BASEDIR="$fresh/src" && eval "${line/--prefix=*([^ ])/--prefix=$fresh/prefix}" >"$fresh/log" 2>&1) &&
       "$fresh/prefix/bin/mnemosyne" run --backend host -- python3 -c 'print("installed")' |
         grep -qx installed; then
    echo "install: ok ($line)"; passed=$((passed + 1))
  else
    echo "install: the README's install line failed on a fresh clone:"; tail -20 "$fresh/log"
    status=1; failed=$((failed + 1))
  fi
  rm -rf "$fresh"
fi

phase ""
echo "$passed passed, $failed failed (${SECONDS} s)"
exit $status
