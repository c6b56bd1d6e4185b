"""The fused sparse optimizer op of dynamic tables (SokDynamicSparseApply)
against numpy, against the TensorFlow-op update it replaces, its bad input,
and its use by OptimizerWrapper. Its results inside training are compared
with TensorFlow's own optimizers by tests/test_optimizer.py."""

import numpy as np
import pytest
import tensorflow as tf

import sok_graph as sok
from sok_graph import compat
from sok_graph.ops import dynamic as dynamic_ops
from sok_graph.ops import library
from sok_graph.optimization import fused_apply
from sparse_apply_reference import formula_attrs, hyper, numpy_step, slot_count

DIM = 4
SLOT_INIT = 0.3  # the slot tables' initial value for keys they do not hold


def _table(key_type, rows=None, initializer="zeros"):
    """A DynamicVariable holding `rows` ({key: row}) and nothing else."""
    v = sok.DynamicVariable(DIM, initializer=initializer, key_type=key_type)
    if rows:
        keys = sorted(rows)
        v.import_rows(tf.constant(keys, key_type), tf.constant([rows[k] for k in keys],
                                                              tf.float32))
    return v


def _rows(v, keys, key_type):
    rows, found = v.find(tf.constant(keys, key_type))
    return rows.numpy(), found.numpy()


@pytest.mark.parametrize("algorithm,formulas,nesterov", [
    ("sgd", "keras", False), ("momentum", "tf1", False), ("momentum", "keras", True),
    ("adagrad", "tf1", False), ("adagrad", "keras", False), ("adagrad", "keras_v2", False),
    ("adam", "keras", False), ("ftrl", "keras", False), ("rmsprop", "keras", False),
    ("rmsprop", "keras_v2", False), ("rmsprop_momentum", "keras", False),
    ("rmsprop_momentum", "keras_v2", False), ("rmsprop_centered", "keras", False),
    ("rmsprop_centered", "keras_v2", False), ("rmsprop_momentum_centered", "keras", False),
    ("adadelta", "keras", False), ("adamax", "keras", False)])
@pytest.mark.parametrize("key_type", [tf.int32, tf.int64])
def test_updates_keys_as_numpy(algorithm, formulas, nesterov, key_type, rng):
    """Keys the table holds and a key it does not (read as zeros, then
    inserted); slot rows the slot tables hold and ones they insert with their
    initializer. Rows, slots and their presence afterwards, against float64
    numpy."""
    held = {k: rng.standard_normal(DIM).astype(np.float32) for k in (3, 7, 11, 20)}
    table = _table(key_type, held)
    slots = []
    slot_held = []
    for _ in range(slot_count(algorithm)):
        # ftrl's accumulator must stay positive: positive slot values
        rows = {k: rng.uniform(0.2, 1.0, DIM).astype(np.float32) for k in (3, 11)}
        if algorithm.endswith("centered") and len(slots) == slot_count(algorithm) - 1:
            # the mean gradient, below the root mean square
            rows = {k: r * 0.2 for k, r in rows.items()}
        slots.append(_table(key_type, rows, initializer=SLOT_INIT))
        slot_held.append(rows)
    keys = [11, 42, 3, 7]  # 42: in no table
    grads = rng.standard_normal((len(keys), DIM)).astype(np.float32)
    # An epsilon that tells sqrt(x) + epsilon (keras_v2) from sqrt(x + epsilon).
    h = hyper(epsilon=0.5 if formulas == "keras_v2" else 1e-7)
    dynamic_ops.sparse_apply(table.handle, [s.handle for s in slots], tf.constant(keys, key_type),
                             tf.constant(grads), tf.constant(h), tf.constant(3, tf.int64),
                             algorithm, nesterov=nesterov, **formula_attrs(formulas))
    for i, k in enumerate(keys):
        w = held.get(k, np.zeros(DIM, np.float32)).astype(np.float64)
        s = [r.get(k, np.full(DIM, SLOT_INIT, np.float32)).astype(np.float64) for r in slot_held]
        want_w, want_s = numpy_step(algorithm, w, s, grads[i].astype(np.float64), h, 3, formulas,
                                     nesterov)
        got_w, found = _rows(table, [k], key_type)
        assert found.all()
        np.testing.assert_allclose(got_w[0], want_w, rtol=2e-5, atol=2e-6)
        for slot, want in zip(slots, want_s):
            got, found = _rows(slot, [k], key_type)
            assert found.all()
            np.testing.assert_allclose(got[0], want, rtol=2e-5, atol=2e-6)
    # A key the update was not given stays as it was.
    np.testing.assert_array_equal(_rows(table, [20], key_type)[0][0], held[20])


