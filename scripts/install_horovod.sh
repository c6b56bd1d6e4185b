#!/usr/bin/env bash
# Installs Horovod 0.28.1 (TensorFlow ops, Gloo controller; no MPI, PyTorch or
# MXNet) into the virtualenv of one TensorFlow version:
#
#   bash scripts/install_horovod.sh [PYTHON [TF_VERSION]]
#
# PYTHON defaults to $SOK_PYTHON, TF_VERSION to $SOK_TF_VERSION (both set by
# scripts/setup_env.sh, which runs this when asked to: --with-horovod or
# SOK_GRAPH_WITH_HOROVOD=1). Nothing happens when SOK_GRAPH_WITHOUT_HOROVOD=1.
#
# One version serves every TensorFlow: 0.28.1, Horovod's last release, still
# accepts TensorFlow 1.15 (its CMake asks for >= 1.15.0; below TF 2.10 it
# builds with C++14 and the ABI flag from tf.sysconfig) and Python 3.6+.
#
# Horovod ships as an sdist only, and its compiled ops must match the
# TensorFlow they are loaded into, so the wheel is built here (~7 min on
# 2 cores) and cached per TensorFlow and Python version under
# $SOK_GRAPH_CACHE/wheels/; later runs install the cached wheel. A wheel is
# moved into the cache only after a build succeeded, so a failed or
# interrupted build is retried on the next run instead of being reused.
set -euo pipefail

HOROVOD_VERSION=0.28.1
# The local changes to the sdist, and HOROVOD_PATCH_LEVEL, part of the cache key.
# shellcheck source=scripts/horovod_sources.sh
source "$(dirname "${BASH_SOURCE[0]}")/horovod_sources.sh"
PY="${1:-${SOK_PYTHON:-}}"
TF_VERSION="${2:-${SOK_TF_VERSION:-}}"
SOK_GRAPH_CACHE="${SOK_GRAPH_CACHE:-$HOME/.cache/sok_graph}"

log() { echo "[install_horovod] $*" >&2; }

if [ "${SOK_GRAPH_WITHOUT_HOROVOD:-0}" = 1 ]; then
  log "SOK_GRAPH_WITHOUT_HOROVOD=1: not installing Horovod"
  exit 0
fi
if [ -z "$PY" ] || [ ! -x "$PY" ]; then
  log "expected the virtualenv's python as the first argument or \$SOK_PYTHON; got '${PY}'"
  exit 2
fi
if [ -z "$TF_VERSION" ]; then
  log "expected the TensorFlow version as the second argument or \$SOK_TF_VERSION"
  exit 2
fi
VENV="$(cd "$(dirname "$PY")/.." && pwd)"

PY_TAG="$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"
# Horovod's runtime dependencies. setup.py also lists them as setup_requires,
# so they must be present before the build (otherwise setuptools fetches them
# itself). None of them depends on anything, so --no-deps installs them whole
# and can never move the TensorFlow or numpy of the venv.
RUNTIME_DEPS=(cloudpickle psutil pyyaml packaging)

# The build directory goes whatever happens; only a finished wheel stays.
work=""
trap '[ -z "$work" ] || rm -rf "$work"' EXIT

BUILD_NAME="horovod-$HOROVOD_VERSION-p$HOROVOD_PATCH_LEVEL-tf-$TF_VERSION-$PY_TAG"
WHEEL_DIR="$SOK_GRAPH_CACHE/wheels/$BUILD_NAME"
WHEEL_MARK="$WHEEL_DIR/.complete"
VENV_MARK="$VENV/.horovod"

cached_wheel() { [ -f "$WHEEL_MARK" ] && echo "$WHEEL_DIR/$(cat "$WHEEL_MARK")"; }

installed_version() {
  # importlib.metadata is Python 3.8+; pkg_resources serves Python 3.7.
  "$PY" -c '
try:
    import importlib.metadata as m
    print(m.version("horovod"))
except ImportError:
    import pkg_resources
    print(pkg_resources.get_distribution("horovod").version)
' 2>/dev/null || true
}

# Already installed from the cached wheel (and still there): nothing to do.
if wheel="$(cached_wheel)" && [ -f "$wheel" ] \
   && [ "$(cat "$VENV_MARK" 2>/dev/null)" = "$(sha256sum "$wheel" | cut -d' ' -f1)" ] \
   && [ "$(installed_version)" = "$HOROVOD_VERSION" ]; then
  log "Horovod $HOROVOD_VERSION already installed in $VENV"
  exit 0
