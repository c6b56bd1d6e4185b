"""The fused sparse optimizer op (SokSparseApply) against numpy, its bad
input, and its use by OptimizerWrapper. Its results inside training are
compared with TensorFlow's own optimizers by tests/test_optimizer.py."""

import numpy as np
import pytest
import tensorflow as tf

import sok_graph as sok
from sok_graph.ops import library
from sok_graph.optimization import fused_apply
from sok_graph.optimization.algorithms import ALGORITHMS
from sparse_apply_reference import hyper, numpy_step, slot_count


@pytest.mark.parametrize("algorithm,tf1,nesterov", [
    ("sgd", False, False), ("momentum", True, False), ("momentum", True, True),
    ("momentum", False, False), ("momentum", False, True), ("adagrad", True, False),
    ("adagrad", False, False), ("adam", False, False), ("ftrl", False, False)])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_updates_touched_rows_as_numpy(algorithm, tf1, nesterov, index_dtype):
    rng = np.random.default_rng(3)
    shapes = [(12, 4), (7, 3)]  # two tables, updated by one op
    tables = [rng.normal(size=s).astype(np.float32) for s in shapes]
    slots = [[rng.uniform(0.1, 1.0, size=s).astype(np.float32) for _ in range(slot_count(algorithm))]
             for s in shapes]
    indices = [np.array([0, 11, 5], index_dtype), np.array([6, 2], index_dtype)]
    grads = [rng.normal(size=(len(i), s[1])).astype(np.float32) for i, s in zip(indices, shapes)]
    h, step = hyper(), 3
    vars_ = [tf.Variable(t) for t in tables]
    slot_vars = [tf.Variable(s) for per in slots for s in per]
    library.load().sok_sparse_apply(
        vars=[v.handle for v in vars_], slots=[s.handle for s in slot_vars],
        indices=[tf.constant(i) for i in indices], grads=[tf.constant(g) for g in grads],
        hyper=tf.constant(h), step=tf.constant(step, tf.int64), algorithm=algorithm, tf1=tf1,
        nesterov=nesterov)
    k = 0
    for t, (table, idx, g) in enumerate(zip(tables, indices, grads)):
        want_w = table.astype(np.float64)
        want_s = [s.astype(np.float64) for s in slots[t]]
        new_w, new_s = numpy_step(algorithm, want_w[idx], [s[idx] for s in want_s], g, h, step,
                                   tf1, nesterov)
        want_w[idx] = new_w
        for s, n in zip(want_s, new_s):
            s[idx] = n
        np.testing.assert_allclose(vars_[t].numpy(), want_w, rtol=2e-5, atol=2e-6)
        for s in want_s:  # untouched rows keep their values exactly
            np.testing.assert_allclose(slot_vars[k].numpy(), s, rtol=2e-5, atol=2e-6)
            k += 1


