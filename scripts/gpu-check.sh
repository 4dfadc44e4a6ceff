#!/usr/bin/env bash
# One short run that shows what mnemosyne does on a real NVIDIA GPU.
#
#   scripts/gpu-check.sh [REPORT_DIR] [--prebuilt DIR | --build]
#
# Without an NVIDIA driver it says so in one line and exits 0. With one, it
# writes REPORT_DIR/report.md (default gpu-report/) and the raw output of
# every step under REPORT_DIR/logs/. Binaries: --prebuilt DIR (a build tree,
# or a folder holding libmnemosyne.so, gpu_probe and mnemosyne), else
# build/, else a fresh build when meson and ninja are there. --build builds
# from this tree first, into build-gpu/ (made anew), with this machine's
# compiler, meson and CUDA toolkit (a machine that reaches no network needs
# mimalloc's source carried: subprojects/packagecache/); the report says
# which distribution, compiler and toolkit built what it ran. Setting
# MNEMOSYNE_CUDA_DRIVER runs it against that library instead of the system's
# driver (the test double: tests/gpu/meson.build, gpu-check-double).
#
# Each step has its own time limit; the report says which ran, which were
# skipped and why. A refused system call or a failing step is a finding,
# written down, not the end of the run. The end-to-end suite runs last, in
# what is left of GPU_CHECK_SECONDS (450) and at most GPU_CHECK_E2E_SECONDS
# (240), so the whole run stays under 8 minutes; GPU_CHECK_E2E_BACKENDS names
# its columns (default: unified device pinned pinned+vmm). report.md is
# written as the steps end, so a run cut short keeps what it found.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
report_dir=gpu-report
prebuilt=""
build_here=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build_here=1; shift ;;
    --prebuilt) prebuilt=${2:?--prebuilt needs a folder}; shift 2 ;;
    --prebuilt=*) prebuilt=${1#--prebuilt=}; shift ;;
    -h|--help) sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu-check: unknown flag $1 (see --help)" >&2; exit 2 ;;
    *) report_dir=$1; shift ;;
  esac
done
# Absolute: the end-to-end cases run programs in folders of their own, where
# a relative LD_PRELOAD names nothing (ld.so ignores it, and the program runs
# without mnemosyne: `git` wrote no statistics on the H200 for that reason).
if [ -n "$prebuilt" ] && [ -d "$prebuilt" ]; then prebuilt=$(cd "$prebuilt" && pwd); fi

# ---------------------------------------------------------------- the driver
driver=${MNEMOSYNE_CUDA_DRIVER:-}
if [ -z "$driver" ]; then
  for candidate in $(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF}') \
      /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1 /usr/lib/wsl/lib/libcuda.so.1; do
    if [ -e "$candidate" ]; then driver=$candidate; break; fi
  done
fi
if [ -z "$driver" ] || [ ! -e "$driver" ]; then
  echo "gpu-check: no NVIDIA driver (libcuda.so.1) on this machine; nothing to check"
  exit 0
fi

