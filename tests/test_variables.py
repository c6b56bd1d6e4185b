"""assign / export / the table protocol / filter_variables /
sparse_read_and_evict / all2all_dense_embedding."""

import contextlib
import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import ON_GPU, run_in_graph

import sok_graph as sok
from sok_graph.ops import dynamic as dynamic_ops


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


def test_a_value_that_shape_does_not_allow_is_refused():
    """As tf.Variable refuses an initial_value its shape= does not allow;
    the table took the value's size before, silently. (The sharded form,
    each worker's rows from the initializer, is checked with 2 and 3
    workers in multiworker/sharded_lookup_edges.py.)"""
    with pytest.raises(ValueError, match=r"shape is \[4, 3\]; initial_value has shape \[2, 3\]"):
        sok.Variable(np.ones((2, 3), np.float32), shape=[4, 3])
    for wrong in ([2, 3], [5, 7]):
        with pytest.raises(ValueError, match=r"shape is \[4, 3\]; the initializer's value has "
                                             r"shape \[%d, %d\]" % tuple(wrong)):
            sok.Variable(shape=[4, 3],
                         initializer=lambda shape, dtype=None, wrong=wrong: tf.zeros(wrong))
    # What shape= allows is taken as before.
    assert tuple(sok.Variable(np.ones((2, 3), np.float32), shape=[None, 3]).shape) == (2, 3)
    np.testing.assert_array_equal(sok.Variable(np.full((2, 3), 2.0, np.float32),
                                               shape=[2, 3]).numpy(), np.full((2, 3), 2.0))
    np.testing.assert_array_equal(sok.Variable(shape=[4, 3], initializer="zeros").numpy(),
                                  np.zeros((4, 3)))


def test_bfloat16_rows_from_numpy_are_taken():
    """numpy files bfloat16 under kind "V": sok.assign and import_rows
    refused a bfloat16 table's own rows as "not floats". Rows beyond
    bfloat16's range are still refused."""
    bf = tf.bfloat16.as_numpy_dtype
    rows = np.array([[1.5, 2.0], [3.0, -1.0]], np.float32)
    table = sok.Variable(np.zeros((3, 2), bf))
    sok.assign(table, [2], rows[:1].astype(bf))
    table.import_rows(tf.constant([0, 1], tf.int64), rows.astype(bf))
    np.testing.assert_array_equal(table.numpy().astype(np.float32),
                                  [[1.5, 2.0], [3.0, -1.0], [1.5, 2.0]])
    wide = sok.Variable(np.zeros((2, 2), np.float32))  # converted into float32
    wide.import_rows(tf.constant([0, 1], tf.int64), rows.astype(bf))
    np.testing.assert_array_equal(wide.numpy(), rows)
    with pytest.raises(ValueError, match=r"beyond bfloat16's largest finite value"):
        sok.assign(table, [0], np.full((1, 2), 1e39))
    np.testing.assert_array_equal(table.numpy()[0].astype(np.float32), [1.5, 2.0])


def test_assign_refuses_what_it_would_write_wrongly():
    """A scalar index failed with Python's IndexError; float64 numbers beyond
    float32's range were written as inf; a float64 tensor failed with
    TensorFlow's message naming no argument. Each is now an error naming
    the argument, and the table is unchanged."""
    static = sok.Variable(np.ones((5, 2), np.float32))
    dynamic = sok.DynamicVariable(2)
    for var in (static, dynamic):
        with pytest.raises(ValueError, match=r"indices for sok.assign must be a vector.*shape \(\)"):
            sok.assign(var, tf.constant(3, tf.int64), [[1.0, 1.0]])
        with pytest.raises(ValueError, match=r"values for sok.assign holds 1e\+39 at \[0, 0\], "
                                             r"beyond float32's largest finite value"):
            sok.assign(var, tf.constant([1], tf.int64), np.array([[1e39, 1.0]]))
        with pytest.raises(TypeError, match="values for sok.assign must be float32.*float64"):
            sok.assign(var, tf.constant([1], tf.int64), tf.constant([[1.0, 1.0]], tf.float64))
    np.testing.assert_array_equal(static.numpy(), np.ones((5, 2), np.float32))
    assert int(dynamic.row_count()) == 0
    # Integers are numbers too: written as floats.
    sok.assign(static, [4], [[2, 3]])
    np.testing.assert_array_equal(static.numpy()[4], [2.0, 3.0])


