"""One worker of tests/test_multiworker_hostile.py's strategy.run check:
the training step inside a MultiWorkerMirroredStrategy's strategy.run over
sok's worker processes (engine "tf"), or the same model in one process
(engine "none") on the whole global batch.

A static table of 21 rows (shards of 11 and 10 rows on two workers) and a
localized one, a dense weight, Keras Adam through sok.OptimizerWrapper
(--opt wrapper) or under sok.OptimizerScope (--opt scope). Step 0 trains
the dense weight only (the tables' gradients are None), steps 1-4 all.
Writes <out>/rank<r>.npz: this worker's rows of both tables with their
global ids, the dense weight, the losses and the Keras step count.
"""

import argparse
import os

import numpy as np

ROWS, DIM, GLOBAL_BATCH, STEPS = 21, 4, 8, 5


def batches():
    rng = np.random.default_rng(3)
    out = []
    for _ in range(STEPS):
        lengths = rng.integers(1, 4, size=GLOBAL_BATCH)
        ids = rng.integers(0, ROWS, size=lengths.sum()).astype(np.int64)
        labels = rng.integers(0, 2, size=GLOBAL_BATCH).astype(np.float32)
        out.append((ids, lengths.astype(np.int64), labels))
    return out


def local(batch, rank, world):
    ids, lengths, labels = batch
    per = GLOBAL_BATCH // world
    lo, hi = rank * per, (rank + 1) * per
    starts = np.concatenate([[0], np.cumsum(lengths)])
    return ids[starts[lo]:starts[hi]], lengths[lo:hi], labels[lo:hi]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--engine", choices=["tf", "none"], required=True)
    p.add_argument("--opt", choices=["wrapper", "scope"], required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    import tensorflow as tf

    import sok_graph as sok

    if args.engine == "tf":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        rank, world = strategy.cluster_resolver.task_id, strategy.num_replicas_in_sync
    else:
        strategy, rank, world = tf.distribute.get_strategy(), 0, 1
    init = np.random.default_rng(7).uniform(-0.5, 0.5, (ROWS, DIM)).astype(np.float32)
    with strategy.scope():
        sok.init(comm_tool=args.engine, use_legacy_optimizer=False)
        spread = sok.Variable(init, name="spread")
        alone = sok.Variable(init, mode=f"localized:{world - 1}", name="alone")
        w = tf.Variable(np.linspace(-0.3, 0.3, 2 * DIM, dtype=np.float32).reshape(2 * DIM, 1))
        keras_opt = tf.keras.optimizers.Adam(0.05)
        opt = sok.OptimizerWrapper(keras_opt) if args.opt == "wrapper" else keras_opt
    tables = [spread, alone]

    def step(ids, lengths, labels, with_tables):
        with tf.GradientTape() as tape:
            ragged = tf.RaggedTensor.from_row_lengths(ids, lengths)
            x = tf.concat(sok.lookup_sparse(tables, [ragged, ragged], combiners="sum"), 1)
            logits = tf.squeeze(tf.matmul(x, w), 1)
            loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(
                labels=labels, logits=logits)) / GLOBAL_BATCH
        grads = tape.gradient(loss, tables + [w])
        if not with_tables:  # a step that trains the dense layers only
            grads = [None, None, grads[2]]
        pairs = list(zip(grads, tables + [w]))
        if args.opt == "scope":
            with sok.OptimizerScope(tables):
                opt.apply_gradients(pairs)
        else:
            opt.apply_gradients(pairs)
        return loss

    losses = []
    for number, batch in enumerate(batches()):
        ids, lengths, labels = (tf.constant(x) for x in local(batch, rank, world))

        @tf.function
        def run(with_tables=number > 0):
            return strategy.reduce(
                "SUM", strategy.run(step, args=(ids, lengths, labels, with_tables)), axis=None)
        losses.append(float(run()))
    os.makedirs(args.out, exist_ok=True)
    rows = {}
    for table in tables:
        keys, values = sok.export(table)
        rows[table.name.split(":")[0] + "_keys"] = keys.numpy()
        rows[table.name.split(":")[0] + "_rows"] = values.numpy()
    np.savez(os.path.join(args.out, f"rank{rank}.npz"), w=w.numpy(), losses=np.array(losses),
             keras_steps=int(keras_opt.iterations.numpy()), **rows)
    print(f"rank {rank} of {world}: done", flush=True)


if __name__ == "__main__":
    main()
