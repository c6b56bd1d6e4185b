"""sok.OptimizerWrapper / sok.SGD against TensorFlow's own optimizers and numpy."""

import inspect
import re

import numpy as np
import pytest
import tensorflow as tf

import sok_graph as sok
from sok_graph import compat

V1 = tf.compat.v1.train

# TF1 optimizers whose sparse kernels update only the rows in the gradient,
# as sok's updates do: their results must agree row for row.
TF1_LAZY = {
    "sgd": lambda: V1.GradientDescentOptimizer(0.5),
    "momentum": lambda: V1.MomentumOptimizer(0.1, 0.9),
    "nesterov": lambda: V1.MomentumOptimizer(0.1, 0.9, use_nesterov=True),
    "adagrad": lambda: V1.AdagradOptimizer(0.3, initial_accumulator_value=0.2),
    "ftrl": lambda: V1.FtrlOptimizer(0.2, l1_regularization_strength=0.01,
                                     l2_regularization_strength=0.02),
    "ftrl_shrink": lambda: V1.FtrlOptimizer(0.2, l1_regularization_strength=0.01,
                                            l2_shrinkage_regularization_strength=0.05),
    "rmsprop": lambda: V1.RMSPropOptimizer(0.05),
    "rmsprop_momentum": lambda: V1.RMSPropOptimizer(0.05, momentum=0.5),
    "rmsprop_centered": lambda: V1.RMSPropOptimizer(0.05, centered=True),
    "adadelta": lambda: V1.AdadeltaOptimizer(1.0, rho=0.9, epsilon=1e-6),
}


def make_data(rng, rows=30, dim=4, batch=12, steps=5):
    table = rng.standard_normal((rows, dim)).astype(np.float32)
    batches = [tf.ragged.constant(
        [list(rng.integers(0, rows // 2, size=rng.integers(1, 4))) for _ in range(batch)],
        tf.int64) for _ in range(steps)]  # rows >= rows // 2 are never touched
    return table, batches


def loss_of(emb):
    return tf.reduce_sum(tf.square(emb - 0.3)) + tf.reduce_sum(emb)


def train_reference(make_opt, table, batches):
    # On the CPU: TensorFlow's sparse optimizers (ResourceSparseApplyMomentum,
    # ...RMSProp) have no GPU kernels.
    with tf.device("/CPU:0"):
        ref = tf.Variable(table)
        opt = make_opt()
        for ids in batches:
            with tf.GradientTape() as tape:
                loss = loss_of(tf.nn.embedding_lookup_sparse(ref, ids.to_sparse(), None,
                                                              combiner="sum"))
            opt.apply_gradients([(tape.gradient(loss, ref), ref)])
        return ref.numpy()


def train_sok(make_opt, var, batches, wrapper=None):
    opt = wrapper or sok.OptimizerWrapper(make_opt())
    for ids in batches:
        with tf.GradientTape() as tape:
            loss = loss_of(sok.lookup_sparse(var, ids, combiners="sum"))
        opt.apply_gradients([(tape.gradient(loss, var), var)])
    return opt


def dynamic_from(table):
    v = sok.DynamicVariable(table.shape[1], initializer="zeros")
    v.import_rows(tf.range(table.shape[0], dtype=tf.int64), tf.constant(table))
    return v


def rows_of(dyn, n):
    rows, found = dyn.find(tf.range(n, dtype=tf.int64))
    assert found.numpy().all()
    return rows.numpy()


@pytest.mark.parametrize("name", sorted(TF1_LAZY))
def test_tf1_optimizers_static_and_dynamic_match_tf(rng, name):
    table, batches = make_data(rng)
    expected = train_reference(TF1_LAZY[name], table, batches)
    static = sok.Variable(table)
    train_sok(TF1_LAZY[name], static, batches)
    np.testing.assert_allclose(static.numpy(), expected, rtol=1e-5, atol=1e-6)
    dyn = dynamic_from(table)
    train_sok(TF1_LAZY[name], dyn, batches)
    np.testing.assert_allclose(rows_of(dyn, 30), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(expected[15:], table[15:])  # untouched rows stay


KERAS_LAZY = {
    "sgd": lambda: tf.keras.optimizers.SGD(0.5),
    "adagrad": lambda: tf.keras.optimizers.Adagrad(0.3),
}


@pytest.mark.parametrize("name", sorted(KERAS_LAZY))
def test_keras_optimizers_match_keras(rng, name):
    table, batches = make_data(rng)
    expected = train_reference(KERAS_LAZY[name], table, batches)
    dyn = dynamic_from(table)
    train_sok(KERAS_LAZY[name], dyn, batches)
    np.testing.assert_allclose(rows_of(dyn, 30), expected, rtol=1e-5, atol=1e-6)


def train_recording_gradients(dyn, batches, apply):
    """Trains dynamic table `dyn` on `batches` (loss_of its lookup), each
    step's gradient given to apply(gradient); returns the gradients as
    (keys, float64 rows) for a numpy model."""
    grads = []
    for ids in batches:
        with tf.GradientTape() as tape:
            loss = loss_of(sok.lookup_sparse(dyn, ids, combiners="sum"))
        g = tape.gradient(loss, dyn)
        grads.append((g.indices.numpy(), g.values.numpy().astype(np.float64)))
        apply(g)
    return grads


def numpy_lazy_adam(table, grads, lr, b1, b2, eps, adamax=False):
    w = table.astype(np.float64).copy()
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t, (idx, g) in enumerate(grads, start=1):
        m[idx] = b1 * m[idx] + (1 - b1) * g
        if adamax:
            v[idx] = np.maximum(b2 * v[idx], np.abs(g))
            w[idx] -= lr / (1 - b1 ** t) * m[idx] / (v[idx] + eps)
        else:
            v[idx] = b2 * v[idx] + (1 - b2) * g * g
            alpha = lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
            w[idx] -= alpha * m[idx] / (np.sqrt(v[idx]) + eps)
    return w


@pytest.mark.parametrize("kind", ["keras_adam", "tf1_adam", "keras_adamax"])
def test_lazy_adam_family_matches_numpy(rng, kind):
    make = {"keras_adam": lambda: tf.keras.optimizers.Adam(0.05, epsilon=1e-7),
            "tf1_adam": lambda: V1.AdamOptimizer(0.05, epsilon=1e-8),
            "keras_adamax": lambda: tf.keras.optimizers.Adamax(0.05, epsilon=1e-7)}[kind]
    table, batches = make_data(rng)
    dyn = dynamic_from(table)
    opt = sok.OptimizerWrapper(make())
    grads = train_recording_gradients(dyn, batches, lambda g: opt.apply_gradients([(g, dyn)]))
    eps = 1e-8 if kind == "tf1_adam" else 1e-7
    expected = numpy_lazy_adam(table, grads, 0.05, 0.9, 0.999, eps, adamax=kind.endswith("max"))
    np.testing.assert_allclose(rows_of(dyn, 30), expected, rtol=1e-4, atol=1e-5)
    assert int(opt.iterations) == len(batches)


def test_duplicate_indices_are_summed(rng):
    v = sok.Variable(np.zeros((4, 2), np.float32))
    opt = sok.SGD(1.0)
    opt.apply_gradients([(tf.IndexedSlices(tf.ones([3, 2]), tf.constant([1, 1, 2], tf.int64)),
                          v)])
    np.testing.assert_array_equal(v.numpy(), [[0, 0], [-2, -2], [-1, -1], [0, 0]])


def test_repeated_dynamic_keys_are_summed(rng):
    """A dynamic table's gradient with a hot key repeated many times (a
    Zipf stream's; its 5000 repeats are several pieces of the segment sum):
    each key updated once by the sum of its rows (numpy's)."""
    table = sok.DynamicVariable(dimension=3, initializer="zeros")
    keys = np.concatenate([np.full(5000, 7), rng.integers(0, 50, 300), [2 ** 40]]).astype(np.int64)
    rng.shuffle(keys)
    grads = rng.normal(size=(len(keys), 3)).astype(np.float32)
    table.sparse_read(tf.constant(np.unique(keys)))  # every key gets a row first
    sok.SGD(1.0).apply_gradients([(tf.IndexedSlices(tf.constant(grads), tf.constant(keys)),
                                    table)])
    distinct = np.unique(keys)
    expected = -np.stack([grads[keys == k].sum(0) for k in distinct])
    np.testing.assert_allclose(table.sparse_read(tf.constant(distinct)).numpy(), expected,
                               rtol=1e-4, atol=1e-4)


def test_other_variables_go_to_the_wrapped_optimizer(rng):
    dense = tf.Variable([1.0, 2.0])
    table = sok.Variable(np.ones((3, 2), np.float32))
    opt = sok.OptimizerWrapper(tf.keras.optimizers.SGD(0.5))
    opt.apply_gradients([(tf.constant([1.0, 1.0]), dense),
                         (tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0], tf.int64)), table)])
    np.testing.assert_allclose(dense.numpy(), [0.5, 1.5])
    np.testing.assert_allclose(table.numpy(), [[0.5, 0.5], [1, 1], [1, 1]])


def test_tf_function_training(rng):
    table, batches = make_data(rng)
    expected = train_reference(TF1_LAZY["adagrad"], table, batches)
    dyn = dynamic_from(table)
    opt = sok.OptimizerWrapper(TF1_LAZY["adagrad"]())
    spec = tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1)

    @tf.function(input_signature=[spec])
    def step(ids):
        with tf.GradientTape() as tape:
            loss = loss_of(sok.lookup_sparse(dyn, ids, combiners="sum"))
        opt.apply_gradients([(tape.gradient(loss, dyn), dyn)])
        return loss

    for ids in batches:
        step(ids)
    np.testing.assert_allclose(rows_of(dyn, 30), expected, rtol=1e-5, atol=1e-6)


def test_graph_mode_session_training(rng):
    table, batches = make_data(rng)
    expected = train_reference(TF1_LAZY["ftrl"], table, batches)
    graph = tf.Graph()
    with graph.as_default():
        dyn = sok.DynamicVariable(4, initializer="zeros")
        load = dyn.import_rows(tf.range(30, dtype=tf.int64), tf.constant(table))
        values = tf.compat.v1.placeholder(tf.int64, [None])
        splits = tf.compat.v1.placeholder(tf.int64, [None])
        ids = tf.RaggedTensor.from_row_splits(values, splits)
        loss = loss_of(sok.lookup_sparse(dyn, ids, combiners="sum"))
        (grad,) = tf.gradients(loss, [dyn.handle])
        train = sok.OptimizerWrapper(TF1_LAZY["ftrl"]()).apply_gradients([(grad, dyn)])
        # The keys' gradient has distinct indices by construction: deduplicated
        # once, by the lookup (with the table's find-or-insert), not again by
        # the update.
        uniques = [op for op in graph.get_operations()
                   if op.type in ("SokUnique", "SokDynamicTableUniqueFindOrInsert")]
        assert [op.type for op in uniques] == ["SokDynamicTableUniqueFindOrInsert"], [
            op.name for op in uniques]
        read = dyn.find(tf.range(30, dtype=tf.int64))[0]
        init = tf.compat.v1.global_variables_initializer()
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(init)
            sess.run(load)
            for b in batches:
                sess.run(train, {values: b.values.numpy(), splits: b.row_splits.numpy()})
            got = sess.run(read)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_indices_distinct_by_construction():
    from sok_graph.ops.util import distinct_by_construction as _distinct_by_construction

    with tf.Graph().as_default():
        keys = tf.compat.v1.placeholder(tf.int64, [None])
        unique, idx = tf.unique(keys)
        positions = tf.unique(tf.compat.v1.placeholder(tf.int32, [None]))[0]
        assert _distinct_by_construction(unique)
        assert _distinct_by_construction(tf.identity(unique))
        assert _distinct_by_construction(tf.gather(unique, positions))
        assert not _distinct_by_construction(idx)  # positions of repeated keys
        assert not _distinct_by_construction(keys)
        # Distinct values gathered at positions that may repeat, or values
        # that may repeat gathered at distinct positions: not distinct.
        assert not _distinct_by_construction(tf.gather(unique, tf.constant([0, 0])))
        assert not _distinct_by_construction(tf.gather(keys, positions))
        # Along another axis a gather repeats nothing it takes, but is not the
        # case recognised: conservative.
        assert not _distinct_by_construction(tf.gather(unique[None], positions, axis=1))