@pytest.mark.parametrize("key_type", [tf.int32, tf.int64])
def test_keys_its_insert_evicts_leave_the_slot_tables(key_type, rng):
    """A key evicted between its lookup and its update is put back by the
    update, which evicts another key of the full table (max_capacity 4; by
    LRU, key 1, the oldest there). That key's slot rows go too, and the
    slot table, whose own oldest key is 2, keeps every key the table keeps:
    before, the slot table evicted key 2 to make room by its own order, so
    key 2 lost its accumulator while key 1, gone from the table, kept its
    own for when it came back. Against numpy's Adagrad."""
    bounds = dict(var_type="hybrid", init_capacity=4, max_capacity=4)
    table = sok.DynamicVariable(DIM, initializer="zeros", key_type=key_type, **bounds)
    slot = sok.DynamicVariable(DIM, initializer=SLOT_INIT, key_type=key_type, **bounds)
    held = [1, 2, 3, 4]
    rows = rng.standard_normal((4, DIM)).astype(np.float32)
    accumulators = rng.uniform(0.2, 1.0, (4, DIM)).astype(np.float32)
    # Import times (microseconds, long before now): the table's oldest key
    # is 1, the slot table's is 2.
    table.import_rows(tf.constant(held, key_type), tf.constant(rows),
                      timestamps=tf.constant([1, 2, 3, 4], tf.int64))
    slot.import_rows(tf.constant(held, key_type), tf.constant(accumulators),
                     timestamps=tf.constant([2, 1, 3, 4], tf.int64))
    grads = rng.standard_normal((1, DIM)).astype(np.float32)
    h = hyper()
    dynamic_ops.sparse_apply(table.handle, [slot.handle], tf.constant([9], key_type),
                             tf.constant(grads), tf.constant(h), tf.constant(1, tf.int64),
                             "adagrad")
    kept = [2, 3, 4, 9]
    _, found = _rows(table, [1] + kept, key_type)
    assert found.tolist() == [False, True, True, True, True]
    got, found = _rows(slot, [1] + kept, key_type)
    assert found.tolist() == [False, True, True, True, True]
    np.testing.assert_array_equal(got[1:4], accumulators[1:4])
    # Key 9 read zeros and its accumulator started at SLOT_INIT.
    want_w, want_s = numpy_step("adagrad", np.zeros(DIM), [np.full(DIM, SLOT_INIT)],
                                grads[0].astype(np.float64), h, 1, "keras", False)
    np.testing.assert_allclose(_rows(table, [9], key_type)[0][0], want_w, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(got[4], want_s[0], rtol=2e-5, atol=2e-6)


_MAKE = {"momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
         "adam": lambda: tf.keras.optimizers.Adam(0.05),
         "ftrl": lambda: tf.keras.optimizers.Ftrl(0.1),
         "rmsprop": lambda: tf.keras.optimizers.RMSprop(0.05),
         "rmsprop_momentum_centered": lambda: tf.keras.optimizers.RMSprop(
             0.05, momentum=0.5, centered=True),
         "rmsprop_tf1_centered": lambda: tf.compat.v1.train.RMSPropOptimizer(
             0.05, momentum=0.0, centered=True),
         "adadelta": lambda: tf.keras.optimizers.Adadelta(1.0),
         "adadelta_tf1": lambda: tf.compat.v1.train.AdadeltaOptimizer(1.0),
         "adamax": lambda: tf.keras.optimizers.Adamax(0.05)}
# Keras 2's OptimizerV2 (epsilon after the root), where this TensorFlow has
# it; an epsilon large enough to tell the two formulas apart.
_OPTIMIZER_V2 = tf.keras.optimizers if compat.IS_TF1 else compat.legacy_optimizers_module()
if _OPTIMIZER_V2 is not None:
    _MAKE.update({
        "adagrad_keras_v2": lambda: _OPTIMIZER_V2.Adagrad(0.05, epsilon=0.5),
        "rmsprop_keras_v2_centered": lambda: _OPTIMIZER_V2.RMSprop(0.05, epsilon=0.5,
                                                                   centered=True)})


@pytest.mark.parametrize("algorithm", sorted(_MAKE))
def test_equals_the_tensorflow_op_update(algorithm, rng):
    """Rows and slots after a few steps through OptimizerWrapper: the fused
    op against the TensorFlow-op update (update_all_rows=False, fusing
    turned off for the comparison), bit for bit or within float rounding."""
    make = _MAKE[algorithm]
    init = {k: rng.standard_normal(DIM).astype(np.float32) for k in range(12)}
    batches = [tf.ragged.constant([list(rng.integers(0, 16, size=rng.integers(1, 4)))
                                   for _ in range(6)], tf.int64) for _ in range(3)]
    results = []
    for fused in (True, False):
        table = _table(tf.int64, init)
        opt = sok.OptimizerWrapper(make())
        if not fused:
            opt._fusable = lambda var: False
        for ids in batches:
            with tf.GradientTape() as tape:
                emb = sok.lookup_sparse(table, ids, combiners="sum")
                loss = tf.reduce_sum(emb * emb) + tf.reduce_sum(emb)
            opt.apply_gradients([(tape.gradient(loss, table), table)])
        keys = list(range(16))
        got = [_rows(table, keys, tf.int64)]
        got += [_rows(opt.get_slot(table, n), keys, tf.int64) for n in opt.slot_names()]
        results.append(got)
    # FTRL subtracts two square roots of nearly equal accumulators: a last-ulp
    # difference between two sqrt implementations (TF 1.15's CPU tf.sqrt,
    # the GPU's powf, the fused kernel's exactly rounded sqrtf) comes out
    # ~10x larger, 1.2e-6 to 2.7e-6 measured; the fused FTRL is held to a
    # float64 numpy model in test_sparse_apply_op.py.
    rtol = 1e-5 if algorithm.startswith("ftrl") else 1e-6
    for (a, fa), (b, fb) in zip(*results):
        np.testing.assert_array_equal(fa, fb)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-7)


