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
    """(fused_step, baseline_step): each returns a scalar that depends on every
    gradient, so nothing can be pruned."""
    fused_vars = [tf.Variable(t) for t in tables]
    base_vars = [tf.Variable(t) for t in tables]
    ragged = [tf.RaggedTensor.from_row_splits(ids, splits) for ids, splits in samples]
    sparse = [r.to_sparse() for r in ragged]

    def finish(tape, loss, variables):
        grads = tape.gradient(loss, variables)
        return tf.add_n([tf.reduce_sum(g.values) for g in grads])

    def fused_step():
        with tf.GradientTape() as tape:
            outs = sok.lookup_sparse(fused_vars, ragged, combiners=combiner)
            loss = tf.add_n([tf.reduce_sum(o * o) for o in outs])
        return finish(tape, loss, fused_vars)

    def baseline_step():
        with tf.GradientTape() as tape:
            outs = [tf.nn.embedding_lookup_sparse(v, s, None, combiner=combiner)
                    for v, s in zip(base_vars, sparse)]
            loss = tf.add_n([tf.reduce_sum(o * o) for o in outs])
        return finish(tape, loss, base_vars)

    return fused_step, baseline_step


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
    fused, base = build_steps(tables, samples, args.combiner)
    fused_fn, base_fn = tf.function(fused), tf.function(base)
    a, b = fused_fn().numpy(), base_fn().numpy()
    np.testing.assert_allclose(a, b, rtol=1e-3)  # same gradients, summed
    return interleaved({"fused": lambda: fused_fn().numpy(),
                        "baseline": lambda: base_fn().numpy()},
                       args.warmup, args.steps, args.rounds)


def bench_session(args, tables, samples):
    graph = tf.Graph()
    with graph.as_default():
        fused, base = build_steps(tables, samples, args.combiner)
        fused_t, base_t = fused(), base()
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        return interleaved({"fused": lambda: sess.run(fused_t),
                            "baseline": lambda: sess.run(base_t)},
                           args.warmup, args.steps, args.rounds)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tables", type=int, default=26)
    p.add_argument("--rows", type=int, default=100000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--batch", type=int, default=8192)
    p.add_argument("--min-hot", type=int, default=1)
    p.add_argument("--max-hot", type=int, default=5)
    p.add_argument("--combiner", default="mean")
    p.add_argument("--steps", type=int, default=10, help="steps per timed round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--modes", default="function,session")
    args = p.parse_args()

    sok.init()
    tables, samples = make_inputs(args, np.random.default_rng(0))
    nnz = sum(len(ids) for ids, _ in samples)
    print(f"TensorFlow {tf.__version__}, {os.cpu_count()} CPUs; {args.tables} tables x "
          f"{args.rows} rows, dim {args.dim}, batch {args.batch}, hotness "
          f"{args.min_hot}..{args.max_hot} ({nnz} ids per step), combiner {args.combiner}")
    print(f"{'mode':<12}{'fused steps/s':>16}{'baseline steps/s':>19}{'ratio':>9}")
    for mode in args.modes.split(","):
        rates = {"function": bench_function, "session": bench_session}[mode](args, tables,
                                                                            samples)
        ratio = rates["fused"] / rates["baseline"]
        print(f"{mode:<12}{rates['fused']:>16.2f}{rates['baseline']:>19.2f}{ratio:>8.2f}x",
              flush=True)


if __name__ == "__main__":
    main()
