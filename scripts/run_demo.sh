#!/usr/bin/env bash
# The main job: sets up sok_graph (TensorFlow 2.15.1 by default) and trains a
# DLRM-style model on MovieLens-100k on CPU, single process; keeps the epoch
# with the best validation AUC (early stopping), prints its test AUC against a
# popularity baseline, dumps its tables, writes a loss/AUC plot.
#   bash scripts/run_demo.sh [--mode tf1] [--epochs N] [--patience N] [--out DIR]
#   SOK_GRAPH_WHEEL=dist/sok_graph-...+tf2.15-...whl bash scripts/run_demo.sh
#                                 # installs that wheel instead of building
# One process needs no Horovod, so the set-up leaves it out (setup_env.sh
# builds it only with --with-horovod; an earlier install stays). The job runs
# on the CPU, so the build leaves out the CUDA kernels and the CUDA 12
# toolchain they need (SOK_GRAPH_WITHOUT_CUDA=0 builds them too).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export SOK_GRAPH_WITHOUT_CUDA="${SOK_GRAPH_WITHOUT_CUDA:-1}"
# shellcheck source=/dev/null
source "$REPO/scripts/setup_env.sh" "${SOK_TF_VERSION:-2.15.1}"
cd "$REPO"
TF_CPP_MIN_LOG_LEVEL=2 exec "$SOK_PYTHON" examples_tf2/movielens_dlrm.py "$@"
