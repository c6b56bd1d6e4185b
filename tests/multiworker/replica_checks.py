"""Checks of the MirroredReplicas engine (tests/test_tf_distribute_comm.py):
one process, a MirroredStrategy over --replicas logical CPUs, each replica a
worker. Every collective against numpy, values and gradients, in a
tf.function (--mode function) or a tf.compat.v1 Session graph (--mode
graph); then what must fail outside strategy.run. Prints "OK" at the end;
any mismatch is an AssertionError.
"""

import argparse
import os

import numpy as np


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--mode", choices=["function", "graph"], required=True)
    args = p.parse_args()
    n = args.replicas
    import tensorflow as tf

    tf.compat.v1.enable_eager_execution()  # TF 1.x starts in graph mode

    from mirrored_cpus import mirrored_strategy_on_cpus

    strategy = mirrored_strategy_on_cpus(n)
    import sok_graph as sok
    from sok_graph.communication.replicas import MirroredReplicas

    with strategy.scope():
        comm = sok.init(comm_tool="tf")
    assert isinstance(comm, MirroredReplicas) and comm.world_size == n, comm.describe()
    assert len(comm.devices) == n and comm.devices[1].endswith("CPU:1"), comm.devices

    # Replica r sends splits[r][w] rows to replica w; rows are tagged by
    # sender, destination and position so a misrouted row shows.
    rng = np.random.default_rng(5)
    splits = rng.integers(0, 4, size=(n, n))
    splits[0, 1] = 0  # an empty chunk
    sent = [np.array([[100 * r + 10 * w + k, -(100 * r + 10 * w + k)]
                      for w in range(n) for k in range(splits[r, w])],
                     np.float32).reshape(-1, 2) for r in range(n)]
    upstream = [rng.normal(size=(splits[:, r].sum(), 2)).astype(np.float32) for r in range(n)]
    gathered_rows = [r + 1 for r in range(n)]  # uneven first dimensions

    def replica_fn():
        r = tf.get_static_value(tf.distribute.get_replica_context().replica_id_in_sync_group)
        assert comm.rank == r
        x = tf.constant(sent[r])
        g = tf.fill([gathered_rows[r], 3], float(r + 1))
        b = tf.constant([[1.0, 2.0]]) * (r + 1)
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([x, g, b])
            received, received_splits = comm.alltoall(x, tf.constant(splits[r]))
            loss_a = tf.reduce_sum(received * upstream[r])
            gathered = comm.allgather(g)
            loss_g = tf.reduce_sum(gathered * tf.range(tf.cast(tf.shape(gathered)[0], tf.float32))[:, None])
            summed = comm.allreduce(b)
            broadcast = comm.broadcast(b, root_rank=n - 1)
            loss_b = tf.reduce_sum(broadcast) * (r + 1)
        return (received, received_splits, tape.gradient(loss_a, x), gathered,
                tape.gradient(loss_g, g), summed, broadcast, tape.gradient(loss_b, b))

    if args.mode == "function":
        out = tf.function(lambda: strategy.run(replica_fn))()
        results = [[t.numpy() for t in strategy.experimental_local_results(o)] for o in out]
    else:
        with tf.Graph().as_default():
            out = strategy.run(replica_fn)
            fetches = [strategy.experimental_local_results(o) for o in out]
            with comm.session() as sess:
                results = sess.run(fetches)

    for r in range(n):
        received, received_splits, grad_x, gathered, grad_g, summed, broadcast, grad_b = [
            res[r] for res in results]
        want = np.concatenate([sent[s][splits[s, :r].sum():splits[s, :r + 1].sum()]
                               for s in range(n)]).reshape(-1, 2)
        np.testing.assert_array_equal(received, want)
        np.testing.assert_array_equal(received_splits, splits[:, r])
        # Each of my rows went to replica w at some position: its gradient
        # is that replica's upstream row.
        want_grad = np.concatenate([
            upstream[w][splits[:r, w].sum():splits[:r + 1, w].sum()] for w in range(n)])
        np.testing.assert_allclose(grad_x.reshape(-1, 2), want_grad.reshape(-1, 2))
        all_g = np.concatenate([np.full((gathered_rows[s], 3), s + 1.0) for s in range(n)])
        np.testing.assert_array_equal(gathered, all_g)
        start = sum(gathered_rows[:r])
        positions = np.arange(start, start + gathered_rows[r], dtype=np.float32)
        # Every replica's loss weights row i by i: the gradient sums n of them.
        np.testing.assert_allclose(grad_g, n * np.repeat(positions[:, None], 3, 1))
        np.testing.assert_allclose(summed, np.array([[1.0, 2.0]]) * sum(range(1, n + 1)))
        np.testing.assert_allclose(broadcast, np.array([[1.0, 2.0]]) * n)
        want_b = np.full((1, 2), sum(range(1, n + 1))) if r == n - 1 else np.zeros((1, 2))
        np.testing.assert_allclose(grad_b, want_b)

    # Outside strategy.run there is no replica: clear errors, not a guess.
    table = sok.Variable(np.arange(20, dtype=np.float32).reshape(10, 2))
    assert len(table.shards) == n and int(table.shards[1].shape[0]) == len(range(1, 10, n))
    for what, call in (
            ("rank", lambda: comm.rank),
            ("sok.lookup_sparse", lambda: sok.lookup_sparse(
                table, tf.ragged.constant([[1]], dtype=tf.int64))),
            ("sok.assign", lambda: sok.assign(table, [0], [[1.0, 1.0]]))):
        try:
            call()
        except RuntimeError as e:
            assert "strategy.run" in str(e), (what, e)
        else:
            raise AssertionError(f"{what} outside strategy.run did not raise")
    # Bad arguments are caught before any exchange, naming what is wrong.
    for call, error, words in (
            (lambda: comm.alltoall(tf.zeros([4, 2]), [2, 2]), ValueError,
             f"splits must have shape [world_size] = [{n}]"),
            (lambda: comm.alltoall(tf.constant(1.0), [1] + [0] * (n - 1)), ValueError,
             "alltoall needs a tensor of rank >= 1"),
            (lambda: comm.alltoall(tf.zeros([4, 2]), [1] * n), tf.errors.InvalidArgumentError,
             "splits must add up"),
            (lambda: comm.broadcast(tf.zeros([2]), root_rank=n), ValueError,
             f"root_rank must be an int in [0, {n})")):
        try:
            call()
        except error as e:
            assert words in str(e), (words, e)
        else:
            raise AssertionError(f"no {error.__name__} ({words})")
    # A strategy whose replicas are not mirrored workers is refused by name.
    from sok_graph import communication

    central = tf.distribute.experimental.CentralStorageStrategy(
        [f"/cpu:{i}" for i in range(n)])
    with central.scope():
        try:
            communication.create("tf")
        except NotImplementedError as e:
            assert "CentralStorageStrategy" in str(e), e
        else:
            raise AssertionError("comm_tool='tf' under CentralStorageStrategy was accepted")
    # Whole-table views work outside: export gives every replica's rows.
    keys, rows = sok.export(table)
    order = np.argsort(keys.numpy())
    np.testing.assert_array_equal(rows.numpy()[order],
                                  np.arange(20, dtype=np.float32).reshape(10, 2))
    # tf.train.Checkpoint saves and restores every shard.
    import tempfile

    dynamic = sok.DynamicVariable(dimension=2, initializer="ones")
    keys = tf.constant([[1, 2, 3, 7]], tf.int64)
    strategy.run(tf.function(lambda: sok.lookup_sparse(dynamic, tf.RaggedTensor.from_tensor(
        keys), combiners="sum")))
    sizes = [int(shard.size[0]) for shard in dynamic.shards]
    assert sizes == [int(np.sum(np.array([1, 2, 3, 7]) % n == r)) for r in range(n)], sizes
    _check_assign_takes_only_the_replicas_own_keys(sok, strategy, n)
    checkpoint = tf.train.Checkpoint(table=table, dynamic=dynamic)
    path = checkpoint.save(os.path.join(tempfile.mkdtemp(), "ckpt"))
    for shard in table.shards:
        shard.assign(tf.zeros_like(shard))
    for shard in dynamic.shards:
        shard.clear()
    checkpoint.restore(path)
    keys_, rows = sok.export(table)
    np.testing.assert_array_equal(rows.numpy()[np.argsort(keys_.numpy())],
                                  np.arange(20, dtype=np.float32).reshape(10, 2))
    assert [int(shard.size[0]) for shard in dynamic.shards] == sizes
    _check_checkpoint_holds_every_shards_optimizer_slots(sok, strategy, table, dynamic, keys)
    _check_keras_weights_file_holds_each_table_once(sok, table, dynamic)
    _check_shards_share_one_seed(sok, strategy, n)
    print("OK", flush=True)


