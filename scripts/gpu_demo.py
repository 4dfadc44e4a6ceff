#!/usr/bin/env python3
"""The demo: a NumPy array's memory handed to a GPU kernel by pointer, in
place, with the result checked from NumPy. Run it under mnemosyne:

    mnemosyne run --backend=unified -- python3 scripts/gpu_demo.py [--with cupy|torch|driver]

NumPy allocates with malloc, so under mnemosyne the array already lies in
CUDA managed memory: a kernel can work on it where it is, with no
cudaMalloc and no copy. Without mnemosyne the kernel faults, unless the GPU
has pageable memory access. The kernel adds 7 to every int32; it comes from
CuPy, from PyTorch, or (`driver`, needing neither) from the CUDA driver
itself through ctypes, with tests/gpu/probe_add.ptx. The default is the
first of the three that is installed."""
import argparse
import ctypes
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PTX = os.path.join(HERE, "..", "tests", "gpu", "probe_add.ptx")


def with_cupy(a):
    import cupy as cp
    mem = cp.cuda.UnownedMemory(a.ctypes.data, a.nbytes, a)
    d = cp.ndarray(a.shape, a.dtype, cp.cuda.MemoryPointer(mem, 0))  # a view, not a copy
    d += 7
    cp.cuda.runtime.deviceSynchronize()
    return f"CuPy {cp.__version__}"


def with_torch(a):
    import torch

    class View:  # __cuda_array_interface__ over the NumPy buffer
        __cuda_array_interface__ = {"shape": a.shape, "typestr": "<i4",
                                    "data": (a.ctypes.data, False), "version": 2}

    t = torch.as_tensor(View(), device="cuda")  # wraps the pointer, no copy
    t.add_(7)
    torch.cuda.synchronize()
    return f"PyTorch {torch.__version__}"


def with_driver(a):
    """cuInit, the primary context, the PTX module, one launch on a's pointer."""
    path = os.environ.get("MNEMOSYNE_CUDA_DRIVER") or "libcuda.so.1"
    cu = ctypes.CDLL(path)

    def check(rc, what):
        if rc != 0:
            name = ctypes.c_char_p()
            cu.cuGetErrorName(rc, ctypes.byref(name))
            raise RuntimeError(f"{what}: {(name.value or b'?').decode()}")

    check(cu.cuInit(0), "cuInit")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    with open(PTX, "rb") as f:
        image = ctypes.create_string_buffer(f.read())
    module, fn = ctypes.c_void_p(), ctypes.c_void_p()
    check(cu.cuModuleLoadData(ctypes.byref(module), image), "cuModuleLoadData")
    check(cu.cuModuleGetFunction(ctypes.byref(fn), module, b"mnemosyne_probe_add"),
          "cuModuleGetFunction")
    data, n, delta = ctypes.c_void_p(a.ctypes.data), ctypes.c_uint(a.size), ctypes.c_int(7)
    params = (ctypes.c_void_p * 3)(*(ctypes.cast(ctypes.byref(v), ctypes.c_void_p)
                                     for v in (data, n, delta)))
    u = ctypes.c_uint
    check(cu.cuLaunchKernel(fn, u((a.size + 255) // 256), u(1), u(1), u(256), u(1), u(1), u(0),
                            None, params, None), "cuLaunchKernel")
    check(cu.cuCtxSynchronize(), "the kernel")
    return f"the CUDA driver ({os.path.basename(path)}) through ctypes"


WAYS = {"cupy": with_cupy, "torch": with_torch, "driver": with_driver}


def installed(way):
    if way == "driver":
        return True
    try:
        __import__(way)
        return True
    except ImportError:
        return False


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--with", dest="way", choices=list(WAYS),
                        help="the kernel's source (default: the first installed)")
    way = parser.parse_args().way or next(w for w in WAYS if installed(w))

    a = np.arange(1 << 22, dtype=np.int32)  # 16 MiB, from malloc
    want = np.arange(1 << 22, dtype=np.int32) + 7
    try:
        used = WAYS[way](a)
    except Exception as e:  # a fault or a refusal is the finding, not a traceback
        print(f"{way}: the kernel did not run on NumPy memory at {a.ctypes.data:#x}: {e}")
        return 1
    ok = np.array_equal(a, want)
    print(f"{used}: kernel ran on NumPy memory at {a.ctypes.data:#x} in place; "
          f"result checked from NumPy: {'ok' if ok else 'WRONG'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
