"""A pool of forked workers over a big heap: what a multiprocessing pool, a
PyTorch DataLoader (fork is its default start method on Linux) or a
pre-fork server does. The parent builds a heap (8 MiB buffers and short
strings), forks the workers one after the other, each reads the whole heap
and reports, and all stay alive until the parent has measured:

  forks_s       the time of the fork() calls, all together
  lost_mib      the memory the machine lost while the workers live
                (MemAvailable before the forks less while they live)
  first_read_s  the time from the first fork to the first worker's report

Prints one line of JSON. Usage: fork_workers.py [--mib N] [--workers N]
"""
import argparse
import json
import os
import sys
import time

from meminfo import mem_available_kib


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1600)
    ap.add_argument("--workers", type=int, default=8)
    a = ap.parse_args()
    strings_mib = a.mib // 16
    buffers = [bytearray(os.urandom(1 << 16)) * 128 for _ in range((a.mib - strings_mib) // 8)]
    strings = [f"key-{i:09d}-" + "x" * 180 for i in range(strings_mib * 1024 * 1024 // 256)]
    expected = sum(b.count(0) for b in buffers) + len(strings)
    time.sleep(0.5)  # the heap settled
    before = mem_available_kib()
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pids = []
    each = []
    started = time.monotonic()
    for _ in range(a.workers):
        t = time.monotonic()
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            os.close(go_w)
            seen = sum(b.count(0) for b in buffers) + sum(1 for s in strings if s[:4] == "key-")
            os.write(ready_w, b"1" if seen == expected else b"0")
            os.read(go_r, 1)  # alive until the parent has measured
            os._exit(0)
        each.append(time.monotonic() - t)
        pids.append(pid)
    reports = b""
    first_read_s = None
    while len(reports) < a.workers:
        reports += os.read(ready_r, a.workers)
        if first_read_s is None:
            first_read_s = time.monotonic() - started
    lost = before - mem_available_kib()
    os.write(go_w, b"x" * a.workers)
    failed = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        failed += status != 0
    ok = reports == b"1" * a.workers and failed == 0
    print(json.dumps({"heap_mib": a.mib, "workers": a.workers, "forks_s": round(sum(each), 3),
                      "each_s": [round(t, 3) for t in each],
                      "lost_mib": lost // 1024, "first_read_s": round(first_read_s, 3),
                      "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
