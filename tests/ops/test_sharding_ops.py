"""Bucketing by owner and local-row mapping against numpy."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import ON_GPU
from routing_reference import routed
from sok_graph.ops import library, sharding


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
@pytest.mark.parametrize("non_negative", [False, True], ids=["checked", "unchecked"])
def test_bucketize_distributed(rng, dtype, world_size, non_negative):
    """The same buckets whether the op checks for negative ids (and reads
    that back on a GPU) or the caller vouches there are none."""
    ids = rng.integers(0, 1000, size=257).astype(dtype.as_numpy_dtype)
    ids[:3] = [0, np.iinfo(dtype.as_numpy_dtype).max, 0]
    b = sharding.bucketize_by_owner(tf.constant(ids), world_size, non_negative=non_negative)
    owners = ids.astype(np.int64) % world_size
    order = np.argsort(owners, kind="stable")  # independent stable sort
    np.testing.assert_array_equal(b.permutation.numpy(), order)
    np.testing.assert_array_equal(b.ids.numpy(), ids[order])
    np.testing.assert_array_equal(b.sizes.numpy(), np.bincount(owners, minlength=world_size))
    np.testing.assert_array_equal(b.ids.numpy()[b.inverse_permutation.numpy()], ids)
    rows = tf.gather(b.ids, b.inverse_permutation)  # un-permute by gathering
    np.testing.assert_array_equal(rows.numpy(), ids)


def test_bucketize_fixed_owner(rng):
    ids = rng.integers(0, 50, size=40)
    b = sharding.bucketize_by_owner(tf.constant(ids), 4, fixed_owner=2)
    np.testing.assert_array_equal(b.sizes.numpy(), [0, 0, 40, 0])
    np.testing.assert_array_equal(b.ids.numpy(), ids)
    np.testing.assert_array_equal(b.permutation.numpy(), np.arange(40))


def test_bucketize_empty():
    b = sharding.bucketize_by_owner(tf.zeros([0], tf.int64), 3)
    assert b.ids.shape == (0,)
    np.testing.assert_array_equal(b.sizes.numpy(), [0, 0, 0])


def test_bucketize_rejects_negative_ids():
    with pytest.raises(tf.errors.InvalidArgumentError, match="got -5 at position 1"):
        sharding.bucketize_by_owner(tf.constant([1, -5], tf.int64), 2)


def test_bucketize_rejects_bad_owner():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="fixed_owner"):
        sharding.bucketize_by_owner(tf.constant([1], tf.int64), 2, fixed_owner=2)


def test_bucketize_rejects_bad_world_size():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="world_size"):
        sharding.bucketize_by_owner(tf.constant([1], tf.int64), 0)


@pytest.mark.parametrize("argument,value", [
    ("world_size", 2.7), ("world_size", 2.0), ("world_size", True), ("world_size", "2"),
    ("fixed_owner", 1.9), ("fixed_owner", -5), ("fixed_owner", True),
    ("num_tables", 2.5), ("num_tables", True)])
def test_sharding_counts_that_are_no_ints_are_refused(argument, value):
    """int() cut world_size=2.7 to 2 workers (ids bucketized for 2, no
    error), took True as 1 and fixed_owner=1.9 as owner 1, and read
    fixed_owner=-5 as no fixed owner. Each is a ValueError naming the
    argument and the value, in every op that takes it."""
    ids = tf.constant([1, 2, 3], tf.int64)
    calls = {
        "bucketize_by_owner": lambda **kw: sharding.bucketize_by_owner(
            ids, kw.get("world_size", 2), fixed_owner=kw.get("fixed_owner", -1)),
        "local_rows": lambda **kw: sharding.local_rows(ids, kw.get("world_size", 2)),
        "route_grouped_keys": lambda **kw: sharding.route_grouped_keys(
            ids, tf.constant([0, 1, 0], tf.int64), kw.get("num_tables", 2),
            kw.get("world_size", 2), fixed_owner=kw.get("fixed_owner", -1)),
    }
    takes = {"world_size": calls, "fixed_owner": ["bucketize_by_owner", "route_grouped_keys"],
             "num_tables": ["route_grouped_keys"]}[argument]
    low = {"world_size": 1, "fixed_owner": -1, "num_tables": 1}[argument]
    for op in takes:
        with pytest.raises(ValueError) as refused:
            calls[op](**{argument: value})
        assert str(refused.value) == f"{argument} must be an int >= {low}; got {value!r}", op
    # numpy integers are ints
    np.testing.assert_array_equal(sharding.local_rows(ids, np.int64(2)).numpy(), [0, 1, 1])


@pytest.mark.parametrize("world_size", [1, 2, 5])
def test_local_rows(rng, world_size):
    ids = rng.integers(0, 10**12, size=100)
    np.testing.assert_array_equal(sharding.local_rows(tf.constant(ids), world_size).numpy(),
                                  ids // world_size)


def test_local_rows_of_global_table_layout():
    # 2 workers, 15 rows: worker 0 holds 8 rows (0, 2, ..., 14), worker 1 holds 7
    ids = np.arange(15)
    b = sharding.bucketize_by_owner(tf.constant(ids), 2)
    np.testing.assert_array_equal(b.sizes.numpy(), [8, 7])
    local = sharding.local_rows(b.ids, 2).numpy()
    np.testing.assert_array_equal(local, list(range(8)) + list(range(7)))


def test_local_rows_rejects_negative():
    with pytest.raises(tf.errors.InvalidArgumentError, match="got -1 at position 0"):
        sharding.local_rows(tf.constant([-1, 3], tf.int32), 2)


def _grouped_keys(rng, rows, take):
    """Distinct keys row * T + t over tables of `rows` rows, `take` of them in
    random order, and how many name each table."""
    count = len(rows)
    every = np.concatenate([np.arange(r, dtype=np.int64) * count + t for t, r in enumerate(rows)])
    keys = rng.permutation(every)[:take]
    return keys, np.bincount(keys % count, minlength=count).astype(np.int64)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16, tf.bfloat16, tf.float64])
@pytest.mark.parametrize("dim", [1, 3, 8])
def test_grouped_gather_rows_and_gradient(rng, dtype, dim):
    """Rows as numpy indexes them; each table's gradient the rows of dy for
    its keys, in their order among the keys, as distinct local rows."""
    rows = [7, 1, 12]
    values = [rng.normal(size=(r, dim)).astype(np.float32) for r in rows]
    tables = [tf.Variable(tf.cast(v, dtype)) for v in values]
    keys, sizes = _grouped_keys(rng, rows, 15)
    dy = rng.normal(size=(len(keys), dim)).astype(np.float32)
    with tf.GradientTape() as tape:
        out = sharding.grouped_gather(tables, tf.constant(keys), tf.constant(sizes))
        loss = tf.reduce_sum(tf.cast(out, tf.float32) * dy)
    expect = np.stack([values[k % 3][k // 3] for k in keys])
    np.testing.assert_array_equal(out.numpy().astype(np.float32),
                                  tf.cast(tf.cast(expect, dtype), tf.float32).numpy())
    grads = tape.gradient(loss, tables)
    for t, g in enumerate(grads):
        assert isinstance(g, tf.IndexedSlices)
        mine = keys % 3 == t
        np.testing.assert_array_equal(g.indices.numpy(), keys[mine] // 3)
        np.testing.assert_array_equal(g.values.numpy().astype(np.float32),
                                      tf.cast(tf.cast(dy[mine], dtype), tf.float32).numpy())
        np.testing.assert_array_equal(g.dense_shape.numpy(), [rows[t], dim])


def test_grouped_gather_of_tensors_in_a_function(rng):
    """Tables given as tensors, in a tf.function (the gradient built in its
    graph, with the tables' shapes known there), against tf.gather."""
    rows = [4, 9]
    values = [tf.constant(rng.normal(size=(r, 2)).astype(np.float32)) for r in rows]
    keys, sizes = _grouped_keys(rng, rows, 13)

    @tf.function
    def run(keys, sizes):
        with tf.GradientTape() as tape:
            tape.watch(values)
            out = sharding.grouped_gather(values, keys, sizes)
            loss = tf.reduce_sum(out * out)
        return out, tape.gradient(loss, values)

    out, grads = run(tf.constant(keys), tf.constant(sizes))
    for t in range(2):
        mine = keys % 2 == t
        np.testing.assert_array_equal(out.numpy()[mine], tf.gather(values[t], keys[mine] // 2))
        dense = tf.math.unsorted_segment_sum(grads[t].values, grads[t].indices, rows[t])
        reference = np.zeros((rows[t], 2), np.float32)
        reference[keys[mine] // 2] = 2 * values[t].numpy()[keys[mine] // 2]
        np.testing.assert_allclose(dense.numpy(), reference, rtol=1e-6)


def test_grouped_gather_empty_and_single_table(rng):
    table = tf.Variable(rng.normal(size=(5, 4)).astype(np.float32))
    out = sharding.grouped_gather([table], tf.zeros([0], tf.int64), tf.constant([0], tf.int64))
    assert out.shape == (0, 4)
    out = sharding.grouped_gather([table], tf.constant([4, 0], tf.int64),
                                  tf.constant([2], tf.int64))
    np.testing.assert_array_equal(out.numpy(), table.numpy()[[4, 0]])


def test_grouped_gather_rejects_bad_input():
    # Key 5 is row 2 of table 1, which has 2 rows. (A CPU kernel check; on a
    # GPU the op reads a zero row: its keys come checked from the senders.
    # The op runs where its variables are.)
    with tf.device("/cpu:0"):
        a = tf.Variable(tf.zeros([3, 2]))
        b = tf.Variable(tf.zeros([2, 2]))
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"keys\[1\]=5 .*'b'.* 2 rows"):
            sharding.grouped_gather([a, b], tf.constant([0, 5], tf.int64),
                                    tf.constant([1, 1], tf.int64), table_names=["a", "b"])
    for device in ("/cpu:0", None):  # the size and dimension checks on every device
        with tf.device(device):
            a = tf.Variable(tf.zeros([3, 2]))
            b = tf.Variable(tf.zeros([2, 2]))
            wide = tf.Variable(tf.zeros([2, 3]))
            # Sizes that do not add up to the keys: the CPU forward reports
            # them; the GPU's does not read them (they stay on the device),
            # the gradient, which needs them, reports them on every device.
            with pytest.raises(tf.errors.InvalidArgumentError, match="table_sizes must add up"):
                with tf.GradientTape() as tape:
                    rows = sharding.grouped_gather([a, b], tf.constant([0, 1], tf.int64),
                                                   tf.constant([1, 0], tf.int64))
                    loss = tf.reduce_sum(rows)
                tape.gradient(loss, [a, b])
            with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                               match="one dimension"):
                sharding.grouped_gather([a, wide], tf.constant([0], tf.int64),
                                        tf.constant([1, 0], tf.int64))


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_grouped_gather_of_padded_keys(rng, mode):
    """Keys ending in padding (-1s, as util.unique_padded leaves them) and
    sizes that count only the keys before it: padding, and in the forward
    any key that names no row, reads a zero row with no error on every
    device; each table's gradient has the rows of its real keys only."""
    rows = [5, 3, 8]
    values = [rng.normal(size=(r, 4)).astype(np.float32) for r in rows]
    tables = [tf.Variable(v) for v in values]
    keys, sizes = _grouped_keys(rng, rows, 11)
    bad = np.array([3 * 8 + 1, -7], np.int64)  # row 8 of table 1 (3 rows); a negative key
    out = sharding.grouped_gather(tables, tf.constant(np.concatenate([keys, bad])),
                                  tf.constant(sizes), padded=True)
    np.testing.assert_array_equal(out.numpy()[len(keys):], np.zeros((2, 4)))
    padded = np.concatenate([keys, np.full(5, -1)]).astype(np.int64)
    dy = rng.normal(size=(len(padded), 4)).astype(np.float32)

    def run(keys, sizes):
        with tf.GradientTape() as tape:
            out = sharding.grouped_gather(tables, keys, sizes, distinct=True, padded=True)
            loss = tf.reduce_sum(out * dy)
        return out, tape.gradient(loss, tables)

    if mode == "function":
        run = tf.function(run, input_signature=[tf.TensorSpec([None], tf.int64),
                                                tf.TensorSpec([3], tf.int64)])
    out, grads = run(tf.constant(padded), tf.constant(sizes))
    expect = np.zeros((len(padded), 4), np.float32)
    expect[:len(keys)] = [values[k % 3][k // 3] for k in keys]
    np.testing.assert_array_equal(out.numpy(), expect)
    for t, g in enumerate(grads):
        mine = keys % 3 == t
        np.testing.assert_array_equal(g.indices.numpy(), keys[mine] // 3)
        np.testing.assert_array_equal(g.values.numpy(), dy[:len(keys)][mine])


def test_grouped_gather_with_an_empty_table_in_a_session(rng):
    """TF1 graph mode: tf.gradients through the op, a table of no rows in
    the group (no key names it), and the indices marked distinct for the
    sparse optimizers only when the caller says the keys are."""
    from sok_graph.ops import util as util_ops

    values = [rng.normal(size=(r, 3)).astype(np.float32) for r in (4, 0, 2)]
    keys = np.array([6, 0, 2, 5], np.int64)  # rows 2, 0 of table 0; rows 0, 1 of table 2
    sizes = np.array([2, 0, 2], np.int64)
    with tf.Graph().as_default():
        tables = [tf.compat.v1.Variable(v, use_resource=True) for v in values]
        out = {}
        for distinct in (False, True):
            rows = sharding.grouped_gather(tables, tf.constant(keys), tf.constant(sizes),
                                           distinct=distinct)
            grads = tf.gradients(tf.reduce_sum(rows * rows), tables)
            out[distinct] = (rows, grads)
            assert [util_ops.marked_distinct(g.indices) for g in grads] == [distinct] * 3
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            rows, grads = sess.run(out[True])
    expect = np.stack([values[0][2], values[0][0], values[2][0], values[2][1]])
    np.testing.assert_array_equal(rows, expect)
    np.testing.assert_array_equal(grads[0].indices, [2, 0])
    np.testing.assert_allclose(grads[0].values, 2 * expect[:2], rtol=1e-6)
    assert grads[1].indices.shape == (0,) and grads[1].values.shape == (0, 3)
    np.testing.assert_array_equal(grads[1].dense_shape, [0, 3])
    np.testing.assert_array_equal(grads[2].indices, [0, 1])


def test_grouped_gather_grad_with_keys_not_grouped_by_table():
    """A permutation or table_sizes that do not group the keys by table: the
    CPU kernel reports it; the GPU kernel (which cannot without waiting for
    the device) gives those positions the index -1 and a zero row, which
    every scatter drops."""
    op = library.load().sok_grouped_gather_grad
    keys = tf.constant([0, 1, 3], tf.int64)  # tables 0, 1, 1 of two
    grads = tf.ones([3, 2])
    wrong = dict(keys=keys, grads=grads, permutation=tf.constant([0, 1, 2], tf.int64),
                 table_sizes=tf.constant([2, 1], tf.int64), num_tables=2)
    with tf.device("/cpu:0"):
        with pytest.raises(tf.errors.InvalidArgumentError, match="permutation must group"):
            op(**wrong)
    if ON_GPU:
        with tf.device("/gpu:0"):
            indices, values = op(**wrong)
        np.testing.assert_array_equal(indices[0].numpy(), [0, -1])
        np.testing.assert_array_equal(values[0].numpy(), [[1, 1], [0, 0]])
        np.testing.assert_array_equal(indices[1].numpy(), [1])


@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
@pytest.mark.parametrize("count", [1, 3, 26])
@pytest.mark.parametrize("fixed_owner", [-1, 0], ids=["distributed", "localized"])
def test_route_grouped_keys(rng, world_size, count, fixed_owner):
    """Keys deduplicated, grouped by owner and written as the owner reads
    them, against numpy; ids repeat, and some are bad (negative, or so large
    that id * count wraps), as a lookup's unchecked ids may be."""
    n = 2000
    ids = rng.integers(0, 300, size=n)
    ids[:4] = [-1, -7, np.iinfo(np.int64).max, np.iinfo(np.int64).min + 3]
    tables = rng.integers(0, count, size=n)
    route = sharding.route_grouped_keys(tf.constant(ids), tf.constant(tables), count,
                                        world_size, fixed_owner)
    sent, sizes, slots = routed(ids, tables, count, world_size, fixed_owner)
    np.testing.assert_array_equal(route.keys.numpy(), sent)
    np.testing.assert_array_equal(route.sizes.numpy(), sizes)
    np.testing.assert_array_equal(route.slots.numpy(), slots)


def test_route_grouped_keys_in_a_graph_and_empty(rng):
    ids = rng.integers(0, 50, size=300)
    tables = rng.integers(0, 4, size=300)

    @tf.function
    def route(i, t):
        return sharding.route_grouped_keys(i, t, 4, 3)

    out = route(tf.constant(ids), tf.constant(tables))
    for got, want in zip(out, routed(ids, tables, 4, 3)):
        np.testing.assert_array_equal(got.numpy(), want)
    empty = route(tf.zeros([0], tf.int64), tf.zeros([0], tf.int64))
    assert empty.keys.shape == (0,) and empty.slots.shape == (0,)
    np.testing.assert_array_equal(empty.sizes.numpy(), [0, 0, 0])


def test_route_grouped_keys_rejects_bad_input():
    ids = tf.constant([1, 2], tf.int64)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="one length|must be equal"):
        sharding.route_grouped_keys(ids, tf.constant([0], tf.int64), 2, 2)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="fixed_owner"):
        sharding.route_grouped_keys(ids, tf.constant([0, 1], tf.int64), 2, 2, fixed_owner=2)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="world_size"):
        sharding.route_grouped_keys(ids, tf.constant([0, 1], tf.int64), 2, 0)
    with tf.device("/cpu:0"):  # the GPU kernel reads a table modulo num_tables
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"tables must be in \[0, num_tables=2\); got 2 at position 1"):
            sharding.route_grouped_keys(ids, tf.constant([0, 2], tf.int64), 2, 2)
