#!/usr/bin/env bash
# The test command: set-up if needed, configure, build, run every test, then
# the unit tests again under AddressSanitizer+UBSan and ThreadSanitizer.
# Usage: scripts/test.sh [--quick]   (--quick: skip the sanitizer builds)
set -euo pipefail
shopt -s extglob
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
quick=0
[ "${1:-}" = "--quick" ] && quick=1

scripts/setup.sh

configure() {  # dir, extra meson options...
  local dir=$1; shift
  if [ -f "$dir/build.ninja" ]; then
    meson setup --reconfigure "$dir" "$@" >/dev/null
  else
    meson setup "$dir" "$@" >/dev/null
  fi
}

passed=0
failed=0
run_suite() {  # dir, meson test args...
  local dir=$1; shift
  local rc=0
  meson test -C "$dir" --print-errorlogs "$@" || rc=$?
  local counts
  counts=$(python3 - "$dir/meson-logs/testlog.json" <<'PY'
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
echo "== format (clang-format, .clang-format)"
if ! clang-format --dry-run --Werror $(git ls-files '*.cpp' '*.hpp' '*.h'); then
  echo "format: run clang-format -i on the files above"
  status=1
fi
echo "== build (release)"
configure build
ninja -C build
echo "== tests (release): unit and end-to-end"
run_suite build --num-processes 2 || status=1

if [ $quick -eq 0 ]; then
  echo "== unit tests under AddressSanitizer + UndefinedBehaviorSanitizer"
  configure build-asan -Dbuildtype=debug -Db_sanitize=address,undefined -Db_lundef=false
  ninja -C build-asan
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    run_suite build-asan --suite unit || status=1
  echo "== registry, loader and arena tests under ThreadSanitizer"
  configure build-tsan -Dbuildtype=debug -Db_sanitize=thread -Db_lundef=false
  ninja -C build-tsan
  TSAN_OPTIONS="halt_on_error=1 allocator_may_return_null=1 suppressions=$root/tests/unit/tsan.supp" \
    run_suite build-tsan --suite tsan || status=1
fi

if [ $quick -eq 0 ]; then
  echo "== the README's install line, on a fresh clone"
  line=$(sed -n 's/^    \(meson setup build --prefix=[^ ]* && meson install -C build\)$/\1/p' README.md)
  fresh=$(mktemp -d)
  if [ -z "$line" ]; then
    echo "install: the README has no install line"; status=1; failed=$((failed + 1))
  elif git clone -q "$root" "$fresh/src" &&
       (cd "$fresh/src" && eval "${line/--prefix=*([^ ])/--prefix=$fresh/prefix}" >"$fresh/log" 2>&1) &&
       "$fresh/prefix/bin/mnemosyne" run --backend host -- python3 -c 'print("installed")' |
         grep -qx installed; then
    echo "install: ok ($line)"; passed=$((passed + 1))
  else
    echo "install: the README's install line failed on a fresh clone:"; tail -20 "$fresh/log"
    status=1; failed=$((failed + 1))
  fi
  rm -rf "$fresh"
fi

echo "$passed passed, $failed failed"
exit $status
