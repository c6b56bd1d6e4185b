"""Lookups a user may build that once gave an unclear error or a wrong
gradient, each checked against plain TensorFlow or numpy."""

import contextlib
import re

import numpy as np
import pytest
import tensorflow as tf

import sok_graph as sok

ROWS = np.arange(18, dtype=np.float32).reshape(6, 3) / 10.0


@contextlib.contextmanager
def _control_flow_v1():
    """tf.while_loop / tf.cond of TF1 (Enter, Exit, Switch, Merge), TF
    1.15's default in graph mode, for the graphs built in the block."""
    from tensorflow.python.ops import control_flow_util

    was = control_flow_util.ENABLE_CONTROL_FLOW_V2
    control_flow_util.ENABLE_CONTROL_FLOW_V2 = False
    try:
        yield
    finally:
        control_flow_util.ENABLE_CONTROL_FLOW_V2 = was


def _loop_of_lookups(table, ids, steps=3):
    """sum over `steps` iterations of a TF1 tf.while_loop of
    sum(lookup_sparse(table, ids) ** 2)."""
    lookup = (lambda: sok.lookup_sparse(table, ids, combiners="sum")) \
        if not isinstance(table, tf.Variable) or hasattr(table, "placement") else \
        (lambda: tf.nn.embedding_lookup_sparse(table, ids.to_sparse(), None, combiner="sum"))

    def body(i, total):
        rows = lookup()
        return i + 1, total + tf.reduce_sum(rows * rows)

    return tf.compat.v1.while_loop(lambda i, total: i < steps, body,
                                   [tf.constant(0), tf.constant(0.0)])[1]


def test_a_dynamic_tables_gradient_through_a_tf1_while_loop_is_refused_by_name():
    """tf.gradients of a loss summed over a TF1 tf.while_loop that reads a
    DynamicVariable failed inside TensorFlow's loop gradient with
    "Operation '.../SokDynamicTableHandle' has no attr named 'shape'"
    (the loop sums a variable's gradient in a buffer of its dense shape,
    and starts it with a zero row at index 0, which would insert key 0).
    It is a NotImplementedError saying what is not supported and what to
    do; the loop's forward still runs, and a static table read in such a
    loop has TensorFlow's gradient."""
    graph = tf.Graph()
    with _control_flow_v1(), graph.as_default():
        sok.init(comm_tool="none")
        ids = tf.ragged.constant([[0, 1], [5]], dtype=tf.int64)
        dynamic = sok.DynamicVariable(3, initializer="ones")
        dynamic_total = _loop_of_lookups(dynamic, ids)
        with pytest.raises(NotImplementedError,
                           match=r"dynamic table read inside a TF1 tf.while_loop .*SokDynamic"
                                 r".* not supported.*outside the loop"):
            tf.compat.v1.gradients(dynamic_total, [dynamic])
    graph = tf.Graph()
    with _control_flow_v1(), graph.as_default():
        sok.init(comm_tool="none")
        ids = tf.ragged.constant([[0, 1], [5]], dtype=tf.int64)
        dynamic = sok.DynamicVariable(3, initializer="ones")
        static, plain = sok.Variable(ROWS), tf.compat.v1.get_variable(
            "plain", initializer=ROWS, use_resource=True)
        dynamic_total = _loop_of_lookups(dynamic, ids)
        static_total, plain_total = _loop_of_lookups(static, ids), _loop_of_lookups(plain, ids)
        grads = [tf.convert_to_tensor(g) for g in
                 tf.compat.v1.gradients(static_total, [static])
                 + tf.compat.v1.gradients(plain_total, [plain])]
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            forward, got, want = sess.run([dynamic_total, static_total, plain_total])
            got_grad, want_grad = sess.run(grads)
    assert forward == pytest.approx(3 * (4 * 3 + 1 * 3))  # rows of ones: 2 + 1 ids of 3 columns
    assert got == pytest.approx(want, rel=1e-6)
    np.testing.assert_allclose(got_grad, want_grad, rtol=1e-6)


@pytest.mark.parametrize("branches", ["one", "both"])
def test_a_dynamic_tables_gradient_through_a_tf1_cond_is_refused_by_name(branches):
    """tf.gradients through a TF1 tf.cond whose branch (or both branches)
    reads a DynamicVariable failed in TensorFlow's cond gradient with "The
    two structures don't have the same nested structure", naming neither
    the table nor sok (TF 1.15's default in graph mode). It is a
    NotImplementedError naming the read and what to do; the cond's forward
    still runs."""
    graph = tf.Graph()
    with _control_flow_v1(), graph.as_default():
        sok.init(comm_tool="none")
        table = sok.DynamicVariable(2, initializer="ones")
        flag = tf.compat.v1.placeholder(tf.bool, [])

        def read(keys):
            return lambda: tf.nn.embedding_lookup(table, tf.constant(keys, tf.int64))

        other = read([1, 3]) if branches == "both" else (lambda: tf.zeros([2, 2]))
        rows = tf.cond(flag, read([0, 2]), other)
        with pytest.raises(NotImplementedError,
                           match=r"dynamic table read inside a TF1 tf.cond branch \(op "
                                 r"'cond/.*SokDynamic.*'\) is not supported.*before the tf.cond"):
            tf.compat.v1.gradients(tf.reduce_sum(rows), [table])
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            assert sess.run(rows, {flag: True}).tolist() == [[1.0, 1.0], [1.0, 1.0]]


