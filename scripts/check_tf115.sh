#!/usr/bin/env bash
# Compiles every op and kernel source -- op registrations, CPU kernels and the
# host side of the GPU kernels -- as C++14 against TensorFlow 1.15's headers
# and links the result against its framework library with --no-undefined.
# TF 1.15 needs Python <= 3.7 and cannot run here, but its wheel (downloaded
# from PyPI once, cached; scripts/tf115_wheel.py) is enough to prove the C++
# stays valid for it. This is the TF 1.15 configuration of the build: Bazel's
# TensorFlow repository is found by importing TensorFlow in the Python that
# runs the build, which TF 1.15 cannot be here.
#
# Sources are compiled as in a CUDA build (SOK_GRAPH_WITH_CUDA=1), so the GPU
# OpKernels are included. The C launchers they call are plain CUDA without any
# TensorFlow header (nvcc builds them for the 2.x libraries); they are not
# rebuilt here: the link takes the functions declared in
# tf_ops/*/kernels/*_launcher.h as defined, and every other symbol must resolve
# in libtensorflow_framework.so.1, libstdc++ or libc.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TF="$(python3 "$REPO/scripts/tf115_wheel.py" headers)"
OBJ="$(mktemp -d)"
trap 'rm -rf "$OBJ"' EXIT
cd "$REPO"
# -DNDEBUG as in the Bazel build (tf_ops/build/sok_ops.bzl says why).
FLAGS=(-std=c++14 -D_GLIBCXX_USE_CXX11_ABI=0 -DNDEBUG -DSOK_GRAPH_WITH_CUDA=1 -fPIC -O0 -w -I.
       -I"$TF/tensorflow_cpu-1.15.0.data/purelib/tensorflow_core/include"
       -I"$TF/tensorflow_core/include")
JOBS="${SOK_GRAPH_JOBS:-2}"
n=0
gpu=0
pids=()
for src in tf_ops/*/ops/*.cc tf_ops/*/kernels/*.cc; do
  if grep -q DEVICE_GPU "$src"; then gpu=$((gpu + 1)); fi
  g++ "${FLAGS[@]}" -c "$src" -o "$OBJ/$n.o" &
  pids+=("$!")
  n=$((n + 1))
  if [ "${#pids[@]}" -ge "$JOBS" ]; then
    wait "${pids[0]}"
    pids=("${pids[@]:1}")
  fi
done
for pid in "${pids[@]}"; do wait "$pid"; done
echo 'extern "C" const char sok_graph_build_info[] = "SOK_GRAPH_BUILD_INFO{tf_version=1.15.0;cuda=1;}";' \
  > "$OBJ/build_info.cc"
g++ "${FLAGS[@]}" -c "$OBJ/build_info.cc" -o "$OBJ/build_info.o"

# The launcher symbols the objects need; each must be declared in a launcher header.
declared="$(grep -ho 'sok_[a-z0-9_]*(' tf_ops/*/kernels/*_launcher.h | tr -d '(' | sort -u)"
defsyms=()
for sym in $(nm -u "$OBJ"/*.o | awk '$1 == "U" && $2 ~ /^sok_/ {print $2}' | sort -u); do
  if ! grep -qx "$sym" <<<"$declared"; then
    echo "TF 1.15 check: undefined symbol $sym is not a launcher declared in tf_ops/*/kernels/*_launcher.h"
    exit 1
  fi
  defsyms+=("-Wl,--defsym=$sym=0")
done
g++ -shared -o "$OBJ/libsok_ops.so" "$OBJ"/*.o -L"$TF/tensorflow_core" \
  -l:libtensorflow_framework.so.1 -Wl,--no-undefined "${defsyms[@]}"
echo "TF 1.15 check: $n sources ($gpu with GPU kernels) compiled as C++14 and linked against" \
  "libtensorflow_framework.so.1 (${#defsyms[@]} CUDA launcher symbols taken as defined)"
