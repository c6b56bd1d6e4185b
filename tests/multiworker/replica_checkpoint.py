"""One side of a tf.train.Checkpoint of sok tables written and read with
different numbers of MirroredStrategy replicas (tests/test_tf_distribute_comm.py):

    replica_checkpoint.py --replicas N --phase save|load --path P [--graph]

--replicas 1 makes plain tables (no strategy). save: a static table of rows
[i, -i] and a dynamic table holding keys 0..11 with rows [k, -k], and an
OptimizerWrapper (Adam) at step 7 whose slots m and v hold 10 and 100 times
each row, written to P. load: the same tables made with other rows (zeros;
dynamic: keys 50..52) and a fresh optimizer, restored from P (--graph: in a
Session's graph), then compared with what was saved, key by key, slots and
every replica's step included. Two more dynamic tables hold admission
counts (per key, and a count-min sketch's counters), which come back as
sok.load gives them: each key's count on its owner, the sketch's sum of
every shard's counters on every shard. Prints "OK"; a mismatch is an
AssertionError.
"""

import argparse

import numpy as np

KEYS = np.arange(12, dtype=np.int64)
# Each slot holds its factor times the row of its key.
SLOT_FACTORS = {"m": 10.0, "v": 100.0}
STEP = 7  # the optimizer's step when saved


def _table_rows(keys):
    keys = np.asarray(keys)
    return np.stack([keys, -keys], 1).astype(np.float32)


def _slot_shards(opt, table):
    """(table shard, its slot) per shard and slot name: the whole slot's
    shards for a table sharded over replicas (get_slot outside
    strategy.run), the slot itself for one table."""
    from sok_graph.tables import replica_shards

    out = []
    for name in SLOT_FACTORS:
        whole = opt.get_slot(table, name)
        slots = whole.shards if isinstance(table, replica_shards.ReplicaShards) else [whole]
        out += [(name, shard, slot)
                for shard, slot in zip(replica_shards.shards_of(table), slots)]
    return out


def _write_slots(opt, static, dynamic):
    import tensorflow as tf

    opt.create_slots(static)
    opt.create_slots(dynamic)
    for table in (static, dynamic):
        for name, shard, slot in _slot_shards(opt, table):
            if table is static:
                ids = shard.export_chunk(0, 1 << 62)[0].numpy()
            else:
                ids = KEYS[np.mod(KEYS, shard.placement[0]) == shard.placement[1]]
            shard.replace_slot(slot, tf.constant(ids),
                               SLOT_FACTORS[name] * _table_rows(ids))


def _slot_contents(opt, static, dynamic, run=None):
    """{(table, slot name, shard index): (keys, rows)} read from the slots."""
    import sok_graph as sok

    run = run or (lambda t: [np.asarray(x) for x in t])
    got = {}
    for label, table in (("static", static), ("dynamic", dynamic)):
        for name, shard, slot in _slot_shards(opt, table):
            index = shard.placement[1]
            if label == "static":
                keys, rows = run((shard.export_chunk(0, 1 << 62)[0], slot.read_value()))
            else:
                keys, rows = run(sok.export(slot))
            got[(label, name, index)] = (keys, rows)
    return got


# Admission counts: per key (each key's count, held by its owner), and a
# sketch's counters, given to every shard as a load gives them: a checkpoint
# holds each counter's largest over the shards, the same for any number of
# replicas (their sum, kept before, grew with the replicas at every save).
COUNTED_KEYS = np.arange(100, 112, dtype=np.int64)
SKETCH_ENTRIES = np.arange(8, dtype=np.int64)


def _count_tables(sok):
    return (sok.DynamicVariable(dimension=2, initializer="zeros", name="counted", min_count=50),
            sok.DynamicVariable(dimension=2, initializer="zeros", name="sketched", min_count=50,
                                min_count_counters=64, min_count_hashes=2))


def _write_counts(counted, sketched):
    import tensorflow as tf
    from sok_graph.tables import replica_shards

    for shard in replica_shards.shards_of(counted):
        world, rank, _ = shard.placement
        keys = COUNTED_KEYS[np.mod(COUNTED_KEYS, world) == rank]
        shard.admission.restore(tf.constant(keys), tf.constant(keys - 95))
    for shard in replica_shards.shards_of(sketched):
        shard.admission.restore(tf.constant(SKETCH_ENTRIES), tf.constant(SKETCH_ENTRIES + 1))