_TF2_ONLY = pytest.mark.skipif(tf.__version__.startswith("1."),
                               reason="v2 control flow in a tf.function is TF 2.x's")


def _looped_total(loop, summed):
    """summed() added up over 3 turns of a v2 tf.while_loop: AutoGraph's
    `for` over a tensor (in a tf.function), or tf.map_fn."""
    if loop == "for":
        total = tf.constant(0.0)
        for _ in tf.range(3):
            total += summed()
        return total
    return tf.reduce_sum(tf.map_fn(lambda i: summed(), tf.range(3),
                                   fn_output_signature=tf.float32))


def _keras_sgd(rate):
    return tf.keras.optimizers.SGD(rate)


@_TF2_ONLY
@pytest.mark.parametrize("loop", ["for", "map_fn"])
@pytest.mark.parametrize("apply", ["wrapper", "scope"])
def test_a_dynamic_tables_gradient_lost_in_a_tf_function_loop_is_refused(loop, apply):
    """A GradientTape around a tf.while_loop (a `for` over a tensor in a
    tf.function, tf.map_fn) that reads a DynamicVariable gets None for the
    table: TensorFlow's loop passes a variable's gradient only as a dense
    tensor of its shape. An optimizer passed the table over as a variable
    the loss does not depend on, and the table never trained, without an
    error. sok's optimizers (the wrapper, a Keras optimizer under
    OptimizerScope) now refuse that None by name, before anything changes."""
    table = sok.DynamicVariable(3, initializer="ones", name="looped")
    dense = tf.Variable(2.0)
    ids = tf.ragged.constant([[0, 1], [5]], dtype=tf.int64)
    optimizer = _keras_sgd(0.1)
    if apply == "wrapper":
        optimizer = sok.OptimizerWrapper(optimizer)

    def summed():
        return tf.reduce_sum(sok.lookup_sparse(table, ids, combiners="sum")) * dense

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            total = _looped_total(loop, summed)
        grads = tape.gradient(total, [table, dense])
        # What TensorFlow's loop gives the table (a plain tf.Variable read
        # there gets its gradient; the dense one here does).
        assert grads[0] is None and grads[1] is not None
        if apply == "scope":
            with sok.OptimizerScope([table]):
                return optimizer.apply_gradients(zip(grads, [table, dense]))
        return optimizer.apply_gradients(zip(grads, [table, dense]))

    with pytest.raises(NotImplementedError,
                       match=r"DynamicVariable 'looped' is read inside a tf.while_loop .* is "
                             r"None.*would not train.*inside the loop body"):
        step()
    assert float(dense.numpy()) == 2.0
    keys, rows = sok.export(table)
    np.testing.assert_array_equal(rows.numpy(), np.ones([len(keys), 3], np.float32))


@_TF2_ONLY
@pytest.mark.parametrize("loop", ["for", "map_fn"])
@pytest.mark.parametrize("apply", ["wrapper", "scope", "session"])
def test_a_dynamic_tables_gradient_partly_lost_in_a_loop_is_refused(loop, apply):
    """The same loop, and a read of the table outside it too: the gradient
    is not None, but holds the outside read's rows alone, so the table
    trained on that read and never on the loop's, without an error (the
    rows the loop read stayed as they were, where a plain tf.Variable's
    moved). Refused by name too now, before anything changes: in a
    tf.function, and in a tf.compat.v1 graph run by a Session with a
    tf.compat.v1.train optimizer under OptimizerScope."""
    def build(table, dense, optimizer):
        ids = tf.ragged.constant([[0, 1], [5]], dtype=tf.int64)

        def summed():
            return tf.reduce_sum(sok.lookup_sparse(table, ids, combiners="sum")) * dense

        def loss():
            total = _looped_total(loop, summed)
            outside = sok.lookup_sparse(table, tf.ragged.constant([[7]], dtype=tf.int64),
                                        combiners="sum")
            return total + tf.reduce_sum(outside)

        with tf.GradientTape() as tape:
            value = loss()
        grads = tape.gradient(value, [table, dense])
        assert grads[0] is not None and grads[1] is not None
        if apply == "wrapper":
            return optimizer.apply_gradients(zip(grads, [table, dense]))
        with sok.OptimizerScope([table]):
            return optimizer.apply_gradients(zip(grads, [table, dense]))

    match = (r"DynamicVariable 'half_looped' is read inside a tf.while_loop .* holds the reads "
             r"outside the loop alone.*would not train on the loop's reads")
    if apply == "session":
        with tf.Graph().as_default():
            sok.init(comm_tool="none")
            table = sok.DynamicVariable(3, initializer="ones", name="half_looped")
            dense = tf.compat.v1.get_variable("dense", initializer=2.0, use_resource=True)
            if loop == "for":  # a `for` over a tensor is AutoGraph's, in a tf.function
                pytest.skip("a Python `for` over tf.range runs the loop in Python in a graph")
            with pytest.raises(NotImplementedError, match=match):
                build(table, dense, tf.compat.v1.train.GradientDescentOptimizer(0.1))
        return
    table = sok.DynamicVariable(3, initializer="ones", name="half_looped")
    dense = tf.Variable(2.0)
    optimizer = _keras_sgd(0.1)
    if apply == "wrapper":
        optimizer = sok.OptimizerWrapper(optimizer)
    with pytest.raises(NotImplementedError, match=match):
        tf.function(lambda: build(table, dense, optimizer))()
    assert float(dense.numpy()) == 2.0
    keys, rows = sok.export(table)
    np.testing.assert_array_equal(rows.numpy(), np.ones([len(keys), 3], np.float32))