@pytest.mark.parametrize("mode", ["function", "graph"])
def test_assign_checks_row_numbers_when_the_graph_runs(mode):
    """The range check of a static table's row numbers was eager only: a
    tf.function or a Session raised TensorFlow's scatter error, naming
    neither sok.assign nor the variable (and a GPU's scatter drops
    out-of-range writes). Compared with a numpy copy of the rows."""
    init = np.arange(10, dtype=np.float32).reshape(5, 2)
    message = r"indices for sok.assign must be in \[0, 5\) \(the rows of the variable\); got\] \[2 7\]"
    if mode == "function":
        var = sok.Variable(init)
        write = tf.function(lambda i, x: sok.assign(var, i, x))
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            write(tf.constant([2, 7]), tf.ones([2, 2]))
        np.testing.assert_array_equal(var.numpy(), init)
        write(tf.constant([2, 4]), tf.ones([2, 2]))
        want = init.copy()
        want[[2, 4]] = 1.0
        np.testing.assert_array_equal(var.numpy(), want)
        return
    with tf.Graph().as_default():
        var = sok.Variable(init)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        op = sok.assign(var, ids, tf.ones([2, 2]))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            with pytest.raises(tf.errors.InvalidArgumentError, match=message):
                sess.run(op, {ids: [2, 7]})
            np.testing.assert_array_equal(sess.run(var), init)
            sess.run(op, {ids: [2, 4]})
            want = init.copy()
            want[[2, 4]] = 1.0
            np.testing.assert_array_equal(sess.run(var), want)


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


def _contents(table):
    """{key: row} of everything the table holds, through export_chunk."""
    keys, rows, _ = table.export_chunk(0, 1 << 20)
    return dict(zip(keys.numpy().tolist(), rows.numpy()))


def _assert_holds(table, want):
    got = _contents(table)
    assert sorted(got) == sorted(want)
    for key, row in want.items():
        np.testing.assert_array_equal(got[key], row, err_msg=f"key {key}")


def test_tables_answer_the_load_protocol_as_numpy_does(rng):
    """What dump, load and the Saver ask of a table (sok_graph/tables/
    __init__.py), on a static and a dynamic table, against a numpy copy of
    what each should hold: replace_rows leaves exactly the rows given,
    import_rows writes some and keeps the others, read_all and export_chunk
    agree, slots are replaced and read by the same keys."""
    dim = 3
    static = sok.Variable(rng.standard_normal((6, dim)).astype(np.float32))
    dynamic = sok.DynamicVariable(dim, key_type=tf.int32)
    sok.assign(dynamic, tf.constant([1, 2], tf.int32), np.ones((2, dim), np.float32))
    bounded = sok.DynamicVariable(dim, var_type="hybrid", init_capacity=16, max_capacity=16)
    assert (static.key_dtype, dynamic.key_dtype) == (tf.int64, tf.int32)
    assert (static.key_metadata, dynamic.key_metadata) == ((), ("timestamps", "frequencies"))
    assert (static.fixed_rows, dynamic.fixed_rows) == (6, None)
    # An unbounded table holds at most what its device's table can: the
    # GPU table's own limit is 2^29 rows (SOK_GPU_TABLE_MAX_UNBOUNDED_ROWS in
    # tf_ops/dynamic/kernels/dynamic_table_launcher.h).
    unbounded = (1 << 29) if ON_GPU else dynamic_ops.MAX_ROWS
    assert [int(t.row_limit()) for t in (static, dynamic, bounded)] == [6, unbounded, 16]
    assert static.admission is None and dynamic.admission is None
    assert not static.replace_can_fail and dynamic.replace_can_fail
    # Every row of the static table; keys the dynamic table did not hold,
    # and not the ones it held.
    for table, keys in ((static, np.arange(6)), (dynamic, np.array([-7, 5, 1 << 20]))):
        rows = rng.standard_normal((len(keys), dim)).astype(np.float32)
        typed = tf.constant(keys.astype(table.key_dtype.as_numpy_dtype))
        table.replace_rows(typed, rows)
        want = dict(zip(keys.tolist(), rows))
        _assert_holds(table, want)
        got_keys, got_rows, metadata = table.read_all()
        assert got_keys.dtype == table.key_dtype
        assert sorted(metadata) == sorted(table.key_metadata)
        assert all(m.shape[0] == len(keys) for m in metadata.values())
        assert dict(zip(got_keys.numpy().tolist(), got_rows.numpy().tolist())) == \
            {k: r.tolist() for k, r in want.items()}
        # Some rows written, the others kept (a dynamic table gains key 9).
        some = np.array([5, 1]) if table is static else np.array([5, 9])
        written = rng.standard_normal((2, dim)).astype(np.float32)
        table.import_rows(tf.constant(some.astype(table.key_dtype.as_numpy_dtype)), written)
        want.update(zip(some.tolist(), written))
        _assert_holds(table, want)
        # A slot, replaced by the table's keys and read back by them; a
        # dynamic slot gives initial_value for a key it does not hold.
        slot = table.make_slot("accumulator", 0.5)
        slot_rows = rng.standard_normal((len(keys), dim)).astype(np.float32)
        table.replace_slot(slot, typed, slot_rows)
        np.testing.assert_array_equal(table.read_slot(slot, typed, 0.5).numpy(), slot_rows)
        # key_map and global_ids are inverse to each other.
        np.testing.assert_array_equal(table.global_ids(table.key_map(typed)).numpy(), keys)
    missing = tf.constant([123], tf.int32)
    np.testing.assert_array_equal(dynamic.read_slot(slot, missing, 0.5).numpy(),
                                  np.full((1, dim), 0.5, np.float32))
    # A static table can neither drop nor reorder rows.
    before = static.numpy()
    for keys in (np.arange(5), np.arange(6)[::-1], np.arange(1, 7)):
        with pytest.raises(ValueError, match="every one of this shard's 6 global row numbers"):
            static.replace_rows(tf.constant(keys, tf.int64),
                                np.zeros((len(keys), dim), np.float32))
    np.testing.assert_array_equal(static.numpy(), before)


