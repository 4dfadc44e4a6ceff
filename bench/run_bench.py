#!/usr/bin/env python3
"""Side-by-side allocator benchmark (scripts/bench.sh runs it).

Every workload (bench/workloads.cpp, and unmodified Debian programs) runs
under each allocator by LD_PRELOAD of its library: glibc (none), Debian's
mimalloc, jemalloc and tcmalloc, mnemosyne with the host backend, mnemosyne
with the unified backend over the test-double driver, and a naive interposer
that makes one driver allocation per malloc. Runs are interleaved (every
allocator once, then again) and repeated; medians and ratios to mimalloc
come from the same run. Single-threaded workloads are also counted with
callgrind: instruction counts repeat exactly on a noisy machine, seconds do
not. Writes bench/results/results.csv, results.md and ratios.png.
"""
import argparse
import csv
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

LIB = "/usr/lib/x86_64-linux-gnu"
PEERS = {
    "mimalloc": f"{LIB}/libmimalloc.so.2",
    "jemalloc": f"{LIB}/libjemalloc.so.2",
    "tcmalloc": f"{LIB}/libtcmalloc_minimal.so.4",
}
# The naive interposer makes a driver call per malloc: it runs this share of
# each workload's work, and its times are scaled up by the inverse.
NAIVE_SHARE = 0.01

# name, argument of the workloads binary, full scale, quick scale,
# single-threaded (then also counted with callgrind).
WORKLOADS = [
    ("churn", "churn", 5.0, 0.5, True),
    ("larson", "larson", 1.0, 0.2, False),
    ("xmalloc", "xmalloc", 3.0, 0.3, False),
    ("cache-scratch", "cache-scratch", 20.0, 2.0, False),
    ("malloc-simple", "malloc-simple", 2.0, 0.2, True),
    ("malloc-thread", "malloc-thread", 1.0, 0.1, False),
    ("realloc-chains", "realloc-chains", 2.0, 0.2, True),
    ("large", "large", 1.0, 0.2, True),
    ("threads-200", "threads-200", 1.0, 1.0, False),
    ("calloc-large", "calloc-large", 3.0, 0.75, True),
    ("realloc-grow", "realloc-grow", 1.0, 0.25, True),
    ("impossible", "impossible", 1.0, 0.1, True),
]

PY_PROGRAM = ("import json\n"
              "d = {str(i): [i] * (i % 50) for i in range(N)}\n"
              "s = json.dumps(d)\n"
              "print(len(json.loads(s)), len(s))\n")


def programs(work, quick):
    """Unmodified Debian programs doing what their users do."""
    n = 20000 if quick else 150000
    src = os.path.join(work, "big.c")
    with open(src, "w") as f:
        for i in range(300 if quick else 1500):
            f.write(f"int f{i}(int x) {{ int a[{i % 17 + 1}]; for (int k = 0; k < {i % 17 + 1};"
                    f" ++k) a[k] = x * k + {i}; return a[x % {i % 17 + 1}]; }}\n")
    lines = os.path.join(work, "lines.txt")
    import random
    rnd = random.Random(5)
    with open(lines, "w") as f:
        for _ in range(60000 if quick else 400000):
            f.write("%08x %s\n" % (rnd.getrandbits(32), "x" * rnd.randrange(1, 40)))
    return [
        ("python3-json", ["/usr/bin/python3", "-c", PY_PROGRAM.replace("N", str(n))]),
        ("gcc-compile", ["gcc", "-O2", "-c", src, "-o", os.devnull]),
        ("sort", ["sort", lines, "-o", os.devnull]),
        ("xz", ["xz", "-6", "-T1", "-c", lines]),
    ]


def allocators(build, fake, work):
    lib = os.path.join(build, "interpose", "libmnemosyne.so")
    naive = os.path.join(build, "bench", "libnaive-interposer.so")
    log = os.path.join(work, "fake.log")
    driver = {"MNEMOSYNE_CUDA_DRIVER": fake, "FAKECUDA_LOG": log,
              # The naive interposer cannot serve the double's own threads:
              # with one, a process is multi-threaded, and GNU time's fork
              # then touches the heap the child lacks.
              "FAKECUDA_THREAD_ITERS": "0", "FAKECUDA_EVENT_THREAD": "0"}
    out = [("glibc", {})]
    out += [(name, {"LD_PRELOAD": path}) for name, path in PEERS.items()]
    out += [("mnemosyne-host", {"LD_PRELOAD": lib, "MNEMOSYNE_BACKEND": "host"}),
            ("mnemosyne-unified", {"LD_PRELOAD": lib, "MNEMOSYNE_BACKEND": "unified", **driver}),
            ("naive", {"LD_PRELOAD": naive, **driver})]
    return out, log


def run_measured(argv, env, log, work):
    """Runs argv; returns (wall, cpu, peak RSS KiB, rc, stderr, driver calls).
    GNU time reports the peak RSS: a child forked straight from this Python
    process would count Python's own pages in its ru_maxrss."""
    if os.path.exists(log):
        os.unlink(log)
    report = os.path.join(work, "time.out")
    start = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "%e %U %S %M", "-o", report] + argv, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - start
    try:
        with open(report) as f:
            fields = f.read().split()[-4:]
        cpu = float(fields[1]) + float(fields[2])
        rss = int(fields[3])
    except (OSError, ValueError, IndexError):
        cpu, rss = 0.0, 0
    calls = 0
    if os.path.exists(log):
        with open(log) as f:
            calls = sum(1 for line in f if " alloc " in line)
    return wall, cpu, rss, p.returncode, p.stderr, calls


def startup(allocs, base_env, build, fake, runs, quick):
    """What starting a process costs under each allocator: /bin/true spawned
    from this (unpreloaded) script, N times in a row, interleaved; the
    median per process, and callgrind's count for one. mnemosyne-unnamed is
    the unified backend in a process MNEMOSYNE_PROGRAMS does not name: what
    each other process of a tree pays."""
    lib = os.path.join(build, "interpose", "libmnemosyne.so")
    configs = [(name, extra) for name, extra in allocs if name != "naive"]
    configs.append(("mnemosyne-unnamed", {"LD_PRELOAD": lib, "MNEMOSYNE_BACKEND": "unified",
                                          "MNEMOSYNE_CUDA_DRIVER": fake,
                                          "MNEMOSYNE_PROGRAMS": "no-such-program"}))
    n = 50 if quick else 300
    per = {name: [] for name, _ in configs}
    for _ in range(runs):
        for name, extra in configs:
            env = {**base_env, **extra}
            start = time.perf_counter()
            for _ in range(n):
                subprocess.run(["/bin/true"], env=env, check=True)
            per[name].append((time.perf_counter() - start) / n)
    rows = []
    for name, extra in configs:
        rows.append({"allocator": name, "ms": statistics.median(per[name]) * 1000,
                     "instructions": instructions(["/bin/true"], {**base_env, **extra})})
    glibc = rows[0]["ms"]
    for r in rows:
        r["extra_ms"] = r["ms"] - glibc
    line = "  ".join(f"{r['allocator']} {r['ms']:.2f} ms" for r in rows)
    print(f"startup (/bin/true): {line}", flush=True)
    return rows, n