# ---------------------------------------------------------------- binaries
# --build: the whole tree (tests included: the probe, the e2e suite), built
# here; on failure the report says why and the run goes on with what else
# there is.
built_by=""
build_failure=""
if [ $build_here -eq 1 ]; then
  mkdir -p "$report_dir/logs"
  echo "gpu-check: building from this tree into build-gpu/ (meson, ninja)" >&2
  rm -rf "$root/build-gpu"
  if (cd "$root" && meson setup build-gpu -Dtests=true && ninja -C build-gpu) \
       >"$report_dir/logs/build.log" 2>&1; then
    prebuilt="$root/build-gpu"
    os=$(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")
    headers=$(sed -n 's/^Message: CUDA headers: //p' "$report_dir/logs/build.log" | head -n 1)
    cuda_version=$(sed -n 's/^#define CUDA_VERSION \([0-9]*\).*/\1/p' "$headers/cuda.h" 2>/dev/null)
    built_by="built here from a clean tree: ${os:-unknown distribution}, $(c++ --version | head -n 1),"
    built_by="$built_by meson $(meson --version), glibc $(ldd --version | head -n 1 | grep -o '[0-9.]*$'),"
    built_by="$built_by CUDA headers $cuda_version ($headers)"
  else
    build_failure=$(grep -v '^\[' "$report_dir/logs/build.log" | tail -n 3 | tr '\n' ' ')
    echo "gpu-check: the build failed (logs/build.log): $build_failure" >&2
  fi
fi
find_bin() {  # NAME PATH-IN-A-BUILD-TREE: prints the first that exists
  local dir
  for dir in "$prebuilt" "$root/build"; do
    [ -n "$dir" ] || continue
    if [ -x "$dir/$2" ] || [ -f "$dir/$2" ]; then echo "$dir/$2"; return; fi
    if [ -x "$dir/$1" ] || [ -f "$dir/$1" ]; then echo "$dir/$1"; return; fi
  done
}
lib=$(find_bin libmnemosyne.so interpose/libmnemosyne.so)
probe=$(find_bin gpu_probe tests/gpu/gpu_probe)
launcher=$(find_bin mnemosyne src/cli/mnemosyne)
workloads=$(find_bin workloads bench/workloads)
naive=$(find_bin libnaive-interposer.so bench/libnaive-interposer.so)
if [ -z "$lib" ] || [ -z "$probe" ]; then
  if command -v meson >/dev/null && command -v ninja >/dev/null; then
    echo "gpu-check: building (meson, ninja)" >&2
    (cd "$root" && { [ -f build/build.ninja ] || meson setup build >/dev/null; } &&
       ninja -C build interpose/libmnemosyne.so tests/gpu/gpu_probe src/cli/mnemosyne >/dev/null)
    lib=$(find_bin libmnemosyne.so interpose/libmnemosyne.so)
    probe=$(find_bin gpu_probe tests/gpu/gpu_probe)
    launcher=$(find_bin mnemosyne src/cli/mnemosyne)
    (cd "$root" && ninja -C build bench/workloads bench/libnaive-interposer.so >/dev/null)
    workloads=$(find_bin workloads bench/workloads)
    naive=$(find_bin libnaive-interposer.so bench/libnaive-interposer.so)
  fi
fi
if [ -z "$lib" ] || [ -z "$probe" ]; then
  echo "gpu-check: no libmnemosyne.so and gpu_probe here (give --prebuilt DIR, or carry build/)" >&2
  exit 1
fi

mkdir -p "$report_dir/logs"
report="$report_dir/report.md"
logs="$report_dir/logs"
started=$(date +%s)
: >"$report"
say() { printf '%s\n' "$*" >>"$report"; }
field() { sed -n "s/.*\\b$1=\\([^ ]*\\).*/\\1/p" | head -n 1; }

# run_step NAME LIMIT_S HEAP CMD...: runs CMD without mnemosyne (HEAP none)
# or under it with that backend (BACKEND+own: in mnemosyne's own context,
# MNEMOSYNE_CONTEXT=own; pinned: MNEMOSYNE_PIN=arena; pinned+granule,
# pinned+vmm: MNEMOSYNE_PIN); output to
# logs/NAME.log; prints the status.
run_step() {
  local name=$1 limit=$2 heap=$3
  shift 3
  local with=(env -u LD_PRELOAD MNEMOSYNE_CUDA_DRIVER="$driver")
  if [ "$heap" = naive ]; then
    # The double's own thread would re-enter it through the naive malloc.
    with=(env LD_PRELOAD="$naive" MNEMOSYNE_CUDA_DRIVER="$driver" FAKECUDA_THREAD_ITERS=0)
  elif [ "$heap" != none ]; then
    local context=primary pin=arena
    [ "${heap%+own}" != "$heap" ] && context=own
    [ "${heap%+granule}" != "$heap" ] && pin=granule
    [ "${heap%+vmm}" != "$heap" ] && pin=vmm
    with=(env LD_PRELOAD="$lib" MNEMOSYNE_BACKEND="${heap%+*}" MNEMOSYNE_CONTEXT="$context"
          MNEMOSYNE_PIN="$pin" MNEMOSYNE_CUDA_DRIVER="$driver")
  fi
  timeout --kill-after=5 "$limit" "${with[@]}" "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then echo "timed out after ${limit} s"; else echo "exit $rc"; fi
}

yes_no() { sed 's/^1$/yes/; s/^0$/no/'; }

# log_rows LOG PREFIX FIELD...: a table row for each line of LOG starting
# with PREFIX, with those fields' values; a FIELD? (0 or 1) reads no or yes.
log_rows() {
  local log=$1 prefix=$2 line row f
  shift 2
  while read -r line; do
    row="|"
    for f in "$@"; do
      if [ "${f%\?}" != "$f" ]; then
        row="$row $(echo "$line" | field "${f%\?}" | yes_no) |"
      else
        row="$row $(echo "$line" | field "$f") |"
      fi
    done
    say "$row"
  done < <(grep "^$prefix" "$log")
}

# probe_rows SUBCOMMAND FIELD...: runs `gpu_probe SUBCOMMAND` under each CUDA
# backend; one table row each with those fields, the last with the exit status.
probe_rows() {
  local what=$1 backend status log row f
  shift
  for backend in unified device pinned pinned+vmm; do
    status=$(run_step "$what-$backend" 120 "$backend" "$probe" "$what")
    log="$logs/$what-$backend.log"
    row="| $backend |"
    for f in "$@"; do row="$row $(field "$f" <"$log") |"; done
    say "${row% |} ($status) |"
  done
}

say "# mnemosyne on a GPU: $(date -u '+%Y-%m-%d %H:%M UTC')"
say ""
say "- machine: $(uname -srm), $(nproc) cores"
say "- driver library: $driver"
if [ -r /proc/driver/nvidia/version ]; then
  say "- kernel module: $(head -n 1 /proc/driver/nvidia/version)"
fi
if command -v nvidia-smi >/dev/null; then
  nvidia-smi -L >"$logs/nvidia-smi.log" 2>&1 || true
  while read -r line; do say "- $line"; done <"$logs/nvidia-smi.log"
fi
# Whether this user may use userfaultfd, the kernel's way to let a parent
# serve its forked child's page faults, those the kernel takes for the child
# included (execve's argv, write() of a heap buffer): issue 47's pull needs
# it, and on this machine's kind of host it is unknown. The sysctl, the
# device, and the call itself (a container's seccomp profile may refuse
# it), for every fault and for user-mode faults only (UFFD_USER_MODE_ONLY).
uffd_line() {
  local sysctl dev calls
  sysctl=$(cat /proc/sys/vm/unprivileged_userfaultfd 2>/dev/null || echo absent)
  dev=absent
  if [ -e /dev/userfaultfd ]; then
    dev="present, not usable by $(id -un)"
    [ -r /dev/userfaultfd ] && [ -w /dev/userfaultfd ] && dev="usable by $(id -un)"
  fi
  calls=$(python3 - <<'PY' 2>/dev/null
import ctypes, errno, os, platform
nr = {"x86_64": 323, "aarch64": 282}.get(platform.machine())
libc = ctypes.CDLL(None, use_errno=True)
out = []
for flags, what in ((os.O_CLOEXEC, "every fault"), (os.O_CLOEXEC | 1, "user-mode faults only")):
    fd = libc.syscall(nr, flags) if nr else -1
    if fd >= 0:
        os.close(fd)
    out.append(f"{what}: " + ("yes" if fd >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")))
print(", ".join(out))
PY
)
  say "- userfaultfd (issue 47): vm.unprivileged_userfaultfd ${sysctl}, /dev/userfaultfd $dev; the call as $(id -un): ${calls:-not tried (no python3)}"
}
uffd_line
say "- binaries: $lib, $probe"
if [ -n "$built_by" ]; then say "- $built_by"; fi
if [ -n "$build_failure" ]; then say "- **the build here failed** (logs/build.log): \`$build_failure\`"; fi
say ""
# GPU_CHECK_PYTHON, else the first python3 that has NumPy (the demo's and a
# row's), else any: a GPU image's python3 with NumPy is often not /usr/bin's.
python=${GPU_CHECK_PYTHON:-}
if [ -z "$python" ]; then
  for candidate in $(command -v python3) /usr/bin/python3; do
    "$candidate" -c 'import numpy' >/dev/null 2>&1 && { python=$candidate; break; }
  done
fi
[ -n "$python" ] || python=$(command -v python3 || command -v /usr/bin/python3 || true)

if [ -n "$launcher" ]; then
  run_step info 60 none "$launcher" info >/dev/null
  say "What the driver and devices offer (\`mnemosyne info\`):"
  say ""
  say '```'
  cat "$logs/info.log" >>"$report"
  say '```'
  say ""
fi

# The costs run first, on a fresh driver: cuInit is then the process's first.
costs_status=$(run_step costs 120 none "$probe" costs)
devices=$(field devices <"$logs/costs.log")
if grep -q '^probe error=' "$logs/costs.log"; then
  # The library is there but no GPU answers (no device, a broken or
  # mismatched kernel module): nothing else can run. A fact, not a failure.
  why=$(grep -m1 '^probe error=' "$logs/costs.log" | sed 's/^probe //')
  say "The driver does not start, so nothing was checked: \`$why\` ($costs_status; logs/costs.log)."
  echo "gpu-check: the driver at $driver does not start ($why); nothing to check; report in $report"
  exit 0
fi

# ---------------------------------------------------------------- 1. kernel
say "## 1. A kernel on memory from plain malloc, new and std::vector"
say ""
say "No cudaMalloc, no copy: the kernel adds 7 to 4 MiB of ints in place."
say ""
say "| heap | malloc | new | std::vector | memory |"
say "|---|---|---|---|---|"
for backend in none unified device pinned pinned+granule pinned+vmm unified+own; do
  row="| ${backend/none/without mnemosyne} |"
  memory=""
  for kind in malloc new vector; do
    status=$(run_step "kernel-$backend-$kind" 120 "$backend" "$probe" kernel "$kind")
    result=$(field result <"$logs/kernel-$backend-$kind.log")
    [ -n "$result" ] || result="no result ($status)"
    row="$row $result |"
    if [ -z "$memory" ]; then
      memory="$(field memory_type <"$logs/kernel-$backend-$kind.log")"
      managed=$(field is_managed <"$logs/kernel-$backend-$kind.log")
      [ -n "$managed" ] && memory="$memory, managed=$managed"
      [ "$(field driver_memory <"$logs/kernel-$backend-$kind.log")" = 0 ] && memory="not driver memory"
    fi
  done
  say "$row ${memory:-?} |"
done
pageable=$(field pageable_memory_access <"$logs/kernel-none-malloc.log")
say ""
say "CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS = ${pageable:-?} (1: the GPU reaches any host memory, so the run without mnemosyne works too)."
say "unified+own: the heap in mnemosyne's own context (MNEMOSYNE_CONTEXT=own), the kernel in the primary one."
say "pinned: MNEMOSYNE_PIN=arena, each arena one cuMemHostAlloc, locked whole."
say "pinned+granule: MNEMOSYNE_PIN=granule, the heap registered 1 MiB at a time (a block spans registrations)."
say "pinned+vmm: MNEMOSYNE_PIN=vmm (pinned's default on Linux), the heap mapped a granule at a time from the virtual-memory API."
say ""
# What cudaMemcpy (and torch's .cuda()) does with a program's buffers. The
# driver copies a block only from one of its allocations or registrations:
# under MNEMOSYNE_PIN=granule (1 MiB registrations) it refused blocks that
# span two on an H200 (CUDA_ERROR_INVALID_VALUE), the reason pinned arenas
# are locked whole by default.
say "Driver copies of malloc'd blocks: out to memory of the probe's own (cuMemcpyDtoH at the block's"
say "address), then to the device and back (cuMemcpyHtoD, cuMemcpyDtoH); ok: the bytes arrived."
say ""
say "| heap | 64 KiB | 900 KiB | 3 MiB | 64 MiB |"
say "|---|---|---|---|---|"
for heap in unified device pinned pinned+granule pinned+vmm; do
  status=$(run_step "copy-$heap" 60 "$heap" "$probe" copy)
  row="| $heap |"
  while read -r line; do
    out=$(echo "$line" | field copy_out) dev=$(echo "$line" | field device)
    [ "$(echo "$line" | field copy_out_ok)" = 1 ] && out=ok
    [ "$(echo "$line" | field device_ok)" = 1 ] && dev=ok
    row="$row $out / $dev |"
  done < <(grep '^copy ' "$logs/copy-$heap.log")
  grep -q '^copy ' "$logs/copy-$heap.log" || row="$row $status | | | |"
  say "$row"
done
say ""

# ---------------------------------------------------------------- 2. attributes
say "## 2. Pointer attributes of interposed blocks"
say ""
for backend in unified device pinned; do
  run_step "attributes-$backend" 60 "$backend" "$probe" attributes >/dev/null
  while read -r line; do say "- $backend: ${line#attributes }"; done \
    < <(grep '^attributes' "$logs/attributes-$backend.log")
done
say ""
say "preferred_location is cuMemRangeGetAttribute's PREFERRED_LOCATION: the chosen device under"
say "\`device\`, none under \`unified\`; pinned memory is not managed, so the driver refuses the query."
say ""
count=${devices:-1}
run_step "bad-device" 60 unified env MNEMOSYNE_DEVICE="$count" /bin/true >/dev/null
say "- MNEMOSYNE_DEVICE=$count, one past the last of $count device(s): \`$(grep -m1 mnemosyne: "$logs/bad-device.log")\`"
say ""

# ---------------------------------------------------------------- 3. costs
say "## 3. Costs"
say ""
line=$(grep '^costs' "$logs/costs.log")
[ -n "$line" ] || say "The probe printed no costs ($costs_status; see logs/costs.log)."
say "- cuInit: $(echo "$line" | field cuinit_ms) ms; primary context: $(echo "$line" | field context_ms) ms"
say "- device memory free after the context: $(echo "$line" | field device_free) of $(echo "$line" | field device_total) bytes"
say ""
run_step context-cost 60 none "$probe" context-cost >/dev/null
say "- device memory one more process's context takes (what each process of a tree costs): $(field device_bytes <"$logs/context-cost.log") bytes"
say ""
say "Per call, the median of 10 (cuMemAdvise: SET_PREFERRED_LOCATION to the device, on a fresh block):"
say ""
say "| size | cuMemAllocManaged, ms | cuMemAdvise, ms | cuMemHostAlloc, ms |"
say "|---|---|---|---|"
log_rows "$logs/costs.log" alloc-cost size managed_ms advise_ms pinned_ms
say ""
line=$(grep '^register-cost' "$logs/costs.log")
say "Under MNEMOSYNE_PIN=granule the pinned backend's arenas are anonymous memory (MADV_DONTFORK)"
say "registered 1 MiB at a time as mimalloc commits it, where the device reaches registered memory at"
say "its host address (1 below); a kernel across neighbouring registrations is the \`pinned+granule\`"
say "row of section 1."
say ""
say "- CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: $(echo "$line" | field host_pointer);" \
    "MADV_DONTFORK on the memory: $(echo "$line" | field dontfork)"
say "- cuMemHostRegister of 1 MiB: $(echo "$line" | field register_ms) ms;" \
    "cuMemHostUnregister: $(echo "$line" | field unregister_ms) ms (median of 20; last: $(echo "$line" | field last))"
# The virtual-memory route for host memory (CUDA 12.2+): granules of
# host-located memory mapped side by side into one reserved range. Whether
# the driver copies a block spanning two of them decides whether it could
# replace one registration per granule (which it refuses to copy across).
run_step vmm-host 60 none "$probe" vmm-host >/dev/null
say "- The virtual-memory API with host-located memory (cuMemCreate, cuMemMap, cuMemSetAccess for the"
say "  device and the host), 16 granules side by side; copy_spanning: 8 KiB across two granules:"
grep '^vmm' "$logs/vmm-host.log" | while read -r line; do say "  - \`${line#vmm }\`"; done
# A phase: 2 GiB held in blocks (GPU_CHECK_PHASE_MIB: the test suite's run
# over the double takes less), all freed, 3 s of waiting. Pinned memory
# goes back granule by granule; managed memory only as whole driver
# allocations: blocks above 16 MiB are each one, smaller ones lie in arenas
# that go back (cuMemFree) once no block of theirs is in use.
give_back_py='
import ctypes, json, sys, time
lib = ctypes.CDLL(None)
lib.mnemosyne_stats_json.restype = ctypes.c_void_p
pool, size, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def backed():
    raw = lib.mnemosyne_stats_json()
    doc = json.loads(ctypes.string_at(raw).decode())
    lib.free(ctypes.c_void_p(raw))
    return doc["pools"][pool]["bytes_backed"] >> 20
def resident():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) >> 10 for l in f if l.startswith("VmRSS:"))
blocks = [bytearray(size) for _ in range(count)]
for b in blocks: b[::4096] = bytes(len(b[::4096]))
peak, peak_rss = backed(), resident()
del blocks
time.sleep(3)
print(f"give-back peak_mib={peak} after_mib={backed()} peak_rss_mib={peak_rss} after_rss_mib={resident()}")
'
phase_mib=${GPU_CHECK_PHASE_MIB:-2048}
phase_size="$phase_mib MiB"
[ "$phase_mib" = 2048 ] && phase_size="2 GiB"
run_step "give-back" 120 pinned+granule python3 -c "$give_back_py" pinned $((1 << 20)) "$phase_mib" >/dev/null
run_step "give-back-vmm" 120 pinned+vmm python3 -c "$give_back_py" pinned $((1 << 20)) "$phase_mib" >/dev/null
# Always 2 GiB: what stays (the first arena, alignment) is a fixed amount.
run_step "give-back-unified" 120 unified python3 -c "$give_back_py" unified $((64 << 20)) 32 >/dev/null
# Arenas: a C program that keeps nothing across the phase (tests/e2e's
# promise_probe), so that every arena but the first has no block in use.
phases=""
for dir in "$prebuilt" "$root/build"; do
  [ -n "$dir" ] && [ -x "$dir/tests/e2e/promise_probe" ] && { phases="$dir/tests/e2e/promise_probe"; break; }
done
[ -n "$phases" ] && run_step "give-back-arenas" 120 unified "$phases" phases 1024 "$phase_mib" >/dev/null
# python3 keeps a few blocks it makes during the phase, and with them their
# arenas: what the free blocks of those held is discarded
# (cuMemDiscardBatchAsync, CUDA 13), which the driver documents only as
# "can also help reduce memory pressure": resident memory tells.
run_step "give-back-discard" 120 unified python3 -c "$give_back_py" unified $((1 << 20)) "$phase_mib" >/dev/null
say "- $phase_size in 1 MiB blocks under \`pinned\` with \`MNEMOSYNE_PIN=granule\`, all freed: $(field peak_mib <"$logs/give-back.log") MiB" \
    "page-locked at the peak, $(field after_mib <"$logs/give-back.log") MiB 3 s after the frees" \
    "(resident: $(field peak_rss_mib <"$logs/give-back.log") MiB, then $(field after_rss_mib <"$logs/give-back.log") MiB)"
say "- The same under \`MNEMOSYNE_PIN=vmm\`: $(field peak_mib <"$logs/give-back-vmm.log") MiB" \
    "mapped at the peak, $(field after_mib <"$logs/give-back-vmm.log") MiB 3 s after the frees" \
    "(resident: $(field peak_rss_mib <"$logs/give-back-vmm.log") MiB, then $(field after_rss_mib <"$logs/give-back-vmm.log") MiB)"
say "- 2 GiB in 64 MiB blocks under \`unified\` (each a driver allocation of its own), all freed:" \
    "$(field peak_mib <"$logs/give-back-unified.log") MiB allocated at the peak," \
    "$(field after_mib <"$logs/give-back-unified.log") MiB 3 s after the frees" \
    "(resident: $(field peak_rss_mib <"$logs/give-back-unified.log") MiB, then $(field after_rss_mib <"$logs/give-back-unified.log") MiB)"
if [ -n "$phases" ]; then
  line=$(grep -m1 '^phase=0 ' "$logs/give-back-arenas.log")
  say "- $phase_size in 1 MiB blocks under \`unified\` (in arenas, each freed whole once unused), all freed:" \
      "$(echo "$line" | field held_peak_mib) MiB of arenas at the peak," \
      "$(echo "$line" | field held_after_mib) MiB 3 s after the frees" \
      "(resident: $(echo "$line" | field rss_peak_mib) MiB, then $(echo "$line" | field rss_after_mib) MiB)"
else
  say "- $phase_size in 1 MiB blocks under \`unified\`: not run (no build tree with tests/e2e/promise_probe)"
fi
say "- The same from python3 (a few blocks live on, and keep their arenas; the free blocks of those" \
    "are discarded): $(field peak_mib <"$logs/give-back-discard.log") MiB of arenas at the peak," \
    "$(field after_mib <"$logs/give-back-discard.log") MiB kept 3 s after the frees" \
    "(resident: $(field peak_rss_mib <"$logs/give-back-discard.log") MiB, then $(field after_rss_mib <"$logs/give-back-discard.log") MiB)"
say ""

say "First touch of a fresh 256 MiB malloc, in GB/s (a kernel writes every int of the second):"
say ""
say "| backend | from the CPU | from the GPU |"
say "|---|---|---|"
probe_rows touch cpu_first_touch_gbs gpu_first_touch_gbs
say ""

say "Does the driver hand out memory that reads zero? 64 MiB blocks, fresh, and again after a block"
say "written by the CPU and the GPU was freed (yes: every int read 0; device: first read by a kernel):"
say ""
say "| memory | fresh | after a free | same address again |"
say "|---|---|---|---|"
zero_status=$(run_step zero-none 120 none "$probe" zero)
log_rows "$logs/zero-none.log" 'zero kind=' kind fresh? reused? same_address?
say ""
setting=$(grep -h '^InitializeSystemMemoryAllocations' /proc/driver/nvidia/params 2>/dev/null ||
          echo "not readable")
say "The nvidia module's InitializeSystemMemoryAllocations (pinned memory is zeroed while 1): \`$setting\`."
say "What mnemosyne concludes (MNEMOSYNE_ZEROED=auto; a \"yes\" where the table above says no is a bug):"
say ""
for heap in unified pinned; do
  run_step "zeroed-$heap" 60 "$heap" env MNEMOSYNE_VERBOSE=1 /bin/true >/dev/null
  say "- \`$(grep -h 'fresh .* memory reads zero' "$logs/zeroed-$heap.log" | head -1)\`"
done
say ""
say "What calloc costs: 256 MiB (a huge arena block) and 1100 MiB (a dedicated segment). Memory not known"
say "zero is cleared by the device for managed heaps (cuMemsetD8Async: no host RAM), by the CPU for"
say "pinned; host RAM is VmRSS growth before the block is read (one int per page is checked):"
say ""
say "| heap | size, MiB | calloc, ms | host RAM, MiB | reads zero |"
say "|---|---|---|---|---|"
for heap in none unified device pinned pinned+vmm; do
  status=$zero_status
  [ "$heap" = none ] || status=$(run_step "zero-$heap" 120 "$heap" "$probe" zero)
  grep '^zero calloc' "$logs/zero-$heap.log" | while read -r line; do
    say "| ${heap/none/glibc} | $(( $(echo "$line" | field calloc_bytes) >> 20 )) | $(echo "$line" | field calloc_ms) | $(echo "$line" | field calloc_rss_mib) | $(echo "$line" | field calloc_zero | yes_no) ($status) |"
  done
done
say ""

# ---------------------------------------------------------------- 4. fork, 5. reset
say "## 4. Fork: what a child inherits"
say ""
say "An 8 MiB malloc'd block written by the CPU, then by a kernel (+7); a forked child reads it."
say ""
say "| backend | smaps VmFlags | mincore after CPU write | after GPU write | the child read |"
say "|---|---|---|---|---|"
probe_rows fork smaps_vmflags mincore_after_cpu_write mincore_after_gpu_write child
say ""
say "(\`dc\`: the mapping is not inherited by fork; mnemosyne copies the heap into the child.)"
say ""

say "## 5. cuDevicePrimaryCtxReset (what cudaDeviceReset does) under a live heap"
say ""
say "| backend | last step reached | exit |"
say "|---|---|---|"
for backend in unified pinned pinned+vmm host unified+own pinned+own; do
  status=$(run_step "reset-$backend" 60 "$backend" "$probe" reset)
  last=$(grep '^reset step=' "$logs/reset-$backend.log" | tail -n 1 | sed 's/^reset step=//')
  say "| $backend | ${last:-none} | $status |"
done
say ""
say "Steps: allocated, reset, read-old-block, freed-old-blocks, new-malloc-works; exit 139 is SIGSEGV."
say "+own: MNEMOSYNE_CONTEXT=own, the heap in a context of mnemosyne's, which the reset should spare."
say "pinned+vmm: what the reset does to granules of the virtual-memory API is documented nowhere (docs/limits.md assumes it destroys them)."
say ""

# ---------------------------------------------------------------- 6. throughput
say "## 6. malloc/free throughput"
say ""
if [ -z "$workloads" ]; then
  say "Skipped: no bench/workloads binary (build it, or put it in the --prebuilt folder)."
else
  say "glibc's malloc-simple shape (10,000 blocks of 16 B to 256 B allocated, then freed, per round),"
  say "in million malloc/free pairs per second. The naive interposer (one cuMemAllocManaged per"
  say "malloc, bench/naive_interposer.c) runs 1% of the rounds."
  say ""
  say "| heap | 1 thread | 8 threads |"
  say "|---|---|---|"
  for heap in none unified device pinned naive; do
    [ "$heap" = naive ] && [ -z "$naive" ] && continue
    row="| ${heap/none/glibc} |"
    for shape in malloc-simple:1 malloc-thread-8:8; do
      name=${shape%:*} threads=${shape#*:} scale=1
      limit=120
      [ "$heap" = naive ] && { scale=0.01; limit=60; }
      status=$(run_step "throughput-$heap-$name" "$limit" "$heap" "$workloads" "$name" "$scale")
      # The workload's own time (work_ms): the process's start, a driver's
      # cuInit and context (~0.2 s) included, would dwarf 2 million pairs.
      ms=$(field work_ms <"$logs/throughput-$heap-$name.log")
      rounds=$(awk -v s="$scale" 'BEGIN { print int(200 * s) + 1 }')
      rate=$(awk -v r="$rounds" -v t="$threads" -v ms="${ms:-0}" \
        'BEGIN { if (ms > 0) printf "%.2f", r * 10000 * t / (ms / 1e3) / 1e6 }')
      if [ "$status" = "exit 0" ] && [ -n "$rate" ]; then row="$row $rate |"; else row="$row $status |"; fi
    done
    say "$row"
  done
fi
say ""

# ---------------------------------------------------------------- 7. programs
say "## 7. Unmodified programs"
say ""
py_prog='import json; d = {str(i): [i] * (i % 40) for i in range(60000)}; s = json.dumps(d); print(len(json.loads(s)), len(s))'
c_src="$logs/work.c"
for i in $(seq 1 300); do echo "int f$i(int x) { int a[$((i % 13 + 1))]; for (int k = 0; k < $((i % 13 + 1)); ++k) a[k] = x * k; return a[x % $((i % 13 + 1))]; }"; done >"$c_src"
say "| program | $(printf '%s | ' unified device pinned pinned+vmm)"
say "|---|---|---|---|---|"
np_prog='import numpy as np; a = np.arange(1 << 20, dtype=np.int64).reshape(1024, 1024); b = a @ (a[:, :16] % 97); print(int(b.sum()), int(np.sort(a.ravel() * 7919 % 10007)[::4096].sum()), round(float(np.sqrt(a).sum()), 3))'
# PyTorch: a CPU tensor of 4 MiB to the device (cudaMemcpy from the heap),
# a product there, a pinned copy, and NumPy over a tensor's memory.
torch_prog='import torch; torch.manual_seed(0); a = torch.randn(2048, 2048, device="cuda"); b = (a @ a).sum().item(); c = torch.arange(1 << 20).float().cuda().sum().item(); d = torch.arange(1 << 20).float().pin_memory().cuda().sum().item(); print(round(b, 1), c, d, torch.zeros(1 << 20).numpy().sum())'
for prog in python3 numpy gcc torch; do
  case $prog in
    python3) exe=$python; cmd=("$exe" -c "$py_prog") ;;
    numpy) exe=$python; cmd=("$exe" -c "$np_prog")
           [ -n "$exe" ] && ! "$exe" -c 'import numpy' >/dev/null 2>&1 && exe="" ;;
    gcc) exe=$(command -v gcc || true); cmd=("$exe" -O2 -S -o - "$c_src") ;;
    torch) exe=$python; cmd=("$exe" -c "$torch_prog")
           [ -n "$exe" ] && ! "$exe" -c 'import torch' >/dev/null 2>&1 && exe="" ;;
  esac
  if [ -z "$exe" ]; then say "| $prog | skipped: not installed | | | |"; continue; fi
  want=$(env -u LD_PRELOAD "${cmd[@]}" 2>&1 | sha256sum)
  row="| $prog |"
  for backend in unified device pinned pinned+vmm; do
    status=$(run_step "program-$prog-$backend" 120 "$backend" "${cmd[@]}")
    got=$(sha256sum <"$logs/program-$prog-$backend.log")
    if [ "$got" = "$want" ]; then row="$row identical |"; else row="$row differs ($status) |"; fi
  done
  say "$row"
