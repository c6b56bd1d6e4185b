#!/usr/bin/env bash
# Builds the wheel for each TensorFlow version and runs the smoke suite on
# it in a fresh virtualenv (scripts/build_wheel.sh, scripts/check_wheel.sh):
#
#   bash scripts/check_tf_matrix.sh                 # every minor from 2.6 to 2.21, and 1.15
#   bash scripts/check_tf_matrix.sh 2.12 2.18       # some minors (newest patch release of each)
#
# Each minor is checked with its newest tensorflow-cpu release on PyPI and
# the newest Python it supports that pyenv has. The results go to
# MATRIX_OUT (default build/tf_matrix.md) as a Markdown table, one row per
# version as it finishes (version, Python, Keras, result, minutes), with the
# last lines of a failure's log in build/tf_matrix/<version>.log. A failing
# version does not stop the others; the exit status says whether all passed.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${MATRIX_OUT:-$REPO/build/tf_matrix.md}"
LOGS="$REPO/build/tf_matrix"
mkdir -p "$LOGS" "$(dirname "$OUT")"
log() { echo "[check_tf_matrix] $*" >&2; }

MINORS=("$@")
if [ ${#MINORS[@]} -eq 0 ]; then
  MINORS=(1.15 2.6 2.7 2.8 2.9 2.10 2.11 2.12 2.13 2.14 2.15 2.16 2.17 2.18 2.19 2.20 2.21)
fi

# The newest Python each TensorFlow minor has wheels for (within the
# Pythons pyenv holds here: 3.7 to 3.13).
python_for() {
  case "$1" in
    1.15) echo 3.7 ;;
    2.6|2.7) echo 3.9 ;;
    2.8|2.9|2.10|2.11) echo 3.10 ;;
    *) echo 3.11 ;;
  esac
}

pyenv_python() {
  local version
  version="$(pyenv versions --bare 2>/dev/null | grep "^$1\." | sort -V | tail -1)"
  [ -n "$version" ] && PYENV_VERSION="$version" pyenv which "python$1" 2>/dev/null
}

# The newest release X.Y.Z (no rc) of tensorflow-cpu for minor X.Y, asked
# from PyPI with the Python that will install it.
newest_release() {
  "$2" -m pip index versions tensorflow-cpu 2>/dev/null | sed -n 's/^Available versions: //p' \
    | tr ',' '\n' | tr -d ' ' | grep -E "^$1\.[0-9]+$" | sort -V | tail -1
}

[ -f "$OUT" ] || printf '| TensorFlow | Python | Keras | smoke suite | minutes | note |\n|---|---|---|---|---|---|\n' > "$OUT"
failed=0
for minor in "${MINORS[@]}"; do
  py_version="$(python_for "$minor")"
  py="$(pyenv_python "$py_version")"
  if [ -z "$py" ]; then
    log "$minor: no Python $py_version from pyenv"
    printf '| %s | %s | | not run | | no Python %s here |\n' "$minor" "$py_version" "$py_version" >> "$OUT"
    failed=1
    continue
  fi
  version="$(newest_release "$minor" "$py")"
  if [ -z "$version" ]; then
    log "$minor: no tensorflow-cpu $minor.x for Python $py_version on PyPI"
    printf '| %s | %s | | not run | | no tensorflow-cpu %s.x wheel for Python %s |\n' \
      "$minor" "$py_version" "$minor" "$py_version" >> "$OUT"
    failed=1
    continue
  fi
  log "$version with Python $py_version"
  start=$(date +%s)
  logfile="$LOGS/$version.log"
  result="passed"
  if ! wheel="$(PYTHON="$py" bash "$REPO/scripts/build_wheel.sh" "$version" 2>"$logfile")"; then
    result="wheel build failed"
  elif ! bash "$REPO/scripts/check_wheel.sh" "$wheel" "$version" "$py" >>"$logfile" 2>&1; then
    result="smoke suite failed"
  fi
  minutes=$(( ($(date +%s) - start + 59) / 60 ))
  venv_py="${SOK_GRAPH_CACHE:-$HOME/.cache/sok_graph}/venvs/tf-$version/bin/python"
  keras="$("$venv_py" -c 'import tensorflow as tf; print(tf.keras.__version__ if hasattr(tf.keras, "__version__") else "")' 2>/dev/null | tail -1)"
  note=""
  if [ "$result" != passed ]; then
    failed=1
    note="$(grep -E 'Error|error:|FAILED|failed' "$logfile" | tail -1 | cut -c1-160 | tr '|' '/')"
  fi
  # A version checked again replaces its row.
  sed -i "/^| ${version//./\\.} |/d" "$OUT"
  printf '| %s | %s | %s | %s | %s | %s |\n' "$version" "$py_version" "$keras" "$result" "$minutes" "$note" >> "$OUT"
  log "$version: $result ($minutes min); log: $logfile"
done
cat "$OUT"
exit "$failed"
