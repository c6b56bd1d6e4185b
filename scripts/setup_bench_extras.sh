#!/usr/bin/env bash
# Installs what bench/dynamic_bench.py compares against but the tests do not
# need: TensorFlow Recommenders-Addons 0.7.2 (CPU) into the TF 2.15.1
# virtualenv. TFRA's only TF 2.15-compatible CPU release imports pkg_resources,
# which setuptools >= 81 dropped, hence the pin.
#   bash scripts/setup_bench_extras.sh && $SOK_PYTHON bench/dynamic_bench.py
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=/dev/null
source "$REPO/scripts/setup_env.sh" 2.15.1
"$SOK_PYTHON" -m pip install -q --no-deps tensorflow-recommenders-addons==0.7.2 "setuptools<81"
echo "TFRA installed into $SOK_PYTHON"
