"""The fused sparse update against the TensorFlow-op update it replaces.

One OptimizerWrapper step (apply_gradients only: the gradients are fixed
IndexedSlices of distinct rows, as a lookup gives them) over DLRM-shaped
static tables (defaults: 26 tables x 100,000 rows, dim 16, 20,000 distinct
rows each) and one dynamic table, in a tf.function, for each algorithm: the
fused ops (SokSparseApply for every static table, SokDynamicSparseApply per
dynamic table) against the same wrapper with fusing turned off (a gather,
the formula's element-wise ops and a scatter per table and slot), measured
in the same process, alternating. Prints steps/s and the ratio.

    python bench/optimizer_bench.py [--tables 26 --rows 100000 --dim 16 --touched 20000]
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import sok_graph as sok  # noqa: E402
from sok_graph.data.flags import int_at_least, names_from  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lookup_bench import interleaved  # noqa: E402

OPTIMIZERS = {
    "sgd": lambda: tf.keras.optimizers.SGD(0.01),
    "adam": lambda: tf.keras.optimizers.Adam(0.01),
    "ftrl": lambda: tf.keras.optimizers.Ftrl(0.01),
    "adagrad": lambda: tf.keras.optimizers.Adagrad(0.01),
    "rmsprop": lambda: tf.keras.optimizers.RMSprop(0.01),
    "rmsprop_momentum_centered": lambda: tf.keras.optimizers.RMSprop(0.01, momentum=0.9,
                                                                     centered=True),
    "adadelta": lambda: tf.keras.optimizers.Adadelta(1.0),
    "adamax": lambda: tf.keras.optimizers.Adamax(0.01),
}


def build(args, name, fused, rng):
    """A tf.function step of `name` over fresh tables, fused or not."""
    sok.init()
    tables = [sok.Variable(rng.normal(0, 0.05, (args.rows, args.dim)).astype(np.float32))
              for _ in range(args.tables)]
    dynamic = sok.DynamicVariable(args.dim, initializer="uniform")
    ids = [tf.constant(rng.choice(args.rows, args.touched, replace=False).astype(np.int64))
           for _ in tables]
    keys = tf.constant(rng.choice(1 << 40, args.touched, replace=False).astype(np.int64))
    grads = [tf.constant(rng.normal(0, 1, (args.touched, args.dim)).astype(np.float32))
             for _ in range(args.tables + 1)]
    dynamic.sparse_read(keys)  # the keys exist, as after the step's lookup
    opt = sok.OptimizerWrapper(OPTIMIZERS[name]())
    if not fused:
        opt._fusable = lambda var: False
    pairs = [(tf.IndexedSlices(g, i, tf.constant([args.rows, args.dim], tf.int64)), t)
             for g, i, t in zip(grads, ids, tables)]
    pairs.append((tf.IndexedSlices(grads[-1], keys), dynamic))

    @tf.function
    def step():
        opt.apply_gradients(pairs)
        return tables[0][0, 0]

    return step, tables, dynamic, keys


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tables", type=int_at_least(1), default=26)
    p.add_argument("--rows", type=int_at_least(1), default=100000)
    p.add_argument("--dim", type=int_at_least(1), default=16)
    p.add_argument("--touched", type=int_at_least(1), default=20000,
                   help="distinct rows per table")
    p.add_argument("--algorithms", type=names_from(tuple(OPTIMIZERS)),
                   default=",".join(OPTIMIZERS))
    p.add_argument("--steps", type=int_at_least(1), default=10, help="steps per timed round")
    p.add_argument("--rounds", type=int_at_least(1), default=5)
    p.add_argument("--warmup", type=int_at_least(0), default=3)
    args = p.parse_args()
    if args.touched > args.rows:
        p.error(f"--touched {args.touched} must be <= --rows {args.rows} (distinct rows of "
                f"each table)")
    print(f"{args.tables} static tables x {args.rows} rows x {args.dim} + 1 dynamic table, "
          f"{args.touched} distinct rows each; TensorFlow {tf.__version__}")
    print(f"{'algorithm':<28}{'fused steps/s':>15}{'TF ops steps/s':>16}{'ratio':>8}")
    for name in args.algorithms:
        steps = {}
        results = {}
        for fused in (True, False):
            step, tables, dynamic, keys = build(args, name, fused, np.random.default_rng(0))
            steps["fused" if fused else "tf_ops"] = step
            step()  # one step each: the same rows before anything is timed
            results[fused] = (tables[0].numpy(), dynamic.sparse_read(keys).numpy())
        for a, b in zip(results[True], results[False]):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
        rates = interleaved({k: (lambda s=s: s().numpy()) for k, s in steps.items()},
                            args.warmup, args.steps, args.rounds)
        print(f"{name:<28}{rates['fused']:>15.1f}{rates['tf_ops']:>16.1f}"
              f"{rates['fused'] / rates['tf_ops']:>7.2f}x", flush=True)


if __name__ == "__main__":
    main()
