#!/usr/bin/env python3
"""Windows end-to-end tests, under wine (headless, a fresh WINEPREFIX).

Each case runs the unmodified harness (harness.cpp) under mnemosyne-inject.exe
and checks what a user would: its output and exit code are those of a normal
run, every block it printed lies in memory the test-double driver handed out
(fakecuda.dll's log), its child process is served too, and errors are one
clear line. The detours-* cases start programs the way Microsoft Detours'
withdll.exe does (detours_layout_inject.cpp lays the process out as Detours
would). Run by `meson test --suite windows` in a mingw-w64 build.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

BLOCK = re.compile(r"^block (\S+) ([0-9A-Fa-fx]+) (\d+)$")
# A registration (cuMemHostRegister, the pinned backend's 1 MiB granules of
# memory of its own) page-locks memory for the driver, as an allocation does.
ALLOC = re.compile(r"^(\d+) (?:alloc|register) kind=(\w+) ptr=0x([0-9a-f]+) size=(\d+)")

results = []


def winpath(path):
    """A Unix path as wine's Z: drive names it."""
    return "Z:" + os.path.abspath(path).replace("/", "\\")


class Wine:
    def __init__(self, work, prefix):
        self.work = work
        self.prefix = prefix
        self.env = dict(os.environ)
        self.env.update({"WINEDEBUG": "-all", "WINEPREFIX": prefix,
                         "WINEDLLOVERRIDES": "mscoree,mshtml=", "DISPLAY": ""})
        for k in list(self.env):
            if k.upper().startswith("MNEMOSYNE_") or k.startswith("FAKECUDA_"):
                del self.env[k]
        if not os.path.isdir(os.path.join(prefix, "drive_c")):
            start = time.monotonic()
            subprocess.run(["wineboot", "-i"], env=self.env, capture_output=True, timeout=300)
            print(f"# fresh WINEPREFIX in {time.monotonic() - start:.1f} s", flush=True)

    def run(self, argv, extra_env=None, timeout=180):
        """(exit status, stdout, stderr) of `wine argv`. A program still
        running after `timeout` seconds is killed and its status is the
        string "timeout after N s", which every case's status check reports
        with whatever the program had printed by then."""
        env = dict(self.env)
        env.update(extra_env or {})
        p = self._run(argv, env, timeout)
        if isinstance(p, tuple):
            return p
        err, lost = wine_own_lines_out(p.stderr)
        if lost and p.returncode != 0:
            # wine's client lost its wineserver: the program did not run to
            # its end, whatever it would have done. Made again, once, said.
            print(f"# {os.path.basename(argv[0])} lost its wineserver (rc={p.returncode}): "
                  "running it again", flush=True)
            p = self._run(argv, env, timeout)
            if isinstance(p, tuple):
                return p
            err, _ = wine_own_lines_out(p.stderr)
        return p.returncode, p.stdout.decode(errors="replace"), err

    @staticmethod
    def _run(argv, env, timeout):
        # Output to files, not pipes, and the wait is for the program's own
        # exit: a wineserver that this wine client starts (when none is
        # running for the prefix) inherits the client's standard output, and
        # a pipe it holds open never reaches end-of-file: the program had
        # ended, yet reading its output waited for the server (seen as hangs
        # "at exit" of 180 s, about 1 run in 40 under load).
        with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:
            p = subprocess.Popen(["wine"] + argv, env=env, stdout=out_f, stderr=err_f)
            try:
                p.wait(timeout=timeout)
                timed_out = False
            except subprocess.TimeoutExpired:
                # Said here, with the Windows processes still alive (which of a
                # tree hung, its threads and where the kernel has them waiting)
                # and what it printed, not as a bare traceback.
                alive = subprocess.run(["ps", "-eLo", "pid,lwp,ppid,etimes,stat,wchan:24,args"],
                                       capture_output=True, text=True).stdout.splitlines()
                alive = [" ".join(l.split()) for l in alive if ".exe" in l and "system32" not in l
                         and l.split()[0] != str(os.getpid())]
                p.kill()
                p.wait()
                timed_out = True
            out_f.seek(0)
            err_f.seek(0)
            out, err = out_f.read(), err_f.read()
        if not timed_out:
            return subprocess.CompletedProcess(p.args, p.returncode, out, err)
        out = out.decode(errors="replace")
        err = err.decode(errors="replace")
        print(f"# {os.path.basename(argv[0])} did not end in {timeout} s and was killed; "
              f"stdout {out[-800:]!r}, stderr {err[-800:]!r}; Windows processes and threads "
              f"alive then: {alive[:40]}", flush=True)
        return (f"timeout after {timeout} s", out, err)