def _check_counts(counted, sketched, run=None):
    """Each key's count on its owner; the sketch's counters on every shard."""
    from sok_graph.tables import replica_shards

    run = run or (lambda t: [np.asarray(x) for x in t])
    for shard in replica_shards.shards_of(counted):
        world, rank, _ = shard.placement
        keys, counts = run(shard.admission.export())
        order = np.argsort(keys)
        want = COUNTED_KEYS[np.mod(COUNTED_KEYS, world) == rank]
        np.testing.assert_array_equal(keys[order], want, err_msg=f"counted shard {rank}")
        np.testing.assert_array_equal(counts[order], want - 95, err_msg=f"counted shard {rank}")
    shards = replica_shards.shards_of(sketched)
    for shard in shards:
        entries, counts = run(shard.admission.export())
        order = np.argsort(entries)
        np.testing.assert_array_equal(entries[order], SKETCH_ENTRIES)
        np.testing.assert_array_equal(counts[order], SKETCH_ENTRIES + 1)


def _check_slots(got, world):
    for (label, name, index), (keys, rows) in got.items():
        order = np.argsort(keys)
        keys, rows = keys[order], rows[order]
        want_keys = (np.arange(10) if label == "static" else KEYS)
        want_keys = want_keys[np.mod(want_keys, world) == index]
        np.testing.assert_array_equal(keys, want_keys, err_msg=f"{label} {name} shard {index}")
        np.testing.assert_array_equal(rows, SLOT_FACTORS[name] * _table_rows(keys),
                                      err_msg=f"{label} {name} shard {index}")


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

    counted, sketched = _count_tables(sok)
    opt = sok.OptimizerWrapper(tf.keras.optimizers.Adam(0.1))
    checkpoint = tf.train.Checkpoint(static=static, dynamic=dynamic, optimizer=opt,
                                     counted=counted, sketched=sketched)
    if saving:
        put(KEYS)
        _write_slots(opt, static, dynamic)
        _write_counts(counted, sketched)
        opt.set_step(STEP)
        checkpoint.write(args.path)
    else:
        put(np.array([50, 51, 52], np.int64))  # a restore drops them
        # The restore makes the slots (no step was taken).
        checkpoint.read(args.path)
    _check_slots(_slot_contents(opt, static, dynamic), n)
    _check_counts(counted, sketched)
    # Every replica's step counter (each replica counts its own applies).
    assert [int(opt._step_variable(r).numpy()) for r in range(n)] == [STEP] * n
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
        counted, sketched = _count_tables(sok)
        opt = sok.OptimizerWrapper(tf.keras.optimizers.Adam(0.1))
        # A graph's step counters exist before its restore (a train op
        # made them); the restore makes the slots.
        steps = [opt._step_variable(r) for r in range(n)]
        status = tf.train.Checkpoint(static=static, dynamic=dynamic, optimizer=opt,
                                     counted=counted, sketched=sketched).restore(path)
        exports = [sok.export(static), sok.export(dynamic)]
        # A Session must see every replica's device (logical CPUs or GPUs).
        config = None if strategy is None else context.active().session_config()
        with tf.compat.v1.Session(config=config) as sess:
            status.run_restore_ops(sess)
            (skeys, srows), (dkeys, drows) = sess.run(exports)
            _check_slots(_slot_contents(opt, static, dynamic, run=sess.run), n)
            _check_counts(counted, sketched, run=sess.run)
            steps = sess.run(steps)
    assert list(steps) == [STEP] * n, steps
    np.testing.assert_array_equal(srows[np.argsort(skeys)], rows)
    order = np.argsort(dkeys)
    np.testing.assert_array_equal(dkeys[order], KEYS)
    np.testing.assert_array_equal(drows[order], np.stack([KEYS, -KEYS], 1).astype(np.float32))
    print("OK", flush=True)


if __name__ == "__main__":
    main()
