"""One side of a tf.train.Checkpoint of sok tables written and read with
different numbers of MirroredStrategy replicas (tests/test_tf_distribute_comm.py):

    replica_checkpoint.py --replicas N --phase save|load --path P [--graph]

--replicas 1 makes plain tables (no strategy). save: a static table of rows
[i, -i] and a dynamic table holding keys 0..11 with rows [k, -k], written to
P. load: the same tables made with other rows (zeros; dynamic: keys 50..52),
restored from P (--graph: in a Session's graph), then compared with what
was saved, key by key. Prints "OK";
a mismatch is an AssertionError.
"""

import argparse

import numpy as np

KEYS = np.arange(12, dtype=np.int64)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--replicas", type=int, required=True)
    p.add_argument("--phase", choices=["save", "load"], required=True)
    p.add_argument("--path", required=True)
    p.add_argument("--graph", action="store_true",
                   help="load: restore in a tf.compat.v1 Session's graph, no initializer run")
    args = p.parse_args()
    n = args.replicas
    import tensorflow as tf

    strategy = None
    if n > 1:
        from mirrored_cpus import mirrored_strategy_on_cpus

        strategy = mirrored_strategy_on_cpus(n)
    import sok_graph as sok

    if args.graph:
        return _load_in_a_graph(sok, strategy, n, args.path)
    if strategy is None:
        sok.init(comm_tool="none")
    else:
        with strategy.scope():
            sok.init(comm_tool="tf")
    saving = args.phase == "save"
    rows = np.stack([np.arange(10), -np.arange(10)], 1).astype(np.float32)
    static = sok.Variable(rows if saving else np.zeros_like(rows), name="static")
    dynamic = sok.DynamicVariable(dimension=2, initializer="zeros", name="dynamic")

    def put(keys):
        """Gives `dynamic` these keys, rows [k, -k], each on its owner."""
        def assign(k):
            return sok.assign(dynamic, k, tf.stack([tf.cast(k, tf.float32),
                                                    -tf.cast(k, tf.float32)], 1))

        if strategy is None:
            assign(tf.constant(keys))
            return

        def replica():
            r = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.int64)
            k = tf.constant(keys)
            return assign(tf.boolean_mask(k, tf.equal(tf.math.floormod(k, n), r)))

        strategy.run(tf.function(replica))

    checkpoint = tf.train.Checkpoint(static=static, dynamic=dynamic)
    if saving:
        put(KEYS)
        checkpoint.write(args.path)
    else:
        put(np.array([50, 51, 52], np.int64))  # a restore drops them
        checkpoint.read(args.path)
    keys, got = (np.asarray(t) for t in sok.export(static))
    np.testing.assert_array_equal(got[np.argsort(keys)], rows)
    keys, got = (np.asarray(t) for t in sok.export(dynamic))
    order = np.argsort(keys)
    np.testing.assert_array_equal(keys[order], KEYS)
    np.testing.assert_array_equal(got[order], np.stack([KEYS, -KEYS], 1).astype(np.float32))
    if strategy is not None:
        # Each shard holds exactly the keys it owns.
        for r, shard in enumerate(dynamic.shards):
            held = np.sort(np.asarray(shard.export()[0]))
            np.testing.assert_array_equal(held, KEYS[KEYS % n == r])
    if not saving and strategy is not None:
        # A table of other rows is refused before any shard changes (the
        # first shard took its rows before the second refused them).
        small = sok.Variable(np.zeros([9, 2], np.float32), name="static")
        try:
            tf.train.Checkpoint(static=small).read(args.path)
        except ValueError as e:
            assert "have shape [10, 2]; the table's are [9, 2]" in str(e), e
        else:
            raise AssertionError("10 rows restored into a table of 9")
        assert not np.asarray(sok.export(small)[1]).any()
    print("OK", flush=True)


def _load_in_a_graph(sok, strategy, n, path):
    """The load side in a tf.compat.v1 Session's graph: the restore's ops
    make the tables (no initializer runs first)."""
    import tensorflow as tf
    from sok_graph import context

    with tf.Graph().as_default():
        if strategy is None:
            sok.init(comm_tool="none")
        else:
            with strategy.scope():
                sok.init(comm_tool="tf")
        rows = np.stack([np.arange(10), -np.arange(10)], 1).astype(np.float32)
        static = sok.Variable(np.zeros_like(rows), name="static")
        dynamic = sok.DynamicVariable(dimension=2, initializer="zeros", name="dynamic")
        status = tf.train.Checkpoint(static=static, dynamic=dynamic).restore(path)
        exports = [sok.export(static), sok.export(dynamic)]
        # A Session must see every replica's device (logical CPUs or GPUs).
        config = None if strategy is None else context.active().session_config()
        with tf.compat.v1.Session(config=config) as sess:
            status.run_restore_ops(sess)
            (skeys, srows), (dkeys, drows) = sess.run(exports)
    np.testing.assert_array_equal(srows[np.argsort(skeys)], rows)
    order = np.argsort(dkeys)
    np.testing.assert_array_equal(dkeys[order], KEYS)
    np.testing.assert_array_equal(drows[order], np.stack([KEYS, -KEYS], 1).astype(np.float32))
    print("OK", flush=True)


if __name__ == "__main__":
    main()
