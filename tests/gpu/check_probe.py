#!/usr/bin/env python3
"""gpu_probe against the test double: what scripts/gpu-check.sh will ask of
a real GPU, checked where the double can answer. A kernel reaches memory
from plain malloc, new and std::vector under every CUDA backend, and faults
without mnemosyne (unless the system has pageable memory access)."""
import os
import re
import subprocess
import sys

PROBE = os.environ["GPU_PROBE"]
LIB = os.environ["MNEMOSYNE_LIB"]
FAKE = os.environ["FAKECUDA_LIB"]
failures = []


def probe(args, preload=None, extra=None):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MNEMOSYNE_", "FAKECUDA_", "LD_PRELOAD"))}
    env["MNEMOSYNE_CUDA_DRIVER"] = FAKE
    if preload:
        env["LD_PRELOAD"] = LIB
        env["MNEMOSYNE_BACKEND"] = preload
    env.update(extra or {})
    r = subprocess.run([PROBE] + args, env=env, capture_output=True, text=True, timeout=60)
    fields = {}
    for line in r.stdout.splitlines():
        for k, v in re.findall(r"(\w+)=(\S+)", line):
            fields.setdefault(k, v)
    return r, fields


def expect(ok, what, r):
    print(f"{'ok' if ok else 'FAIL'} {what}")
    if not ok:
        failures.append(what)
        print(f"  rc={r.returncode} stdout={r.stdout.strip()!r} stderr={r.stderr.strip()[-300:]!r}")


r, f = probe(["kernel", "malloc"])
expect(r.returncode == 0 and f.get("result") == "CUDA_ERROR_ILLEGAL_ADDRESS"
       and f.get("driver_memory") == "0", "without mnemosyne, a kernel faults on malloc memory", r)
r, f = probe(["kernel", "malloc"], extra={"FAKECUDA_PAGEABLE": "1"})
expect(f.get("result") == "ok" and f.get("pageable_memory_access") == "1",
       "without mnemosyne, with pageable memory access, it works", r)
for backend, managed, memtype in (("unified", "1", "device"), ("device", "1", "device"),
                                  ("pinned", "0", "host")):
    for kind in ("malloc", "new", "vector"):
        r, f = probe(["kernel", kind], preload=backend)
        expect(r.returncode == 0 and f.get("result") == "ok" and f.get("driver_memory") == "1"
               and f.get("is_managed") == managed and f.get("memory_type") == memtype,
               f"{backend}: a kernel adds 7 to {kind} memory in place", r)
# Under MNEMOSYNE_PIN=arena (cuMemHostAlloc arenas; pinned's default, vmm,
# maps granules of the driver's virtual-memory API, opened to the device)
# as well.
for kind in ("malloc", "vector"):
    r, f = probe(["kernel", kind], preload="pinned", extra={"MNEMOSYNE_PIN": "arena"})
    expect(r.returncode == 0 and f.get("result") == "ok" and f.get("driver_memory") == "1"
           and f.get("memory_type") == "host",
           f"pinned, PIN=arena: a kernel adds 7 to {kind} memory in place", r)
# Driver copies of malloc'd blocks, spanning 1 MiB boundaries: every block
# under every backend by default (pinned: PIN=vmm, granules side by side in
# one reservation, which an H200 copied across) and under
# MNEMOSYNE_PIN=arena; under MNEMOSYNE_PIN=granule the double, like an H200,
# refuses a copy of a block spanning two registrations.
for backend, extra in (("unified", None), ("device", None), ("pinned", None),
                       ("pinned", {"MNEMOSYNE_PIN": "arena"}),
                       ("pinned", {"MNEMOSYNE_PIN": "granule"})):
    r, _ = probe(["copy"], preload=backend, extra=extra)
    rows = [dict(re.findall(r"(\w+)=(\S+)", l)) for l in r.stdout.splitlines()
            if l.startswith("copy ")]
    spanning = [row for row in rows if row["spans_mib_boundary"] == "1"]
    if extra is None or extra["MNEMOSYNE_PIN"] != "granule":
        expect(r.returncode == 0 and len(rows) == 4 and spanning
               and all(row["copy_out_ok"] == "1" for row in rows),
               f"{backend}: the driver copies every malloc'd block, across 1 MiB boundaries too", r)
    else:
        expect(r.returncode == 0 and spanning
               and all(row["copy_out"] == "CUDA_ERROR_INVALID_VALUE" for row in spanning),
               "pinned, PIN=granule: a block spanning two registrations cannot be copied", r)
