"""One worker of tests/test_collective_strategy.py's training comparison.

  --mode strategy  CollectiveStrategy (engine from COLLECTIVE_STRATEGY): the
                   table is a partitioned get_variable under embedding_scope()
                   (one sharded sok.Variable), trained with a native
                   tf.compat.v1 optimizer in a MonitoredTrainingSession, each
                   worker on its slice of every global batch, its loss a mean
                   over that slice.
  --mode plain     the reference: plain TensorFlow in one process, the same
                   model on whole global batches, the table a 3-way
                   PartitionedVariable.
  --api lookup     tf.nn.embedding_lookup_sparse + tf.nn.embedding_lookup, the
                   table L2-regularized (get_variable's regularizer)
  --api fc         tf.compat.v1.feature_column.input_layer with embedding_column
  --opt adagrad | ftrl

Writes <out>/rank<r>.npz: this worker's table rows with their global ids,
the dense weights, and its per-step losses.
"""

import argparse
import os

import numpy as np

ROWS, DIM, GLOBAL_BATCH, STEPS = 50, 4, 8, 5


def table_init(shape, dtype=None, partition_info=None):
    """A fixed [ROWS, DIM] table; a partition gets its slice (the plain
    reference's PartitionedVariable asks per part)."""
    import tensorflow as tf

    full = np.arange(ROWS * DIM, dtype=np.float32).reshape(ROWS, DIM) % 7 / 10 - 0.3
    start = 0 if partition_info is None else partition_info.var_offset[0]
    return tf.constant(full[start:start + shape[0]], dtype=dtype or tf.float32)


def batches():
    rng = np.random.default_rng(7)
    out = []
    for _ in range(STEPS):
        lengths = rng.integers(1, 4, size=GLOBAL_BATCH)
        ids = np.minimum(rng.zipf(1.5, size=lengths.sum()) - 1, ROWS - 1).astype(np.int64)
        single = rng.integers(0, ROWS, size=GLOBAL_BATCH).astype(np.int64)
        labels = rng.integers(0, 2, size=(GLOBAL_BATCH, 1)).astype(np.float32)
        out.append((ids, lengths, single, labels))
    return out


def local(batch, rank, world):
    ids, lengths, single, labels = batch
    per = GLOBAL_BATCH // world
    lo, hi = rank * per, (rank + 1) * per
    starts = np.concatenate([[0], np.cumsum(lengths)])
    return ids[starts[lo]:starts[hi]], lengths[lo:hi], single[lo:hi], labels[lo:hi]


def sparse_value(ids, lengths):
    import tensorflow as tf

    rows = np.repeat(np.arange(len(lengths)), lengths)
    cols = np.concatenate([np.arange(n) for n in lengths])
    return tf.compat.v1.SparseTensorValue(np.stack([rows, cols], 1).astype(np.int64), ids,
                                          np.array([len(lengths), 3], np.int64))


