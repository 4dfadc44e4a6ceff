#!/usr/bin/python3
"""Draws `mnemosyne stats --plot OUT.png`: a bar chart of a run's pools.

The launcher runs this with /usr/bin/python3 and writes the data on stdin as
one JSON object:

    {"output": "OUT.png",
     "files": [{"label": "run.json",
                "pools": [{"name": "unified", "bytes_reserved": N, "bytes_peak": N,
                           "driver_calls": N, ...}, ...]}, ...]}

Top panel, per pool (MiB): the memory the backend took from the driver
(bytes_backed_peak, and bytes_backed at exit), the peak of live bytes the
program held, and, hatched and apart, the address space reserved
(bytes_reserved), which is not memory.
Bottom panel: driver calls per pool. Exit status 3 when matplotlib cannot be
imported (the launcher then adds nothing to this script's message), 1 on any
other failure.
"""
import json
import os
import sys

EXIT_NO_MATPLOTLIB = 3


def main():
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only, no display
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError as e:
        print(f"mnemosyne stats: --plot needs matplotlib for {sys.executable} ({e}); install "
              "the Debian package python3-matplotlib (apt-get install python3-matplotlib)",
              file=sys.stderr)
        return EXIT_NO_MATPLOTLIB

    data = json.load(sys.stdin)
    output = data["output"]
    files = data["files"]
    several = len(files) > 1

    labels, backed_peak, backed, peak, reserved, calls = [], [], [], [], [], []
    for f in files:
        for pool in f["pools"]:
            labels.append(f"{f['label']}\n{pool['name']}" if several else pool["name"])
            backed_peak.append(pool.get("bytes_backed_peak", 0) / 2**20)
            backed.append(pool.get("bytes_backed", 0) / 2**20)
            peak.append(pool.get("bytes_peak", 0) / 2**20)
            reserved.append(pool.get("bytes_reserved", 0) / 2**20)
            calls.append(pool.get("driver_calls", 0))

    width = max(6.0, 1.4 * len(labels) + 2)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(width, 7), sharex=True)
    positions = list(range(len(labels)))
    bar = 0.2
    top.bar([p - 1.5 * bar for p in positions], backed_peak, bar, color="tab:blue",
            label="memory, peak (taken from the driver)")
    top.bar([p - 0.5 * bar for p in positions], backed, bar, color="tab:cyan",
            label="memory at exit")
    top.bar([p + 0.5 * bar for p in positions], peak, bar, color="tab:orange",
            label="live blocks, peak (what the program held)")
    top.bar([p + 1.5 * bar for p in positions], reserved, bar, fill=False, hatch="//",
            edgecolor="tab:gray", label="address space reserved (not memory)")
    top.set_ylabel("MiB")
    top.set_title("mnemosyne: memory per pool")
    top.legend(fontsize="small")
    bottom.bar(positions, calls, 0.6, color="tab:green")
    bottom.set_ylabel("driver calls")
    bottom.yaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.set_title("CUDA driver calls per pool")
    bottom.set_xticks(positions)
    bottom.set_xticklabels(labels)
    if not labels:
        top.text(0.5, 0.5, "no pools", ha="center", va="center", transform=top.transAxes)
    fig.tight_layout()
    try:
        fig.savefig(output, format="png")
    except OSError as e:
        print(f"mnemosyne stats: cannot write {output}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    # Keep matplotlib's cache out of unwritable homes without a warning.
    if "MPLCONFIGDIR" not in os.environ and not os.access(os.path.expanduser("~"), os.W_OK):
        import tempfile
        os.environ["MPLCONFIGDIR"] = tempfile.mkdtemp(prefix="mnemosyne-mpl-")
    sys.exit(main())
