"""Time to a model's first training step in a tf.function: sok_graph
against plain TensorFlow.

The first call of a tf.function traces it: Python runs once to build the
graph (and AutoGraph rewrites the Python it calls), then the graph runs.
A recommender's training step is traced at start-up, again for every new
input signature, and once per process in every test and notebook, so this
is time users wait for. The step: `--tables` tables of `--rows` x `--dim`,
ragged ids (hotness 1..3, combiner mean), a dense layer, a sigmoid loss and
an SGD update of everything.

Three variants, each in a fresh process (AutoGraph and TensorFlow cache
what a trace made), alternated over `--rounds`:
  sok          sok.Variable tables, sok.lookup_sparse, sok.OptimizerWrapper
  sok_rewritten the same with AutoGraph rewriting sok_graph's Python as it
               rewrites the caller's (what every trace did before
               compat.leave_package_to_autograph_unconverted)
  plain_tf     tf.Variable tables, tf.nn.embedding_lookup_sparse per table,
               the Keras optimizer alone

Prints the median seconds of the first call and of a later step, and the
ratios against plain TensorFlow measured in the same run.

    python bench/first_step_bench.py [--tables 8 --rounds 3]
"""

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

VARIANTS = ("sok", "sok_rewritten", "plain_tf")


def parse_args(argv=None):
    from sok_graph.data.flags import int_at_least

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tables", type=int_at_least(1), default=8)
    p.add_argument("--rows", type=int_at_least(1), default=10000)
    p.add_argument("--dim", type=int_at_least(1), default=16)
    p.add_argument("--batch", type=int_at_least(1), default=1024)
    p.add_argument("--rounds", type=int_at_least(1), default=3)
    p.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def one_variant(args):
    """In this process: (seconds of the first call, seconds of a later step)."""
    import numpy as np
    import tensorflow as tf

    if tf.__version__.startswith("1."):
        tf.compat.v1.enable_eager_execution()
    import sok_graph as sok

    if args.variant == "sok_rewritten":
        from tensorflow.python.autograph.core import config as autograph_config

        autograph_config.CONVERSION_RULES = tuple(
            r for r in autograph_config.CONVERSION_RULES
            if not (isinstance(r, autograph_config.DoNotConvert) and r.matches("sok_graph")))
    rng = np.random.default_rng(0)
    rows = [rng.normal(0, 0.05, (args.rows, args.dim)).astype(np.float32)
            for _ in range(args.tables)]
    inputs = []
    for _ in range(args.tables):
        lengths = rng.integers(1, 4, size=args.batch)
        ids = rng.integers(0, args.rows, size=int(lengths.sum()))
        inputs.append(tf.RaggedTensor.from_row_lengths(ids, lengths))
    labels = tf.constant(rng.integers(0, 2, size=(args.batch, 1)).astype(np.float32))
    dense = tf.Variable(rng.normal(0, 0.1, (args.tables * args.dim, 1)).astype(np.float32))
    keras_sgd = tf.keras.optimizers.SGD(0.05) if not tf.__version__.startswith("1.") \
        else tf.compat.v1.train.GradientDescentOptimizer(0.05)
    if args.variant == "plain_tf":
        tables = [tf.Variable(r) for r in rows]
        sparse = [x.to_sparse() for x in inputs]

        def embed():
            return [tf.nn.embedding_lookup_sparse(t, s, None, combiner="mean")
                    for t, s in zip(tables, sparse)]
        optimizer = keras_sgd
    else:
        sok.init(comm_tool="none")
        tables = [sok.Variable(r) for r in rows]

        def embed():
            return sok.lookup_sparse(tables, inputs, combiners=["mean"] * args.tables)
        optimizer = sok.OptimizerWrapper(keras_sgd)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            logits = tf.matmul(tf.concat(embed(), axis=1), dense)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
        variables = tables + [dense]
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    started = time.perf_counter()
    step().numpy()
    first = time.perf_counter() - started
    step().numpy()
    started = time.perf_counter()
    step().numpy()
    return first, time.perf_counter() - started


def main():
    args = parse_args()
    if args.variant:
        first, later = one_variant(args)
        print(json.dumps({"first": first, "later": later}))
        return
    import numpy as np

    argv = [sys.executable, os.path.abspath(__file__), "--tables", str(args.tables),
            "--rows", str(args.rows), "--dim", str(args.dim), "--batch", str(args.batch)]
    seconds = {v: {"first": [], "later": []} for v in VARIANTS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            out = subprocess.run(argv + ["--variant", variant], capture_output=True, text=True,
                                 env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
            if out.returncode != 0:
                sys.exit(f"{variant} failed:\n{out.stdout}{out.stderr}")
            got = json.loads(out.stdout.strip().splitlines()[-1])
            for k in got:
                seconds[variant][k].append(got[k])
    med = {v: {k: float(np.median(x)) for k, x in s.items()} for v, s in seconds.items()}
    print(f"{args.tables} tables x {args.rows} x {args.dim}, batch {args.batch}, median of "
          f"{args.rounds} fresh processes each")
    base = med["plain_tf"]
    for v in VARIANTS:
        print(f"{v:>14}: first call {med[v]['first']:7.3f} s ({med[v]['first'] / base['first']:5.2f}x"
              f" plain TF)   later step {med[v]['later'] * 1e3:7.2f} ms "
              f"({med[v]['later'] / base['later']:5.2f}x)")


if __name__ == "__main__":
    main()