fi

log "installing Horovod's runtime dependencies (${RUNTIME_DEPS[*]}) into $VENV"
"$PY" -m pip install -q --no-deps "${RUNTIME_DEPS[@]}"

cmake_version_ok() {
  # 3.13 is Horovod's minimum; CMake 4 no longer accepts the
  # cmake_minimum_required(2.8.12) of the Gloo Horovod bundles.
  local v
  v="$("$1" --version 2>/dev/null | sed -n 's/^cmake version \([0-9][0-9.]*\).*/\1/p')"
  [ -n "$v" ] && [ "$(printf '%s\n' 3.13 "$v" | sort -V | head -1)" = 3.13 ] \
    && [ "$(printf '%s\n' 4 "$v" | sort -V | head -1)" = "$v" ]
}

build_wheel() {
  local cmake_bin sdist src
  # HOROVOD_CMAKE is Horovod's own way to name a CMake; else the one on PATH
  # (Debian's cmake package), else the PyPI one.
  cmake_bin="${HOROVOD_CMAKE:-$(command -v cmake || true)}"
  if [ -z "$cmake_bin" ] || ! cmake_version_ok "$cmake_bin"; then
    log "no CMake 3.13..3.x on PATH; installing one from PyPI into $VENV"
    "$PY" -m pip install -q --no-deps "cmake>=3.13,<4"
    cmake_bin="$VENV/bin/cmake"
  fi
  log "using $("$cmake_bin" --version | head -1) ($cmake_bin)"

  mkdir -p "$SOK_GRAPH_CACHE/wheels"
  work="$(mktemp -d "$SOK_GRAPH_CACHE/wheels/.build-XXXXXX")"
  log "downloading the horovod==$HOROVOD_VERSION sdist"
  "$PY" -m pip download -q --no-binary :all: --no-deps -d "$work" "horovod==$HOROVOD_VERSION"
  sdist="$work/horovod-$HOROVOD_VERSION.tar.gz"
  tar -xzf "$sdist" -C "$work"
  src="$work/horovod-$HOROVOD_VERSION"

  patch_horovod_sources "$src" "$TF_VERSION" || return 1

  local logfile="$SOK_GRAPH_CACHE/wheels/$BUILD_NAME.log"
  log "building the wheel against TensorFlow $TF_VERSION (several minutes; log: $logfile)"
  local start=$SECONDS
  # --no-build-isolation: the build must see the venv's TensorFlow (in an
  # isolated build CMake reports "Could NOT find Tensorflow").
  if ! env HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_PYTORCH=1 \
       HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_CMAKE="$cmake_bin" \
       MAKEFLAGS="-j${SOK_GRAPH_BUILD_JOBS:-2}" \
       "$PY" -m pip wheel -v --no-build-isolation --no-deps -w "$work/dist" "$src" \
       >"$logfile" 2>&1; then
    tail -40 "$logfile" >&2
    log "building Horovod $HOROVOD_VERSION against TensorFlow $TF_VERSION failed; full log: $logfile"
    return 1
  fi
  log "built in $((SECONDS - start)) s"
  local built
  built="$(cd "$work/dist" && ls horovod-"$HOROVOD_VERSION"-*.whl)"
  mkdir -p "$WHEEL_DIR"
  rm -f "$WHEEL_MARK"
  mv "$work/dist/$built" "$WHEEL_DIR/$built"
  # Written last: its presence means the wheel next to it is whole.
  echo "$built" > "$WHEEL_MARK.tmp"
  mv "$WHEEL_MARK.tmp" "$WHEEL_MARK"
}

if ! wheel="$(cached_wheel)" || [ ! -f "$wheel" ]; then
  build_wheel
  wheel="$(cached_wheel)"
else
  log "using the cached wheel $wheel"
fi

"$PY" -m pip install -q --no-deps --force-reinstall "$wheel"
# Loads the compiled ops: a wheel built for another TensorFlow fails here.
if ! (cd / && "$PY" -c "import horovod.tensorflow as hvd; hvd.init(); assert hvd.size() == 1") \
     >/dev/null 2>&1; then
  (cd / && "$PY" -c "import horovod.tensorflow as hvd; hvd.init()") >&2 || true
  log "the installed Horovod does not load in $VENV; remove $WHEEL_DIR to rebuild it"
  exit 1
fi
sha256sum "$wheel" | cut -d' ' -f1 > "$VENV_MARK"
log "Horovod $HOROVOD_VERSION ready in $VENV"
