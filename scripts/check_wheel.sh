#!/usr/bin/env bash
# Installs a sok_graph wheel where only TensorFlow is installed and runs the
# smoke suite against it, as a user without a build toolchain would:
#
#   bash scripts/check_wheel.sh dist/sok_graph-0.1.0+tf2.15-....whl 2.15.1 [PYTHON]
#
# A fresh virtualenv (PYTHON, default: python3, or pyenv's 3.7.16 for TF 1.x)
# gets tensorflow-cpu==VERSION, the wheel and pytest, from PyPI and the file.
# The suite then runs with PATH holding that virtualenv only, so Bazel, gcc,
# nvcc and the CUDA toolkit are out of reach; CUDA_HOME and the cache of
# source builds are unset. The smoke suite: SOK's v2 "Get Started"
# walkthrough, the v1 Session flow with OptimizerScope, a lookup demo, a
# MirroredStrategy run with two replicas as workers (TF 2.x), dynamic and
# static tables trained, dumped and loaded in a new process and in a Session
# (tests/test_dump_load.py), and serving exports (Keras, TF1 Session) loaded
# by stock TensorFlow (tests/test_serving.py).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEEL="$(cd "$(dirname "${1:?usage: check_wheel.sh WHEEL TF_VERSION [PYTHON]}")" && pwd)/$(basename "$1")"
TF_VERSION="${2:?usage: check_wheel.sh WHEEL TF_VERSION [PYTHON]}"
log() { echo "[check_wheel] $*" >&2; }

PY_BASE="${3:-}"
if [ -z "$PY_BASE" ]; then
  case "$TF_VERSION" in
    1.*) PY_BASE="$(PYENV_VERSION=3.7.16 pyenv which python3.7 2>/dev/null || command -v python3.7)" ;;
    *) PY_BASE="python3" ;;
  esac
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
venv="$work/venv"
log "fresh virtualenv with $PY_BASE: tensorflow-cpu==$TF_VERSION, pytest, $(basename "$WHEEL")"
"$PY_BASE" -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
pins=""
case "$TF_VERSION" in
  1.*) pins="numpy==1.18.5 protobuf==3.20.3 pytest==7.4.4" ;;
  # TF 2.7 to 2.11 ask for numpy >= 1.x with no upper bound, but their
  # extension modules fail to import under numpy 2 (_ARRAY_API not found).
  2.7.*|2.8.*|2.9.*|2.10.*|2.11.*) pins="pytest>=7 numpy<2" ;;
  *) pins="pytest>=7" ;;
esac
# shellcheck disable=SC2086
"$venv/bin/pip" install -q "tensorflow-cpu==$TF_VERSION" $pins "$WHEEL"

# The tests, copied away from the source tree (whose sok_graph/ must not
# shadow the installed one).
cp -r "$REPO/tests" "$work/tests"
cp -r "$REPO/examples_tf1" "$REPO/examples_tf2" "$work/"
tests=(
  "examples/test_examples.py::test_get_started_walkthrough"
  "examples/test_examples.py::test_lookup_demo_learns"
  "examples/test_examples.py::test_sok_v1_demo_model_learns"
  "examples/test_examples.py::test_sok_v1_demo_model_on_two_mirrored_replicas"
  "test_dump_load.py::test_dump_new_process_load_gives_identical_next_step"
  "test_dump_load.py::test_dump_and_load_in_graph_mode"
  "test_serving.py::test_tf2_keras_model_serves_in_plain_tensorflow"
  "test_serving.py::test_tf1_session_export_serves_in_plain_tensorflow"
)
log "smoke suite, with PATH=$venv/bin only"
start=$(date +%s)
(cd "$work/tests" && env -i HOME="$HOME" PATH="$venv/bin" TF_CPP_MIN_LOG_LEVEL=2 \
   SOK_GRAPH_CACHE="$work/no-cache" \
   "$venv/bin/python" -m pytest -q -p no:cacheprovider "${tests[@]}")
log "smoke suite passed in $(( $(date +%s) - start )) s"
