#!/usr/bin/env bash
# The full test suite, for every supported TensorFlow version:
#   bash scripts/run_tests.sh
# For each version (SOK_GRAPH_TF_VERSIONS, default "2.15.1 2.21.0 1.15.0"): set up
# and install (scripts/setup_env.sh), run `bazel test //...` (C++ core tests
# and the Python tests against the Bazel-built package), then run the examples
# against the pip-installed package; for the first version also the C++
# core tests under AddressSanitizer and UBSan (.bazelrc). Finally, check
# that the host side of the GPU kernels compiles and links against TensorFlow
# 1.15 (scripts/check_tf115.sh; 1.15's own build is CPU-only). The static
# TF 1.15 / Python 3.7 check of the Python
# (scripts/check_tf115_api.py) runs first, and the public API must be the same
# on every version (scripts/api_signatures.py).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
VERSIONS="${SOK_GRAPH_TF_VERSIONS:-2.15.1 2.21.0 1.15.0}"
# The Horovod tests fail instead of skipping when Horovod is missing:
# setup_env.sh installs it.
export SOK_GRAPH_REQUIRE_HOROVOD=1
total=0
echo "=== TensorFlow 1.15: Python API and Python 3.7 syntax check"
python3 "$REPO/scripts/check_tf115_api.py"
total=$((total + 1))
api_tables="$(mktemp -d)"
for version in $VERSIONS; do
  echo "=== TensorFlow $version: setup"
  # shellcheck source=/dev/null
  source "$REPO/scripts/setup_env.sh" "$version"
  # The checkers' own tests need Python 3.8+: the first version's (a 2.x).
  first_python="${first_python:-$SOK_PYTHON}"
  echo "=== TensorFlow $version: bazel test //..."
  log_file="$(mktemp)"
  set +e
  "$SOK_PYTHON" tf_ops/build/bazelw.py test //... --cache_test_results=no \
    --test_env=SOK_GRAPH_REQUIRE_HOROVOD 2>&1 | tee "$log_file"
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" != 0 ]; then
    echo "bazel test failed for TensorFlow $version (exit $rc)"
    exit "$rc"
  fi
  passed=$(sed -n 's/^Executed [0-9]* out of [0-9]* tests\?: \([0-9]*\) tests\? pass\.$/\1/p' "$log_file" | tail -1)
  rm -f "$log_file"
  total=$((total + ${passed:-0}))
  if [ "$version" = "${VERSIONS%% *}" ]; then
    # The C++ cores do not link TensorFlow: once, under both sanitizers.
    for config in asan ubsan; do
      echo "=== C++ core tests under --config=$config"
      log_file="$(mktemp)"
      set +e
      "$SOK_PYTHON" tf_ops/build/bazelw.py test --config="$config" //tf_ops/... \
        --cache_test_results=no 2>&1 | tee "$log_file"
      rc=${PIPESTATUS[0]}
      set -e
      if [ "$rc" != 0 ]; then
        echo "C++ core tests failed under --config=$config (exit $rc)"
        exit "$rc"
      fi
      passed=$(sed -n 's/^Executed [0-9]* out of [0-9]* tests\?: \([0-9]*\) tests\? pass\.$/\1/p' "$log_file" | tail -1)
      rm -f "$log_file"
      total=$((total + ${passed:-0}))
    done
  fi
  echo "=== TensorFlow $version: examples against the installed package"
  # From tests/, so the source tree's sok_graph/ cannot shadow the installed one.
  (cd "$REPO/tests" && TF_CPP_MIN_LOG_LEVEL=2 "$SOK_PYTHON" -m pytest -q -p no:cacheprovider \
     examples) || exit 1
  total=$((total + 1))
  (cd "$REPO/tests" && TF_CPP_MIN_LOG_LEVEL=2 "$SOK_PYTHON" "$REPO/scripts/api_signatures.py" \
     dump "$api_tables/$version.json")
  "$SOK_PYTHON" tf_ops/build/bazelw.py shutdown >/dev/null 2>&1 || true
done
if [ "$(find "$api_tables" -name '*.json' | wc -l)" -gt 1 ]; then
  echo "=== public API (names, parameters, defaults) on TensorFlow $VERSIONS"
  python3 "$REPO/scripts/api_signatures.py" compare "$api_tables"/*.json
  total=$((total + 1))
fi
rm -rf "$api_tables"
echo "=== the TF 1.15 API checker and the API comparison, tested"
(cd "$REPO/scripts/tests" && "$first_python" -m pytest -q -p no:cacheprovider .)
total=$((total + 1))
echo "=== TensorFlow 1.15: C++14 compile and link check of every op and kernel"
bash "$REPO/scripts/check_tf115.sh"
total=$((total + 1))
echo "test targets (googletest binaries, pytest files, the TF 1.15 and API checks) over TF versions: $VERSIONS"
echo "$total passed, 0 failed"
