"""Host synchronisations per training step, from a TensorFlow profiler trace.

Runs bench/e2e_bench.py's DLRM step (sok side and plain-TF side, tf.function
and graph mode) on the GPU, traces --steps steps with tf.profiler, and reads
the trace (XSpace protobuf, the format TensorBoard's profile plugin reads):

  - every CUDA driver/runtime call that makes the host wait for the GPU
    (cu*Synchronize, and the blocking device-to-host copies cuMemcpyDtoH /
    cudaMemcpy), attributed to the TensorFlow op running on that thread;
  - every device-to-host copy the GPU ran (Memcpy DtoH on the device plane).

    python bench/host_syncs.py [--steps 5] [--mode function|graph|both] [--side sok|tf|both]

Prints per step: the blocking calls by TensorFlow op, and the DtoH copies.
The benchmark's own `loss.numpy()` / `sess.run(loss)` at the end of a step
is one DtoH copy that every step of any model has.
"""

import argparse
import collections
import glob
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_bench  # noqa: E402

BLOCKING = ("Synchronize", "cuMemcpyDtoH_v2", "cuMemcpyDtoH ", "cudaMemcpy ", "cuMemcpy_v2")


def _xspace(logdir):
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    paths = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
    if not paths:
        raise SystemExit(f"no *.xplane.pb under {logdir}")
    space = xplane_pb2.XSpace()
    with open(sorted(paths)[-1], "rb") as f:
        space.ParseFromString(f.read())
    return space


def _events(plane):
    """(line id, line name, event name, start ps, end ps) of every event."""
    names = {k: v.name for k, v in plane.event_metadata.items()}
    for line in plane.lines:
        base = line.timestamp_ns * 1000
        for e in line.events:
            start = base + e.offset_ps
            yield line.id, line.name, names.get(e.metadata_id, "?"), start, start + e.duration_ps


def _is_blocking(name):
    return any(b.strip() == name or name.startswith(b) for b in BLOCKING) or \
        "Synchronize" in name


def analyse(space, steps):
    host_ops = collections.defaultdict(list)  # thread id -> [(start, end, name)]
    blocking, dtoh, planes = [], 0, []
    for plane in space.planes:
        planes.append(plane.name)
        if plane.name.startswith("/host:CPU"):
            for tid, _, name, s, e in _events(plane):
                host_ops[tid].append((s, e, name))
    for plane in space.planes:
        if plane.name == "/host:CUPTI" or "CUPTI" in plane.name:
            for tid, _, name, s, e in _events(plane):
                if _is_blocking(name):
                    blocking.append((tid, name, s, e))
        elif plane.name.startswith("/device:GPU"):
            for _, line, name, _, _ in _events(plane):
                if "DtoH" in name or ("Memcpy" in line and "DtoH" in name):
                    dtoh += 1
    by_op = collections.Counter()
    for tid, name, s, e in blocking:
        enclosing = [(os_, oe, on) for os_, oe, on in host_ops.get(tid, []) if os_ <= s and e <= oe]
        # The innermost TensorFlow op (TraceMe names look like "name:Type").
        ops = [on for os_, oe, on in sorted(enclosing, key=lambda x: x[1] - x[0]) if ":" in on]
        by_op[(ops[0].split(":")[-1] if ops else "(no TensorFlow op)", name)] += 1
    return planes, by_op, dtoh


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--mode", choices=["function", "graph", "both"], default="both")
    p.add_argument("--side", choices=["sok", "tf", "both"], default="both")
    p.add_argument("--batch", type=int, default=8192)
    p.add_argument("--rows", type=int, default=100000)
    p.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    args = p.parse_args()
    bench_args = argparse.Namespace(batch=args.batch, rows=args.rows, optimizer=args.optimizer)
    import numpy as np

    batches = e2e_bench.dlrm_batches(bench_args, np.random.default_rng(0), 4)
    modes = ["function", "graph"] if args.mode == "both" else [args.mode]
    sides = ["sok", "tf"] if args.side == "both" else [args.side]
    print(f"TensorFlow {tf.__version__}, GPUs {len(tf.config.list_physical_devices('GPU'))}; "
          f"DLRM batch {args.batch}, {args.steps} traced steps, optimizer {args.optimizer}")
    for mode in modes:
        for side in sides:
            build = e2e_bench.function_step if mode == "function" else e2e_bench.graph_step
            step = build("dlrm", side, bench_args, batches, False)
            for i in range(3):
                step(i)
            logdir = tempfile.mkdtemp(prefix="sok_syncs_")
            tf.profiler.experimental.start(logdir)
            for i in range(args.steps):
                step(i)
            tf.profiler.experimental.stop()
            planes, by_op, dtoh = analyse(_xspace(logdir), args.steps)
            total = sum(by_op.values())
            print(f"\n{side} / {mode}: {total / args.steps:.1f} blocking CUDA calls per step, "
                  f"{dtoh / args.steps:.1f} device-to-host copies per step")
            for (op, call), n in sorted(by_op.items(), key=lambda x: -x[1]):
                print(f"  {n / args.steps:6.1f}/step  {call:28} in {op}")
            if not any("CUPTI" in pl for pl in planes):
                print(f"  (no CUPTI plane in the trace: planes {planes})")


if __name__ == "__main__":
    main()