def test_duplicate_keys_through_sparse_read_are_summed(rng):
    """A dynamic table read with repeated keys (not deduplicated by a
    lookup): its gradient's indices repeat and are summed before the update,
    in graph mode too."""
    graph = tf.Graph()
    with graph.as_default():
        dyn = sok.DynamicVariable(2, initializer="zeros")
        keys = tf.constant([5, 7, 5, 5], tf.int64)
        loss = tf.reduce_sum(dyn.sparse_read(keys) * tf.constant([[1.0, 2.0]]))
        (grad,) = tf.gradients(loss, [dyn.handle])
        train = sok.OptimizerWrapper(V1.GradientDescentOptimizer(1.0)).apply_gradients(
            [(grad, dyn)])
        read = dyn.find(tf.constant([5, 7], tf.int64))[0]
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            got = sess.run(read)
    np.testing.assert_allclose(got, [[-3.0, -6.0], [-1.0, -2.0]])


def test_slots_of_evicted_keys_are_dropped():
    v = sok.DynamicVariable(2, var_type="hybrid", init_capacity=4, max_capacity=4,
                            initializer="zeros")
    opt = sok.OptimizerWrapper(V1.AdagradOptimizer(0.1, initial_accumulator_value=1.0))

    def step(keys):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v.sparse_read(tf.constant(keys, tf.int64)))
        opt.apply_gradients([(tape.gradient(loss, v), v)])

    step([1, 2, 3, 4])
    step([1, 2, 3, 4])  # accumulators of 1..4: 1 + 2 * 1^2 = 3
    acc = opt.get_slot(v, "accumulator")
    keys = lambda t: set(t.export()[0].numpy().tolist())  # noqa: E731
    step([5, 6])  # evicts 1 and 2 (least recently used) from v, and so from its slot
    assert keys(v) == keys(acc) == {3, 4, 5, 6}
    step([1])  # 1 comes back: its accumulator starts afresh at 1 + 1^2 = 2
    rows, found = acc.find(tf.constant([1, 4], tf.int64))
    assert found.numpy().all()
    np.testing.assert_allclose(rows.numpy(), [[2.0, 2.0], [3.0, 3.0]])
    assert keys(v) == keys(acc)


@pytest.mark.parametrize("fused", [True, False])
def test_slots_of_evicted_keys_are_dropped_in_a_tf1_session(fused):
    """TF1 graph mode builds the read before apply_gradients makes the
    slots: the slots still drop the keys each step's read evicts, so a key
    that comes back starts its accumulator afresh, as eagerly (fused: the
    SokDynamicSparseApply path; else the wrapper's find/scatter path)."""
    with tf.Graph().as_default():
        v = sok.DynamicVariable(2, var_type="hybrid", init_capacity=4, max_capacity=4,
                                initializer="zeros")
        opt = sok.OptimizerWrapper(V1.AdagradOptimizer(0.1, initial_accumulator_value=1.0),
                                   update_all_rows=False)
        if not fused:
            opt._fusable = lambda var: False  # the wrapper's own row updates
        keys = tf.compat.v1.placeholder(tf.int64, [None])
        loss = tf.reduce_sum(v.sparse_read(keys))
        train = opt.apply_gradients([(tf.compat.v1.gradients(loss, [v])[0], v)])
        acc = opt.get_slot(v, "accumulator")
        from sok_graph.ops import dynamic as dynamic_ops

        exported = [dynamic_ops.export(t.handle, tf.int64, 2)[0] for t in (v, acc)]
        found = acc.find(tf.constant([1, 4], tf.int64))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for batch in ([1, 2, 3, 4], [1, 2, 3, 4], [5, 6]):
                sess.run(train, {keys: batch})
            table_keys, slot_keys = (set(k.tolist()) for k in sess.run(exported))
            assert table_keys == slot_keys == {3, 4, 5, 6}
            sess.run(train, {keys: [1]})  # 1 comes back: 1 + 1^2 = 2
            rows, present = sess.run(found)
            assert present.all()
            np.testing.assert_allclose(rows, [[2.0, 2.0], [3.0, 3.0]])
            table_keys, slot_keys = (set(k.tolist()) for k in sess.run(exported))
            assert table_keys == slot_keys


WRITES = {
    "sok.assign": lambda v, k, r: sok.assign(v, k, r),
    "scatter_update": lambda v, k, r: v.scatter_update(tf.IndexedSlices(r, k)),
    "scatter_add": lambda v, k, r: v.scatter_add(k, r),
    "import_rows": lambda v, k, r: v.import_rows(k, r),
}


@pytest.mark.parametrize("graph,writes_first", [(False, False), (True, False), (True, True)],
                         ids=["eager", "session", "session_writes_built_before_the_slots"])
@pytest.mark.parametrize("write", sorted(WRITES))
def test_slots_of_keys_a_write_evicts_are_dropped(write, graph, writes_first):
    """A write of a new key into a full table evicts the least recently
    used key (1): its slot rows go too, so when it comes back its
    accumulator starts afresh (it came back with its old one, 3 + 1 where
    a fresh one gives 1 + 1). A write that evicts nothing drops nothing.
    In a graph also a write built before the optimizer made its slots (it
    dropped nothing from them)."""
    def build():
        v = sok.DynamicVariable(2, var_type="hybrid", init_capacity=4, max_capacity=4,
                                initializer="zeros")
        opt = sok.OptimizerWrapper(V1.AdagradOptimizer(0.1, initial_accumulator_value=1.0))
        keys = tf.compat.v1.placeholder(tf.int64, [None]) if graph else None

        def step(batch):
            ids = keys if graph else tf.constant(batch, tf.int64)
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(v.sparse_read(ids))
            return opt.apply_gradients([(tape.gradient(loss, v), v)])

        return v, opt, keys, step

    rows = [[0.5, 0.5]]
    if not graph:
        v, opt, _, step = build()
        for batch in ([1, 2, 3, 4], [1, 2, 3, 4], [2, 3, 4]):
            step(batch)
        acc = opt.get_slot(v, "accumulator")
        WRITES[write](v, tf.constant([3], tf.int64), rows)  # held: evicts nothing
        assert set(acc.export()[0].numpy().tolist()) == {1, 2, 3, 4}
        WRITES[write](v, tf.constant([9], tf.int64), rows)
        assert set(v.export()[0].numpy().tolist()) == {2, 3, 4, 9}
        assert set(acc.export()[0].numpy().tolist()) == {2, 3, 4}
        step([1])  # evicts 2, the least recently used (of 2 and 4, the smaller key)
        got = acc.find(tf.constant([1, 4], tf.int64))[0].numpy()
    else:
        with tf.Graph().as_default():
            v, opt, keys, step = build()
            if writes_first:
                held = WRITES[write](v, tf.constant([3], tf.int64), rows)
                new = WRITES[write](v, tf.constant([9], tf.int64), rows)
            train = step(None)
            acc = opt.get_slot(v, "accumulator")
            if not writes_first:
                held = WRITES[write](v, tf.constant([3], tf.int64), rows)
                new = WRITES[write](v, tf.constant([9], tf.int64), rows)
            from sok_graph.ops import dynamic as dynamic_ops

            slot_keys = dynamic_ops.export(acc.handle, tf.int64, 2)[0]
            found = acc.find(tf.constant([1, 4], tf.int64))[0]
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                for batch in ([1, 2, 3, 4], [1, 2, 3, 4], [2, 3, 4]):
                    sess.run(train, {keys: batch})
                sess.run(held)
                assert set(sess.run(slot_keys).tolist()) == {1, 2, 3, 4}
                sess.run(new)
                assert set(sess.run(slot_keys).tolist()) == {2, 3, 4}
                sess.run(train, {keys: [1]})
                got = sess.run(found)
    # key 1 afresh: 1 + 1^2; key 4 read three times: 1 + 3 * 1^2
    np.testing.assert_allclose(got, [[2.0, 2.0], [4.0, 4.0]])


def test_a_clear_built_before_the_slots_empties_them():
    """In a graph, a table's clear() op built before the optimizer made its
    slot tables empties them too when it runs (it emptied only the slots
    made before it was built, so a key that came back kept its old
    accumulator: 3 + 1 where a fresh one gives 1 + 1)."""
    from sok_graph.ops import dynamic as dynamic_ops

    with tf.Graph().as_default():
        v = sok.DynamicVariable(2, initializer="zeros")
        clear = v.clear()
        keys = tf.compat.v1.placeholder(tf.int64, [None])
        opt = sok.OptimizerWrapper(V1.AdagradOptimizer(0.1, initial_accumulator_value=1.0))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v.sparse_read(keys))
        train = opt.apply_gradients([(tape.gradient(loss, v), v)])
        acc = opt.get_slot(v, "accumulator")
        slot_keys = dynamic_ops.export(acc.handle, tf.int64, 2)[0]
        found = acc.find(tf.constant([1], tf.int64))[0]
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(2):
                sess.run(train, {keys: [1, 2]})
            sess.run(clear)
            assert sess.run(slot_keys).size == 0 and sess.run(v.size)[0] == 0
            sess.run(train, {keys: [1]})
            np.testing.assert_allclose(sess.run(found), [[2.0, 2.0]])


def _keras_optimizers_with_slots():
    """Keras 3's optimizers, or Keras 2's OptimizerV2 ones (the legacy
    optimizers sok.init selects, as SOK does); None where neither."""
    if compat.KERAS_MAJOR_VERSION >= 3:
        return tf.keras.optimizers
    return getattr(tf.keras.optimizers, "legacy", None)


@pytest.mark.skipif(_keras_optimizers_with_slots() is None,
                    reason="Keras 3 or Keras 2's legacy optimizers (TF 2.11 on)")
@pytest.mark.parametrize("make", [lambda k: k.Adam(0.1), lambda k: k.Adagrad(0.1),
                                  lambda k: k.SGD(0.1, momentum=0.9)],
                         ids=["adam", "adagrad", "momentum"])