def wine_own_lines_out(stderr):
    """The program's stderr, less the lines wine's own client writes about its
    socket to wineserver ("wine client error:354: sendmsg: ...", the number
    a thread id in hex), which WINEDEBUG does not silence, and whether there
    were any. Seen in two clean CI runs out of about ten, each time in the
    first case of the job, and once with "recvmsg: Connection reset by
    peer" where the program then ended with status 1 and no output of its
    own (a wineserver of the shared prefix exiting as the client came). They
    are printed, not hidden; a run that failed with one is made again
    (Wine.run); the exit status and output checks see any harm they did."""
    kept = []
    lost = False
    for line in stderr.decode(errors="replace").splitlines(keepends=True):
        if re.match(r"wine client error:[0-9a-f]+: ", line):
            print(f"# wine itself wrote: {line.strip()}", flush=True)
            lost = True
        else:
            kept.append(line)
    return "".join(kept), lost


def driver_allocations(log_path):
    """{pid: [(start, end, kind)]} from fakecuda's log."""
    out = {}
    if not os.path.exists(log_path):
        return out
    with open(log_path) as f:
        for line in f:
            m = ALLOC.match(line)
            if m:
                start = int(m.group(3), 16)
                out.setdefault(int(m.group(1)), []).append(
                    (start, start + int(m.group(4)), m.group(2)))
    return out


def blocks(stdout):
    found = []
    for line in stdout.splitlines():
        m = BLOCK.match(line.strip())
        if m:
            found.append((m.group(1), int(m.group(2), 16), int(m.group(3))))
    return found


def inside(ranges, ptr, size):
    """Whether [ptr, ptr + size) lies in driver memory: in one range, or in
    ranges of one process that touch end to end (neighbouring granules)."""
    for ranges_ in ranges.values():
        merged = []
        for start, end, _ in sorted(ranges_):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        if any(start <= ptr and ptr + size <= end for start, end in merged):
            return True
    return False


def record(name, ok, detail=""):
    results.append((name, ok))
    print(f"{'ok' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}",
          flush=True)


def plain_lines(stdout):
    """What a run printed besides block addresses (which differ run to run)."""
    return [l.strip() for l in stdout.splitlines() if l.strip() and not BLOCK.match(l.strip())]


NATIVE = {}


def native_run(wine, harness):
    """The harness without mnemosyne: the reference output. Wine itself
    once returned nothing for it in a fresh prefix (not reproduced in 40
    runs since); a reference run that failed is said and made again, once.
    The runs under mnemosyne are never repeated."""
    if harness not in NATIVE:
        rc, out, err = wine.run([harness])
        if rc != 0 or "harness: ok" not in out:
            print(f"# the run without mnemosyne failed (rc={rc}, stdout {out[-200:]!r}, "
                  f"stderr {err[-300:]!r}); running it again", flush=True)
            rc, out, err = wine.run([harness])
        NATIVE[harness] = (rc, out, err)
    return NATIVE[harness]


def case_injected(wine, a, name, backend, kind, harness, method="auto", extra=(), env_extra=None):
    log = os.path.join(wine.work, f"{name}.log")
    env = {"FAKECUDA_LOG": winpath(log), **(env_extra or {})}
    rc, out, err = wine.run([a.injector, f"--inject={method}", f"--backend={backend}",
                             f"--cuda-driver={winpath(a.driver)}", "--", harness], env)
    problems = []
    if rc != 0 or "harness: ok" not in out:
        problems.append(f"rc={rc}, failures: {[l for l in out.splitlines() if 'FAILED' in l]}")
    if err.strip():
        problems.append(f"stderr not empty: {err.strip()[:300]}")
    native_rc, native_out, _ = native_run(wine, harness)
    if native_rc != 0 or plain_lines(out) != plain_lines(native_out):
        problems.append(f"output differs from a run without mnemosyne: {plain_lines(out)} vs "
                        f"{plain_lines(native_out)}")
    found = blocks(out)
    names = {b[0] for b in found}
    for want in ["malloc", "calloc", "realloc", "aligned_malloc", "aligned_offset_malloc",
                 "aligned_offset_realloc", "expand",
                 "strdup", "wcsdup", "malloc_large", "new", "vector", "string", "new_aligned",
                 "thread", "late_dll", "getprocaddress", "early_realloc", "child_malloc",
                 "child_new", "envchild_malloc", "cleanchild_malloc", *extra]:
        if want not in names:
            problems.append(f"no block {want} printed")
    ranges = driver_allocations(log)
    kinds = {k for r in ranges.values() for _, _, k in r}
    if kind not in kinds:
        problems.append(f"the driver served no {kind} memory (log kinds {sorted(kinds)})")
    # A child whose environment was replaced by one without MNEMOSYNE_
    # variables runs without mnemosyne, as without LD_PRELOAD on Linux.
    outside = [f"{n}@{p:#x}" for n, p, s in found
               if not n.startswith("cleanchild") and not inside(ranges, p, s)]
    if outside:
        problems.append(f"blocks outside driver memory: {outside[:8]}")
    pids = {pid for pid, r in ranges.items() if r}
    if len(pids) != 3:
        problems.append(f"driver memory in {len(pids)} process(es); expected the harness and "
                        "two of its children")
    record(name, not problems, "; ".join(problems))