def test_static_shard_numbers_rows_as_its_placement_says(rng, tmp_path):
    """Worker 1 of 2 of a distributed static table of 6 rows holds global
    rows 1, 3, 5 as local rows 0, 1, 2: the protocol's keys are the global
    row numbers, the Saver's the local ones. (The shard is made as worker 1
    would make it, with the placement of that worker set by hand: one
    process runs no second worker.)"""
    whole = rng.standard_normal((6, 2)).astype(np.float32)
    shard = sok.Variable(whole[1::2])
    shard._sok_world_size, shard._sok_rank = 2, 1
    shard._sok_global_shape = tf.TensorShape([6, 2])
    assert shard.placement == (2, 1, -1)
    assert shard.fixed_rows == 6 and int(shard.row_limit()) == 3
    _assert_holds(shard, {1: whole[1], 3: whole[3], 5: whole[5]})
    np.testing.assert_array_equal(shard.key_map(tf.constant([1, 3, 5], tf.int64)), [0, 1, 2])
    np.testing.assert_array_equal(shard.global_ids(tf.constant([0, 1, 2], tf.int64)), [1, 3, 5])
    new = rng.standard_normal((3, 2)).astype(np.float32)
    shard.replace_rows(tf.constant([1, 3, 5], tf.int64), new)
    _assert_holds(shard, {1: new[0], 3: new[1], 5: new[2]})
    with pytest.raises(ValueError, match="every one of this shard's 3 global row numbers"):
        shard.replace_rows(tf.constant([0, 1, 2], tf.int64), new)
    shard.import_rows(tf.constant([5], tf.int64), whole[5:6])
    _assert_holds(shard, {1: new[0], 3: new[1], 5: whole[5]})
    # The Saver writes the shard as a table of its own, in a directory named
    # by the table and the shard: local rows 0..2.
    saver = sok.Saver()
    saver.dump_to_file(shard, tmp_path / "shard")
    from sok_graph.dump_load import read_dump
    name = shard.name[:-2] if shard.name.endswith(":0") else shard.name
    assert os.listdir(tmp_path / "shard") == [f"{name}.shard-1-of-2"]
    saved = read_dump(str(tmp_path / "shard" / f"{name}.shard-1-of-2"), {name: 2})[1][name]
    np.testing.assert_array_equal(saved["keys"], [0, 1, 2])
    shard.replace_rows(tf.constant([1, 3, 5], tf.int64), np.zeros((3, 2), np.float32))
    saver.restore_from_file(shard, tmp_path / "shard")
    _assert_holds(shard, {1: new[0], 3: new[1], 5: whole[5]})