def test_a_keras_optimizer_outside_the_scope_names_the_dynamic_table(make):
    """A Keras optimizer with slots given a DynamicVariable's gradient
    outside sok.OptimizerScope failed with "Shapes used to initialize
    variables must be fully-defined ... shape=(None, 2)" (Keras 3) or
    "'DynamicVariable' object has no attribute '_distribute_strategy'"
    (Keras 2's OptimizerV2), naming neither the table nor the scope. The
    table is left as it was."""
    v = sok.DynamicVariable(2, name="items", initializer="ones")
    ids = tf.ragged.constant([[1, 2]], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(sok.lookup_sparse(v, ids, combiners="sum"))
    grads = tape.gradient(loss, [v])
    # Keras 3 refuses it while making slots; Keras 2's apply_gradients
    # before anything (v1/optimizers.py, _refusing_outside_scope).
    with pytest.raises(NotImplementedError, match=r"DynamicVariable 'items': (making an? "
                                                  r"(Keras )?optimizer's slot variables|"
                                                  r"\w+\.apply_gradients cannot update a "
                                                  r"dynamic table).*sok.OptimizerScope"):
        make(_keras_optimizers_with_slots()).apply_gradients(zip(grads, [v]))
    np.testing.assert_array_equal(v.sparse_read(tf.constant([1, 2], tf.int64)).numpy(),
                                  np.ones((2, 2)))


@pytest.mark.skipif(not tf.executing_eagerly(), reason="Keras optimizers eagerly")
@pytest.mark.parametrize("route", ["wrapper", "scope"])
@pytest.mark.parametrize("rate", ["schedule", "callable"])
def test_a_keras_optimizers_rate_replaced_between_steps_trains_sok_rows_as_keras_does(route,
                                                                                     rate):
    """`opt.learning_rate = schedule` (or a callable) replaces the object
    the optimizer reads its rate from; the rows of sok tables kept the one
    read when the wrapper was made (or at the scope's first step): a
    schedule switched to after one step left them at the first rate (0.9
    off Keras' own rows after three steps). The reference: the same
    optimizer class on a tf.Variable. (Keras 2 cannot take a callable in
    place of a rate it holds in a variable.)"""
    if rate == "callable" and compat.KERAS_MAJOR_VERSION < 3:
        pytest.skip("Keras 2 assigns a new rate into its variable: a callable is refused")
    sok.init(comm_tool="none")
    start = np.random.default_rng(0).normal(size=[6, 3]).astype(np.float32)
    ids = tf.constant([0, 2, 5], tf.int64)

    def new_rate():
        if rate == "callable":
            return lambda: 0.05
        return tf.keras.optimizers.schedules.ExponentialDecay(1.0, 1, 0.5)

    def train(table, apply):
        opt = tf.keras.optimizers.SGD(0.1)
        wrapper = sok.OptimizerWrapper(opt) if route == "wrapper" else None
        for step in range(3):
            if step == 1:
                opt.learning_rate = new_rate()
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(tf.gather(table, ids)))
            grads = tape.gradient(loss, [table])
            apply(opt, wrapper, zip(grads, [table]))
        return table.numpy()

    def keras_apply(opt, wrapper, pairs):
        opt.apply_gradients(pairs)

    def sok_apply(opt, wrapper, pairs):
        if wrapper is not None:
            wrapper.apply_gradients(pairs)
        else:
            with sok.OptimizerScope([table]):
                opt.apply_gradients(pairs)

    want = train(tf.Variable(start), keras_apply)
    table = sok.Variable(start)
    np.testing.assert_allclose(train(table, sok_apply), want, rtol=1e-6, atol=1e-7)


@pytest.mark.skipif(not tf.executing_eagerly(), reason="Keras optimizers eagerly")
def test_a_keras_optimizer_counts_the_steps_it_gives_only_sok_tables():
    """Inside OptimizerScope, a Keras optimizer whose every variable is a
    sok table left its `iterations` at 0 (a matrix factorisation trained
    with fit: 16 steps, iterations 0), which callbacks and checkpoints read."""
    v = sok.DynamicVariable(2, initializer="ones")
    s = sok.Variable(np.ones([4, 2], np.float32))
    opt = tf.keras.optimizers.SGD(0.1)

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v.sparse_read(ids)) + tf.reduce_sum(tf.gather(s, ids))
        grads = tape.gradient(loss, [v, s])
        with sok.OptimizerScope([v, s]):
            opt.apply_gradients(zip(grads, [v, s]))

    for _ in range(3):
        step(tf.constant([1, 2], tf.int64))
    with sok.OptimizerScope([v]):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v.sparse_read(tf.constant([3], tf.int64)))
        opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
    assert int(opt.iterations.numpy()) == 4


@pytest.mark.skipif(not hasattr(tf.keras.mixed_precision, "LossScaleOptimizer"),
                    reason="tf.keras.mixed_precision.LossScaleOptimizer (TF 2.4 on)")
def test_a_loss_scale_optimizer_is_refused_saying_what_to_do():
    """Under a mixed_float16 policy compile() wraps the optimizer in a
    LossScaleOptimizer; given to the wrapper (or routed by OptimizerScope
    in fit) it was refused as an unsupported optimizer, with no word of
    mixed precision or of the way out."""
    inner = tf.keras.optimizers.SGD(0.1)
    scaled = tf.keras.mixed_precision.LossScaleOptimizer(inner)
    with pytest.raises(TypeError, match=r"not mixed precision's LossScaleOptimizer\w*.*divide "
                                        r"them by its loss scale.*"
                                        r"sok.OptimizerWrapper\(optimizer.inner_optimizer\) "
                                        r"only where they are all finite"):
        sok.OptimizerWrapper(scaled)
    sok.OptimizerWrapper(scaled.inner_optimizer)  # the way out


_KERAS_2_ADAMS = {"new": lambda: tf.keras.optimizers.Adam(0.05),
                  "legacy": lambda: tf.keras.optimizers.legacy.Adam(0.05)}


@pytest.mark.skipif(not hasattr(tf.keras.mixed_precision, "LossScaleOptimizer")
                    or compat.KERAS_MAJOR_VERSION >= 3,
                    reason="Keras 2's LossScaleOptimizer (TF 2.4 on); Keras 3's is refused by "
                           "sok.OptimizerScope, test_a_loss_scale_optimizer_is_refused_saying_"
                           "what_to_do")
@pytest.mark.parametrize("kind", sorted(_KERAS_2_ADAMS))
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf_function"])
def test_adam_under_a_loss_scale_optimizer_counts_its_steps_as_keras_does(rng, graph, kind):
    """Keras 2's LossScaleOptimizer(Adam) applying gradients to sok tables
    (routed by sok.OptimizerScope to the inner Adam) and to a tf.Variable of
    the same rows, with a step of non-finite gradients, which it skips:
    every row ends as the tf.Variable's. Keras counts the skipped step in
    Adam's `iterations`; the tables' step did not, so their bias correction
    lagged a step. With the new Adam the LossScaleOptimizer built the inner
    Adam for the tables too: a ValueError for a dynamic table, Adam slots
    the size of a static one."""
    if kind == "legacy" and not hasattr(tf.keras.optimizers, "legacy"):
        pytest.skip("no tf.keras.optimizers.legacy before TF 2.11")
    table = rng.standard_normal((6, 3)).astype(np.float32)
    updates = [rng.standard_normal((6, 3)).astype(np.float32) for _ in range(5)]
    updates[2][1, 0] = np.inf  # the skipped step
    opt = tf.keras.mixed_precision.LossScaleOptimizer(_KERAS_2_ADAMS[kind](), initial_scale=1.0)
    static, dynamic, plain = sok.Variable(table), dynamic_from(table), tf.Variable(table)
    keys = tf.constant([3, 0, 5, 1, 4, 2], tf.int64)  # every row each step

    def step(update):
        rows = tf.gather(update, keys)
        pairs = [(tf.IndexedSlices(rows, keys), v) for v in (static, dynamic)]
        pairs.append((tf.IndexedSlices(rows, keys), plain))
        with sok.OptimizerScope([static, dynamic]):
            opt.apply_gradients(pairs)

    run = tf.function(step) if graph else step
    for update in updates:
        run(tf.constant(update))
    want = plain.numpy()
    assert not np.allclose(want, table)
    np.testing.assert_allclose(static.numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rows_of(dynamic, 6), want, rtol=1e-5, atol=1e-6)
    # Adam's own slots: the tf.Variable's only (the tables' are the wrapper's).
    slots = [v for v in opt.variables() if v.shape.rank]
    assert [tuple(v.shape) for v in slots] == [(6, 3), (6, 3)], slots


def test_bad_optimizers():
    with pytest.raises(TypeError, match="must be a tf.compat.v1.train or Keras optimizer"):
        sok.OptimizerWrapper(object())
    with pytest.raises(TypeError, match="supports SGD, Momentum.*got Nadam"):
        sok.OptimizerWrapper(tf.keras.optimizers.Nadam())
    # Routed by sok.OptimizerScope, the refusal names the tables too (it
    # named only the wrapper and the optimizer).
    v = sok.Variable(np.zeros((4, 2), np.float32), name="routed_table")
    grads = [(tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1], tf.int64)), v)]
    with pytest.raises(TypeError, match=r"sok.OptimizerScope routes the gradients of sok tables "
                                        r"\['routed_table.*'\] to Nadam, which cannot update "
                                        r"them: .*supports SGD, Momentum.*got Nadam"):
        with sok.OptimizerScope([v]):
            tf.keras.optimizers.Nadam().apply_gradients(grads)
    np.testing.assert_array_equal(v.numpy(), np.zeros((4, 2), np.float32))


@pytest.mark.parametrize("make", [
    lambda: V1.AdamOptimizer(0.05),
    lambda: tf.keras.optimizers.Adam(0.05),
    lambda: tf.keras.optimizers.Adamax(0.05),
], ids=["tf1_adam", "keras_adam", "keras_adamax"])
def test_adam_equals_tensorflow_when_every_row_is_touched(rng, make):
    """Lazy and dense Adam agree when each step touches every row: then sok's
    result must equal TensorFlow's own Adam."""
    table = rng.standard_normal((8, 3)).astype(np.float32)
    batches = [tf.ragged.constant([list(rng.permutation(8)[:5]), list(range(8))], tf.int64)
               for _ in range(6)]
    expected = train_reference(make, table, batches)
    for var in (sok.Variable(table), dynamic_from(table)):
        train_sok(make, var, batches)
        got = var.numpy() if not isinstance(var, sok.DynamicVariable) else rows_of(var, 8)
        np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-6)


def _keras_optimizer_with(option):
    """A Keras optimizer with one option the sparse row updates do not apply,
    on whichever Keras this TensorFlow has (None where it has no such option)."""
    keras = tf.keras.optimizers
    if option == "weight_decay":
        cls = getattr(keras, "AdamW", None) or getattr(getattr(keras, "experimental", None),
                                                       "AdamW", None)
        return None if cls is None else cls(0.01, weight_decay=0.1)
    try:
        return keras.SGD(0.1, **{option: 0.001 if option != "use_ema" else True})
    except (TypeError, ValueError):
        return None


@pytest.mark.parametrize("option", ["weight_decay", "clipnorm", "clipvalue", "global_clipnorm",
                                    "use_ema"])
def test_keras_options_not_applied_to_rows_are_refused(option):
    """SGD(clipnorm=0.001) used to move a row by the whole gradient: an
    option the sparse update would ignore is an error naming it."""
    opt = _keras_optimizer_with(option)
    if opt is None or getattr(opt, option, None) in (None, False, 0):
        pytest.skip(f"this Keras has no {option} option on its optimizers")
    v = sok.Variable(np.zeros((4, 2), np.float32))
    grads = [(tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1], tf.int64)), v)]
    # Keras 2's AdamW is no Adam subclass: refused as an unsupported optimizer.
    refusal = f"does not apply .*{option}=|supports SGD.*got AdamW"
    with pytest.raises((ValueError, TypeError), match=refusal):
        sok.OptimizerWrapper(opt).apply_gradients(grads)
    np.testing.assert_array_equal(v.numpy(), np.zeros((4, 2), np.float32))


@pytest.mark.parametrize("option", ["clipnorm", "global_clipnorm", "clipvalue"])
def test_a_keras_option_set_after_the_wrapper_was_made_is_refused(option):
    """opt.clipnorm = 0.1 after sok.OptimizerWrapper(opt) (or after a first
    step inside sok.OptimizerScope): the sok rows used to move by the
    unclipped gradient while Keras clipped the dense weights, without an
    error (the wrapper looked at the options once, when it was made)."""
    opt = tf.keras.optimizers.SGD(0.1)
    if not hasattr(opt, option):
        pytest.skip(f"this Keras has no {option} option on its optimizers")
    _refused_when_set_after_a_step(opt, option, 0.001, f"does not apply .*{option}=")