def fork_costs(allocs, base_env, build, runs, quick):
    """What fork() costs the parent with a live heap of each shape
    (bench/fork_cost.cpp): 64 KiB blocks, or objects of 16 to 256 bytes with
    holes (a key-value server's heap), under glibc, mimalloc and mnemosyne,
    whose CUDA backends copy the heap for the child. The median of the
    fork() calls, in ms and in seconds per GiB of live heap."""
    binary = os.path.join(build, "bench", "fork_cost")
    mib = 64 if quick else 512
    forks = 2 if quick else 5
    lib = os.path.join(build, "interpose", "libmnemosyne.so")
    configs = [(name, extra) for name, extra in allocs if name in ("glibc", "mimalloc",
                                                                      "mnemosyne-host",
                                                                      "mnemosyne-unified")]
    configs.append(pinned_config(allocs, lib))
    rows = []
    for shape in ("large", "small"):
        per = {name: [] for name, _ in configs}
        for _ in range(runs):
            for name, extra in configs:
                p = subprocess.run([binary, str(mib), str(forks), shape], env={**base_env, **extra},
                                   capture_output=True, text=True)
                m = re.search(r"fork\(\) ([0-9.]+) ms", p.stdout)
                if p.returncode != 0 or not m:
                    print(f"bench: fork_cost {shape} under {name} failed: {p.stderr[-300:]}")
                    continue
                per[name].append(float(m.group(1)))
        for name, _ in configs:
            if per[name]:
                ms = statistics.median(per[name])
                rows.append({"shape": shape, "allocator": name, "live_mib": mib, "fork_ms": ms,
                             "s_per_gib": ms / 1000 / (mib / 1024)})
        line = "  ".join(f"{r['allocator']} {r['fork_ms']:.1f} ms" for r in rows
                         if r["shape"] == shape)
        print(f"fork ({shape}, {mib} MiB): {line}", flush=True)
    # One fork of a big heap: what fork() itself costs before it returns.
    big = 512 if quick else 4096
    single = []
    for name, extra in configs:
        if name in ("mimalloc", "mnemosyne-host"):
            continue
        p = subprocess.run([binary, str(big), "1", "large"], env={**base_env, **extra},
                           capture_output=True, text=True)
        m = re.search(r"fork\(\) ([0-9.]+) ms", p.stdout)
        if p.returncode != 0 or not m:
            print(f"bench: fork_cost {big} MiB under {name} failed: {p.stderr[-300:]}")
            continue
        single.append({"allocator": name, "live_mib": big, "fork_ms": float(m.group(1))})
    print("fork (one, %d MiB): %s" % (big, "  ".join(f"{r['allocator']} {r['fork_ms']:.0f} ms"
                                                     for r in single)), flush=True)
    return {"calls": rows, "single": single, "workers": fork_workers(configs, base_env, quick),
            "signals": fork_signals(configs, base_env, build),
            "redis": fork_redis(configs, base_env, quick),
            "dataloader": fork_dataloader(configs, base_env, quick)}


def pinned_config(allocs, lib):
    """mnemosyne on `pinned` over the double: the unified row's settings
    with the backend changed."""
    unified = next(extra for name, extra in allocs if name == "mnemosyne-unified")
    return ("mnemosyne-pinned", {**unified, "LD_PRELOAD": lib, "MNEMOSYNE_BACKEND": "pinned"})


def fork_configs(configs):
    """glibc and the CUDA backends: the others fork as glibc does."""
    return [(name, extra) for name, extra in configs if name not in ("mimalloc", "mnemosyne-host")]


def fork_signals(configs, base_env, build):
    """glibc's tst-mallocfork2 and tst-mallocfork3 shapes (tests/e2e's
    fork_race_probe: forks from signal handlers while the program allocates;
    with threads and _Fork in the second): the whole run's time."""
    probe = os.path.join(build, "tests", "e2e", "fork_race_probe")
    rows = []
    if not os.path.exists(probe):
        print("bench: no fork_race_probe (build the tests); the signal cases are left out")
        return rows
    for mode in ("signal-fork", "signal-threads"):
        for name, extra in fork_configs(configs):
            t = time.monotonic()
            p = subprocess.run([probe, mode], env={**base_env, **extra}, capture_output=True,
                               text=True, timeout=600)
            if p.returncode != 0:
                print(f"bench: fork_race_probe {mode} under {name} failed: {p.stderr[-300:]}")
                continue
            rows.append({"shape": mode, "allocator": name, "run_s": time.monotonic() - t})
        print(f"fork {mode}: " + "  ".join(f"{r['allocator']} {r['run_s']:.2f} s" for r in rows
                                          if r["shape"] == mode), flush=True)
    return rows


def json_run(argv, env, ok_key, what, timeout=1800):
    """Runs a benchmark script that prints one line of JSON; its result, or
    None (with what it printed) when it failed or its `ok_key` is false."""
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    try:
        r = json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        r = {}
    if p.returncode != 0 or not r.get(ok_key):
        print(f"bench: {what} failed: {p.stderr[-300:]} {p.stdout[-300:]}")
        return None
    return r


def fork_redis(configs, base_env, quick):
    """redis-server's BGSAVE over a heap of small objects while a client
    writes (bench/fork_redis.py). Plain is Redis as Debian ships it, on its
    own jemalloc."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fork_redis.py")
    if shutil.which("redis-server") is None:
        print("bench: no redis-server; the Redis case is left out")
        return []
    mib = 128 if quick else 2048
    rows = []
    for name, extra in fork_configs(configs):
        label = "redis (jemalloc)" if name == "glibc" else name
        r = json_run([sys.executable, script, "--mib", str(mib)] +
                     [f"--env={k}={v}" for k, v in extra.items()], base_env, "rdb_ok",
                     f"fork_redis under {name}")
        if r is not None:
            rows.append({"allocator": label, **r})
    print(f"fork redis ({mib} MiB): " + "  ".join(
        f"{r['allocator']} fork {r['fork_ms']:.0f} ms, {r['lost_mib']} MiB" for r in rows),
        flush=True)
    return rows


def fork_dataloader(configs, base_env, quick):
    """A PyTorch DataLoader's workers over an in-memory dataset
    (bench/fork_dataloader.py); left out where PyTorch is not installed."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fork_dataloader.py")
    if subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode:
        print("bench: no PyTorch (python3-torch); the DataLoader case is left out")
        return []
    mib = 64 if quick else 500
    rows = []
    for name, extra in fork_configs(configs):
        r = json_run([sys.executable, script, "--mib", str(mib), "--workers", "4"],
                     {**base_env, **extra}, "ok", f"fork_dataloader under {name}")
        if r is not None:
            rows.append({"allocator": name, **r})
    print(f"fork dataloader ({mib} MiB): " + "  ".join(
        f"{r['allocator']} {r['first_batch_s']:.2f} s" for r in rows), flush=True)
    return rows


