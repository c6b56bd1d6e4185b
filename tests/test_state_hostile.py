"""Bad input to sok.assign and sok.filter_variables, and a launcher stall
timeout beyond what Horovod reads: each was taken without a word (a wrong
table, a wrong split of the variables) or killed every worker; each is now
refused by name, or works. References: numpy copies of the rows, the list
given, a sum done in Python."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import sok_graph as sok
from sok_graph import launch
from sok_graph.launch import environment as launch_env

SHAPES_MESSAGE = r"sok.assign takes indices as a vector and values of shape \[len\(indices\), 2\]"

# (indices, values) whose shapes are known only when the graph runs; each
# is wrong for a table of dimension 2.
BAD_SHAPES = {
    "one_column_too_many": ([1], [[7.0, 8.0, 9.0]]),  # spilled into row 2
    "one_column": ([0, 1], [[5.0], [6.0]]),  # set only column 0
    "fewer_rows_than_indices": ([0, 1], [[5.0, 5.0]]),
    "empty_of_another_width": ([], np.zeros((0, 3), np.float32)),
    "matrix_of_indices": ([[1, 2]], [[5.0, 5.0], [6.0, 6.0]]),
    "scalar_value": ([1, 2], 4.0),
}


def _run_assign_in_graph(init, indices, values, ranked=False):
    """sok.assign of placeholders of unknown shapes (with ranked, of shapes
    [None] and [None, None]) in a Session: the error (or None) and the
    table's rows afterwards."""
    with tf.Graph().as_default():
        var = sok.Variable(init)
        ids = tf.compat.v1.placeholder(tf.int64, [None] if ranked else None)
        rows = tf.compat.v1.placeholder(tf.float32, [None, None] if ranked else None)
        op = sok.assign(var, ids, rows)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            error = None
            try:
                sess.run(op, {ids: indices, rows: values})
            except tf.errors.InvalidArgumentError as e:
                error = e
            return error, sess.run(var)


@pytest.mark.parametrize("case", sorted(BAD_SHAPES))
def test_assign_in_a_session_refuses_values_of_the_wrong_shape(case):
    """A static table's sok.assign from placeholders of unknown shapes: the
    shapes are checked when the graph runs, and nothing is written
    (TensorFlow's CPU scatter wrote a row of 3 values into a table of
    dimension 2 as row 1 and the first value of row 2, and a one-column row
    into column 0 only, without an error)."""
    init = np.arange(8, dtype=np.float32).reshape(4, 2)
    indices, values = BAD_SHAPES[case]
    error, rows = _run_assign_in_graph(init, indices, values)
    assert error is not None, f"taken: the table became {rows.tolist()}"
    assert "sok.assign takes indices as a vector" in error.message
    np.testing.assert_array_equal(rows, init)


@pytest.mark.parametrize("ranked", [False, True])
def test_assign_in_a_session_still_writes_rows_of_the_right_shape(ranked):
    """Also from placeholders [None] and [None, None]: TF 1.15 refused them
    at build time ("got shape (?, ?)"), its unknown Dimension taken for a
    width other than the table's."""
    init = np.arange(8, dtype=np.float32).reshape(4, 2)
    new = np.array([[10.0, 11.0], [12.0, 13.0]], np.float32)
    error, rows = _run_assign_in_graph(init, [3, 0], new, ranked)
    assert error is None
    want = init.copy()
    want[[3, 0]] = new
    np.testing.assert_array_equal(rows, want)


def test_assign_in_a_tf_function_of_unknown_shapes_refuses_the_wrong_width():
    """The same through a tf.function whose signature leaves the shapes
    open (one trace for every batch)."""
    init = np.arange(8, dtype=np.float32).reshape(4, 2)
    var = sok.Variable(init)
    write = tf.function(lambda i, x: sok.assign(var, i, x), input_signature=[
        tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, None], tf.float32)])
    for indices, values in ([[1], [[7.0, 8.0, 9.0]]], [[0, 1], [[5.0], [6.0]]],
                            [[0, 1], [[5.0, 5.0]]]):
        with pytest.raises(tf.errors.InvalidArgumentError, match=SHAPES_MESSAGE):
            write(tf.constant(indices, tf.int64), tf.constant(values, tf.float32))
        np.testing.assert_array_equal(var.numpy(), init)
    write(tf.constant([2], tf.int64), tf.constant([[-1.0, -2.0]]))
    want = init.copy()
    want[2] = [-1.0, -2.0]
    np.testing.assert_array_equal(var.numpy(), want)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint32, np.uint64])
def test_assign_names_unsigned_row_numbers(dtype):
    """numpy's unsigned row numbers failed in TensorFlow's scatter ("Value
    for attr 'Tindices' of uint8 is not in the list of allowed values"),
    naming no argument."""
    init = np.zeros((4, 2), np.float32)
    var = sok.Variable(init)
    with pytest.raises(TypeError, match=r"indices for sok.assign must be int32 or int64 row "
                                        r"numbers; got uint"):
        sok.assign(var, np.array([1], dtype), [[1.0, 2.0]])
    np.testing.assert_array_equal(var.numpy(), init)
    sok.assign(var, np.array([1], dtype).astype(np.int64), [[1.0, 2.0]])
    want = init.copy()
    want[1] = [1.0, 2.0]
    np.testing.assert_array_equal(var.numpy(), want)


def _variables():
    return (sok.Variable(np.zeros((3, 2), np.float32)), sok.DynamicVariable(2),
            tf.Variable(np.ones((2,), np.float32)))


