#!/usr/bin/env bash
# Everything the multi-GPU issue checks, on a machine with 2 or more GPUs and
# TensorFlow seeing them, in one command; each stage bounded in time, every
# log kept under LOGS, one summary line per stage at the end:
#
#   bash tests/gpu/run_multi_gpu.sh [STAGE ...]
#
# Stages (default: all, in this order):
#   modes      tests/gpu/nccl_modes_check.py: the NCCL op from threads, in a
#              Session graph and in a tf.function
#   alltoall   tests/gpu/nccl_alltoall_check.py against numpy
#   horovod    Horovod with NCCL built from $HOROVOD_SDIST into $LOGS/horovod
#              (scripts/build_horovod_gpu.sh; NCCL_INCLUDE names a folder
#              with nccl.h where NCCL's wheel has none); skipped without
#              HOROVOD_SDIST
#   tests      tests/gpu/test_multi_gpu.py (N-GPU training equals 1-GPU
#              training; dumps across GPU counts), SOK_GRAPH_NCCL=$NCCL
#   bench      bench/dlrm_criteo_tb.py: 1 GPU (tables cut to half), N GPUs in
#              one process, one process per GPU; bench/alltoall_bench.py
#
# Env: LOGS (default /tmp/sok_multi_gpu), NCCL (SOK_GRAPH_NCCL for the tests,
# default 1), TESTS_K (pytest -k for the tests stage), PYTHON (python3).
# NVLink multicast stays off in every process (NCCL_NVLS_ENABLE=0).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
LOGS=${LOGS:-/tmp/sok_multi_gpu}
mkdir -p "$LOGS"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2} PYTHONUNBUFFERED=1
summary=()
t0=$SECONDS

# stage NAME SECONDS command...: runs it into $LOGS/NAME.log, records a line.
stage() {
  local name=$1 bound=$2 start=$SECONDS rc
  shift 2
  echo "== $name (at most ${bound} s)" >&2
  timeout "$bound" "$@" > "$LOGS/$name.log" 2>&1
  rc=$?
  summary+=("$name: $([ $rc = 0 ] && echo ok || { [ $rc = 124 ] && echo "no end within $bound s" || echo "exit $rc"; }) ($((SECONDS - start)) s)")
  return 0
}

# The figures a bench log ends with.
figures() { grep -h -E "ms/step|busbw|GB/s|sok / plain" "$@" 2>/dev/null | grep -v "step [0-9]*/" ; }

gpus=$("$PY" -c 'import tensorflow as tf; print(len(tf.config.list_physical_devices("GPU")))' 2>/dev/null | tail -1)
if [ "${gpus:-0}" -lt 2 ]; then
  echo "run_multi_gpu: TensorFlow sees ${gpus:-no} GPU(s); these checks need 2 or more"
  exit 2
fi
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(modes alltoall horovod tests bench)
for s in "${stages[@]}"; do
  case $s in
  modes)
    SOK_GRAPH_STACKS_DIR="$LOGS/stacks" stage modes 400 "$PY" tests/gpu/nccl_modes_check.py ;;
  alltoall)
    stage alltoall 300 "$PY" tests/gpu/nccl_alltoall_check.py --world "$gpus" ;;
  horovod)
    if [ -n "${HOROVOD_SDIST:-}" ]; then
      stage horovod 900 bash scripts/build_horovod_gpu.sh "$HOROVOD_SDIST" "$LOGS/horovod"
      export PYTHONPATH="$LOGS/horovod${PYTHONPATH:+:$PYTHONPATH}"
    else
      summary+=("horovod: skipped (set HOROVOD_SDIST to a horovod-0.28.1.tar.gz)")
    fi ;;
  tests)
    (cd tests && SOK_GRAPH_NCCL=${NCCL:-1} timeout 3000 "$PY" -m pytest -v \
       -p no:cacheprovider -rs --durations=0 --junitxml="$LOGS/tests.xml" \
       gpu/test_multi_gpu.py ${TESTS_K:+-k "$TESTS_K"}) > "$LOGS/tests.log" 2>&1
    summary+=("tests: $(tail -1 "$LOGS/tests.log")") ;;
  bench)
    stage bench_1gpu 300 env CUDA_VISIBLE_DEVICES=0 "$PY" bench/dlrm_criteo_tb.py --gpus 1 \
      --table_scale 0.5 --steps 300 --warmup 10
    stage bench_mirrored 300 env SOK_GRAPH_NCCL=1 "$PY" bench/dlrm_criteo_tb.py --gpus "$gpus" \
      --steps 300 --warmup 10 --trace 2
    stage bench_workers 400 env SOK_GRAPH_NCCL=1 "$PY" -m sok_graph.launch -np "$gpus" \
      --timeout 390 bench/dlrm_criteo_tb.py --workers --steps 300 --warmup 10 --trace 2
    stage bench_workers_65536 400 env SOK_GRAPH_NCCL=1 "$PY" -m sok_graph.launch -np "$gpus" \
      --timeout 390 bench/dlrm_criteo_tb.py --workers --global_batch 65536 --steps 100 --warmup 5
    stage alltoall_sok 300 env SOK_GRAPH_NCCL=1 "$PY" bench/alltoall_bench.py --engine sok \
      --gpus "$gpus"
    stage alltoall_torch 300 "$PY" bench/alltoall_bench.py --engine torch --gpus "$gpus" ;;
  *) echo "run_multi_gpu: unknown stage $s" >&2; exit 2 ;;
  esac
done
echo "run_multi_gpu: $gpus GPUs, $((SECONDS - t0)) s, logs in $LOGS"
printf '  %s\n' "${summary[@]}"
for f in "$LOGS"/bench_*.log "$LOGS"/alltoall_*.log; do
  [ -f "$f" ] && figures "$f" | sed "s|^|  $(basename "$f" .log): |" | head -8
done
grep -h -E "^(FAILED|ERROR)|Error:|differs" "$LOGS/tests.log" 2>/dev/null | head -20