def fork_workers(configs, base_env, quick):
    """A pool of workers forked from a big heap (bench/fork_workers.py): the
    time of the fork() calls together, and the memory the machine loses
    while the workers live. One run each: a run takes tens of seconds."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fork_workers.py")
    mib, workers = (256, 4) if quick else (1600, 8)
    rows = []
    for name, extra in configs:
        if name in ("mimalloc", "mnemosyne-host"):
            continue  # the kernel's copy-on-write, as glibc's
        r = json_run([sys.executable, script, "--mib", str(mib), "--workers", str(workers)],
                     {**base_env, **extra}, "ok", f"fork_workers under {name}", timeout=900)
        if r is not None:
            rows.append({"allocator": name, **r})
    line = "  ".join(f"{r['allocator']} {r['forks_s']:.2f} s, {r['lost_mib']} MiB" for r in rows)
    print(f"fork workers ({workers} of {mib} MiB): {line}", flush=True)
    return rows


# Children that run a command or exit (issue 47): the language cases of
# bench/fork_exec.py at one heap size (1 GiB), the C program's children
# (bench/fork_cost) at two (1 and 4 GiB).
FORK_EXEC_LANG = ["python-execv", "python-preexec", "python-exit", "perl-system", "node-execsync"]
FORK_EXEC_C = ["exec", "exit", "read1"]


def fork_exec(allocs, base_env, build, quick):
    """Each case under glibc, `unified` and `pinned`: the first child of a
    series (cold: no image to share) and the median of the others (warm),
    from the call to the child's end, and the heap each child cost a copy of
    (mnemosyne's fork_bytes_copied over the children)."""
    lib = os.path.join(build, "interpose", "libmnemosyne.so")
    configs = [(name, extra) for name, extra in allocs if name in ("glibc", "mnemosyne-unified")]
    configs.append(pinned_config(allocs, lib))
    # The same two with children that pull their heap (MNEMOSYNE_FORK_PULL_MS,
    # docs/fork.md), where this user may use userfaultfd.
    configs += [(name + "-pull", {**extra, "MNEMOSYNE_FORK_PULL_MS": "100"})
                for name, extra in configs if name != "glibc"]
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fork_exec.py")
    binary = os.path.join(build, "bench", "fork_cost")
    stats_dir = tempfile.mkdtemp(prefix="mnemosyne-fork-exec-")
    rows = []

    def copied_mib(name, pid, children):
        path = os.path.join(stats_dir, f"{pid}.json")
        if name == "glibc" or not os.path.exists(path):
            return ""
        with open(path) as f:
            return json.load(f).get("fork_bytes_copied", 0) / children / (1 << 20)

    cases = []
    lang_mib, count = (64, 3) if quick else (1024, 5)
    for case in FORK_EXEC_LANG:
        tool = {"perl": "perl", "node": "node"}.get(case.split("-")[0])
        if tool and shutil.which(tool) is None:
            print(f"bench: no {tool}; the {case} case is left out")
            continue
        cases.append((case, lang_mib, count, [sys.executable, script, case, "--mib",
                                              str(lang_mib), "--count", str(count)]))
    for mib in ((64,) if quick else (1024, 4096)):
        n = count if mib <= 1024 else 3
        for child in FORK_EXEC_C:
            cases.append((f"c-{child}", mib, n, [binary, str(mib), str(n), "large", child]))
    for case, mib, n, argv in cases:
        for name, extra in configs:
            env = {**base_env, **extra}
            if name != "glibc":
                env["MNEMOSYNE_STATS_FILE"] = os.path.join(stats_dir, "%p.json")
            what = f"fork-exec {case} ({mib} MiB) under {name}"
            if argv[0] == binary:
                # Its pid names its statistics file.
                p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
                out, err = p.communicate(timeout=1800)
                m = re.search(r"first fork\(\) [0-9.]+ ms, to its end ([0-9.]+) ms; the other "
                              r"[0-9]+: fork\(\) [0-9.]+ ms, to the end ([0-9.]+) ms", out)
                r = None
                if m and p.returncode == 0:
                    r = {"first_ms": float(m.group(1)), "rest_ms": float(m.group(2)),
                         "pid": p.pid}
                else:
                    print(f"bench: {what} failed: {err[-300:]}")
            else:  # the script prints its pid
                r = json_run(argv, env, "ok", what)
            if r is None:
                continue
            rows.append({"case": case, "heap_mib": mib, "allocator": name, "children": n,
                         "first_ms": r["first_ms"], "rest_ms": r["rest_ms"],
                         "copied_mib_per_child": copied_mib(name, r["pid"], n)})
        print(f"fork-exec {case} ({mib} MiB): " + "  ".join(
            f"{x['allocator']} {x['first_ms']:.0f}/{x['rest_ms']:.0f} ms" for x in rows
            if x["case"] == case and x["heap_mib"] == mib), flush=True)
    shutil.rmtree(stats_dir, ignore_errors=True)
    return rows


def fork_exec_section(rows):
    """The table, each cell first/warm ms and its ratio to glibc's, and the
    copy per child; the issue's targets under it."""
    if not rows:
        return []
    md = ["## Children that run a command or exit (issue 47)", "",
          "Each parent holds its heap in 1 MiB pieces (the C program: 64 KiB blocks), each "
          "written, and starts its children one after the other; each child runs /bin/true "
          "(`exit`, `python-exit`: exits at once; `read1`: reads 1% of the blocks, then exits). "
          "Cells: the first child (cold: no image of an earlier fork to share) / the median of "
          "the others (warm), from the call to the child's end, in ms, with the ratio to "
          "glibc's; then the heap copied per child (`fork_bytes_copied` over the children). "
          "Targets (issue 47): within 1.2x glibc's time, cold and warm, at most 1 MiB copied "
          "per child; `read1`: at most 2% of the heap plus mimalloc's metadata. The `+pull` "
          "columns: `MNEMOSYNE_FORK_PULL_MS=100` (children take the pages they touch; a "
          "parent with threads of its own, Node's, copies as without it).", "",
          "| case | heap | glibc | `unified` | copied | `pinned` | copied | `unified+pull` | "
          "copied | `pinned+pull` | copied |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = []
    for r in rows:
        if (r["case"], r["heap_mib"]) not in keys:
            keys.append((r["case"], r["heap_mib"]))
    for case, mib in keys:
        got = {r["allocator"]: r for r in rows if r["case"] == case and r["heap_mib"] == mib}
        base = got.get("glibc")

        def cell(name):
            r = got.get(name)
            if r is None:
                return "-"
            text = f"{r['first_ms']:.0f} / {r['rest_ms']:.0f}"
            if base and name != "glibc" and base["first_ms"] > 0 and base["rest_ms"] > 0:
                text += (f" ({r['first_ms'] / base['first_ms']:.1f}x / "
                         f"{r['rest_ms'] / base['rest_ms']:.1f}x)")
            return text

        def copied(name):
            r = got.get(name)
            if not r or r["copied_mib_per_child"] == "":
                return "-"
            mib = r["copied_mib_per_child"]
            return f"{mib:.0f} MiB" if mib >= 10 else f"{mib:.2f} MiB"
        md.append(f"| {case} | {mib} MiB | {cell('glibc')} | " + " | ".join(
            f"{cell(n)} | {copied(n)}" for n in ("mnemosyne-unified", "mnemosyne-pinned",
                                                  "mnemosyne-unified-pull",
                                                  "mnemosyne-pinned-pull")) + " |")
    return md + [""]


def write_fork_exec(out, rows, quick):
    with open(os.path.join(out, "fork_exec.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["case", "heap_mib", "allocator", "children", "first_ms",
                                          "rest_ms", "copied_mib_per_child"])
        w.writeheader()
        for r in rows:
            w.writerow({**r, "first_ms": f"{r['first_ms']:.2f}", "rest_ms": f"{r['rest_ms']:.2f}",
                        "copied_mib_per_child": (f"{r['copied_mib_per_child']:.2f}"
                                                 if r["copied_mib_per_child"] != "" else "")})
    with open(os.path.join(out, "fork_exec.md"), "w") as f:
        f.write(f"# Forks whose children run a command or exit, "
                f"{datetime.date.today().isoformat()}\n\nMachine: {machine_line()}."
                f"{' Quick run (small heaps).' if quick else ''}\n\n" +
                "\n".join(fork_exec_section(rows)[2:]))


def instructions(argv, env):
    """Instructions of the whole process, counted by callgrind."""
    p = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"] + argv,
                       env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    m = re.search(r"Collected : (\d+)", p.stderr)
    return int(m.group(1)) if m and p.returncode == 0 else None


# The fast path: churn-bare (bench/workloads.cpp) counted at two scales, the
# difference divided by the pairs between them, so that start-up (the
# library's, the driver's) is left out and a change of a few instructions
# per malloc+free shows as itself. Scales: pairs = 2,000,000 x scale.
FAST_PATH_SCALES = (1.0, 3.0)
FAST_PATH_QUICK_SCALES = (0.25, 0.75)


def fast_path(allocs, base_env, binary, quick):
    """Instructions per malloc+free pair, start-up apart, per allocator."""
    low, high = FAST_PATH_QUICK_SCALES if quick else FAST_PATH_SCALES
    pairs = 2_000_000 * (high - low)
    rows = []
    for alloc, extra in allocs:
        if alloc == "naive":
            continue  # a driver call per malloc: not a fast path
        env = {**base_env, **extra}
        a = instructions([binary, "churn-bare", f"{low:g}"], env)
        b = instructions([binary, "churn-bare", f"{high:g}"], env)
        if a is None or b is None:
            print(f"bench: fast path under {alloc}: callgrind failed", flush=True)
            continue
        rows.append({"allocator": alloc, "per_pair": (b - a) / pairs})
    base = next((r["per_pair"] for r in rows if r["allocator"] == "mimalloc"), None)
    for r in rows:
        r["ratio"] = r["per_pair"] / base if base else None
    print("fast path: " + "  ".join(f"{r['allocator']} {r['per_pair']:.1f}" for r in rows), flush=True)
    return rows


def fast_path_section(rows):
    if not rows:
        return []
    md = ["## Fast path (callgrind): instructions per malloc+free pair", "",
          "churn-bare (1,024 live blocks of 8 to 1,023 bytes, one byte written to each), "
          "counted at two scales; the difference over the pairs between them, so that "
          "start-up is left out. The loop's own instructions are in every row.", "",
          "| allocator | per pair | ratio to mimalloc |", "|---|---|---|"]
    for r in rows:
        ratio = f"{r['ratio']:.3f}x" if r["ratio"] else "-"
        md.append(f"| {r['allocator']} | {r['per_pair']:.1f} | {ratio} |")
    return md + [""]


# The Windows table: workload, scale, quick scale. What the injected DLL's
# fast path costs, measured under wine (no tool here counts a Windows
# program's instructions: valgrind does not run wine, and this machine's
# virtual CPU has no counters for perf).
WINDOWS_WORKLOADS = [
    ("churn", 2.0, 0.3),
    ("malloc-simple", 1.0, 0.2),
    ("realloc-chains", 1.0, 0.2),
    ("malloc-thread", 0.5, 0.1),
    ("larson", 0.5, 0.1),
]


def windows_table(build_win, runs, quick):
    """The workloads under wine, three ways: workloads.exe on the C runtime's
    heap (msvcrt, wine's HeapAlloc), workloads-mimalloc.exe on mnemosyne's
    private mimalloc linked in, and workloads.exe with mnemosyne.dll
    injected (host backend, and unified over the test double). The time is
    the workload's own clock (work_ms), so wine's start is not in it; the
    median of `runs` interleaved runs."""
    exe = os.path.join(build_win, "bench", "workloads.exe")
    exe_mi = os.path.join(build_win, "bench", "workloads-mimalloc.exe")
    injector = os.path.join(build_win, "interpose", "windows", "mnemosyne-inject.exe")
    fake = os.path.join(build_win, "tests", "fakecuda", "fakecuda.dll")
    missing = [p for p in (exe, exe_mi, injector, fake) if not os.path.exists(p)]
    if missing or shutil.which("wine") is None:
        print(f"bench: no windows table (missing {missing or ['wine']})", flush=True)
        return None
    def winpath(path):  # as wine's Z: drive names it
        return "Z:" + path.replace("/", "\\")

    exe, exe_mi, injector, fake = (winpath(p) for p in (exe, exe_mi, injector, fake))
    env = {**os.environ, "WINEPREFIX": os.path.join(build_win, "wine-bench"), "WINEDEBUG": "-all"}
    env = {k: v for k, v in env.items() if not k.startswith(("MNEMOSYNE_", "FAKECUDA_", "MIMALLOC_"))}
    if not os.path.isdir(env["WINEPREFIX"]):
        subprocess.run(["wineboot", "-i"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # One wineserver for the whole table: started per program, it exits
    # between them and a program may lose its connection.
    subprocess.run(["wineserver", "-p"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run(["wineboot"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    configs = [
        ("runtime heap", lambda w, sc: [exe, w, sc]),
        ("mimalloc (private build)", lambda w, sc: [exe_mi, w, sc]),
        ("mnemosyne-host", lambda w, sc: [injector, "--backend=host", "--", exe, w, sc]),
        ("mnemosyne-unified", lambda w, sc: [injector, "--backend=unified",
                                             "--cuda-driver=" + fake, "--", exe, w, sc]),
    ]
    # The double's simulated driver threads off, as in the Linux table: its
    # internal thread mallocs blocks of up to 32 MiB and writes every page
    # of them through the first ~100 ms, inside the workload's clock, which
    # no real driver does (with it, unified's malloc-simple read 1.26x
    # mimalloc on 2026-12-05 instead of 1.08x).
    quiet_double = {"FAKECUDA_THREAD_ITERS": "0", "FAKECUDA_EVENT_THREAD": "0"}
    env_of = {"mnemosyne-unified": {**env, **quiet_double}}
    # Wall times under wine move more than natively: 7 runs at least (3
    # left the DLL's ratio on malloc-simple anywhere from 1.05x to 1.40x).
    n = runs if quick else max(runs, 7)
    rows = []
    try:
        for name, full, quick_scale in WINDOWS_WORKLOADS:
            scale = f"{quick_scale if quick else full:g}"
            got = {c: [] for c, _ in configs}
            for _ in range(n):
                for c, argv_of in configs:
                    why = ""
                    for _attempt in range(2):  # once more if wine lost its server
                        # stderr to a file, not a pipe: the services wine
                        # starts with a program inherit its handles and
                        # outlive it, so a pipe would not reach its end.
                        with tempfile.TemporaryFile() as err:
                            try:
                                p = subprocess.run(["wine"] + argv_of(name, scale),
                                                   env=env_of.get(c, env),
                                                   stdout=subprocess.DEVNULL, stderr=err,
                                                   timeout=300)
                            except subprocess.TimeoutExpired:
                                why = "no answer in 300 s"
                                continue
                            err.seek(0)
                            text = err.read()
                        m = re.search(rb"work_ms=([0-9.]+)", text)
                        if p.returncode == 0 and m:
                            got[c].append(float(m.group(1)))
                            break
                        why = f"rc={p.returncode}: {text.decode(errors='replace')[-300:]}"
                    else:
                        print(f"bench: windows {name} under {c} failed ({why})", flush=True)
            base = statistics.median(got[configs[1][0]]) if got[configs[1][0]] else None
            for c, _ in configs:
                if got[c]:
                    ms = statistics.median(got[c])
                    rows.append({"workload": name, "allocator": c, "scale": scale, "work_ms": ms,
                                 "ratio": ms / base if base else None})
            print(f"windows {name}: " + "  ".join(f"{r['allocator']} {r['work_ms']:.1f} ms"
                                                 for r in rows if r["workload"] == name),
                  flush=True)
    finally:
        subprocess.run(["wineserver", "-k"], env=env, capture_output=True)
    return rows, n


def windows_section(windows):
    rows, n = windows
    allocs = list(dict.fromkeys(r["allocator"] for r in rows))
    md = ["## Windows (mnemosyne.dll injected, under wine)", "",
          f"Work time of each workload by its own clock (wine's start excluded), median of {n} "
          "interleaved runs; ratio to the same private mimalloc linked into the program; "
          "`unified` over the test double with its simulated driver threads off, as in the "
          "Linux tables. "
          "No instruction counts: valgrind does not run wine and this machine's virtual CPU "
          "has no counters.", "",
          "| workload | " + " | ".join(allocs) + " |", "|---|" + "---|" * len(allocs)]
    for name in dict.fromkeys(r["workload"] for r in rows):
        cells = []
        for a in allocs:
            r = next((r for r in rows if r["workload"] == name and r["allocator"] == a), None)
            cells.append("-" if r is None else
                         f"{r['work_ms']:.1f} ms" + (f" ({r['ratio']:.2f}x)" if r["ratio"] else ""))
        md.append(f"| {name} | " + " | ".join(cells) + " |")
    return md + [""]


def machine_line():
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{platform.node()}: {os.cpu_count()} cores, {cpu}, {platform.release()}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true",
                    help="one run each at a small scale, callgrind for churn only: a smoke run")
    ap.add_argument("--runs", type=int, default=0, help="repetitions (default 3, quick 1)")
    ap.add_argument("--only", default="", help="comma-separated workloads")
    ap.add_argument("--windows-build", default="",
                    help="the mingw build (build-win): adds the windows table, run under wine")
    a = ap.parse_args()
    runs = a.runs or (1 if a.quick else 3)
    build = os.path.abspath(a.build)
    fake = os.path.join(build, "tests", "fakecuda", "libfakecuda.so")
    binary = os.path.join(build, "bench", "workloads")
    missing = [p for p in list(PEERS.values()) + [fake, binary, "/usr/bin/time"]
               if not os.path.exists(p)]
    if missing:
        print(f"bench: missing {missing} (scripts/setup.sh installs the peers; build first)")
        return 1
    work = tempfile.mkdtemp(prefix="mnemosyne-bench-")
    allocs, log = allocators(build, fake, work)
    base_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("MNEMOSYNE_", "FAKECUDA_", "LD_PRELOAD", "MIMALLOC_"))}
    base_env["LC_ALL"] = "C"

    cases = []  # (name, argv builder(share), single-threaded)
    for name, arg, full, quick_scale, st in WORKLOADS:
        scale = quick_scale if a.quick else full
        cases.append((name, (lambda share, arg=arg, scale=scale:
                             [binary, arg, f"{scale * share:g}"]), st, True))
    for name, argv in programs(work, a.quick):
        cases.append((name, (lambda share, argv=argv: argv), False, False))
    if a.only:
        cases = [c for c in cases if c[0] in a.only.split(",")]

    rows = []
    failures = 0
    started = time.monotonic()
    for name, argv_of, st, scalable in cases:
        samples = {alloc: [] for alloc, _ in allocs}
        for _ in range(runs):
            for alloc, extra in allocs:
                if alloc == "naive" and not scalable:
                    continue  # a real program cannot run a share of its work
                share = NAIVE_SHARE if alloc == "naive" else 1.0
                env = {**base_env, **extra}
                wall, cpu, rss, rc, err, calls = run_measured(argv_of(share), env, log, work)
                if rc != 0:
                    failures += 1
                    print(f"bench: {name} under {alloc} failed (rc={rc}): "
                          f"{err.decode(errors='replace')[-300:]}", flush=True)
                    continue
                m = re.search(rb"call_ms=([0-9.]+)", err)  # a workload that times its call
                call_ms = float(m.group(1)) if m else None
                samples[alloc].append((wall / share, cpu / share, rss, calls, call_ms))
        for alloc, extra in allocs:
            got = samples[alloc]
            if not got:
                continue
            row = {"workload": name, "allocator": alloc, "runs": len(got),
                   "wall_s": statistics.median(g[0] for g in got),
                   "cpu_s": statistics.median(g[1] for g in got),
                   "peak_rss_kib": int(statistics.median(g[2] for g in got)),
                   "driver_allocations": int(statistics.median(g[3] for g in got)),
                   "instructions": "",
                   "call_ms": (statistics.median(g[4] for g in got)
                               if all(g[4] is not None for g in got) else "")}
            row["instructions_stats"] = ""
            if st and (not a.quick or name == "churn") and alloc != "naive":
                count = instructions(argv_of(1.0), {**base_env, **extra})
                row["instructions"] = count if count is not None else ""
                if alloc == "mnemosyne-host":
                    # Statistics on (MNEMOSYNE_STATS_FILE): what counting costs.
                    stats = {"MNEMOSYNE_STATS_FILE": os.path.join(work, "stats-%p.json")}
                    count = instructions(argv_of(1.0), {**base_env, **extra, **stats})
                    row["instructions_stats"] = count if count is not None else ""
            rows.append(row)
        line = "  ".join(f"{r['allocator']} {r['wall_s']:.3f}s" for r in rows if r["workload"] == name)
        print(f"{name}: {line}", flush=True)
    fast = None
    if not a.only or "fast-path" in a.only.split(","):
        fast = fast_path(allocs, base_env, binary, a.quick)
    starts = None
    if not a.only or "startup" in a.only.split(","):
        starts = startup(allocs, base_env, build, fake, runs, a.quick)
    forks = None
    if not a.only or "fork" in a.only.split(","):
        forks = fork_costs(allocs, base_env, build, runs, a.quick)
    execs = None
    if not a.only or "fork-exec" in a.only.split(","):
        execs = fork_exec(allocs, base_env, build, a.quick)
    windows = None
    if a.windows_build and (not a.only or "windows" in a.only.split(",")):
        windows = windows_table(os.path.abspath(a.windows_build), runs, a.quick)
    elapsed = time.monotonic() - started
    shutil.rmtree(work, ignore_errors=True)
    write_results(a.out, rows, runs, a.quick, elapsed, starts, forks, windows, fast, execs)
    if failures:
        print(f"bench: {failures} run(s) failed (above); their rows are missing")
    return 1 if failures else 0


def ratio(rows, name, alloc, key):
    mine = [r for r in rows if r["workload"] == name and r["allocator"] == alloc]
    base = [r for r in rows if r["workload"] == name and r["allocator"] == "mimalloc"]
    if not mine or not base or mine[0][key] in ("", 0) or base[0][key] in ("", 0):
        return None
    return float(mine[0][key]) / float(base[0][key])


def fork_section(forks):
    """The fork tables, in Markdown lines; also written alone to fork.md."""
    calls = forks["calls"]
    md = ["## fork() with a live heap", "",
          f"bench/fork_cost: median time of the fork() call in the parent, {calls[0]['live_mib']} "
          "MiB of live heap: 64 KiB blocks (large) or 16-256 byte objects with holes (small); "
          "the forks follow each other, so from the second on a CUDA backend's child shares the "
          "first one's image of the heap.", "",
          "| heap | allocator | fork() | per GiB of live heap |", "|---|---|---|---|"]
    for r in calls:
        md.append(f"| {r['shape']} | {r['allocator']} | {r['fork_ms']:.1f} ms | "
                  f"{r['s_per_gib']:.3f} s |")
    workers = forks["workers"]
    if workers:
        w = workers[0]
        md += ["", "## Forked workers over a big heap", "",
               f"bench/fork_workers.py: a Python parent holding {w['heap_mib']} MiB (8 MiB "
               f"buffers and short strings) forks {w['workers']} workers one after the other; each "
               "reads the whole heap and stays alive until the parent has measured. One run.", "",
               "| allocator | the fork() calls | slowest fork | memory the machine loses while "
               "they live |", "|---|---|---|---|"]
        for r in workers:
            md.append(f"| {r['allocator']} | {r['forks_s']:.2f} s | {max(r['each_s']):.2f} s | "
                      f"{r['lost_mib']:,} MiB |")
    single = forks.get("single") or []
    if single:
        md += ["", "## One fork of a big heap", "",
               f"bench/fork_cost: one fork() with {single[0]['live_mib']:,} MiB of live heap "
               "(64 KiB blocks): the call itself, before it returns.", "",
               "| allocator | fork() |", "|---|---|"]
        md += [f"| {r['allocator']} | {r['fork_ms']:,.0f} ms |" for r in single]
    signals = forks.get("signals") or []
    if signals:
        md += ["", "## Forks from signal handlers", "",
               "tests/e2e's fork_race_probe: signal-fork is glibc's tst-mallocfork2 shape (forks "
               "from a SIGUSR1 handler while the program mallocs, frees and forks), "
               "signal-threads tst-mallocfork3's (sender threads, _Fork in the handler, a second "
               "thread forking); children check the heap. The whole run.", "",
               "| shape | allocator | run |", "|---|---|---|"]
        md += [f"| {r['shape']} | {r['allocator']} | {r['run_s']:.2f} s |" for r in signals]
    redis = forks.get("redis") or []
    if redis:
        md += ["", "## Redis BGSAVE", "",
               f"bench/fork_redis.py: redis-server (Debian's) holding {redis[0]['used_mib']:,} "
               f"MiB ({redis[0]['keys']:,} keys of 100-byte values) saves with BGSAVE while a "
               "client keeps overwriting keys; redis-check-rdb reads every key back from the "
               "child's file. Redis (jemalloc) is the server as Debian ships it.", "",
               "| allocator | fork (latest_fork_usec) | longest wait for a SET reply | BGSAVE | "
               "memory lost during it |", "|---|---|---|---|---|"]
        md += [f"| {r['allocator']} | {r['fork_ms']:,.0f} ms | {r['worst_ms']:,.0f} ms | "
               f"{r['save_s']:.1f} s | {r['lost_mib']:,} MiB |" for r in redis]
    loader = forks.get("dataloader") or []
    if loader:
        md += ["", "## PyTorch DataLoader", "",
               f"bench/fork_dataloader.py: a {loader[0]['dataset_mib']} MiB dataset of 64 KiB "
               f"NumPy samples held in memory, DataLoader with {loader[0]['workers']} forked "
               "workers; each sample's checksum checked in the parent.", "",
               "| allocator | to the first batch | one epoch | memory lost at the first batch |",
               "|---|---|---|---|"]
        md += [f"| {r['allocator']} | {r['first_batch_s']:.2f} s | {r['epoch_s']:.2f} s | "
               f"{r['lost_mib']:,} MiB |" for r in loader]
    md += targets_section(forks)
    return md + [""]


def targets_section(forks):
    """Issue 36's targets against this run's figures, per CUDA backend."""
    backends = ("mnemosyne-unified", "mnemosyne-pinned")
    rows = []

    def by(table, key="allocator"):
        return {r[key]: r for r in forks.get(table) or []}

    w = by("workers")
    if "glibc" in w:
        g = w["glibc"]
        heap_gib = g["heap_mib"] / 1024
        goal_s = 3 * g["forks_s"] + 0.3 * heap_gib
        goal_mib = g["heap_mib"] + 2 * g["lost_mib"] + 256
        rows.append((f"{g['workers']} workers of {g['heap_mib']:,} MiB: the forks",
                     f"3x glibc + 0.3 s/GiB = {goal_s:.2f} s", f"{g['forks_s']:.2f} s",
                     [(w[b]["forks_s"], f"{w[b]['forks_s']:.2f} s") if b in w else None
                      for b in backends], goal_s))
        rows.append((f"{g['workers']} workers: memory lost",
                     f"a heap + 2x glibc + 256 MiB = {goal_mib:,} MiB", f"{g['lost_mib']:,} MiB",
                     [(w[b]["lost_mib"], f"{w[b]['lost_mib']:,} MiB") if b in w else None
                      for b in backends], goal_mib))
    d = by("dataloader")
    if "glibc" in d:
        goal = 1.3 * d["glibc"]["first_batch_s"]
        rows.append(("DataLoader: to the first batch", f"1.3x glibc = {goal:.2f} s",
                     f"{d['glibc']['first_batch_s']:.2f} s",
                     [(d[b]["first_batch_s"], f"{d[b]['first_batch_s']:.2f} s") if b in d else None
                      for b in backends], goal))
    sig = {(r["shape"], r["allocator"]): r for r in forks.get("signals") or []}
    for shape, name in (("signal-fork", "tst-mallocfork2"), ("signal-threads", "tst-mallocfork3")):
        if (shape, "glibc") in sig:
            base = sig[(shape, "glibc")]["run_s"]
            rows.append((f"{name}'s shape: the run", f"2x glibc = {2 * base:.2f} s", f"{base:.2f} s",
                         [(sig[(shape, b)]["run_s"], f"{sig[(shape, b)]['run_s']:.2f} s")
                          if (shape, b) in sig else None for b in backends], 2 * base))
    one = by("single")
    if "glibc" in one:
        goal = one["glibc"]["fork_ms"] + 50
        rows.append((f"one fork of {one['glibc']['live_mib']:,} MiB: fork()",
                     f"glibc + 50 ms = {goal:,.0f} ms", f"{one['glibc']['fork_ms']:,.0f} ms",
                     [(one[b]["fork_ms"], f"{one[b]['fork_ms']:,.0f} ms") if b in one else None
                      for b in backends], goal))
    r = by("redis")
    plain = r.get("redis (jemalloc)")
    if plain:
        # A fork of a few ms: its double is noise; the floor is 2x plain's or 50 ms.
        goal = max(2 * plain["fork_ms"], 50)
        rows.append(("Redis BGSAVE: the parent's stall (fork)", f"2x plain = {goal:,.0f} ms",
                     f"{plain['fork_ms']:,.0f} ms",
                     [(r[b]["fork_ms"], f"{r[b]['fork_ms']:,.0f} ms") if b in r else None
                      for b in backends], goal))
        total = plain["used_mib"] + plain["lost_mib"]
        rows.append(("Redis BGSAVE: the heap and memory lost during the save",
                     f"2x plain = {2 * total:,} MiB", f"{total:,} MiB",
                     [(r[b]["used_mib"] + r[b]["lost_mib"],
                       f"{r[b]['used_mib'] + r[b]['lost_mib']:,} MiB") if b in r else None
                      for b in backends], 2 * total))
    if not rows:
        return []
    md = ["", "## Issue 36's targets", "",
          "Each target as the issue sets it, from this run's glibc (or plain) figure; "
          "'met' when the figure is at or under the goal.", "",
          "| case | goal | glibc | unified | pinned |", "|---|---|---|---|---|"]
    for case, goal_text, base_text, cells, goal in rows:
        shown = []
        for c in cells:
            shown.append("-" if c is None else f"{c[1]} ({'met' if c[0] <= goal else 'missed'})")
        md.append(f"| {case} | {goal_text} | {base_text} | {shown[0]} | {shown[1]} |")
    return md


def write_forks(out, forks, runs):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "fork.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["shape", "allocator", "live_mib", "fork_ms", "s_per_gib"])
        w.writeheader()
        for r in forks["calls"]:
            w.writerow({**r, "fork_ms": f"{r['fork_ms']:.2f}", "s_per_gib": f"{r['s_per_gib']:.4f}"})
    today = datetime.date.today().isoformat()
    head = [f"# fork() cost, {today}", "",
            f"Machine: {machine_line()}. Median of {runs} interleaved runs of 5 forks each "
            "(fork_cost).", ""]
    with open(os.path.join(out, "fork.md"), "w") as f:
        f.write("\n".join(head + fork_section(forks)))


def write_windows(out, windows, quick):
    """windows.csv and windows.md; and where only this table ran (--only
    windows), its section of an earlier results.md, replaced in place."""
    with open(os.path.join(out, "windows.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["workload", "allocator", "scale", "work_ms", "ratio"])
        w.writeheader()
        for r in windows[0]:
            w.writerow({**r, "work_ms": f"{r['work_ms']:.2f}",
                        "ratio": "" if r["ratio"] is None else f"{r['ratio']:.3f}"})
    today = datetime.date.today().isoformat()
    section = windows_section(windows)  # heading, "", text, "", table
    with open(os.path.join(out, "windows.md"), "w") as f:
        f.write("\n".join([f"# mnemosyne.dll under wine, {today}", "",
                           f"Machine: {machine_line()}.{' Quick run.' if quick else ''}", ""]
                          + section[2:]))
    results = os.path.join(out, "results.md")
    head = section[0]
    if os.path.exists(results):
        with open(results) as f:
            text = f.read()
        if head in text:
            start = text.index(head)
            end = text.find("\n## ", start + len(head))
            dated = section[:2] + [f"Measured {today} by `--only windows`, apart from the rest "
                                   "of this file.", ""] + section[2:]
            text = text[:start] + "\n".join(dated) + (text[end:] if end >= 0 else "")
            with open(results, "w") as f:
                f.write(text)


def write_results(out, rows, runs, quick, elapsed, starts, forks, windows, fast=None,
                  execs=None):
    os.makedirs(out, exist_ok=True)
    if forks:
        write_forks(out, forks, runs)
    if windows:
        write_windows(out, windows, quick)
    if fast:
        with open(os.path.join(out, "fastpath.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["allocator", "per_pair", "ratio"])
            w.writeheader()
            for r in fast:
                w.writerow({"allocator": r["allocator"], "per_pair": f"{r['per_pair']:.2f}",
                            "ratio": f"{r['ratio']:.4f}" if r["ratio"] else ""})
        with open(os.path.join(out, "fastpath.md"), "w") as f:
            f.write(f"# Fast path, {datetime.date.today().isoformat()}\n\nMachine: {machine_line()}."
                    f"{' Quick run (small scales).' if quick else ''}\n\n" +
                    "\n".join(fast_path_section(fast)[2:]))
    if execs:
        write_fork_exec(out, execs, quick)
    if not rows:  # only the fork, fast-path or windows section was asked for (--only)
        md = ((fast_path_section(fast) if fast else []) + (fork_section(forks) if forks else []) +
              (fork_exec_section(execs) if execs else []) +
              (windows_section(windows) if windows else []))
        print("\n".join(md) if md else "bench: nothing ran")
        return
    fields = ["workload", "allocator", "runs", "wall_s", "cpu_s", "peak_rss_kib",
              "driver_allocations", "instructions", "instructions_stats", "call_ms"]
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({**r, "wall_s": f"{r['wall_s']:.4f}", "cpu_s": f"{r['cpu_s']:.4f}"})
    names = list(dict.fromkeys(r["workload"] for r in rows))
    allocs = list(dict.fromkeys(r["allocator"] for r in rows))
    others = [x for x in allocs if x != "mimalloc"]
    today = datetime.date.today().isoformat()
    md = [f"# Allocators side by side, {today}", "",
          f"Machine: {machine_line()}. {'Quick run (small scale, 1 run)' if quick else f'Median of {runs} interleaved runs'};"
          f" {elapsed / 60:.1f} minutes. Ratios are to Debian's mimalloc 2.0.9 in the same run"
          " (lower is better). The naive interposer ran 1% of each workload; its times are"
          " scaled up.", ""]
    for key, title in [("wall_s", "Wall time"), ("instructions", "Instructions (callgrind)"),
                       ("peak_rss_kib", "Peak RSS")]:
        md += [f"## {title}, ratio to mimalloc", "",
               "| workload | mimalloc | " + " | ".join(others) + " |",
               "|---|---|" + "---|" * len(others)]
        for name in names:
            base = [r for r in rows if r["workload"] == name and r["allocator"] == "mimalloc"]
            if not base or base[0][key] in ("", 0):
                continue
            value = base[0][key]
            shown = (f"{value:.3f} s" if key == "wall_s" else
                     f"{int(value):,}" if key == "instructions" else f"{int(value) / 1024:.0f} MiB")
            cells = []
            for alloc in others:
                rr = ratio(rows, name, alloc, key)
                cells.append("-" if rr is None else f"{rr:.2f}x")
            md.append(f"| {name} | {shown} | " + " | ".join(cells) + " |")
        md.append("")
    geo = []
    for alloc in others:
        rs = [ratio(rows, n, alloc, "wall_s") for n in names]
        rs = [x for x in rs if x]
        if rs:
            geo.append(f"{alloc} {statistics.geometric_mean(rs):.2f}x")
    md += ["Geometric mean of wall-time ratios: " + ", ".join(geo) + ".", ""]
    calls = [r for r in rows if r["allocator"] == "mnemosyne-unified"]
    if calls:
        md += ["Driver allocations (test double) per run, mnemosyne-unified: " +
               ", ".join(f"{r['workload']} {r['driver_allocations']}" for r in calls) + ".", ""]
    md += fast_path_section(fast)
    md += stats_section(rows)
    md += call_section(rows)
    if starts:
        start_rows, n = starts
        md += ["## Start-up: /bin/true", "",
               f"Median per process of {n} spawned in a row; instructions of one (callgrind).", "",
               "| allocator | per process | over glibc | instructions |", "|---|---|---|---|"]
        for r in start_rows:
            count = f"{r['instructions']:,}" if r["instructions"] else "-"
            md.append(f"| {r['allocator']} | {r['ms']:.2f} ms | {r['extra_ms']:+.2f} ms | {count} |")
        md.append("")
        with open(os.path.join(out, "startup.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["allocator", "ms", "extra_ms", "instructions"])
            w.writeheader()
            for r in start_rows:
                w.writerow({**r, "ms": f"{r['ms']:.3f}", "extra_ms": f"{r['extra_ms']:.3f}"})
    if forks:
        md += fork_section(forks)
    if windows:
        md += windows_section(windows)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(md))
    plot(out, rows, names, others, today)
    print("\n".join(md))


def stats_section(rows):
    """What statistics cost: mnemosyne-host's instructions with
    MNEMOSYNE_STATS_FILE set, against the same without."""
    counted = [r for r in rows if r["allocator"] == "mnemosyne-host"
               and r["instructions_stats"] != "" and r["instructions"] not in ("", 0)]
    if not counted:
        return []
    md = ["## Statistics on (callgrind), mnemosyne-host", "",
          "| workload | statistics off | statistics on | ratio |", "|---|---|---|---|"]
    for r in counted:
        md.append(f"| {r['workload']} | {r['instructions']:,} | {r['instructions_stats']:,} | "
                  f"{r['instructions_stats'] / r['instructions']:.2f}x |")
    return md + [""]


def call_section(rows):
    """The workloads that time their one call (calloc-large): that call's
    time and the process's peak RSS, against glibc's (not the naive
    interposer's: it ran a share of the size)."""
    md = []
    timed = [r for r in rows if r["call_ms"] != "" and r["allocator"] != "naive"]
    for name in dict.fromkeys(r["workload"] for r in timed):
        mine = [r for r in timed if r["workload"] == name]
        glibc = next((r for r in mine if r["allocator"] == "glibc"), None)
        md += [f"## {name}: the call itself", "",
               "| allocator | call | ratio to glibc | peak RSS |", "|---|---|---|---|"]
        for r in mine:
            rr = (f"{r['call_ms'] / glibc['call_ms']:.2f}x"
                  if glibc and glibc["call_ms"] > 0 else "-")
            md.append(f"| {r['allocator']} | {r['call_ms']:.3f} ms | {rr} | "
                      f"{r['peak_rss_kib'] / 1024:.0f} MiB |")
        md.append("")
    return md


def plot(out, rows, names, others, today):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench: matplotlib missing (python3-matplotlib): no plot")
        return
    fig, ax = plt.subplots(figsize=(max(8, len(names) * 0.9), 4.8))
    width = 0.8 / max(1, len(others))
    for k, alloc in enumerate(others):
        values = [ratio(rows, n, alloc, "wall_s") or 0 for n in names]
        ax.bar([i + k * width for i in range(len(names))], values, width, label=alloc)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))])
    ax.set_xticklabels(names, rotation=35, ha="right")
    ax.set_ylabel("wall time / mimalloc's (log)")
    ax.set_title(f"Allocators side by side ({today}); lower is better")
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "ratios.png"), dpi=110)


if __name__ == "__main__":
    sys.exit(main())
