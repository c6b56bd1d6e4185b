"""One worker of tests/test_collective_strategy_hostile.py's two-worker
tests: sok.CollectiveStrategy (engine from COLLECTIVE_STRATEGY) with a
model-parallel table, a partitioned get_variable under embedding_scope().

  --phase clip        --clip global: every gradient clipped by
                      tf.clip_by_global_norm; --clip table: the table's
                      gradient by tf.clip_by_norm; --clip both: the table's
                      by tf.clip_by_norm, then every gradient by
                      tf.clip_by_global_norm; between compute_gradients
                      and apply_gradients, each worker on its slice of every
                      global batch. Writes <out>/rank<r>.npz: this worker's
                      table rows with their global ids, the dense weights,
                      its per-step losses, the table gradient's norm
                      (tf.linalg.global_norm) and clip_by_global_norm's.
  --phase loss_scale  two steps of tf.compat.v1.mixed_precision's
                      MixedPrecisionLossScaleOptimizer: the first one's
                      scaled gradient overflows in table row 0 only (rank
                      0's row), the second is finite. Writes
                      <out>/rank<r>.npz: the dense weights and the loss
                      scale before and after each step.
  --phase unaveraged  apply_gradients given the table's gradient from
                      tf.gradients (not compute_gradients, which averages
                      over the workers): writes <out>/rank<r>.json with the
                      ValueError's message (null where none was raised).
  --phase checkpoint  --save D: trains 3 steps in a
                      MonitoredTrainingSession(checkpoint_dir=D) that saves
                      every step; then --restore D1 D2 ...: in turn, a
                      MonitoredTrainingSession(checkpoint_dir=Di) in a new
                      graph, saving nothing, and reads the table. Writes
                      <out>/rank<r>.json: the rows trained, and per restore
                      the rows and global step restored or the ValueError.
"""

import argparse
import json
import os

import numpy as np

# clip: TABLE_CLIP below the table gradient's norm and GLOBAL_CLIP below
# the global norm at every step (the test checks so on the reference), so
# that the clip bites.
ROWS, DIM, GLOBAL_BATCH, STEPS = 21, 4, 8, 4
TABLE_CLIP, GLOBAL_CLIP = 0.1, 0.08
CKPT_ROWS, CKPT_DIM, CKPT_STEPS = 20, 2, 3
OVERFLOW = 2e34  # times the default dynamic loss scale (2 ** 15): past float32's range


def _table(tf, strategy, name, shape, initializer):
    with strategy.embedding_scope(), tf.compat.v1.variable_scope(
            "emb", partitioner=tf.compat.v1.fixed_size_partitioner(2)):
        return tf.compat.v1.get_variable(name, shape=shape, initializer=initializer)


def _own_keys(rank, world, rows):
    """The table's rows this worker holds, in the order of its shard."""
    return np.arange(rank, rows, world)


def clip_table_init(shape, dtype=None, partition_info=None):
    import tensorflow as tf

    full = (np.arange(ROWS * DIM, dtype=np.float32).reshape(ROWS, DIM) % 7) / 10 - 0.3
    return tf.constant(full, dtype=dtype or tf.float32)


def clip_batches():
    rng = np.random.default_rng(11)
    return [(rng.integers(0, ROWS, size=(GLOBAL_BATCH, 3)).astype(np.int64),
             rng.integers(0, 2, size=(GLOBAL_BATCH, 1)).astype(np.float32))
            for _ in range(STEPS)]


def clip(tf, strategy, out, how):
    rank, world = strategy.rank(), strategy.world_size()
    with strategy.scope(), tf.Graph().as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None, 3], name="ids")
        labels = tf.compat.v1.placeholder(tf.float32, [None, 1], name="labels")
        table = _table(tf, strategy, "table", (ROWS, DIM), clip_table_init)
        x = tf.reshape(tf.nn.embedding_lookup(table, ids), [-1, 3 * DIM])
        w = tf.compat.v1.get_variable("dense/w", initializer=tf.constant(
            np.linspace(-0.5, 0.5, 3 * DIM, dtype=np.float32).reshape(3 * DIM, 1)))
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
            labels=labels, logits=tf.matmul(x, w)))
        opt = tf.compat.v1.train.AdagradOptimizer(0.3)
        grads, variables = zip(*opt.compute_gradients(loss))
        at = [i for i, v in enumerate(variables) if v is table]
        assert len(at) == 1, variables
        grads = list(grads)
        # The whole table's gradient norm (every worker's rows) in one
        # process; on several workers, what global_norm makes of a worker's part.
        table_norm = tf.linalg.global_norm([grads[at[0]]])
        global_norm = tf.constant(0.0)
        if how in ("table", "both"):
            grads[at[0]] = tf.clip_by_norm(grads[at[0]], TABLE_CLIP)
        if how in ("global", "both"):
            grads, global_norm = tf.clip_by_global_norm(grads, GLOBAL_CLIP)
        step = tf.compat.v1.train.get_or_create_global_step()
        train = opt.apply_gradients(list(zip(grads, variables)), global_step=step)
        losses, table_norms, global_norms = [], [], []
        with tf.compat.v1.train.MonitoredTrainingSession() as sess:
            for batch_ids, batch_labels in clip_batches():
                per = GLOBAL_BATCH // world
                feed = {ids: batch_ids[rank * per:(rank + 1) * per],
                        labels: batch_labels[rank * per:(rank + 1) * per]}
                got = sess.run([loss, table_norm, global_norm, train], feed)
                losses.append(got[0])
                table_norms.append(got[1])
                global_norms.append(got[2])
            rows, dense = sess.run([table, w])
    np.savez(os.path.join(out, f"rank{rank}.npz"), keys=_own_keys(rank, world, ROWS), rows=rows,
             w=dense, losses=np.array(losses), table_norms=np.array(table_norms),
             global_norms=np.array(global_norms))


