"""Children that only run a command, or exit, from a parent with a big heap:
what Python's os.fork + execv and subprocess with preexec_fn, Perl's
system() and Node's child_process.execSync do (issue 47). The parent holds
MIB MiB of heap in 1 MiB pieces, each written, then starts COUNT children
one after the other, each running /bin/true (or, for fork-exit, exiting at
once), and waits for each. Prints one line of JSON:

  first_ms    the first child, from the call to its end (the first fork of a
              series: no image of an earlier fork to share)
  rest_ms     the median of the others
  pid         the parent's pid (its statistics file, under mnemosyne)

Usage: fork_exec.py CASE [--mib N] [--count N]
  CASE: python-execv | python-preexec | python-exit | perl-system | node-execsync
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PERL = r"""
use Time::HiRes qw(time);
my ($mib, $count) = @ARGV;
my @heap = map { my $s = chr($_ % 251) x (1 << 20); $s } 1 .. $mib;
my @ms;
for (1 .. $count) {
  my $t = time;
  system("/bin/true") == 0 or die "system failed";
  push @ms, (time - $t) * 1000;
}
my $first = shift @ms;
my @s = sort { $a <=> $b } @ms;
printf("{\"first_ms\": %.2f, \"rest_ms\": %.2f, \"pid\": %d, \"ok\": true}\n",
       $first, $s[int(@s / 2)], $$);
"""

NODE = r"""
const { execSync } = require("child_process");
const [mib, count] = process.argv.slice(1).map(Number);  // node -e: no script path
const heap = [];
for (let i = 0; i < mib; i++) heap.push(Buffer.alloc(1 << 20, i % 251));
const ms = [];
for (let i = 0; i < count; i++) {
  const t = process.hrtime.bigint();
  execSync("/bin/true");
  ms.push(Number(process.hrtime.bigint() - t) / 1e6);
}
const first = ms.shift();
ms.sort((a, b) => a - b);
console.log(JSON.stringify({first_ms: first, rest_ms: ms[Math.floor(ms.length / 2)],
                            pid: process.pid, ok: heap.length === mib}));
"""


def python_case(case, mib, count):
    heap = [bytearray([i % 251]) * (1 << 20) for i in range(mib)]
    ms = []
    for _ in range(count):
        t = time.monotonic()
        if case == "python-preexec":
            subprocess.run(["/bin/true"], preexec_fn=lambda: None, check=True)
        else:
            pid = os.fork()
            if pid == 0:
                if case == "python-execv":
                    os.execv("/bin/true", ["true"])
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            if status != 0:
                raise SystemExit(f"child ended with status {status}")
        ms.append((time.monotonic() - t) * 1000)
    first = ms.pop(0)
    print(json.dumps({"first_ms": first, "rest_ms": statistics.median(ms), "pid": os.getpid(),
                      "ok": len(heap) == mib}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case")
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--count", type=int, default=5)
    a = ap.parse_args()
    if a.case.startswith("python-"):
        return python_case(a.case, a.mib, a.count)
    if a.case == "perl-system":
        argv = ["perl", "-e", PERL, str(a.mib), str(a.count)]
    elif a.case == "node-execsync":
        argv = ["node", "-e", NODE, str(a.mib), str(a.count)]
    else:
        raise SystemExit(f"fork_exec.py: no case {a.case}")
    # exec, not a child: the statistics file is the measured process's.
    sys.stdout.flush()
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()