r, _ = probe(["attributes"], preload="unified")
lines = [l for l in r.stdout.splitlines() if l.startswith("attributes")]
expect(len(lines) == 2 and all("driver_memory=1 is_managed=1" in l for l in lines),
       "unified: 64-byte and 64 MiB mallocs are managed memory", r)
for backend, device, want in (("device", "1", "1"), ("unified", "0", "none"),
                              ("pinned", "0", "CUDA_ERROR_INVALID_VALUE")):
    r, _ = probe(["attributes"], preload=backend, extra={"MNEMOSYNE_DEVICE": device})
    lines = [l for l in r.stdout.splitlines() if l.startswith("attributes")]
    expect(len(lines) == 2 and all(f"preferred_location={want}" in l for l in lines),
           f"{backend}, device {device}: the preferred location is {want}", r)
r, f = probe(["costs"], preload="unified")
costs = [l for l in r.stdout.splitlines() if l.startswith("alloc-cost")]
expect(r.returncode == 0 and "cuinit_ms" in f and len(costs) == 3
       and all(re.search(r"managed_ms=[0-9.]+ advise_ms=[0-9.]+ pinned_ms=[0-9.]+", l)
               for l in costs),
       "costs: cuInit, the context, allocation calls and cuMemAdvise are timed", r)
r, _ = probe(["zero"])
kinds = re.findall(r"zero kind=(\w+) fresh=1 reused=1", r.stdout)
expect(r.returncode == 0 and kinds == ["managed", "device", "pinned"],
       "zero: the double's fresh and reused blocks read zero, from the CPU and the GPU", r)
expect("calloc_zero=1 driver_memory=0" in r.stdout, "zero: without mnemosyne calloc is glibc's", r)
r, _ = probe(["zero"], preload="pinned")
expect(len(re.findall(r"calloc_ms=[0-9.]+ calloc_rss_mib=-?\d+ calloc_zero=1 driver_memory=1 "
                      r"is_managed=0", r.stdout)) == 2,
       "zero: under pinned, callocs of 256 MiB and 1100 MiB are zeroed driver memory", r)
r, _ = probe(["zero"], preload="unified")
small = [int(m) for m in re.findall(r"calloc_rss_mib=(-?\d+) calloc_zero=1 driver_memory=1 "
                                    r"is_managed=1", r.stdout)]
expect(len(small) == 2 and max(small) < 64,
       "zero: under unified, callocs of 256 MiB and 1100 MiB read zero and took no host RAM (the "
       "device cleared them)", r)
# cudaDeviceReset: the primary context's reset frees a heap allocated in it
# (the double then dies inside the reset, freeing its own bookkeeping); a
# heap in mnemosyne's own context (MNEMOSYNE_CONTEXT=own) outlives it.
for backend in ("unified", "device", "pinned"):
    r, _ = probe(["reset"], preload=backend, extra={"MNEMOSYNE_CONTEXT": "own"})
    steps = re.findall(r"reset step=(\S+)", r.stdout)
    expect(r.returncode == 0 and steps == ["allocated", "reset", "read-old-block",
                                           "freed-old-blocks", "new-malloc-works"]
           and "value=1" in r.stdout,
           f"{backend}, own context: the heap outlives cuDevicePrimaryCtxReset", r)
    r, f = probe(["kernel", "vector"], preload=backend, extra={"MNEMOSYNE_CONTEXT": "own"})
    expect(f.get("result") == "ok" and f.get("driver_memory") == "1",
           f"{backend}, own context: a kernel in the primary context works on the heap", r)
r, _ = probe(["reset"], preload="unified")
expect(r.returncode != 0 and "reset step=new-malloc-works" not in r.stdout,
       "unified, primary context: the reset takes the heap with it (the documented limit)", r)
r, f = probe(["kernel", "malloc"], preload="unified",
             extra={"MNEMOSYNE_CONTEXT": "own", "FAKECUDA_MISSING": "cuCtxCreate"})
warnings = [l for l in r.stderr.splitlines() if l.startswith("mnemosyne:")]
expect(r.returncode == 0 and f.get("driver_memory") == "0" and len(warnings) == 1
       and "MNEMOSYNE_CONTEXT=own needs cuCtxCreate_v4" in warnings[0]
       and "the heap uses host memory" in warnings[0],
       "own context without cuCtxCreate_v4: one warning, the heap on host memory", r)
r, _ = probe(["kernel", "malloc"], extra={"MNEMOSYNE_CUDA_DRIVER": "/nonexistent/libcuda.so.1"})
expect(r.returncode == 1 and "error=no-driver" in r.stdout, "no driver: one line, exit 1", r)
print(f"# {len(failures)} failed")
sys.exit(1 if failures else 0)
