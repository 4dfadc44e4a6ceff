#!/usr/bin/env python3
"""End-to-end tests: unmodified programs under libmnemosyne.so.

Each case runs a program without and with the interposer (and the test-double
driver), requires byte-identical results, and reads the double's log to check
where the heap landed. Usage: run_e2e.py CASE [BACKEND]. Paths come from the
environment that meson's test() sets (see meson.build).
"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# Absolute: programs run in folders of their own, where a relative
# LD_PRELOAD names nothing (ld.so ignores it, and they run without us).
LIB = os.path.abspath(os.environ["MNEMOSYNE_LIB"])
FAKE = os.path.abspath(os.environ["FAKECUDA_LIB"])


def readable_by_everyone(path):
    """Whether a user other than its owner can open `path`: the file is
    world-readable and every directory above it world-searchable."""
    path = os.path.abspath(path)
    if not os.stat(path).st_mode & 0o004:
        return False
    while path != os.path.dirname(path):
        path = os.path.dirname(path)
        if not os.stat(path).st_mode & 0o001:
            return False
    return True


# Some cases run programs as other users (the PostgreSQL server as postgres,
# setpriv's id as nobody), who must be able to load the preload library and
# the double. A checkout in a private directory (mktemp -d makes one 0700)
# gets copies of both, for this run, in a directory every user can read.
if not (readable_by_everyone(LIB) and readable_by_everyone(FAKE)):
    _shared = tempfile.mkdtemp(prefix="mnemosyne-e2e-libs-")
    os.chmod(_shared, 0o755)
    LIB, FAKE = (shutil.copy(p, _shared) for p in (LIB, FAKE))
    import atexit
    atexit.register(shutil.rmtree, _shared, ignore_errors=True)
# E2E_DIRTY=1: the double hands out memory that is not zero (FAKECUDA_DIRTY),
# as a driver that does not clear it would; every case must pass unchanged.
DIRTY = os.environ.get("E2E_DIRTY") == "1"
# E2E_PIN=arena (or granule, or vmm, the default): every run under the
# interposer with that MNEMOSYNE_PIN (a case's own setting wins).
PIN = os.environ.get("E2E_PIN", "")
# E2E_FORK_PULL_MS=100: every run under the interposer with that
# MNEMOSYNE_FORK_PULL_MS (a case's own setting wins): children pull their
# heap where userfaultfd serves this user (docs/fork.md).
FORK_PULL_MS = os.environ.get("E2E_FORK_PULL_MS", "")
PROBE = os.environ["ALLOC_PROBE"]
CHURN = os.environ["THREAD_CHURN"]
FORK_PROBE = os.environ["FORK_PROBE"]
FORK_RACE_PROBE = os.environ["FORK_RACE_PROBE"]
ERRNO_PROBE = os.environ["ERRNO_PROBE"]
PROMISE_PROBE = os.environ["PROMISE_PROBE"]
FAULT_PROBE = os.environ["FAULT_PROBE"]
STRESS_PROBE = os.environ["STRESS_PROBE"]
FORK_STDIO_PROBE = os.environ.get("FORK_STDIO_PROBE", "")
TOOLKIT_STUB = os.environ.get("CUDA_TOOLKIT_STUB", "")
DLOPEN_PROBE = os.environ["DLOPEN_PROBE"]
CTOR_LIB = os.environ["CTOR_LIB"]
LAUNCHER = os.environ.get("MNEMOSYNE_LAUNCHER", "")
SIZE_ROUTE_PROBE = os.environ.get("SIZE_ROUTE_PROBE", "")
PYTHON = "/usr/bin/python3"
TIMEOUT = 240
# E2E_REAL_DRIVER=1 (scripts/gpu-check.sh): FAKECUDA_LIB is a real
# libcuda.so.1. There is no driver log then: where the heap landed is read
# from each process's statistics file instead (check_heap), and the checks
# that only the double's log can answer are not made. Cases that need the
# log or the double's fault injection refuse to run (REAL_DRIVER_CASES).
REAL = os.environ.get("E2E_REAL_DRIVER") == "1"
# Pinned memory registered 1 MiB at a time, given back granule by granule;
# or, by default, host memory of the driver's virtual-memory API, 2 MiB at a
# time; or each pinned arena one cuMemHostAlloc, locked whole.
GRANULES = {"MNEMOSYNE_PIN": "granule"}
VMM = {"MNEMOSYNE_PIN": "vmm"}
ARENAS = {"MNEMOSYNE_PIN": "arena"}
REAL_DRIVER_CASES = {
    "probe", "python", "gcc", "git", "sort", "xz", "ls", "fork-python", "fork-python-threads",
    "fork-storm", "thread-churn", "dlopen", "fork-fopen", "fork-held-lock", "fork-patterns",
    "fork-from-thread", "fork-snapshot", "fork-free-space", "fork-pool-large", "fork-pull",
    "fork-own-handler", "fork-gdb", "bad-options", "exports", "own-context",
    "fork-cross-free", "fork-signal", "fork-signal-threads", "errno", "promises", "calloc", "signals",
    "calloc-big",
    "jvm-launch", "single-threaded-tools",
}
LAST_STATS_DIR = [None]  # the statistics folder of the latest run under the interposer

MANAGED = {"unified", "device", "hbm", "gddr"}


class Failure(Exception):
    pass


def expect(ok, message):
    if not ok:
        raise Failure(message)


class Run:
    """One program run, with or without the interposer."""

    def __init__(self, tmp, backend, preload, extra_env=None):
        self.log = os.path.join(tmp, "fake.log")
        env = dict(os.environ)
        for key in list(env):
            # meson sets MALLOC_PERTURB_: glibc would then fill every block it
            # frees, 32 MiB ones included (aligned blocks split off), which
            # is not what a user's program runs with.
            if key.startswith(("MNEMOSYNE_", "FAKECUDA_", "LD_PRELOAD", "MALLOC_PERTURB_")):
                del env[key]
        env["LC_ALL"] = "C"
        if preload:
            env["LD_PRELOAD"] = LIB
            env["MNEMOSYNE_BACKEND"] = backend
            env["MNEMOSYNE_CUDA_DRIVER"] = FAKE
            env["FAKECUDA_LOG"] = self.log
            if DIRTY:
                env["FAKECUDA_DIRTY"] = "1"
            if PIN:
                env["MNEMOSYNE_PIN"] = PIN
            if FORK_PULL_MS:
                env["MNEMOSYNE_FORK_PULL_MS"] = FORK_PULL_MS
            if REAL:
                stats = tempfile.mkdtemp(prefix="stats-", dir=tmp)
                env["MNEMOSYNE_STATS_FILE"] = os.path.join(stats, "%p.json")
                LAST_STATS_DIR[0] = stats
        env.update(extra_env or {})
        self.env = env

    def __call__(self, cmd, cwd=None, stdin=None):
        return subprocess.run(cmd, env=self.env, cwd=cwd, input=stdin, capture_output=True,
                               timeout=TIMEOUT)


def parse_log(path):
    events = []
    if not os.path.exists(path):
        return events
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) < 2:
                continue
            # A registration (cuMemHostRegister) page-locks memory of our
            # own for the driver, a mapping of the virtual-memory API
            # (cuMemMap) maps the driver's host memory: pinned memory, as an
            # allocation is.
            name = {"register": "alloc", "unregister": "free", "vmm-map": "alloc",
                    "vmm-unmap": "free"}.get(parts[1], parts[1])
            event = {"pid": int(parts[0]), "event": name, "registered": name != parts[1]}
            for kv in parts[2:]:
                if "=" in kv:
                    k, v = kv.split("=", 1)
                    event[k] = v
            events.append(event)
    return events


def driver_blocks(events):
    """(start, end, kind, pid) of every block the double handed out."""
    blocks = []
    for e in events:
        if e["event"] == "alloc" and e.get("rc") == "0":
            start = int(e["ptr"], 16)
            blocks.append((start, start + int(e["size"]), e["kind"], e["pid"]))
    return blocks


def freed_before(events, index, pid, ptr):
    """True when a block holding `ptr` was freed by process `pid` before
    events[index]."""
    for e in events[:index]:
        if e["pid"] == pid and e["event"] == "free" and "ptr" in e:
            start = int(e["ptr"], 16)
            if start <= ptr < start + int(e["size"]):
                return True
    return False


def check_heap(events, backend, device=0, injected=()):
    """The heap of every process under the interposer came from the backend.
    `injected`: calls a test made fail on purpose. One failure is by design
    (src/arena/fork/, copy_early): the fork copy's cuMemcpyDtoH of
    a dedicated block another thread freed after the copy listed it; it is
    allowed only when the double logged the address as unknown and that
    block's free came first."""
    if REAL:
        check_stats(backend)
        return
    fails = []
    unknown = []  # indices of dtoh-unknown lines not yet matched with their failure
    for i, e in enumerate(events):
        if e["event"] == "dtoh-unknown":
            unknown.append(i)
        if e["event"] != "fail" or e["call"] in injected:
            continue
        if e["call"] == "cuMemcpyDtoH_v2" and e.get("rc") == "1":
            mine = [j for j in unknown if events[j]["pid"] == e["pid"]]
            if mine and freed_before(events, mine[-1], e["pid"], int(events[mine[-1]]["ptr"], 16)):
                unknown.remove(mine[-1])
                continue
        fails.append(e)
    expect(not fails, f"driver calls failed: {fails[:3]}")
    allocs = [e for e in events if e["event"] == "alloc"]
    if backend == "host":
        expect(not events, f"the host backend must not even load the driver: {events[:3]}")
        return
    kind = "host" if backend == "pinned" else "managed"
    expect(allocs, f"no driver allocation was logged for backend {backend}")
    expect(all(e["kind"] == kind for e in allocs), f"{backend}: expected only {kind} blocks")
    if backend in ("device", "hbm", "gddr"):
        advice = [e for e in events if e["event"] == "advise"]
        expect(advice, "device backend: no cuMemAdvise was logged")
        expect(all(int(e["loc_id"]) == device for e in advice),
               f"device backend: advice must name device {device}: {advice[:3]}")


def stats_in(folder):
    """Every statistics file in `folder`, parsed."""
    docs = []
    for name in sorted(os.listdir(folder)) if folder else []:
        with open(os.path.join(folder, name)) as f:
            docs.append(json.load(f))
    return docs


def stats_docs():
    """The statistics file of every process of the latest run under the
    interposer (real-driver mode), parsed."""
    folder = LAST_STATS_DIR[0]
    docs = stats_in(folder)
    expect(docs, f"no process wrote its statistics into {folder}")
    return docs


def check_stats(backend):
    """A real driver: every process that wrote statistics ran its heap on
    the backend, without a fallback to host memory."""
    for doc in stats_docs():
        # A forked child grows with host memory: its heap is its parent's copy.
        expect(doc["active_backend"] == backend or doc.get("forked_child"),
               f"{doc['program']} (pid {doc['pid']}) ran on {doc['active_backend']}, not {backend}")
        pool = doc["pools"].get(backend, {})
        expect(pool.get("allocations", 0) > 0 or doc["pools"]["system"]["allocations"] == 0,
               f"{doc['program']}: no allocation came from {backend}: {doc['pools']}")
        expect(pool.get("driver_failures", 0) == 0,
               f"{doc['program']}: driver calls failed: {pool}")


def compare(base, mine, what, stdout_only=False):
    # Both runs' output: when the run without the interposer is the one that
    # failed (a program's own race), its output says why.
    expect(base.returncode == mine.returncode,
           f"{what}: exit status {mine.returncode} under the interposer, {base.returncode} without"
           f"\n--- with: stdout {mine.stdout[-800:]!r}"
           f"\nstderr: {mine.stderr.decode(errors='replace')[-2000:]}"
           f"\n--- without: stdout {base.stdout[-800:]!r}"
           f"\nstderr: {base.stderr.decode(errors='replace')[-2000:]}")
    expect(base.stdout == mine.stdout, f"{what}: stdout differs under the interposer\n"
           f"--- without\n{base.stdout[-1500:]!r}\n--- with\n{mine.stdout[-1500:]!r}")
    if not stdout_only:
        # Python 3.12's fork warning names the process ("(pid=1234)"), which
        # differs between any two runs.
        def same(text):
            return re.sub(rb"\(pid=\d+\)", b"(pid=N)", text)
        expect(same(base.stderr) == same(mine.stderr), f"{what}: stderr differs under the interposer\n"
               f"--- without\n{base.stderr[-1500:]!r}\n--- with\n{mine.stderr[-1500:]!r}")


def twice(tmp, backend, cmd, what, extra_env=None, cwd_factory=None, stdin=None, stdout_only=False):
    """Runs cmd without and with the interposer; returns the second run's events."""
    base_cwd = cwd_factory("base") if cwd_factory else None
    mine_cwd = cwd_factory("mine") if cwd_factory else None
    base = Run(tmp, backend, False, extra_env)(cmd, cwd=base_cwd, stdin=stdin)
    run = Run(tmp, backend, True, extra_env)
    mine = run(cmd, cwd=mine_cwd, stdin=stdin)
    compare(base, mine, what, stdout_only)
    return parse_log(run.log), base, mine


# ---------------------------------------------------------------- the cases

def case_probe(tmp, backend):
    pointers = os.path.join(tmp, "pointers.txt")
    # The double has two devices; a real machine may have one.
    device = 1 if backend in ("device", "hbm", "gddr") and not REAL else 0
    extra = {"MNEMOSYNE_DEVICE": str(device)}
    base = Run(tmp, backend, False, extra)([PROBE])
    run = Run(tmp, backend, True, dict(extra, PROBE_POINTERS=pointers))
    mine = run([PROBE])
    compare(base, mine, "alloc_probe")
    events = parse_log(run.log)
    check_heap(events, backend, device)
    with open(pointers) as f:
        ptrs = [int(line, 16) for line in f if line.strip()]
    expect(len(ptrs) > 20, f"too few pointers recorded: {len(ptrs)}")
    if REAL:
        return  # which blocks the driver handed out is in the double's log only
    blocks = driver_blocks(events)
    if backend == "host":
        expect(not blocks, "host backend: driver memory was allocated")
        return
    outside = [hex(p) for p in ptrs if not any(s <= p < e for s, e, _, _ in blocks)]
    expect(not outside, f"pointers outside driver memory: {outside[:5]} of {len(ptrs)}")


