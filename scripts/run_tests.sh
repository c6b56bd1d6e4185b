#!/usr/bin/env bash
# The full test suite, for every supported TensorFlow version:
#   bash scripts/run_tests.sh
# For each version (SOK_GRAPH_TF_VERSIONS, default "2.15.1 2.21.0"): set up
# and install (scripts/setup_env.sh), run `bazel test //...` (C++ core tests
# and the Python tests against the Bazel-built package), then run the examples
# against the pip-installed package.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
VERSIONS="${SOK_GRAPH_TF_VERSIONS:-2.15.1 2.21.0}"
total=0
for version in $VERSIONS; do
  echo "=== TensorFlow $version: setup"
  # shellcheck source=/dev/null
  source "$REPO/scripts/setup_env.sh" "$version"
  echo "=== TensorFlow $version: bazel test //..."
  log_file="$(mktemp)"
  set +e
  "$SOK_PYTHON" tf_ops/build/bazelw.py test //... --cache_test_results=no 2>&1 | tee "$log_file"
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" != 0 ]; then
    echo "bazel test failed for TensorFlow $version (exit $rc)"
    exit "$rc"
  fi
  passed=$(sed -n 's/^Executed [0-9]* out of [0-9]* tests\?: \([0-9]*\) tests\? pass\.$/\1/p' "$log_file" | tail -1)
  rm -f "$log_file"
  total=$((total + ${passed:-0}))
  echo "=== TensorFlow $version: examples against the installed package"
  (cd "$REPO" && TF_CPP_MIN_LOG_LEVEL=2 "$SOK_PYTHON" -m pytest -q -p no:cacheprovider \
     tests/examples --rootdir tests) || exit 1
  "$SOK_PYTHON" tf_ops/build/bazelw.py shutdown >/dev/null 2>&1 || true
done
echo "test targets (each a googletest binary or a pytest file) over TF versions: $VERSIONS"
echo "$total passed, 0 failed"
