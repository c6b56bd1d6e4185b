#!/usr/bin/env bash
# The main job: sets up sok_graph (TensorFlow 2.15.1 by default) and trains
# the demo model on CPU, single process.
#   bash scripts/run_demo.sh [demo flags, e.g. --mode tf1]
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=/dev/null
source "$REPO/scripts/setup_env.sh" "${SOK_TF_VERSION:-2.15.1}"
cd "$REPO"
TF_CPP_MIN_LOG_LEVEL=2 exec "$SOK_PYTHON" examples_tf2/lookup_demo.py "$@"