done
say ""

# ---------------------------------------------------------------- 8. the demo
say "## 8. NumPy memory in a GPU kernel, in place"
say ""
demo="$root/scripts/gpu_demo.py"
if [ -z "$python" ] || ! "$python" -c 'import numpy' >/dev/null 2>&1; then
  say "Skipped: NumPy is not installed."
else
  # As users run it: through the launcher, when it finds its library (a flat
  # --prebuilt folder is not an installed tree; then LD_PRELOAD, as it does).
  how="mnemosyne run --backend=unified --"
  launch=("$launcher" run --backend=unified --)
  if [ -z "$launcher" ] ||
     ! env MNEMOSYNE_CUDA_DRIVER="$driver" "$launcher" run --backend=unified -- /bin/true >/dev/null 2>&1; then
    how="LD_PRELOAD=libmnemosyne.so MNEMOSYNE_BACKEND=unified"
    launch=(env LD_PRELOAD="$lib" MNEMOSYNE_BACKEND=unified)
  fi
  say "\`$how python3 scripts/gpu_demo.py --with WAY\`"
  say "for each way installed (\`driver\`, the CUDA driver through ctypes, always is), then without mnemosyne:"
  say ""
  say '```'
  for way in cupy torch driver; do
    [ "$way" = driver ] || "$python" -c "import $way" >/dev/null 2>&1 || continue
    status=$(run_step "demo-$way" 180 none "${launch[@]}" "$python" "$demo" --with "$way")
    say "\$ $how python3 scripts/gpu_demo.py --with $way   # $status"
    cat "$logs/demo-$way.log" >>"$report"
  done
  status=$(run_step demo-without 120 none "$python" "$demo" --with driver)
  say "\$ python3 scripts/gpu_demo.py --with driver   # without mnemosyne: $status"
  cat "$logs/demo-without.log" >>"$report"
  say '```'