def case_crt_probe(wine, a):
    """ucrt functions wine's ucrtbase lacks, as mnemosyne serves them."""
    log = os.path.join(wine.work, "crt-probe.log")
    rc, out, err = wine.run([a.injector, "--backend=unified", f"--cuda-driver={winpath(a.driver)}",
                             "--", a.crt_probe], {"FAKECUDA_LOG": winpath(log)})
    problems = []
    if rc != 0 or "crt_probe: ok" not in out or err.strip():
        problems.append(f"rc={rc}: {out[-300:]!r} {err[-300:]!r}")
    ranges = driver_allocations(log)
    found = blocks(out)
    if len(found) != 2 or any(not inside(ranges, p, s) for _, p, s in found):
        problems.append(f"blocks {found} not all in driver memory")
    record("crt-probe", not problems, "; ".join(problems))


def case_api(wine, a):
    """The C API of include/mnemosyne.h, found with GetProcAddress."""
    problems = []
    for backend in ["unified", "host"]:
        rc, out, err = wine.run([a.injector, f"--backend={backend}",
                                 f"--cuda-driver={winpath(a.driver)}", "--", a.api_probe, backend])
        if rc != 0 or not re.search(r"^api_probe \d+\.\d+\.\d+ ok", out, re.M) or err.strip():
            problems.append(f"{backend}: rc={rc} {out[-300:]!r} {err[-200:]!r}")
    record("c-api", not problems, "; ".join(problems))


def case_gtest(wine, a):
    log = os.path.join(wine.work, "gtest.log")
    rc, out, err = wine.run([a.injector, "--backend=unified", f"--cuda-driver={winpath(a.driver)}",
                             "--", a.gtest_harness], {"FAKECUDA_LOG": winpath(log)})
    problems = []
    if rc != 0 or "[  PASSED  ] 4 tests." not in out or "FAILED" in out:
        problems.append(f"rc={rc}: {out[-400:]}")
    pids = {pid for pid, r in driver_allocations(log).items() if r}
    if len(pids) < 3:  # the harness and one child per death test
        problems.append(f"driver memory in {len(pids)} process(es), expected 3")
    record("gtest-death-tests", not problems, "; ".join(problems))


def case_timeout(wine, a):
    rc, out, err = wine.run([a.injector, "--backend=unified", f"--cuda-driver={winpath(a.driver)}",
                             "--", a.harness, "child", "child"],
                            {"FAKECUDA_INIT_DELAY_MS": "4000",
                             "MNEMOSYNE_TEST_DRIVER_TIMEOUT_MS": "300"})
    problems = []
    if rc != 0 or "child_malloc" not in out:
        problems.append(f"rc={rc}")
    if "cuInit(0) gave no answer within 0.3 s" not in err or "uses host memory" not in err:
        problems.append(f"stderr: {err.strip()[:300]}")
    record("cuinit-timeout", not problems, "; ".join(problems))


JSCRIPT = """var a = []; for (var i = 0; i < 20000; i++) a.push("item" + i * 7);
var m = {}; for (var i = 0; i < 20000; i++) m["k" + i] = a[i * 3 % 20000];
var s = a.slice(0, 5000).sort().join(",");
WScript.Echo(a.length + " " + a.join(",").length + " " + m["k19999"] + " " + s.length);
"""


def negative_figures(doc):
    """Every figure of a statistics file that is below zero (none may be:
    frees of blocks the runtime handed out before the start are counted
    apart, in earlier_frees)."""
    found = [f"{pool}.{k}={v}" for pool, figures in doc.get("pools", {}).items()
             for k, v in figures.items() if isinstance(v, (int, float)) and v < 0]
    found += [f"earlier_frees.{k}={v}" for k, v in doc.get("earlier_frees", {}).items() if v < 0]
    return found


def case_real_program(wine, a, name, argv, extra_env=None, min_pids=1):
    """An unmodified program that ships with wine (cmd.exe, cscript.exe):
    the same output as without mnemosyne, and its heap in driver memory."""
    log = os.path.join(wine.work, f"{name}.log")
    stats = os.path.join(wine.work, f"{name}-%p.json")
    env = {"FAKECUDA_LOG": winpath(log), **(extra_env or {})}
    native_rc, native_out, native_err = wine.run(argv)
    rc, out, err = wine.run([a.injector, "--backend=unified", f"--cuda-driver={winpath(a.driver)}",
                             f"--stats-file={winpath(stats)}", "--"] + argv, env)
    problems = []
    if (rc, out) != (native_rc, native_out) or not out.strip():
        problems.append(f"rc={rc} vs {native_rc}, output {out[:200]!r} vs {native_out[:200]!r}")
    if err != native_err:
        problems.append(f"stderr {err[:300]!r}")
    allocs = driver_allocations(log)
    if len([p for p, r in allocs.items() if r]) < min_pids:
        problems.append(f"driver memory in {len(allocs)} process(es), expected {min_pids}")
    with open(log) as f:
        if "deadlock" in f.read():
            problems.append("the driver deadlocked on itself")
    served = 0
    for f in os.listdir(wine.work):
        if f.startswith(name + "-") and f.endswith(".json"):
            with open(os.path.join(wine.work, f)) as fh:
                doc = json.load(fh)
            served += doc.get("pools", {}).get("unified", {}).get("allocations", 0)
            if negative_figures(doc):
                problems.append(f"{f}: negative figures {negative_figures(doc)}")
            if extra_env and "FAKECUDA_THREAD_ITERS" in extra_env and \
                    doc.get("driver_allocations", 0) == 0:
                problems.append("no driver-thread allocation needed new memory: proved nothing")
    if served == 0:
        problems.append("no allocation was served by the unified pool (statistics)")
    record(name, not problems, "; ".join(problems))