def test_static_replace_rows_checks_keys_known_only_when_run(rng):
    """In a graph, keys fed at run time are checked when the assignment runs,
    and the assignment needs no initialized variable (as a load's does not)."""
    values = rng.standard_normal((4, 2)).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        table = sok.Variable(np.zeros((4, 2), np.float32))
        keys = tf.compat.v1.placeholder(tf.int64, [None])
        replace = table.replace_rows(keys, values)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(replace, {keys: np.arange(4)})
            np.testing.assert_array_equal(sess.run(table.read_value()), values)
            with pytest.raises(tf.errors.InvalidArgumentError, match="every global row number"):
                sess.run(replace, {keys: np.arange(4)[::-1]})


@pytest.mark.parametrize("scope", [None, "outer"])
def test_graph_mode_static_tables_named_with_any_characters(tmp_path, scope):
    """sok.Variable(..., name="表") (or "tablé", "a b", "_x", "a:0") failed
    in a Session's graph with TensorFlow's "not a valid root scope name",
    naming no argument, although it worked eagerly. The table keeps its
    name (inside the name scope, with TensorFlow's suffix where the graph
    has a variable of that name); lookups, an optimizer's update with its
    slots, sok.dump / sok.load, sok.Saver and tf.compat.v1.train.Saver
    keep each table's rows."""
    names = ["表", "tablé", "table", "a b", "_x", "a:0"]
    prefix = scope + "/" if scope else ""
    graph = tf.Graph()
    with graph.as_default():
        with tf.compat.v1.name_scope(scope) if scope else contextlib.nullcontext():
            tables = [sok.Variable(np.full((3, 2), float(i), np.float32), name=n)
                      for i, n in enumerate(names)]
        twin = sok.Variable(np.full((3, 2), 9.0, np.float32), name="表")
        every = tables + [twin]
        ids = [tf.ragged.constant([[1], [2]], tf.int64) for _ in every]
        looked_up = sok.lookup_sparse(every, ids, combiners=["sum"] * len(every))
        grads = [tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1], tf.int64),
                                  tf.constant([3, 2], tf.int64)) for _ in every]
        train = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.1)).apply_gradients(
            list(zip(grads, every)))
        clobber = [t.assign(np.full((3, 2), -1.0, np.float32)) for t in every]
        saver = sok.Saver()
        saver_dumps = [saver.dump_to_file(t, str(tmp_path / "saver")) for t in every]
        saver_restores = [saver.restore_from_file(t, str(tmp_path / "saver")) for t in every]
        tf_saver = tf.compat.v1.train.Saver(every)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            got = sess.run(looked_up)
            for i, rows in enumerate(got):
                value = 9.0 if i == 6 else float(i)  # each table's rows as made
                assert rows.tolist() == [[value, value]] * 2, i
            sess.run(train)
            # Adagrad (TF1): accumulator 0.1 + 1, row 1 moves by 0.1 / sqrt(1.1).
            want = [np.full((3, 2), v, np.float32) for v in list(range(6)) + [9.0]]
            for w in want:
                w[1] -= 0.1 / np.sqrt(1.1)
            sok.dump(str(tmp_path / "dump"), every)
            path = tf_saver.save(sess, str(tmp_path / "tf" / "model"))
            sess.run(saver_dumps)
            for restore in (lambda: sok.load(str(tmp_path / "dump"), every),
                            lambda: tf_saver.restore(sess, path),
                            lambda: sess.run(saver_restores)):
                sess.run(clobber)
                restore()
                for w, got in zip(want, sess.run(every)):
                    np.testing.assert_allclose(got, w, rtol=1e-6)
    assert [t.name for t in tables] == [prefix + n + ":0" for n in names]
    assert twin.name == ("表:0" if scope else "表_1:0")


@pytest.mark.parametrize("name", [5, b"table", ["t"]])
def test_a_static_tables_name_that_is_no_str_is_refused(name):
    with pytest.raises(TypeError, match=r"name must be a str or None; got"):
        sok.Variable(np.zeros((2, 2), np.float32), name=name)


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