fi
say ""
# ---------------------------------------------------------------- 9. the growth corpus
# tests/e2e/run_growth.py with E2E_REAL_DRIVER=1: the growth patterns the
# test suite checks over the double (issue 35), on this driver. Pinned
# memory at the peak is mnemosyne's own count (bytes_backed_peak: over the
# double it equals the driver's); after the quiet phase the larger of that
# count and the kernel's locked and pinned pages (VmLck + VmPin), where the
# driver accounts them there. Managed memory is what is resident. In what
# is left of GPU_CHECK_GROWTH_SECONDS (120).
say "## 9. Growth patterns on this driver"
say ""
growth_probe=$(find_bin growth_probe tests/e2e/growth_probe)
growth_budget=${GPU_CHECK_GROWTH_SECONDS:-120}
if [ -z "$growth_probe" ] || [ -z "$python" ]; then
  say "Skipped: no growth_probe (carry build/ or give --prebuilt BUILD_DIR) or no python3."
else
  say "tests/e2e/run_growth.py: the backend's memory at the peak (at most 1.25 x the live bytes + 2 MiB"
  say "a thread) and after 3 s of quiet (at most live + 64 MiB); cells start while ${growth_budget} s last."
  say ""
  say "| pattern | mode | result |"
  say "|---|---|---|"
  growth_start=$(date +%s)
  for pattern in concat realloc threads burst small python-concat vector temp-huge scatter; do
    for mode in vmm unified arena; do
      if [ $(( $(date +%s) - growth_start )) -ge "$growth_budget" ]; then
        say "| $pattern | $mode | not run: the step's ${growth_budget} s were spent |"
        continue
      fi
      status=$(run_step "growth-$pattern-$mode" 90 none env E2E_REAL_DRIVER=1 MNEMOSYNE_LIB="$lib" \
        FAKECUDA_LIB="$driver" GROWTH_PROBE="$growth_probe" \
        "$python" "$root/tests/e2e/run_growth.py" "$pattern" "$mode")
      result=$(grep -m1 '^growth \[' "$logs/growth-$pattern-$mode.log" | sed 's/^growth \[[^]]*\]: //')
      problems=$(grep -c '^FAIL' "$logs/growth-$pattern-$mode.log")
      [ "$problems" = 0 ] || result="$result; $(grep -m1 '^FAIL' "$logs/growth-$pattern-$mode.log" | cut -c1-160)"
      say "| $pattern | $mode | ${result:-no figures} ($status) |"
    done
  done