def build(tf, strategy, api, rank):
    """The model: (ids, single ids, labels placeholders, features, logits)."""
    sp = tf.compat.v1.sparse_placeholder(tf.int64, name="ids")
    single = tf.compat.v1.placeholder(tf.int64, [None], name="single")
    labels = tf.compat.v1.placeholder(tf.float32, [None, 1], name="labels")
    partitioner = tf.compat.v1.fixed_size_partitioner(3)
    emb_scope = strategy.embedding_scope() if strategy else _null()
    with emb_scope, tf.compat.v1.variable_scope("emb", partitioner=partitioner):
        if api == "lookup":
            # With an L2 regularizer: plain TensorFlow adds one loss per
            # part, CollectiveStrategy one per worker's shard.
            table = tf.compat.v1.get_variable(
                "table", shape=(ROWS, DIM), initializer=table_init,
                regularizer=lambda t: 0.01 * tf.reduce_sum(tf.square(t)))
            a = tf.nn.embedding_lookup_sparse(table, sp, None, combiner="mean")
            b = tf.nn.embedding_lookup(table, single)
            x = tf.concat([a, b], 1)
        else:
            column = tf.feature_column.embedding_column(
                tf.feature_column.categorical_column_with_identity("f", ROWS), DIM,
                combiner="mean", initializer=table_init)
            x = tf.compat.v1.feature_column.input_layer({"f": sp}, [column])
    in_dim = x.shape[1]
    # Rank r > 0 starts with other dense weights: the broadcast from rank 0
    # must replace them.
    w0 = np.linspace(-0.5, 0.5, in_dim, dtype=np.float32).reshape(in_dim, 1) + rank
    w = tf.compat.v1.get_variable("dense/w", initializer=tf.constant(w0))
    bias = tf.compat.v1.get_variable("dense/b", shape=[1],
                                     initializer=tf.compat.v1.zeros_initializer())
    return sp, single, labels, x, tf.matmul(x, w) + bias


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["strategy", "plain"], required=True)
    p.add_argument("--api", choices=["lookup", "fc"], required=True)
    p.add_argument("--opt", choices=["adagrad", "ftrl"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--export", help="strategy mode: export a SavedModel here after training")
    p.add_argument("--as_text", action="store_true", help="export saved_model.pbtxt")
    args = p.parse_args()
    import tensorflow as tf

    tf.compat.v1.enable_eager_execution()  # TF 1.x starts in graph mode

    strategy = None
    if args.mode == "strategy":
        import sok_graph as sok

        strategy = sok.CollectiveStrategy()
        rank, world = strategy.rank(), strategy.world_size()
    else:
        rank, world = 0, 1

    scope = strategy.scope() if strategy else _null()
    with scope, tf.Graph().as_default():
        sp, single, labels, x, logits = build(tf, strategy, args.api, rank)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                      logits=logits))
        regularization = tf.compat.v1.losses.get_regularization_losses()
        if regularization:
            loss = loss + tf.add_n(regularization)
        step = tf.compat.v1.train.get_or_create_global_step()
        if args.opt == "adagrad":
            opt = tf.compat.v1.train.AdagradOptimizer(0.3)
        else:
            opt = tf.compat.v1.train.FtrlOptimizer(0.3, l1_regularization_strength=0.001,
                                                   l2_regularization_strength=0.01)
        train_op = opt.minimize(loss, global_step=step)
        table_vars = [v for v in tf.compat.v1.global_variables()
                      if v.op.name.startswith("emb/") and len(v.shape) == 2
                      and "/Adagrad" not in v.op.name and "/Ftrl" not in v.op.name]
        losses = []
        with tf.compat.v1.train.MonitoredTrainingSession() as sess:
            for batch in batches():
                ids, lengths, s, y = local(batch, rank, world)
                feed = {sp: sparse_value(ids, lengths), single: s, labels: y}
                losses.append(sess.run([loss, train_op], feed)[0])
            parts = sess.run(table_vars)
            dense = sess.run([v for v in tf.compat.v1.global_variables()
                              if v.op.name in ("dense/w", "dense/b")])
            if args.export:
                def signature_def_fn():
                    sp, single, _, _, logits = build(tf, strategy, args.api, rank)
                    sig = tf.compat.v1.saved_model.predict_signature_def(
                        {"ids": sp, "single": single}, {"logits": logits})
                    return {"serving_default": sig}

                written = strategy.export_saved_model(args.export, session=sess,
                                                      signature_def_fn=signature_def_fn,
                                                      as_text=args.as_text)
                assert (written is not None) == (rank == 0), written
    if strategy is not None:
        assert len(table_vars) == 1 and sok.distributed_variable.is_sok_variable(table_vars[0])
        rows = parts[0]
        keys = np.arange(rank, ROWS, world)
        assert rows.shape[0] == len(keys), (rows.shape, len(keys))
    else:
        assert len(table_vars) == 3, [v.name for v in table_vars]
        order = sorted(range(3), key=lambda i: table_vars[i].op.name)
        rows = np.concatenate([parts[i] for i in order])
        keys = np.arange(ROWS)
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, f"rank{rank}.npz"), keys=keys, rows=rows,
             w=dense[0], b=dense[1], losses=np.array(losses))
    print(f"rank {rank} of {world}: losses {losses}", flush=True)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