def case_host(wine, a):
    log = os.path.join(wine.work, "host.log")
    rc, out, err = wine.run([a.injector, "--backend=host", "--verbose",
                             f"--cuda-driver={winpath(a.driver)}", "--", a.harness],
                            {"FAKECUDA_LOG": winpath(log)})
    problems = []
    if rc != 0 or "harness: ok" not in out:
        problems.append(f"rc={rc}")
    if "mnemosyne: heap on host" not in err:
        problems.append(f"no 'heap on host' line in stderr: {err[:300]}")
    if driver_allocations(log):
        problems.append("the host backend called the driver")
    record("host-backend", not problems, "; ".join(problems))


def case_init_crash(wine, a):
    rc, out, err = wine.run([a.injector, "--backend=unified",
                             f"--cuda-driver={winpath(a.driver)}", "--", a.harness],
                            {"FAKECUDA_INIT_CRASH": "1"})
    problems = []
    if rc != 0 or "harness: ok" not in out:
        problems.append(f"rc={rc}")
    want = "cuInit(0) crashed inside the driver (exception 0xc0000005, access violation)"
    if want not in err or "the heap uses host memory" not in err:
        problems.append(f"stderr: {err.strip()[:400]}")
    # One line for the tree: the harness says it, and its two injected
    # children inherit MNEMOSYNE_WARNED with that line's key.
    lines = [l for l in err.splitlines() if l.strip()]
    if len(lines) != 1:
        problems.append(f"{len(lines)} stderr lines, expected one for the process tree")
    record("cuinit-crash", not problems, "; ".join(problems))


def case_bad_options(wine, a):
    rc, out, err = wine.run([a.injector, "--", a.harness],
                            {"MNEMOSYNE_BAKEND": "host", "MNEMOSYNE_LIMIT": "12Q",
                             "MNEMOSYNE_BACKEND": "host"})
    problems = []
    if rc != 0 or "harness: ok" not in out:
        problems.append(f"rc={rc}")
    for want in ["unknown option MNEMOSYNE_BAKEND=host", "MNEMOSYNE_LIMIT=12Q is not a size"]:
        if want not in err:
            problems.append(f"no warning '{want}' in: {err[:300]}")
    record("bad-options", not problems, "; ".join(problems))


def case_disable(wine, a):
    log = os.path.join(wine.work, "disable.log")
    rc, out, err = wine.run([a.injector, "--disable", f"--cuda-driver={winpath(a.driver)}",
                             "--", a.harness], {"FAKECUDA_LOG": winpath(log)})
    ok = rc == 0 and "harness: ok" in out and not driver_allocations(log) and not err.strip()
    record("disable", ok, f"rc={rc} err={err[:200]}")


def case_programs(wine, a):
    """--programs: in a tree of cmd.exe processes around the harness, only
    the harness (and its children, the same program) load the driver."""
    name = os.path.splitext(os.path.basename(a.harness))[0].upper()  # no .exe, other case
    argv = ["cmd.exe", "/c", f"cmd /c echo one & {winpath(a.harness)} & cmd /c echo two"]
    problems = []
    native_rc, native_out, _ = wine.run(argv)
    for programs, want_pids in ((name, 3), ("no-such-program,C:\\*\\x.exe", 0)):
        log = os.path.join(wine.work, f"programs-{want_pids}.log")
        rc, out, err = wine.run([a.injector, "--backend=unified",
                                 f"--cuda-driver={winpath(a.driver)}", f"--programs={programs}",
                                 "--"] + argv, {"FAKECUDA_LOG": winpath(log)})
        if rc != native_rc or plain_lines(out) != plain_lines(native_out) or \
                "harness: ok" not in out or err.strip():
            problems.append(f"{programs}: rc={rc} vs {native_rc}, output {plain_lines(out)[:6]} "
                            f"vs {plain_lines(native_out)[:6]}, stderr {err.strip()[:200]!r}")
        logged = set()
        if os.path.exists(log):
            with open(log) as f:
                logged = {line.split()[0] for line in f if line.strip()}
        served = {pid for pid, r in driver_allocations(log).items() if r}
        if len(logged) != want_pids or len(served) != want_pids:
            problems.append(f"{programs}: {len(logged)} process(es) loaded the driver and "
                            f"{len(served)} took memory from it; expected {want_pids} (the "
                            "harness and its two children, never cmd.exe)")
    record("programs", not problems, "; ".join(problems))