fi
say ""
# Forked workers (issue 36): children of forks that follow each other share
# one image of the heap, compared page by page with the heap at each later
# fork. Here the compare reads driver memory with the CPU (and copy_early
# what lives on the device); each worker checks every byte it reads. A heap
# this large is copied by mnemosyne's fork helpers too (several threads
# reading driver memory at once; e2e fork-pool-large below checks what the
# workers read, and how many threads copied).
say "### Forked workers sharing one image (bench/fork_workers.py, 256 MiB heap, 4 workers)"
say ""
if [ -z "$python" ]; then
  say "Skipped: no python3."
else
  say "| backend | forks, each (s) | MiB the machine lost while they lived | result |"
  say "|---|---|---|---|"
  for heap in none unified device pinned+vmm; do
    status=$(run_step "fork-workers-$heap" 120 "$heap" "$python" "$root/bench/fork_workers.py" \
      --mib 256 --workers 4)
    row=$("$python" - "$logs/fork-workers-$heap.log" <<'PY' 2>/dev/null
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(f"{r['forks_s']} ({', '.join(map(str, r['each_s']))}) | {r['lost_mib']} | "
      f"{'every worker read its heap right' if r['ok'] else 'A WORKER READ WRONG DATA'}")
PY
    )
    say "| ${heap/none/glibc} | ${row:-no figures | | see the log} ($status) |"
  done