def _refused_when_set_after_a_step(opt, attribute, value, words):
    """A wrapper of `opt` takes a step on a sok table; then opt.<attribute> =
    value, and the next step is a ValueError matching `words`, the rows as
    the first step left them."""
    v = sok.Variable(np.zeros((4, 2), np.float32))
    grads = [(tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1], tf.int64)), v)]
    wrapper = sok.OptimizerWrapper(opt)
    wrapper.apply_gradients(grads)
    moved = v.numpy()
    assert np.all(moved[1] < 0), moved  # the first step moved the row
    setattr(opt, attribute, value)
    with pytest.raises(ValueError, match=words):
        wrapper.apply_gradients(grads)
    np.testing.assert_array_equal(v.numpy(), moved)


def test_an_optimizer_subclass_with_its_own_update_is_refused():
    """A subclass of a supported optimizer that computes its updates its own
    way (tf.contrib.opt's AdamWOptimizer, NadamOptimizer, AdaMaxOptimizer on
    TF 1.15: an Adam subclass) was trained by the base class's rule, its own
    update ignored without an error. A subclass that changes nothing of the
    update (here: its constructor) is the base class's algorithm."""

    class OwnUpdate(tf.compat.v1.train.AdamOptimizer):
        def _apply_sparse(self, grad, var):  # noqa: D401 (stands for a changed rule)
            return super()._apply_sparse(grad, var)

    class OwnDefaults(tf.compat.v1.train.AdamOptimizer):
        def __init__(self):
            super().__init__(0.5)

    v = sok.Variable(np.zeros((4, 2), np.float32))
    grads = [(tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1], tf.int64)), v)]
    with pytest.raises(TypeError, match="update sok rows by AdamOptimizer's rule; OwnUpdate "
                                        "derives from it but computes its updates its own way "
                                        r"\(OwnUpdate defines _apply_sparse\)"):
        sok.OptimizerWrapper(OwnUpdate(0.1))
    wrapper = sok.OptimizerWrapper(OwnDefaults())
    assert wrapper.algorithm == "adam"
    wrapper.apply_gradients(grads)
    # Adam's first step moves a row by the rate, against the gradient's sign.
    np.testing.assert_allclose(v.numpy()[1], [-0.5, -0.5], rtol=1e-5)


@pytest.mark.skipif(compat.KERAS_MAJOR_VERSION < 2, reason="Keras optimizers' flags")
@pytest.mark.parametrize("optimizer, flag", [("SGD", "nesterov"), ("RMSprop", "centered"),
                                             ("Adam", "amsgrad")])
def test_a_keras_flag_set_after_the_wrapper_was_made_is_refused(optimizer, flag):
    """opt.nesterov = True (centered, amsgrad) after sok.OptimizerWrapper(opt):
    the sok rows kept the update and slots chosen when the wrapper was made
    (rows 1.99 off the reference after a few steps of nesterov), without an
    error."""
    kwargs = {"momentum": 0.9} if optimizer == "SGD" else {}
    opt = getattr(tf.keras.optimizers, optimizer)(0.1, **kwargs)
    if not hasattr(opt, flag):
        pytest.skip(f"this Keras' {optimizer} has no {flag}")
    words = "does not support Adam\\(amsgrad=True\\)" if flag == "amsgrad" else \
        f"{optimizer}'s {flag} is True now and was False when sok.OptimizerWrapper was made"
    _refused_when_set_after_a_step(opt, flag, True, words)


def _keras2_module():
    """Keras 2's OptimizerV2 optimizers: tf.keras.optimizers.legacy (TF 2.11
    to 2.15), tf.keras.optimizers before it; None under Keras 3."""
    legacy = compat.legacy_optimizers_module()
    if legacy is not None:
        return legacy
    return tf.keras.optimizers if compat.KERAS_MAJOR_VERSION < 3 else None


@pytest.mark.parametrize("option", ["decay", "loss_scale_factor"])
def test_keras_learning_rate_decay_and_loss_scale_are_refused(option):
    """Keras 2's SGD(decay=0.5) shrinks the learning rate every step and
    Keras 3's loss_scale_factor divides the gradients; the sparse updates
    applied neither (a row moved by the undecayed, unscaled step): refused,
    naming the option, before anything moves."""
    if option == "decay":
        module = _keras2_module()
        if module is None:
            pytest.skip("Keras 3 optimizers have no decay option")
        opt = module.SGD(0.1, decay=0.5)
    else:
        if compat.KERAS_MAJOR_VERSION < 3:
            pytest.skip("Keras 2 optimizers have no loss_scale_factor option")
        opt = tf.keras.optimizers.SGD(0.1, loss_scale_factor=4.0)
    v = sok.Variable(np.zeros((4, 2), np.float32))
    grads = [(tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1], tf.int64)), v)]
    with pytest.raises(ValueError, match=f"does not apply .*{option}="):
        sok.OptimizerWrapper(opt).apply_gradients(grads)
    np.testing.assert_array_equal(v.numpy(), np.zeros((4, 2), np.float32))


def test_a_native_optimizers_decay_is_refused_when_it_updates_sok_rows():
    """Keras 2's SGD(decay=0.5) may train sok variables itself (every
    option applied) and be dumped with them; under sok.OptimizerScope its
    sok rows would be updated by sok_graph, which ignores decay: refused
    there, before anything changes."""
    module = _keras2_module()
    if module is None:
        pytest.skip("Keras 3 optimizers have no decay option")
    opt = module.SGD(0.1, decay=0.5)
    v = sok.DynamicVariable(dimension=2, initializer="1")
    keys = tf.constant([1, 4], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(v, keys))
    grads = tape.gradient(loss, [v])
    with pytest.raises(ValueError, match="does not apply .*decay="):
        with sok.OptimizerScope([v]):
            opt.apply_gradients(zip(grads, [v]))
    np.testing.assert_array_equal(v.find(keys)[0].numpy(), np.ones((2, 2)))


def test_ftrl_shrinkage_and_beta_match_tf(rng):
    """Ftrl's l2 shrinkage (Keras 2 keeps it private) and the TF1 optimizer's
    beta (kept as _beta) reach the sparse update: rows as TensorFlow's own
    optimizer trains them. (Keras 3's Ftrl updates every row of a variable
    densely, so it is no reference for a row-wise update.)"""
    module = _keras2_module()
    makers = {}
    if module is not None:
        makers["keras shrinkage"] = lambda: module.Ftrl(
            0.2, l1_regularization_strength=0.01, l2_shrinkage_regularization_strength=0.5)
    if "beta" in inspect.signature(V1.FtrlOptimizer.__init__).parameters:  # not in TF 1.15
        makers["tf1 beta"] = lambda: V1.FtrlOptimizer(0.2, l1_regularization_strength=0.01,
                                                      beta=0.5)
    if not makers:
        pytest.skip("this TensorFlow has neither Keras 2's Ftrl nor the TF1 Ftrl's beta")
    for name, make in makers.items():
        table, batches = make_data(rng)
        expected = train_reference(make, table, batches)
        dyn = dynamic_from(table)
        train_sok(make, dyn, batches)
        np.testing.assert_allclose(rows_of(dyn, 30), expected, rtol=1e-5, atol=1e-6,
                                   err_msg=name)


def test_keras_options_left_at_their_defaults_are_accepted():
    v = sok.Variable(np.zeros((4, 2), np.float32))
    opt = sok.OptimizerWrapper(tf.keras.optimizers.SGD(1.0))
    opt.apply_gradients([(tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1], tf.int64)), v)])
    np.testing.assert_array_equal(v.numpy()[1], [-1.0, -1.0])


def test_a_static_tables_gradient_is_refused_for_a_dynamic_table():
    """A gradient of row numbers (a static table's, with its dense_shape)
    given to a DynamicVariable raises instead of inserting the row numbers
    as keys."""
    static = sok.Variable(np.ones((10, 4), np.float32))
    dynamic = sok.DynamicVariable(4, initializer="zeros")
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(sok.lookup_sparse([static], [tf.ragged.constant([[1, 2]], tf.int64)],
                                               combiners=["sum"])[0])
    grad = tape.gradient(loss, [static])[0]
    assert isinstance(grad, tf.IndexedSlices)
    opt = sok.OptimizerWrapper(tf.keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match="addressed by key.*dense_shape"):
        opt.apply_gradients([(grad, dynamic)])
    assert int(dynamic.size[0]) == 0


def _one_step(opt, dynamic):
    """(rows of keys 1 and 3, the plain variable, the step) after
    opt.apply_gradients of a gradient of ones for key 1 of a table of ones
    and of a plain variable, or the exception it raised with them."""
    if dynamic:
        table = sok.DynamicVariable(2, initializer="ones")
        table.sparse_read(tf.constant([1, 3], tf.int64))  # the rows a lookup gives them
        grad = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1], tf.int64))
    else:
        table = sok.Variable(np.ones((4, 2), np.float32))
        grad = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1], tf.int64),
                                tf.constant([4, 2], tf.int64))
    plain = tf.Variable([1.0, 1.0])
    error = None
    try:
        opt.apply_gradients([(grad, table), (tf.ones([2]), plain)])
    except (TypeError, ValueError) as e:
        error = e
    rows = (table.find(tf.constant([1, 3], tf.int64))[0] if dynamic
            else tf.gather(table, [1, 3])).numpy().tolist()
    return rows, plain.numpy().tolist(), int(opt.iterations.numpy()), error


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("make,exc,pattern", [
    # A vector: sok.optimizers.Adam applied one rate per column, the fused
    # updates failed in a Pack of the hyperparameters.
    (lambda: sok.SGD(tf.constant([0.1, 0.2])), ValueError,
     r"^sok.SGD: learning_rate must be a scalar; got a \w+ of shape \[2\]"),
    (lambda: sok.optimizers.Adam(tf.constant([0.1, 0.2])), ValueError,
     r"^Adam: learning_rate must be a scalar; got a \w+ of shape \[2\]"),
    (lambda: sok.optimizers.LazyAdam(tf.Variable([0.1, 0.2])), ValueError,
     r"^LazyAdam: learning_rate must be a scalar; got a \w+ of shape \[2\]"),
    (lambda: sok.SGD(lambda: tf.constant([[0.1]])), ValueError,
     r"^SGD: learning_rate must be a scalar; got a \w+ of shape \[1, 1\]"),
    (lambda: sok.OptimizerWrapper(V1.GradientDescentOptimizer(tf.constant([0.1, 0.2]))),
     ValueError, r"^GradientDescentOptimizer: learning_rate must be a scalar; got a \w+ of "
                 r"shape \[2\]"),
    # NaN or negative in a tensor, refused as the same number is.
    (lambda: sok.SGD(tf.constant(float("nan"))), ValueError,
     r"^sok.SGD: learning_rate must be a finite number >= 0; got a tensor holding nan"),
    (lambda: sok.optimizers.Adam(tf.constant(-1.0)), ValueError,
     r"^Adam: learning_rate must be a finite number >= 0; got a tensor holding -1.0"),
    # Not a real number: failed in a Cast, naming nothing.
    (lambda: sok.SGD(tf.constant("0.1")), TypeError,
     r"^sok.SGD: learning_rate must be a real number; got a string \w+"),
    (lambda: sok.SGD(lambda: "0.1"), TypeError,
     r"^SGD: learning_rate must be a number, a tensor or a variable .*; got '0.1'"),
    (lambda: sok.OptimizerWrapper(V1.GradientDescentOptimizer("0.1")), TypeError,
     r"^GradientDescentOptimizer: learning_rate must be a number, a tensor or a variable"),
])
def test_a_learning_rate_that_is_no_real_scalar_is_refused(make, exc, pattern, dynamic):
    """Refused when the optimizer is made where it can be, else at the
    update, before anything (table, plain variable, step) changes."""
    try:
        opt = make()
    except exc as e:
        assert re.search(pattern, str(e)), str(e)
        return
    rows, plain, step, error = _one_step(opt, dynamic)
    assert isinstance(error, exc) and re.search(pattern, str(error)), repr(error)
    assert (rows, plain, step) == ([[1.0, 1.0], [1.0, 1.0]], [1.0, 1.0], 0)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("make", [
    lambda: sok.SGD(tf.constant(0.5)), lambda: sok.SGD(tf.Variable(0.5)),
    lambda: sok.SGD(lambda: tf.constant(0.5)), lambda: sok.SGD(np.float32(0.5)),
    lambda: sok.SGD(tf.constant(1, tf.int32) / 2),
    lambda: sok.OptimizerWrapper(V1.GradientDescentOptimizer(tf.constant(0.5))),
    lambda: sok.OptimizerWrapper(V1.GradientDescentOptimizer(lambda: 0.5)),
    lambda: sok.OptimizerWrapper(tf.keras.optimizers.SGD(
        tf.keras.optimizers.schedules.ExponentialDecay(0.5, 10, 0.5))),
])
def test_a_scalar_learning_rate_in_any_form_still_trains(make, dynamic):
    rows, plain, step, error = _one_step(make(), dynamic)
    assert error is None
    # w - 0.5 * 1 for key 1 and the plain variable; key 3 untouched.
    assert (rows, plain, step) == ([[0.5, 0.5], [1.0, 1.0]], [0.5, 0.5], 1)


