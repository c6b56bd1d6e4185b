#!/usr/bin/env bash
# The full test suite, for every supported TensorFlow version:
#   bash scripts/run_tests.sh
# For each version (SOK_GRAPH_TF_VERSIONS, default "2.15.1 2.21.0 1.15.0"): set up
# and install with Horovod (scripts/setup_env.sh --with-horovod), run
# `bazel test //...` (C++ core tests and the Python tests against the
# Bazel-built package), then run the examples against the pip-installed
# package; for the first version that sets up, also the C++ core tests under
# AddressSanitizer and UBSan (.bazelrc). Then a wheel for the first version
# (SOK_GRAPH_WHEEL_TF_VERSION overrides) is built and its smoke suite run in a
# clean virtualenv (scripts/build_wheel.sh, scripts/check_wheel.sh). Finally,
# check that the host side of
# the GPU kernels compiles and links against TensorFlow 1.15
# (scripts/check_tf115.sh; 1.15's own build is CPU-only). The static
# TF 1.15 / Python 3.7 check of the Python
# (scripts/check_tf115_api.py) runs first, and the public API must be the same
# on every version (scripts/api_signatures.py).
#
# A failing step does not stop the run: every version and check runs, the
# failures are listed at the end, and the exit status is 1 if there was any.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
VERSIONS="${SOK_GRAPH_TF_VERSIONS:-2.15.1 2.21.0 1.15.0}"
# The Horovod tests fail instead of skipping when Horovod is missing:
# setup_env.sh --with-horovod installs it.
export SOK_GRAPH_REQUIRE_HOROVOD=1
# So do the MovieLens ones when the recbole wheel (the data set) is missing.
export SOK_GRAPH_REQUIRE_MOVIELENS=1
# The suite tests this checkout, built here: never a wheel named for the
# main job (SOK_GRAPH_WHEEL, see setup_env.sh).
unset SOK_GRAPH_WHEEL
total=0    # test targets that passed
failed=0   # test targets (or steps: a setup, a check) that failed
failures=()

fail() {  # WHAT: one more failure, named in the summary
  failures+=("$1")
  failed=$((failed + ${2:-1}))
  echo "FAILED: $1"
}

# Runs `bazel test` with the given arguments (output shown and parsed):
# passed and failed targets are added to the counts; WHAT names a failure.
bazel_test() {
  local what="$1" log_file rc summary passed nfailed
  shift
  log_file="$(mktemp)"
  "$SOK_PYTHON" tf_ops/build/bazelw.py test "$@" 2>&1 | tee "$log_file"
  rc=${PIPESTATUS[0]}
  # Bazel's last line: "Executed 5 out of 5 tests: 5 tests pass.", or e.g.
  # "Executed 4 out of 5 tests: 2 tests pass, 2 fail locally and 1 fails to build."
  summary="$(grep '^Executed [0-9]* out of [0-9]* tests\?: ' "$log_file" | tail -1)"
  passed=$(printf '%s\n' "$summary" | sed -n 's/^[^:]*: \([0-9]*\) tests\? pass.*$/\1/p')
  nfailed=$(printf '%s\n' "$summary" | grep -o '[0-9]* fails\?' \
              | awk '{n += $1} END {if (n) print n}')
  rm -f "$log_file"
  total=$((total + ${passed:-0}))
  if [ "$rc" != 0 ]; then
    # A build error runs no test: one failure for the whole step.
    fail "$what (bazel exit $rc)" "${nfailed:-1}"
  fi
}

echo "=== TensorFlow 1.15: Python API and Python 3.7 syntax check"
if python3 "$REPO/scripts/check_tf115_api.py"; then
  total=$((total + 1))
else
  fail "the TF 1.15 / Python 3.7 check of the Python (scripts/check_tf115_api.py)"
fi