def _check_assign_takes_only_the_replicas_own_keys(sok, strategy, n):
    """sok.assign inside strategy.run writes the replica's shard: a key the
    replica owns goes in; a key another replica owns is refused, naming its
    owner (it went into the wrong shard, where no lookup read it, and a dump
    then held the key twice)."""
    import tensorflow as tf

    table = sok.DynamicVariable(dimension=2, initializer="zeros")

    def own():
        r = tf.distribute.get_replica_context().replica_id_in_sync_group
        key = tf.reshape(tf.cast(r, tf.int64), [1])
        return sok.assign(table, key, tf.fill([1, 2], tf.cast(r, tf.float32) + 1.0))

    strategy.run(tf.function(own))
    keys, rows = (np.asarray(x) for x in sok.export(table))
    np.testing.assert_array_equal(rows[np.argsort(keys)],
                                  np.repeat(np.arange(1, n + 1, dtype=np.float32), 2).reshape(n, 2))
    def foreign():  # the next replica's key, on every replica
        r = tf.distribute.get_replica_context().replica_id_in_sync_group
        key = tf.reshape(tf.math.floormod(tf.cast(r, tf.int64) + 1, n), [1])
        return sok.assign(table, key, [[5.0, 5.0]])

    try:
        strategy.run(tf.function(foreign))
    except tf.errors.InvalidArgumentError as e:
        assert "sok.assign works on the shard" in str(e) and "worker that owns it" in str(e), e
    else:
        raise AssertionError("sok.assign of another replica's key was taken")
    assert sorted(np.asarray(sok.export(table)[0]).tolist()) == list(range(n))
    _check_shard_methods_take_only_the_replicas_own_keys(sok, strategy, n, table)