def case_stats(wine, a):
    path = os.path.join(wine.work, "stats-%p.json")
    rc, out, err = wine.run([a.injector, "--backend=unified", f"--cuda-driver={winpath(a.driver)}",
                             f"--stats-file={winpath(path)}", "--", a.harness])
    problems = []
    if rc != 0 or "harness: ok" not in out:
        problems.append(f"rc={rc}")
    files = [f for f in os.listdir(wine.work) if f.startswith("stats-") and f.endswith(".json")]
    if len(files) != 3:
        problems.append(f"{len(files)} stats files (the harness and two children expected): "
                        f"{files}")
    for f in files:
        try:
            with open(os.path.join(wine.work, f)) as fh:
                doc = json.load(fh)
            text = json.dumps(doc)
            if doc.get("schema") != "mnemosyne-stats/1" or '"allocations": 0' in text.split(
                    '"unified"')[-1][:200]:
                problems.append(f"{f}: unexpected content {text[:200]}")
            if negative_figures(doc):
                problems.append(f"{f}: negative figures {negative_figures(doc)}")
            # The harness frees and reallocates blocks allocated before
            # injection: counted apart, not as the system pool's.
            if doc.get("program", "").lower().startswith("harness") and \
                    doc.get("earlier_frees", {}).get("count", 0) == 0:
                problems.append(f"{f}: the harness's frees of earlier blocks were not counted "
                                f"apart: {doc.get('earlier_frees')}, system pool "
                                f"{doc.get('pools', {}).get('system')}")
        except (OSError, ValueError) as e:
            problems.append(f"{f}: {e}")
    record("stats-file", not problems, "; ".join(problems))


def case_injector_errors(wine, a):
    problems = []
    rc, _, err = wine.run([a.injector, "--bogus", "--", a.harness])
    if rc != 2 or "unknown flag --bogus" not in err:
        problems.append(f"unknown flag: rc={rc} {err.strip()[:200]}")
    rc, _, err = wine.run([a.injector, "--backend=nonesuch", "--", a.harness])
    if rc != 2 or "nonesuch" not in err:
        problems.append(f"bad backend: rc={rc} {err.strip()[:200]}")
    rc, _, err = wine.run([a.injector, "--", winpath(os.path.join(wine.work, "missing.exe"))])
    if rc != 127 or "cannot start" not in err:
        problems.append(f"missing program: rc={rc} {err.strip()[:200]}")
    lonely = os.path.join(wine.work, "lonely")
    os.makedirs(lonely, exist_ok=True)
    shutil.copy(a.injector, lonely)
    rc, _, err = wine.run([os.path.join(lonely, os.path.basename(a.injector)), "--", a.harness])
    if rc != 126 or "mnemosyne.dll not found" not in err:
        problems.append(f"missing DLL: rc={rc} {err.strip()[:200]}")
    shutil.copy(a.injector, lonely)
    with open(os.path.join(lonely, "mnemosyne.dll"), "wb") as f:
        f.write(b"MZ not a DLL" + bytes(500))
    rc, _, err = wine.run([os.path.join(lonely, os.path.basename(a.injector)), "--", a.harness])
    if rc != 126 or "cannot be loaded" not in err:
        problems.append(f"damaged DLL: rc={rc} {err.strip()[:200]}")
    pe32 = os.path.join(wine.work, "pe32.exe")
    with open(pe32, "wb") as f:
        f.write(pe32_image())
    rc, _, err = wine.run([a.injector, "--", winpath(pe32)])
    if rc != 126 or "is a 32-bit program" not in err:
        problems.append(f"32-bit program: rc={rc} {err.strip()[:200]}")
    rc, _, err = wine.run([a.injector, "--backend=host", "--", "cmd.exe", "/c", "exit 7"])
    if rc != 7 or err.strip():
        problems.append(f"exit code: rc={rc} (want 7) {err.strip()[:200]}")
    record("injector-errors", not problems, "; ".join(problems))


LAYOUT = "detours-layout: "
PLAIN_RUNS = {}


def plain_run(wine, argv):
    """A program without mnemosyne, once per command line: the reference."""
    key = tuple(argv)
    if key not in PLAIN_RUNS:
        PLAIN_RUNS[key] = wine.run(argv)
    return PLAIN_RUNS[key]


def without_timings(text):
    """GoogleTest's output, less its run times (which differ run to run)."""
    return re.sub(r" \(\d+ ms( total)?\)", "", text)