PY_WORKLOAD = r"""
import json, os, sqlite3, subprocess, sys, threading
data = {"k%d" % i: [str(j) * (j % 7) for j in range(i % 40)] for i in range(3000)}
text = json.dumps(data, sort_keys=True)
assert json.loads(text) == data
db = sqlite3.connect(":memory:")
db.execute("create table t (a integer, b text)")
db.executemany("insert into t values (?, ?)", [(i, "x" * (i % 300)) for i in range(30000)])
db.execute("create index ti on t(b)")
print(db.execute("select count(*), sum(length(b)) from t where a % 3 = 0").fetchone())
results = []
lock = threading.Lock()
def work(n):
    r = sum(len(str(x) * 3) for x in range(n))
    with lock:
        results.append(r)
threads = [threading.Thread(target=work, args=(40000 + i,)) for i in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(sorted(results))
out = subprocess.run([sys.executable, "-c", "print(sum(range(10**5)))"],
                     capture_output=True, text=True).stdout
print(out.strip(), len(text))
where = os.environ.get("E2E_WHERE")
if where:
    import ctypes
    lib = ctypes.CDLL(None)
    lib.mnemosyne_backend_of.restype = ctypes.c_char_p
    lib.mnemosyne_backend_of.argtypes = [ctypes.c_void_p]
    big = bytes(1 << 20)
    with open(where, "w") as f:
        f.write(lib.mnemosyne_backend_of(id(big)).decode() + "\n")
        f.write(lib.mnemosyne_backend_of(id(text)).decode() + "\n")
"""


def case_python(tmp, backend):
    where = os.path.join(tmp, "where.txt")
    base = Run(tmp, backend, False)([PYTHON, "-c", PY_WORKLOAD])
    run = Run(tmp, backend, True, {"E2E_WHERE": where})
    mine = run([PYTHON, "-c", PY_WORKLOAD])
    compare(base, mine, "python3")
    check_heap(parse_log(run.log), backend, 0)
    with open(where) as f:
        places = f.read().split()
    expect(places == [backend, backend], f"python objects live in {places}, expected {backend}")


C_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
struct node { struct node* next; char name[32]; };
static int cmp(const void* a, const void* b) { return strcmp(*(char* const*)a, *(char* const*)b); }
int main(int argc, char** argv) {
  struct node* head = NULL;
  for (int i = 0; i < 1000; ++i) {
    struct node* n = malloc(sizeof *n);
    snprintf(n->name, sizeof n->name, "node-%d-%d", i * 7919 % 1000, argc);
    n->next = head; head = n;
  }
  char* names[1000]; int k = 0;
  for (struct node* n = head; n; n = n->next) names[k++] = n->name;
  qsort(names, k, sizeof names[0], cmp);
  printf("%s %s\n", names[0], names[k - 1]);
  (void)argv;
  return 0;
}
"""


def case_gcc(tmp, backend):
    src = os.path.join(tmp, "prog.c")
    with open(src, "w") as f:
        f.write(C_SOURCE)
    outs = {}
    for label in ("base", "mine"):
        outs[label] = os.path.join(tmp, f"prog-{label}.o")
    base = Run(tmp, backend, False)(["gcc", "-O2", "-Wall", "-c", src, "-o", outs["base"]])
    run = Run(tmp, backend, True)
    mine = run(["gcc", "-O2", "-Wall", "-c", src, "-o", outs["mine"]])
    compare(base, mine, "gcc")
    with open(outs["base"], "rb") as a, open(outs["mine"], "rb") as b:
        expect(a.read() == b.read(), "gcc produced a different object file under the interposer")
    check_heap(parse_log(run.log), backend, 0)


def case_git(tmp, backend):
    env = {"GIT_AUTHOR_NAME": "A", "GIT_AUTHOR_EMAIL": "a@example.invalid",
           "GIT_COMMITTER_NAME": "A", "GIT_COMMITTER_EMAIL": "a@example.invalid",
           "GIT_AUTHOR_DATE": "2020-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2020-01-01T00:00:00Z",
           "GIT_CONFIG_NOSYSTEM": "1", "HOME": tmp}
    results = {}
    log_events = []
    for label, preload in (("base", False), ("mine", True)):
        repo = os.path.join(tmp, f"repo-{label}")
        os.makedirs(repo)
        for i in range(50):
            with open(os.path.join(repo, f"f{i}.txt"), "w") as f:
                f.write(f"file {i}\n" * (i * 20 + 1))
        run = Run(tmp, backend, preload, env)
        outs = []
        for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "."],
                    ["git", "commit", "-q", "-m", "first"], ["git", "log", "--format=%H %s"],
                    ["git", "gc", "-q"], ["git", "fsck"]):
            r = run(cmd, cwd=repo)
            outs.append((r.returncode, r.stdout))
            expect(r.returncode == 0, f"{' '.join(cmd)} failed ({label}): {r.stderr[-500:]!r}")
        results[label] = outs
        if preload:
            log_events = parse_log(run.log)
    expect(results["base"] == results["mine"], "git results differ under the interposer")
    check_heap(log_events, backend, 0)


def case_sort(tmp, backend):
    data = "".join(f"{(i * 2654435761) % 1000003:07d} line {i}\n" for i in range(200000)).encode()
    events, _, _ = twice(tmp, backend, ["sort", "--parallel=2", "-S", "8M"], "sort", stdin=data)
    check_heap(events, backend, 0)


def case_xz(tmp, backend):
    data = b"".join(b"%d:%s\n" % (i, b"abcdefgh" * (i % 17)) for i in range(300000))
    events, base, mine = twice(tmp, backend, ["xz", "-T2", "-3", "-c"], "xz -T2", stdin=data)
    check_heap(events, backend, 0)
    back = subprocess.run(["xz", "-dc"], input=mine.stdout, capture_output=True, timeout=TIMEOUT)
    expect(back.stdout == data, "xz round trip failed")


PY_FORK = r"""
import multiprocessing as mp
big = [str(i) * (i % 13) for i in range(200000)]
def f(i):
    local = [bytes(i % 5000) for _ in range(50)]
    return len(big[i]) + sum(len(x) for x in local)
if __name__ == "__main__":
    ctx = mp.get_context("fork")
    with ctx.Pool(4) as pool:
        print(sum(pool.map(f, range(0, 200000, 97))))
    q = ctx.Queue()
    ps = [ctx.Process(target=lambda q, k: q.put((k, len(big[k]))), args=(q, k)) for k in range(6)]
    for p in ps: p.start()
    got = sorted(q.get() for _ in ps)
    for p in ps: p.join()
    print(got, [p.exitcode for p in ps])
"""


def case_fork_python(tmp, backend):
    events, _, _ = twice(tmp, backend, [PYTHON, "-c", PY_FORK], "python multiprocessing (fork)")
    check_heap(events, backend, 0)
    parent_pids = {e["pid"] for e in events if e["event"] == "init"}
    child_calls = [e for e in events if e["pid"] not in parent_pids and e["event"] != "fork-child"]
    expect(not child_calls, f"the driver was called in a forked child: {child_calls[:3]}")


PY_POOL_LARGE = r"""
import hashlib, multiprocessing as mp
# 320 MiB the workers read: 8 MiB and 64 KiB buffers, and smaller ones.
bufs = [bytes([i % 251]) * (8 << 20) for i in range(30)]
mids = [bytes([(i * 7) % 256]) * (64 << 10) + i.to_bytes(4, "little") for i in range(1200)]
small = [("k%07d-" % i + "x" * (600 + i % 300)).encode() for i in range(20000)]
def digest(k):
    h = hashlib.sha256()
    for part in (bufs[k::3], mids[k::3], small[k::3]):
        for b in part:
            h.update(b)
    return h.hexdigest()
if __name__ == "__main__":
    ctx = mp.get_context("fork")
    results = []
    for round in range(2):
        expected = [digest(k) for k in range(3)]
        with ctx.Pool(3) as pool:
            results.append(pool.map(digest, range(3)) == expected)
        for i in range(round, len(bufs), 3):  # a third changes before the next pool
            bufs[i] = bytes([(i + 7 + round) % 251]) * (8 << 20)
    print("workers read their fork's heap:", results, expected[0][:16])
"""


def case_fork_pool_large(tmp, backend):
    """A Python parent with 320 MiB of heap forks a pool of three workers,
    twice, a third of the heap changed in between: each worker's digest of
    its share matches the parent's. A heap that large is copied by the
    forking thread and mnemosyne's fork helpers together (one less than the
    CPUs, at most 7): the parent's statistics say how many took part."""
    stats = tempfile.mkdtemp(prefix="stats-", dir=tmp)
    extra = {"MNEMOSYNE_STATS_FILE": os.path.join(stats, "%p.json")}
    events, _, mine = twice(tmp, backend, [PYTHON, "-c", PY_POOL_LARGE], "a pool over 320 MiB",
                            extra_env=extra)
    check_heap(events, backend, 0)
    expect(b"[True, True]" in mine.stdout, f"a worker read a wrong heap: {mine.stdout!r}")
    parents = [d for d in stats_in(stats) if not d["forked_child"]]
    expect(len(parents) == 1, f"one parent's statistics expected: {len(parents)}")
    want = min(len(os.sched_getaffinity(0)), 8)
    expect(parents[0]["fork_copy_workers"] == want,
           f"the copies ran on {parents[0]['fork_copy_workers']} threads, not {want}")


PY_FORK_STORM = r"""
import os
keep = [bytearray(i % 4096) for i in range(20000)]
ok = 0
for round in range(300):
    pid = os.fork()
    if pid == 0:
        blocks = [bytearray(1000 + i) for i in range(200)]
        total = sum(len(b) for b in blocks) + len(keep[round])
        os._exit(0 if total > 0 else 3)
    _, status = os.waitpid(pid, 0)
    ok += os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
print("children ok:", ok)
"""


def case_fork_storm(tmp, backend):
    events, _, _ = twice(tmp, backend, [PYTHON, "-c", PY_FORK_STORM], "fork storm")
    check_heap(events, backend, 0)


def case_thread_churn(tmp, backend):
    events, _, _ = twice(tmp, backend, [CHURN, "4000"], "thread churn")
    check_heap(events, backend, 0)
    total = sum(int(e["size"]) for e in events if e["event"] == "alloc")
    if REAL:
        total = sum(doc["pools"][backend]["bytes_reserved"] for doc in stats_docs())
    # 4000 threads, 32 alive at a time. mimalloc 2.0.9 gives each live
    # thread its own 32 MiB segment, so with every thread of a wave running
    # at once (many cores) the heap needs 33 segments, and arenas double
    # as they grow, reserving up to twice what is needed: 2 x 33 x 32 MiB.
    # A segment leaked per thread would need 4000 of them.
    bound = 2 * (32 + 1) * (32 << 20)
    expect(total <= bound, f"thread churn took {total >> 20} MiB of driver memory "
           f"(bound {bound >> 20} MiB)")


def case_dlopen(tmp, backend):
    events, _, mine = twice(tmp, backend, [DLOPEN_PROBE, CTOR_LIB], "dlopen")
    expect(b"allocated in a constructor" in mine.stdout, "constructor allocation lost")
    check_heap(events, backend, 0)


def check_children_quiet(events):
    """No forked child called the driver (only the double's atfork handler ran)."""
    parents = {e["pid"] for e in events if e["event"] == "init"}
    calls = [e for e in events if e["pid"] not in parents and e["event"] != "fork-child"]
    expect(not calls, f"the driver was called in a forked child: {calls[:3]}")


def fork_case(tmp, backend, mode, extra=None, injected=()):
    events, base, mine = twice(tmp, backend, [FORK_PROBE, mode], f"fork_probe {mode}",
                               extra_env=extra)
    check_heap(events, backend, 0, injected)
    check_children_quiet(events)
    return base, mine


def case_fork_fopen(tmp, backend):
    """fopen, one sleeping thread, fork: glibc resets the FILE's lock in the
    child before any atfork handler runs."""
    fork_case(tmp, backend, "fopen-thread")


def case_fork_held_lock(tmp, backend):
    """A thread holds a FILE's lock across fork(): glibc's child resets every
    FILE lock (in the heap) before any atfork handler, so a child sharing its
    parent's heap pages would free the parent's lock. The double maps pinned
    memory as the nvidia module does (FAKECUDA_PINNED_SHARED: a shared
    mapping a child inherits); mnemosyne marks it MADV_DONTFORK. So are the
    mappings of the virtual-memory API (MNEMOSYNE_PIN=vmm), always."""
    shared = {"FAKECUDA_PINNED_SHARED": "1"}
    fork_case(tmp, backend, "held-lock", dict(shared, **ARENAS) if backend == "pinned" else shared)
    if backend == "pinned":
        fork_case(tmp, backend, "held-lock", VMM)


def case_fork_patterns(tmp, backend):
    fork_case(tmp, backend, "patterns")


def case_fork_from_thread(tmp, backend):
    fork_case(tmp, backend, "from-thread")


def case_fork_driver_busy(tmp, backend):
    fork_case(tmp, backend, "driver-busy", {"MNEMOSYNE_ARENA_SIZE": "32MiB"})


def case_fork_own_handler(tmp, backend):
    fork_case(tmp, backend, "own-handler")


def case_fork_device(tmp, backend):
    """Pages whose data the double holds on the device reach the child: read
    through the driver by fork(), without migrating them; read by the CPU
    (migrating them) when glibc's fork is called directly or the driver's
    copy fails."""
    report = os.path.join(tmp, "report.txt")
    fork_case(tmp, backend, "device", {"FORK_PROBE_FAKE": FAKE, "FORK_REPORT": report},
              injected=("cuMemcpyDtoH_v2",))
    with open(report) as f:
        facts = {k: int(v) for k, v in (line.split() for line in f if line.strip())}
    if backend not in MANAGED:
        return
    expect(facts["moved"] > 100, f"too few pages moved to the device: {facts}")
    expect(facts["wrapper_migrations"] == 0,
           f"fork() migrated device pages instead of copying them through the driver: {facts}")
    expect(facts["wrapper_dtoh_bytes"] >= facts["moved"] * 4096,
           f"fork() did not read the device pages through the driver: {facts}")
    expect(facts["still_on_device"] == 1, f"the data left the device: {facts}")
    expect(facts["direct_migrations"] > 0 and facts["failing_copy_migrations"] > 0,
           f"without the driver's copy, the CPU must read (and migrate) the pages: {facts}")


