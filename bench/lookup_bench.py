"""Fused multi-table lookup vs one tf.nn.embedding_lookup_sparse per table.

Forward + backward of a DLRM-shaped embedding layer (defaults: 26 tables x
100,000 rows, dim 16, batch 8192, hotness uniform in 1..5, combiner mean),
measured in the same process for both, in tf.function and in a graph-mode
Session. Prints steps/s and the ratio fused / baseline.

    python bench/lookup_bench.py [--tables 26 --rows 100000 --dim 16 --batch 8192]
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import sok_graph as sok  # noqa: E402
from sok_graph.data.flags import int_at_least, names_from  # noqa: E402


def make_inputs(args, rng):
    tables, samples = [], []
    for _ in range(args.tables):
        tables.append(rng.normal(0, 0.05, (args.rows, args.dim)).astype(np.float32))
        lengths = rng.integers(args.min_hot, args.max_hot + 1, size=args.batch)
        splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        ids = rng.integers(0, args.rows, size=splits[-1]).astype(np.int64)
        samples.append((ids, splits))
    return tables, samples


def build_steps(tables, samples, combiner):
    """(fused_step, baseline_step, check): each step computes the embeddings
    of all tables, loss = the sum of all embeddings, and the gradients of
    every table, and returns those gradients' values and the embeddings, so
    nothing can be pruned (the gradient of a sum does not read the
    embeddings: a Session fetching only the gradients would not run the
    forward lookups at all). The loss is kept trivial so that the time
    measured is the embedding layer's (a fixed upstream tensor would be
    constant-folded in a Session but not in a tf.function, and skew the
    comparison). `check` reduces a step's gradients and embeddings to one
    number for comparing the two."""
    fused_vars = [tf.Variable(t) for t in tables]
    base_vars = [tf.Variable(t) for t in tables]
    # validate=False: the fused op checks row_splits itself, and the baseline
    # gets its SparseTensors without per-step checks too.
    ragged = [tf.RaggedTensor.from_row_splits(ids, splits, validate=False)
              for ids, splits in samples]
    sparse = [r.to_sparse() for r in ragged]

    def grads_of(outs, tape, variables):
        loss = tf.add_n([tf.reduce_sum(o) for o in outs])
        return [g.values for g in tape.gradient(loss, variables)] + list(outs)

    def fused_step():
        with tf.GradientTape() as tape:
            outs = sok.lookup_sparse(fused_vars, ragged, combiners=combiner)
            return grads_of(outs, tape, fused_vars)

    def baseline_step():
        with tf.GradientTape() as tape:
            outs = [tf.nn.embedding_lookup_sparse(v, s, None, combiner=combiner)
                    for v, s in zip(base_vars, sparse)]
            return grads_of(outs, tape, base_vars)

    def check(values):
        return float(sum(np.abs(np.asarray(v, np.float64)).sum() for v in values))

    return fused_step, baseline_step, check


def time_steps(run, warmup, steps):
    for _ in range(warmup):
        run()
    start = time.perf_counter()
    for _ in range(steps):
        run()
    return steps / (time.perf_counter() - start)


def interleaved(runs, warmup, steps, rounds):
    """Median steps/s of each run over `rounds` alternating rounds, so both
    see the same machine load."""
    rates = {name: [] for name in runs}
    for name, run in runs.items():
        time_steps(run, warmup, 1)
    for _ in range(rounds):
        for name, run in runs.items():
            rates[name].append(time_steps(run, 0, steps))
    return {name: float(np.median(r)) for name, r in rates.items()}


def bench_function(args, tables, samples):
    fused, base, check = build_steps(tables, samples, args.combiner)
    fused_fn, base_fn = tf.function(fused), tf.function(base)
    # Same gradients (summed absolute values) before anything is timed.
    np.testing.assert_allclose(check(fused_fn()), check(base_fn()), rtol=1e-4)
    # A step's outputs stay on the host: returning them costs no copy; reading
    # one element waits for the step to finish.
    return interleaved({"fused": lambda: fused_fn()[0][0, 0].numpy(),
                        "baseline": lambda: base_fn()[0][0, 0].numpy()},
                       args.warmup, args.steps, args.rounds)


def bench_session(args, tables, samples):
    graph = tf.Graph()
    with graph.as_default():
        fused, base, check = build_steps(tables, samples, args.combiner)
        fused_t, base_t = fused(), base()
        # One element of every gradient and embedding: fetching it computes
        # all of them without copying them out (a tf.group gets pruned by
        # Grappler).
        fused_op = tf.add_n([v[0, 0] for v in fused_t])
        base_op = tf.add_n([v[0, 0] for v in base_t])
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        np.testing.assert_allclose(check(sess.run(fused_t)), check(sess.run(base_t)), rtol=1e-4)
        return interleaved({"fused": lambda: sess.run(fused_op),
                            "baseline": lambda: sess.run(base_op)},
                           args.warmup, args.steps, args.rounds)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tables", type=int_at_least(1), default=26)
    p.add_argument("--rows", type=int_at_least(1), default=100000)
    p.add_argument("--dim", type=int_at_least(1), default=16)
    p.add_argument("--batch", type=int_at_least(1), default=8192)
    p.add_argument("--min-hot", type=int_at_least(0), default=1)
    p.add_argument("--max-hot", type=int_at_least(1), default=5)
    p.add_argument("--combiner", default="mean")
    p.add_argument("--steps", type=int_at_least(1), default=10, help="steps per timed round")
    p.add_argument("--rounds", type=int_at_least(1), default=5)
    p.add_argument("--warmup", type=int_at_least(0), default=3)
    p.add_argument("--modes", type=names_from(("function", "session")), default="function,session")
    args = p.parse_args()
    if args.min_hot > args.max_hot:
        p.error(f"--min-hot {args.min_hot} must be <= --max-hot {args.max_hot}")

    sok.init()
    tables, samples = make_inputs(args, np.random.default_rng(0))
    nnz = sum(len(ids) for ids, _ in samples)
    print(f"TensorFlow {tf.__version__}, {os.cpu_count()} CPUs; {args.tables} tables x "
          f"{args.rows} rows, dim {args.dim}, batch {args.batch}, hotness "
          f"{args.min_hot}..{args.max_hot} ({nnz} ids per step), combiner {args.combiner}")
    print(f"{'mode':<12}{'fused steps/s':>16}{'baseline steps/s':>19}{'ratio':>9}")
    for mode in args.modes:
        rates = {"function": bench_function, "session": bench_session}[mode](args, tables,
                                                                            samples)
        ratio = rates["fused"] / rates["baseline"]
        print(f"{mode:<12}{rates['fused']:>16.2f}{rates['baseline']:>19.2f}{ratio:>8.2f}x",
              flush=True)


if __name__ == "__main__":
    main()
