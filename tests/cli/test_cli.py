#!/usr/bin/python3
"""Tests of the `mnemosyne` launcher: run, info, stats, help, install.

Usage: test_cli.py [GROUP...] where GROUP is one of the TestCase classes
below (RunTests, InfoTests, StatsTests, HelpTests, InstallTests,
CudaHeadersTests); none runs
them all. Paths come from the environment meson's test() sets (see
meson.build); the MNEMOSYNE_TEST_ prefix is one the library ignores.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

ENV = os.environ
LAUNCHER = ENV["MNEMOSYNE_TEST_LAUNCHER"]
INTERPOSER = ENV["MNEMOSYNE_TEST_INTERPOSER"]
FAKE = ENV["MNEMOSYNE_TEST_FAKECUDA"]
VERSION = ENV["MNEMOSYNE_TEST_VERSION"]
PYTHON = "/usr/bin/python3"
TIMEOUT = 60

# Every option of the table, as flag -> (value given, variable, value expected).
STATS_DIR = "@STATS_DIR@"  # replaced by a temporary directory
ALL_FLAGS = [
    ("--backend", "pinned", "MNEMOSYNE_BACKEND", "pinned"),
    ("--device", "1", "MNEMOSYNE_DEVICE", "1"),
    ("--size", "1M:64M", "MNEMOSYNE_SIZE", "1M:64M"),
    ("--arena-size", "256MiB", "MNEMOSYNE_ARENA_SIZE", "256MiB"),
    ("--limit", "8G", "MNEMOSYNE_LIMIT", "8G"),
    ("--fallback", "fail", "MNEMOSYNE_FALLBACK", "fail"),
    ("--context", "own", "MNEMOSYNE_CONTEXT", "own"),
    ("--zeroed", "no", "MNEMOSYNE_ZEROED", "no"),
    ("--pin", "granule", "MNEMOSYNE_PIN", "granule"),
    ("--fork-keep-ms", "120000", "MNEMOSYNE_FORK_KEEP_MS", "120000"),
    ("--fork-pull-ms", "100", "MNEMOSYNE_FORK_PULL_MS", "100"),
    ("--verbose", None, "MNEMOSYNE_VERBOSE", "1"),
    ("--stats", None, "MNEMOSYNE_SHOW_STATS", "1"),
    ("--stats-file", STATS_DIR + "/s.%p.json", "MNEMOSYNE_STATS_FILE",
     STATS_DIR + "/s.%p.json"),
    ("--cuda-driver", FAKE, "MNEMOSYNE_CUDA_DRIVER", FAKE),
    ("--programs", "python3*,train.py", "MNEMOSYNE_PROGRAMS", "python3*,train.py"),
    ("--exclude", "unshare,my-sandbox", "MNEMOSYNE_EXCLUDE", "unshare,my-sandbox"),
    ("--warned", "unified:3c9d2f1a", "MNEMOSYNE_WARNED", "unified:3c9d2f1a"),
    ("--disable", None, "MNEMOSYNE_DISABLE", "1"),
]

PRINT_ENV = ("import json, os; print(json.dumps({k: v for k, v in os.environ.items() "
             "if k.startswith('MNEMOSYNE_') or k == 'LD_PRELOAD'}))")

STATS_GOOD = {
    "schema": "mnemosyne-stats/1",
    "pid": 4242,
    "program": "python3",
    "requested_backend": "unified",
    "active_backend": "unified",
    "device": 0,
    "counting": True,
    "size_range": {"min": 0, "max": 18446744073709551615},
    "limit": 0,
    "fallback": "host",
    "pools": {
        "unified": {
            "allocations": 1200, "frees": 1100,
            "bytes_requested": 73400320, "bytes_live": 1048576, "bytes_peak": 9437184,
            "segments": 2, "bytes_reserved": 201326592, "bytes_backed": 41943040,
            "bytes_backed_peak": 52428800,
            "driver_calls": 4, "driver_failures": 1, "driver_ms": 0.21,
            "advice_failures": 0, "a_later_key": [1, {"x": None}],
        },
        "system": {
            "allocations": 3, "frees": 1,
            "bytes_requested": 4096, "bytes_live": 2048, "bytes_peak": 4096,
            "segments": 0, "bytes_reserved": 0,
            "driver_calls": 0, "driver_failures": 0, "driver_ms": 0.0,
            "advice_failures": 0,
        },
    },
    "fallbacks": {"count": 17, "reason": "the driver is out of memory"},
    "fork_bytes_copied": 0,
}


def clean_env(**extra):
    """The test's environment without MNEMOSYNE_*/FAKECUDA_*/LD_PRELOAD, plus extra."""
    env = {k: v for k, v in ENV.items()
           if not (k.startswith(("MNEMOSYNE_", "FAKECUDA_")) or k == "LD_PRELOAD")}
    env["LC_ALL"] = "C"
    env.update(extra)
    return env


def launch(args, env=None, cwd=None):
    return subprocess.run([LAUNCHER] + args, env=env if env is not None else clean_env(),
                          cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT)


def stderr_lines(r):
    """stderr lines that come from the launcher (not from the library in COMMAND)."""
    return [line for line in r.stderr.splitlines() if line.strip()]


def matplotlib_missing():
    r = subprocess.run([PYTHON, "-c", "import matplotlib"], capture_output=True, text=True)
    return r.returncode != 0 and (r.stderr.strip().splitlines() or ["?"])[-1]


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="mnemosyne-cli-")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def assertUsageError(self, r, *needles):
        self.assertEqual(r.returncode, 2, f"exit status; stderr: {r.stderr!r}")
        lines = stderr_lines(r)
        self.assertEqual(len(lines), 1, f"one line expected: {r.stderr!r}")
        for needle in needles:
            self.assertIn(needle, lines[0])
        self.assertIn("--help", lines[0])