fi
say ""

# ---------------------------------------------------------------- 10. what the heap buys
# What a heap in driver memory buys a program that moves its data to the GPU
# (issue 48): a 256 MiB malloc'd block under each heap, glibc's first
# (pageable memory, which the driver stages through a buffer of its own),
# against a cuMemHostAlloc buffer (the reference: what cudaHostAlloc gives).
# gpu_probe gains: copy bandwidth both ways, an asynchronous copy beside
# kernels on another stream (overlap 1: they ran together; and how long
# the copy's call took to return), a kernel on the block in place against
# the block copied into cuMemAlloc memory first. Then PyTorch's
# tensor.to("cuda", non_blocking=True) of a 256 MiB CPU tensor, where
# PyTorch with CUDA is installed.
say "## 10. What the heap buys: copies and kernels"
say ""
gains_rows=""
for heap in none pinned pinned+vmm unified device; do
  status=$(run_step "gains-$heap" 120 "$heap" "$probe" gains)
  log="$logs/gains-$heap.log"
  name=$heap
  [ "$heap" = none ] && name="glibc (pageable)"
  line=$(grep -m1 '^gains buffer=malloc ' "$log")
  kernel=$(grep -m1 '^gains kernel_' "$log")
  overlap=$(echo "$line" | field overlap)
  if [ -z "$line" ]; then
    why=$(grep -m1 -E '^gains (result|buffer)=' "$log" | sed 's/^gains //')
    gains_rows="$gains_rows| $name | ${why:-no result} ($status) | | | | | |"$'\n'
    continue
  fi
  gains_rows="$gains_rows| $name | $(echo "$line" | field htod_gbs) | $(echo "$line" | field dtoh_gbs) |"
  gains_rows="$gains_rows $overlap | $(echo "$line" | field async_call_ms) of $(echo "$line" | field copy_ms) |"
  gains_rows="$gains_rows $(echo "$kernel" | field kernel_inplace_ms) | $(echo "$kernel" | field kernel_copied_ms) |"$'\n'