def detours_run(wine, a, name, backend, argv, flags=()):
    """argv started by the Detours-layout injector (detours_layout_inject.cpp)
    with mnemosyne.dll, its MNEMOSYNE_* settings in the environment as a
    withdll.exe user sets them. Gives the exit code, stdout, stderr less the
    injector's layout line, that line, the driver's allocations and the
    allocations the backend's pool served (statistics files, all processes)."""
    log = os.path.join(wine.work, f"{name}.log")
    stats = os.path.join(wine.work, f"{name}-%p.json")
    env = {"MNEMOSYNE_BACKEND": backend, "MNEMOSYNE_CUDA_DRIVER": winpath(a.driver),
           "MNEMOSYNE_STATS_FILE": winpath(stats), "FAKECUDA_LOG": winpath(log)}
    rc, out, err = wine.run([a.detours_inject, f"--dll={winpath(a.dll)}", "--show-layout",
                             *flags, "--"] + argv, env)
    layout = [l.strip() for l in err.splitlines() if l.startswith(LAYOUT)]
    err = "".join(l for l in err.splitlines(keepends=True) if not l.startswith(LAYOUT))
    for line in layout:
        print(f"# {name}: {line[len(LAYOUT):]}", flush=True)
    served = 0
    for f in os.listdir(wine.work):
        if f.startswith(name + "-") and f.endswith(".json"):
            with open(os.path.join(wine.work, f)) as fh:
                served += json.load(fh).get("pools", {}).get(backend, {}).get("allocations", 0)
    return rc, out, err, layout, driver_allocations(log), served


def heap_problems(backend, kind, allocs, served, found, min_pids=1):
    """The heap in driver memory: the double's log and the statistics."""
    problems = []
    kinds = {k for r in allocs.values() for _, _, k in r}
    if kind not in kinds:
        problems.append(f"the driver served no {kind} memory (log kinds {sorted(kinds)})")
    pids = {pid for pid, r in allocs.items() if r}
    if len(pids) < min_pids:
        problems.append(f"driver memory in {len(pids)} process(es), expected {min_pids}")
    if served == 0:
        problems.append(f"the statistics show no allocation served by the {backend} pool")
    outside = [f"{n}@{p:#x}" for n, p, s in found if not inside(allocs, p, s)]
    if outside:
        problems.append(f"blocks outside driver memory: {outside}")
    return problems


def case_detours_programs(wine, a, backend, kind):
    """Programs of three image sizes (the static 5-line hello world, the
    import probe, the probe with 44 MiB more of sections) started as
    Detours' withdll.exe starts them: the same output and exit code as
    without mnemosyne, the heap in driver memory, and (the probes) the
    import directory the program reads is its file's."""
    problems = []
    for program in [a.hello, a.import_probe, a.import_probe_big]:
        label = os.path.splitext(os.path.basename(program))[0]
        name = f"detours-{backend}-{label}"
        native_rc, native_out, native_err = plain_run(wine, [program])
        rc, out, err, layout, allocs, served = detours_run(wine, a, name, backend, [program])
        if (rc, plain_lines(out)) != (native_rc, plain_lines(native_out)) or not out.strip():
            problems.append(f"{label}: rc={rc} vs {native_rc}, output {plain_lines(out)} vs "
                            f"{plain_lines(native_out)}")
        if err != native_err:
            problems.append(f"{label}: stderr {err.strip()[:300]!r}")
        if len(layout) != 1 or "payload copied" not in layout[0]:
            problems.append(f"{label}: the injector did not lay the process out: {layout}")
        if "import_probe" in label and "import_probe: the headers are the file's" not in out:
            problems.append(f"{label}: the import directory was not restored")
        problems += [f"{label}: {p}" for p in heap_problems(backend, kind, allocs, served,
                                                            blocks(out))]
    if backend == "unified":
        # The restore record tagged as earlier versions of Detours tag it.
        rc, out, err, _, _, _ = detours_run(wine, a, "detours-earlier-guid", backend,
                                            [a.import_probe], ["--earlier-guid"])
        if rc != 0 or "import_probe: the headers are the file's" not in out or err:
            problems.append(f"earlier GUID: rc={rc}, output {plain_lines(out)}, stderr "
                            f"{err.strip()[:300]!r}")
    record(f"detours-layout-{backend}", not problems, "; ".join(problems))


def case_detours_gtest(wine, a):
    """The GoogleTest program, its death tests in children (injected by the
    DLL's CreateProcess hooks), started with Detours' layout."""
    problems = []
    native_rc, native_out, native_err = plain_run(wine, [a.gtest_harness])
    for backend, kind in (("unified", "managed"), ("pinned", "host")):
        rc, out, err, layout, allocs, served = detours_run(
            wine, a, f"detours-gtest-{backend}", backend, [a.gtest_harness])
        if rc != 0 or "[  PASSED  ] 4 tests." not in out or "FAILED" in out:
            problems.append(f"{backend}: rc={rc}: {out[-400:]}")
        if (rc, without_timings(out)) != (native_rc, without_timings(native_out)):
            problems.append(f"{backend}: output differs from a run without mnemosyne")
        if without_timings(err) != without_timings(native_err):
            problems.append(f"{backend}: stderr {err.strip()[:300]!r}")
        if len(layout) != 1:
            problems.append(f"{backend}: the injector did not lay the process out: {layout}")
        # the harness and one child per death test
        problems += [f"{backend}: {p}" for p in heap_problems(backend, kind, allocs, served, [],
                                                              min_pids=3)]
    record("detours-layout-gtest", not problems, "; ".join(problems))