class RunTests(Base):
    def run_env(self, flags, env=None):
        r = launch(["run"] + flags + ["--", PYTHON, "-c", PRINT_ENV], env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout.strip().splitlines()[-1])

    def test_every_flag_sets_its_variable(self):
        for form in ("space", "equals"):
            with self.subTest(form=form):
                args, expected = [], {}
                for flag, value, var, want in ALL_FLAGS:
                    if value is not None:
                        value = value.replace(STATS_DIR, self.tmp)
                        args += [flag, value] if form == "space" else [f"{flag}={value}"]
                    else:
                        args.append(flag)
                    expected[var] = want.replace(STATS_DIR, self.tmp)
                got = self.run_env(args)
                for var, want in expected.items():
                    self.assertEqual(got.get(var), want, var)
                self.assertEqual(got["LD_PRELOAD"], os.path.realpath(INTERPOSER))

    def test_boolean_values(self):
        got = self.run_env(["--verbose=no", "--stats=yes", "--disable=off",
                            "--cuda-driver", FAKE])
        self.assertEqual(got["MNEMOSYNE_VERBOSE"], "0")
        self.assertEqual(got["MNEMOSYNE_SHOW_STATS"], "1")
        self.assertEqual(got["MNEMOSYNE_DISABLE"], "0")

    def test_relative_stats_file_is_made_absolute(self):
        r = launch(["run", "--stats-file", "out.%p.json", "--disable", "--", PYTHON, "-c",
                    PRINT_ENV], cwd=self.tmp)
        self.assertEqual(r.returncode, 0, r.stderr)
        got = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertEqual(got["MNEMOSYNE_STATS_FILE"],
                         os.path.join(os.path.realpath(self.tmp), "out.%p.json"))

    def test_ld_preload_is_prepended(self):
        other = os.path.join(self.tmp, "other.so")
        got = self.run_env(["--disable"], env=clean_env(LD_PRELOAD=other))
        self.assertEqual(got["LD_PRELOAD"], os.path.realpath(INTERPOSER) + ":" + other)

    def test_unset_options_pass_through(self):
        got = self.run_env(["--disable"], env=clean_env(MNEMOSYNE_BACKEND="host"))
        self.assertEqual(got["MNEMOSYNE_BACKEND"], "host")
        self.assertNotIn("MNEMOSYNE_DEVICE", got)
        got = self.run_env(["--disable", "--backend=pinned"],
                           env=clean_env(MNEMOSYNE_BACKEND="host"))
        self.assertEqual(got["MNEMOSYNE_BACKEND"], "pinned")

    def test_program_runs_under_the_backend(self):
        r = launch(["run", "--backend", "pinned", "--cuda-driver", FAKE, "--", PYTHON, "-c",
                    "import ctypes, sys; lib = ctypes.CDLL(None); "
                    "lib.mnemosyne_active_backend.restype = ctypes.c_char_p; "
                    "print(lib.mnemosyne_active_backend().decode()); sys.exit(7)"])
        self.assertEqual(r.returncode, 7, r.stderr)
        self.assertEqual(r.stdout.strip(), "pinned")

    def test_exit_table_shows_memory(self):
        """--stats: the table at exit shows the memory taken from the driver
        (now and at its peak) beside the address space reserved, labelled."""
        stats = os.path.join(self.tmp, "run.json")
        r = launch(["run", "--backend", "pinned", "--cuda-driver", FAKE, "--stats",
                    "--stats-file", stats, "--", PYTHON, "-c",
                    "blocks = [bytearray(1 << 20) for _ in range(40)]; del blocks[20:]"])
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = [line for line in r.stderr.splitlines() if line.startswith("mnemosyne: ")]
        header = next(line for line in lines if line.split()[1:2] == ["pool"])
        columns = re.split(r"\s{2,}", header[len("mnemosyne: "):].strip())
        self.assertEqual(columns[7:10], ["memory", "memory peak", "reserved VA"], header)
        pinned = next(line for line in lines if line.split()[1:2] == ["pinned"]).split()[1:]
        memory, memory_peak, reserved = (int(v) for v in pinned[7:10])
        with open(stats) as f:
            pool = json.load(f)["pools"]["pinned"]
        self.assertEqual((memory, memory_peak, reserved),
                         (pool["bytes_backed"], pool["bytes_backed_peak"], pool["bytes_reserved"]))
        # 40 MiB held at once: the peak memory covers it, at most the reserve.
        self.assertGreaterEqual(memory_peak, 40 << 20)
        self.assertLessEqual(memory, memory_peak)
        self.assertLessEqual(memory_peak, reserved)

    def test_exit_status(self):
        self.assertEqual(launch(["run", "--", "/bin/sh", "-c", "exit 0"]).returncode, 0)
        self.assertEqual(launch(["run", "--", "/bin/sh", "-c", "exit 7"]).returncode, 7)
        self.assertEqual(launch(["run", "/bin/sh", "-c", "exit 3"]).returncode, 3)  # no "--"

    def test_command_not_found(self):
        for cmd in ("mnemosyne-no-such-command", os.path.join(self.tmp, "missing")):
            r = launch(["run", "--", cmd])
            self.assertEqual(r.returncode, 127, r.stderr)
            lines = stderr_lines(r)
            self.assertEqual(len(lines), 1, r.stderr)
            self.assertIn(cmd, lines[0])

    def test_command_not_executable(self):
        script = os.path.join(self.tmp, "not-executable")
        with open(script, "w") as f:
            f.write("#!/bin/sh\nexit 0\n")
        os.chmod(script, 0o644)
        for cmd in (script, self.tmp):
            r = launch(["run", "--", cmd])
            self.assertEqual(r.returncode, 126, r.stderr)
            lines = stderr_lines(r)
            self.assertEqual(len(lines), 1, r.stderr)
            self.assertIn(cmd, lines[0])

    def test_usage_errors(self):
        cases = [
            (["--backend=quantum"], ["--backend=quantum", "unified"]),
            (["--backend"], ["--backend", "needs a value"]),
            (["--device", "x"], ["--device=x"]),
            (["--device=-1"], ["--device=-1"]),
            (["--device=4096"], ["--device=4096"]),
            (["--size", "9:3"], ["--size=9:3"]),
            (["--size=lots"], ["--size=lots"]),
            (["--limit", "1Q"], ["--limit=1Q"]),
            (["--arena-size=1M"], ["--arena-size=1M", "32MiB"]),
            (["--fallback=maybe"], ["--fallback=maybe", "host or fail"]),
            (["--context=mine"], ["--context=mine", "primary or own"]),
            (["--zeroed=maybe"], ["--zeroed=maybe", "auto, yes or no"]),
            (["--pin=page"], ["--pin=page", "arena, granule or vmm"]),
            (["--fork-keep-ms=2s"], ["--fork-keep-ms=2s", "milliseconds"]),
            (["--verbose=perhaps"], ["--verbose=perhaps", "boolean"]),
            (["--stats-file="], ["--stats-file"]),
            (["--stats-file", "/nonexistent-dir/x.json"], ["/nonexistent-dir"]),
            (["--cuda-driver", "/nonexistent/libcuda.so.1"], ["/nonexistent/libcuda.so.1"]),
            (["--programs=python3,,gcc"], ["--programs=python3,,gcc", "no empty item"]),
            (["--programs", "[ab"], ["--programs=[ab", "every [ closed"]),
            (["--no-such-flag"], ["--no-such-flag"]),
            (["-z"], ["-z"]),
        ]
        marker = os.path.join(self.tmp, "ran")
        for args, needles in cases:
            with self.subTest(args=args):
                r = launch(["run"] + args + ["--", "/usr/bin/touch", marker])
                self.assertUsageError(r, *needles)
                self.assertFalse(os.path.exists(marker), "COMMAND must not run")
        self.assertUsageError(launch(["run"]), "COMMAND")
        self.assertUsageError(launch(["run", "--backend=host", "--"]), "COMMAND")

    def test_local_rank_passes_through(self):
        got = self.run_env(["--disable", "--device", "local-rank"])
        self.assertEqual(got["MNEMOSYNE_DEVICE"], "local-rank")