def case_fork_snapshot(tmp, backend):
    """Forks in a row (children of the shared image and its deltas), the
    parent overwriting every block right after each fork, the first large
    one by a driver copy (cuMemcpyDtoH into the heap block): every child,
    a grandchild, and a grandchild whose parent exited at once after forking
    it read the values of the moment of their own fork (docs/fork.md)."""
    report = os.path.join(tmp, "report.txt")
    env = {"FORK_PROBE_FAKE": FAKE, "FORK_REPORT": report}
    if backend == "pinned":
        env["FORK_PROBE_SOURCE"] = "pinned"  # the copy's source of the heap's own kind
    fork_case(tmp, backend, "snapshot", env)
    with open(report) as f:
        facts = {k: int(v) for k, v in (line.split() for line in f if line.strip())}
    if backend != "host":
        expect(facts["driver_copies"] == 4, f"the parent's driver copies did not all land: {facts}")


def case_fork_free_space(tmp, backend):
    """A child writes into the free space of the heap it got (blocks its
    parent freed): the heap image its siblings share does not grow by what
    it writes (docs/fork.md: free space is fresh memory in the child), and
    the parent's blocks read right."""
    fork_case(tmp, backend, "free-space")


def normalized(text):
    """gdb's output with what varies from run to run made equal: process and
    thread ids, and the padding of the columns whose width follows them
    (`info threads` pads "Target Id" to its longest entry, so a 3-digit LWP
    and a 5-digit one align the rest of the table differently)."""
    text = re.sub(rb"(process|LWP|Thread) (0x[0-9a-f]+ \(LWP )?\d+", rb"\1 N", text)
    return re.sub(rb"[ \t]+", b" ", text)


GDB_TARGET = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int depth(int n) { return n == 0 ? 0 : 1 + depth(n - 1); }
int main(void) {
  char* s = malloc(64);
  strcpy(s, "inferior ran");
  printf("%s %d\n", s, depth(5));
  free(s);
  return 0;
}
"""


def case_fork_gdb(tmp, backend):
    """gdb (multi-threaded: its worker threads) forks the inferior and a probe
    child of its own, and keeps its alternate signal stack in the heap."""
    if shutil.which("gdb") is None:  # scripts/setup.sh installs it; a GPU image may lack it
        print(f"SKIP fork-gdb [{backend}]: gdb is not installed")
        sys.exit(77)
    src = os.path.join(tmp, "target.c")
    exe = os.path.join(tmp, "target")
    with open(src, "w") as f:
        f.write(GDB_TARGET)
    subprocess.run(["gcc", "-g", "-O0", src, "-o", exe], check=True)
    # gdb is interposed, the program it debugs is not (its libraries would
    # change what gdb prints about it).
    cmd = ["gdb", "-nx", "-batch", "-ex", "unset environment LD_PRELOAD", "-ex",
           "break depth if n == 2", "-ex", "run", "-ex", "bt", "-ex", "info threads", "-ex",
           "continue", exe]
    base = Run(tmp, backend, False)(cmd)
    run = Run(tmp, backend, True)
    mine = run(cmd)
    expect(b"inferior ran 5" in base.stdout, f"gdb did not run the inferior: {base.stdout!r}")
    expect(base.returncode == mine.returncode, f"gdb exit {mine.returncode} vs {base.returncode}:"
           f" {mine.stderr[-800:]!r}")
    expect(normalized(base.stdout) == normalized(mine.stdout),
           f"gdb output differs\n--- without\n{base.stdout.decode()}\n--- with\n{mine.stdout.decode()}")
    expect(normalized(base.stderr) == normalized(mine.stderr),
           f"gdb stderr differs: {base.stderr!r} vs {mine.stderr!r}")
    events = parse_log(run.log)
    check_heap(events, backend, 0)


MPI_PROGRAM = r"""
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int n = 1 << 16;
  double* v = malloc(n * sizeof *v);
  for (int i = 0; i < n; ++i) v[i] = rank + i * 1e-3;
  double local = 0, total = 0;
  for (int i = 0; i < n; ++i) local += v[i];
  MPI_Allreduce(&local, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("ranks %d total %.3f\n", size, total);
  free(v);
  MPI_Finalize();
  return 0;
}
"""


def case_fork_mpirun(tmp, backend):
    """OpenMPI's mpirun is multi-threaded and forks (then execs) its ranks."""
    src = os.path.join(tmp, "ring.c")
    exe = os.path.join(tmp, "ring")
    with open(src, "w") as f:
        f.write(MPI_PROGRAM)
    subprocess.run(["mpicc", "-O2", src, "-o", exe], check=True)
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "3", exe]
    # Each case's own session directory: mpiruns of cases running at once
    # raced to create the shared /tmp/ompi.<host>.<uid> ("File exists").
    events, base, _ = twice(tmp, backend, cmd, "mpirun", stdout_only=True,
                            extra_env={"OMPI_MCA_orte_tmpdir_base": tmp})
    expect(base.stdout.startswith(b"ranks 3 total"), f"mpirun without mnemosyne: {base.stdout!r}")
    check_heap(events, backend, 0)
    if backend != "host":
        ranks = {e["pid"] for e in events if e["event"] == "alloc"}
        expect(len(ranks) >= 4, f"mpirun and its 3 ranks should each allocate driver memory: {ranks}")


PY_FORK_THREADS = r"""
import concurrent.futures, multiprocessing as mp, os, threading, time, hashlib
data = {i: hashlib.sha256(str(i).encode()).hexdigest() * 8 for i in range(20000)}
stop = threading.Event()
def churn(k):
    local = []
    while not stop.is_set():
        local.append(bytearray(1000 + k) * 3)
        if len(local) > 200:
            local.clear()
    return k
def work(i):
    return sum(len(data[j]) for j in range(i, i + 500))
if __name__ == "__main__":
    pool = concurrent.futures.ThreadPoolExecutor(4)
    churners = [pool.submit(churn, k) for k in range(4)]
    time.sleep(0.05)
    ctx = mp.get_context("fork")
    with ctx.Pool(3) as procs:
        print(sum(procs.map(work, range(0, 19000, 250))))
    results = []
    def forker():
        for k in range(20):
            pid = os.fork()
            if pid == 0:
                os._exit(0 if work(k * 100) == 500 * 512 else 7)
            results.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    t = threading.Thread(target=forker)
    t.start(); t.join()
    stop.set()
    print(sorted(f.result() for f in churners), results.count(0))
"""


def case_fork_python_threads(tmp, backend):
    """python3's multiprocessing (fork) and os.fork from a thread, while a
    thread pool churns the heap: children of a multi-threaded parent that
    never exec."""
    events, _, _ = twice(tmp, backend, [PYTHON, "-c", PY_FORK_THREADS], "python fork + threads")
    check_heap(events, backend, 0)
    check_children_quiet(events)


# A CUDA sample's ending: cudaDeviceReset at the end of main (here python3
# resets the primary context through ctypes), then the interpreter's exit
# frees its objects.
PY_RESET_AT_END = PY_WORKLOAD + r"""
import ctypes
cu = ctypes.CDLL(os.environ["E2E_DRIVER"])
cu.cuInit(0)
print("reset", cu.cuDevicePrimaryCtxReset_v2(0))
"""


def fork_race_case(tmp, backend, mode):
    events, _, _ = twice(tmp, backend, [FORK_RACE_PROBE, mode], f"fork_race_probe {mode}")
    check_heap(events, backend, 0)
    check_children_quiet(events)


def case_fork_cross_free(tmp, backend):
    """Other threads free the main thread's blocks while it forks: every
    child allocates 100,000 blocks of its own from the heap it was given."""
    fork_race_case(tmp, backend, "cross-free")


def case_fork_signal(tmp, backend):
    """fork() from a SIGUSR1 handler while the program mallocs, frees and
    forks itself (glibc's tst-mallocfork2 shape); children check the heap."""
    fork_race_case(tmp, backend, "signal-fork")


def case_fork_signal_threads(tmp, backend):
    """_Fork() from a handler while sender threads signal the main thread,
    and a second thread forking at the same time (tst-mallocfork3's shape)."""
    fork_race_case(tmp, backend, "signal-threads")


def session_processes(sid):
    """The pids of the processes still in session `sid`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[3]) == sid:  # after the name: state, ppid, pgrp, session
            pids.append(int(entry))
    return pids


def stacks_of(pids):
    """Every thread's stack of each process (gdb), as text."""
    if shutil.which("gdb") is None:
        return "(gdb is not installed: no stacks)"
    out = []
    for pid in pids[:8]:
        try:
            r = subprocess.run(["gdb", "-nx", "-batch", "-p", str(pid), "-ex",
                                "thread apply all bt 30"], capture_output=True, timeout=60)
            lines = [l for l in r.stdout.decode(errors="replace").splitlines()
                     if l.startswith(("#", "Thread "))]
            out.append(f"--- process {pid}:\n" + "\n".join(lines))
        except subprocess.TimeoutExpired:
            out.append(f"--- process {pid}: gdb timed out")
    if len(pids) > 8:
        out.append(f"({len(pids) - 8} more processes not shown)")
    return "\n".join(out)


def run_in_session(cmd, env, limit):
    """Runs `cmd` in a session of its own. Returns (returncode, stdout,
    stderr, seconds); a run past `limit` seconds fails with every
    process's stack, and so does one that leaves a process behind (every
    child must have ended when the program does). Whatever is left is
    killed."""
    start = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        stacks = stacks_of([p.pid] + [q for q in session_processes(p.pid) if q != p.pid])
        for q in session_processes(p.pid):
            try:
                os.kill(q, signal.SIGKILL)
            except OSError:
                pass
        p.communicate()
        raise Failure(f"{' '.join(cmd)} hung (more than {limit} s):\n{stacks}")
    seconds = time.monotonic() - start
    left = session_processes(p.pid)
    for _ in range(20):  # a child killed with its parent may take a moment to go
        if not left:
            break
        time.sleep(0.05)
        left = session_processes(p.pid)
    if left:
        stacks = stacks_of(left)
        for q in left:
            try:
                os.kill(q, signal.SIGKILL)
            except OSError:
                pass
        raise Failure(f"{len(left)} processes outlived {' '.join(cmd)}:\n{stacks}")
    return p.returncode, out, err, seconds


def fork_stdio_case(tmp, backend, mode):
    """Runs fork_stdio_probe MODE (E2E_FORK_STDIO_SECONDS each, 1 by
    default) once without the interposer and E2E_FORK_STDIO_RUNS times (20)
    with it, the double's internal thread on: no run may hang, fail, or
    leave a process behind."""
    seconds = os.environ.get("E2E_FORK_STDIO_SECONDS", "1")
    runs = int(os.environ.get("E2E_FORK_STDIO_RUNS", "20"))
    limit = 30 + 10 * float(seconds)
    work = os.path.join(tmp, "files")
    os.makedirs(work)
    cmd = [FORK_STDIO_PROBE, mode, seconds, work] + ([CTOR_LIB] if mode == "stdio" else [])
    rc, out, err, plain = run_in_session(cmd, Run(tmp, backend, False).env, limit)
    expect(rc == 0, f"without the interposer: exit {rc}: {out!r} {err!r}")
    glibc_forks = re.search(rb"(\d+) forks", out).group(1).decode()
    slowest = 0.0
    forks = 0
    for i in range(runs):
        run = Run(tmp, backend, True)
        rc, out, err, took = run_in_session(cmd, run.env, limit)
        expect(rc == 0, f"run {i + 1} of {runs}: exit {rc}: {out.decode()!r} {err.decode()!r}")
        m = re.search(rb"(\d+) forks, 0 bad children, 0 bad rounds", out)
        expect(m is not None, f"run {i + 1}: {out!r}")
        forks += int(m.group(1))
        slowest = max(slowest, took)
        if i == 0:
            events = parse_log(run.log)
            check_heap(events, backend, 0)
            check_children_quiet(events)
        if os.path.exists(run.log):
            os.unlink(run.log)
    pin = f", PIN={PIN}" if PIN else ""
    print(f"fork_stdio_probe {mode} [{backend}{pin}]: {runs} runs of {seconds} s, {forks} forks "
          f"(glibc: {glibc_forks} in one run); slowest run {slowest:.2f} s, glibc's {plain:.2f} s")


def case_fork_stdio(tmp, backend):
    """Threads fork (children that _exit at once, children that use stdio)
    beside threads writing and reading back files with fflush(NULL), and
    threads in dlopen/dlclose, getpwnam, syslog and newlocale (issue 45:
    children spun in glibc's fork on a torn stdio list)."""
    fork_stdio_case(tmp, backend, "stdio")


def case_fork_deadlock(tmp, backend):
    """glibc's tst-malloc-fork-deadlock shape: 4 threads fork while 8 read
    files with getline and rewind and one calls fflush(NULL) (issue 45: the
    parent deadlocked)."""
    fork_stdio_case(tmp, backend, "deadlock")


FORK_PULL_PROBE = os.environ["FORK_PULL_PROBE"]
PULL_HEAP = 256 << 20  # fork_pull_probe's 256 blocks of 1 MiB


def pull_allowed():
    """Whether userfaultfd serves this user's kernel-mode faults too
    (platform/page_pull.hpp): root, the sysctl, or /dev/userfaultfd."""
    if os.geteuid() == 0:
        return True
    try:
        with open("/proc/sys/vm/unprivileged_userfaultfd") as f:
            if f.read().strip() == "1":
                return True
    except OSError:
        pass
    return os.access("/dev/userfaultfd", os.R_OK | os.W_OK)