@pytest.mark.parametrize("make,pattern", [
    # Adam's bias correction divides by 1 - beta_1^t: every updated row NaN.
    (lambda: tf.keras.optimizers.Adam(0.1, beta_1=1.0),
     r"Adam's beta_1 must be in \[0, 1\) for the rows of sok tables \(adam\); got 1.0"),
    (lambda: tf.keras.optimizers.Adam(0.1, beta_1=float("nan")),
     r"Adam's beta_1 must be in \[0, 1\) .*; got nan"),
    (lambda: tf.keras.optimizers.Adam(0.1, beta_2=1.5),
     r"Adam's beta_2 must be in \[0, 1\) .*; got 1.5"),
    (lambda: tf.keras.optimizers.Adam(0.1, epsilon=-1.0),
     r"Adam's epsilon must be a finite number >= 0 .*; got -1.0"),
    (lambda: V1.AdamOptimizer(0.1, beta1=2.0),
     r"AdamOptimizer's beta1 must be in \[0, 1\) .*; got 2.0"),
    (lambda: V1.GradientDescentOptimizer(float("nan")),
     r"GradientDescentOptimizer's learning_rate must be a finite number >= 0 .*; got nan"),
    (lambda: V1.GradientDescentOptimizer(-0.5),
     r"GradientDescentOptimizer's learning_rate must be a finite number >= 0 .*; got -0.5"),
    (lambda: V1.GradientDescentOptimizer(tf.constant(float("inf"))),
     r"GradientDescentOptimizer's learning_rate must be a finite number >= 0 .*; got inf"),
    (lambda: V1.MomentumOptimizer(0.1, momentum=float("inf")),
     r"MomentumOptimizer's momentum must be a finite number .*; got inf"),
    (lambda: V1.RMSPropOptimizer(0.1, decay=1.5),
     r"RMSPropOptimizer's decay must be in \[0, 1\] .*; got 1.5"),
    (lambda: V1.AdadeltaOptimizer(0.1, rho=-0.5),
     r"AdadeltaOptimizer's rho must be in \[0, 1\] .*; got -0.5"),
])
def test_wrapped_hyperparameters_out_of_range_are_refused(make, pattern):
    """A NaN, an infinity or a number outside what the algorithm takes made
    every row the update touched NaN (or moved it up the gradient): refused
    when the wrapper is made, and under sok.OptimizerScope when the native
    optimizer would update sok rows, before anything changes."""
    with pytest.raises(ValueError, match="^sok.OptimizerWrapper: " + pattern):
        sok.OptimizerWrapper(make())
    v = sok.Variable(np.ones((4, 2), np.float32))
    grad = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1], tf.int64),
                            tf.constant([4, 2], tf.int64))
    with sok.OptimizerScope([v]):
        with pytest.raises(ValueError, match="^sok.OptimizerWrapper: " + pattern):
            make().apply_gradients([(grad, v)])
    np.testing.assert_array_equal(v.numpy(), np.ones((4, 2), np.float32))


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("name,make", [
    ("SGD", sok.SGD), ("Adam", sok.optimizers.Adam), ("LazyAdam", sok.optimizers.LazyAdam),
    ("GradientDescentOptimizer",
     lambda lr: sok.OptimizerWrapper(V1.GradientDescentOptimizer(lr))),
])
def test_a_learning_rate_known_only_when_the_graph_runs_is_checked_then(name, make, dynamic):
    """A placeholder learning rate fed NaN, an infinity or a negative
    number in a Session: the update fails with an InvalidArgumentError
    naming the optimizer and learning_rate, before any row, the step or
    (sok.SGD) a plain variable changes; those rows used to turn NaN or move
    up the gradient. A rate of 0.5 then trains: w - 0.5 for the row of key
    1 (Adam's first step moves a row by the learning rate), key 3 as it
    was."""
    with tf.Graph().as_default():
        lr = tf.compat.v1.placeholder(tf.float32, [])
        opt = make(lr)
        keys = tf.constant([1, 3], tf.int64)
        if dynamic:
            table = sok.DynamicVariable(2, initializer="ones")
            ready = table.sparse_read(keys)  # the rows a lookup gives them
            grad = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1], tf.int64))
            read = table.find(keys)[0]
        else:
            table = sok.Variable(np.ones((4, 2), np.float32))
            ready = tf.no_op()
            grad = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1], tf.int64),
                                    tf.constant([4, 2], tf.int64))
            read = tf.gather(table, keys)
        pairs = [(grad, table)]
        plain = tf.Variable([1.0, 1.0]) if name == "SGD" else tf.constant([1.0, 1.0])
        if name == "SGD":
            pairs.append((tf.ones([2]), plain))
        train = opt.apply_gradients(pairs)
        step = opt.iterations
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(ready)
            for bad in (float("nan"), float("inf"), -1.0):
                with pytest.raises(tf.errors.InvalidArgumentError,
                                   match=name + ": learning_rate must be a finite number >= 0"):
                    sess.run(train, {lr: bad})
                got = sess.run([read, plain, step])
                assert (got[0].tolist(), got[1].tolist(), int(got[2])) == (
                    [[1.0, 1.0], [1.0, 1.0]], [1.0, 1.0], 0), bad
            sess.run(train, {lr: 0.5})
            got = sess.run([read, plain, step])
    np.testing.assert_allclose(got[0], [[0.5, 0.5], [1.0, 1.0]], rtol=1e-5)
    assert got[1].tolist() == ([0.5, 0.5] if name == "SGD" else [1.0, 1.0])
    assert int(got[2]) == 1


@pytest.mark.parametrize("known", [True, False])
def test_only_a_learning_rate_known_when_the_graph_runs_adds_a_check(known):
    """A Python number adds no op to the graph; a placeholder its assertion."""
    graph = tf.Graph()
    with graph.as_default():
        lr = 0.5 if known else tf.compat.v1.placeholder_with_default(0.5, [])
        table = sok.Variable(np.ones((4, 2), np.float32))
        grad = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1], tf.int64),
                                tf.constant([4, 2], tf.int64))
        sok.optimizers.LazyAdam(lr).apply_gradients([(grad, table)])
    checks = [op.name for op in graph.get_operations() if "learning_rate_check" in op.name]
    assert bool(checks) == (not known), checks


@pytest.mark.parametrize("lr", [-1.0, float("nan")])
@pytest.mark.parametrize("make", [tf.keras.optimizers.Adam, tf.keras.optimizers.SGD])
def test_a_keras_learning_rate_kept_in_a_variable_is_checked(make, lr):
    """Keras 3 keeps the learning rate in a Keras variable (no tf.Variable):
    a wrapped Adam(-1.0) was taken, and moved every row up the gradient.
    Refused when the wrapper is made, naming the optimizer and
    learning_rate; a rate assigned to that variable later is refused by
    the update, before the row changes."""
    with pytest.raises(ValueError, match=r"^sok.OptimizerWrapper: " + make.__name__ +
                       r"'s learning_rate must be a finite number >= 0 .*; got " + str(lr)):
        sok.OptimizerWrapper(make(lr))
    opt = make(0.5)
    wrapper = sok.OptimizerWrapper(opt)
    v = sok.Variable(np.ones((4, 2), np.float32))
    grad = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1], tf.int64),
                            tf.constant([4, 2], tf.int64))
    if not hasattr(opt.learning_rate, "assign"):
        return  # Keras 2 on TF 1.x: a float until the optimizer builds its variables
    opt.learning_rate.assign(lr)
    with pytest.raises(ValueError, match=make.__name__ + r": learning_rate must be a finite "
                                         r"number >= 0; got " + str(lr)):
        wrapper.apply_gradients([(grad, v)])
    np.testing.assert_array_equal(v.numpy(), np.ones((4, 2), np.float32))


@pytest.mark.parametrize("make,want", [
    # Adamax takes beta_2 = 1 (u = max(u, |g|)): 1 - 0.1 / (1 - 0.9) * 0.1 / (1 + 1e-7).
    (lambda: tf.keras.optimizers.Adamax(0.1, beta_1=0.9, beta_2=1.0, epsilon=1e-7),
     1 - 0.1 / 0.1 * 0.1 / (1 + 1e-7)),
    # rho = 1 keeps TF1 RMSProp's mean square at its start, 1: 1 - 0.1 / sqrt(1 + 1e-10).
    (lambda: V1.RMSPropOptimizer(0.1, decay=1.0, epsilon=1e-10), 1 - 0.1 / np.sqrt(1 + 1e-10)),
    # A learning rate of 0 moves nothing.
    (lambda: V1.GradientDescentOptimizer(0.0), 1.0),
])
def test_wrapped_hyperparameters_at_the_ends_of_their_range_still_train(make, want):
    v = sok.Variable(np.ones((4, 2), np.float32))
    grad = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1], tf.int64),
                            tf.constant([4, 2], tf.int64))
    sok.OptimizerWrapper(make()).apply_gradients([(grad, v)])
    expected = np.ones((4, 2), np.float32)
    expected[1] = want
    np.testing.assert_allclose(v.numpy(), expected, rtol=1e-6)


@pytest.mark.parametrize("make", [lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
                                  lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
                                  lambda: tf.compat.v1.train.AdamOptimizer(0.1)],
                         ids=["adagrad", "momentum", "adam"])