def case_detours_no_payload(wine, a):
    """Detours' rewrite with no payload to undo it (a foreign injector): the
    bytes before the new import table are not mapped, and mnemosyne.dll must
    neither read them nor touch the image. The hello world starts as without
    mnemosyne, with its heap moved; the probe still sees the rewritten
    directory (nothing put it back) and says so."""
    problems = []
    native_rc, native_out, native_err = plain_run(wine, [a.hello])
    rc, out, err, layout, allocs, served = detours_run(
        wine, a, "detours-nopayload-hello", "unified", [a.hello], ["--no-payload"])
    if len(layout) != 1 or "the bytes before it not mapped; payload left out" not in layout[0]:
        problems.append(f"the layout did not leave unmapped memory before the table: proved "
                        f"nothing: {layout}")
    if (rc, out, err) != (native_rc, native_out, native_err):
        problems.append(f"hello: rc={rc} vs {native_rc}, output {out[:200]!r} vs "
                        f"{native_out[:200]!r}, stderr {err.strip()[:300]!r}")
    problems += [f"hello: {p}" for p in heap_problems("unified", "managed", allocs, served, [])]
    rc, out, err, layout, allocs, served = detours_run(
        wine, a, "detours-nopayload-probe", "unified", [a.import_probe], ["--no-payload"])
    if rc != 1 or "import_probe: the headers differ from the file's" not in out or \
            not re.search(r"^import_probe: imports \S*mnemosyne\.dll KERNEL32", out, re.M) or \
            err.strip():
        problems.append(f"probe: rc={rc} (want 1: the rewrite left in place), output "
                        f"{plain_lines(out)}, stderr {err.strip()[:300]!r}")
    problems += [f"probe: {p}" for p in heap_problems("unified", "managed", allocs, served,
                                                      blocks(out))]
    record("detours-layout-no-payload", not problems, "; ".join(problems))


def case_restore_own(wine, a):
    """The injector's own import rewrite (--inject=imports) is undone as
    well: the probes read their file's import directory."""
    problems = []
    for program in [a.import_probe, a.import_probe_big]:
        label = os.path.splitext(os.path.basename(program))[0]
        log = os.path.join(wine.work, f"restore-own-{label}.log")
        native_rc, native_out, _ = plain_run(wine, [program])
        rc, out, err = wine.run([a.injector, "--inject=imports", "--backend=unified",
                                 f"--cuda-driver={winpath(a.driver)}", "--", program],
                                {"FAKECUDA_LOG": winpath(log)})
        if (rc, plain_lines(out)) != (native_rc, plain_lines(native_out)) or err.strip() or \
                "import_probe: the headers are the file's" not in out:
            problems.append(f"{label}: rc={rc}, output {plain_lines(out)}, stderr "
                            f"{err.strip()[:300]!r}")
        outside = [p for _, p, s in blocks(out) if not inside(driver_allocations(log), p, s)]
        if outside or not blocks(out):
            problems.append(f"{label}: blocks {blocks(out)} not all in driver memory")
    record("restore-own-imports", not problems, "; ".join(problems))


def pe32_image():
    """The headers of a 32-bit (i386) console program: enough for Windows
    to tell its bitness (GetBinaryType), as the injector must before starting
    it. No 32-bit compiler is installed to build a real one."""
    import struct
    dos = b"MZ" + bytes(58) + struct.pack("<I", 64)
    coff = struct.pack("<HHIIIHH", 0x14C, 1, 0, 0, 0, 224, 0x0102)  # i386, executable, 32-bit
    opt = bytearray(224)
    struct.pack_into("<H", opt, 0, 0x10B)  # PE32
    struct.pack_into("<I", opt, 16, 0x1000)  # entry point
    struct.pack_into("<I", opt, 28, 0x400000)  # image base
    struct.pack_into("<II", opt, 32, 0x1000, 0x200)  # section, file alignment
    struct.pack_into("<H", opt, 40, 4)  # major operating system version
    struct.pack_into("<H", opt, 48, 4)  # major subsystem version
    struct.pack_into("<I", opt, 56, 0x2000)  # size of image
    struct.pack_into("<I", opt, 60, 0x200)  # size of headers
    struct.pack_into("<H", opt, 68, 3)  # console subsystem
    struct.pack_into("<I", opt, 92, 16)  # data directories
    section = b".text\0\0\0" + struct.pack("<IIIIIIHHI", 0x1000, 0x1000, 0x200, 0x200, 0, 0,
                                           0, 0, 0x60000020)
    head = dos + b"PE\0\0" + coff + bytes(opt) + section
    return head + bytes(0x200 - len(head)) + b"\xc3" + bytes(0x1ff)