def _check_shard_methods_take_only_the_replicas_own_keys(sok, strategy, n, table):
    """The table's own reads and writes of a replica's shard (sparse_read,
    scatter_update, import_rows, sok.sparse_read_and_evict) refuse a key
    another replica owns, as sok.assign does: each put the key into the
    wrong shard, where no lookup read it, and a dump then held it twice."""
    import tensorflow as tf

    bounded = sok.DynamicVariable(dimension=2, initializer="zeros", var_type="hybrid",
                                  init_capacity=64, max_capacity=64)
    calls = {
        "DynamicVariable.sparse_read": (table, lambda shard, key: shard.sparse_read(key)),
        "DynamicVariable.scatter_update": (
            table, lambda shard, key: shard.scatter_update(key, [[5.0, 5.0]])),
        "DynamicVariable.import_rows": (
            table, lambda shard, key: shard.import_rows(key, [[5.0, 5.0]])),
        "sok.sparse_read_and_evict": (
            bounded, lambda shard, key: sok.sparse_read_and_evict(bounded, key)[0]),
    }
    for what, (var, call) in calls.items():
        before = [np.asarray(x) for x in sok.export(var)]

        def foreign():  # the next replica's key, on every replica
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            key = tf.reshape(tf.math.floormod(tf.cast(r, tf.int64) + 1, n) + 10 * n, [1])
            return call(var.shard(what), key)

        try:
            strategy.run(tf.function(foreign))
        except tf.errors.InvalidArgumentError as e:
            assert f"{what} works on the shard of table" in str(e), (what, e)
        else:
            raise AssertionError(f"{what} of another replica's key was taken")
        after = [np.asarray(x) for x in sok.export(var)]
        for a, b in zip(before, after):
            np.testing.assert_array_equal(a, b, err_msg=what)


