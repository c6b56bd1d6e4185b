#!/usr/bin/env bash
# The whole pytest suite with TensorFlow on a GPU: every tests/**/test_*.py
# (tests/gpu excepted: those are the CUDA launcher checks of run_all.sh) in a
# process of its own, with the GPU as every test's default device
# (SOK_GRAPH_TEST_DEVICE, read by tests/conftest.py), several files at once
# on one GPU (TF_FORCE_GPU_ALLOW_GROWTH=true, so each process takes only the
# memory it uses). Ends with one summary line:
#
#   run_tf_suite: 27 files, 468 tests, 442 passed, 0 failed, 26 skipped
#   (3 CPU-only), fuzz cases 3893 (1896 rejected, each followed by a working
#   op), CUDA errors 0, device /GPU:0, 347 s
#
# and exits non-zero when a test failed, a file's process died, no GPU was
# visible, or any log mentions a CUDA error.
#
#   bash tests/gpu/run_tf_suite.sh [-j JOBS] [test files, relative to tests/]
#
# Run it where TensorFlow sees the GPU and the installed sok_graph (not the
# checkout) is importable; pytest runs from tests/ so the source tree cannot
# shadow the installed package. Logs and JUnit XML go to $SOK_GPU_SUITE_LOGS
# (default /tmp/sok_gpu_suite).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
JOBS=4
if [ "${1:-}" = "-j" ]; then JOBS=$2; shift 2; fi
LOGS=${SOK_GPU_SUITE_LOGS:-/tmp/sok_gpu_suite}
export TF_FORCE_GPU_ALLOW_GROWTH=true
export SOK_GRAPH_TEST_DEVICE=${SOK_GRAPH_TEST_DEVICE:-/GPU:0}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-1}
export PYTHONUNBUFFERED=1
rm -rf "$LOGS" && mkdir -p "$LOGS"

if ! "$PY" -c 'import sys, tensorflow as tf; sys.exit(0 if tf.config.list_physical_devices("GPU") else 1)' \
    >"$LOGS/gpu_check.log" 2>&1; then
  echo "run_tf_suite: TensorFlow sees no GPU here ($("$PY" -c 'import tensorflow as tf; print(tf.__version__)' 2>&1 | tail -1)); see $LOGS/gpu_check.log"
  exit 2
fi

if [ $# -gt 0 ]; then
  files=("$@")
else
  # The long files first, so the parallel run ends together.
  mapfile -t files < <(find . -name 'test_*.py' -not -path './gpu/*' -printf '%s %P\n' |
                       sort -rn | cut -d' ' -f2-)
fi

start=$(date +%s)
run_one() {
  local f=$1 name
  name=$(echo "${f%.py}" | tr / _)
  "$PY" -m pytest -q -p no:cacheprovider -rs --junitxml="$LOGS/$name.xml" "$f" \
    >"$LOGS/$name.log" 2>&1
  echo "$? $f" >"$LOGS/$name.rc"
  echo "[$(tail -1 "$LOGS/$name.log")] $f"
}
export -f run_one
export PY LOGS
printf '%s\n' "${files[@]}" | xargs -P "$JOBS" -I{} bash -c 'run_one "$@"' _ {}

"$PY" - "$LOGS" "$(( $(date +%s) - start ))" "${#files[@]}" <<'EOF'
import glob, os, re, sys
import xml.etree.ElementTree as ET

logs, seconds, nfiles = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tests = failed = skipped = cpu_only = fuzz = rejected = cuda_errors = 0
broken = []
cuda = re.compile(r"CUDA error|CUDA_ERROR|illegal memory access|Error recording CUDA event|"
                  r"cudaError|misaligned address")
for rc_file in sorted(glob.glob(os.path.join(logs, "*.rc"))):
    rc, name = open(rc_file).read().split(" ", 1)
    base = rc_file[:-3]
    log = open(base + ".log", errors="replace").read()
    cuda_errors += len(cuda.findall(log))
    m = re.search(r"fuzz cases run: (\d+)", log)
    if m:
        fuzz += int(m.group(1))
    m = re.search(r"(\d+) rejected inputs each followed by a working op", log)
    if m:
        rejected += int(m.group(1))
    try:
        root = ET.parse(base + ".xml").getroot()
    except (OSError, ET.ParseError):
        broken.append(name.strip() + " (no report: the process died)")
        continue
    failed_here = 0
    for case in root.iter("testcase"):
        tests += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed_here += 1
            print("FAILED", case.get("classname"), case.get("name"))
        skip = case.find("skipped")
        if skip is not None:
            skipped += 1
            if "CPU-only" in (skip.get("message") or ""):
                cpu_only += 1
    failed += failed_here
    if rc.strip() not in ("0", "5") and not failed_here:
        broken.append(f"{name.strip()} (pytest exit {rc.strip()})")
for b in broken:
    print("BROKEN", b)
passed = tests - failed - skipped
print(f"run_tf_suite: {nfiles} files, {tests} tests, {passed} passed, {failed} failed, "
      f"{skipped} skipped ({cpu_only} CPU-only), fuzz cases {fuzz} ({rejected} rejected, each "
      f"followed by a working op), CUDA errors {cuda_errors}, "
      f"device {os.environ['SOK_GRAPH_TEST_DEVICE']}, {seconds} s")
sys.exit(1 if failed or broken or cuda_errors else 0)
EOF