done
reference=$(grep -m1 '^gains buffer=cuMemHostAlloc ' "$logs/gains-none.log")
say "A 256 MiB block from malloc under each heap, copied to device memory (cuMemcpyHtoD) and back"
say "(median of 3); copied asynchronously beside kernels on another stream that take about as long"
say "(overlap: 1 when copy and kernels ran together, 0 when one waited for the other; and when the"
say "copy's call returned, of the copy's time); a kernel adding 1 to every int of the block in place"
say "(median of 3 launches after a first, which may migrate it) against the block copied into"
say "cuMemAlloc memory and the kernel run there. The last row is a cuMemHostAlloc buffer."
say ""
say "| heap | to device, GB/s | to host, GB/s | async copy: overlap | its call returned after, of ms | kernel in place, ms | copied first, then the kernel, ms |"
say "|---|---|---|---|---|---|---|"
printf '%s' "$gains_rows" >>"$report"
if [ -n "$reference" ]; then
  say "| cuMemHostAlloc (reference) | $(echo "$reference" | field htod_gbs) | $(echo "$reference" | field dtoh_gbs) |" \
      "$(echo "$reference" | field overlap) | $(echo "$reference" | field async_call_ms) of $(echo "$reference" | field copy_ms) | | |"
fi
say ""
torch_py='
import sys, time
import torch
if not torch.cuda.is_available():
    print("torch result=no-cuda")
    sys.exit(0)