def test_bad_input_names_what_is_wrong():
    table = _table(tf.int64, {1: np.ones(DIM, np.float32)})
    other_dim = sok.DynamicVariable(DIM + 1, initializer="zeros")
    int32_slot = sok.DynamicVariable(DIM, initializer="zeros", key_type=tf.int32)
    keys = tf.constant([1], tf.int64)
    grads = tf.ones([1, DIM])
    h, step = tf.constant(hyper()), tf.constant(1, tf.int64)

    def call(slots=(), k=keys, g=grads, hyper=h, st=step, algorithm="sgd"):
        dynamic_ops.sparse_apply(table.handle, [s.handle for s in slots], k, g, hyper, st,
                                 algorithm)

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"grads must be \[1, 4\]"):
        call(g=tf.ones([1, DIM + 1]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="keys must be int64"):
        call(k=tf.constant([1], tf.int32))
    with pytest.raises(tf.errors.InvalidArgumentError, match="hyper must be a vector of 11"):
        call(hyper=tf.ones([9]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="step must be a scalar"):
        call(st=tf.constant([1], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="'adam' keeps 2 slot tables"):
        call(slots=[other_dim], algorithm="adam")
    with pytest.raises(tf.errors.InvalidArgumentError, match="slot table 0 has dimension 5"):
        call(slots=[other_dim], algorithm="momentum")
    with pytest.raises(tf.errors.InvalidArgumentError, match="slot table 0 has dimension 4 and "
                                                             "keys int32"):
        call(slots=[int32_slot], algorithm="adagrad")
    missing = dynamic_ops.handle("a_slot_table_never_created")
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match="slot table 0 of the update does not exist"):
        dynamic_ops.sparse_apply(table.handle, [missing], keys, grads, h, step, "adagrad")
    # Nothing changed.
    np.testing.assert_array_equal(_rows(table, [1], tf.int64)[0][0], np.ones(DIM))


@pytest.mark.parametrize("name,make", [
    ("adam", lambda: tf.keras.optimizers.Adam(0.1)),
    ("ftrl", lambda: tf.compat.v1.train.FtrlOptimizer(0.1)),
    ("sgd", lambda: tf.keras.optimizers.SGD(0.1)),
    ("rmsprop", lambda: tf.keras.optimizers.RMSprop(0.1)),
    ("rmsprop_momentum_centered", lambda: tf.keras.optimizers.RMSprop(0.1, momentum=0.9,
                                                                      centered=True)),
    ("adadelta", lambda: tf.keras.optimizers.Adadelta(0.1)),
    ("adamax", lambda: tf.keras.optimizers.Adamax(0.1))])
def test_wrapper_fuses_dynamic_tables(name, make):
    """OptimizerWrapper updates a dynamic table through one
    SokDynamicSparseApply, for every algorithm and RMSprop's slot layouts
    (no find, scatter or unique op of its own)."""
    sok.init()
    table = sok.DynamicVariable(DIM, initializer="zeros")
    opt = sok.OptimizerWrapper(make())
    ids = tf.ragged.constant([[1, 2, 2], [3]], dtype=tf.int64)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            emb = sok.lookup_sparse(table, ids)
            loss = tf.reduce_sum(emb * emb)
        opt.apply_gradients([(tape.gradient(loss, table), table)])

    ops = [o.type for o in step.get_concrete_function().graph.get_operations()]
    fused = ops.count("SokDynamicSparseApply")
    # Every algorithm is fused; `name` is the kernel for its settings.
    assert opt._hp.kernel == name and name in fused_apply.fused_algorithms()
    assert fused == 1, ops
    # The lookup's own unique find-or-insert only.
    assert ops.count("SokDynamicTableUniqueFindOrInsert") == 1, ops
    assert not [t for t in ops if t in ("SokUnique", "SokDynamicTableFindOrInsert",
                                        "SokDynamicTableScatter", "SokDynamicTableFind")], ops


def test_a_graph_built_against_other_slot_lists_is_refused():
    """The dynamic tables' fused update checks the same lists: a node built
    with other slot names fails before the table changes."""
    table = _table(tf.int64, {1: np.ones(DIM, np.float32)})
    slots = [f"{a}:{','.join(s[::-1])}" for a, s in fused_apply.spec().slots.items()]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"the graph's slot_names \[.*'adam:v,m'.*\] differ"):
        library.load().sok_dynamic_sparse_apply(
            table=table.handle, keys=tf.constant([1], tf.int64), grads=tf.ones([1, DIM]),
            hyper=tf.constant(hyper()), step=tf.constant(1, tf.int64), slots=[],
            algorithm="sgd", slot_names=slots)
    np.testing.assert_array_equal(_rows(table, [1], tf.int64)[0][0], np.ones(DIM))
