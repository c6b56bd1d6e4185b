#!/usr/bin/env bash
# Sets up everything sok_graph needs on a fresh Debian machine with Python 3.11
# and installs sok_graph, built for one TensorFlow version:
#
#   source scripts/setup_env.sh 2.15.1     # or 2.21.0 or 1.15.0; default 2.15.1
#   source scripts/setup_env.sh 2.15.1 --with-horovod   # and Horovod (multi-worker)
#
# Horovod, the engine of multi-worker runs, is installed only on request
# (--with-horovod, or SOK_GRAPH_WITH_HOROVOD=1): single-process work does not
# use it, and the first time it is built from source for the TF version
# (minutes). scripts/run_tests.sh asks for it; scripts/run_demo.sh does not.
# A virtualenv that has Horovod keeps it either way.
#
# TensorFlow 1.15 needs Python 3.7: its virtualenv is made from pyenv's
# CPython 3.7.16 (or a python3.7 on PATH), with the last versions of the test
# dependencies that still support 3.7, and its ops are built CPU-only (C++14,
# the old libstdc++ ABI of TF 1.15's headers; see README, "TensorFlow 1.15").
#
# Afterwards $SOK_PYTHON is the Python of a virtualenv that has that
# TensorFlow and sok_graph installed. What is safe to reuse is cached under
# ~/.cache/sok_graph (override with SOK_GRAPH_CACHE): the virtualenvs (marked
# complete only after a successful install), Bazel's per-TF-version build
# outputs and the Horovod wheels. Installs use only Debian's apt and PyPI.
set -euo pipefail

log() { echo "[setup_env] $*" >&2; }

# Arguments: a TF version and/or --with-horovod, in any order. (Sourced, so
# its variables are the caller's: they carry the sok_setup_ prefix.)
sok_setup_version=""
sok_setup_horovod="${SOK_GRAPH_WITH_HOROVOD:-0}"
if [ "$sok_setup_horovod" != 0 ] && [ "$sok_setup_horovod" != 1 ]; then
  log "SOK_GRAPH_WITH_HOROVOD is '$sok_setup_horovod'; expected 0 or 1"
  return 2 2>/dev/null || exit 2
fi
for sok_setup_arg in "$@"; do
  case "$sok_setup_arg" in
    --with-horovod) sok_setup_horovod=1 ;;
    -*)
      log "unknown argument '$sok_setup_arg'; expected a TensorFlow version" \
          "(e.g. 2.15.1) and/or --with-horovod"
      return 2 2>/dev/null || exit 2 ;;
    *)
      if [ -n "$sok_setup_version" ]; then
        log "got two TensorFlow versions, '$sok_setup_version' and '$sok_setup_arg'; expected one"
        return 2 2>/dev/null || exit 2
      fi
      sok_setup_version="$sok_setup_arg" ;;
  esac
done
SOK_TF_VERSION="${sok_setup_version:-${SOK_TF_VERSION:-2.15.1}}"
SOK_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SOK_GRAPH_CACHE="${SOK_GRAPH_CACHE:-$HOME/.cache/sok_graph}"
export SOK_GRAPH_CACHE

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    log "need root to run: $*"; return 1; fi
}

# SOK_GRAPH_WHEEL=path/to/sok_graph-...whl installs that wheel (built by
# scripts/build_wheel.sh for this TensorFlow) instead of building from this
# checkout: no Bazel, no compiler, no CUDA toolchain. Only when asked for, so
# a stale wheel can never stand in for the source being tested.
if [ -n "${SOK_GRAPH_WHEEL:-}" ] && [ ! -f "$SOK_GRAPH_WHEEL" ]; then
  log "SOK_GRAPH_WHEEL is '$SOK_GRAPH_WHEEL', which is not a file; expected a sok_graph wheel"
  return 2 2>/dev/null || exit 2
fi