t = torch.ones(64 << 20, dtype=torch.float32)  # 256 MiB
torch.cuda.synchronize()
t.to("cuda", non_blocking=True)
torch.cuda.synchronize()
runs, calls = [], []
for _ in range(5):
    start = time.perf_counter()
    g = t.to("cuda", non_blocking=True)
    returned = time.perf_counter()
    torch.cuda.synchronize()
    runs.append(time.perf_counter() - start)
    calls.append(returned - start)
    del g
runs.sort()
calls.sort()
print(f"torch gbs={(256 << 20) / runs[2] / 1e9:.2f} call_ms={calls[2] * 1e3:.2f} is_pinned={int(t.is_pinned())}")
'
if [ -z "$python" ] || ! "$python" -c 'import torch' >/dev/null 2>&1; then
  say "PyTorch: not installed, so \`tensor.to(\"cuda\", non_blocking=True)\` was not measured."
else
  say "PyTorch: \`tensor.to(\"cuda\", non_blocking=True)\` of a 256 MiB CPU tensor (median of 5):"
  say ""
  say "| heap | GB/s | the call returned after, ms | tensor.is_pinned() |"
  say "|---|---|---|---|"
  for heap in none pinned; do
    status=$(run_step "torch-$heap" 120 "$heap" "$python" -c "$torch_py")
    line=$(grep -m1 '^torch ' "$logs/torch-$heap.log")
    name=$heap
    [ "$heap" = none ] && name="glibc (pageable)"
    if [ -z "$(echo "$line" | field gbs)" ]; then
      say "| $name | $(echo "$line" | sed 's/^torch //') ($status) | | |"
    else
      say "| $name | $(echo "$line" | field gbs) | $(echo "$line" | field call_ms) | $(echo "$line" | field is_pinned | yes_no) |"
    fi
  done
fi
say ""
# ---------------------------------------------------------------- 10. the e2e suite
# Last, in what is left of the run's time: tests/e2e/run_e2e.py with
# E2E_REAL_DRIVER=1, unmodified programs under each backend, output identical
# to their plain runs, the heap checked through each process's statistics.
# It needs a build tree (its probes). Each row is written when its case ends,
# so a run cut short still reports what it did.
say "## 11. The end-to-end suite on this driver"
say ""
tree=""
for dir in "$prebuilt" "$root/build"; do
  [ -n "$dir" ] && [ -x "$dir/tests/e2e/alloc_probe" ] && { tree=$(cd "$dir" && pwd); break; }
done
# fork-snapshot early: what a child reads after its parent's driver copy
# (cuMemcpyDtoH) into a heap block right after the fork (issue 36).
e2e_cases=(probe fork-snapshot fork-pull fork-pool-large python gcc git sort xz ls thread-churn dlopen fork-held-lock fork-python fork-python-threads
           fork-storm fork-fopen fork-patterns fork-from-thread fork-own-handler fork-gdb bad-options
           own-context fork-cross-free errno promises calloc fork-signal fork-signal-threads)
left=$(( started + ${GPU_CHECK_SECONDS:-450} - $(date +%s) ))
e2e_budget=${GPU_CHECK_E2E_SECONDS:-240}
# GPU_CHECK_E2E_BACKENDS: the columns, for a run that follows up on one mode.
e2e_backends=${GPU_CHECK_E2E_BACKENDS:-unified device pinned pinned+vmm}
[ "$left" -lt "$e2e_budget" ] && e2e_budget=$(( left > 0 ? left : 0 ))
if [ -z "$tree" ]; then
  say "Skipped: no build tree with tests/e2e (give --prebuilt BUILD_DIR, or carry build/)."
elif [ -z "$python" ]; then
  say "Skipped: no python3."
else
  say "tests/e2e/run_e2e.py with E2E_REAL_DRIVER=1: output identical to a plain run, every process's"
  say "heap on the backend (its statistics file); the double's own log checks are not made."
  say "Cases start while the step's ${e2e_budget} s last."
  say ""
  say "| case | backend | verdict |"
  say "|---|---|---|"
  e2e_start=$(date +%s) passed=0 cells=0
  for case in "${e2e_cases[@]}"; do
    for backend in $e2e_backends; do
      cells=$((cells + 1))
      if [ $(( $(date +%s) - e2e_start )) -ge "$e2e_budget" ]; then
        say "| $case | $backend | not run: the step's ${e2e_budget} s were spent |"
        continue
      fi
      status=$(run_step "e2e-$case-$backend" 120 none env E2E_REAL_DRIVER=1 \
        MNEMOSYNE_LIB="$lib" FAKECUDA_LIB="$driver" ALLOC_PROBE="$tree/tests/e2e/alloc_probe" \
        THREAD_CHURN="$tree/tests/e2e/thread_churn" FORK_PROBE="$tree/tests/e2e/fork_probe" \
        FORK_RACE_PROBE="$tree/tests/e2e/fork_race_probe" ERRNO_PROBE="$tree/tests/e2e/errno_probe" \
        FORK_PULL_PROBE="$tree/tests/e2e/fork_pull_probe" \
        PROMISE_PROBE="$tree/tests/e2e/promise_probe" \
        FAULT_PROBE="$tree/tests/e2e/fault_probe" STRESS_PROBE="$tree/tests/e2e/stress_probe" \
        DLOPEN_PROBE="$tree/tests/e2e/dlopen_probe" CTOR_LIB="$tree/tests/e2e/libctor_alloc.so" \
        SIZE_ROUTE_PROBE="$tree/tests/e2e/size_route_probe" MNEMOSYNE_LAUNCHER="$launcher" \
        E2E_PIN="$([ "${backend%+vmm}" != "$backend" ] && echo vmm || echo arena)" \
        "$python" "$root/tests/e2e/run_e2e.py" "$case" "${backend%+vmm}")
      verdict=$(grep -m1 -E '^(PASS|FAIL|SKIP)' "$logs/e2e-$case-$backend.log" | cut -c1-160)
      [ "$status" = "exit 0" ] || [ -n "$verdict" ] || verdict="no verdict ($status)"
      [ "${verdict#PASS}" != "$verdict" ] && passed=$((passed + 1))
      say "| $case | $backend | ${verdict:-$status} |"
    done
  done
  say ""
  say "$passed of $cells passed."
fi
say ""
say "Finished in $(( $(date +%s) - started )) s."
echo "gpu-check: report in $report"
