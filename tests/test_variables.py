"""assign / export / filter_variables / sparse_read_and_evict / all2all_dense_embedding."""

import numpy as np
import pytest
import tensorflow as tf
from conftest import run_in_graph

import sok_graph as sok


def test_assign_and_export_static(rng):
    v = sok.Variable(np.zeros((24, 3), np.float32))
    values = rng.standard_normal((4, 3)).astype(np.float32)
    sok.assign(v, tf.constant([0, 5, 23, 7], tf.int64), values)
    idx, rows = sok.export(v)
    assert idx.numpy().tolist() == list(range(24))
    np.testing.assert_array_equal(rows.numpy()[[0, 5, 23, 7]], values)
    assert np.count_nonzero(rows.numpy()) == np.count_nonzero(values)
    with pytest.raises(ValueError, match=r"must be in \[0, 24\).*got 24 at position 1"):
        sok.assign(v, tf.constant([1, 24], tf.int64), values[:2])


def test_assign_and_export_dynamic(rng):
    v = sok.DynamicVariable(3)
    values = rng.standard_normal((3, 3)).astype(np.float32)
    sok.assign(v, tf.constant([10, 1 << 40, -3], tf.int64), values)
    keys, rows = sok.export(v)
    got = dict(zip(keys.numpy().tolist(), rows.numpy()))
    assert set(got) == {10, 1 << 40, -3}
    np.testing.assert_array_equal(got[1 << 40], values[1])


def test_tables_read_in_chunks_cover_every_row_once(rng):
    """The table protocol's chunked read (export_chunk) against the table's
    own contents: chunks of 5 cover every row once, in order for a static
    table; a static table has no write times to filter by."""
    init = rng.standard_normal((12, 3)).astype(np.float32)
    static = sok.Variable(init)
    dynamic = sok.DynamicVariable(3)
    keys = np.array([7, 1 << 40, -3, 11, 2, 9, 100], np.int64)
    values = rng.standard_normal((len(keys), 3)).astype(np.float32)
    sok.assign(dynamic, tf.constant(keys), values)
    for table, count, want in ((static, 12, dict(enumerate(init))),
                               (dynamic, len(keys), dict(zip(keys.tolist(), values)))):
        assert int(table.row_count()) == count
        got, offset = {}, 0
        while offset < count:
            k, r, offset = table.export_chunk(offset, 5)
            offset = int(offset)
            for key, row in zip(k.numpy().tolist(), r.numpy()):
                assert key not in got
                got[key] = row
        assert sorted(got) == sorted(want)
        for key, row in want.items():
            np.testing.assert_array_equal(got[key], row)
    with pytest.raises(ValueError, match="updated_after applies to sok.DynamicVariable only"):
        static.export_chunk(0, 5, updated_after=5)


def test_filter_variables():
    s, d, t = sok.Variable(np.zeros((2, 2), np.float32)), sok.DynamicVariable(2), tf.Variable(1.0)
    sok_vars, others = sok.filter_variables([t, s, d])
    assert sok_vars == [s, d] and others == [t]
    with pytest.raises(TypeError, match="sok.Variable or sok.DynamicVariable"):
        sok.export(t)


def test_sparse_read_and_evict():
    """The read inserts missing keys as a lookup does and hands back the
    least recently used entries it evicted to make room, with their rows."""
    v = sok.DynamicVariable(2, var_type="hybrid", init_capacity=4, max_capacity=4,
                            initializer=1.5)
    assigned = np.arange(8, dtype=np.float32).reshape(4, 2)
    sok.assign(v, tf.constant([1, 2, 3, 4], tf.int64), assigned)
    v.sparse_read(tf.constant([1], tf.int64))  # 1 and 2 are used after 3 and 4
    v.sparse_read(tf.constant([2], tf.int64))
    rows, keys, evicted = sok.sparse_read_and_evict(v, tf.constant([[5, 2], [6, 5]], tf.int64))
    np.testing.assert_array_equal(rows.numpy(), [[[1.5, 1.5], assigned[1]],
                                                 [[1.5, 1.5], [1.5, 1.5]]])
    order = np.argsort(keys.numpy())
    np.testing.assert_array_equal(keys.numpy()[order], [3, 4])
    np.testing.assert_array_equal(evicted.numpy()[order], assigned[[2, 3]])
    assert sorted(sok.export(v)[0].numpy().tolist()) == [1, 2, 5, 6]
    # Nothing to evict: empty, typed outputs.
    rows, keys, evicted = sok.sparse_read_and_evict(v, tf.constant([1, 2], tf.int64))
    assert keys.shape == [0] and keys.dtype == tf.int64 and evicted.shape == [0, 2]
    with pytest.raises(ValueError, match="bounded table"):
        sok.sparse_read_and_evict(sok.DynamicVariable(2), tf.constant([1], tf.int64))


@pytest.mark.parametrize("shape", [[5], [2, 3], [2, 2, 2], [0, 4]])
def test_all2all_dense_embedding_matches_embedding_lookup(rng, shape):
    table = rng.standard_normal((10, 4)).astype(np.float32)
    ids = rng.integers(0, 10, size=shape)
    for param in (sok.Variable(table), tf.constant(table)):
        got = sok.all2all_dense_embedding(param, tf.constant(ids, tf.int64))
        want = tf.nn.embedding_lookup(table, ids)
        assert got.shape == want.shape
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_all2all_dense_embedding_dynamic_and_gradient(rng):
    v = sok.DynamicVariable(3, initializer="zeros")
    sok.assign(v, tf.range(6, dtype=tf.int64), tf.reshape(tf.range(18, dtype=tf.float32), [6, 3]))
    ids = tf.constant([[5, 1], [1, 1]], tf.int64)
    with tf.GradientTape() as tape:
        out = sok.all2all_dense_embedding(v, ids)
        loss = tf.reduce_sum(out)
    assert out.shape == (2, 2, 3)
    np.testing.assert_array_equal(out.numpy()[0, 0], [15, 16, 17])
    g = tape.gradient(loss, v)
    got = dict(zip(g.indices.numpy().tolist(), g.values.numpy()[:, 0]))
    assert got == {5: 1.0, 1: 3.0}


def test_all2all_dense_embedding_in_graph(rng):
    table = rng.standard_normal((6, 2)).astype(np.float32)
    out = run_in_graph(lambda: sok.all2all_dense_embedding(sok.Variable(table),
                                                           tf.constant([[3, 0]], tf.int64)))
    # An index array: numpy < 1.23 reads a nested list index as a tuple.
    np.testing.assert_array_equal(out, table[np.array([[3, 0]])])