class InfoTests(Base):
    BACKENDS = ["unified", "device", "hbm", "gddr", "pinned", "host"]

    def test_fake_driver(self):
        r = launch(["info"], env=clean_env(MNEMOSYNE_CUDA_DRIVER=FAKE))
        self.assertEqual(r.returncode, 0, r.stderr)
        out = r.stdout
        self.assertIn(FAKE, out.splitlines()[0])
        self.assertIn("devices: 2", out)
        device_lines = [line for line in out.splitlines() if "compute capability" in line]
        self.assertEqual(len(device_lines), 2, out)
        for line in device_lines:
            self.assertIn("concurrentManagedAccess=", line)
            self.assertIn("pageableMemoryAccess=0", line)
        for name in self.BACKENDS:
            self.assertRegex(out, rf"(?m)^\s+{name}\s+works")
        self.assertNotIn("not needed", out)

    def test_pageable_memory_note(self):
        r = launch(["info"], env=clean_env(MNEMOSYNE_CUDA_DRIVER=FAKE, FAKECUDA_PAGEABLE="1"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("not needed for access", r.stdout)

    def test_cuda_driver_flag(self):
        r = launch(["info", "--cuda-driver", FAKE])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("devices: 2", r.stdout)

    def test_no_driver(self):
        r = launch(["info"], env=clean_env(MNEMOSYNE_CUDA_DRIVER="/nonexistent"))
        self.assertEqual(r.returncode, 1)
        lines = stderr_lines(r)
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn("/nonexistent", lines[0])
        self.assertIn("driver: none", r.stdout)

    def test_json(self):
        r = launch(["info", "--json"], env=clean_env(MNEMOSYNE_CUDA_DRIVER=FAKE))
        self.assertEqual(r.returncode, 0, r.stderr)
        doc = json.loads(r.stdout)
        self.assertEqual(doc["schema"], "mnemosyne-info/1")
        self.assertTrue(doc["driver"]["available"])
        self.assertEqual(doc["driver"]["path"], FAKE)
        self.assertEqual(doc["device_count"], 2)
        self.assertEqual([d["ordinal"] for d in doc["devices"]], [0, 1])
        for d in doc["devices"]:
            self.assertGreater(d["total_memory"], 0)
            self.assertIsInstance(d["concurrent_managed_access"], bool)
            self.assertIs(d["pageable_memory_access"], False)
        self.assertEqual(list(doc["backends"]), self.BACKENDS)
        for name in self.BACKENDS:
            self.assertTrue(doc["backends"][name]["works"], name)
        self.assertTrue(doc["ok"])
        self.assertEqual(doc["reason"], "")

    def test_json_no_driver(self):
        r = launch(["info", "--json"], env=clean_env(MNEMOSYNE_CUDA_DRIVER="/nonexistent"))
        self.assertEqual(r.returncode, 1)
        doc = json.loads(r.stdout)
        self.assertFalse(doc["ok"])
        self.assertFalse(doc["driver"]["available"])
        self.assertIn("/nonexistent", doc["reason"])
        self.assertEqual(len(stderr_lines(r)), 1, r.stderr)

    def test_usage_errors(self):
        self.assertUsageError(launch(["info", "--frobnicate"]), "--frobnicate")
        self.assertUsageError(launch(["info", "extra"]), "extra")


class StatsTests(Base):
    def write(self, name, content):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(content if isinstance(content, str) else json.dumps(content))
        return path

    def test_table(self):
        path = self.write("good.json", STATS_GOOD)
        r = launch(["stats", path])
        self.assertEqual(r.returncode, 0, r.stderr)
        out = r.stdout
        self.assertIn(path, out)
        for pool in ("unified", "system"):
            self.assertRegex(out, rf"(?m)^\s+{pool}\s")
        unified = next(line for line in out.splitlines() if line.strip().startswith("unified"))
        for number in ("1200", "1100", "73400320", "1048576", "9437184", "201326592", "0.210"):
            self.assertIn(number, unified.split())
        # Memory taken from the driver (at exit, peak) beside the address
        # space reserved, each under a label that says which is memory.
        header = next(line for line in out.splitlines() if line.strip().startswith("pool"))
        self.assertEqual(header.split()[1:12],
                         ["allocations", "frees", "requested", "live", "peak", "segments",
                          "memory", "memory_peak", "reserved_va", "drv_calls", "drv_failures"])
        self.assertEqual(unified.split()[1:12],
                         ["1200", "1100", "73400320", "1048576", "9437184", "2", "41943040",
                          "52428800", "201326592", "4", "1"])
        self.assertRegex(out, r"memory: bytes the backend took from the driver.*reserved_va: "
                              r"address space, not memory")
        # A file written before the backed bytes were kept: "-" there.
        system = next(line for line in out.splitlines() if line.strip().startswith("system"))
        self.assertEqual(system.split()[7:10], ["-", "-", "0"])
        self.assertEqual(out.count("fallbacks to the system allocator"), 1, out)
        self.assertIn("fallbacks to the system allocator: 17", out)
        self.assertIn("the driver is out of memory", out)

    def test_several_files(self):
        a = self.write("a.json", STATS_GOOD)
        other = dict(STATS_GOOD, pid=99, pools={"pinned": dict(STATS_GOOD["pools"]["unified"],
                                                               bytes_reserved=123456789)})
        b = self.write("b.json", other)
        r = launch(["stats", a, b])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(a, r.stdout)
        self.assertIn(b, r.stdout)
        self.assertIn("123456789", r.stdout)

    def test_unknown_schema(self):
        path = self.write("v9.json", dict(STATS_GOOD, schema="mnemosyne-stats/9"))
        r = launch(["stats", path])
        self.assertEqual(r.returncode, 1)
        lines = stderr_lines(r)
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn("mnemosyne-stats/9", lines[0])
        self.assertIn("mnemosyne-stats/1", lines[0])

    def test_invalid_files(self):
        cases = {
            "truncated.json": ('{"schema": "mnemosyne-stats/1", "pools": {', "not valid JSON"),
            "array.json": ("[1, 2]", "not a mnemosyne statistics file"),
            "noschema.json": ('{"pools": {}}', "schema"),
            "badcount.json": (json.dumps(dict(STATS_GOOD, pools={"unified": {"frees": "x"}})),
                              "pools.unified.frees"),
        }
        for name, (content, needle) in cases.items():
            with self.subTest(file=name):
                path = self.write(name, content)
                r = launch(["stats", path])
                self.assertEqual(r.returncode, 1, r.stderr)
                lines = stderr_lines(r)
                self.assertEqual(len(lines), 1, r.stderr)
                self.assertIn(path, lines[0])
                self.assertIn(needle, lines[0])
        r = launch(["stats", os.path.join(self.tmp, "absent.json")])
        self.assertEqual(r.returncode, 1)
        self.assertIn("absent.json", r.stderr)

    def assertRefused(self, path, needle):
        r = launch(["stats", path])
        self.assertEqual(r.returncode, 1, f"{path}: {r.returncode} {r.stderr[-300:]!r}")
        lines = stderr_lines(r)
        self.assertEqual(len(lines), 1, r.stderr[-500:])
        self.assertIn(needle, lines[0])
        self.assertLess(len(lines[0]), 600, "the message should be one readable line")
        self.assertEqual(r.stdout, "")

    def test_hostile_files(self):
        """Files users hand to `stats` that no mnemosyne wrote: one clear
        line each, exit status 1, no crash."""
        good = json.dumps(STATS_GOOD)
        bad_number = lambda v: good.replace('"frees": 1100', '"frees": ' + v)
        cases = {
            "empty.json": ("", "not valid JSON"),
            "spaces.json": ("   \n\t ", "not valid JSON"),
            "garbage.bin": (bytes(range(256)) * 40, "not valid JSON"),
            "nul.json": (good[:40] + "\0" + good[40:], "not valid JSON"),
            "bad-utf8.json": (good.replace("mnemosyne-stats/1", "mnemosyne-\udcff").encode(
                "utf-8", "surrogateescape"), "not valid JSON"),
            "deep.json": ("[" * 200000, "nested deeper than"),
            "deep-object.json": ('{"a":' * 100000 + "1" + "}" * 100000, "nested deeper than"),
            "huge.json": ('{"schema": "mnemosyne-stats/1", "pools": {}, "pad": "' +
                          "x" * (17 << 20) + '"}', "larger than 16 MiB"),
            "too-big-int.json": (bad_number("18446744073709551616"), "pools.unified.frees"),
            "negative.json": (bad_number("-1"), "pools.unified.frees"),
            "fraction.json": (bad_number("1.5"), "pools.unified.frees"),
            "exponent.json": (bad_number("1e400"), "not valid JSON"),
            "nan.json": (bad_number("NaN"), "not valid JSON"),
            "trailing-comma.json": (good[:-1] + ",}", "not valid JSON"),
            "comment.json": ("// stats\n" + good, "not valid JSON"),
            "two-documents.json": (good + good, "not valid JSON"),
            "pools-array.json": (json.dumps(dict(STATS_GOOD, pools=[1])), '"pools"'),
            "pool-number.json": (json.dumps(dict(STATS_GOOD, pools={"unified": 3})),
                                 "pools.unified is not an object"),
            "schema-number.json": (json.dumps(dict(STATS_GOOD, schema=1)), "schema"),
        }
        for name, (content, needle) in cases.items():
            with self.subTest(file=name):
                path = os.path.join(self.tmp, name)
                with open(path, "wb") as f:
                    f.write(content if isinstance(content, bytes) else content.encode(
                        "utf-8", "surrogateescape"))
                self.assertRefused(path, needle)
        with self.subTest(file="a directory"):
            self.assertRefused(self.tmp, self.tmp)
        with self.subTest(file="/dev/zero"):
            self.assertRefused("/dev/zero", "not")
        # Every truncation of a good file is refused the same way.
        path = os.path.join(self.tmp, "cut.json")
        for cut in range(0, len(good) - 1, max(1, len(good) // 60)):
            with self.subTest(cut=cut):
                with open(path, "w") as f:
                    f.write(good[:cut])
                self.assertRefused(path, "not valid JSON")

    def test_large_but_valid(self):
        """Many pools and long names are shown, not refused."""
        pools = {f"pool{i}": STATS_GOOD["pools"]["unified"] for i in range(5000)}
        pools["n" * 100000] = STATS_GOOD["pools"]["unified"]
        path = self.write("many.json", dict(STATS_GOOD, pools=pools))
        r = launch(["stats", path])
        self.assertEqual(r.returncode, 0, r.stderr[-500:])
        self.assertIn("pool4999", r.stdout)

    def test_usage_errors(self):
        self.assertUsageError(launch(["stats"]), "FILE")
        self.assertUsageError(launch(["stats", "--plot"]), "--plot")
        self.assertUsageError(launch(["stats", "--bar", "x.json"]), "--bar")

    def test_plot(self):
        missing = matplotlib_missing()
        if missing:
            print(f"skipping test_plot: {PYTHON} cannot import matplotlib ({missing}); "
                  "install python3-matplotlib", file=sys.stderr)
            self.skipTest("matplotlib is not importable")
        path = self.write("good.json", STATS_GOOD)
        png = os.path.join(self.tmp, "out.png")
        r = launch(["stats", path, "--plot", png], env=clean_env(MPLCONFIGDIR=self.tmp))
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(png, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        self.assertGreater(os.path.getsize(png), 1000)

    def test_plot_without_matplotlib(self):
        # A matplotlib that cannot be imported, first on the path.
        fake = os.path.join(self.tmp, "fake-site", "matplotlib")
        os.makedirs(fake)
        with open(os.path.join(fake, "__init__.py"), "w") as f:
            f.write("raise ImportError('No module named matplotlib (test double)')\n")
        path = self.write("good.json", STATS_GOOD)
        png = os.path.join(self.tmp, "out.png")
        r = launch(["stats", "--plot=" + png, path],
                   env=clean_env(PYTHONPATH=os.path.dirname(fake), MPLCONFIGDIR=self.tmp))
        self.assertEqual(r.returncode, 1)
        self.assertIn("python3-matplotlib", r.stderr)
        self.assertFalse(os.path.exists(png))


class HelpTests(Base):
    COMMANDS = [[], ["run"], ["info"], ["stats"]]

    def test_help_everywhere(self):
        for cmd in self.COMMANDS:
            for flag in ("--help", "-h"):
                with self.subTest(cmd=cmd, flag=flag):
                    r = launch(cmd + [flag])
                    self.assertEqual(r.returncode, 0, r.stderr)
                    for section in ("NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "ENVIRONMENT",
                                    "EXIT STATUS"):
                        self.assertRegex(r.stdout, rf"(?m)^{section}$")
                    self.assertEqual(r.stderr, "")
        for cmd in ("run", "info", "stats"):
            self.assertEqual(launch(["help", cmd]).stdout, launch([cmd, "--help"]).stdout)

    def test_version_everywhere(self):
        for cmd in self.COMMANDS:
            with self.subTest(cmd=cmd):
                r = launch(cmd + ["--version"])
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(r.stdout, f"mnemosyne {VERSION}\n")

    def test_run_help_lists_every_option(self):
        out = launch(["run", "--help"]).stdout
        flat = " ".join(out.split())
        for flag, value, var, _ in ALL_FLAGS:
            self.assertRegex(out, rf"(?m)^    {flag}[ \[]")
            self.assertIn("Sets " + var + ".", flat)
        self.assertEqual(out.count("Default:"), len(ALL_FLAGS))
        self.assertEqual(out.count("Example:"), len(ALL_FLAGS))
        for status in ("125", "126", "127"):
            self.assertRegex(out, rf"(?m)^    {status}\s")

    def test_info_help_documents_json_keys(self):
        out = launch(["info", "--help"]).stdout
        for key in ("schema", "driver.available", "devices[]", "backends.<name>", "ok",
                    "reason", "pageable_memory_access_everywhere"):
            self.assertIn(key, out)

    def test_help_lines_fit(self):
        for cmd in self.COMMANDS:
            out = launch(cmd + ["--help"]).stdout
            long_lines = [line for line in out.splitlines()
                          if len(line) > 80 and " " in line.strip()]
            self.assertEqual(long_lines, [], f"{cmd}: lines over 80 columns")

    def test_unknown_commands_and_options(self):
        self.assertUsageError(launch(["frobnicate"]), "frobnicate")
        self.assertUsageError(launch(["--frobnicate"]), "--frobnicate")
        self.assertUsageError(launch([]), "command")
        self.assertUsageError(launch(["help", "frobnicate"]), "frobnicate")


class InstallTests(Base):
    def test_install(self):
        build = ENV.get("MNEMOSYNE_TEST_BUILD_ROOT", "")
        meson = ENV.get("MNEMOSYNE_TEST_MESON", "")
        if not build or not meson:
            self.skipTest("MNEMOSYNE_TEST_BUILD_ROOT or MNEMOSYNE_TEST_MESON not set")
        prefix = ENV["MNEMOSYNE_TEST_PREFIX"]
        libdir = ENV["MNEMOSYNE_TEST_LIBDIR"]
        bindir = ENV["MNEMOSYNE_TEST_BINDIR"]
        includedir = ENV["MNEMOSYNE_TEST_INCLUDEDIR"]
        datadir = ENV["MNEMOSYNE_TEST_DATADIR"]

        # `meson install` writes meson-logs/install-log.txt next to
        # meson-private/ (resolved through links). A shadow of the build
        # directory made of links, with real meson-private/ and meson-logs/
        # directories, keeps every write inside the temporary directory.
        shadow = os.path.join(self.tmp, "build")
        os.makedirs(os.path.join(shadow, "meson-logs"))
        os.makedirs(os.path.join(shadow, "meson-private"))
        for entry in os.listdir(build):
            if entry not in ("meson-logs", "meson-private"):
                os.symlink(os.path.join(build, entry), os.path.join(shadow, entry))
        private = os.path.join(build, "meson-private")
        for entry in os.listdir(private):
            os.symlink(os.path.join(private, entry), os.path.join(shadow, "meson-private", entry))

        build_log = os.path.join(build, "meson-logs", "install-log.txt")
        log_before = os.stat(build_log).st_mtime_ns if os.path.exists(build_log) else None

        dest = os.path.join(self.tmp, "dest")
        r = subprocess.run([meson, "install", "-C", shadow, "--no-rebuild", "--destdir", dest,
                            "--skip-subprojects", "--quiet"],
                           env=clean_env(), capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

        def under(d, *rest):
            d = d if os.path.isabs(d) else os.path.join(prefix, d)
            return os.path.join(dest + d, *rest)

        exe = under(bindir, "mnemosyne")
        lib = under(libdir, "libmnemosyne.so")
        header = under(includedir, "mnemosyne.h")
        pc = under(libdir, "pkgconfig", "mnemosyne.pc")
        script = under(datadir, "mnemosyne", "plot_stats.py")
        for path in (exe, lib, header, pc, script):
            self.assertTrue(os.path.isfile(path), f"{path} not installed")
        self.assertTrue(os.access(exe, os.X_OK))
        with open(pc) as f:
            text = f.read()
        self.assertRegex(text, r"(?m)^Libs: .*-lmnemosyne")
        self.assertRegex(text, r"(?m)^Cflags: .*-I\$\{includedir\}")
        self.assertIn("preload", text.lower())

        r = subprocess.run([exe, "run", "--cuda-driver", FAKE, "--", PYTHON, "-c",
                            "import os; print(os.environ['LD_PRELOAD']); print('ran')"],
                           env=clean_env(), capture_output=True, text=True, timeout=TIMEOUT)
        self.assertEqual(r.returncode, 0, r.stderr)
        preload, ran = r.stdout.splitlines()[-2:]
        self.assertEqual(preload, os.path.realpath(lib))
        self.assertEqual(ran, "ran")

        # The installed launcher's help names the installed library too.
        r = subprocess.run([exe, "run", "--help"], env=clean_env(), capture_output=True,
                           text=True, timeout=TIMEOUT)
        self.assertIn(os.path.realpath(lib), r.stdout.replace("\n    ", " ").replace("\n", ""))
        log_after = os.stat(build_log).st_mtime_ns if os.path.exists(build_log) else None
        self.assertEqual(log_before, log_after, "meson install wrote into the build directory")
        self.assertTrue(os.path.isfile(os.path.join(shadow, "meson-logs", "install-log.txt")))


class CudaHeadersTests(unittest.TestCase):
    """scripts/find-cuda-headers.sh: where the build finds cuda.h and
    cudaTypedefs.h, in its order, on machines laid out as toolkits lay
    them out."""

    SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                          "find-cuda-headers.sh")

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="mnemosyne-cuda-headers-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def toolkit(self, name, sub="include", typedefs=True):
        inc = os.path.join(self.tmp, name, sub)
        os.makedirs(inc)
        for header in ["cuda.h"] + (["cudaTypedefs.h"] if typedefs else []):
            open(os.path.join(inc, header), "w").close()
        return os.path.join(self.tmp, name), inc

    def find(self, **env):
        clean = {k: v for k, v in ENV.items()
                 if k not in ("CUDA_PATH", "CUDA_HOME", "CUDA_ROOT", "CONDA_PREFIX")}
        clean["PATH"] = "/usr/bin:/bin"
        clean.update(env)
        return subprocess.run(["sh", self.SCRIPT], env=clean, capture_output=True, text=True,
                              timeout=TIMEOUT)

    def test_named_toolkits_in_order(self):
        path, path_inc = self.toolkit("path")
        home, home_inc = self.toolkit("home")
        self.assertEqual(self.find(CUDA_HOME=home).stdout.strip(), home_inc)
        self.assertEqual(self.find(CUDA_PATH=path, CUDA_HOME=home).stdout.strip(), path_inc)
        self.assertEqual(self.find(CUDA_ROOT=home).stdout.strip(), home_inc)

    def test_headers_without_typedefs_are_passed_over(self):
        half, _ = self.toolkit("half", typedefs=False)
        home, home_inc = self.toolkit("home")
        self.assertEqual(self.find(CUDA_PATH=half, CUDA_HOME=home).stdout.strip(), home_inc)

    def test_nvcc_on_path_names_its_toolkit_through_a_symlink(self):
        tk, inc = self.toolkit("cuda-12.4", sub=os.path.join("targets", os.uname().machine + "-linux",
                                                               "include"))
        os.makedirs(os.path.join(tk, "bin"))
        nvcc = os.path.join(tk, "bin", "nvcc")
        with open(nvcc, "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(nvcc, 0o755)
        bindir = os.path.join(self.tmp, "bin")
        os.makedirs(bindir)
        os.symlink(nvcc, os.path.join(bindir, "nvcc"))
        got = self.find(PATH=bindir + ":/usr/bin:/bin")
        self.assertEqual(got.stdout.strip(), inc)

    def test_conda_environment(self):
        env, inc = self.toolkit("conda", sub=os.path.join("targets", os.uname().machine + "-linux",
                                                          "include"))
        self.assertEqual(self.find(CONDA_PREFIX=env).stdout.strip(), inc)

    def test_none_found_names_where_it_looked(self):
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            self.skipTest("needs root and unshare to hide the machine's own toolkit")
        cmd = ("mount -t tmpfs none /usr/local/cuda 2>/dev/null || true; "
               "mount -t tmpfs none /usr/include; sh " + self.SCRIPT)
        got = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True,
                             timeout=TIMEOUT, env={"PATH": "/usr/bin:/bin",
                                                   "CUDA_HOME": os.path.join(self.tmp, "none")})
        self.assertEqual(got.returncode, 1, got.stderr)
        self.assertEqual(got.stdout.split(), [
            os.path.join(self.tmp, "none", "include"),
            os.path.join(self.tmp, "none", "targets", os.uname().machine + "-linux", "include"),
            "/usr/local/cuda/include", "/usr/include"])


SOURCE_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def fixtures():
    """../shared/fixtures (scripts/find-fixtures.sh), or None."""
    found = subprocess.run(["sh", os.path.join(SOURCE_ROOT, "scripts", "find-fixtures.sh")],
                           capture_output=True, text=True, timeout=TIMEOUT)
    return found.stdout.strip() if found.returncode == 0 else None


class MimallocSourceTests(unittest.TestCase):
    """scripts/fetch-mimalloc.sh: mimalloc 2.0.9's source from wherever it can
    be had, checked by content, patched into subprojects/mimalloc/source/; in
    a copy of the scripts and patches, so the checkout's own tree is never
    touched. Upstream's repository is its git bundle in ../shared/fixtures."""

    TREE = "d0d7a2705a1e0060a122e956a2575fc90614edcc"
    COMMIT = "28cf67e5b64c704cad993c71f29a24e781bee544"

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="mnemosyne-mimalloc-source-")
        self.root = os.path.join(self.tmp, "root")
        os.makedirs(os.path.join(self.root, "scripts"))
        shutil.copy(os.path.join(SOURCE_ROOT, "scripts", "fetch-mimalloc.sh"),
                    os.path.join(self.root, "scripts"))
        shutil.copytree(os.path.join(SOURCE_ROOT, "subprojects", "mimalloc", "patches"),
                        os.path.join(self.root, "subprojects", "mimalloc", "patches"))
        fix = fixtures()
        self.bundle = os.path.join(fix, "mimalloc-v2.0.9.bundle") if fix else None

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def need_bundle(self):
        if not self.bundle or not os.path.isfile(self.bundle):
            self.skipTest("../shared/fixtures/mimalloc-v2.0.9.bundle is absent: upstream's "
                          "repository has no stand-in here")

    def fetch(self, *args):
        return subprocess.run(["bash", os.path.join(self.root, "scripts", "fetch-mimalloc.sh")] +
                              list(args), capture_output=True, text=True, timeout=TIMEOUT)

    def source(self, *path):
        return os.path.join(self.root, "subprojects", "mimalloc", "source", *path)

    def assert_patched(self, got):
        self.assertEqual(got.returncode, 0, got.stderr)
        with open(self.source("src", "os.c")) as f:
            self.assertIn("mnemosyne: the embedder's segment provider", f.read())
        with open(self.source("src", "arena.c")) as f:
            self.assertIn("mnemosyne: a block never claimed before is zero", f.read())
        # Debian's layout: upstream's documentation and IDE folders left out.
        for folder in ("bin", "doc", "docs", "ide"):
            self.assertFalse(os.path.exists(self.source(folder)), folder)

    def upstream_tarball(self, tamper=False):
        """Upstream's release tarball as GitHub makes it (git archive of the
        tag, one top folder), made from the bundle."""
        repo = os.path.join(self.tmp, "repo")
        subprocess.run(["git", "clone", "-q", "--no-checkout", self.bundle, repo], check=True,
                       capture_output=True)
        tree = os.path.join(self.tmp, "tree")
        os.makedirs(tree)
        archive = subprocess.run(["git", "-C", repo, "archive", "--prefix=mimalloc-2.0.9/",
                                  self.COMMIT], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        if tamper:
            with open(os.path.join(tree, "mimalloc-2.0.9", "src", "alloc.c"), "a") as f:
                f.write("/* not upstream's */\n")
        out = os.path.join(self.tmp, "v2.0.9.tar.gz")
        subprocess.run(["tar", "-czf", out, "-C", tree, "mimalloc-2.0.9"], check=True)
        return out

    def test_upstream_at_its_commit(self):
        self.need_bundle()
        got = self.fetch("--sources", "present,upstream", "--upstream", self.bundle)
        self.assert_patched(got)
        self.assertIn("mimalloc source: upstream", got.stderr)
        # Again: nothing to do, nothing said.
        again = self.fetch("--sources", "present")
        self.assertEqual((again.returncode, again.stderr), (0, ""))
        # A changed patch remakes the tree from the copy kept, fetching nothing.
        patch = os.path.join(self.root, "subprojects", "mimalloc", "patches",
                             "mimalloc-huge-calloc.patch")
        with open(patch) as f:
            text = f.read()
        with open(patch, "w") as f:
            f.write("A changed explanation.\n" + text)
        remade = self.fetch("--sources", "present")
        self.assert_patched(remade)
        self.assertIn("(patched)", remade.stderr)

    def test_a_release_tarball_given_or_put_in_place(self):
        self.need_bundle()
        tarball = self.upstream_tarball()
        self.assert_patched(self.fetch("--sources", "given", "--source", tarball))
        shutil.rmtree(os.path.join(self.root, "subprojects", "mimalloc", "source"))
        shutil.rmtree(os.path.join(self.root, "subprojects", "packagecache"))
        cache = os.path.join(self.root, "subprojects", "packagecache")
        os.makedirs(cache)
        shutil.copy(tarball, cache)
        self.assert_patched(self.fetch("--sources", "present"))

    def test_debians_tarball(self):
        for folder in ("packagecache", "packagefiles"):
            tarball = os.path.join(SOURCE_ROOT, "subprojects", folder,
                                   "mimalloc_2.0.9+ds.orig.tar.xz")
            if os.path.isfile(tarball):
                break
        else:
            self.skipTest("no Debian mimalloc_2.0.9+ds.orig.tar.xz in this checkout")
        self.assert_patched(self.fetch("--sources", "given", "--source", tarball))

    def test_another_source_is_refused(self):
        self.need_bundle()
        got = self.fetch("--sources", "given", "--source", self.upstream_tarball(tamper=True))
        self.assertEqual(got.returncode, 1)
        self.assertIn("not mimalloc v2.0.9 (content tree", got.stderr)
        self.assertFalse(os.path.exists(self.source()))

    def test_none_names_what_to_fetch_and_where(self):
        got = self.fetch("--sources", "present,given,upstream",
                         "--upstream", os.path.join(self.tmp, "no-such-repository"))
        self.assertEqual(got.returncode, 1)
        self.assertIn("mimalloc 2.0.9's source could not be had", got.stderr)
        self.assertIn(os.path.join(self.root, "subprojects", "packagecache"), got.stderr)
        self.assertIn("v2.0.9.tar.gz", got.stderr)
        self.assertIn(self.COMMIT, got.stderr)
        self.assertFalse(os.path.exists(self.source()))


class LibraryTests(unittest.TestCase):
    """What the built preload library asks of the system it is loaded on."""

    def dump(self):
        return subprocess.run(["objdump", "-T", "-p", INTERPOSER], capture_output=True, text=True,
                              timeout=TIMEOUT, check=True).stdout

    def test_glibc_versions_and_libraries(self):
        """Default: nothing beyond libc (libdl and libpthread would cost
        every process two more libraries at start). -Dglibc_compat=true:
        nothing newer than glibc 2.31 (src/platform/glibc_symvers.h), with
        the two libraries where 2.31 keeps dl* and pthread_*; the rootfs
        phase of scripts/test.sh loads such a build on Debian 11."""
        dump = self.dump()
        needed = sorted(line.split()[-1] for line in dump.splitlines()
                        if line.strip().startswith("NEEDED"))
        newer = []
        for line in dump.splitlines():
            if "*UND*" not in line:
                continue
            for field in line.split():
                v = field.strip("()")
                if v.startswith("GLIBC_2.") and [int(x) for x in v[6:].split(".")][:2] > [2, 31]:
                    newer.append(f"{line.split()[-1]}@{v}")
        if ENV.get("MNEMOSYNE_TEST_GLIBC_COMPAT") == "true" and ENV.get("MNEMOSYNE_TEST_SANITIZE",
                                                                         "none") == "none":
            self.assertEqual(newer, [], "add these to src/platform/glibc_symvers.h")
            self.assertIn("libdl.so.2", needed)
            self.assertIn("libpthread.so.0", needed)
        elif [int(x) for x in os.confstr("CS_GNU_LIBC_VERSION").split()[1].split(".")[:2]] < [2, 34]:
            # Built on a glibc that keeps dl* and pthread_* apart.
            self.assertEqual(needed, ["libc.so.6", "libdl.so.2", "libpthread.so.0"])
        else:
            self.assertEqual(needed, ["libc.so.6"])


if __name__ == "__main__":
    groups = sys.argv[1:]
    loader = unittest.TestLoader()
    module = sys.modules[__name__]
    if groups:
        suite = unittest.TestSuite(loader.loadTestsFromName(g, module) for g in groups)
    else:
        suite = loader.loadTestsFromModule(module)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)