def _worker_one_of_two(whole):
    """A distributed static table's shard as worker 1 of 2 makes it (global
    rows 1, 3, 5, ...), its placement set by hand: one process runs no
    second worker."""
    shard = sok.Variable(whole[1::2])
    shard._sok_world_size, shard._sok_rank = 2, 1
    shard._sok_global_shape = tf.TensorShape(whole.shape)
    return shard


def test_static_table_protocol_refuses_bad_arguments(rng):
    """Each wrong argument to a static shard's protocol methods is a Python
    exception naming the method, the argument and the value, and changes no
    row: before these checks rows one column too wide were written across
    the next row, a key of another worker's shard overwrote some row of this
    one (its id // workers), a repeated key kept one of its rows, integer
    rows were cast and float keys taken."""
    whole = rng.standard_normal((6, 2)).astype(np.float32)
    shard = _worker_one_of_two(whole)
    slot = tf.Variable(np.zeros((3, 2), np.float32))
    one = whole[:1]
    cases = [
        (lambda: shard.import_rows(tf.constant([1.0]), one), TypeError,
         r"import_rows takes keys of int32 or int64 .*got keys of dtype float32"),
        (lambda: shard.import_rows(tf.constant([6], tf.int64), one), ValueError,
         r"import_rows takes keys in \[0, 6\) .*got key 6"),
        (lambda: shard.import_rows(tf.constant([-1], tf.int32), one), ValueError,
         r"import_rows takes keys in \[0, 6\) .*got key -1"),
        (lambda: shard.import_rows(tf.constant([0], tf.int64), one), ValueError,
         r"keys of rows this shard holds \(worker 1 of 2\); got key 0, which worker 0 holds"),
        (lambda: shard.import_rows(tf.constant([3, 1, 3], tf.int64), whole[:3]), ValueError,
         r"import_rows takes each key at most once; got key 3 2 times"),
        (lambda: shard.import_rows(tf.constant([1, 3], tf.int64),
                                   np.ones((2, 3), np.float32)), ValueError,
         r"import_rows takes rows of shape \[2, 2\] .*got rows of shape \(2, 3\)"),
        (lambda: shard.import_rows(tf.constant([1, 3], tf.int64), one), ValueError,
         r"import_rows takes rows of shape \[2, 2\] .*got rows of shape \(1, 2\)"),
        (lambda: shard.import_rows(tf.constant([1], tf.int64), whole[0]), ValueError,
         r"import_rows takes rows of shape \[1, 2\] .*got rows of shape \(2,\)"),
        (lambda: shard.import_rows(tf.constant([1], tf.int64), np.ones((1, 2), np.int64)),
         TypeError, r"import_rows takes rows of floats .*got rows of dtype int64"),
        (lambda: shard.import_rows(tf.constant([1], tf.int64), tf.ones([1, 2], tf.float64)),
         TypeError, r"rows of the table's dtype float32; got rows of dtype float64"),
        (lambda: shard.replace_rows(tf.constant([1, 3, 5], tf.int64),
                                    np.full((3, 2), 1e300)), ValueError,
         r"replace_rows takes rows of the table's dtype float32; got 1e\+300 at \[0, 0\], "
         r"beyond float32's largest finite value"),
        (lambda: shard.replace_rows(tf.constant([1.0, 3.0, 5.0]), whole[:3]), TypeError,
         r"replace_rows takes keys of int32 or int64 .*float32"),
        (lambda: shard.replace_rows(tf.constant([1, 3, 5], tf.int64), whole[:3, :1]),
         ValueError, r"replace_rows takes rows of shape \[3, 2\] .*got rows of shape \(3, 1\)"),
        (lambda: shard.replace_rows(tf.zeros([0], tf.int64), whole[:0]), ValueError,
         r"every one of this shard's 3 global row numbers"),
        (lambda: shard.replace_slot(slot, tf.constant([1, 3, 5], tf.int64), whole[:4]),
         ValueError, r"replace_slot takes rows of shape \[3, 2\] .*got rows of shape \(4, 2\)"),
        (lambda: shard.read_slot(slot, tf.constant([7], tf.int64), 0.0), ValueError,
         r"read_slot takes keys in \[0, 6\) .*got key 7"),
        (lambda: shard.read_slot(slot, tf.constant([2], tf.int64), 0.0), ValueError,
         r"read_slot takes keys of rows this shard holds .*got key 2, which worker 0 holds"),
        (lambda: shard.global_ids(tf.constant([0.0])), TypeError,
         r"global_ids takes int32 or int64 local row numbers; got ids of dtype float32"),
    ]
    for call, error, words in cases:
        with pytest.raises(error, match=words):
            call()
        _assert_holds(shard, {1: whole[1], 3: whole[3], 5: whole[5]})
        np.testing.assert_array_equal(slot.numpy(), np.zeros((3, 2)))
    # No keys write nothing; int32 keys are global row numbers too.
    shard.import_rows(tf.zeros([0], tf.int64), np.zeros((0, 2), np.float32))
    shard.import_rows(tf.constant([5], tf.int32), whole[:1])
    _assert_holds(shard, {1: whole[1], 3: whole[3], 5: whole[0]})


