#!/usr/bin/env bash
# Compiles every op and kernel source as C++14 against TensorFlow 1.15's
# headers and links the result against its framework library with
# --no-undefined. TF 1.15 needs Python <= 3.7 and cannot run here, but its
# wheel (downloaded from PyPI once, cached) is enough to prove the C++ stays
# valid for it. CPU kernels only: GPU OpKernels target TF 2.x stream APIs.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SOK_GRAPH_CACHE:-$HOME/.cache/sok_graph}/tf-1.15"
WHEEL=tensorflow_cpu-1.15.0-cp37-cp37m-manylinux2010_x86_64.whl
mkdir -p "$CACHE"
if [ ! -f "$CACHE/unpacked/.complete" ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 37 \
    --implementation cp --abi cp37m --platform manylinux2010_x86_64 \
    tensorflow-cpu==1.15.0 -d "$CACHE"
  rm -rf "$CACHE/unpacked"
  python3 - "$CACHE/$WHEEL" "$CACHE/unpacked" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
z.extractall(sys.argv[2], [n for n in z.namelist()
                           if "/include/" in n or n.endswith("libtensorflow_framework.so.1")])
PY
  touch "$CACHE/unpacked/.complete"
fi
TF="$CACHE/unpacked"
OBJ="$(mktemp -d)"
trap 'rm -rf "$OBJ"' EXIT
cd "$REPO"
FLAGS=(-std=c++14 -D_GLIBCXX_USE_CXX11_ABI=0 -fPIC -O0 -w -I.
       -I"$TF/tensorflow_cpu-1.15.0.data/purelib/tensorflow_core/include"
       -I"$TF/tensorflow_core/include")
n=0
for src in tf_ops/*/ops/*.cc tf_ops/*/kernels/*.cc; do
  g++ "${FLAGS[@]}" -c "$src" -o "$OBJ/$n.o"
  n=$((n + 1))
done
echo 'extern "C" const char sok_graph_build_info[] = "SOK_GRAPH_BUILD_INFO{tf_version=1.15.0;cuda=0;}";' \
  > "$OBJ/build_info.cc"
g++ "${FLAGS[@]}" -c "$OBJ/build_info.cc" -o "$OBJ/build_info.o"
g++ -shared -o "$OBJ/libsok_ops.so" "$OBJ"/*.o -L"$TF/tensorflow_core" \
  -l:libtensorflow_framework.so.1 -Wl,--no-undefined
echo "TF 1.15 check: $n sources compiled as C++14 and linked against libtensorflow_framework.so.1"
