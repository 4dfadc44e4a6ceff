"""A PyTorch DataLoader over a dataset held in memory, with worker processes
(fork is their default start method on Linux): each worker is forked from
the parent when the loader's iterator is made, and gets the dataset through
the fork. Measured:

  first_batch_s  from making the iterator (the forks) to the first batch
  epoch_s        from making the iterator to the end of one epoch
  lost_mib       the memory the machine lost while the workers lived
                 (MemAvailable before the iterator, less after the first batch)

The dataset: --mib MiB of float32 samples of 64 KiB (NumPy arrays: their data
is malloc'd). Each sample's checksum is compared with the parent's.

Prints one line of JSON. Usage: fork_dataloader.py [--mib N] [--workers N]
"""
import argparse
import json
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from meminfo import mem_available_kib


class InMemory(Dataset):
    def __init__(self, mib):
        rng = np.random.default_rng(7)
        per = 64 * 1024 // 4
        self.samples = [rng.random(per, dtype=np.float32) for _ in range(mib * 16)]
        self.sums = [float(s.sum(dtype=np.float64)) for s in self.samples]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        s = self.samples[i]
        return torch.from_numpy(s.copy()), torch.tensor(float(s.sum(dtype=np.float64)),
                                                      dtype=torch.float64), i


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=500)
    ap.add_argument("--workers", type=int, default=4)
    a = ap.parse_args()
    torch.set_num_threads(1)
    data = InMemory(a.mib)
    loader = DataLoader(data, batch_size=64, shuffle=True, num_workers=a.workers,
                        generator=torch.Generator().manual_seed(1))
    time.sleep(0.5)  # the heap settled
    before = mem_available_kib()
    started = time.monotonic()
    it = iter(loader)
    first = next(it)
    first_batch_s = time.monotonic() - started
    lost = before - mem_available_kib()
    wrong = 0
    seen = 0
    for batch in [first] + list(it):
        _, sums, idx = batch
        for s, i in zip(sums.tolist(), idx.tolist()):
            wrong += s != data.sums[i]
            seen += 1
    epoch_s = time.monotonic() - started
    ok = wrong == 0 and seen == len(data)
    print(json.dumps({"dataset_mib": a.mib, "workers": a.workers,
                      "first_batch_s": round(first_batch_s, 3), "epoch_s": round(epoch_s, 3),
                      "lost_mib": lost // 1024, "samples": seen, "wrong": wrong, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