def main():
    ap = argparse.ArgumentParser()
    for opt in ["build", "dll", "injector", "driver", "harness", "ucrt-harness", "gtest-harness",
                "crt-probe", "api-probe", "detours-inject", "hello", "import-probe",
                "import-probe-big"]:
        ap.add_argument("--" + opt, required=True)
    ap.add_argument("--only", default="", help="comma-separated cases (default: all)")
    ap.add_argument("--prefix", default="",
                    help="a WINEPREFIX to share with other runs (made if missing); default: a "
                         "fresh one of its own, removed at the end")
    a = ap.parse_args()
    if shutil.which("wine") is None:
        print("wine is not installed (scripts/setup.sh installs it)")
        return 1
    work = tempfile.mkdtemp(prefix="mnemosyne-wine-")
    prefix = os.path.abspath(a.prefix) if a.prefix else os.path.join(work, "prefix")
    try:
        wine = Wine(work, prefix)
        js = os.path.join(work, "work.js")
        with open(js, "w") as f:
            f.write(JSCRIPT)
        # The same script, then a second asleep: the driver's thread (200
        # allocations 2 to 4 ms apart) runs while the program is alive. The
        # script alone can end before that thread's first allocation on a
        # busy machine (seen: 1 run in 40 beside two busy loops, "proved
        # nothing").
        js_waits = os.path.join(work, "work-waits.js")
        with open(js_waits, "w") as f:
            f.write(JSCRIPT + "WScript.Sleep(1000);\n")
        cases = [
            ("unified", lambda: case_injected(wine, a, "inject-unified-imports", "unified",
                                              "managed", a.harness, "imports")),
            ("thread", lambda: case_injected(wine, a, "inject-unified-thread", "unified",
                                             "managed", a.harness, "thread")),
            ("pinned", lambda: case_injected(wine, a, "inject-pinned", "pinned", "host",
                                             a.harness)),
            ("device", lambda: case_injected(wine, a, "inject-device", "device", "managed",
                                             a.harness)),
            ("ucrt", lambda: case_injected(wine, a, "ucrt-unified", "unified", "managed",
                                           a.ucrt_harness, "auto", ["recalloc"])),
            ("crt-probe", lambda: case_crt_probe(wine, a)),
            ("api", lambda: case_api(wine, a)),
            ("gtest", lambda: case_gtest(wine, a)),
            ("timeout", lambda: case_timeout(wine, a)),
            ("cmd", lambda: case_real_program(
                wine, a, "cmd-nested",
                ["cmd.exe", "/c", "for /L %i in (1,1,300) do @echo %i & cmd /c echo nested"],
                min_pids=2)),
            ("cscript", lambda: case_real_program(
                wine, a, "cscript", ["cscript.exe", "//nologo", winpath(js)])),
            ("driver-thread", lambda: case_real_program(
                wine, a, "driver-thread", ["cscript.exe", "//nologo", winpath(js_waits)],
                # The thread's first block (128 MiB, over the 64 MiB first
                # arena) needs new memory a few ms after cuInit; drawn at
                # random, the first such block came after the program's end
                # about once in 40 runs under load.
                {"FAKECUDA_THREAD_ALLOC_MAX": str(256 << 20), "FAKECUDA_THREAD_ITERS": "200",
                 "FAKECUDA_THREAD_FIRST_ALLOC": str(128 << 20)})),
            # A driver whose fresh memory is not zero (FAKECUDA_DIRTY): the
            # harness checks calloc's and _recalloc's zeros among the rest.
            ("dirty-unified", lambda: case_injected(wine, a, "dirty-unified", "unified",
                                                    "managed", a.harness,
                                                    env_extra={"FAKECUDA_DIRTY": "1"})),
            ("dirty-pinned", lambda: case_injected(wine, a, "dirty-pinned", "pinned", "host",
                                                   a.ucrt_harness, "auto", ["recalloc"],
                                                   env_extra={"FAKECUDA_DIRTY": "1"})),
            ("dirty-cscript", lambda: case_real_program(
                wine, a, "dirty-cscript", ["cscript.exe", "//nologo", winpath(js)],
                {"FAKECUDA_DIRTY": "1"})),
            ("host", lambda: case_host(wine, a)),
            ("crash", lambda: case_init_crash(wine, a)),
            ("options", lambda: case_bad_options(wine, a)),
            ("disable", lambda: case_disable(wine, a)),
            ("programs", lambda: case_programs(wine, a)),
            ("stats", lambda: case_stats(wine, a)),
            ("errors", lambda: case_injector_errors(wine, a)),
            ("detours-unified", lambda: case_detours_programs(wine, a, "unified", "managed")),
            ("detours-pinned", lambda: case_detours_programs(wine, a, "pinned", "host")),
            ("detours-device", lambda: case_detours_programs(wine, a, "device", "managed")),
            ("detours-gtest", lambda: case_detours_gtest(wine, a)),
            ("detours-no-payload", lambda: case_detours_no_payload(wine, a)),
            ("restore-own", lambda: case_restore_own(wine, a)),
        ]
        known = [key for key, _ in cases]
        for key in a.only.split(",") if a.only else []:
            if key not in known:
                print(f"unknown case {key}; cases: {', '.join(known)}")
                return 2
        for key, fn in cases:
            if not a.only or key in a.only.split(","):
                fn()
    finally:
        if not a.prefix:  # a shared prefix's wineserver may serve other runs
            subprocess.run(["wineserver", "-k"], env={**os.environ, "WINEPREFIX": prefix},
                           capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    failed = [n for n, ok in results if not ok]
    print(f"# {len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
