#!/usr/bin/env python3
"""scripts/gpu-check.sh against the test double: it runs every step from
binaries given with --prebuilt (what is carried to a GPU machine) and
writes the report; without a driver it says so in one line and exits 0."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "gpu-check.sh")
failures = []


def expect(ok, what, detail=""):
    print(f"{'ok' if ok else 'FAIL'} {what}")
    if not ok:
        failures.append(what)
        print(f"  {detail}")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MNEMOSYNE_", "FAKECUDA_", "LD_PRELOAD"))}
    env.update(extra)
    return env


# The give-back phases of 1 MiB blocks at half their size: the e2e give-back
# cases run the full 2 GiB over the double; here the script's rows are
# checked (smaller, what a process keeps, its first arena, would weigh more
# than the 10% the checks allow).
PHASE_MIB = 1024
tmp = tempfile.mkdtemp(prefix="mnemosyne-gpu-check-")
try:
    flat = os.path.join(tmp, "prebuilt")
    os.makedirs(flat)
    for key in ("MNEMOSYNE_LIB", "GPU_PROBE", "MNEMOSYNE_LAUNCHER", "BENCH_WORKLOADS",
                "NAIVE_INTERPOSER"):
        shutil.copy(os.environ[key], flat)
    report_dir = os.path.join(tmp, "report")
    r = subprocess.run(["bash", SCRIPT, report_dir, "--prebuilt", flat], capture_output=True,
                       text=True, timeout=500,
                       env=clean_env(MNEMOSYNE_CUDA_DRIVER=os.environ["FAKECUDA_LIB"],
                                     GPU_CHECK_E2E_SECONDS="5",
                                     GPU_CHECK_GROWTH_SECONDS="10",
                                     GPU_CHECK_PHASE_MIB=str(PHASE_MIB)))
    expect(r.returncode == 0, "the script finishes against the double", r.stderr[-500:])
    with open(os.path.join(report_dir, "report.md")) as f:
        report = f.read()
    expect(flat in report, "it used the --prebuilt binaries", report[:400])
    expect(re.search(r"^- userfaultfd \(issue 47\): vm\.unprivileged_userfaultfd \S+, "
                     r"/dev/userfaultfd .*; the call as \S+: every fault: \w+, "
                     r"user-mode faults only: \w+$", report, re.M),
           "whether userfaultfd serves this user is reported", report[:600])
    # The e2e step needs a build tree: the flat folder has none, build/ may.
    if "## 11. The end-to-end suite" in report and "Skipped: no build tree" not in report:
        expect("| probe | unified | PASS probe [unified] |" in report,
               "the e2e suite ran in its real-driver mode", report[:1500])
    for row, what in [
        ("| without mnemosyne | CUDA_ERROR_ILLEGAL_ADDRESS | CUDA_ERROR_ILLEGAL_ADDRESS | "
         "CUDA_ERROR_ILLEGAL_ADDRESS | not driver memory |", "the kernel faults without mnemosyne"),
        ("| unified | ok | ok | ok | device, managed=1 |", "unified: the kernel works in place"),
        ("| device | ok | ok | ok | device, managed=1 |", "device: the kernel works in place"),
        ("| pinned | ok | ok | ok | host, managed=0 |", "pinned: the kernel works in place"),
        ("| pinned+vmm | ok | ok | ok | host, managed=0 |",
         "pinned with PIN=vmm: the kernel works in place"),
        ("| pinned+vmm | ok / ok | ok / ok | ok / ok | ok / ok |",
         "pinned with PIN=vmm: the driver copies every block, out and through device memory"),
        ("`location=host fresh_zero=yes cpu=ok kernel=ok copy_spanning=ok",
         "the virtual-memory API's host memory: zero, CPU, kernel and spanning copies reported"),
        ("pinned: size=67108864 driver_memory=1 is_managed=0 memory_type=host",
         "pinned blocks are the driver's host memory"),
        ("does not exist: the driver reports 2 devices", "a device past the last is refused"),
        ("| python3 | identical | identical | identical |", "python3's output is unchanged"),
        ("| gcc | identical | identical | identical |", "gcc's output is unchanged"),
        ("- device: size=67108864 driver_memory=1 is_managed=1 memory_type=device device=0 "
         "preferred_location=0", "device blocks prefer the chosen device"),
        ("| managed | yes | yes |", "whether fresh managed memory reads zero is reported"),
        ("| pinned | yes | yes |", "whether fresh pinned memory reads zero is reported"),
        ("- cuInit: ", "cuInit is timed"),
        ("mnemosyne fake GPU 0", "mnemosyne info's report is included"),
        ("one more process's context takes (what each process of a tree costs): 0 bytes",
         "the context cost is measured (the double's contexts take no device memory)"),
        ("| unified | rd,wr,mr,mw,me,dc", "unified segments are marked not to be inherited (dc)"),
        ("| host | new-malloc-works | exit 0 |", "the host backend survives a context reset"),
        ("| unified+own | new-malloc-works | exit 0 |",
         "unified in its own context survives a context reset"),
        ("| pinned+own | new-malloc-works | exit 0 |",
         "pinned in its own context survives a context reset"),
        ("| unified+own | ok | ok | ok | device, managed=1 |",
         "a kernel works on a heap in mnemosyne's own context"),
        ("- CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: 1; MADV_DONTFORK on the memory: yes",
         "what pinned reservations rely on is reported"),
        ("cuMemHostUnregister: 0.", "registration is timed"),
    ]:
        expect(row in report, what, report)
    m = re.search(r"all freed: (\d+) MiB page-locked at the peak, (\d+) MiB 3 s after the frees "
                  r"\(resident: (\d+) MiB, then (\d+) MiB\)", report)
    expect(m and int(m.group(1)) >= PHASE_MIB and int(m.group(2)) < int(m.group(1)) // 10
           and int(m.group(4)) < int(m.group(3)) // 10,
           "the give-back row shows pinned memory returned", report)
    m = re.search(r"MNEMOSYNE_PIN=vmm`: (\d+) MiB mapped at the peak, (\d+) MiB 3 s after the frees "
                  r"\(resident: (\d+) MiB, then (\d+) MiB\)", report)
    expect(m and int(m.group(1)) >= PHASE_MIB and int(m.group(2)) < int(m.group(1)) // 10,
           "the give-back row shows PIN=vmm granules returned", report)
    m = re.search(r"all freed: (\d+) MiB allocated at the peak, (\d+) MiB 3 s after the frees "
                  r"\(resident: (\d+) MiB, then (\d+) MiB\)", report)
    expect(m and int(m.group(1)) >= PHASE_MIB and int(m.group(2)) < int(m.group(1)) // 10
           and int(m.group(4)) < int(m.group(3)) // 10,
           "the give-back row shows huge managed blocks returned", report)
    m = re.search(r"all freed: (\d+) MiB of arenas at the peak, (\d+) MiB 3 s after the frees "
                  r"\(resident: (\d+) MiB, then (\d+) MiB\)", report)
    expect(m and int(m.group(1)) >= PHASE_MIB and int(m.group(2)) < int(m.group(1)) // 10
           and int(m.group(4)) < int(m.group(3)) // 10,
           "the give-back row shows unused managed arenas returned", report)
    m = re.search(r"are discarded\): (\d+) MiB of arenas at the peak, (\d+) MiB kept 3 s after the "
                  r"frees \(resident: (\d+) MiB, then (\d+) MiB\)", report)
    expect(m and int(m.group(1)) >= PHASE_MIB and int(m.group(4)) < int(m.group(3)) // 10,
           "the discard row shows free blocks of kept arenas dropped", report)
    section = report.split("## 6. malloc/free throughput", 1)[-1].split("\n## ", 1)[0]
    rates = {l.split("|")[1].strip(): l for l in section.splitlines()
             if re.fullmatch(r"\| \w+ \| .* \| .* \|", l) and not l.startswith("| heap")}
    expect(all(re.fullmatch(r"\| \w+ \| [0-9.]+ \| [0-9.]+ \|", rates.get(h, ""))
               for h in ("glibc", "unified", "device", "pinned")),
           "throughput at 1 and 8 threads for glibc and each backend", rates)
    # The naive interposer is the benchmark's strawman, not ours: it is
    # reported, whatever it does (under 8 threads it sometimes gets NULL).
    expect("naive" in rates, "the naive interposer is reported", rates)
    touch = [l for l in report.splitlines()
             if re.fullmatch(r"\| (unified|device|pinned) \| [0-9.]+ \| [0-9.]+ \(exit 0\) \|", l)]
    expect(len(touch) == 3, "first-touch bandwidth from the CPU and the GPU, per backend", touch)
    fork_rows = [l for l in report.splitlines() if l.startswith(("| unified | rd", "| device | rd",
                                                                  "| pinned | rd"))]
    expect(len(fork_rows) == 3 and all("same-data (exit 0)" in l for l in fork_rows),
           "a forked child reads what the kernel wrote, on every backend", fork_rows)
    costs = [l for l in report.splitlines()
             if re.fullmatch(r"\| \d+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|", l)]
    expect(len(costs) == 3, "cuMemAllocManaged, cuMemAdvise and cuMemHostAlloc at three sizes",
           costs)
    calloc = [l for l in report.splitlines()
              if re.fullmatch(r"\| (glibc|unified|device|pinned) \| (256|1100) \| [0-9.]+ \| -?\d+ \| "
                              r"yes \(exit 0\) \|", l)]
    expect(len(calloc) == 8, "callocs of 256 MiB and 1100 MiB are timed and read zero under every heap",
           calloc)
    numpy_here = subprocess.run(["/usr/bin/python3", "-c", "import numpy"]).returncode == 0
    if numpy_here:
        expect("| numpy | identical | identical | identical |" in report,
               "NumPy's output is unchanged", report)
    if numpy_here:
        demo = report.split("## 8.", 1)[-1]
        expect("--with driver   # exit 0\nthe CUDA driver (libfakecuda.so) through ctypes: kernel ran "
               "on NumPy memory" in demo and "result checked from NumPy: ok" in demo,
               "the demo: a kernel adds 7 to a NumPy array in place", demo)
        expect("without mnemosyne: exit 1\ndriver: the kernel did not run on NumPy memory" in demo
               and "CUDA_ERROR_ILLEGAL_ADDRESS" in demo, "the demo faults without mnemosyne", demo)
    # The growth patterns' rows (run_growth.py's real-driver mode): a cell or
    # two in the few seconds given here, when a build tree has the probe.
    growth = report.split("## 9. Growth patterns", 1)[-1].split("\n## ", 1)[0]
    if "Skipped" not in growth:
        expect(re.search(r"\| concat \| vmm \| peak \d+ MiB for \d+ MiB live \([0-9.]+x\), after the "
                         r"quiet phase \d+ MiB for \d+ MiB live[^|]* \(exit 0\) \|", growth),
               "the growth corpus runs on the driver", growth)
        workers = growth.split("### Forked workers", 1)[-1]
        rows = re.findall(r"^\| (glibc|unified|device|pinned\+vmm) \| [0-9.]+ \([0-9., ]+\) \| -?\d+ "
                          r"\| every worker read its heap right \(exit 0\) \|$", workers, re.M)
        expect(rows == ["glibc", "unified", "device", "pinned+vmm"],
               "forked workers read their heap on every backend", workers)
    # What the heap buys (gpu_probe gains): a row for every heap and the
    # reference, with figures; over the double the figures mean nothing, the
    # rows only show that the script runs. The kernel faults on glibc's
    # pageable memory (unreachable here) and runs in place on the others.
    gains = report.split("## 10. What the heap buys", 1)[-1].split("\n## ", 1)[0]
    number = r"[0-9]+\.[0-9]{2}"
    for heap in ("glibc \\(pageable\\)", "pinned", "pinned\\+vmm", "unified", "device"):
        inplace = "unreachable" if heap.startswith("glibc") else number
        expect(re.search(rf"^\| {heap} \| {number} \| {number} \| {number} \| {number} of {number} \| "
                         rf"{inplace} \| {number} \|$", gains, re.M),
               f"what the heap buys: the {heap} row", gains)
    expect(re.search(rf"^\| cuMemHostAlloc \(reference\) \| {number} \| {number} \| {number} \| "
                     rf"{number} of {number} \| \| \|$", gains, re.M),
           "what the heap buys: the cuMemHostAlloc reference row", gains)
    expect("PyTorch: not installed" in gains or "| glibc (pageable) | no-cuda" in gains
           or re.search(r"^\| pinned \| [0-9.]+ \|", gains, re.M),
           "what the heap buys: the PyTorch line", gains)
    logs = os.listdir(os.path.join(report_dir, "logs"))
    expect("kernel-unified-malloc.log" in logs and "costs.log" in logs, "raw logs are kept", logs)

    broken_dir = os.path.join(tmp, "broken")
    r = subprocess.run(["bash", SCRIPT, broken_dir, "--prebuilt", flat], capture_output=True,
                       text=True, timeout=120,
                       env=clean_env(MNEMOSYNE_CUDA_DRIVER=os.environ["FAKECUDA_LIB"],
                                     FAKECUDA_INIT_ERROR="100"))
    with open(os.path.join(broken_dir, "report.md")) as f:
        broken = f.read()
    expect(r.returncode == 0 and r.stdout.count("\n") == 1
           and "does not start (error=cuInit rc=CUDA_ERROR_NO_DEVICE)" in r.stdout
           and "The driver does not start, so nothing was checked" in broken
           and "## 1." not in broken,
           "a driver whose cuInit fails: one line, exit 0, the report says why", repr(r))

    have_driver = "libcuda.so.1" in subprocess.run(["ldconfig", "-p"], capture_output=True,
                                                   text=True).stdout
    if not have_driver:
        none_dir = os.path.join(tmp, "none")
        r = subprocess.run(["bash", SCRIPT, none_dir], capture_output=True, text=True,
                           timeout=60, env=clean_env())
        expect(r.returncode == 0 and r.stdout.strip().count("\n") == 0
               and "no NVIDIA driver" in r.stdout and not os.path.exists(none_dir),
               "without a driver: one line, exit 0, nothing written", repr(r))
finally:
    shutil.rmtree(tmp, ignore_errors=True)
print(f"# {len(failures)} failed")
sys.exit(1 if failures else 0)