def pull_run(tmp, backend, mode, prefix=()):
    """fork_pull_probe MODE with and without the interposer, children pulling
    (MNEMOSYNE_FORK_PULL_MS=100); the parent's statistics."""
    # Outside tmp (0700): a run as nobody writes there too.
    stats = tempfile.mkdtemp(prefix=f"mnemosyne-e2e-pull-{mode}-")
    os.chmod(stats, 0o777)
    extra = {"MNEMOSYNE_FORK_PULL_MS": "100",
             "MNEMOSYNE_STATS_FILE": os.path.join(stats, "%p.json")}
    events, _, _ = twice(tmp, backend, [*prefix, FORK_PULL_PROBE, mode], f"fork_pull_probe {mode}",
                         extra_env=extra)
    check_children_quiet(events)
    docs = []
    for name in os.listdir(stats):
        with open(os.path.join(stats, name)) as f:
            doc = json.load(f)
        if doc["program"].startswith("fork_pull_probe") and not doc["forked_child"]:
            docs.append(doc)
    shutil.rmtree(stats, ignore_errors=True)
    expect(len(docs) == 1, f"{mode}: {len(docs)} statistics of the probe's parent")
    return docs[0]


def case_fork_pull(tmp, backend):
    """Children that exec (argv in the heap), write() heap buffers, read 1% of
    the heap, wait until the parent has moved on, fork themselves, close every
    descriptor, or are forked from a signal handler (issue 47): each reads its
    fork's heap; where this user may pull, one that execs or exits copies at
    most 1 MiB, one that reads 1% at most 2% of the heap and 1 MiB."""
    pulls = pull_allowed()
    budgets = {"exec": 4 * (1 << 20), "read1": 4 * (PULL_HEAP // 50 + (1 << 20))}
    for mode in ("exec", "write", "read1", "late", "nested", "closefds", "signal"):
        doc = pull_run(tmp, backend, mode)
        copied = doc["fork_bytes_copied"]
        if backend == "host":
            expect(copied == 0, f"{mode}: host heap copied {copied} bytes")
        elif mode in budgets and pulls:
            expect(copied <= budgets[mode],
                   f"{mode}: children copied {copied >> 10} KiB (at most {budgets[mode] >> 10})")
        elif mode in budgets:
            print(f"{mode}: this user may not pull (userfaultfd): {copied >> 20} MiB copied")


def case_fork_pull_unprivileged(tmp, backend):
    """A user whom userfaultfd does not serve (nobody, on a system that
    keeps it for the privileged) gets the copy, whole, and the same output."""
    if os.geteuid() != 0:
        print("not root: cannot run as nobody; case_fork_pull covers this user")
        return
    setpriv = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    nobody_pulls = open("/proc/sys/vm/unprivileged_userfaultfd").read().strip() == "1"
    doc = pull_run(tmp, backend, "exec", setpriv)
    copied = doc["fork_bytes_copied"]
    if nobody_pulls:
        expect(copied <= 4 << 20, f"nobody may pull here, yet {copied >> 20} MiB copied")
    else:
        expect(copied >= PULL_HEAP, f"nobody cannot pull, yet only {copied >> 20} MiB copied")


def case_errno(tmp, backend):
    """errno survives successful mallocs that grow the heap, a thread's first
    allocation, dedicated segments, realloc, new/delete and fork."""
    events, _, mine = twice(tmp, backend, [ERRNO_PROBE], "errno_probe")
    expect(mine.stdout.endswith(b"errno: 0 calls changed it\n"), f"errno: {mine.stdout!r}")
    check_heap(events, backend, 0)


def case_calloc(tmp, backend):
    """calloc's blocks read zero, on fresh memory and on memory reused after
    the program dirtied it (with E2E_DIRTY: fresh driver memory is not zero)."""
    _, _, mine = twice(tmp, backend, [PROMISE_PROBE, "calloc"], "promise_probe calloc")
    expect(mine.returncode == 0, f"calloc: {mine.stdout!r}")


def case_calloc_big(tmp, backend):
    """calloc(1, 3 GiB) reads zero and costs no CPU pass: the peak RSS stays
    under 256 MiB, as with glibc, because fresh memory known zero is not
    cleared and managed memory not known zero is cleared by the device (the
    double's device memset leaves no page in host RAM). With E2E_DIRTY the
    double itself fills every fresh page (slow where page faults are), so
    only the zeros of a 1100 MiB block, a dedicated segment too, are checked."""
    mib = 1100 if DIRTY else 3072
    events, base, mine = twice(tmp, backend, [PROMISE_PROBE, "calloc-big", str(mib)],
                               "promise_probe calloc-big", stdout_only=True)
    expect(mine.returncode == 0, f"calloc-big: {mine.stdout!r}")
    rss = {}
    for name, run in (("glibc", base), ("mnemosyne", mine)):
        m = re.search(rb"maxrss_kib=(\d+)", run.stderr)
        expect(m, f"calloc-big ({name}): no maxrss line in {run.stderr[-500:]!r}")
        rss[name] = int(m.group(1)) >> 10
    print(f"calloc(1, {mib} MiB): peak RSS {rss['mnemosyne']} MiB ({rss['glibc']} MiB without)")
    if REAL:
        return  # the driver's own RSS accounting differs; the zeros are the point
    check_heap(events, backend, 0)
    cleared = sum(int(e["size"]) for e in events
                  if e["event"] == "memset" and e.get("kind") == "managed")
    if backend in MANAGED:
        expect(cleared >= mib << 20, f"the device cleared {cleared} bytes, not the {mib} MiB block")
    else:
        expect(cleared == 0, f"{backend}: the driver cleared {cleared} bytes")
    if not DIRTY:
        expect(rss["mnemosyne"] < 256, f"calloc(1, 3 GiB) peaked at {rss['mnemosyne']} MiB RSS")


def case_promises(tmp, backend):
    """What glibc promises where calls fail or report: memalign/aligned_alloc/
    posix_memalign's result and errno for every kind of invalid alignment,
    calloc's zeros (on fresh and on reused memory), mallinfo2/mallinfo
    following allocations and frees, malloc_stats with a cancellation pending (it prints and returns),
    impossible sizes (NULL and ENOMEM), and a fork under RLIMIT_AS that
    either fails with ENOMEM or gives a child every byte."""
    twice(tmp, backend, [PROMISE_PROBE, "align"], "promise_probe align")
    case_calloc(tmp, backend)
    # The double's own thread mallocs blocks of up to 32 MiB in its first
    # ~100 ms (FAKECUDA_THREAD_ITERS); on a loaded machine one was live
    # between two of the probe's readings and counted as the program's.
    _, _, mine = twice(tmp, backend, [PROMISE_PROBE, "mallinfo"], "promise_probe mallinfo",
                       {"FAKECUDA_THREAD_ITERS": "0"})
    expect(mine.returncode == 0 and b"NO" not in mine.stdout, f"mallinfo2: {mine.stdout!r}")
    _, _, mine = twice(tmp, backend, [PROMISE_PROBE, "impossible"], "promise_probe impossible")
    expect(mine.stdout.endswith(b", 0 otherwise\n"), f"impossible sizes: {mine.stdout!r}")
    # glibc's tst-malloc-too-large's shape: a failed request costs about
    # what glibc's does. Each made mimalloc collect its whole heap, which
    # freed the one page a small malloc had used and faulted it back (on
    # host, 319,463 page faults and 5.5 s where glibc took 2 faults).
    _, base, mine = twice(tmp, backend, [PROMISE_PROBE, "too-large"], "promise_probe too-large",
                          {"FAKECUDA_THREAD_ITERS": "0"}, stdout_only=True)
    faults = [int(r.stderr.decode().rsplit("faults=", 1)[1].split()[0]) for r in (base, mine)]
    expect(mine.stdout.endswith(b", 0 otherwise\n") and faults[1] <= faults[0] + 1000,
           f"too-large sizes: {mine.stdout!r}, {faults[1]} page faults (glibc: {faults[0]})")
    _, base, mine = twice(tmp, backend, [PROMISE_PROBE, "stats-cancel"], "malloc_stats",
                          stdout_only=True)
    expect(base.stdout == b"malloc_stats returned; the thread was cancelled\n",
           f"glibc's malloc_stats with a cancellation pending: {base.stdout!r}")
    expect(b"mnemosyne: backend " in mine.stderr,
           f"malloc_stats printed nothing with a cancellation pending: {mine.stderr!r}")
    # glibc's layout, which programs (and glibc's tst-malloc-stats-cancellation,
    # which looks for "max mmap bytes") read, then mnemosyne's own line.
    for label in (b"Arena 0:\n", b"\nsystem bytes     = ", b"\nin use bytes     = ",
                  b"Total (incl. mmap):\n", b"\nmax mmap regions = ", b"\nmax mmap bytes   = "):
        expect(label in base.stderr and label in mine.stderr,
               f"malloc_stats lacks glibc's {label!r}: glibc {base.stderr!r}, mine {mine.stderr!r}")
    for headroom in ("1", "16", "256"):
        run = Run(tmp, backend, True)
        r = run([PROMISE_PROBE, "fork-limit", headroom])
        expect(r.returncode == 0 and r.stdout in (b"fork: the child found every byte\n",
                                                  b"fork failed: ENOMEM\n"),
               f"fork under RLIMIT_AS (size + {headroom} MiB): {r.returncode} {r.stdout!r} "
               f"{r.stderr[-600:]!r}")
        print(f"fork under RLIMIT_AS, size + {headroom} MiB: {r.stdout.decode().strip()}")
    # A file-size limit (`ulimit -f`, soft or hard): the fork's image is a
    # file to the kernel, whose SIGXFSZ would kill the program.
    for flag in ("-S", "-SH"):
        run = Run(tmp, backend, True)
        r = run(["bash", "-c", f'ulimit {flag} -f 1000 && exec "$0" fork-limit 256',
                 PROMISE_PROBE])
        expect(r.returncode == 0 and r.stdout in (b"fork: the child found every byte\n",
                                                  b"fork failed: ENOMEM\n"),
               f"fork under `ulimit {flag} -f 1000`: {r.returncode} {r.stdout!r} "
               f"{r.stderr[-600:]!r}")
        print(f"fork under `ulimit {flag} -f 1000`: {r.stdout.decode().strip()}")


# Programs that take their signals in one place: blocked in every thread of
# theirs and read with sigwait()/sigwaitinfo() (python3, dumb-init) or from a
# signalfd (catatonit), forwarding them to a child. A thread the driver
# started must not take them instead.
SIGNAL_PROGRAMS = {
    "python3-sigwait": [PYTHON, "-c", r"""
import os, signal, threading
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGUSR2})
worker = threading.Thread(target=lambda: [bytearray(1 << 20) for _ in range(50)])
worker.start(); worker.join()
for sig in (signal.SIGUSR1, signal.SIGUSR2) * 20:
    os.kill(os.getpid(), sig)
    print(signal.sigwaitinfo({sig}).si_signo)
"""],
    "catatonit-signalfd": ["catatonit", "--", "/bin/sh", "-c",
                           'trap "echo got USR1" USR1; kill -USR1 $PPID; sleep 0.3 & wait; '
                           'trap "echo got TERM" TERM; kill -TERM $PPID; sleep 0.3 & wait; echo end'],
    "dumb-init-sigwait": ["dumb-init", "--single-child", "--", "/bin/sh", "-c",
                          'trap "echo got USR1" USR1; kill -USR1 $PPID; sleep 0.3 & wait; '
                          'trap "echo got HUP" HUP; kill -HUP $PPID; sleep 0.3 & wait; echo end'],
}


def case_signals(tmp, backend):
    """Signals a program blocks in its threads reach it, not the driver's."""
    for name, cmd in SIGNAL_PROGRAMS.items():
        if not shutil.which(cmd[0]):
            raise Failure(f"{cmd[0]} is not installed (scripts/setup.sh installs it)")
        events, _, _ = twice(tmp, backend, cmd, name)
        check_heap(events, backend, 0)


def case_single_threaded_tools(tmp, backend):
    """Programs that need a single-threaded process (a user namespace, one
    thread's credentials) keep the system allocator by default (EXCLUDE) and
    work as without mnemosyne; the commands they run move their heap."""
    # id runs as nobody (outside the namespace too): the double's log must
    # be writable for it.
    os.chmod(tmp, 0o777)
    for cmd in (["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "id"],
                ["unshare", "-U", "id"], ["unshare", "-r", "id"]):
        log = os.path.join(tmp, "fake.log")
        with open(log, "w"):
            pass
        os.chmod(log, 0o666)
        events, _, _ = twice(tmp, backend, cmd, " ".join(cmd))
        check_heap(events, backend, 0)
        if not REAL and backend != "host":
            # One process loaded the driver: id, not the tool before it.
            expect(len({e["pid"] for e in events if e["event"] == "init"}) == 1,
                   f"{cmd[0]}: expected only id to load the driver: {events[:4]}")
    if backend == "host":
        return
    # Why: with the driver's threads in the tool itself, the kernel refuses
    # the user namespace (a multi-threaded process may not create one).
    run = Run(tmp, backend, True, {"MNEMOSYNE_EXCLUDE": ""})
    r = run(["unshare", "-U", "id"])
    expect(r.returncode != 0 and b"Invalid argument" in r.stderr,
           f"unshare -U with the driver loaded: {r.returncode} {r.stderr!r}")


TREE = ["/bin/sh", "-c", "ls / | sort | tail -3; echo x | cat; /bin/sh -c 'echo nested | cat'"]


def case_warn_once(tmp, backend):
    """Without a driver, a tree of processes prints the fallback warning
    once (its first process), and every process's statistics give the
    reason."""
    for name, extra in (("no driver", {"MNEMOSYNE_CUDA_DRIVER": "/nonexistent/libcuda.so.1"}),
                        ("no device", {"FAKECUDA_DEVICES": "0"})):
        stats = tempfile.mkdtemp(prefix="warn-", dir=tmp)
        extra = dict(extra, MNEMOSYNE_STATS_FILE=os.path.join(stats, "%p.json"))
        base = Run(tmp, backend, False, extra)(TREE)
        mine = Run(tmp, backend, True, extra)(TREE)
        expect(base.stdout == mine.stdout and base.returncode == mine.returncode,
               f"{name}: output differs: {mine.stdout!r} {mine.returncode}")
        one_warning(mine, rf"the {backend} backend is unavailable .*the heap uses host memory")
        docs = []
        for f in os.listdir(stats):
            with open(os.path.join(stats, f)) as fh:
                docs.append(json.load(fh))
        # ls, sort, tail, cat, cat (the shells exec their last command)
        expect(len(docs) >= 5, f"{name}: {len(docs)} statistics files for the tree")
        quiet = [d["program"] for d in docs if not d["backend_unavailable"]]
        expect(not quiet, f"{name}: no reason in the statistics of {quiet}")
        for d in docs:
            validate_stats(d)
    # Through the launcher, as users run it: the same, one line.
    r = subprocess.run([LAUNCHER, "run", f"--backend={backend}", f"--cuda-driver={FAKE}", "--"]
                       + TREE, env=dict(Run(tmp, backend, False).env, FAKECUDA_DEVICES="0"),
                       capture_output=True, timeout=TIMEOUT)
    one_warning(r, rf"the {backend} backend is unavailable")


JAVA_LAUNCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ProcessLaunch.java")


def case_jvm_launch(tmp, backend):
    """A JVM starting 100 children from a pool of 4 threads, with each of its
    launch mechanisms: FORK (the JVM forks itself while its threads run),
    VFORK and POSIX_SPAWN. Output identical to a plain run."""
    java, javac = shutil.which("java"), shutil.which("javac")
    if java is None or javac is None:
        raise Failure("java/javac are not installed (scripts/setup.sh installs them)")
    classes = os.path.join(tmp, "classes")
    subprocess.run([javac, "-d", classes, JAVA_LAUNCH], check=True, capture_output=True)
    for mechanism in ("FORK", "VFORK", "POSIX_SPAWN"):
        cmd = [java, f"-Djdk.lang.Process.launchMechanism={mechanism}", "-cp", classes,
               "ProcessLaunch", "100"]
        events, _, mine = twice(tmp, backend, cmd, f"java ({mechanism})")
        expect(mine.stdout.endswith(b"0:done\n"), f"java ({mechanism}): {mine.stdout[-200:]!r}")
        check_heap(events, backend, 0)


def postgres_bin():
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    if not found:
        raise Failure("PostgreSQL is not installed (scripts/setup.sh installs it)")
    return os.path.dirname(found[-1])


def case_postgres(tmp, backend):
    """PostgreSQL under mnemosyne, as its users run it: initdb, the server
    started (its postmaster forks a backend per connection and takes its
    signals in one place), pgbench with a connection per transaction and a
    read-write run, the accounts consistent with the history, a clean fast
    shutdown, every server process's heap on the backend."""
    if os.geteuid() != 0:
        raise Failure("the PostgreSQL case runs the server as user postgres: run it as root")
    bindir = postgres_bin()
    os.chmod(tmp, 0o777)
    data = os.path.join(tmp, "data")
    stats = os.path.join(tmp, "stats")
    os.mkdir(stats)
    os.chmod(stats, 0o777)
    log = os.path.join(tmp, "fake.log")
    with open(log, "w"):
        pass
    os.chmod(log, 0o666)

    def as_postgres(cmd, env=None, timeout=TIMEOUT):
        return subprocess.run(["runuser", "-u", "postgres", "--", "env"] +
                              [f"{k}={v}" for k, v in (env or {}).items()] + cmd,
                              capture_output=True, timeout=timeout)

    r = as_postgres([f"{bindir}/initdb", "-D", data, "-A", "trust"])
    expect(r.returncode == 0, f"initdb: {r.stderr[-500:]!r}")
    env = {k: v for k, v in Run(tmp, backend, True).env.items()
           if k.startswith(("MNEMOSYNE_", "FAKECUDA_", "LD_PRELOAD"))}
    env["MNEMOSYNE_STATS_FILE"] = os.path.join(stats, "%p.json")
    server_log = os.path.join(tmp, "server.log")
    start = as_postgres([f"{bindir}/pg_ctl", "-D", data, "-w", "-l", server_log, "-o",
                         f"-k {tmp} -c listen_addresses=''", "start"], env)
    try:
        expect(start.returncode == 0, f"pg_ctl start: {start.stderr[-500:]!r}")
        bench = [f"{bindir}/pgbench", "-h", tmp]
        r = as_postgres(bench + ["-i", "-s", "2", "postgres"])
        expect(r.returncode == 0, f"pgbench -i: {r.stderr[-500:]!r}")
        for args in (["-C", "-S", "-c", "4", "-j", "2", "-T", "5"], ["-c", "4", "-j", "2", "-T", "3"]):
            r = as_postgres(bench + args + ["postgres"])
            out = r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace")
            expect(r.returncode == 0 and "number of failed transactions: 0 " in out and
                   "aborted" not in out, f"pgbench {' '.join(args)}: {out[-800:]}")
        r = as_postgres([f"{bindir}/psql", "-h", tmp, "-Atc",
                         "select (select sum(abalance) from pgbench_accounts) = "
                         "(select coalesce(sum(delta), 0) from pgbench_history), "
                         "(select count(*) from pgbench_accounts)", "postgres"])
        expect(r.stdout.strip() == b"t|200000", f"consistency: {r.stdout!r} {r.stderr!r}")
    finally:
        stop = as_postgres([f"{bindir}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop"])
    expect(stop.returncode == 0, f"pg_ctl stop: {stop.stderr[-500:]!r}")
    with open(server_log, errors="replace") as f:
        text = f.read()
    bad = [line for line in text.splitlines()
           if re.search(r"PANIC|terminated by signal|reinitializing|was terminated", line)]
    expect(not bad, f"server log: {bad[:5]}")
    docs = stats_in(stats)
    expect(len(docs) > 20, f"only {len(docs)} server processes wrote statistics")
    for d in docs:
        validate_stats(d)
        # Backends are forked children: their heap is the postmaster's copy,
        # and they grow with host memory.
        expect(d["requested_backend"] == backend and not d["backend_unavailable"] and
               d["fallbacks"]["count"] == 0 and
               (d["forked_child"] or d["active_backend"] == backend),
               f"{d['program']} (pid {d['pid']}) ran on {d['active_backend']}: {d}")
    expect(any(d["program"] == "postgres" and not d["forked_child"] for d in docs),
           "the postmaster wrote no statistics")
    check_heap(parse_log(log), backend, 0)


def case_own_context(tmp, backend):
    """MNEMOSYNE_CONTEXT=own: a program that resets the primary context at the
    end of main exits as it does without mnemosyne, its heap untouched."""
    cmd = [PYTHON, "-c", PY_RESET_AT_END]
    extra = {"E2E_DRIVER": FAKE, "MNEMOSYNE_CONTEXT": "own"}
    events, _, _ = twice(tmp, backend, cmd, "python3 resetting the primary context", extra)
    check_heap(events, backend, 0)
    if REAL:
        return
    expect(not [e for e in events if e["event"] == "ctx-free"],
           "the reset freed blocks of the heap's own context")
    # The default context: the reset frees the heap (managed memory, and
    # pinned arenas from cuMemHostAlloc) and the exit's frees crash. Under
    # pinned with MNEMOSYNE_PIN=granule the arenas are the process's own
    # memory, registered with the driver: the reset unregisters them and the
    # program goes on. Both are docs/limits.md's limit; if either changes, say
    # so there. What a reset does to the granules of PIN=vmm (pinned's default)
    # is not known (not measured on hardware, not modelled by the double):
    # docs/limits.md says to assume it destroys them.
    for extra in (ARENAS, GRANULES) if backend == "pinned" else ({},):
        reset_default_context(tmp, backend, cmd, extra)


def reset_default_context(tmp, backend, cmd, extra):
    run = Run(tmp, backend, True, {"E2E_DRIVER": FAKE, **extra})
    r = run(cmd)
    if extra == GRANULES:
        expect(r.returncode == 0, f"a reset under pinned should leave the heap readable: "
               f"exit {r.returncode} {r.stderr[-500:]!r}")
        events = parse_log(run.log)
        expect([e for e in events if e["event"] == "ctx-free"],
               "the reset should have dropped the heap's registrations")
    else:
        expect(r.returncode != 0, "the primary context's heap survived a reset: update docs/limits.md")


def one_warning(mine, needle):
    lines = [l for l in mine.stderr.decode(errors="replace").splitlines() if l.startswith("mnemosyne:")]
    expect(len(lines) == 1, f"expected one mnemosyne warning line, got {lines}")
    expect(re.search(needle, lines[0]), f"warning {lines[0]!r} does not match {needle!r}")


PY_HUNGRY = r"""
blocks = [bytearray(4 << 20) for _ in range(150)]
for i, b in enumerate(blocks): b[0] = i % 256
print(sum(b[0] for b in blocks), len(blocks))
"""


def fault_case(tmp, backend, extra, needle, script=PY_WORKLOAD):
    base = Run(tmp, backend, False)([PYTHON, "-c", script])
    run = Run(tmp, backend, True, extra)
    mine = run([PYTHON, "-c", script])
    compare(base, mine, "fault run", stdout_only=True)
    one_warning(mine, needle)
    return parse_log(run.log)


def case_fault_no_driver(tmp, backend):
    fault_case(tmp, backend, {"MNEMOSYNE_CUDA_DRIVER": "/nonexistent/libcuda.so.1"},
               r"unavailable.*nonexistent.*host memory")


def case_fault_init(tmp, backend):
    fault_case(tmp, backend, {"FAKECUDA_INIT_ERROR": "100"}, r"unavailable.*(NO_DEVICE|100)")


def case_fault_no_device(tmp, backend):
    fault_case(tmp, backend, {"FAKECUDA_DEVICES": "0"},
               r"unavailable \(device 0 does not exist: the driver reports 0 devices\).*host memory")


def case_fault_bad_device(tmp, backend):
    fault_case(tmp, backend, {"MNEMOSYNE_DEVICE": "5"},
               r"unavailable \(device 5 does not exist: the driver reports 2 devices\)")


def case_fault_alloc_after(tmp, backend):
    events = fault_case(tmp, backend, {"FAKECUDA_FAIL_ALLOC_AFTER": "1"},
                        r"could not serve a request \(cuMemAllocManaged of \d+ bytes failed: "
                        r"CUDA_ERROR_OUT_OF_MEMORY\).*host memory", PY_HUNGRY)
    expect(any(e["event"] == "alloc" for e in events), "the first arena should be driver memory")


def case_fault_cap(tmp, backend):
    events = fault_case(tmp, backend, {"FAKECUDA_MEM_LIMIT": str(200 << 20)},
                        r"could not serve.*host memory", PY_HUNGRY)
    expect(any(e["event"] == "alloc" for e in events), "driver memory should be used up to the cap")


# ---------------------------------------------------------------- the fault matrix
#
# Each cell: the fault, when the program meets it ("start": the backend never
# works; "run": it fails after the first arena; "none": nothing visible), the
# warning it must get, and the probe's arguments (1 MiB mallocs, blocks of
# their own). With MNEMOSYNE_FALLBACK=host the program's output is unchanged
# and one warning line says why; with =fail the allocations fail with
# NULL/ENOMEM/std::bad_alloc and only a start-time fault is announced.

def alloc_call(backend, when):
    """The driver call whose refusal a fault message names: under pinned,
    arenas are mapped from host memory of the driver's virtual-memory API
    (cuMemCreate, PIN=vmm, the default), or come from cuMemHostAlloc
    (PIN=arena), or are reservations registered granule by granule
    (cuMemHostRegister, PIN=granule); blocks of their own come from
    cuMemHostAlloc. A vmm granule refused at the start (`when`) makes the
    heap fall back to cuMemHostAlloc arenas, whose refusal the line names."""
    if backend != "pinned":
        return "cuMemAllocManaged"
    if (PIN or "vmm") == "vmm" and when == "run":
        return r"cuMemCreate"
    return r"cuMemHost(?:Alloc|Register)"


FAULT_CELLS = {
    "no-driver": ({"MNEMOSYNE_CUDA_DRIVER": "/nonexistent/libcuda.so.1"}, "start",
                  r"cannot load MNEMOSYNE_CUDA_DRIVER=/nonexistent/libcuda\.so\.1", (200, 4)),
    "missing-entry": ({"FAKECUDA_MISSING": "cuMemHostAlloc"}, "start",
                      r"lacks the entry point cuMemHostAlloc", (200, 4)),
    "init-fails": ({"FAKECUDA_INIT_ERROR": "100"}, "start",
                   r"cuInit\(0\) failed: CUDA_ERROR_NO_DEVICE \(100\)", (200, 4)),
    "init-crash": ({"FAKECUDA_INIT_CRASH": "1"}, "start",
                   r"cuInit\(0\) crashed inside the driver \(signal 11, SEGV\)", (200, 4)),
    "stub": ({"FAKECUDA_STUB": "1"}, "start", r"is the CUDA Toolkit's stub libcuda\.so, for "
             r"linking only .*install the NVIDIA driver, or set MNEMOSYNE_CUDA_DRIVER", (200, 4)),
    "toolkit-stub": ({"MNEMOSYNE_CUDA_DRIVER": TOOLKIT_STUB}, "start",
                     r"stubs/libcuda\.so is the CUDA Toolkit's stub", (200, 4)),
    "no-device": ({"FAKECUDA_DEVICES": "0"}, "start",
                  r"device 0 does not exist: the driver reports 0 devices", (200, 4)),
    "driver-cap": ({"FAKECUDA_MEM_LIMIT": str(150 << 20)}, "run",
                   r"{call} of \d+ bytes failed: CUDA_ERROR_OUT_OF_MEMORY", (200, 0)),
    "limit": ({"MNEMOSYNE_LIMIT": "150MiB"}, "run", r"the limit of 157286400 bytes is reached",
              (200, 0)),
    # Whichever of the two tables of 4096 fills first: the backend's live
    # blocks, or mnemosyne's segments (under pinned, arenas are reservations,
    # not blocks of the backend's table, so the segment table fills first).
    "registry-full": ({}, "run", r"(the {backend} backend's table of live blocks is full "
                      r"\(4096 blocks\)|mnemosyne's segment table is full \(4096 segments\))",
                      (20, 4200)),
    "advice-fails": ({"FAKECUDA_ADVISE_ERROR": "1"}, "none", None, (200, 4)),
}
for n in range(5):
    FAULT_CELLS[f"nth-alloc-{n}"] = (
        {"FAKECUDA_FAIL_ALLOC_AFTER": str(n)}, "start" if n == 0 else "run",
        r"{call} of \d+ bytes failed: CUDA_ERROR_OUT_OF_MEMORY", (1000, 0))


def fault_lines(r):
    return [l for l in r.stderr.decode(errors="replace").splitlines() if l.startswith("mnemosyne:")]


def run_fault_cell(tmp, backend, cell):
    extra, when, needle, (mallocs, aligned) = FAULT_CELLS[cell]
    if cell == "toolkit-stub" and not os.path.exists(TOOLKIT_STUB):
        print(f"SKIP: the CUDA Toolkit's stub libcuda.so is not at {TOOLKIT_STUB!r}")
        sys.exit(77)
    if needle is not None:
        needle = needle.format(call=alloc_call(backend, when), backend=backend)
    cmd = [FAULT_PROBE, str(mallocs), str(aligned)]
    base = Run(tmp, backend, False)(cmd)
    expect(base.returncode == 0 and not re.search(rb"\b0 of [1-9]", base.stdout),
           f"the probe itself failed: {base.returncode} {base.stdout!r}")
    stats = os.path.join(tmp, f"stats-{cell}.json")

    # FALLBACK=host: the program sees no difference, one line says why.
    mine = Run(tmp, backend, True, dict(extra, MNEMOSYNE_STATS_FILE=stats))(cmd)
    compare(base, mine, f"{cell} with FALLBACK=host", stdout_only=True)
    lines = fault_lines(mine)
    if needle is None:
        expect(not lines, f"{cell}: no warning expected, got {lines}")
    else:
        expect(len(lines) == 1 and re.search(needle, lines[0]),
               f"{cell}: expected one line matching {needle!r}, got {lines}")
        expect(("host memory" in lines[0]), f"{cell}: the line should say where the heap goes")
    if cell == "advice-fails":
        with open(stats) as f:
            pool = json.load(f)["pools"][backend]
        expect(pool["advice_failures"] >= 1, f"advice failures not counted: {pool}")
        return

    # FALLBACK=fail: allocations fail the way the API says.
    fail = Run(tmp, backend, True, dict(extra, MNEMOSYNE_FALLBACK="fail"))(cmd)
    expect(fail.returncode == 0, f"{cell} with FALLBACK=fail: exit {fail.returncode}: "
           f"{fail.stderr[-500:]!r}")
    out = fail.stdout.decode()
    lines = fault_lines(fail)
    if when == "start":
        expect(len(lines) == 1 and re.search(needle, lines[0]) and
               "allocations fail (MNEMOSYNE_FALLBACK=fail)" in lines[0],
               f"{cell}: expected one line saying allocations fail, got {lines}")
        for api in ("malloc", "aligned_alloc", "calloc", "posix_memalign", "realloc"):
            if api == "aligned_alloc" and aligned == 0:
                continue
            expect(re.search(rf"^{api}: 0 of \d+, then ENOMEM$", out, re.M),
                   f"{cell}: {api} should fail with ENOMEM:\n{out}")
        expect("new: bad_alloc" in out, f"{cell}: operator new should throw bad_alloc:\n{out}")
    else:
        expect(not lines, f"{cell}: FALLBACK=fail must not announce host memory: {lines}")
        api, count = ("aligned_alloc", aligned) if cell == "registry-full" else ("malloc", mallocs)
        m = re.search(rf"^{api}: (\d+) of {count}, then ENOMEM$", out, re.M)
        # Under pinned the driver's n-th allocation is the n-th 1 MiB granule
        # registered: the fault of nth-alloc-1 and -2 comes at the probe's
        # first 1 MiB block, after the program's own start-up was served.
        least = 0 if backend == "pinned" and cell.startswith("nth-alloc-") else 1
        expect(m and least <= int(m.group(1)) < count,
               f"{cell}: {api} should serve some blocks, then fail with ENOMEM:\n{out}")


def case_fault(tmp, backend):
    run_fault_cell(tmp, backend, os.environ["E2E_FAULT_CELL"])


# ---------------------------------------------------------------- stress

def case_stress_churn(tmp, backend):
    """32 threads of random malloc/calloc/realloc/free with cross-thread frees
    for 60 s, every block checked; the backend's reserved bytes must stop
    growing once the steady live set is reached (a leak would not)."""
    seconds = int(os.environ.get("E2E_STRESS_SECONDS", "60"))
    report = os.path.join(tmp, "churn.txt")
    run = Run(tmp, backend, True, {"STRESS_REPORT": report})
    r = run([STRESS_PROBE, "churn", str(seconds), "32"])
    expect(r.returncode == 0 and r.stdout == b"churn: 32 threads, all blocks intact\n",
           f"churn failed: {r.returncode} {r.stdout!r} {r.stderr[-800:]!r}")
    expect(not fault_lines(r), f"churn: unexpected warnings {fault_lines(r)}")
    with open(report) as f:
        rows = [line.split() for line in f]
    ops = int(next(v for k, v, *_ in rows if k == "ops"))
    reserved = [int(row[2]) for row in rows if row[0] == "reserved"]
    expect(len(reserved) >= seconds - 2 and min(reserved) > 0, f"reserved samples {reserved}")
    half = reserved[len(reserved) // 2]
    expect(reserved[-1] <= half,
           f"reserved bytes kept growing with a steady live set: {half} at {len(reserved) // 2} s,"
           f" {reserved[-1]} at the end")
    print(f"churn: {ops} operations in {seconds} s ({ops // seconds} per second), reserved "
          f"{reserved[0] >> 20} MiB after 1 s, {half >> 20} MiB at half time, "
          f"{reserved[-1] >> 20} MiB at the end")
    check_heap(parse_log(run.log), backend, 0)


def case_stress_forks(tmp, backend):
    """200 fork+exec and 50 fork-only children while 4 threads allocate
    (E2E_STRESS_FORKS=EXEC,FORK: other counts)."""
    execs, forks = os.environ.get("E2E_STRESS_FORKS", "200,50").split(",")
    events, _, mine = twice(tmp, backend, [STRESS_PROBE, "forks", execs, forks], "stress forks")
    expect(f"{execs} of {execs} exec'd children ok, {forks} of {forks} forked children ok".encode()
           in mine.stdout, f"stress forks: {mine.stdout!r}")
    check_heap(events, backend, 0)
    check_children_quiet(events)


def case_stress_dlopen(tmp, backend):
    """dlopen/dlclose of a library that allocates in its constructor and frees
    in its destructor, 2000 times, while 2 threads allocate."""
    events, _, mine = twice(tmp, backend, [STRESS_PROBE, "dlopen", CTOR_LIB, "2000"],
                            "stress dlopen")
    expect(b"2000 of 2000" in mine.stdout, f"stress dlopen: {mine.stdout!r}")
    check_heap(events, backend, 0)


def case_launcher(tmp, backend):
    expect(LAUNCHER, "MNEMOSYNE_LAUNCHER not set")
    run = Run(tmp, backend, False, {"MNEMOSYNE_CUDA_DRIVER": FAKE,
                                    "FAKECUDA_LOG": os.path.join(tmp, "fake.log")})
    r = run([LAUNCHER, "run", "--backend", backend, "--device", "0", "--",
             PYTHON, "-c", "import sys; print('hello'); sys.exit(7)"])
    expect(r.returncode == 7, f"launcher exit status {r.returncode}, expected 7: {r.stderr!r}")
    expect(r.stdout == b"hello\n", f"launcher stdout {r.stdout!r}")
    check_heap(parse_log(os.path.join(tmp, "fake.log")), backend, 0)


# ---------------------------------------------------------------- options

def case_size_routing(tmp, backend):
    run = Run(tmp, backend, True, {"MNEMOSYNE_SIZE": "1K:64K"})
    r = run([SIZE_ROUTE_PROBE])
    expect(r.returncode == 0, f"size_route_probe failed: {r.stdout!r} {r.stderr!r}")
    expect(r.stderr == b"", f"unexpected stderr: {r.stderr!r}")
    want = (f"malloc(100) system\nmalloc(4096) {backend}\nmalloc(100000) system\n"
            f"calloc(10, 200) {backend}\n"
            f"realloc(4096 -> 200000) system, contents kept\n"
            f"realloc(100 -> 8192) {backend}, contents kept\n")
    expect(r.stdout.decode() == want, f"routing:\n{r.stdout.decode()}\nexpected:\n{want}")
    # Python under a range keeps working, and its output is unchanged.
    events, _, _ = twice(tmp, backend, [PYTHON, "-c", PY_WORKLOAD], "python3 with SIZE",
                         extra_env={"MNEMOSYNE_SIZE": "256:1M"})
    check_heap(events, backend, 0)


def case_limit_fallback_host(tmp, backend):
    events = fault_case(tmp, backend, {"MNEMOSYNE_LIMIT": "160MiB"},
                        r"could not serve.*limit.*host memory", PY_HUNGRY)
    total = sum(int(e["size"]) for e in events if e["event"] == "alloc")
    expect(0 < total <= 160 << 20, f"{total} driver bytes taken under a 160 MiB limit")


def case_limit_fallback_fail(tmp, backend):
    run = Run(tmp, backend, True, {"MNEMOSYNE_LIMIT": "160MiB", "MNEMOSYNE_FALLBACK": "fail"})
    r = run([PYTHON, "-c", PY_HUNGRY])
    err = r.stderr.decode(errors="replace")
    expect(r.returncode == 1 and "MemoryError" in err,
           f"expected Python's MemoryError (exit 1), got {r.returncode}: {err[-800:]}")
    expect(not any(l.startswith("mnemosyne:") for l in err.splitlines()),
           f"FALLBACK=fail should not warn about host memory: {err[-800:]}")
    total = sum(int(e["size"]) for e in parse_log(run.log) if e["event"] == "alloc")
    expect(total <= 160 << 20, f"{total} driver bytes taken under a 160 MiB limit")


def case_local_rank(tmp, backend):
    for var in ("LOCAL_RANK", "HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                "MV2_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK",
                "PALS_LOCAL_RANKID", "FLUX_TASK_LOCAL_ID", "JSM_NAMESPACE_LOCAL_RANK",
                "SLURM_LOCALID"):
        for rank, device in (("0", 0), ("3", 1), ("4", 0)):
            log = os.path.join(tmp, f"fake-{var}-{rank}.log")
            run = Run(tmp, "device", True, {"MNEMOSYNE_DEVICE": "local-rank", var: rank,
                                            "FAKECUDA_DEVICES": "2", "FAKECUDA_LOG": log})
            r = run([PYTHON, "-c", "print(sum(range(1000)))"])
            expect(r.returncode == 0 and r.stderr == b"", f"{var}={rank}: {r.stderr!r}")
            advice = [e for e in parse_log(log) if e["event"] == "advise"]
            expect(advice and all(int(e["loc_id"]) == device for e in advice),
                   f"{var}={rank} with 2 devices should advise device {device}: {advice[:2]}")


STATS_KEYS = {"allocations", "frees", "bytes_requested", "bytes_live", "bytes_peak", "segments",
              "bytes_reserved", "bytes_backed", "bytes_backed_peak", "driver_calls",
              "driver_failures", "driver_ms",
              "advice_failures"}


def validate_stats(doc):
    """Checks a stats document against docs/stats-schema.md."""
    expect(doc.get("schema") == "mnemosyne-stats/1", f"schema: {doc.get('schema')}")
    for key, kind in (("pid", int), ("program", str), ("requested_backend", str),
                      ("active_backend", str), ("device", int), ("counting", bool),
                      ("size_range", dict), ("limit", int), ("fallback", str), ("pools", dict),
                      ("fallbacks", dict), ("fork_bytes_copied", int),
                      ("backend_unavailable", str), ("earlier_frees", dict),
                      ("forked_child", bool)):
        expect(isinstance(doc.get(key), kind), f"stats key {key} missing or not {kind.__name__}")
    expect("system" in doc["pools"], "stats: no system pool")
    for name, pool in doc["pools"].items():
        expect(set(pool) == STATS_KEYS, f"pool {name} keys {sorted(pool)}")
        for k, v in pool.items():
            expect(isinstance(v, (int, float)) and not isinstance(v, bool), f"{name}.{k} = {v!r}")
            expect(v >= 0, f"{name}.{k} negative")
    for k in ("count", "bytes"):
        v = doc["earlier_frees"].get(k)
        expect(isinstance(v, int) and v >= 0, f"earlier_frees.{k} = {v!r}")


def case_stats_json(tmp, backend):
    pattern = os.path.join(tmp, "stats-%p.json")
    run = Run(tmp, backend, True, {"MNEMOSYNE_STATS_FILE": pattern, "FAKECUDA_FAIL_ALLOC_AFTER": "2"})
    r = run([PYTHON, "-c", PY_HUNGRY])
    expect(r.returncode == 0, f"python failed: {r.stderr[-500:]!r}")
    files = [f for f in os.listdir(tmp) if f.startswith("stats-")]
    expect(len(files) == 1, f"expected one stats file, got {files}")
    pid = int(files[0][len("stats-"):-len(".json")])
    with open(os.path.join(tmp, files[0])) as f:
        doc = json.load(f)
    validate_stats(doc)
    expect(doc["pid"] == pid and doc["program"] == "python3", f"pid/program {doc['pid']} {doc['program']}")
    expect(doc["counting"] is True, "counting should be on with STATS_FILE")
    events = [e for e in parse_log(run.log) if e["pid"] == pid]
    allocs = [e for e in events if e["event"] == "alloc" and e["kind"] == "managed"]
    fails = [e for e in events if e["event"] == "fail" and e["call"] == "cuMemAllocManaged"]
    pool = doc["pools"][backend]
    expect(pool["segments"] == len(allocs), f"segments {pool['segments']} vs driver log {len(allocs)}")
    expect(pool["bytes_reserved"] == sum(int(e["size"]) for e in allocs),
           f"bytes_reserved {pool['bytes_reserved']} vs driver log")
    expect(pool["driver_failures"] == len(fails), f"driver_failures {pool['driver_failures']} vs {len(fails)}")
    # A discard of a kept arena's free block (retire.cpp, when a pass comes
    # while the program runs) is four calls: a stream made, the discard, a
    # synchronize, the stream destroyed; the double logs the discard.
    discards = [e for e in events if e["event"] == "discard"]
    calls = len(allocs) + len(fails) + 4 * len(discards)
    expect(pool["driver_calls"] == calls, f"driver_calls {pool['driver_calls']} vs {calls} "
           f"({len(allocs)} allocations, {len(fails)} failures, {len(discards)} discards)")
    expect(doc["fallbacks"]["count"] > 0 and doc["fallbacks"]["reason"], "fallbacks not reported")
    expect(doc["pools"]["system"]["allocations"] >= doc["fallbacks"]["count"],
           "system pool should count the fallbacks")
    expect(pool["allocations"] >= 150 and pool["bytes_peak"] >= 64 << 20,
           f"allocations/peak implausible: {pool}")


def case_launcher_stats(tmp, backend):
    expect(LAUNCHER, "MNEMOSYNE_LAUNCHER not set")
    log = os.path.join(tmp, "fake.log")
    out = os.path.join(tmp, "s.json")
    run = Run(tmp, backend, False, {"MNEMOSYNE_CUDA_DRIVER": FAKE, "FAKECUDA_LOG": log})
    r = run([LAUNCHER, "run", "--backend", backend, "--stats", "--stats-file", out, "--",
             PYTHON, "-c", "x = [bytes(5000) for i in range(20000)]; print(len(x))"])
    expect(r.returncode == 0 and r.stdout == b"20000\n", f"launcher run: {r.returncode} {r.stderr!r}")
    with open(out) as f:
        doc = json.load(f)
    validate_stats(doc)
    table = [l for l in r.stderr.decode().splitlines() if l.startswith(f"mnemosyne: {backend} ")]
    expect(len(table) == 1, f"no {backend} row in the table: {r.stderr!r}")
    cols = table[0].split()
    pool = doc["pools"][backend]
    expect(int(cols[2]) == pool["allocations"] and int(cols[3]) == pool["frees"],
           f"table {cols} disagrees with JSON {pool}")
    expect(pool["allocations"] >= 20000, f"only {pool['allocations']} allocations counted")
    expect(pool["segments"] == len([e for e in parse_log(log) if e["event"] == "alloc"]),
           "table segments disagree with the driver log")


def case_disable(tmp, backend):
    events, _, mine = twice(tmp, backend, [PROBE], "alloc_probe with DISABLE",
                            extra_env={"MNEMOSYNE_DISABLE": "1"})
    expect(not events, f"DISABLE still loaded the driver: {events[:3]}")


def case_bad_options(tmp, backend):
    run = Run(tmp, backend, True, {"MNEMOSYNE_LIMIT": "12Q", "MNEMOSYNE_BAKEND": "host",
                                   "mnemosyne_size": "5:3"})
    r = run([PYTHON, "-c", "print('ok')"])
    expect(r.returncode == 0 and r.stdout == b"ok\n", f"bad options broke the program: {r!r}")
    lines = [l for l in r.stderr.decode().splitlines() if l.startswith("mnemosyne:")]
    expect(len(lines) == 3, f"expected three warnings, got {lines}")
    text = "\n".join(lines)
    for needle in ("MNEMOSYNE_LIMIT=12Q", "default", "MNEMOSYNE_BAKEND", "mnemosyne_size=5:3"):
        expect(needle in text, f"warnings do not mention {needle}: {lines}")
    check_heap(parse_log(run.log), backend, 0)



def case_programs(tmp, backend):
    """MNEMOSYNE_PROGRAMS: in a tree of over 300 processes only the named ones
    load the driver and move their heap; the rest run unchanged on glibc."""
    tree = os.path.join(tmp, "tree.sh")
    script = os.path.join(tmp, "train.py")
    link = os.path.join(tmp, "gpu-job")
    with open(tree, "w") as f:
        f.write("#!/bin/sh\n"
                "set -e\n"
                "i=0\n"
                "while [ $i -lt 50 ]; do\n"
                "  /bin/true\n"
                "  echo \"line $i\" | cat > /dev/null\n"
                "  printf 'b\\na\\n' | sort | head -n 1\n"
                "  i=$((i + 1))\n"
                "done\n"
                "/usr/bin/python3 -c 'print(sum(range(10)))'\n"
                "\"$PROBE\" & echo $! >> \"$PIDS\"; wait $!\n"
                "\"$LINK\" & echo $! >> \"$PIDS\"; wait $!\n"
                "\"$SCRIPT\"\n"
                "make -s -j2 -f \"$MAKEFILE\"\n")
    with open(script, "w") as f:
        f.write("#!/usr/bin/python3\n"
                "import os, json\n"
                "with open(os.environ['PIDS'], 'a') as f: print(os.getpid(), file=f)\n"
                "print(len(json.dumps([{'k': i} for i in range(20000)])))\n")
    makefile = os.path.join(tmp, "Makefile")
    with open(makefile, "w") as f:
        f.write("all: " + " ".join(f"t{i}" for i in range(8)) + "\n"
                "t%:\n\t@echo $@ | tr t T > /dev/null\n")
    os.chmod(tree, 0o755)
    os.chmod(script, 0o755)
    os.symlink(PROBE, link)

    def run_tree(preload, programs, tag):
        pids = os.path.join(tmp, f"pids-{tag}")
        env = {"PROBE": PROBE, "LINK": link, "SCRIPT": script, "MAKEFILE": makefile,
               "PIDS": pids}
        if programs is not None:
            env["MNEMOSYNE_PROGRAMS"] = programs
        run = Run(tmp, backend, preload, env)
        if os.path.exists(run.log):
            os.unlink(run.log)
        r = run([tree], cwd=tmp)
        with open(pids) as f:
            return run, r, {int(line) for line in f if line.strip()}

    _, base, _ = run_tree(False, None, "base")
    expect(base.returncode == 0, f"the tree failed without the interposer: {base.stderr[-800:]!r}")
    run, mine, named = run_tree(True, "alloc_probe,gpu-job,train.py", "named")
    compare(base, mine, "a tree of 300 processes under PROGRAMS")
    events = parse_log(run.log)
    check_heap(events, backend)
    expect(len(named) == 3, f"expected three named pids, got {named}")
    if backend == "host":
        return
    started = {e["pid"] for e in events if e["event"] == "init"}
    allocating = {e["pid"] for e in events if e["event"] == "alloc"}
    expect(started == named, f"the driver was started by {sorted(started)}, "
                             f"the named processes are {sorted(named)}")
    expect(allocating == named, f"driver memory went to {sorted(allocating)}, "
                                f"the named processes are {sorted(named)}")

    # A list naming none of them: nobody loads the driver, output unchanged.
    run, mine, _ = run_tree(True, "no-such-program,/opt/*/train.py", "none")
    compare(base, mine, "a tree of 300 processes under a PROGRAMS naming none")
    expect(not parse_log(run.log), f"an unnamed process loaded the driver: "
                                   f"{parse_log(run.log)[:3]}")

# ---------------------------------------------------------------- the library itself

EXPECTED_EXPORTS = {
    "malloc", "free", "calloc", "realloc", "reallocarray", "cfree", "posix_memalign",
    "aligned_alloc", "memalign", "valloc", "pvalloc", "malloc_usable_size", "malloc_trim",
    "mallopt", "mallinfo", "mallinfo2", "malloc_stats", "pthread_create", "fork", "_Fork", "sigaction",
    "signal",
    "mnemosyne_owns", "mnemosyne_backend_of", "mnemosyne_active_backend", "mnemosyne_version",
    "mnemosyne_stats_json",
    # operator new / delete, every form
    "_Znwm", "_Znam", "_ZnwmRKSt9nothrow_t", "_ZnamRKSt9nothrow_t", "_ZnwmSt11align_val_t",
    "_ZnamSt11align_val_t", "_ZnwmSt11align_val_tRKSt9nothrow_t",
    "_ZnamSt11align_val_tRKSt9nothrow_t", "_ZdlPv", "_ZdaPv", "_ZdlPvRKSt9nothrow_t",
    "_ZdaPvRKSt9nothrow_t", "_ZdlPvm", "_ZdaPvm", "_ZdlPvSt11align_val_t",
    "_ZdaPvSt11align_val_t", "_ZdlPvmSt11align_val_t", "_ZdaPvmSt11align_val_t",
    "_ZdlPvSt11align_val_tRKSt9nothrow_t", "_ZdaPvSt11align_val_tRKSt9nothrow_t",
}


def case_exports(tmp, backend):
    nm = subprocess.run(["nm", "-D", "--defined-only", LIB], capture_output=True, text=True)
    expect(nm.returncode == 0, f"nm failed: {nm.stderr}")
    names = {line.split()[-1] for line in nm.stdout.splitlines() if line.strip()}
    expect(names == EXPECTED_EXPORTS,
           f"exports differ: extra {sorted(names - EXPECTED_EXPORTS)}, "
           f"missing {sorted(EXPECTED_EXPORTS - names)}")
    expect(not any(n.startswith(("mi_", "_mi_")) for n in names), "a mimalloc symbol is exported")
    dyn = subprocess.run(["readelf", "-d", LIB], capture_output=True, text=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)
    expect(needed, "readelf found no NEEDED entries")
    expect(not any("cuda" in n or "mimalloc" in n for n in needed),
           f"the library links {needed}")
    # No C++ runtime: loading libstdc++ would cost every process, C programs
    # too, a millisecond (cxx_alloc.cpp finds the program's own when needed).
    expect(not any("stdc++" in n or "c++" in n for n in needed), f"the library links {needed}")
    for tool in (LAUNCHER,):
        dyn = subprocess.run(["readelf", "-d", tool], capture_output=True, text=True).stdout
        expect("libcuda" not in dyn and "mimalloc" not in dyn, f"{tool} links libcuda/mimalloc")


def case_readme_options(tmp, backend):
    """Every option the library knows (the launcher's help is made from its
    table) has a row in the README's table, and the README names no other."""
    r = subprocess.run([LAUNCHER, "run", "--help"], capture_output=True, text=True)
    expect(r.returncode == 0, f"run --help failed: {r.stderr}")
    known = set(re.findall(r"Sets\s+(MNEMOSYNE_[A-Z_]+)", r.stdout))
    expect(len(known) >= 11, f"too few options in run --help: {sorted(known)}")
    readme = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")
    with open(readme) as f:
        rows = set(re.findall(r"^\| `(MNEMOSYNE_[A-Z_]+)` \|", f.read(), re.M))
    expect(rows == known, f"README rows {sorted(rows)} vs options {sorted(known)}")


def case_stats_api(tmp, backend):
    """mnemosyne_stats_json() answers on demand, without any stats option."""
    script = (
        "import ctypes, json\n"
        "lib = ctypes.CDLL(None)\n"
        "lib.mnemosyne_stats_json.restype = ctypes.c_void_p\n"
        "raw = lib.mnemosyne_stats_json()\n"
        "text = ctypes.string_at(raw).decode()\n"
        "lib.free(ctypes.c_void_p(raw))\n"
        "print(text)\n")
    run = Run(tmp, backend, True)
    r = run([PYTHON, "-c", script])
    expect(r.returncode == 0, f"python failed: {r.stderr[-500:]!r}")
    doc = json.loads(r.stdout)
    validate_stats(doc)
    expect(doc["counting"] is False, "counting is off unless asked for")
    expect(doc["active_backend"] == backend, f"active backend {doc['active_backend']}")
    expect(doc["pools"][backend]["segments"] >= 1, "no segment reported")


def case_vmm_missing(tmp, backend):
    """pinned's default (PIN=vmm) on a driver whose virtual-memory API has no
    host memory (CUDA 12.0 and 12.1: FAKECUDA_VMM_HOST=0, the granularity
    query refused) or no virtual-memory API (no cuMemCreate): arenas locked
    whole by cuMemHostAlloc, as PIN=arena, without a word; the program's
    output is unchanged."""
    for driver in ({"FAKECUDA_VMM_HOST": "0"}, {"FAKECUDA_MISSING": "cuMemCreate"}):
        stats = os.path.join(tmp, "stats.json")
        what = f"python3 with {driver}"
        events, _, mine = twice(tmp, backend, [PYTHON, "-c", PY_WORKLOAD], what,
                                extra_env=dict(driver, MNEMOSYNE_STATS_FILE=stats))
        hosts = [e for e in events if e["event"] == "alloc" and e["kind"] == "host"]
        expect(hosts, f"{what}: no cuMemHostAlloc arena in the driver's log")
        expect(not fault_lines(mine), f"{what}: a warning: {fault_lines(mine)}")
        with open(stats) as f:
            pool = json.load(f)["pools"][backend]
        expect(pool["segments"] >= 1 and pool["bytes_backed"] == pool["bytes_reserved"],
               f"{what}: expected arenas locked whole: {pool}")


def case_stats_live(tmp, backend):
    """With statistics on, a pool's bytes_live follows the blocks exactly: it
    grows by their malloc_usable_size while they live (blocks of every size
    class, calloc'd, aligned, realloc'd, huge; half freed by another thread)
    and comes back to where it was. On `host`: under a CUDA backend the
    driver's own bookkeeping, allocated in the heap while it serves a new
    segment, is counted too (as it should be), which this cannot tell apart."""
    run = Run(tmp, backend, True, {"MNEMOSYNE_STATS_FILE": os.path.join(tmp, "stats-%p.json")})
    r = run([PROMISE_PROBE, "stats-live", backend])
    expect(r.returncode == 0, f"stats-live: exit {r.returncode}: {r.stdout!r} {r.stderr[-500:]!r}")
    print(r.stdout.decode().strip().splitlines()[-1])


# The start of a python3 program that reads its own statistics: backed(pool)
# is the pool's bytes_backed now (mnemosyne_stats_json, the preloaded
# library's).
PY_BACKED = r"""
import ctypes, json, sys, time
lib = ctypes.CDLL(None)
lib.mnemosyne_stats_json.restype = ctypes.c_void_p
def backed(pool):
    raw = lib.mnemosyne_stats_json()
    doc = json.loads(ctypes.string_at(raw).decode())
    lib.free(ctypes.c_void_p(raw))
    return doc["pools"][pool]["bytes_backed"]
"""

PY_PHASES = PY_BACKED + r"""
pool, size, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def resident():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) << 10 for l in f if l.startswith("VmRSS:"))
blocks = [bytearray(size) for _ in range(count)]
for i, b in enumerate(blocks):
    b[::4096] = bytes([i % 251]) * len(b[::4096])
check = sum(b[0] + b[-4096] for b in blocks)
peak, peak_rss = backed(pool), resident()
del blocks
time.sleep(3.0)
after, after_rss = backed(pool), resident()
small = [bytes(64) for _ in range(1000)]
again = [bytearray(size) for _ in range(count)]
for i, b in enumerate(again):
    b[::4096] = bytes([i * 7 % 251]) * len(b[::4096])
check += sum(b[0] + b[-4096] for b in again)
print(check, len(small), peak, after, peak_rss, after_rss)
"""

# Per backend: the phases to run, each the blocks it holds (size, count;
# 2 GiB in all), whether the backend's own bytes (bytes_backed) follow, and
# the options of the run. Pinned memory is backed granule by granule
# (registered, or mapped from the driver's virtual-memory API) and given
# back after a delay; host memory is the kernel's (its mapped bytes stay, its resident
# pages go); managed memory goes back only as whole driver allocations:
# blocks above 16 MiB are each one, smaller ones lie in arenas, which go
# back once no block of theirs is in use (the first one excepted).
GIVE_BACK = {"pinned": [(1 << 20, 2048, True, GRANULES), (1 << 20, 2048, True, VMM)],
             "host": [(1 << 20, 2048, False, None)], "unified": [(64 << 20, 32, True, None)]}


PY_REALLOC = PY_BACKED + r"""
lib.malloc.restype = lib.realloc.restype = ctypes.c_void_p
lib.realloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
n = 4096
p = lib.malloc(n)
ctypes.memset(p, 1, n)
while n < int(sys.argv[1]):
    grown = n + n // 2
    p = lib.realloc(ctypes.c_void_p(p), grown)
    ctypes.memset(p + n, 1, grown - n)
    print(n, grown, backed("pinned"))
    n = grown
"""


def case_give_back(tmp, backend):
    """A program that holds 2 GiB in blocks, frees them all and waits: the
    memory it held goes back (resident memory, and for CUDA backends the
    driver's bytes, drop below 10% of the peak), and the program runs on as
    before. Under pinned, a block grown by realloc to 512 MiB holds only
    itself and the block it was copied from."""
    for size, count, backed_follows, extra in GIVE_BACK[backend]:
        give_back_phase(tmp, backend, size, count, backed_follows, extra)
    if backend == "unified":
        give_back_arenas(tmp, backend)
    if backend == "pinned":
        for extra in (GRANULES, VMM):
            give_back_realloc(tmp, backend, extra)


def give_back_realloc(tmp, backend, extra):
    """Each step of the growth copies the block into a new one: backed are the
    two, as mimalloc commits them (32 MiB arena blocks), and at most the
    64 MiB of unused granules the give-back delay keeps. (A failed commit
    backed after another range served the request held twice the block.)"""
    r = Run(tmp, backend, True, extra)([PYTHON, "-c", PY_REALLOC, str(512 << 20)])
    expect(r.returncode == 0 and not fault_lines(r), f"realloc growth failed: {r.returncode} "
           f"{r.stderr[-800:]!r}")
    steps = [tuple(int(x) for x in line.split()) for line in r.stdout.decode().splitlines()]
    expect(steps and steps[-1][1] >= 512 << 20, f"output {r.stdout[-400:]!r}")

    def blocks(size):
        return (size // (32 << 20) + 1) * (32 << 20)

    for old, grown, backed in steps:
        expect(backed <= blocks(grown) + blocks(old) + (80 << 20),
               f"PIN={extra['MNEMOSYNE_PIN']}: {backed >> 20} MiB backed for a block grown "
               f"from {old >> 20} to {grown >> 20} MiB")
    print(f"give-back [{backend}, PIN={extra['MNEMOSYNE_PIN']}, realloc growth to "
          f"{steps[-1][1] >> 20} MiB]: {steps[-1][2] >> 20} MiB backed at the last step")


def give_back_arenas(tmp, backend):
    """Managed blocks of 16 MiB and less lie in arenas, which the driver
    frees only whole: an arena no block is in use in goes back (cuMemFree),
    the first one excepted. A C program that keeps nothing across its
    phases gets back all but that one; python3 keeps a few blocks it made
    during the phase (its dictionaries grow), each of which keeps its whole
    arena (docs/limits.md): some arenas go back, not all, and what the free
    blocks of the others held is discarded (its resident memory drops)."""
    run = Run(tmp, backend, True)
    r = run([PROMISE_PROBE, "phases", "1024", "2048"])
    expect(r.returncode == 0 and r.stdout.startswith(b"phases: 2048 blocks of 1024 KiB twice, "
                                                     b"checksum 522240"), f"phases: {r.returncode} "
           f"{r.stdout!r} {r.stderr[-800:]!r}")
    phases = [dict(kv.split("=") for kv in line.split())
              for line in r.stderr.decode().splitlines() if line.startswith("phase=")]
    expect(len(phases) == 2, f"phases: {r.stderr[-800:]!r}")
    for ph in phases:
        peak, after = int(ph["held_peak_mib"]), int(ph["held_after_mib"])
        peak_rss, after_rss = int(ph["rss_peak_mib"]), int(ph["rss_after_mib"])
        expect(peak >= 2048 and after < peak // 10, f"arenas held: {peak} MiB, then {after} MiB")
        expect(after_rss < peak_rss // 10, f"resident: {peak_rss} MiB, then {after_rss} MiB")
    events = parse_log(run.log)
    freed = sum(int(e["size"]) for e in events if e["event"] == "free") >> 20
    expect(freed >= 2 * (peak - after) - 128, f"the driver saw {freed} MiB given back")
    print(f"give-back [{backend}, 2048 x 1 MiB, C]: {peak} MiB of arenas, {peak_rss} MiB resident "
          f"at the peak; {after} MiB and {after_rss} MiB 3 s after the frees")
    run = Run(tmp, backend, True)
    r = run([PYTHON, "-c", PY_PHASES, backend, str(1 << 20), "2048"])
    expect(r.returncode == 0 and not fault_lines(r), f"python failed: {r.returncode} "
           f"{r.stderr[-800:]!r}")
    _, _, peak, after, peak_rss, after_rss = (int(x) for x in r.stdout.split())
    expect(after < peak - (512 << 20), f"python: {peak >> 20} MiB backed, then {after >> 20} MiB")
    # What the free blocks of the arenas it keeps held is discarded
    # (cuMemDiscardBatchAsync; the double drops the pages).
    expect(after_rss < peak_rss // 10,
           f"python: {peak_rss >> 20} MiB resident, then {after_rss >> 20} MiB")
    print(f"give-back [{backend}, 2048 x 1 MiB, python3]: {peak >> 20} MiB backed, "
          f"{peak_rss >> 20} MiB resident at the peak; {after >> 20} MiB and "
          f"{after_rss >> 20} MiB 3 s after the frees")


def give_back_phase(tmp, backend, size, count, backed_follows, extra):
    run = Run(tmp, backend, True, extra)
    r = run([PYTHON, "-c", PY_PHASES, backend, str(size), str(count)])
    expect(r.returncode == 0 and not fault_lines(r), f"python failed: {r.returncode} "
           f"{r.stderr[-800:]!r}")
    check, small, peak, after, peak_rss, after_rss = (int(x) for x in r.stdout.split())
    expect(check == 2 * sum(i % 251 + i * 7 % 251 for i in range(count)) and small == 1000,
           f"output {r.stdout!r}")
    expect(peak_rss >= 2 << 30, f"{peak_rss >> 20} MiB resident for 2 GiB of blocks")
    expect(after_rss < peak_rss // 10,
           f"{after_rss >> 20} MiB still resident of a {peak_rss >> 20} MiB peak")
    if backed_follows:
        expect(peak >= 2 << 30, f"peak {peak >> 20} MiB backed for 2 GiB of blocks")
        expect(after < peak // 10, f"{after >> 20} MiB still backed of a {peak >> 20} MiB peak")
        events = parse_log(run.log)
        freed = sum(int(e["size"]) for e in events if e["event"] == "free")
        expect(freed >= peak - after - (64 << 20),
               f"the driver saw {freed >> 20} MiB given back, stats say {(peak - after) >> 20}")
    how = f", PIN={extra['MNEMOSYNE_PIN']}" if extra and "MNEMOSYNE_PIN" in extra else ""
    print(f"give-back [{backend}{how}, {count} x {size >> 20} MiB]: {peak >> 20} MiB backed, "
          f"{peak_rss >> 20} MiB resident at the peak; {after >> 20} MiB and "
          f"{after_rss >> 20} MiB 3 s after the frees")


def case_give_back_refused(tmp, backend):
    """A driver that refuses to unregister (FAKECUDA_UNREGISTER_ERROR): the
    granules it keeps stay registered, and locked, with their pages, and the
    program runs on as before, reusing them, with nothing printed."""
    size, count, _, _ = GIVE_BACK[backend][0]
    run = Run(tmp, backend, True, {"FAKECUDA_UNREGISTER_ERROR": "1", **GRANULES})
    r = run([PYTHON, "-c", PY_PHASES, backend, str(size), str(count)])
    expect(r.returncode == 0 and not r.stderr.strip(), f"python failed: {r.returncode} "
           f"{r.stderr[-800:]!r}")
    check, small, peak, after, _, _ = (int(x) for x in r.stdout.split())
    expect(check == 2 * sum(i % 251 + i * 7 % 251 for i in range(count)) and small == 1000,
           f"output {r.stdout!r}")
    expect(peak >= 2 << 30 and after >= peak - (64 << 20),
           f"{after >> 20} MiB backed after the frees, of {peak >> 20}: the driver kept them")
    events = parse_log(run.log)
    expect(not any(e["event"] == "free" for e in events), "the double unregistered something")
    print(f"give-back refused: {peak >> 20} MiB registered, {after >> 20} MiB still registered")


def case_ls(tmp, backend):
    """ls links libraries whose constructors allocate before ours runs."""
    events, _, _ = twice(tmp, backend, ["ls", "-la", "--time-style=+", "/usr/lib", "/etc"], "ls")
    check_heap(events, backend, 0)


PY_WAIT_DRIVER_THREAD = r"""
import ctypes, os, time
fake = ctypes.CDLL(os.environ["MNEMOSYNE_TEST_FAKE"])
class Counters(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "init_calls", "alloc_managed", "alloc_host", "free_managed", "free_host",
        "advise_calls")] + [("advise_last_device", ctypes.c_int64)] + [
        (n, ctypes.c_uint64) for n in ("legacy_free_calls", "live_bytes", "failed_calls",
        "invalid_context_calls", "thread_allocs", "total_calls", "legacy_calls",
        "ctx_freed_blocks")] + [("advise_last_advice", ctypes.c_int64),
        ("advise_last_loc_type", ctypes.c_int64), ("thread_finished", ctypes.c_uint64)]
c = Counters()
deadline = time.time() + 120
while time.time() < deadline:
    fake.fakecuda_get_counters(ctypes.byref(c))
    if c.thread_finished:
        break
    time.sleep(0.01)
print("driver thread finished" if c.thread_finished else "driver thread still running",
      c.thread_allocs)
"""


def case_driver_thread(tmp, backend):
    """The double's internal thread mallocs blocks the arena has no room for
    while it holds the driver's lock. Its thread was created inside cuInit,
    so the pthread_create wrapper marked it: the arena serves it from the
    host heap instead of calling the driver (the double aborts on that
    self-deadlock)."""
    stats = os.path.join(tmp, "stats.json")
    run = Run(tmp, backend, True, {"FAKECUDA_THREAD_ALLOC_MAX": str(256 << 20),
                                   "FAKECUDA_THREAD_ITERS": "60", "MNEMOSYNE_TEST_FAKE": FAKE,
                                   "MNEMOSYNE_STATS_FILE": stats})
    r = run([PYTHON, "-c", PY_WAIT_DRIVER_THREAD])
    expect(r.returncode == 0, f"exit {r.returncode}: {r.stderr[-800:]!r}")
    expect(r.stdout == b"driver thread finished 60\n", f"stdout {r.stdout!r}")
    events = parse_log(run.log)
    expect(not [e for e in events if e["event"] == "deadlock"], "the driver deadlocked on itself")
    with open(stats) as f:
        doc = json.load(f)
    expect(doc["driver_allocations"] > 0,
           "no driver-thread allocation needed new memory: the test proved nothing")
    check_heap(events, backend, 0)


CASES = {name[5:].replace("_", "-"): fn for name, fn in globals().items()
         if name.startswith("case_")}


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in CASES:
        print(f"usage: {sys.argv[0]} CASE [BACKEND]; cases: {', '.join(sorted(CASES))}")
        return 2
    case, backend = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "unified")
    if REAL and case not in REAL_DRIVER_CASES:
        print(f"SKIP {case} [{backend}]: needs the test double's log or fault injection")
        return 0
    tmp = tempfile.mkdtemp(prefix=f"mnemosyne-e2e-{case}-")
    try:
        CASES[case](tmp, backend)
    except Failure as e:
        print(f"FAIL {case} [{backend}]: {e}")
        print(f"(files kept in {tmp})")
        return 1
    print(f"PASS {case} [{backend}]")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
