"""The fused sparse optimizer op (SokSparseApply) against numpy, its bad
input, and its use by OptimizerWrapper. Its results inside training are
compared with TensorFlow's own optimizers by tests/test_optimizer.py."""

import inspect
import types

import numpy as np
import pytest
import tensorflow as tf

import sok_graph as sok
from sok_graph import compat
from sok_graph.ops import library
from sok_graph.optimization import fused_apply
from sok_graph.optimization.algorithms import kernel_slot_names
from sparse_apply_reference import formula_attrs, hyper, numpy_step, slot_count


@pytest.mark.parametrize("algorithm,formulas,nesterov", [
    ("sgd", "keras", False), ("momentum", "tf1", False), ("momentum", "tf1", True),
    ("momentum", "keras", False), ("momentum", "keras", True), ("adagrad", "tf1", False),
    ("adagrad", "keras", False), ("adagrad", "keras_v2", False), ("adam", "keras", False),
    ("ftrl", "keras", False), ("rmsprop", "keras", False), ("rmsprop", "keras_v2", False),
    ("rmsprop_momentum", "keras", False), ("rmsprop_momentum", "keras_v2", False),
    ("rmsprop_centered", "keras", False), ("rmsprop_centered", "keras_v2", False),
    ("rmsprop_momentum_centered", "keras", False),
    ("rmsprop_momentum_centered", "keras_v2", False), ("adadelta", "keras", False),
    ("adamax", "keras", False)])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_updates_touched_rows_as_numpy(algorithm, formulas, nesterov, index_dtype):
    rng = np.random.default_rng(3)
    shapes = [(12, 4), (7, 3)]  # two tables, updated by one op
    tables = [rng.normal(size=s).astype(np.float32) for s in shapes]
    slots = [[rng.uniform(0.1, 1.0, size=s).astype(np.float32) for _ in range(slot_count(algorithm))]
             for s in shapes]
    if algorithm.endswith("centered"):  # a mean gradient below the root mean square
        for per in slots:
            per[-1] *= 0.2
    indices = [np.array([0, 11, 5], index_dtype), np.array([6, 2], index_dtype)]
    grads = [rng.normal(size=(len(i), s[1])).astype(np.float32) for i, s in zip(indices, shapes)]
    # An epsilon that tells sqrt(x) + epsilon (keras_v2) from sqrt(x + epsilon).
    h, step = hyper(epsilon=0.5 if formulas == "keras_v2" else 1e-7), 3
    vars_ = [tf.Variable(t) for t in tables]
    slot_vars = [tf.Variable(s) for per in slots for s in per]
    library.load().sok_sparse_apply(
        vars=[v.handle for v in vars_], slots=[s.handle for s in slot_vars],
        indices=[tf.constant(i) for i in indices], grads=[tf.constant(g) for g in grads],
        hyper=tf.constant(h), step=tf.constant(step, tf.int64), algorithm=algorithm,
        nesterov=nesterov, **formula_attrs(formulas))
    k = 0
    for t, (table, idx, g) in enumerate(zip(tables, indices, grads)):
        want_w = table.astype(np.float64)
        want_s = [s.astype(np.float64) for s in slots[t]]
        new_w, new_s = numpy_step(algorithm, want_w[idx], [s[idx] for s in want_s], g, h, step,
                                   formulas, nesterov)
        want_w[idx] = new_w
        for s, n in zip(want_s, new_s):
            s[idx] = n
        np.testing.assert_allclose(vars_[t].numpy(), want_w, rtol=2e-5, atol=2e-6)
        for s in want_s:  # untouched rows keep their values exactly
            np.testing.assert_allclose(slot_vars[k].numpy(), s, rtol=2e-5, atol=2e-6)
            k += 1


@pytest.mark.parametrize("lr_power", [-0.5, -0.25, -1.0])
def test_ftrl_at_any_learning_rate_power_as_numpy(lr_power):
    """-0.5 (the default) takes a square root, the others the general power."""
    rng = np.random.default_rng(5)
    table = rng.normal(size=(6, 3)).astype(np.float32)
    slots = [rng.uniform(0.1, 1.0, size=(6, 3)).astype(np.float32) for _ in range(2)]
    idx, g = np.array([4, 1], np.int64), rng.normal(size=(2, 3)).astype(np.float32)
    h = hyper(lr_power=lr_power)
    var, slot_vars = tf.Variable(table), [tf.Variable(x) for x in slots]
    library.load().sok_sparse_apply(
        vars=[var.handle], slots=[x.handle for x in slot_vars], indices=[tf.constant(idx)],
        grads=[tf.constant(g)], hyper=tf.constant(h), step=tf.constant(1, tf.int64),
        algorithm="ftrl")
    want_w, want_s = numpy_step("ftrl", table[idx].astype(np.float64),
                                [x[idx].astype(np.float64) for x in slots], g, h, 1)
    np.testing.assert_allclose(var.numpy()[idx], want_w, rtol=2e-5, atol=2e-6)
    for got, want in zip(slot_vars, want_s):
        np.testing.assert_allclose(got.numpy()[idx], want, rtol=2e-5, atol=2e-6)


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
    with pytest.raises(tf.errors.InvalidArgumentError, match="hyper must have 11 entries; got 3"):
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
    ("rmsprop", lambda: tf.keras.optimizers.RMSprop(0.1)),
    ("rmsprop_momentum", lambda: tf.compat.v1.train.RMSPropOptimizer(0.1, momentum=0.5)),
    ("adadelta", lambda: tf.compat.v1.train.AdadeltaOptimizer(0.1)),
    ("adamax", lambda: tf.keras.optimizers.Adamax(0.1))])