@_TF2_ONLY
def test_a_dynamic_table_trained_by_a_tape_inside_a_tf_function_loop_trains_as_a_variable():
    """The way that works (Keras' steps_per_execution takes it): the tape
    and the optimizer's step inside the loop body. Two steps of SGD on the
    squared sum of a lookup, against the same loop on a tf.Variable with
    tf.nn.embedding_lookup_sparse."""
    table = sok.DynamicVariable(3, initializer="ones")
    plain = tf.Variable(np.ones([6, 3], np.float32))
    ids = tf.ragged.constant([[0, 1], [5, 5, 1]], dtype=tf.int64)
    wrapper, reference = sok.OptimizerWrapper(_keras_sgd(0.05)), _keras_sgd(0.05)

    @tf.function
    def train():
        for _ in tf.range(2):
            with tf.GradientTape() as tape:
                got = sok.lookup_sparse(table, ids, combiners="sum")
                loss = tf.reduce_sum(got * got * tf.constant([[1.0], [3.0]]))
            wrapper.apply_gradients(zip(tape.gradient(loss, [table]), [table]))
            with tf.GradientTape() as tape:
                want = tf.nn.embedding_lookup_sparse(plain, ids.to_sparse(), None, combiner="sum")
                loss = tf.reduce_sum(want * want * tf.constant([[1.0], [3.0]]))
            reference.apply_gradients(zip(tape.gradient(loss, [plain]), [plain]))

    train()
    keys, rows = sok.export(table)
    got = dict(zip(keys.numpy().tolist(), rows.numpy().tolist()))
    assert sorted(got) == [0, 1, 5]
    for key in (0, 1, 5):
        np.testing.assert_allclose(got[key], plain.numpy()[key], rtol=1e-6)
    assert not np.allclose(plain.numpy()[0], 1.0)  # it trained


@_TF2_ONLY
def test_a_dynamic_tables_gradient_through_a_tf_function_cond_is_refused_by_name():
    """A GradientTape around a tf.cond (an `if` on a tensor in a
    tf.function) whose branch reads a DynamicVariable failed with
    TensorFlow's "Internal error: Tried to take gradients (or similar) of a
    variable without handle data"; it is a NotImplementedError naming the
    read and what to do."""
    table = sok.DynamicVariable(3, initializer="ones")
    ids = tf.ragged.constant([[0, 1], [5]], dtype=tf.int64)

    @tf.function
    def gradient(flag):
        with tf.GradientTape() as tape:
            total = tf.cond(flag,
                            lambda: tf.reduce_sum(sok.lookup_sparse(table, ids, combiners="sum")),
                            lambda: tf.constant(0.0))
        return tape.gradient(total, [table])

    with pytest.raises(NotImplementedError,
                       match=r"read inside a tf.cond branch \(op '.*SokDynamic.*'\).*not "
                             r"supported.*before the tf.cond"):
        gradient(tf.constant(True))


def test_all2all_dense_embedding_errors_name_its_argument():
    """all2all_dense_embedding's table argument is `param`; its errors about
    it said "params[0]" (lookup_sparse's list), an argument the caller never
    passed."""
    for bad in (np.ones((3, 2), np.float64), None, np.ones([3], np.float32)):
        with pytest.raises((TypeError, ValueError)) as e:
            sok.all2all_dense_embedding(bad, tf.constant([1], tf.int64))
        assert re.search(r"\bparam\b", str(e.value)) and "params[0]" not in str(e.value), \
            str(e.value)