# --- system packages: Bazel 4.2.3 (offline-capable), googletest -------------
need_apt=()
if [ -z "${SOK_GRAPH_WHEEL:-}" ]; then
  command -v bazel >/dev/null || need_apt+=(bazel-bootstrap)
  [ -d /usr/share/bazel/rules/java ] || need_apt+=(bazel-rules-java)
  [ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev googletest)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  log "installing ${need_apt[*]} with apt"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# --- a virtualenv per TensorFlow version ------------------------------------
VENV="$SOK_GRAPH_CACHE/venvs/tf-$SOK_TF_VERSION"
# What the tests and the main job need next to TensorFlow. pyarrow 17 works
# with numpy 1.x (TF 2.15) and 2.x (TF 2.21). MovieLens-100k comes inside the
# recbole wheel, installed without its dependencies (torch and more).
# hypothesis drives the fuzz tests (tests/test_fuzz_ops.py).
REQUIREMENTS="tensorflow-cpu==$SOK_TF_VERSION pytest>=7 pyarrow==17.0.0 tqdm matplotlib hypothesis"
NO_DEPS="recbole==1.2.1"
case "$SOK_TF_VERSION" in
  1.*)
    # TF 1.15 has wheels for Python <= 3.7 only. numpy 1.18.5 is the newest
    # it works with; without protobuf 3.20.x `import tensorflow` fails; the
    # rest are the last releases with Python 3.7 wheels.
    if [ -n "${PYTHON:-}" ]; then
      PY_BASE="$PYTHON"
    else
      PY_BASE="$(PYENV_VERSION=3.7.16 pyenv which python3.7 2>/dev/null || command -v python3.7 || true)"
    fi
    if [ -z "$PY_BASE" ] || ! "$PY_BASE" -c 'import sys; assert sys.version_info[:2] == (3, 7)' 2>/dev/null; then
      log "TensorFlow $SOK_TF_VERSION needs Python 3.7; looked for \`PYENV_VERSION=3.7.16 pyenv which python3.7\`" \
          "and python3.7 on PATH and found ${PY_BASE:-neither} (install it: pyenv install 3.7.16, or set PYTHON)"
      return 1 2>/dev/null || exit 1
    fi
    REQUIREMENTS="tensorflow-cpu==$SOK_TF_VERSION numpy==1.18.5 protobuf==3.20.3 pytest==7.4.4"
    REQUIREMENTS="$REQUIREMENTS hypothesis==6.79.4 pyarrow==12.0.1 tqdm matplotlib==3.5.3"
    ;;
  2.7.*|2.8.*|2.9.*|2.10.*|2.11.*)
    # These ask for numpy with no upper bound but fail to import under
    # numpy 2 (_ARRAY_API not found).
    PY_BASE="${PYTHON:-python3}"
    REQUIREMENTS="$REQUIREMENTS numpy<2"
    ;;
  *)
    PY_BASE="${PYTHON:-python3}"
    # TF >= 2.16: Keras 2 as the tf_keras package too (what TF_USE_LEGACY_KERAS=1
    # selects; tests/test_tf_keras_legacy.py). Without its dependencies: it
    # asks for the `tensorflow` wheel, whose files would overwrite
    # tensorflow-cpu's.
    tf_minor="${SOK_TF_VERSION#2.}"; tf_minor="${tf_minor%%.*}"
    if [ "${SOK_TF_VERSION%%.*}" = 2 ] && [ "$tf_minor" -ge 16 ] 2>/dev/null; then
      NO_DEPS="$NO_DEPS tf_keras~=2.$tf_minor.0"
    fi
    ;;
esac
if [ ! -f "$VENV/.complete" ]; then
  log "creating $VENV with tensorflow-cpu==$SOK_TF_VERSION"
  rm -rf "$VENV"
  "$PY_BASE" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade "pip>=23" setuptools wheel