def test_the_step_counts_every_session_run_whatever_the_formula(make):
    """In a graph the wrapper's step is an assign_add the update may not
    read (Adagrad's and momentum's formulas take no step): on TF 1.15 it
    never ran, the step stayed 0 and sok.dump recorded 0."""
    graph = tf.Graph()
    with graph.as_default():
        table = sok.Variable(np.ones((6, 2), np.float32), name="t")
        dyn = sok.DynamicVariable(2, initializer=1.0, name="d")
        ids = tf.RaggedTensor.from_tensor(tf.constant([[1, 4]], tf.int64))
        out = sok.lookup_sparse([table, dyn], [ids, ids], combiners=["sum", "sum"])
        loss = tf.reduce_sum(out[0]) + tf.reduce_sum(out[1])
        opt = sok.OptimizerWrapper(make())
        grads = tf.compat.v1.gradients(loss, [table, dyn])
        static_only = opt.apply_gradients([(grads[0], table)])
        both = opt.apply_gradients(zip(grads, [table, dyn]))
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        for _ in range(3):
            sess.run(static_only)
        assert sess.run(opt.iterations) == 3
        sess.run(both)
        assert sess.run(opt.iterations) == 4


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf_function"])
@pytest.mark.parametrize("kind", ["scope_keras", "scope_tf1", "wrapper_keras"])
def test_tf_train_checkpoint_resumes_the_sok_optimizer_state(tmp_path, rng, kind, compiled):
    """tf.train.Checkpoint of the tables, a dense weight and the optimizer
    (a native one under OptimizerScope, or a sok.OptimizerWrapper), restored
    into fresh objects before their first step and into the trained ones
    (rolled back), trains on exactly as the uninterrupted run: rows, the
    dense weight and the sok step. The sok slots used to be left out: Adam's
    moments started again from zero, without a word."""
    from sok_graph.optimization.wrapper import wrapper_for

    table = rng.standard_normal((12, 3)).astype(np.float32)
    batches = [tf.constant(rng.integers(0, 12, size=6), tf.int64) for _ in range(5)]

    def build():
        dyn, static = dynamic_from(table), sok.Variable(table)
        dense = tf.Variable(np.linspace(-1.0, 1.0, 3, dtype=np.float32).reshape(3, 1))
        native = tf.keras.optimizers.Adam(0.05) if kind.endswith("keras") else V1.AdamOptimizer(0.05)
        opt = sok.OptimizerWrapper(native) if kind.startswith("wrapper") else native

        def step(ids):
            ragged = tf.RaggedTensor.from_row_lengths(ids, [2, 2, 2])
            with tf.GradientTape() as tape:
                a, b = sok.lookup_sparse([dyn, static], [ragged, ragged], combiners=["sum", "sum"])
                loss = tf.reduce_sum(tf.matmul(tf.square(a - b), dense))
            variables = [dyn, static, dense]
            pairs = zip(tape.gradient(loss, variables), variables)
            with sok.OptimizerScope([dyn, static]):
                opt.apply_gradients(pairs)

        run = tf.function(step) if compiled else step
        checkpoint = tf.train.Checkpoint(dyn=dyn, static=static, dense=dense, optimizer=opt)
        return dyn, static, dense, opt, run, checkpoint

    def state(dyn, static, dense, opt):
        sok_step = opt.iterations if kind.startswith("wrapper") else wrapper_for(opt).iterations
        return [rows_of(dyn, 12), static.numpy(), dense.numpy(), int(sok_step.numpy())]

    dyn, static, dense, opt, run, checkpoint = build()
    for ids in batches[:3]:
        run(ids)
    path = checkpoint.save(str(tmp_path / "ck"))
    for ids in batches[3:]:
        run(ids)
    expected = state(dyn, static, dense, opt)
    assert expected[3] == 5

    fresh = build()
    restored = [fresh[5].restore(path), checkpoint.restore(path)]
    for resumed, status in zip((fresh, (dyn, static, dense, opt, run)), restored):
        for ids in batches[3:]:
            resumed[4](ids)
        status.assert_consumed()  # the fresh optimizer's variables exist now
        for got, want in zip(state(*resumed[:4]), expected):
            np.testing.assert_array_equal(got, want)


def _optimizer_v2_module():
    """Where Keras 2's OptimizerV2 optimizers live here (tf.keras.optimizers
    on TF 1.x, its `legacy` module on 2.11 to 2.15), else None (Keras 3)."""
    if compat.IS_TF1:
        return tf.keras.optimizers
    return compat.legacy_optimizers_module()


OPTIMIZER_V2_EPSILON = {
    "adagrad": lambda m: m.Adagrad(0.05, initial_accumulator_value=1e-7),
    "rmsprop": lambda m: m.RMSprop(0.01),
    "rmsprop_centered": lambda m: m.RMSprop(0.01, centered=True),
    "rmsprop_momentum": lambda m: m.RMSprop(0.01, momentum=0.5),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZER_V2_EPSILON))
def test_keras_optimizer_v2_adds_epsilon_where_its_kernels_do(rng, name):
    """Keras 2's OptimizerV2 Adagrad and RMSprop without momentum divide by
    sqrt(x) + epsilon (Keras 3's, and Keras 2's newer ones, by sqrt(x +
    epsilon)): with gradients of 1e-4, sok's rows equal the same optimizer's
    on a plain tf.Variable (they were 0.97 where it gave 0.90). Every step
    reads the same rows, so the legacy RMSprop's decay of unread rows'
    mean squares does not show. (The formulas of algorithms.py, which
    update other dtypes, are held to the fused ops' by
    ops/test_dynamic_sparse_apply_op.py.)"""
    module = _optimizer_v2_module()
    if module is None:
        pytest.skip("no Keras 2 OptimizerV2 in this TensorFlow")
    table = rng.standard_normal((8, 3)).astype(np.float32)
    ids = tf.ragged.constant([[1, 3], [3, 6]], tf.int64)

    def loss(emb):
        return tf.reduce_sum(emb * tf.constant([[1e-4, -2e-4, 3e-5]], emb.dtype))

    def train(var, opt, lookup):
        for _ in range(4):
            with tf.GradientTape() as tape:
                value = loss(lookup(var))
            if isinstance(var, tf.Variable) and not getattr(var, "is_sok_variable", False):
                opt.apply_gradients([(tape.gradient(value, var), var)])
                continue
            with sok.OptimizerScope([var]):
                opt.apply_gradients([(tape.gradient(value, var), var)])

    def plain(var):
        return tf.nn.embedding_lookup_sparse(var, ids.to_sparse(), None, combiner="sum")

    def sok_lookup(var):
        return sok.lookup_sparse(var, ids, combiners="sum")

    ref = tf.Variable(table)
    train(ref, OPTIMIZER_V2_EPSILON[name](module), plain)
    want = ref.numpy()
    assert np.abs(want - table).max() > 1e-3  # the steps moved the rows
    static, dyn = sok.Variable(table), dynamic_from(table)
    for var in (static, dyn):
        train(var, OPTIMIZER_V2_EPSILON[name](module), sok_lookup)
    np.testing.assert_allclose(static.numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rows_of(dyn, 8), want, rtol=1e-5, atol=1e-6)


def test_keras_2s_new_optimizers_are_routed_once_sok_init_made_the_legacy_ones_default(rng):
    """sok.init (use_legacy_optimizer=True, SOK's default) makes
    tf.keras.optimizers Keras 2's legacy ones; its new ones stay in
    tf.keras.optimizers.experimental. Inside OptimizerScope they update sok
    tables too (lazy Adam against numpy), and one sok cannot apply (Lion)
    is refused by name: both failed inside Keras' build with "Cannot
    convert a partially known TensorShape", the scope not routing them."""
    experimental = getattr(tf.keras.optimizers, "experimental", None)
    new_base = getattr(experimental, "Optimizer", None)
    if not isinstance(new_base, type) or compat.is_keras_optimizer_v2(experimental.Adam(0.1)):
        pytest.skip("no Keras 2 new optimizers beside the legacy ones here")
    sok.init(comm_tool="none")
    table, batches = make_data(rng)
    dyn = dynamic_from(table)
    opt = experimental.Adam(0.05, epsilon=1e-7)

    last = []

    def apply(g):
        last[:] = [g]
        with sok.OptimizerScope([dyn]):
            opt.apply_gradients([(g, dyn)])

    grads = train_recording_gradients(dyn, batches, apply)
    expected = numpy_lazy_adam(table, grads, 0.05, 0.9, 0.999, 1e-7)
    np.testing.assert_allclose(rows_of(dyn, 30), expected, rtol=1e-5, atol=1e-6)
    lion = getattr(experimental, "Lion", None) or getattr(tf.keras.optimizers, "Lion", None)
    if lion is not None:  # Keras 2's new Lion (it has no legacy kind)
        assert isinstance(lion(0.1), new_base)
        with pytest.raises(TypeError, match="got Lion"):
            with sok.OptimizerScope([dyn]):
                lion(0.1).apply_gradients([(last[0], dyn)])


def test_a_saved_model_holding_the_optimizer_of_sok_tables_loads(tmp_path, rng):
    """tf.saved_model.save of a module holding a native optimizer that
    trained a sok table under OptimizerScope (so its sok state is the
    optimizer's child), then tf.saved_model.load: the loader rebuilds the
    sok state as a plain object, which must not be given slot variables
    (loading failed with "'_UserObject' object has no attribute
    'add_slot'"). A tf.train.Checkpoint of the same objects still holds the
    slots."""
    if compat.IS_TF1:
        pytest.skip("TF 1.x saves no object graphs in SavedModels")
    table = rng.standard_normal((6, 3)).astype(np.float32)
    static = sok.Variable(table)
    dense = tf.Variable(np.ones((3, 1), np.float32))
    opt = tf.keras.optimizers.Adam(0.05)
    ids = tf.ragged.constant([[1, 2], [4]], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.matmul(sok.lookup_sparse(static, ids, combiners="sum"), dense))
    with sok.OptimizerScope([static]):
        opt.apply_gradients(zip(tape.gradient(loss, [static, dense]), [static, dense]))
    module = tf.Module()
    module.static, module.dense, module.opt = static, dense, opt
    module.score = tf.function(
        lambda x: tf.matmul(tf.gather(tf.convert_to_tensor(static), x), dense),
        input_signature=[tf.TensorSpec([None], tf.int64)])
    tf.saved_model.save(module, str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    np.testing.assert_allclose(loaded.score(tf.constant([1, 4], tf.int64)).numpy(),
                               module.score(tf.constant([1, 4], tf.int64)).numpy())
    path = tf.train.Checkpoint(static=static, optimizer=opt).save(str(tmp_path / "ck"))
    names = [name for name, _ in tf.train.list_variables(path)]
    assert any("OPTIMIZER_SLOT/optimizer/sok_optimizer_state/m" in n for n in names), names


LIVE_CHANGES = {
    "adam_beta_1": (lambda: tf.keras.optimizers.Adam(0.05), "beta_1", 0.5),
    "sgd_momentum": (lambda: tf.keras.optimizers.SGD(0.05, momentum=0.9), "momentum", 0.3),
    "rmsprop_rho": (lambda: tf.keras.optimizers.RMSprop(0.05), "rho", 0.5),
}


@pytest.mark.parametrize("name", sorted(LIVE_CHANGES))
def test_a_keras_hyperparameter_changed_between_steps_takes_effect(rng, name):
    """`opt.beta_1 = 0.5` (momentum, rho) between eager steps changes sok's
    updates as it changes Keras' own on a plain tf.Variable (every step reads
    the same rows, so Keras' non-lazy momentum and moments agree with sok's
    lazy ones). Keras 3 keeps them as Python numbers, which sok read once,
    at its first update: the change was ignored without a word."""
    make, attribute, changed = LIVE_CHANGES[name]
    table = rng.standard_normal((6, 3)).astype(np.float32)
    ids = tf.ragged.constant([[1, 2], [4, 2]], tf.int64)

    def train(var, lookup):
        opt = make()
        for step in range(4):
            if step == 2:
                setattr(opt, attribute, changed)
            with tf.GradientTape() as tape:
                loss = loss_of(lookup(var))
            if getattr(var, "is_sok_variable", False):
                with sok.OptimizerScope([var]):
                    opt.apply_gradients([(tape.gradient(loss, var), var)])
            else:
                opt.apply_gradients([(tape.gradient(loss, var), var)])

    ref = tf.Variable(table)
    train(ref, lambda v: tf.nn.embedding_lookup_sparse(v, ids.to_sparse(), None, combiner="sum"))
    static, dyn = sok.Variable(table), dynamic_from(table)
    for var in (static, dyn):
        train(var, lambda v: sok.lookup_sparse(v, ids, combiners="sum"))
    touched = [1, 2, 4]
    want = ref.numpy()[touched]
    np.testing.assert_allclose(static.numpy()[touched], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rows_of(dyn, 6)[touched], want, rtol=1e-5, atol=1e-5)


def test_a_hyperparameter_changed_out_of_range_is_refused_at_the_next_update():
    """The range checks of the hyperparameters run before each update, on
    the numbers the optimizer holds then."""
    table = sok.Variable(np.ones((4, 2), np.float32))
    opt = sok.OptimizerWrapper(tf.keras.optimizers.Adam(0.05))
    grad = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1], tf.int64))
    opt.apply_gradients([(grad, table)])
    opt.optimizer.beta_1 = 1.0
    if not isinstance(opt.optimizer.beta_1, float):
        pytest.skip("this Keras keeps beta_1 in a variable (OptimizerV2), checked at the first "
                    "update only: reading it before each would wait for its device")
    before = table.numpy()
    with pytest.raises(ValueError, match=r"beta_1 must be in \[0, 1\).*got 1.0"):
        opt.apply_gradients([(grad, table)])
    np.testing.assert_array_equal(table.numpy(), before)