def loss_scale(tf, strategy, out):
    rank = strategy.rank()
    with strategy.scope(), tf.Graph().as_default():
        table = _table(tf, strategy, "table", (4, 2), tf.compat.v1.constant_initializer(0.5))
        w = tf.compat.v1.get_variable("w", initializer=tf.constant([1.0, 2.0]))
        times = tf.compat.v1.placeholder(tf.float32, [], name="times")
        # Every worker reads row 0, which rank 0 holds: only rank 0's part of
        # the table's gradient overflows.
        loss = (times * tf.reduce_sum(tf.nn.embedding_lookup(table, tf.constant([0], tf.int64)))
                + tf.reduce_sum(tf.square(w)))
        opt = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.1), loss_scale="dynamic")
        train = opt.minimize(loss)
        scale = [v for v in tf.compat.v1.global_variables()
                 if v.op.name.endswith("current_loss_scale")]
        assert len(scale) == 1, tf.compat.v1.global_variables()
        dense, scales = [], []
        with tf.compat.v1.train.MonitoredTrainingSession() as sess:
            for value in (None, OVERFLOW, 1.0):
                if value is not None:
                    sess.run(train, {times: value})
                got = sess.run([w, scale[0]])
                dense.append(got[0])
                scales.append(got[1])
    np.savez(os.path.join(out, f"rank{rank}.npz"), w=np.array(dense), scales=np.array(scales))


def unaveraged(tf, strategy, out):
    rank = strategy.rank()
    message = None
    with strategy.scope(), tf.Graph().as_default():
        table = _table(tf, strategy, "table", (4, 2), tf.compat.v1.constant_initializer(0.5))
        w = tf.compat.v1.get_variable("w", initializer=tf.constant([1.0, 2.0]))
        loss = (tf.reduce_sum(tf.nn.embedding_lookup(table, tf.constant([0, 3], tf.int64)))
                + tf.reduce_sum(tf.square(w)))
        variables = [table, w]
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        try:
            opt.apply_gradients(list(zip(tf.gradients(loss, variables), variables)))
        except ValueError as e:
            message = str(e)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"error": message}, f)


def checkpoint(tf, strategy, out, save, restore):
    rank, world = strategy.rank(), strategy.world_size()
    keys = _own_keys(rank, world, CKPT_ROWS)

    def build():
        table = _table(tf, strategy, "table", (CKPT_ROWS, CKPT_DIM),
                       tf.compat.v1.constant_initializer(0.5))
        ids = tf.constant(keys)
        # Row i moves by (i + 1) per step: every row ends unlike the others
        # and unlike the initializer.
        loss = tf.reduce_sum(tf.nn.embedding_lookup(table, ids)
                             * tf.cast(tf.reshape(ids, [-1, 1]) + 1, tf.float32))
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss, global_step=step)
        return table, step, train

    result = {"rank": rank, "world": world, "keys": keys.tolist(), "restores": []}
    if save:
        with strategy.scope(), tf.Graph().as_default():
            table, _, train = build()
            with tf.compat.v1.train.MonitoredTrainingSession(
                    checkpoint_dir=save, save_checkpoint_steps=1) as sess:
                for _ in range(CKPT_STEPS):
                    sess.run(train)
                result["trained"] = sess.run(table).tolist()
    for directory in restore:
        with strategy.scope(), tf.Graph().as_default():
            table, step, _ = build()
            try:
                with tf.compat.v1.train.MonitoredTrainingSession(
                        checkpoint_dir=directory, save_checkpoint_steps=None,
                        save_checkpoint_secs=None, save_summaries_steps=None,
                        save_summaries_secs=None) as sess:
                    rows, at = sess.run([table, step])
                result["restores"].append({"dir": directory, "rows": rows.tolist(),
                                           "step": int(at)})
            except ValueError as e:
                result["restores"].append({"dir": directory, "error": str(e)})
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--phase", choices=["clip", "loss_scale", "unaveraged", "checkpoint"],
                   required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--clip", choices=["global", "table", "both"], default="global",
                   help="clip: clip_by_global_norm of every gradient, or clip_by_norm of "
                        "the table's")
    p.add_argument("--save", help="checkpoint: train and save under this checkpoint_dir")
    p.add_argument("--restore", nargs="*", default=[],
                   help="checkpoint: restore from each of these checkpoint_dirs in turn")
    args = p.parse_args()
    import tensorflow as tf

    tf.compat.v1.enable_eager_execution()  # TF 1.x starts in graph mode
    import sok_graph as sok

    strategy = sok.CollectiveStrategy()
    os.makedirs(args.out, exist_ok=True)
    if args.phase == "clip":
        clip(tf, strategy, args.out, args.clip)
    elif args.phase == "loss_scale":
        loss_scale(tf, strategy, args.out)
    elif args.phase == "unaveraged":
        unaveraged(tf, strategy, args.out)
    else:
        checkpoint(tf, strategy, args.out, args.save, args.restore)
    print(f"rank {strategy.rank()} of {strategy.world_size()}: {args.phase} done", flush=True)


if __name__ == "__main__":
    main()
