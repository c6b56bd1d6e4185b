"""Summing a gradient's repeated rows by key: sok's deterministic segment sum
against TensorFlow's tf.math.unsorted_segment_sum, in the same run.

The rows of a batch's keys come back from the backward pass one per key of
the batch; before a sparse update they are summed per distinct key. Here
the keys are the DemoModel's (--batch x --slots x --nnz, default 8192 x
100 x 10 = 8.2M) drawn Zipf(--alpha) or uniform (--alpha 0) over --vocab
ids; the segment of each is its position among the distinct keys (what
unique returns), and the rows are --dim floats.

- sok: util_ops.unsorted_segment_sum, the same sums in the same order on
  every run and on CPU and GPU. It groups positions by a stable radix sort
  and adds a segment's rows in pieces of 1024, the pieces of a long segment
  in parallel; a Zipf stream's hottest key (hundreds of thousands of
  repeats) is no longer one thread's serial loop. Checked, it reads one
  flag back (ids >= num_segments are an error); unchecked (check_ids=False,
  what a gradient's sum by a unique's positions uses) it reads nothing.
- TF: tf.math.unsorted_segment_sum, atomic adds on a GPU (the order of the
  additions, and the last bits of the sums, vary from run to run).

Printed: ms per call (median of --rounds rounds of --calls calls), the
ratio sok / TF, and the largest difference between the two results
relative to the largest sum.

    python bench/segment_sum_bench.py [--alpha 1.05 --vocab 1048576
        --batch 8192 --slots 100 --nnz 10 --dim 16]

On a CPU use a smaller --batch (e.g. 256).
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from sok_graph.data.hashed_keys import draw_ids  # noqa: E402
from sok_graph.ops import util as util_ops  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=1 << 20)
    p.add_argument("--alpha", type=float, default=1.05, help="Zipf exponent; 0: uniform")
    p.add_argument("--batch", type=int, default=8192)
    p.add_argument("--slots", type=int, default=100)
    p.add_argument("--nnz", type=int, default=10)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    ids = draw_ids(rng, args.alpha, args.vocab, args.batch * args.slots * args.nnz)
    distinct, position, counts = np.unique(ids, return_inverse=True, return_counts=True)
    num = distinct.size
    rows = rng.standard_normal((ids.size, args.dim)).astype(np.float32)
    device = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
    print(f"device {device}, TensorFlow {tf.__version__}: {ids.size} rows of {args.dim} floats "
          f"into {num} segments ({'Zipf(%.2f)' % args.alpha if args.alpha > 0 else 'uniform'} "
          f"over {args.vocab} ids; longest segment {counts.max()})", flush=True)
    values = tf.constant(rows)
    segments = tf.constant(position.astype(np.int64))

    def repeated(fn):
        @tf.function
        def calls():
            acc = tf.zeros([num, args.dim])
            for _ in range(args.calls):  # unrolled: one launch per call, no host loop
                acc += fn(values, segments, num)
            return acc
        return calls

    sides = {"sok, ids checked": repeated(util_ops.unsorted_segment_sum),
             "sok, unchecked": repeated(util_ops.sum_by_position),
             "TF unsorted_segment_sum": repeated(tf.math.unsorted_segment_sum)}
    results = {name: fn().numpy() / args.calls for name, fn in sides.items()}  # warm-up
    times = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, fn in sides.items():
            start = time.perf_counter()
            fn().numpy()
            times[name].append((time.perf_counter() - start) / args.calls)
    median = {name: float(np.median(t)) for name, t in times.items()}
    base = median["TF unsorted_segment_sum"]
    for name in sides:
        print(f"{name:>24}: {median[name] * 1e3:8.3f} ms per call, {median[name] / base:6.2f}x TF")
    checked, unchecked, tf_sum = results.values()
    if not np.array_equal(checked, unchecked):
        raise SystemExit("sok's checked and unchecked sums differ")
    scale = float(np.abs(tf_sum).max()) or 1.0
    print(f"largest difference sok - TF: {float(np.abs(checked - tf_sum).max()) / scale:.2e} "
          f"of the largest sum")


if __name__ == "__main__":
    main()