def test_a_saver_restore_without_the_initializer_links_the_slots(tmp_path):
    """A tf.compat.v1.train.Saver restore runs no initializer (as
    MonitoredTrainingSession resuming from a checkpoint): the restored
    table and its slot table are made and linked by the restore, so the
    keys the table evicts afterwards leave the slot too (the slot kept
    them: 3 keys where 0 remain). Against the keys the table holds."""
    from sok_graph.ops import dynamic as dynamic_ops

    path = str(tmp_path / "ckpt")

    def build():
        v = sok.DynamicVariable(2, var_type="hybrid", init_capacity=4, max_capacity=4,
                                name="t", initializer="zeros")
        slot = v.make_slot("m", 0.0)
        keys = tf.compat.v1.placeholder(tf.int64, [None])
        read = v.sparse_read(keys)
        write = slot.scatter_update(keys, tf.fill(tf.stack([tf.size(keys), 2]), 7.0))
        exported = [dynamic_ops.export(t.handle, tf.int64, 2)[0] for t in (v, slot)]
        return keys, read, write, exported, tf.compat.v1.train.Saver()

    with tf.Graph().as_default():
        keys, read, write, _, saver = build()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run([read, write], {keys: [1, 2, 3, 4]})
            saver.save(sess, path)
    with tf.Graph().as_default():
        keys, read, write, exported, saver = build()
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, path)
            sess.run(read, {keys: [6, 7, 8]})  # evicts three of 1-4
            table_keys, slot_keys = (set(k.tolist()) for k in sess.run(exported))
    assert len(table_keys) == 4 and {6, 7, 8} <= table_keys
    assert slot_keys == table_keys & {1, 2, 3, 4}


def test_the_wrappers_learning_rate_is_the_optimizers_and_read_only():
    """SOK's wrapper gives its optimizer's rate as `lr`, read-only. Reading
    it was an AttributeError, and `wrapper.lr = 0` or `wrapper.learning_rate
    = 0` made an attribute that no update read: the next step still trained.
    The optimizer's own rate, which every update reads, stops it."""
    sok.init(comm_tool="none")
    table = sok.Variable(np.ones((4, 2), np.float32))
    keras_sgd = tf.keras.optimizers.SGD(0.1)
    wrapper = sok.OptimizerWrapper(keras_sgd)

    def rate(x):
        return float(x.numpy()) if hasattr(x, "numpy") else float(x)

    assert rate(wrapper.lr) == pytest.approx(0.1)
    assert rate(wrapper.learning_rate) == pytest.approx(0.1)
    assert sok.SGD(0.05).lr == 0.05
    for name in ("lr", "learning_rate"):
        with pytest.raises(AttributeError, match=f"OptimizerWrapper.{name} is read-only: set "
                                                 f"the learning rate on the wrapped optimizer"):
            setattr(wrapper, name, 0.0)
    ids = tf.ragged.constant([[0]], tf.int64)

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse(table, ids, combiners="sum"))
        wrapper.apply_gradients(zip(tape.gradient(loss, [table]), [table]))

    step()
    np.testing.assert_allclose(table.numpy()[0], [0.9, 0.9], rtol=1e-6)
    keras_sgd.learning_rate = 0.0
    assert rate(wrapper.lr) == 0.0
    step()
    np.testing.assert_allclose(table.numpy()[0], [0.9, 0.9], rtol=1e-6)


@pytest.mark.skipif(not tf.executing_eagerly(), reason="eager steps")
def test_an_optimizer_dropped_after_steps_under_the_scope_is_freed():
    """The wrapper keeping a native optimizer's slots for sok tables was
    held in a module-level weak dictionary whose values referred to their
    keys: every optimizer ever used under sok.OptimizerScope stayed alive,
    with its slot tables (a hyperparameter search grew without bound)."""
    import gc
    import weakref

    sok.init(comm_tool="none")
    table = sok.DynamicVariable(2, initializer="ones")
    dropped = []
    for _ in range(3):
        opt = tf.keras.optimizers.Adam(0.1)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(table.sparse_read(tf.constant([1, 2], tf.int64)))
        grads = tape.gradient(loss, [table])
        with sok.OptimizerScope([table]):
            opt.apply_gradients(zip(grads, [table]))
        dropped.append(weakref.ref(opt))
        del opt
    gc.collect()
    assert [ref() for ref in dropped] == [None, None, None]


@pytest.mark.parametrize("route", ["wrapper", "scope"])
@pytest.mark.parametrize("make", [lambda: tf.keras.optimizers.Adam(0.1),
                                  lambda: V1.GradientDescentOptimizer(0.1)],
                         ids=["keras_adam", "tf1_sgd"])
def test_gradients_that_are_all_none_are_refused_as_tensorflow_refuses_them(make, route):
    """apply_gradients where no variable has a gradient (the loss does not
    depend on the tables: a lookup made outside the tape) is TensorFlow's
    and Keras' ValueError; sok trained nothing without an error, and under
    OptimizerScope Keras counted a step. A table without a gradient beside
    a variable with one is passed over, as TensorFlow passes over it."""
    ref = tf.Variable(np.ones((3, 2), np.float32))
    with pytest.raises(ValueError, match="No gradients provided for any variable"):
        make().apply_gradients([(None, ref)])

    rows = np.arange(6, dtype=np.float32).reshape(3, 2)
    table, dyn = sok.Variable(rows), dynamic_from(rows)

    def apply(opt, grads_and_vars):
        if route == "wrapper":
            return sok.OptimizerWrapper(opt).apply_gradients(grads_and_vars)
        with sok.OptimizerScope([table, dyn]):
            return opt.apply_gradients(grads_and_vars)

    opt = make()
    with pytest.raises(ValueError, match=r"No gradients provided for any variable.*"
                                         r"GradientTape"):
        apply(opt, [(None, table), (None, dyn)])
    np.testing.assert_array_equal(table.numpy(), rows)
    np.testing.assert_array_equal(rows_of(dyn, 3), rows)
    if hasattr(opt, "iterations"):
        assert int(opt.iterations) == 0

    # Beside a variable with a gradient: that one trains, as with
    # TensorFlow's optimizer alone, and the tables stay.
    dense, expected = tf.Variable([1.0, 2.0]), tf.Variable([1.0, 2.0])
    make().apply_gradients([(tf.constant([0.5, -1.0]), expected)])
    apply(make(), [(None, table), (tf.constant([0.5, -1.0]), dense), (None, dyn)])
    np.testing.assert_allclose(dense.numpy(), expected.numpy())
    np.testing.assert_array_equal(table.numpy(), rows)
    np.testing.assert_array_equal(rows_of(dyn, 3), rows)


def _numpy_lazy_adam_on_sums(table, batches, lr, eps, steps_per_batch=1):
    """A numpy model of LazyAdam training `table` on loss_of(the sum of each
    sample's rows): the gradient worked out by hand (dL/d sum = 2 (sum -
    0.3) + 1, added to each row a sample holds), then lazy Adam."""
    w = table.astype(np.float64).copy()
    m, v = np.zeros_like(w), np.zeros_like(w)
    t = 0
    for ids in batches:
        samples = ids.to_list()
        for _ in range(steps_per_batch):
            t += 1
            g = np.zeros_like(w)
            for sample in samples:
                d = 2.0 * (w[sample].sum(0) - 0.3) + 1.0
                for key in sample:
                    g[key] += d
            rows = sorted({key for sample in samples for key in sample})
            m[rows] = 0.9 * m[rows] + 0.1 * g[rows]
            v[rows] = 0.999 * v[rows] + 0.001 * g[rows] ** 2
            alpha = lr * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
            w[rows] -= alpha * m[rows] / (np.sqrt(v[rows]) + eps)
    return w


@pytest.mark.parametrize("how", ["callable", "tape", "tf1_session", "tf1_eager"])
def test_minimize_of_sok_lazy_adam_steps_as_numpy(rng, how):
    """SOK 1.x's optimizers are Keras optimizers (LazyAdamOptimizer a
    tf.compat.v1 one) and have minimize; sok's had none (AttributeError)."""
    table, batches = make_data(rng, steps=3)
    want = _numpy_lazy_adam_on_sums(table, batches, 0.05, 1e-8 if how.startswith("tf1") else 1e-7)
    if how == "tf1_session":
        with tf.Graph().as_default():
            dyn = sok.DynamicVariable(table.shape[1], initializer="zeros")
            load = dyn.import_rows(tf.range(table.shape[0], dtype=tf.int64), tf.constant(table))
            ids = tf.compat.v1.ragged.placeholder(tf.int64, 1, [])
            step = tf.compat.v1.train.get_or_create_global_step()
            opt = sok.optimizers.LazyAdamOptimizer(0.05)
            train = opt.minimize(loss_of(sok.lookup_sparse(dyn, ids, combiners="sum")),
                                 global_step=step)
            rows = dyn.find(tf.range(30, dtype=tf.int64))[0]
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                sess.run(load)
                for batch in batches:
                    sess.run(train, {ids: tf.compat.v1.ragged.RaggedTensorValue(
                        batch.values.numpy(), batch.row_splits.numpy())})
                got, steps = sess.run([rows, step])
        assert steps == len(batches)
    else:
        dyn = dynamic_from(table)
        opt = sok.optimizers.LazyAdam(0.05)
        for batch in batches:
            if how == "tf1_eager":  # var_list: what the loss reads, in one run of it
                if batch is batches[0]:
                    opt = sok.optimizers.LazyAdamOptimizer(0.05)
                opt.minimize(lambda: loss_of(sok.lookup_sparse(dyn, batch, combiners="sum")))
            elif how == "callable":
                opt.minimize(lambda: loss_of(sok.lookup_sparse(dyn, batch, combiners="sum")),
                             var_list=[dyn])
            else:
                with tf.GradientTape() as tape:
                    loss = loss_of(sok.lookup_sparse(dyn, batch, combiners="sum"))
                opt.minimize(loss, [dyn], tape=tape)
        got = rows_of(dyn, 30)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _keras_sgd_subclasses():
    """Subclasses of Keras' SGD that halve the gradients where Keras lets a
    subclass change them: (name, class, whether sok.OptimizerScope applies
    what it does). Keras 2's OptimizerV2 (TF <= 2.10's default, the legacy
    optimizers) has no _clip_gradients; TF 1.15's no _transform_gradients."""

    def halved(grads):
        return [None if g is None else
                tf.IndexedSlices(g.values * 0.5, g.indices, g.dense_shape)
                if isinstance(g, tf.IndexedSlices) else g * 0.5 for g in grads]

    base = tf.keras.optimizers.SGD
    found = []
    if hasattr(base, "_clip_gradients"):
        found.append(("clip", type("ClipSGD", (base,), {
            "_clip_gradients": lambda self, grads: halved(grads)}), False))
    if hasattr(base, "_transform_gradients"):
        found.append(("transform", type("TransformSGD", (base,), {
            "_transform_gradients": lambda self, pairs: list(zip(
                halved([g for g, _ in pairs]), [v for _, v in pairs]))}), False))

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        pairs = list(grads_and_vars)
        return base.apply_gradients(self, list(zip(halved([g for g, _ in pairs]),
                                                   [v for _, v in pairs])), *args, **kwargs)
    found.append(("apply_gradients", type("HalvingSGD", (base,),
                                          {"apply_gradients": apply_gradients}), True))
    return found


