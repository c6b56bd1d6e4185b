"""A "hybrid" dynamic table with part of its rows in host memory against
the same table with every row in GPU memory, on one training stream.

Both tables are DynamicVariable(var_type="hybrid") with the same
max_capacity, dimension and initializer; "all in GPU memory" leaves
max_hbm_for_vectors unset, "split" sets it to --hbm-share of the table's
values, max_capacity rows of dim floats (2/3: a table 1.5 times what it is
given of GPU memory, which is issue 43's case of a table 1.5x the GPU,
scaled to the host's memory; the rest of its rows are in host memory, and
a bounded table with a budget allocates max_capacity rows, however many
slots its index has). --split-only leaves out the all-GPU table, for a
table whose values do not fit the GPU at all. Both are filled with the
same --rows keys first (untimed), so the steps start with rows of both
tiers; the split table then moves its most used rows into GPU memory as it
trains (a pass every 16 lookups; per 2^25 slots for larger tables), which
the warm-up (--warmup steps, at least one round) and the rounds include.

A step (one tf.function): --batch samples of --hotness ids each, drawn from
Zipf(--alpha) (or uniform, --alpha 0) over --rows ids, each id hashed into
the 63-bit key space; sok.lookup_sparse (combiner sum), a squared loss, its
gradient and the SGD update of the table through sok.OptimizerWrapper. The
tables run in interleaved rounds (--rounds rounds of --steps steps each,
after the warm-up); the figure is the median over rounds of the time
per step. Printed: ms per step, millions of ids per second, the split
table's step rate over the all-GPU one's (issue 43's target: >= 0.5 on a
Zipf(1.05) stream), and the rows each table holds and has evicted after the
run (none may be lost below max_capacity).

    python bench/hybrid_bench.py [--rows 16777216 --dim 64 --batch 65536
        --hotness 4 --alpha 1.05 --hbm-share 0.6667 --rounds 5 --steps 20]

Needs a GPU for the split to mean anything (on CPU both tables are host
memory); the host needs memory for the host share of the rows.
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import sok_graph as sok  # noqa: E402
from sok_graph.data.hashed_keys import draw_ids, hashed  # noqa: E402


def make_table(args, hbm_gib):
    config = dict(init_capacity=args.capacity, max_capacity=args.capacity)
    if hbm_gib is not None:
        config["max_hbm_for_vectors"] = hbm_gib
    return sok.DynamicVariable(args.dim, var_type="hybrid", initializer="uniform", seed=5,
                               **config)


def fill(table, keys, chunk=1 << 20):
    for start in range(0, keys.size, chunk):
        table.sparse_read(tf.constant(keys[start:start + chunk]))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1 << 24, help="distinct ids of the stream")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=65536)
    p.add_argument("--hotness", type=int, default=4)
    p.add_argument("--alpha", type=float, default=1.05, help="Zipf exponent; 0: uniform")
    p.add_argument("--hbm-share", type=float, default=2 / 3,
                   help="share of the split table's row storage in GPU memory")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=0,
                   help="steps of each table before the rounds (default: one round's); a "
                        "large table passes its rows between tiers every 16 lookups per 2^25 "
                        "slots, so its steady state takes more")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batches", type=int, default=16, help="distinct batches, cycled")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split-only", action="store_true",
                   help="only the split table (one whose values exceed the GPU's memory)")
    p.add_argument("--trace", type=int, default=0,
                   help="then trace this many steps of each table: GPU time by op and kernel")
    args = p.parse_args()
    for flag in ("warmup", "trace"):
        if getattr(args, flag) < 0:
            p.error(f"--{flag} must be >= 0 (steps); got {getattr(args, flag)}")
    args.capacity = 1 << max(1, int(np.ceil(np.log2(args.rows))))
    sok.init(comm_tool="none")
    rng = np.random.default_rng(args.seed)
    values = args.capacity * args.dim * 4
    hbm_gib = args.hbm_share * values / (1 << 30)
    print(f"device: {'GPU' if tf.config.list_physical_devices('GPU') else 'CPU only'}; "
          f"{args.rows} ids, dim {args.dim}, max_capacity {args.capacity}; values "
          f"{values / (1 << 30):.2f} GiB, split table: {hbm_gib:.2f} GiB in GPU memory "
          f"({args.hbm_share:.3f} of the values); stream: "
          f"{'Zipf(%.2f)' % args.alpha if args.alpha > 0 else 'uniform'}, "
          f"{args.batch} x {args.hotness} ids per step", flush=True)

    tables = {} if args.split_only else {"all in GPU memory": make_table(args, None)}
    tables["split"] = make_table(args, hbm_gib)
    start = time.perf_counter()
    every_key = hashed(np.arange(args.rows))
    for table in tables.values():
        fill(table, every_key)
    print(f"filled in {time.perf_counter() - start:.1f} s", flush=True)
    if tf.config.list_physical_devices("GPU"):
        info = tf.config.experimental.get_memory_info("GPU:0")
        print(f"GPU memory through TensorFlow's allocator: {info['current'] / (1 << 30):.2f} "
              f"GiB in use, peak {info['peak'] / (1 << 30):.2f} GiB", flush=True)
    batches = []
    for _ in range(args.batches):
        ids = draw_ids(rng, args.alpha, args.rows, args.batch * args.hotness)
        batches.append(tf.RaggedTensor.from_uniform_row_length(
            tf.constant(hashed(ids)), args.hotness))
    distinct = np.mean([np.unique(b.flat_values.numpy()).size for b in batches])
    print(f"distinct keys per step: {distinct:.0f} of {args.batch * args.hotness}", flush=True)

    steps = {}
    for name, table in tables.items():
        optimizer = sok.OptimizerWrapper(tf.keras.optimizers.SGD(learning_rate=0.01))

        @tf.function
        def step(ids, table=table, optimizer=optimizer):
            with tf.GradientTape() as tape:
                pooled = sok.lookup_sparse(table, ids, combiners="sum")
                loss = tf.reduce_mean(tf.square(pooled - 1.0))
            grads = tape.gradient(loss, [table])
            optimizer.apply_gradients(zip(grads, [table]))
            return loss

        steps[name] = step

    def run_round(name):
        start = time.perf_counter()
        for i in range(args.steps):
            loss = steps[name](batches[i % len(batches)])
        float(loss)  # waits for the last step
        return (time.perf_counter() - start) / args.steps

    for name in tables:
        # warm-up: traces, first touches, the tiers' first passes
        for _ in range(max(1, -(-args.warmup // args.steps))):
            run_round(name)
    times = {name: [] for name in tables}
    for _ in range(args.rounds):
        for name in tables:
            times[name].append(run_round(name))
    ids_per_step = args.batch * args.hotness
    for name in tables:
        t = np.median(times[name])
        print(f"{name:>18}: {t * 1e3:8.3f} ms/step (min {min(times[name]) * 1e3:.3f}, "
              f"max {max(times[name]) * 1e3:.3f})  {ids_per_step / t / 1e6:8.2f} M ids/s")
    if "all in GPU memory" in times:
        ratio = np.median(times["all in GPU memory"]) / np.median(times["split"])
        print(f"split / all-in-GPU step rate: {ratio:.3f} (target >= 0.5)")
    if args.trace:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import host_syncs

        for name in tables:
            host_syncs.print_traced_steps(
                name, lambda i, name=name: steps[name](batches[i % len(batches)]), args.trace)
    for name, table in tables.items():
        stats = {k: int(v) for k, v in table.stats().items()}
        print(f"{name:>18}: {stats['size']} rows held of {args.rows} inserted, "
              f"{stats['evicted_total']} evicted, memory_bytes {stats['memory_bytes']}")
        assert stats["size"] == args.rows and stats["evicted_total"] == 0, stats


if __name__ == "__main__":
    main()
