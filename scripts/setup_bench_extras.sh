#!/usr/bin/env bash
# Installs the baselines the benchmarks compare against but the tests do not
# need: pandas (bench/data_bench.py) and, on TF 2.15.1, TensorFlow
# Recommenders-Addons 0.7.2 (bench/dynamic_bench.py). TFRA's only TF
# 2.15-compatible CPU release imports pkg_resources, which setuptools >= 81
# dropped, hence the pin.
#   bash scripts/setup_bench_extras.sh [2.15.1|2.21.0]
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=/dev/null
source "$REPO/scripts/setup_env.sh" "${1:-2.15.1}"
# Pinning TensorFlow keeps pip from upgrading numpy past what it supports.
"$SOK_PYTHON" -m pip install -q pandas "tensorflow-cpu==$SOK_TF_VERSION"
if [ "$SOK_TF_VERSION" = 2.15.1 ]; then
  "$SOK_PYTHON" -m pip install -q --no-deps tensorflow-recommenders-addons==0.7.2 "setuptools<81"
fi
echo "benchmark baselines installed into $SOK_PYTHON"