@pytest.mark.parametrize("name,cls,scope_applies", _keras_sgd_subclasses(),
                         ids=[n for n, _, _ in _keras_sgd_subclasses()])
def test_a_keras_subclass_that_changes_the_gradients_is_applied_or_refused(name, cls,
                                                                              scope_applies):
    """A Keras SGD subclass that halves the gradients (in _clip_gradients,
    _transform_gradients or apply_gradients) moved a tf.Variable's rows by
    half of what it moved a sok table's, without an error: the wrapper
    never calls those methods for the tables. Now what sok.OptimizerScope
    runs (the optimizer's own apply_gradients) trains as the tf.Variable,
    and what neither calls is refused, naming the method."""
    table = np.ones((4, 2), np.float32)
    ids = tf.ragged.constant([[1, 2]], tf.int64)
    ref = tf.Variable(table)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup_sparse(ref, ids.to_sparse(), None,
                                                           combiner="sum"))
    cls(1.0).apply_gradients([(tape.gradient(loss, ref), ref)])
    np.testing.assert_allclose(ref.numpy()[1], [0.5, 0.5])

    def gradient(var):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse([var], [ids], combiners=["sum"])[0])
        return tape.gradient(loss, var)

    var = sok.Variable(table)
    with pytest.raises(TypeError, match=r"defines (its own|_clip_gradients|_transform_gradients)"):
        sok.OptimizerWrapper(cls(1.0)).apply_gradients([(gradient(var), var)])
    opt = cls(1.0)
    if scope_applies:
        with sok.OptimizerScope([var]):
            opt.apply_gradients([(gradient(var), var)])
        np.testing.assert_allclose(var.numpy(), ref.numpy())
    else:
        with pytest.raises(TypeError, match=r"defines _(clip|transform)_gradients"):
            with sok.OptimizerScope([var]):
                opt.apply_gradients([(gradient(var), var)])
    np.testing.assert_array_equal(var.numpy()[3], table[3])


def _keras_optimizer_v2(name):
    """Keras 2's OptimizerV2 class `name` (tf.keras.optimizers.legacy from
    TF 2.11, tf.keras.optimizers before), or None under Keras 3."""
    if compat.KERAS_MAJOR_VERSION >= 3:
        return None
    return getattr(getattr(tf.keras.optimizers, "legacy", tf.keras.optimizers), name)


def _takes_gradient_transformers():
    sgd = _keras_optimizer_v2("SGD")
    try:
        return sgd is not None and sgd(1.0, gradient_transformers=[]) is not None
    except TypeError:  # TF 1.15's OptimizerV2
        return False


@pytest.mark.skipif(not _takes_gradient_transformers(),
                    reason="this Keras has no OptimizerV2 SGD taking gradient_transformers")
def test_keras_gradient_transformers_are_refused_for_sok_tables():
    """Keras 2's gradient_transformers halved a tf.Variable's gradient and
    not a sok table's, without an error."""
    sgd = _keras_optimizer_v2("SGD")
    with pytest.raises(ValueError, match=r"does not apply SGD's gradient_transformers="):
        sok.OptimizerWrapper(sgd(1.0, gradient_transformers=[lambda pairs: pairs]))
    sok.OptimizerWrapper(sgd(1.0, gradient_transformers=[]))  # none given: nothing to refuse


@pytest.mark.parametrize("make", [
    lambda: tf.keras.optimizers.Adam(0.1),
    lambda: tf.keras.optimizers.SGD(
        tf.keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)),
], ids=["adam", "sgd_schedule"])
def test_a_wrappers_step_keeps_up_with_steps_that_trained_only_dense_weights(rng, make):
    """One OptimizerWrapper trains a table and a dense weight; at one step
    the table gets no gradient (only the dense part of the model trained).
    The wrapped Keras optimizer counted that step and the wrapper did not,
    so the table's Adam bias correction and learning-rate schedule stayed a
    step behind the dense weight's for good (1.3e-2 and 5e-2 off the same
    Keras optimizer training a tf.Variable copy of the table)."""
    table = rng.standard_normal((6, 2)).astype(np.float32)
    ids = tf.ragged.constant([[0, 1], [3]], tf.int64)
    var, ref = sok.Variable(table), tf.Variable(table)
    dense, ref_dense = tf.Variable([1.0, 2.0]), tf.Variable([1.0, 2.0])
    wrapper, ref_opt = sok.OptimizerWrapper(make()), make()
    for step in range(3):
        with_table = step != 1
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(dense * dense)
            if with_table:
                loss += tf.reduce_sum(sok.lookup_sparse([var], [ids], combiners=["sum"])[0] ** 2)
        wrapper.apply_gradients(zip(tape.gradient(loss, [var, dense]), [var, dense]))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(ref_dense * ref_dense)
            if with_table:
                loss += tf.reduce_sum(tf.nn.embedding_lookup_sparse(
                    ref, ids.to_sparse(), None, combiner="sum") ** 2)
        grads = tape.gradient(loss, [ref, ref_dense])
        ref_opt.apply_gradients([(g, v) for g, v in zip(grads, [ref, ref_dense])
                                 if g is not None])
    assert int(wrapper.iterations.numpy()) == 3
    np.testing.assert_allclose(var.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dense.numpy(), ref_dense.numpy(), rtol=1e-6)


def test_sok_sgd_with_a_schedule_trains_tf_variables_at_the_tables_rate():
    """sok.SGD(schedule) given a table and a tf.Variable in one call failed
    ("Attempt to convert a value (<...ExponentialDecay ...>)"): the
    tf.Variable's update read the schedule as a number. It now takes the
    rate the table's step gives."""
    schedule = tf.keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    opt = sok.SGD(schedule)
    var = sok.Variable(np.ones((4, 2), np.float32))
    dense = tf.Variable(np.ones((4, 2), np.float32))
    ids = tf.ragged.constant([[1]], tf.int64)
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = (tf.reduce_sum(sok.lookup_sparse([var], [ids], combiners=["sum"])[0])
                    + tf.reduce_sum(dense))
        opt.apply_gradients(zip(tape.gradient(loss, [var, dense]), [var, dense]))
    rates = [0.1 * 0.5 ** s for s in range(3)]
    np.testing.assert_allclose(var.numpy()[1], 1 - sum(rates), rtol=1e-6)
    np.testing.assert_allclose(dense.numpy(), 1 - sum(rates), rtol=1e-6)
    dense_only = tf.Variable([1.0])  # a call of tf.Variables only: the next step's rate
    opt.apply_gradients([(tf.constant([1.0]), dense_only)])
    np.testing.assert_allclose(dense_only.numpy(), [1 - 0.1 * 0.5 ** 3], rtol=1e-6)


def test_keras_momentum_set_above_zero_after_the_wrapper_was_made_is_refused():
    """SGD(0.1) wrapped, then opt.momentum = 0.9: the rows went on as plain
    SGD (the rule and slots were chosen at 0), where Keras' own update of a
    tf.Variable fails for want of the momentum slot."""
    opt = tf.keras.optimizers.SGD(0.1)
    if isinstance(getattr(opt, "_momentum", None), bool):
        pytest.skip("Keras 2's OptimizerV2 SGD fixes its momentum flag when it is made")
    wrapper = sok.OptimizerWrapper(opt)
    var = sok.Variable(np.ones((4, 2), np.float32))
    ids = tf.ragged.constant([[1]], tf.int64)

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse([var], [ids], combiners=["sum"])[0])
        wrapper.apply_gradients([(tape.gradient(loss, var), var)])
    step()
    opt.momentum = 0.9
    with pytest.raises(ValueError, match=r"momentum is above 0 now and was 0"):
        step()
    np.testing.assert_allclose(var.numpy()[1], [0.9, 0.9], rtol=1e-6)


def test_keras2_ftrl_shrinkage_is_read_where_keras_reads_it(rng):
    """Keras 2's OptimizerV2 Ftrl keeps l2_shrinkage_regularization_strength
    private; a public attribute of that name set later is not what its
    update uses, and sok read it (rows off by 0.14)."""
    ftrl = _keras_optimizer_v2("Ftrl")
    if ftrl is None:
        pytest.skip("Keras 3 has no OptimizerV2")

    def make():
        made = ftrl(0.2, l2_shrinkage_regularization_strength=0.0)
        made.l2_shrinkage_regularization_strength = 0.5  # Keras does not read it
        return made
    table, batches = make_data(rng)
    expected = train_reference(make, table, batches)
    static = sok.Variable(table)
    train_sok(make, static, batches)
    np.testing.assert_allclose(static.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_a_keras_optimizer_used_beside_its_wrapper_leaves_the_wrappers_step_alone(rng):
    """One Keras Adam updating some dense weights itself and, through
    sok.OptimizerWrapper, a table and other weights, both each step (in
    either order): Keras counts two steps a step; the wrapper counts its
    own calls, and the table trains as with the wrapper alone."""
    table = rng.standard_normal((6, 2)).astype(np.float32)
    ids = tf.ragged.constant([[0, 1], [3]], tf.int64)
    results = []
    for order in ("wrapper_first", "optimizer_first", "wrapper_alone"):
        var, a, b = sok.Variable(table), tf.Variable([1.0, 2.0]), tf.Variable([3.0])
        keras_opt = tf.keras.optimizers.Adam(0.1)
        if hasattr(keras_opt, "build"):  # Keras 3 and Keras 2's new optimizers
            keras_opt.build([a, b])
        wrapper = sok.OptimizerWrapper(keras_opt)
        for _ in range(3):
            with tf.GradientTape() as tape:
                loss = (tf.reduce_sum(sok.lookup_sparse([var], [ids], combiners=["sum"])[0] ** 2)
                        + tf.reduce_sum(a * a) + tf.reduce_sum(b * b))
            g_var, g_a, g_b = tape.gradient(loss, [var, a, b])
            if order == "optimizer_first":
                keras_opt.apply_gradients([(g_b, b)])
            wrapper.apply_gradients([(g_var, var), (g_a, a)])
            if order == "wrapper_first":
                keras_opt.apply_gradients([(g_b, b)])
        assert int(wrapper.iterations.numpy()) == 3, order
        results.append(var.numpy())
    np.testing.assert_array_equal(results[0], results[2])
    np.testing.assert_array_equal(results[1], results[2])