def test_static_import_rows_checks_keys_known_only_when_run(rng):
    """Keys and rows fed at run time: a key of another shard, a repeated key
    or rows of another count fail when the import runs, naming the table
    and what it takes, and write nothing."""
    whole = rng.standard_normal((6, 2)).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        shard = _worker_one_of_two(whole)
        keys = tf.compat.v1.placeholder(tf.int64, [None])
        rows = tf.compat.v1.placeholder(tf.float32, [None, 2])
        imported = shard.import_rows(keys, rows)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(shard.initializer)
            for k, r, words in (
                    ([1, 2], whole[:2], r"takes keys in \[0, 6\) that this shard \(worker 1 of "
                                        r"2\) holds; got\] \[2\]"),
                    ([7], whole[:1], r"that this shard \(worker 1 of 2\) holds; got\] \[7\]"),
                    ([5, 5], whole[:2], "takes each key at most once"),
                    ([1, 3], whole[:1], r"takes rows \[len\(keys\), 2\]")):
                with pytest.raises(tf.errors.InvalidArgumentError, match=words):
                    sess.run(imported, {keys: k, rows: r})
                np.testing.assert_array_equal(sess.run(shard.read_value()), whole[1::2])
            sess.run(imported, {keys: [5, 1], rows: whole[:2]})
            np.testing.assert_array_equal(sess.run(shard.read_value()),
                                          [whole[1], whole[3], whole[0]])


def test_dynamic_table_import_refuses_bad_arguments():
    """A dynamic table's import_rows and replace_rows (and so replace_slot)
    refuse rows of another shape or of integers, values the table's dtype
    makes infinite, float write times (truncated), and replace_rows a
    repeated key (which it settled by keeping
    the last row without a word: the table is to hold exactly the keys
    given), naming the table, the argument and the value, and leave the
    table as it was. import_rows keeps the last row of a repeated key, as
    scatter_update does."""
    table = sok.DynamicVariable(2, name="dyn_bad_args")
    table.import_rows(tf.constant([4, 9], tf.int64), np.array([[1, 1], [2, 2]], np.float32))
    keys = tf.constant([5, 6], tf.int64)
    rows = np.ones((2, 2), np.float32)
    for method in ("import_rows", "replace_rows"):
        call = getattr(table, method)
        for args, kwargs, error, words in (
                ((keys, np.ones((2, 3), np.float32)), {}, ValueError,
                 rf"'dyn_bad_args': {method}'s rows must be \[2, 2\] .*got rows of shape "
                 rf"\(2, 3\)"),
                ((keys, np.ones((2, 2), np.int32)), {}, TypeError,
                 f"{method} takes rows of floats .*got rows of dtype int32"),
                ((keys, tf.ones([2, 2], tf.float64)), {}, TypeError,
                 f"{method} takes rows of float32; got rows of dtype float64"),
                # float64 beyond float32's range was written as inf.
                ((keys, np.array([[1.0, 2.0], [3.0, -1e300]])), {}, ValueError,
                 rf"'dyn_bad_args': {method} takes rows of float32; got -1e\+300 at \[1, 1\], "
                 r"beyond float32's largest finite value .*would become inf"),
                ((keys, rows), {"timestamps": np.array([1.5, 2.5])}, TypeError,
                 f"{method} takes timestamps of integers; got timestamps of dtype float64"),
                ((tf.constant([5.0, 6.0]), rows), {}, TypeError, "must be int64")):
            with pytest.raises(error, match=words):
                call(*args, **kwargs)
            _assert_holds(table, {4: [1, 1], 9: [2, 2]})
    with pytest.raises(ValueError, match="'dyn_bad_args': replace_rows takes each key at most "
                                         "once; got key 5 2 times"):
        table.replace_rows(tf.constant([5, 6, 5], tf.int64), np.ones((3, 2), np.float32))
    _assert_holds(table, {4: [1, 1], 9: [2, 2]})
    table.import_rows(tf.constant([4, 4], tf.int64), np.array([[5, 5], [6, 6]], np.float32))
    _assert_holds(table, {4: [6, 6], 9: [2, 2]})
    # Keys fed at run time: a repeated key fails when the import runs.
    graph = tf.Graph()
    with graph.as_default():
        fed = sok.DynamicVariable(2, name="dyn_fed")
        ph = tf.compat.v1.placeholder(tf.int64, [None])
        replace = fed.replace_rows(ph, tf.ones([2, 2]))
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(fed.initializer)
            with pytest.raises(tf.errors.InvalidArgumentError, match="at most once"):
                sess.run(replace, {ph: [3, 3]})
            sess.run(replace, {ph: [3, 4]})


