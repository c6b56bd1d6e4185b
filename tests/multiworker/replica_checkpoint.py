"""One side of a tf.train.Checkpoint of sok tables written and read with
different numbers of MirroredStrategy replicas (tests/test_tf_distribute_comm.py):

    replica_checkpoint.py --replicas N --phase save|load --path P

--replicas 1 makes plain tables (no strategy). save: a static table of rows
[i, -i] and a dynamic table holding keys 0..11 with rows [k, -k], written to
P. load: the same tables made with other rows (zeros; dynamic: keys 50..52),
restored from P, then compared with what was saved, key by key. Prints "OK";
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
    args = p.parse_args()
    n = args.replicas
    import tensorflow as tf

    strategy = None
    if n > 1:
        from mirrored_cpus import mirrored_strategy_on_cpus

        strategy = mirrored_strategy_on_cpus(n)
    import sok_graph as sok

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
    print("OK", flush=True)


if __name__ == "__main__":
    main()