def test_a_bad_index_names_the_table_and_changes_nothing():
    if tf.config.experimental.list_physical_devices("GPU"):
        pytest.skip("on a GPU the op skips bad indices; OptimizerWrapper passes checked ones")
    a = tf.Variable(np.ones((4, 2), np.float32))
    b = tf.Variable(np.ones((3, 2), np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"indices\[1\] must be in \[0, 3\).*got 3 at position 1"):
        library.load().sok_sparse_apply(
            vars=[a.handle, b.handle], slots=[], indices=[tf.constant([0], tf.int64),
                                                          tf.constant([1, 3], tf.int64)],
            grads=[tf.ones((1, 2)), tf.ones((2, 2))], hyper=tf.constant(hyper()),
            step=tf.constant(1, tf.int64), algorithm="sgd")
    np.testing.assert_array_equal(a.numpy(), 1.0)  # table 0 was fine, and untouched too
    np.testing.assert_array_equal(b.numpy(), 1.0)


def test_shapes_and_slot_counts_are_checked():
    v = tf.Variable(np.ones((4, 2), np.float32))
    s = tf.Variable(np.ones((4, 2), np.float32))
    common = dict(hyper=tf.constant(hyper()), step=tf.constant(1, tf.int64))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=r"grads\[0\] must be"):
        library.load().sok_sparse_apply(vars=[v.handle], slots=[s.handle],
                                        indices=[tf.constant([0, 1], tf.int64)],
                                        grads=[tf.ones((2, 3))], algorithm="adagrad", **common)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="slot"):
        library.load().sok_sparse_apply(vars=[v.handle], slots=[],
                                        indices=[tf.constant([0], tf.int64)],
                                        grads=[tf.ones((1, 2))], algorithm="adam", **common)
    with pytest.raises(tf.errors.InvalidArgumentError, match="hyper must have 10 entries; got 3"):
        library.load().sok_sparse_apply(vars=[v.handle], slots=[],
                                        indices=[tf.constant([0], tf.int64)],
                                        grads=[tf.ones((1, 2))], hyper=tf.ones([3]),
                                        step=tf.constant(1, tf.int64), algorithm="sgd")
    wrong = tf.Variable(np.ones((5, 2), np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"slots\[0\] \(of vars\[0\]\) has "
                                                             r"shape \[5,2\]"):
        library.load().sok_sparse_apply(vars=[v.handle], slots=[wrong.handle],
                                        indices=[tf.constant([0], tf.int64)],
                                        grads=[tf.ones((1, 2))], algorithm="adagrad", **common)
    np.testing.assert_array_equal(v.numpy(), 1.0)


def test_a_value_read_before_the_update_keeps_its_rows():
    """The update is in place, but never under a reader: a tensor read from
    the variable before the op keeps the old rows (copy-on-write)."""
    v = tf.Variable(np.zeros((4, 2), np.float32))

    @tf.function
    def read_then_update():
        before = tf.identity(v.read_value())
        with tf.control_dependencies([before]):
            op = library.load().sok_sparse_apply(
                vars=[v.handle], slots=[], indices=[tf.constant([2], tf.int64)],
                grads=[tf.ones((1, 2))], hyper=tf.constant(hyper(lr=1.0)),
                step=tf.constant(1, tf.int64), algorithm="sgd")
        with tf.control_dependencies([op]):
            return before + 0.0, v.read_value()

    before, after = read_then_update()
    np.testing.assert_array_equal(before.numpy(), 0.0)
    np.testing.assert_array_equal(after.numpy()[2], [-1.0, -1.0])


@pytest.mark.parametrize("name,make", [
    ("adam", lambda: tf.keras.optimizers.Adam(0.1)),
    ("ftrl", lambda: tf.keras.optimizers.Ftrl(0.1)),
    ("momentum", lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)),
    ("rmsprop", lambda: tf.keras.optimizers.RMSprop(0.1))])
def test_wrapper_fuses_the_algorithms_the_op_has(name, make):
    """OptimizerWrapper updates static tables through the fused op (so the
    equivalence tests of test_optimizer.py run it) where the op has the
    algorithm, through TensorFlow ops otherwise; the lookup's gradient
    (distinct indices) is not deduplicated again."""
    sok.init()
    tables = [sok.Variable(np.ones((10, 4), np.float32)), sok.Variable(np.ones((6, 4), np.float32))]
    opt = sok.OptimizerWrapper(make())
    ids = [tf.ragged.constant([[1, 2, 2], [3]], dtype=tf.int64),
           tf.ragged.constant([[5], [0, 5]], dtype=tf.int64)]

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(x * x) for x in sok.lookup_sparse(tables, ids)])
        opt.apply_gradients(zip(tape.gradient(loss, tables), tables))

    ops = [o.type for o in step.get_concrete_function().graph.get_operations()]
    fused = ops.count("SokSparseApply")
    assert fused == (1 if name in fused_apply.FUSED_ALGORITHMS else 0), ops
    if fused:
        assert not [t for t in ops if "Unique" in t or "Scatter" in t], ops
    assert set(fused_apply.FUSED_ALGORITHMS) <= set(ALGORITHMS)