@pytest.mark.parametrize("which", ["static", "dynamic", "tf.Variable"])
def test_filter_variables_refuses_one_variable_in_place_of_a_list(which):
    """A sok.Variable passed alone was iterated row by row: ([], [its rows
    as tensors]), no sok variable found, without an error."""
    var = dict(zip(["static", "dynamic", "tf.Variable"], _variables()))[which]
    with pytest.raises(TypeError, match=r"sok.filter_variables takes a list of variables.*"
                                        r"put a single variable in a list"):
        sok.filter_variables(var)


def test_filter_variables_refuses_nested_lists_dicts_and_strings():
    """A list of two models' variable lists put the sok variables among the
    others; a dict gave its keys as variables."""
    s, d, t = _variables()
    with pytest.raises(TypeError, match=r"vars\[1\] is a list: concatenate the lists first"):
        sok.filter_variables([t, [s, d]])
    with pytest.raises(TypeError, match=r"takes a list of variables .*got dict"):
        sok.filter_variables({"s": s, "t": t})
    with pytest.raises(TypeError, match=r"takes a list of variables .*got str"):
        sok.filter_variables("st")
    with pytest.raises(TypeError, match=r"takes a list of variables .*got NoneType"):
        sok.filter_variables(None)


def test_filter_variables_still_splits_any_iterable_of_variables():
    """Any iterable, each variable once: TF 1.15's Keras lists a variable a
    model holds in a list attribute twice, and a table given twice took
    its gradient twice."""
    s, d, t = _variables()
    given = [t, s, d, t, d]
    want = ([s, d], [t])
    for form in (list, tuple, iter):
        got = sok.filter_variables(form(given))
        assert [list(map(id, part)) for part in got] == [list(map(id, part)) for part in want]


def test_horovod_stall_settings_stay_within_a_c_int():
    """Horovod narrows its time settings to a C int: --stall-timeout 3e9
    gave a negative Gloo timeout, and every worker aborted in hvd.init()."""
    for seconds in (3e9, 1e10, 1e20, 1e308):
        settings = launch.horovod_stall_settings(seconds)
        for name, text in settings.items():
            assert 1 <= int(text) <= 2**31 - 1, (seconds, name, text)
    # Within that range nothing changes.
    assert launch.horovod_stall_settings(120)["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "120"


HOROVOD_WORKER = r"""
import tensorflow as tf
if not tf.executing_eagerly():  # TF 1.15
    tf.compat.v1.enable_eager_execution()
import horovod.tensorflow as hvd
hvd.init()
total = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum)
print("total=%g" % float(total.numpy()[0]), flush=True)
"""


@pytest.mark.skipif(not launch_env.horovod_available(), reason="needs Horovod")
def test_a_stall_timeout_beyond_a_c_int_runs_horovod_workers(tmp_path):
    """`python -m sok_graph.launch -np 2 --stall-timeout 1e20` (a bound meant
    as none): both workers' allreduce gives 1 + 2 (each aborted with
    SIGABRT: "gloo ... timeout.count() >= 0. Invalid timeout")."""
    script = tmp_path / "worker.py"
    script.write_text(HOROVOD_WORKER)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    p = subprocess.run([sys.executable, "-m", "sok_graph.launch", "-np", "2", "--cpu",
                        "--stall-timeout", "1e20", "--timeout", "240", str(script)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:]
    totals = sorted(line.split("total=")[1] for line in p.stdout.splitlines()
                    if "total=" in line)
    assert totals == [str(1 + 2)] * 2, p.stdout[-3000:]


def test_incremental_model_dump_names_a_bad_sess():
    """sess= that is not a Session failed with "'str' object has no
    attribute 'graph'", and a Session of another graph with TensorFlow's
    "must be from the same graph" naming a Cast op: neither names the
    argument, the value or what was expected."""
    graph = tf.Graph()
    with graph.as_default():
        v = sok.DynamicVariable(2, initializer=1.0, name="inc_bad_sess")
        read = v.sparse_read(tf.constant([1, 2], tf.int64))
        init = tf.compat.v1.global_variables_initializer()
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(init)
            sess.run(read)
            for bad in ("sess", 5):
                with pytest.raises(TypeError, match=r"sess.*" + re.escape(repr(bad))):
                    sok.incremental_model_dump([v], 0, sess=bad)
            other = tf.compat.v1.Session(graph=tf.Graph())
            try:
                with pytest.raises(ValueError, match=r"sess.*inc_bad_sess|inc_bad_sess.*sess"):
                    sok.incremental_model_dump([v], 0, sess=other)
            finally:
                other.close()
            keys, rows = sok.incremental_model_dump([v], 0, sess=sess)  # still works
            np.testing.assert_array_equal(np.sort(keys[0]), [1, 2])


def test_assign_takes_a_list_of_small_ints_for_an_int64_table_and_an_empty_list():
    """A Python list of keys becomes int32 in TensorFlow: an int64 table's
    sok.assign refused it ("must be int64 (its key_type); got int32"),
    where sparse_read and sparse_read_and_evict widen it; an empty list
    becomes float32 ("indices must be integers; got float32"). Reference:
    the rows given."""
    table = sok.DynamicVariable(dimension=2, initializer="zeros")
    sok.assign(table, [9, 4], [[1.0, 2.0], [3.0, 4.0]])
    keys, rows = (t.numpy() for t in sok.export(table))
    assert dict(zip(keys.tolist(), rows.tolist())) == {9: [1.0, 2.0], 4: [3.0, 4.0]}
    static = sok.Variable(np.arange(6, dtype=np.float32).reshape(3, 2))
    for var in (static, table):
        before = [t.numpy() for t in sok.export(var)]
        sok.assign(var, [], np.zeros((0, 2), np.float32))
        for got, kept in zip(sok.export(var), before):
            np.testing.assert_array_equal(got.numpy(), kept)
