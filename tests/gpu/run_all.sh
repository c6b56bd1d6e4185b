#!/usr/bin/env bash
# Builds sok_graph's CUDA launchers (every tf_ops/*/kernels/*.cu, with the
# Bazel build's nvcc flags and static cudart) and the CPU table reference
# from source, then runs every GPU check and timing: one command for a GPU
# machine that has CUDA, CuPy and PyTorch but no TensorFlow.
#
#   bash tests/gpu/run_all.sh [--quick] [--checks-only]
#   bash tests/gpu/run_all.sh --build-only   # prints the library's path
#
# SOK_GPU_LIB=path/libsok_cuda_kernels.so checks that library instead of
# building one (e.g. the Bazel build's, compiled with CUDA 12 by clang); only
# the CPU reference is built then.
#
# SOK_GPU_SANITIZE=1 first runs the checks (small sizes) under
# compute-sanitizer's memcheck, with CuPy's memory pool off so that an
# out-of-bounds access cannot hide inside a pooled block.
set -euo pipefail
if [[ -n "${SOK_GPU_LIB:-}" ]]; then SOK_GPU_LIB=$(readlink -f -- "$SOK_GPU_LIB"); fi
cd "$(dirname "$0")/../.."
BUILD=${SOK_GPU_BUILD:-/tmp/sok_gpu_build}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
mkdir -p "$BUILD"
# Same targets as tf_ops/build/sok_ops.bzl (CUDA_ARCH_FLAGS).
ARCH=(-gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=sm_90
      -gencode=arch=compute_90,code=compute_90)

start=$(date +%s)
if [[ -n "${SOK_GPU_LIB:-}" ]]; then
  [[ -f "$SOK_GPU_LIB" ]] || { echo "SOK_GPU_LIB=$SOK_GPU_LIB does not exist" >&2; exit 1; }
  g++ -O2 -std=c++14 -ffp-contract=off -shared -fPIC -I. tests/gpu/cpu_table_ref.cc -o "$BUILD/libcpu_table_ref.so"
  echo "prebuilt $SOK_GPU_LIB; built the CPU reference in $(( $(date +%s) - start )) s" >&2
  LIB="$SOK_GPU_LIB"
else
  pids=()
  objs=()
  for src in tf_ops/*/kernels/*.cu; do
    obj="$BUILD/$(echo "${src%.cu}" | tr / _).o"
    objs+=("$obj")
    "$NVCC" -c -O3 -std=c++17 -Xcompiler -fPIC -I. "${ARCH[@]}" -o "$obj" "$src" &
    pids+=($!)
  done
  g++ -O2 -std=c++14 -ffp-contract=off -shared -fPIC -I. tests/gpu/cpu_table_ref.cc -o "$BUILD/libcpu_table_ref.so"
  for pid in "${pids[@]}"; do wait "$pid"; done
  "$NVCC" -shared -cudart static -o "$BUILD/libsok_cuda_kernels.so" "${objs[@]}" \
    -Xlinker --no-undefined
  echo "built ${#objs[@]} CUDA sources + CPU reference in $(( $(date +%s) - start )) s with $("$NVCC" --version | tail -1)" >&2
  LIB="$BUILD/libsok_cuda_kernels.so"
fi

REF="$BUILD/libcpu_table_ref.so"
if [[ "${1:-}" == --build-only ]]; then echo "$LIB"; exit 0; fi
export PYTHONUNBUFFERED=1
if [[ "${SOK_GPU_SANITIZE:-0}" == 1 ]]; then
  SOK_GPU_NO_POOL=1 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
    python3 tests/gpu/run_gpu_checks.py "$LIB" --cpu-ref "$REF" --quick --checks-only \
    && echo "compute-sanitizer memcheck: clean" || echo "compute-sanitizer memcheck: FAILED ($?)"
fi
python3 tests/gpu/run_gpu_checks.py "$LIB" --cpu-ref "$REF" "$@"
