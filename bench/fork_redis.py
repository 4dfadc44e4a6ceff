"""Redis's BGSAVE over a big heap of small objects: the fork a snapshotting
server makes while its clients keep writing. An unmodified redis-server (as
Debian ships it) is filled with DEBUG POPULATE to about --mib MiB of used
memory, a client thread keeps overwriting keys, and BGSAVE forks a child
that writes the whole dataset out. Only the server runs under the
allocator asked for (--env NAME=VALUE, for LD_PRELOAD and MNEMOSYNE_*),
not this client. Measured:

  fork_ms        the parent's fork, as Redis times it (latest_fork_usec):
                 its main thread serves no client meanwhile
  worst_ms       the longest a writing client waited for one SET's reply
                 during the save (the stall a client sees)
  save_s         BGSAVE to the end of the child
  lost_mib       the most memory the machine lost during the save
                 (MemAvailable before it, less its lowest value)
  keys, rdb_ok   the keys redis-check-rdb read back from the child's file

With --saves N, N saves --pause seconds apart, as `save <seconds>` makes
a server snapshot periodically: fork_ms_each lists each save's fork, the
figures above are the last save's, every save's file is checked, and
held_mib is the memory the machine lost between the first save and the
last (what a kept image of the heap costs).

Prints one line of JSON. Usage:
  fork_redis.py [--mib N] [--saves N] [--pause SECONDS] [--env NAME=VALUE]...
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

from meminfo import mem_available_kib


class Client:
    """A minimal RESP client: one command, one reply."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buf = b""

    def _line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise RuntimeError("redis closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n):
        while len(self.buf) < n + 2:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise RuntimeError("redis closed the connection")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def call(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(out))
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"-":
            raise RuntimeError(f"redis: {rest.decode()}")
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n).decode()
        if kind == b":":
            return int(rest)
        return rest.decode()

    def info(self, section):
        fields = {}
        for line in self.call("INFO", section).splitlines():
            if ":" in line:
                k, v = line.split(":", 1)
                fields[k] = v
        return fields


def rdb_keys(work):
    """The keys redis-check-rdb reads from the save's file (0 when it fails)."""
    check = subprocess.run(["redis-check-rdb", os.path.join(work, "dump.rdb")],
                           capture_output=True, text=True)
    if check.returncode != 0:
        return 0
    for line in check.stdout.splitlines():
        if "keys read" in line:
            return int(line.split("]")[-1].split()[0])
    return 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=2048)
    ap.add_argument("--saves", type=int, default=1)
    ap.add_argument("--pause", type=float, default=0.0, help="seconds between saves")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server")
    a = ap.parse_args()
    server = shutil.which("redis-server")
    if server is None:
        print("fork_redis: no redis-server (apt-get install redis-server)", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="fork-redis-")
    port = free_port()
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", work, "--dbfilename", "dump.rdb", "--enable-debug-command", "yes",
         "--logfile", os.path.join(work, "redis.log"), "--daemonize", "no"],
        env={**os.environ, **dict(e.split("=", 1) for e in a.env)},
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                c = Client(port)
                c.call("PING")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start: {proc.stderr.read()[-500:]!r}")
                time.sleep(0.05)
        # Keys of 100-byte values, populated in steps up to the size asked.
        keys = 0
        while int(c.info("memory")["used_memory"]) < a.mib << 20:
            step = 1_000_000 if a.mib >= 512 else 100_000
            c.call("DEBUG", "POPULATE", keys + step, "key", 100)
            keys += step
        used_mib = int(c.info("memory")["used_memory"]) >> 20
        time.sleep(0.5)  # the heap settled
        # The writer: SETs over the existing keys, each reply timed.
        stop = threading.Event()
        stats = {"ops": 0, "worst": 0.0}

        def writer():
            w = Client(port)
            i = 0
            while not stop.is_set():
                t = time.monotonic()
                w.call("SET", f"key:{(i * 7919) % keys}", "w" * 100)
                dt = time.monotonic() - t
                stats["ops"] += 1
                stats["worst"] = max(stats["worst"], dt)
                i += 1

        th = threading.Thread(target=writer)
        th.start()
        fork_ms_each = []
        saves_ok = True
        for save in range(a.saves):
            if save:
                time.sleep(a.pause)
            time.sleep(0.3)
            stats["worst"] = 0.0
            before = mem_available_kib()
            if save == 0:
                first_before = before
            lowest = before
            ops_before = stats["ops"]
            started = time.monotonic()
            c.call("BGSAVE")
            while True:
                lowest = min(lowest, mem_available_kib())
                if c.info("persistence").get("rdb_bgsave_in_progress") == "0":
                    break
                time.sleep(0.02)
            save_s = time.monotonic() - started
            fork_ms_each.append(round(int(c.info("stats")["latest_fork_usec"]) / 1000, 1))
            if a.saves > 1:
                saves_ok = saves_ok and rdb_keys(work) == keys and \
                    c.info("persistence").get("rdb_last_bgsave_status") == "ok"
        stop.set()
        th.join()
        persistence = c.info("persistence")
        fork_usec = int(c.info("stats")["latest_fork_usec"])
        c.call("FLUSHALL")  # nothing to write at shutdown
        try:
            c.call("SHUTDOWN", "NOSAVE")
        except RuntimeError:
            pass
        proc.wait(timeout=60)
        read = rdb_keys(work)
        rdb_ok = (persistence.get("rdb_last_bgsave_status") == "ok" and read == keys and
                  saves_ok)
        print(json.dumps({"used_mib": used_mib, "keys": keys, "fork_ms": round(fork_usec / 1000, 1),
                          "worst_ms": round(stats["worst"] * 1000, 1),
                          "writes_during_save": stats["ops"] - ops_before,
                          "save_s": round(save_s, 2), "lost_mib": (before - lowest) // 1024,
                          "keys_read": read, "rdb_ok": rdb_ok, "fork_ms_each": fork_ms_each,
                          "held_mib": (first_before - before) // 1024}))
        return 0 if rdb_ok else 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