api_tables="$(mktemp -d)"
env_file="$(mktemp)"
trap 'rm -rf "$api_tables" "$env_file"' EXIT
pythons=()         # the Python of each version that set up
sanitizers_run=no
for version in $VERSIONS; do
  echo "=== TensorFlow $version: setup"
  # In a subshell, so that a failed setup (setup_env.sh stops at its first
  # failing command) fails this version only; what the steps below need from
  # it comes back through $env_file.
  : > "$env_file"
  (
    # shellcheck source=/dev/null
    source "$REPO/scripts/setup_env.sh" "$version" --with-horovod
    {
      printf 'export SOK_PYTHON=%q SOK_TF_VERSION=%q SOK_GRAPH_CACHE=%q\n' \
        "$SOK_PYTHON" "$SOK_TF_VERSION" "$SOK_GRAPH_CACHE"
      if [ -n "${SOK_GRAPH_CUDA12_HOME:-}" ]; then
        printf 'export SOK_GRAPH_CUDA12_HOME=%q\n' "$SOK_GRAPH_CUDA12_HOME"
      else
        echo 'unset SOK_GRAPH_CUDA12_HOME'
      fi
    } > "$env_file"
  )
  rc=$?
  if [ "$rc" != 0 ] || [ ! -s "$env_file" ]; then
    fail "TensorFlow $version: setup (scripts/setup_env.sh $version --with-horovod, exit $rc)"
    continue
  fi
  # shellcheck source=/dev/null
  source "$env_file"
  pythons+=("$SOK_PYTHON")

  echo "=== TensorFlow $version: bazel test //..."
  bazel_test "TensorFlow $version: bazel test //..." //... --cache_test_results=no \
    --test_env=SOK_GRAPH_REQUIRE_HOROVOD --test_env=SOK_GRAPH_REQUIRE_MOVIELENS
  if [ "$sanitizers_run" = no ]; then
    # The C++ cores do not link TensorFlow: once, under both sanitizers.
    sanitizers_run=yes
    for config in asan ubsan; do
      echo "=== C++ core tests under --config=$config"
      bazel_test "C++ core tests under --config=$config" --config="$config" //tf_ops/... \
        --cache_test_results=no
    done
  fi

  echo "=== TensorFlow $version: examples against the installed package"
  # From tests/, so the source tree's sok_graph/ cannot shadow the installed one.
  if (cd "$REPO/tests" && TF_CPP_MIN_LOG_LEVEL=2 "$SOK_PYTHON" -m pytest -q -p no:cacheprovider \
        examples); then
    total=$((total + 1))
  else
    fail "TensorFlow $version: examples (tests/examples)"
  fi
  if ! (cd "$REPO/tests" && TF_CPP_MIN_LOG_LEVEL=2 "$SOK_PYTHON" "$REPO/scripts/api_signatures.py" \
          dump "$api_tables/$version.json"); then
    rm -f "$api_tables/$version.json"
    fail "TensorFlow $version: the public API's table (scripts/api_signatures.py dump)"
  fi
  "$SOK_PYTHON" tf_ops/build/bazelw.py shutdown >/dev/null 2>&1 || true
done

# A binary wheel for the first version, installed into a clean virtualenv
# with only that TensorFlow, and the smoke suite run from it with no build
# toolchain on PATH (scripts/build_wheel.sh, scripts/check_wheel.sh).
wheel_version="${SOK_GRAPH_WHEEL_TF_VERSION:-${VERSIONS%% *}}"
echo "=== TensorFlow $wheel_version: the wheel, built and smoke-tested in a clean virtualenv"
wheel_dir="$(mktemp -d)"
if wheel="$(DIST_DIR="$wheel_dir" bash "$REPO/scripts/build_wheel.sh" "$wheel_version")" \
   && bash "$REPO/scripts/check_wheel.sh" "$wheel" "$wheel_version"; then
  total=$((total + 1))
else
  fail "TensorFlow $wheel_version: the wheel (scripts/build_wheel.sh, scripts/check_wheel.sh)"
fi
rm -rf "$wheel_dir"

if [ "$(find "$api_tables" -name '*.json' | wc -l)" -gt 1 ]; then
  echo "=== public API (names, parameters, defaults) on TensorFlow $VERSIONS"
  if python3 "$REPO/scripts/api_signatures.py" compare "$api_tables"/*.json; then
    total=$((total + 1))
  else
    fail "the public API differs between TensorFlow versions (scripts/api_signatures.py compare)"
  fi
fi

# A Python >= 3.8 with pytest for the checkers' own tests (they parse with
# ast.parse(feature_version=...), which Python 3.7 lacks), whatever the TF
# versions: a set-up virtualenv's, else python3's, else a small virtualenv
# with pytest made once next to the others.
checker_python() {
  local py venv probe='import sys, pytest; sys.exit(sys.version_info[:2] < (3, 8))'
  for py in "${pythons[@]}" python3; do
    if "$py" -c "$probe" >/dev/null 2>&1; then
      echo "$py"
      return 0
    fi
  done
  venv="${SOK_GRAPH_CACHE:-$HOME/.cache/sok_graph}/venvs/checkers"
  if [ ! -f "$venv/.complete" ]; then
    python3 -c 'import sys; sys.exit(sys.version_info[:2] < (3, 8))' || {
      echo "python3 is $(python3 --version 2>&1); the checkers' tests need 3.8 or newer" >&2
      return 1
    }
    echo "making $venv (python3 and pytest) for the checkers' tests" >&2
    rm -rf "$venv"
    python3 -m venv "$venv" >&2 && "$venv/bin/pip" install -q "pytest>=7" >&2 \
      && touch "$venv/.complete" || return 1
  fi
  echo "$venv/bin/python"
}

echo "=== the TF 1.15 API checker and the API comparison, tested"
if py="$(checker_python)" && echo "(on $("$py" --version 2>&1): $py)" \
   && (cd "$REPO/scripts/tests" && "$py" -m pytest -q -p no:cacheprovider .); then
  total=$((total + 1))
else
  fail "the checkers' own tests (scripts/tests)"
fi
echo "=== TensorFlow 1.15: C++14 compile and link check of every op and kernel"
if bash "$REPO/scripts/check_tf115.sh"; then
  total=$((total + 1))
else
  fail "the TF 1.15 C++14 compile and link check (scripts/check_tf115.sh)"
fi

echo "test targets (googletest binaries, pytest files, the TF 1.15 and API checks) over TF versions: $VERSIONS"
if [ "${#failures[@]}" -gt 0 ]; then
  echo "failed:"
  printf '  %s\n' "${failures[@]}"
fi
echo "$total passed, $failed failed"
[ "${#failures[@]}" = 0 ]