def _check_checkpoint_holds_every_shards_optimizer_slots(sok, strategy, table, dynamic, keys):
    """tf.train.Checkpoint of the tables and a native Adam that trained them
    under OptimizerScope holds every replica shard's slots and step: a
    fresh Adam restored from it has them, before its first step."""
    import tempfile

    import tensorflow as tf
    from sok_graph.optimization.wrapper import wrapper_for

    opt = tf.keras.optimizers.Adam(0.1)
    ids = tf.RaggedTensor.from_tensor(keys)

    def replica_step():
        with tf.GradientTape() as tape:
            a, b = sok.lookup_sparse([table, dynamic], [ids, ids], combiners=["sum", "sum"])
            loss = tf.reduce_sum(a * a) + tf.reduce_sum(b * b)
        grads = tape.gradient(loss, [table, dynamic])
        with sok.OptimizerScope([table, dynamic]):
            opt.apply_gradients(zip(grads, [table, dynamic]))

    step = tf.function(lambda: strategy.run(replica_step))
    step()
    step()

    def state(optimizer):
        wrapper = wrapper_for(optimizer)
        slots = []
        # Outside strategy.run a table's slot is whole, its shards' in .shards.
        for r in range(len(table.shards)):
            slots += [wrapper.get_slot(table, name).shards[r].numpy() for name in ("m", "v")]
        for r in range(len(dynamic.shards)):
            for name in ("m", "v"):
                k, rows = wrapper.get_slot(dynamic, name).shards[r].export()
                slots.append(rows.numpy()[np.argsort(k.numpy())])
        # Each replica's step counter (made here if need be: a restored
        # checkpoint sets it as it is made).
        return slots + [int(wrapper._step_variable(r).numpy()) for r in range(len(table.shards))]

    want = state(opt)
    assert want[-len(table.shards):] == [2] * len(table.shards), want
    assert any(np.abs(s).sum() > 0 for s in want[:-len(table.shards)])
    checkpoint = tf.train.Checkpoint(table=table, dynamic=dynamic, optimizer=opt)
    path = checkpoint.save(os.path.join(tempfile.mkdtemp(), "ckpt"))
    fresh = tf.keras.optimizers.Adam(0.1)
    tf.train.Checkpoint(table=table, dynamic=dynamic, optimizer=fresh).restore(path)
    got = state(fresh)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def _check_keras_weights_file_holds_each_table_once(sok, table, dynamic):
    """A Keras 3 model holding tables sharded over the replicas saves each
    whole, once (not each shard again), and load_weights gives every shard
    its rows back (tests/test_keras_weights.py has the rest)."""
    import tempfile

    import h5py
    import tensorflow as tf
    from sok_graph.compat.keras import keras_saveable_class

    if keras_saveable_class() is object:
        return  # Keras 2 and TF 1.x save tf.Variables themselves
    import keras

    def tables(t):
        keys, rows = (np.asarray(x) for x in sok.export(t))
        return keys[np.argsort(keys)], rows[np.argsort(keys)]

    holder = keras.Model()
    holder.table, holder.dynamic = table, dynamic
    holder.built = True  # nothing to build: it only holds the tables
    want = [tables(table), tables(dynamic)]
    path = os.path.join(tempfile.mkdtemp(), "m.weights.h5")
    holder.save_weights(path)
    with h5py.File(path, "r") as f:
        groups = []
        f.visit(groups.append)
    assert sorted(g for g in groups if g.endswith("/keys")) == \
        ["dynamic/vars/keys", "table/vars/keys"], groups
    for shard in table.shards:
        shard.assign(tf.zeros_like(shard))
    for shard in dynamic.shards:
        shard.clear()
    holder.load_weights(path)
    for got, kept in zip([tables(table), tables(dynamic)], want):
        for g, k in zip(got, kept):
            np.testing.assert_array_equal(g, k)


def _check_shards_share_one_seed(sok, strategy, n):
    """A table's replica shards draw a key's row from one seed, the seed
    the same table gets in a job of one process per worker: a table made
    without one takes the next number of the tables made since sok.init,
    and a table refused for its arguments takes none (it took one)."""
    with strategy.scope():
        sok.init(comm_tool="tf")  # numbers tables from the first again
    try:
        sok.DynamicVariable(dimension=2, var_type="hybrid", max_capacity=1000)
    except ValueError:
        pass  # not a power of two
    else:
        raise AssertionError("max_capacity=1000 of a hybrid table was taken")
    first, second = sok.DynamicVariable(dimension=2), sok.DynamicVariable(dimension=2)
    seeds = [[shard._config["seed"] for shard in t.shards] for t in (first, second)]
    assert seeds[0] == [0] * n, seeds  # the first unseeded table, as in a worker process
    assert len(set(seeds[1])) == 1 and seeds[1][0] != 0, seeds
    assert all("seed" not in shard.config_dict for shard in first.shards)


if __name__ == "__main__":
    main()