def test_wrapper_fuses_the_algorithms_the_op_has(name, make):
    """OptimizerWrapper updates float32 static tables through the fused op
    for every algorithm (so the equivalence tests of test_optimizer.py run
    it); the lookup's gradient (distinct indices) is not deduplicated
    again."""
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
    # Every algorithm is fused; `name` is the kernel for its settings.
    assert opt._hp.kernel == name and name in fused_apply.fused_algorithms()
    assert fused == 1, ops
    assert not [t for t in ops if "Unique" in t or "Scatter" in t], ops
    assert set(fused_apply.fused_algorithms()) == set(kernel_slot_names())


def test_python_follows_the_one_spec_the_ops_spell_out():
    """The fused ops' algorithms, slots and hyperparameter order are one list
    in C++ (tf_ops/optimizer/core/sparse_apply.h) that the registered ops
    spell out; the Python side reads it back and builds `hyper` in that
    order, which is the numpy reference's argument order."""
    got = fused_apply.spec()
    assert got.hyper_names == tuple(inspect.signature(hyper).parameters)
    assert set(got.algorithms) == {"sgd", "momentum", "adagrad", "adam", "ftrl", "rmsprop",
                                   "rmsprop_momentum", "rmsprop_centered",
                                   "rmsprop_momentum_centered", "adadelta", "adamax"}
    assert got.slots["adam"] == ("m", "v") and got.slots["ftrl"] == ("accumulator", "linear")
    assert got.slots["rmsprop_momentum_centered"] == ("rms", "momentum", "mg")
    hp = types.SimpleNamespace(**{n: float(i + 1) for i, n in enumerate(got.hyper_names)})
    np.testing.assert_array_equal(fused_apply._hyper(hp, 1.0).numpy(),
                                  np.arange(1, len(got.hyper_names) + 1, dtype=np.float32))


def _op_defs_with(changes):
    """Copies of the fused ops' registered OpDefs with attribute defaults
    replaced: {(op name, attr name): [strings]}."""
    from tensorflow.core.framework import op_def_pb2

    defs = {}
    for name in fused_apply.OPS:
        defs[name] = op_def_pb2.OpDef()
        defs[name].CopyFrom(compat.registered_op_def(name))
        for attr in defs[name].attr:
            if (name, attr.name) in changes:
                del attr.default_value.list.s[:]
                attr.default_value.list.s.extend(v.encode() for v in changes[name, attr.name])
    return defs


def test_a_spec_python_does_not_share_fails_loudly():
    spec = fused_apply.spec()
    both = fused_apply.OPS
    swapped = [f"{a}:{','.join(reversed(s)) if a == 'adam' else ','.join(s)}"
               for a, s in spec.slots.items()]
    with pytest.raises(RuntimeError, match=r"slots \('v', 'm'\) for 'adam'; "
                                           r"optimization/algorithms.py keeps \('m', 'v'\)"):
        fused_apply._read_spec(_op_defs_with({(op, "slot_names"): swapped for op in both}))
    extra = list(spec.hyper_names) + ["gamma"]
    with pytest.raises(RuntimeError, match=r"hyperparameters \['gamma'\]"):
        fused_apply._read_spec(_op_defs_with({(op, "hyper_names"): extra for op in both}))
    with pytest.raises(RuntimeError, match="the fused updates disagree"):
        fused_apply._read_spec(_op_defs_with({("SokSparseApply", "hyper_names"): extra}))


def test_a_graph_built_against_other_lists_is_refused():
    """A node whose hyper_names (the order its builder used) is not this
    library's fails when its kernel is made, before any row changes."""
    v = tf.Variable(np.ones((4, 2), np.float32))
    order = list(fused_apply.spec().hyper_names)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"the graph's hyper_names \['{order[-1]}', .*\] differ from this "
                             r"library's "
                             r"\['lr', .*build it again"):
        library.load().sok_sparse_apply(vars=[v.handle], slots=[],
                                        indices=[tf.constant([0], tf.int64)],
                                        grads=[tf.ones((1, 2))], hyper=tf.constant(hyper()),
                                        step=tf.constant(1, tf.int64), algorithm="sgd",
                                        hyper_names=order[::-1])
    np.testing.assert_array_equal(v.numpy(), 1.0)
