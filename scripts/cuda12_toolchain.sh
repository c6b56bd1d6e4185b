#!/usr/bin/env bash
# Assembles the CUDA 12 toolkit that sok_graph's CUDA launchers are built with
# and prints its path (for SOK_GRAPH_CUDA12_HOME):
#
#   bash scripts/cuda12_toolchain.sh [DIR]   # DIR: $SOK_GRAPH_CACHE/cuda12,
#                                            # default ~/.cache/sok_graph/cuda12
#
# Everything comes from Debian's apt and PyPI: clang-19 compiles the .cu files
# (it has no use for nvcc), NVIDIA's CUDA 12.9 wheels give ptxas, libdevice,
# the headers, CUB and libcudart_static.a. A static cudart 12.9 runs on drivers
# >= 525, as TensorFlow's own CUDA 12 builds do; CUDA 13's needs >= 580.
# No CUDA 12 wheel ships `fatbinary`, which clang calls to bundle the cubins and
# PTX: bin/fatbinary is a wrapper that hands clang's images to a CUDA 13
# fatbinary ($CUDA_HOME's or /usr/local/cuda's, else the one in PyPI's
# nvidia-cuda-nvcc wheel) in that version's syntax; the container it writes is
# the same format every CUDA driver reads, the images in it are CUDA 12.9's.
#
# Idempotent: a complete tree is reused (DIR/.complete records what it holds).
# Logs go to stderr; stdout is only the tree's path.
# Env: PYTHON (whose pip installs the wheels; default python3),
#      SOK_GRAPH_CUDA_CLANG (default clang++-19), SOK_GRAPH_FATBINARY (a
#      CUDA >= 13 fatbinary to use instead of looking for one; "pypi" takes
#      the wheel's even where a toolkit is installed).
set -euo pipefail
export PIP_ROOT_USER_ACTION=ignore

CACHE="${SOK_GRAPH_CACHE:-$HOME/.cache/sok_graph}"
DIR="${1:-$CACHE/cuda12}"
PY="${PYTHON:-python3}"
CLANG="${SOK_GRAPH_CUDA_CLANG:-clang++-19}"
CLANG_PKG=clang-19
WHEELS="nvidia-cuda-nvcc-cu12==12.9.86 nvidia-cuda-runtime-cu12==12.9.79 nvidia-cuda-cccl-cu12==12.9.27"
# Only for its fatbinary, where no CUDA >= 13 toolkit is installed.
FATBINARY_WHEEL="nvidia-cuda-nvcc==13.0.88"
TREE="$DIR/cuda-12.9"

log() { echo "[cuda12_toolchain] $*" >&2; }
die() { log "error: $*"; exit 1; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    die "need root (or sudo) to run: $*"; fi
}

# A fatbinary that takes --image3=kind=...,sm=...,file=... (CUDA >= 13).
takes_image3() { [ -x "$1" ] && "$1" --help 2>/dev/null | grep -q -- '--image3'; }

tree_ok() {
  [ "$(cat "$DIR/.complete" 2>/dev/null)" = "$WHEELS $CLANG" ] &&
    [ -x "$TREE/bin/ptxas" ] && [ -f "$TREE/lib64/libcudart_static.a" ] &&
    [ -f "$TREE/include/cuda_runtime_api.h" ] && [ -f "$TREE/include/cub/cub.cuh" ] &&
    [ -d "$TREE/nvvm/libdevice" ] && [ -x "$TREE/bin/fatbinary" ] &&
    takes_image3 "$(readlink -f "$TREE/bin/fatbinary.real")"
}

# --- clang (Debian's) ---------------------------------------------------------
if ! command -v "$CLANG" >/dev/null; then
  [ "$CLANG" = clang++-19 ] || die "$CLANG (SOK_GRAPH_CUDA_CLANG) is not on PATH"
  log "installing $CLANG_PKG with apt"
  as_root apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends \
    "$CLANG_PKG" >&2 || die "apt-get install $CLANG_PKG failed"
  command -v "$CLANG" >/dev/null || die "$CLANG is still not on PATH after installing $CLANG_PKG"
fi

if tree_ok; then
  echo "$TREE"
  exit 0
fi

# --- the CUDA 12.9 wheels -----------------------------------------------------
"$PY" -m pip --version >/dev/null 2>&1 ||
  die "$PY has no pip; set PYTHON to a Python with pip (e.g. a virtualenv's)"
log "installing $WHEELS into $DIR/pip"
rm -rf "$DIR/pip" "$TREE" "$DIR/.complete"
mkdir -p "$DIR"
# shellcheck disable=SC2086
"$PY" -m pip install -q --disable-pip-version-check --no-deps --target "$DIR/pip" $WHEELS >&2 ||
  die "pip could not install $WHEELS"
P="$DIR/pip/nvidia"
for f in cuda_nvcc/bin/ptxas cuda_nvcc/nvvm/libdevice cuda_runtime/lib/libcudart_static.a \
         cuda_runtime/include/cuda_runtime_api.h cuda_cccl/include/cub/cub.cuh; do
  [ -e "$P/$f" ] || die "the wheels lack $f (did their layout change?)"
done

# --- a fatbinary of CUDA >= 13 ------------------------------------------------
REAL=""
case "${SOK_GRAPH_FATBINARY:-}" in
  pypi) ;;
  "") for cand in "${CUDA_HOME:+$CUDA_HOME/bin/fatbinary}" /usr/local/cuda/bin/fatbinary; do
        if [ -n "$cand" ] && takes_image3 "$cand"; then REAL="$(readlink -f "$cand")"; break; fi
      done ;;
  *) takes_image3 "$SOK_GRAPH_FATBINARY" ||
       die "SOK_GRAPH_FATBINARY=$SOK_GRAPH_FATBINARY is not a fatbinary that takes --image3 (CUDA >= 13)"
     REAL="$(readlink -f "$SOK_GRAPH_FATBINARY")" ;;