def test_mode_none_is_distributed_as_in_sok():
    """sok.Variable(..., mode=None) (SOK's default spelled out) was a
    TypeError; it is a distributed table, as a DynamicVariable's is."""
    sok.init()
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    table = sok.Variable(rows, mode=None)
    assert isinstance(table, sok.DistributedVariable) and table.mode == "distributed"
    assert sok.DynamicVariable(3, mode=None).mode == "distributed"
    ids = tf.RaggedTensor.from_row_lengths(tf.constant([3, 0, 3], tf.int64), [2, 1])
    np.testing.assert_array_equal(sok.lookup_sparse(table, ids, combiners="sum").numpy(),
                                  [rows[3] + rows[0], rows[3]])


def _sgd(lr):
    if tf.__version__.startswith("1."):
        return tf.compat.v1.train.GradientDescentOptimizer(lr)
    return tf.keras.optimizers.SGD(lr)


def test_tables_made_while_a_step_is_traced_live_outside_its_graph():
    """A Keras layer that makes its tables in build(), first called inside
    a tf.function (as model.fit builds a model): a sok.Variable from shape=
    and an initializer failed ("initial_value ... could not be lifted out of
    a tf.function") and a DynamicVariable's handle was out of scope in every
    later step. They are made outside the traced graph, as tf.Variable and
    add_weight are, and train: two SGD steps against numpy."""
    class Embedding(tf.keras.layers.Layer):
        def build(self, input_shape):
            self.rows = sok.Variable(shape=[6, 2],
                                       initializer=tf.keras.initializers.Constant(0.5))
            self.keyed = sok.DynamicVariable(dimension=2, initializer="ones")

        def call(self, ids):
            a, b = sok.lookup_sparse([self.rows, self.keyed], [ids, ids],
                                     combiners=["sum", "sum"])
            return a + b

    layer = Embedding()
    optimizer = sok.OptimizerWrapper(_sgd(1.0))
    samples = [[1, 2], [2, 5]]
    ids = tf.ragged.constant(samples, tf.int64)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(ids))
        tables = [layer.rows, layer.keyed]
        optimizer.apply_gradients(zip(tape.gradient(loss, tables), tables))
        return loss

    static = np.full((6, 2), 0.5, np.float32)
    dynamic = {k: np.ones(2, np.float32) for k in (1, 2, 5)}
    for _ in range(2):
        want = sum(static[k] + dynamic[k] for s in samples for k in s).sum()
        np.testing.assert_allclose(float(step()), want, rtol=1e-6)
        for k in (k for s in samples for k in s):  # d loss / d row = 1 per use
            static[k] -= 1.0
            dynamic[k] -= 1.0
    np.testing.assert_allclose(sok.export(layer.rows)[1].numpy(), static)
    keys, rows = (x.numpy() for x in sok.export(layer.keyed))
    assert sorted(keys.tolist()) == [1, 2, 5]
    np.testing.assert_allclose(rows[np.argsort(keys)], np.stack([dynamic[k] for k in (1, 2, 5)]))