fi
if [ "$(cat "$VENV/.complete" 2>/dev/null)" != "$REQUIREMENTS $NO_DEPS" ]; then
  log "installing $REQUIREMENTS and $NO_DEPS (no deps) into $VENV"
  # shellcheck disable=SC2086
  "$VENV/bin/pip" install -q $REQUIREMENTS
  "$VENV/bin/pip" install -q --no-deps $NO_DEPS
  echo "$REQUIREMENTS $NO_DEPS" > "$VENV/.complete"
fi
SOK_PYTHON="$VENV/bin/python"
export SOK_PYTHON SOK_TF_VERSION

# --- CUDA 12 for the GPU kernels: clang-19 from apt, CUDA 12.9 from PyPI
# (scripts/cuda12_toolchain.sh, cached under $SOK_GRAPH_CACHE/cuda12). Kernels
# built with it run on NVIDIA drivers >= 525, like TensorFlow's CUDA 12 builds;
# the build falls back to nvcc ($CUDA_HOME, /usr/local/cuda) only without it.
# SOK_GRAPH_WITHOUT_CUDA=1 builds CPU-only; a preset SOK_GRAPH_CUDA12_HOME is kept.
# TensorFlow 1.x builds are CPU-only (tf_ops/build/bazelw.py sees to it):
# the kernels target CUDA 12, TF 1.15's GPU build is CUDA 10.0.
if [ -n "${SOK_GRAPH_WHEEL:-}" ]; then
  :  # a wheel carries its kernels
elif [ "${SOK_GRAPH_WITHOUT_CUDA:-0}" = 1 ] || [ "${SOK_TF_VERSION%%.*}" = 1 ]; then
  [ "${SOK_TF_VERSION%%.*}" != 1 ] || log "TensorFlow $SOK_TF_VERSION: building CPU-only"
  unset SOK_GRAPH_CUDA12_HOME
elif [ -z "${SOK_GRAPH_CUDA12_HOME:-}" ]; then
  log "assembling the CUDA 12 toolchain (scripts/cuda12_toolchain.sh)"
  SOK_GRAPH_CUDA12_HOME="$(PYTHON="$VENV/bin/python" bash "$SOK_REPO/scripts/cuda12_toolchain.sh")"
  export SOK_GRAPH_CUDA12_HOME
fi

# --- build the ops for this TensorFlow and install sok_graph ----------------
if [ -n "${SOK_GRAPH_WHEEL:-}" ]; then
  log "installing $SOK_GRAPH_WHEEL (SOK_GRAPH_WHEEL) for TensorFlow $SOK_TF_VERSION"
  "$SOK_PYTHON" -m pip install -q --no-deps --force-reinstall "$SOK_GRAPH_WHEEL"
  # A wheel for another TensorFlow says so here, naming the one it needs.
  (cd / && "$SOK_PYTHON" -c "from sok_graph.ops import library; library.load()")
else
  log "building and installing sok_graph for TensorFlow $SOK_TF_VERSION"
  (cd "$SOK_REPO" && "$SOK_PYTHON" -m pip install -q --no-deps --no-build-isolation \
     --force-reinstall . )
fi

# --- Horovod, the multi-worker engine, when asked for: its wheel is built once
# per TensorFlow version and cached (scripts/install_horovod.sh);
# SOK_GRAPH_WITHOUT_HOROVOD=1 skips it even then. Not asked for, nothing
# is installed or removed.
if [ "$sok_setup_horovod" = 1 ]; then
  bash "$SOK_REPO/scripts/install_horovod.sh" "$SOK_PYTHON" "$SOK_TF_VERSION"
elif [ -f "$VENV/.horovod" ]; then
  log "Horovod: not asked for; the one installed earlier stays in $VENV"
else
  log "Horovod: not installed (multi-worker runs need it: source scripts/setup_env.sh" \
      "$SOK_TF_VERSION --with-horovod)"
fi
log "ready: $SOK_PYTHON"
