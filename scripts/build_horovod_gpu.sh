#!/usr/bin/env bash
# Builds Horovod 0.28.1 with its GPU operations on NCCL (the SOK path on
# GPUs: `horovodrun -np N`, one process per GPU) against the TensorFlow of
# PYTHON, and installs it into TARGET:
#
#   bash scripts/build_horovod_gpu.sh SDIST TARGET
#
# SDIST is the horovod-0.28.1.tar.gz from PyPI (`pip download --no-binary
# :all: --no-deps horovod==0.28.1`), so this runs where nothing can be
# downloaded: the GPU machines, whose 32 cores, nvcc and CMake build it in a
# few minutes. It needs nvcc ($CUDA_HOME, default /usr/local/cuda), NCCL's
# headers and library (the nvidia-nccl-cu12/-cu13 wheel PYTHON imports, or
# NCCL_HOME with include/ and lib/), CMake >= 3.13, and Horovod's runtime
# dependencies (cloudpickle, psutil, pyyaml, packaging) already importable.
#
# Env: PYTHON (default python3), CUDA_HOME, NCCL_HOME (or NCCL_INCLUDE: the
# folder of nccl.h where the NCCL wheel has none), CUDA_CC (the compute
# capabilities to build for, default 90: CUDA 13 builds none below 75),
# JOBS (default: every core).
set -euo pipefail
SDIST=${1:?usage: build_horovod_gpu.sh SDIST TARGET}
TARGET=${2:?usage: build_horovod_gpu.sh SDIST TARGET}
PY=${PYTHON:-python3}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
# shellcheck source=scripts/horovod_sources.sh
source "$(dirname "${BASH_SOURCE[0]}")/horovod_sources.sh"
log() { echo "[build_horovod_gpu] $*" >&2; }

TF_VERSION=$("$PY" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null | tail -1)
[ -n "$TF_VERSION" ] || { log "$PY cannot import TensorFlow"; exit 2; }
for m in cloudpickle psutil yaml packaging; do
  "$PY" -c "import $m" 2>/dev/null || { log "$PY lacks $m (a Horovod runtime dependency)"; exit 2; }
done
[ -x "$CUDA_HOME/bin/nvcc" ] || { log "no nvcc in $CUDA_HOME/bin"; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# NCCL as Horovod's CMake looks for it: include/nccl.h and lib/libnccl.so. The
# wheels ship lib/libnccl.so.2 only, under nvidia/nccl (CUDA 12's) or
# nvidia/cu13 (CUDA 13's); a wheel without the header takes NCCL_INCLUDE's.
if [ -z "${NCCL_HOME:-}" ]; then
  wheel_dir=$("$PY" - <<'PY' 2>/dev/null || true
import glob, os, sys
for entry in sys.path:
    for d in sorted(glob.glob(os.path.join(entry or ".", "nvidia", "*"))):
        if os.path.isfile(os.path.join(d, "lib", "libnccl.so.2")):
            print(d)
            raise SystemExit
PY
)
  include=${NCCL_INCLUDE:-$wheel_dir/include}
  [ -n "$wheel_dir" ] || { log "no libnccl.so.2 under nvidia/*/lib on $PY's path: set NCCL_HOME or install nvidia-nccl-cu13"; exit 2; }
  [ -f "$include/nccl.h" ] || { log "no nccl.h in $include: set NCCL_INCLUDE to a folder holding NCCL's header"; exit 2; }
  NCCL_HOME="$work/nccl"
  mkdir -p "$NCCL_HOME/lib"
  ln -s "$(readlink -f "$include")" "$NCCL_HOME/include"
  ln -s "$wheel_dir/lib/libnccl.so.2" "$NCCL_HOME/lib/libnccl.so"
  ln -s "$wheel_dir/lib/libnccl.so.2" "$NCCL_HOME/lib/libnccl.so.2"
fi
log "TensorFlow $TF_VERSION, $("$CUDA_HOME/bin/nvcc" --version | tail -2 | head -1), NCCL from $NCCL_HOME"

tar -xzf "$SDIST" -C "$work"
src="$work/horovod-0.28.1"
patch_horovod_sources "$src" "$TF_VERSION"
patch_horovod_gpu_sources "$src" "$TF_VERSION"

log "building (log: $work/build.log, kept in TARGET as horovod_build.log)"
mkdir -p "$TARGET"
start=$SECONDS
# CMAKE_POLICY_VERSION_MINIMUM lets CMake 4 configure the Gloo that Horovod
# bundles (it asks for CMake 2.8.12). The forced includes give Horovod's and
# Gloo's sources the standard headers that GCC 13 and later stopped bringing
# in through others (group_table.h is also patched). NVLink multicast stays
# off for the processes this starts as for every other.
if ! env HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_PYTORCH=1 \
     HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_MPI=1 \
     HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME="$NCCL_HOME" HOROVOD_NCCL_LINK=SHARED \
     HOROVOD_CUDA_HOME="$CUDA_HOME" HOROVOD_BUILD_CUDA_CC_LIST="${CUDA_CC:-90}" \
     CMAKE_POLICY_VERSION_MINIMUM=3.5 NCCL_NVLS_ENABLE=0 \
     CXXFLAGS="-include cstdint -include string -include stdexcept ${CXXFLAGS:-}" \
     MAKEFLAGS="-j${JOBS:-$(nproc)}" \
     "$PY" -m pip wheel -v --no-build-isolation --no-deps --no-index -w "$work/dist" "$src" \
     > "$work/build.log" 2>&1; then
  cp "$work/build.log" "$TARGET/horovod_build.log"
  grep -n -m 20 -E "error|Error" "$work/build.log" >&2 || true
  tail -30 "$work/build.log" >&2
  log "the build failed after $((SECONDS - start)) s; full log: $TARGET/horovod_build.log"
  exit 1
fi
cp "$work/build.log" "$TARGET/horovod_build.log"
log "built in $((SECONDS - start)) s"
"$PY" -m pip install -q --no-index --no-deps --target "$TARGET" "$work"/dist/horovod-*.whl
# Horovod's library needs libnccl.so.2 from the loader's path at import.
(cd / && PYTHONPATH="$TARGET${PYTHONPATH:+:$PYTHONPATH}" \
 LD_LIBRARY_PATH="$(readlink -f "$NCCL_HOME/lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$PY" -c '
import horovod, horovod.tensorflow as hvd
hvd.init()
print("horovod", horovod.__version__, "in", horovod.__path__[0], "NCCL", hvd.nccl_built(),
      "CUDA", hvd.cuda_built(), "Gloo", hvd.gloo_built())')
log "use it with PYTHONPATH=$TARGET and NCCL's lib/ on LD_LIBRARY_PATH ($(readlink -f "$NCCL_HOME/lib/libnccl.so.2" | xargs dirname))"
