#!/usr/bin/env python3
"""Writes a PTX file as a C++ header: `constexpr char kPtx[] = R"ptx(...)ptx";`.
One kernel text serves gpu_probe (compiled in) and scripts/gpu_demo.py (read
at run time)."""
import sys

src, out = sys.argv[1], sys.argv[2]
with open(src) as f:
    text = f.read()
if ")ptx\"" in text:
    sys.exit(f"embed_ptx: {src} contains the raw-string delimiter")
with open(out, "w") as f:
    f.write(f"// Generated from {src} by tests/gpu/embed_ptx.py.\n")
    f.write(f'constexpr char kPtx[] = R"ptx({text})ptx";\n')
