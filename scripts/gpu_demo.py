#!/usr/bin/env python3
"""The demo: a NumPy array's memory handed to a GPU kernel by pointer, in
place, with the result checked from NumPy. Run it under mnemosyne:

    mnemosyne run --backend=unified -- python3 scripts/gpu_demo.py

NumPy allocates with malloc, so under mnemosyne the array already lies in
CUDA managed memory: CuPy (or PyTorch) can work on it where it is, with no
cudaMalloc and no copy. Without mnemosyne the kernel faults, unless the GPU
has pageable memory access."""
import sys

import numpy as np

a = np.arange(1 << 22, dtype=np.float32)  # 16 MiB, from malloc
want = np.arange(1 << 22, dtype=np.float32) * 2 + 1

try:
    import cupy as cp
    mem = cp.cuda.UnownedMemory(a.ctypes.data, a.nbytes, a)
    d = cp.ndarray(a.shape, a.dtype, cp.cuda.MemoryPointer(mem, 0))  # a view, not a copy
    d *= 2
    d += 1
    cp.cuda.runtime.deviceSynchronize()
    used = f"CuPy {cp.__version__}"
except ImportError:
    import torch

    class View:  # __cuda_array_interface__ over the NumPy buffer
        __cuda_array_interface__ = {"shape": a.shape, "typestr": "<f4",
                                    "data": (a.ctypes.data, False), "version": 2}

    t = torch.as_tensor(View(), device="cuda")  # wraps the pointer, no copy
    t.mul_(2).add_(1)
    torch.cuda.synchronize()
    used = f"PyTorch {torch.__version__}"

ok = np.array_equal(a, want)
print(f"{used}: kernel ran on NumPy memory at {a.ctypes.data:#x} in place; "
      f"result checked from NumPy: {'ok' if ok else 'WRONG'}")
sys.exit(0 if ok else 1)
