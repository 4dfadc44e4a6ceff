"""The machine's memory as the fork benchmarks measure it."""


def mem_available_kib():
    """MemAvailable from /proc/meminfo, in KiB."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    raise RuntimeError("no MemAvailable in /proc/meminfo")
