#!/bin/sh
# Where the CUDA Toolkit's headers are (cuda.h and cudaTypedefs.h: the build
# uses nothing else). Prints the first directory that has both, or, when
# none has, every directory it looked in, space-separated, and exits 1.
# Looked in, in order: what the user names ($CUDA_PATH, $CUDA_HOME,
# $CUDA_ROOT), nvcc's toolkit (an HPC module puts it on PATH), an active
# conda environment, then where toolkits install: /usr/local/cuda, and
# /usr/include (Debian's and Ubuntu's nvidia-cuda-dev). Used by meson.build
# and scripts/setup.sh.
arch=$(uname -m)
nvcc=$(command -v nvcc 2>/dev/null || true)
# A symlink (/usr/local/bin/nvcc, /usr/bin/nvcc) names the toolkit it points into.
[ -z "$nvcc" ] || nvcc=$(readlink -f "$nvcc" 2>/dev/null || printf %s "$nvcc")
looked=""
for base in "${CUDA_PATH:-}" "${CUDA_HOME:-}" "${CUDA_ROOT:-}" \
            "${nvcc:+$(dirname "$(dirname "$nvcc")")}" "${CONDA_PREFIX:-}"; do
  [ -n "$base" ] || continue
  for dir in "$base/include" "$base/targets/$arch-linux/include"; do
    looked="$looked $dir"
    if [ -f "$dir/cuda.h" ] && [ -f "$dir/cudaTypedefs.h" ]; then
      printf '%s\n' "$dir"
      exit 0
    fi
  done
done
for dir in /usr/local/cuda/include /usr/include; do
  looked="$looked $dir"
  if [ -f "$dir/cuda.h" ] && [ -f "$dir/cudaTypedefs.h" ]; then
    printf '%s\n' "$dir"
    exit 0
  fi
done
printf '%s\n' "${looked# }"
exit 1