esac
if [ -z "$REAL" ]; then
  log "no CUDA >= 13 fatbinary installed; taking the one in PyPI's $FATBINARY_WHEEL"
  rm -rf "$DIR/fatbinary-cu13" "$DIR/fatbinary"
  "$PY" -m pip install -q --disable-pip-version-check --no-deps --target "$DIR/fatbinary-cu13" \
    "$FATBINARY_WHEEL" >&2 || die "pip could not install $FATBINARY_WHEEL"
  # Only fatbinary is kept (a static executable apart from libc).
  [ -x "$DIR/fatbinary-cu13/nvidia/cu13/bin/fatbinary" ] || die "$FATBINARY_WHEEL has no bin/fatbinary"
  mv "$DIR/fatbinary-cu13/nvidia/cu13/bin/fatbinary" "$DIR/fatbinary"
  rm -rf "$DIR/fatbinary-cu13"
  REAL="$DIR/fatbinary"
  takes_image3 "$REAL" || die "$REAL does not take --image3"
fi
log "fatbinary: $REAL"

# --- the tree clang takes as --cuda-path ----------------------------------------
# bin/ptxas, nvvm/libdevice, lib64/ and include/ (the three wheels' headers side
# by side), linked relative so that DIR can move.
mkdir -p "$TREE/bin" "$TREE/nvvm" "$TREE/include"
ln -sr "$P/cuda_nvcc/bin/ptxas" "$TREE/bin/ptxas"
ln -sr "$P/cuda_nvcc/nvvm/libdevice" "$TREE/nvvm/libdevice"
ln -sr "$P/cuda_runtime/lib" "$TREE/lib64"
for d in "$P/cuda_runtime/include" "$P/cuda_nvcc/include" "$P/cuda_cccl/include"; do
  for f in "$d"/*; do
    name="${f##*/}"
    case "$name" in __init__.py|__pycache__) continue ;; esac
    [ -e "$TREE/include/$name" ] && die "two wheels ship include/$name"
    ln -sr "$f" "$TREE/include/$name"
  done
done
# clang's __clang_cuda_runtime_wrapper.h includes this curand header, which
# none of the wheels has; sok_graph uses no curand.
printf '#pragma once\n// Empty stand-in (scripts/cuda12_toolchain.sh): sok_graph uses no curand.\n' \
  > "$TREE/include/curand_mtgp32_kernel.h"
ln -sfn "$REAL" "$TREE/bin/fatbinary.real"

# clang-19 calls `fatbinary -64 --create OUT --image=profile=sm_80,file=X.o
# --image=profile=compute_90,file=Y.s ...`; CUDA 13's fatbinary only takes
# --image3=kind=elf|ptx,sm=N,file=F. PTX stays uncompressed, like the cubins.
cat > "$TREE/bin/fatbinary" <<'EOF'
#!/usr/bin/env bash
# Written by scripts/cuda12_toolchain.sh: translates clang's fatbinary
# arguments for the CUDA >= 13 fatbinary that fatbinary.real points to.
# SOK_GRAPH_FATBINARY_LOG=FILE appends both command lines to FILE.
set -euo pipefail
real="$(dirname "$(readlink -f "$0")")/fatbinary.real"
args=(--compress=false)
for a in "$@"; do
  case "$a" in
    --image=profile=sm_*|-image=profile=sm_*|--image=profile=compute_*|-image=profile=compute_*)
      spec="${a#*=}"                 # profile=sm_80,file=X
      profile="${spec%%,*}"; profile="${profile#profile=}"
      file="${spec#*,}"
      [ "${file#file=}" != "$file" ] || { echo "fatbinary wrapper: cannot read $a" >&2; exit 2; }
      case "$profile" in
        sm_*) args+=("--image3=kind=elf,sm=${profile#sm_},$file") ;;
        *) args+=("--image3=kind=ptx,sm=${profile#compute_},$file") ;;
      esac ;;
    --image=*|-image=*) echo "fatbinary wrapper: unexpected image $a" >&2; exit 2 ;;
    *) args+=("$a") ;;
  esac
done
if [ -n "${SOK_GRAPH_FATBINARY_LOG:-}" ]; then
  { echo "clang: fatbinary $*"; echo "real:  $real ${args[*]}"; } >> "$SOK_GRAPH_FATBINARY_LOG"
fi
exec "$real" "${args[@]}"
EOF
chmod +x "$TREE/bin/fatbinary"

# --- check: one kernel through clang, ptxas and fatbinary -----------------------
check="$(mktemp -d)"
trap 'rm -rf "$check"' EXIT
printf '#include <cub/cub.cuh>\n__global__ void k(int* p) { p[threadIdx.x] = 1; }\n' > "$check/k.cu"
"$CLANG" -x cuda --cuda-path="$TREE" --cuda-gpu-arch=sm_80 --cuda-gpu-arch=sm_90 \
  --no-cuda-include-ptx=sm_80 -Wno-unknown-cuda-version -O3 -std=c++17 -fPIC \
  -c "$check/k.cu" -o "$check/k.o" >&2 || die "$CLANG cannot compile CUDA against $TREE"
echo "$WHEELS $CLANG" > "$DIR/.complete"
log "ready: $TREE (CUDA 12.9, $("$CLANG" --version | head -1))"
echo "$TREE"
