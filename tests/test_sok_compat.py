"""SOK 2.x scripts run unchanged: one test per public behaviour listed in
docs/sok_compat.md, each checked against numpy or plain TensorFlow.

The expectations come from SOK's documentation (its API pages and the
examples in its docstrings), not from SOK's own tests.
"""

import importlib.util
import inspect
import json
import os
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest
import tensorflow as tf

import sok_graph
import sparse_operation_kit as sok
from sok_graph import compat, context
from sok_graph.optimization.wrapper import OptimizerWrapper

SOK2_NAMES = ["init", "set_comm_tool", "tf_version", "raw_ops", "Variable", "DistributedVariable",
              "LocalizedVariable", "DynamicVariable", "assign", "export", "OptimizerWrapper",
              "SGD", "lookup_sparse", "all2all_dense_embedding", "dump", "load",
              "filter_variables", "sparse_read_and_evict", "incremental_model_dump"]
SOK1_NAMES = ["Init", "All2AllDenseEmbedding", "DistributedEmbedding", "OptimizerScope",
              "split_embedding_variable_from_others", "optimizers", "Saver", "get_embedding",
              "GraphKeys"]


def _params(fn):
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


# ----------------------------------------------------------------- names


@pytest.mark.parametrize("name", SOK2_NAMES + SOK1_NAMES)
def test_every_public_sok_name_exists(name):
    assert getattr(sok, name) is getattr(sok_graph, name)


def test_sok1_optimizers_module():
    assert callable(sok.optimizers.Adam) and callable(sok.optimizers.LazyAdam)


def test_signatures_and_defaults_match_sok():
    empty = inspect.Parameter.empty
    assert _params(sok.init) == [("comm_tool", "horovod"), ("use_legacy_optimizer", True)]
    assert _params(sok.set_comm_tool) == [("tool", empty)]
    assert _params(sok.lookup_sparse)[:4] == [("params", empty), ("sp_ids", empty),
                                              ("sp_weights", None), ("combiners", None)]
    assert _params(sok.all2all_dense_embedding)[:2] == [("param", empty), ("indices", empty)]
    assert _params(sok.assign) == [("var", empty), ("indices", empty), ("values", empty)]
    assert _params(sok.export) == [("var", empty)]
    assert _params(sok.filter_variables) == [("vars", empty)]
    assert _params(sok.dump)[:3] == [("path", empty), ("dump_vars", empty), ("optimizer", None)]
    assert _params(sok.load)[:3] == [("path", empty), ("load_vars", empty), ("optimizer", None)]
    assert _params(sok.sparse_read_and_evict) == [("var", empty), ("indices", empty),
                                                  ("name", None)]
    dyn = _params(sok.DynamicVariable.__init__)
    assert dyn[1:10] == [("dimension", empty), ("initializer", None), ("var_type", None),
                         ("name", None), ("constraint", None), ("trainable", True),
                         ("key_type", None), ("dtype", None), ("mode", None)]
    assert inspect.signature(sok.DynamicVariable.__init__).parameters[
        "table_config"].kind is inspect.Parameter.VAR_KEYWORD
    assert _params(sok.SGD.__init__)[1] == ("lr", 0.01)


# ------------------------------------------------------ module attributes


def test_tf_version_is_a_list_of_ints():
    expected = [int("".join(c for c in part if c.isdigit()) or 0)
                for part in tf.__version__.split(".")[:3]]
    assert sok.tf_version == expected
    assert all(isinstance(x, int) for x in sok.tf_version)
    assert sok.tf_version[0] == 2 and sok.tf_version[1] >= 15 or sok.tf_version[0] == 1


def test_raw_ops_is_the_op_library():
    assert isinstance(sok.raw_ops, types.ModuleType)
    assert hasattr(sok.raw_ops, "sok_dynamic_table_handle")


def test_set_comm_tool_selects_the_communicator():
    comm = sok.set_comm_tool("none")
    assert context.active() is comm and (comm.world_size, comm.rank) == (1, 0)
    with pytest.raises(ValueError, match="comm_tool"):
        sok.set_comm_tool("mpi")


def test_init_single_is_one_process():
    """SOK's single-process scripts call sok.init("single"): one process, no
    communication, and a lookup that reads the whole table."""
    comm = sok.init("single")
    assert context.active() is comm and (comm.world_size, comm.rank) == (1, 0)
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    v = sok.Variable(table)
    out = sok.lookup_sparse(v, tf.ragged.constant([[3, 1], [2]], tf.int64), combiners="sum")
    np.testing.assert_array_equal(np.asarray(out), [table[3] + table[1], table[2]])
    with pytest.raises(ValueError, match="'horvod'"):
        sok.init("horvod")


# ------------------------------------------------------------- init / Keras


def test_init_with_legacy_optimizers_where_tensorflow_has_them():
    """SOK's default: tf.keras.optimizers' optimizers become the legacy ones
    where it holds OptimizerV2 optimizers (the rest of the module, such as
    schedules, stays reachable); on Keras 3 nothing changes."""
    legacy = compat.legacy_optimizers_module()
    before = tf.keras.optimizers
    sok.init(comm_tool="horovod", use_legacy_optimizer=True)
    if legacy is None:
        assert tf.keras.optimizers is before
        return
    assert tf.keras.optimizers.SGD is legacy.SGD and tf.keras.optimizers.Adam is legacy.Adam
    assert "OptimizerV2" in [c.__name__ for c in type(tf.keras.optimizers.SGD(0.1)).__mro__]
    assert tf.keras.optimizers.schedules is before.schedules
    assert tf.keras.optimizers.legacy is legacy
    context.restore_keras_optimizers()
    assert tf.keras.optimizers is before


def test_one_optimizer_updates_a_sok_variable_then_a_tf_variable():
    """The SOK script pattern: one tf.keras SGD for a sok.Variable, later for
    a tf.Variable it has not seen (legacy optimizers after sok.init where TF
    has them; through sok.OptimizerWrapper on every Keras)."""
    sok.init(comm_tool="horovod")
    table0 = np.arange(12, dtype=np.float32).reshape(4, 3)
    dense0 = np.ones((3, 2), np.float32)
    table, dense = sok.Variable(table0), tf.Variable(dense0)
    opt = tf.keras.optimizers.SGD(learning_rate=0.5)
    if compat.legacy_optimizers_module() is None:
        opt = sok.OptimizerWrapper(opt)
    ids = tf.ragged.constant([[1, 3]], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(sok.lookup_sparse(table, ids, combiners="sum"))
    opt.apply_gradients(zip(tape.gradient(loss, [table]), [table]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.matmul(tf.ones([1, 3]), dense))
    opt.apply_gradients(zip(tape.gradient(loss, [dense]), [dense]))
    expected = table0.copy()
    expected[[1, 3]] -= 0.5
    np.testing.assert_allclose(table.numpy(), expected)
    np.testing.assert_allclose(dense.numpy(), dense0 - 0.5)


class _OptimizerV2:
    """Stands for tf_keras.optimizers.legacy.Optimizer where tf_keras is
    not installed: recognised by its package and class name."""

    def apply_gradients(self, grads_and_vars, name=None, **kwargs):
        for g, v in grads_and_vars:
            v.assign_sub(self.learning_rate * tf.convert_to_tensor(g))


_OptimizerV2.__name__ = "OptimizerV2"
_OptimizerV2.__module__ = "tf_keras.src.optimizers.legacy.optimizer_v2"


class _TfKerasSGD(_OptimizerV2):
    def __init__(self, learning_rate=0.01):
        self.learning_rate = learning_rate


_TfKerasSGD.__name__ = "SGD"
_TfKerasSGD.__module__ = "tf_keras.src.optimizers.legacy.gradient_descent"


HAVE_TF_KERAS = importlib.util.find_spec("tf_keras") is not None


def _tf_keras_sgd(lr):
    if HAVE_TF_KERAS:
        import tf_keras

        return tf_keras.optimizers.legacy.SGD(learning_rate=lr)
    return _TfKerasSGD(lr)


def test_tf_keras_legacy_optimizers_are_recognised():
    opt = _tf_keras_sgd(0.25)
    assert compat.is_keras_optimizer(opt) and compat.is_optimizer(opt)
    assert not compat.is_keras_optimizer(object())
    stranger = type("SGD", (), {"apply_gradients": lambda self, gv: None,
                                "__module__": "mylib.optim"})()
    assert not compat.is_keras_optimizer(stranger)


def test_optimizer_wrapper_takes_a_tf_keras_legacy_optimizer():
    opt = sok.OptimizerWrapper(_tf_keras_sgd(0.25))
    assert opt.algorithm == "sgd"
    v = sok.DynamicVariable(dimension=2, initializer="1")
    keys = tf.constant([5, 9], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(v, keys))
    opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
    got_keys, rows = sok.export(v)
    order = np.argsort(got_keys.numpy())
    np.testing.assert_array_equal(got_keys.numpy()[order], [5, 9])
    np.testing.assert_allclose(rows.numpy()[order], np.full((2, 2), 0.75))


def test_optimizer_scope_routes_a_tf_keras_optimizer(monkeypatch):
    """Native use: under sok.OptimizerScope a tf_keras optimizer's own
    apply_gradients updates sok variables row by row."""
    fake = types.ModuleType("tf_keras")
    fake.optimizers = types.SimpleNamespace(Optimizer=None,
                                            legacy=types.SimpleNamespace(Optimizer=_OptimizerV2))
    if not HAVE_TF_KERAS:
        monkeypatch.setitem(sys.modules, "tf_keras", fake)
    opt = _tf_keras_sgd(0.5)
    v = sok.DynamicVariable(dimension=3, initializer="2")
    keys = tf.constant([1, 4], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(v, keys))
    grads = tape.gradient(loss, [v])
    with sok.OptimizerScope([v]):
        opt.apply_gradients(zip(grads, [v]))
    rows, _ = v.find(keys)
    np.testing.assert_allclose(rows.numpy(), np.full((2, 3), 1.5))


# ----------------------------------------------------------------- Variable


def test_variable_modes_give_sok_classes():
    value = np.arange(15, dtype=np.float32).reshape(5, 3)
    d = sok.Variable(value, dtype=tf.float32)
    loc = sok.Variable(value, dtype=tf.float32, mode="localized:0")
    assert type(d) is sok.DistributedVariable and type(loc) is sok.LocalizedVariable
    assert isinstance(d, sok.Variable) and isinstance(d, tf.Variable)
    assert (d.target_gpu, loc.target_gpu) == (-1, 0)
    assert d.num_gpus == 1 and d.global_gpu_id == 0 and tuple(d.global_shape) == (5, 3)
    np.testing.assert_array_equal(d.numpy(), value)
    np.testing.assert_array_equal(loc.numpy(), value)
    ids = tf.constant([0, 4], tf.int64)
    np.testing.assert_array_equal(d.key_map(ids).numpy(), [0, 4])  # one worker: id // 1
    np.testing.assert_array_equal(loc.key_map(ids).numpy(), [0, 4])
    with pytest.raises(ValueError, match="localized"):
        sok.LocalizedVariable(value)


def test_variable_from_shape_and_initializer():
    v = sok.Variable(shape=[6, 4], initializer=tf.keras.initializers.Constant(0.25),
                     dtype=tf.float32)
    np.testing.assert_array_equal(v.numpy(), np.full((6, 4), 0.25, np.float32))
    assert v.dtype == tf.float32 and tuple(v.global_shape) == (6, 4)
    z = sok.Variable(shape=[2, 3], initializer="zeros")
    np.testing.assert_array_equal(z.numpy(), np.zeros((2, 3)))


# ---------------------------------------------------------- DynamicVariable


def test_dynamic_variable_defaults():
    v = sok.DynamicVariable(dimension=3)
    assert v.var_type == "hbm" and v.backend_type == "hbm"
    assert v.key_type == tf.int64 and v.handle_dtype == tf.float32 and v.dtype == tf.float32
    assert v.dimension == 3 and v.target_gpu == -1 and v.num_gpus == 1
    assert v.config_dict == {} and v.initializer_str == ""
    rows = tf.nn.embedding_lookup(v, tf.constant([7, 8], tf.int64)).numpy()
    assert rows.shape == (2, 3) and np.all(np.abs(rows) <= 0.05)  # SOK's small random start


@pytest.mark.parametrize("text,value", [("13", 13.0), ("-0.5", -0.5), ("1e-2", 0.01)])
def test_dynamic_variable_string_number_is_a_constant(text, value):
    v = sok.DynamicVariable(dimension=3, initializer=text)
    rows = tf.nn.embedding_lookup(v, tf.constant([0, 1, 2 ** 40], tf.int64))
    np.testing.assert_allclose(rows.numpy(), np.full((3, 3), value, np.float32))
    assert v.initializer_str == text


def test_dynamic_variable_size_is_keys_and_dimension():
    v = sok.DynamicVariable(dimension=3, initializer="13")
    np.testing.assert_array_equal(v.size.numpy(), [0, 3])
    tf.nn.embedding_lookup(v, tf.constant([0, 1, 2 ** 40, 1], tf.int64))
    assert int(v.size[0]) == 3 and int(v.size[1]) == 3


def test_capacities_without_var_type():
    """SOK scripts pass init_capacity/max_capacity with the default
    var_type ("hbm"), which keeps every key."""
    v = sok.DynamicVariable(dimension=2, initializer="1", init_capacity=8, max_capacity=16)
    assert v.var_type == "hbm"
    assert v.config_dict == {"init_capacity": 8, "max_capacity": 16}
    keys = np.arange(40, dtype=np.int64)
    tf.nn.embedding_lookup(v, tf.constant(keys))
    assert int(v.size[0]) == 40
    assert sorted(sok.export(v)[0].numpy().tolist()) == keys.tolist()


def test_hybrid_table_is_bounded():
    v = sok.DynamicVariable(dimension=2, var_type="hybrid", init_capacity=8, max_capacity=8)
    for start in range(0, 32, 4):
        tf.nn.embedding_lookup(v, tf.constant(np.arange(start, start + 4, dtype=np.int64)))
    assert int(v.size[0]) == 8
    assert set(sok.export(v)[0].numpy().tolist()) >= {28, 29, 30, 31}  # the latest stay


def test_embedding_lookup_gradient_matches_tf_variable():
    """tf.nn.embedding_lookup on a DynamicVariable trains like on a tf.Variable."""
    dense = tf.Variable(np.full((10, 2), 3.0, np.float32))
    v = sok.DynamicVariable(dimension=2, initializer="3")
    ids = tf.constant([[1, 4], [4, 9]], tf.int64)
    wrapped, plain = sok.OptimizerWrapper(tf.keras.optimizers.SGD(0.1)), None
    with tf.GradientTape(persistent=True) as tape:
        a = tf.nn.embedding_lookup(v, ids)
        b = tf.nn.embedding_lookup(dense, ids)
        la, lb = tf.reduce_sum(a * a), tf.reduce_sum(b * b)
    np.testing.assert_allclose(a.numpy(), b.numpy())
    ga, gb = tape.gradient(la, [v])[0], tape.gradient(lb, [dense])[0]
    assert isinstance(ga, tf.IndexedSlices)
    wrapped.apply_gradients([(ga, v)])
    plain = dense - 0.1 * tf.convert_to_tensor(gb)
    rows, found = v.find(tf.constant([1, 4, 9], tf.int64))
    assert found.numpy().all()
    np.testing.assert_allclose(rows.numpy(), plain.numpy()[[1, 4, 9]], rtol=1e-6)


def test_int32_ids_read_an_int64_table():
    v = sok.DynamicVariable(dimension=2, initializer="4")
    rows = tf.nn.embedding_lookup(v, tf.constant([3, 5], tf.int32))
    np.testing.assert_array_equal(rows.numpy(), np.full((2, 2), 4.0))
    emb = sok.lookup_sparse(v, tf.ragged.constant([[3, 5]], tf.int32), combiners="sum")
    np.testing.assert_array_equal(emb.numpy(), [[8.0, 8.0]])


def test_assign_and_export():
    v = sok.DynamicVariable(dimension=3, initializer="0")
    keys = np.array([2 ** 40, 7, 11], np.int64)
    values = np.arange(9, dtype=np.float32).reshape(3, 3)
    sok.assign(v, tf.constant(keys), tf.constant(values))
    got_keys, got_rows = sok.export(v)
    order = np.argsort(got_keys.numpy())
    ref = np.argsort(keys)
    np.testing.assert_array_equal(got_keys.numpy()[order], keys[ref])
    np.testing.assert_array_equal(got_rows.numpy()[order], values[ref])


def test_filter_variables_as_documented():
    v1 = tf.Variable([[0, 1, 2]])
    v2 = sok.Variable([[3, 4, 5]])
    v3 = sok.Variable([[6, 7, 8]], mode="localized:0")
    v4 = sok.DynamicVariable(dimension=3, initializer="13")
    sok_vars, other_vars = sok.filter_variables([v1, v2, v3, v4])
    assert sok_vars == [v2, v3, v4] and other_vars == [v1]


def test_sparse_read_and_evict_as_documented():
    """SOK's pattern: each step reads a new block of keys from a table that
    holds two blocks, trains it (SGD, lr 1, loss = sum: every read row loses
    1), and gets back the block read two steps before, at its trained value."""
    block, steps, dim = 4, 5, 3
    v = sok.DynamicVariable(dimension=dim, var_type="hybrid", initializer="11",
                            init_capacity=2 * block, max_capacity=2 * block)
    optimizer = sok.OptimizerWrapper(tf.keras.optimizers.SGD(learning_rate=1.0))
    for i in range(steps):
        indices = tf.constant(range(i * block, (i + 1) * block), tf.int64)
        with tf.GradientTape() as tape:
            embedding, evict_key, evict_value = sok.sparse_read_and_evict(v, indices)
            loss = tf.reduce_sum(embedding)
        optimizer.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
        np.testing.assert_array_equal(embedding.numpy(), np.full((block, dim), 11.0))
        want = list(range((i - 2) * block, (i - 1) * block)) if i >= 2 else []
        assert sorted(evict_key.numpy().tolist()) == want
        np.testing.assert_array_equal(evict_value.numpy(), np.full((len(want), dim), 10.0))
    with pytest.raises(TypeError, match="bounded"):  # SOK raises TypeError
        sok.sparse_read_and_evict(sok.DynamicVariable(2), tf.constant([1], tf.int64))


# ------------------------------------------- DynamicVariable as a tf.Variable


def _sorted_rows(keys, rows):
    order = np.argsort(keys)
    return np.asarray(keys)[order], np.asarray(rows)[order]


def test_dynamic_variable_is_a_tf_variable_in_a_session():
    """SOK's DynamicVariable is a tf.Variable: filter_variables' lists can be
    fetched whole (a table fetches as its size [keys, dimension]) and the
    graph's variable collections hold it as they hold a tf.Variable."""
    with tf.Graph().as_default():
        v1 = tf.compat.v1.Variable([[0.0, 1.0, 2.0]])
        v2 = sok.Variable([[3.0, 4.0, 5.0]])
        v3 = sok.Variable([[6.0, 7.0, 8.0]], mode="localized:0")
        v4 = sok.DynamicVariable(dimension=3, initializer="13")
        frozen = sok.DynamicVariable(dimension=2, trainable=False)
        rows = tf.nn.embedding_lookup(v4, tf.constant([4, 2 ** 40, 4], tf.int64))
        assert isinstance(v4, tf.Variable) and isinstance(frozen, tf.Variable)
        assert any(x is v4 for x in tf.compat.v1.global_variables())
        assert any(x is frozen for x in tf.compat.v1.global_variables())
        assert any(x is v4 for x in tf.compat.v1.trainable_variables())
        assert not any(x is frozen for x in tf.compat.v1.trainable_variables())
        sok_vars, other_vars = sok.filter_variables([v1, v2, v3, v4])
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            np.testing.assert_array_equal(sess.run(rows), np.full((3, 3), 13.0))
            got_sok, got_other = sess.run((sok_vars, other_vars))
    np.testing.assert_array_equal(got_sok[0], [[3.0, 4.0, 5.0]])
    np.testing.assert_array_equal(got_sok[1], [[6.0, 7.0, 8.0]])
    np.testing.assert_array_equal(got_sok[2], [2, 3])  # two keys of dimension 3
    assert len(got_sok) == 3 and len(got_other) == 1
    np.testing.assert_array_equal(got_other[0], [[0.0, 1.0, 2.0]])


def test_tf1_saver_saves_and_restores_dynamic_tables(tmp_path):
    """tf.compat.v1.train.Saver() over the global variables saves each
    table's keys and rows under the table's graph name (unique, with its
    name scope, as a tf.Variable's) and restoring gives back exactly the
    saved keys and rows, in the same Session and in a new graph."""
    rng = np.random.default_rng(7)
    keys_a = np.array([3, 2 ** 40, 11], np.int64)
    rows_a = rng.normal(size=(3, 2)).astype(np.float32)
    keys_b = np.array([5, 6], np.int64)
    rows_b = rng.normal(size=(2, 2)).astype(np.float32)
    keys_c = np.array([-4], np.int64)
    rows_c = rng.normal(size=(1, 2)).astype(np.float32)
    dense = rng.normal(size=(2, 2)).astype(np.float32)
    want = [(keys_a, rows_a), (keys_b, rows_b), (keys_c, rows_c)]

    def build():
        a = sok.DynamicVariable(dimension=2)
        with tf.name_scope("tower"):
            b = sok.DynamicVariable(dimension=2, var_type="hybrid", init_capacity=8,
                                    max_capacity=8)
        c = sok.DynamicVariable(dimension=2)  # a second table with the default name
        w = tf.compat.v1.Variable(dense, name="w")
        return (a, b, c), w, tf.compat.v1.train.Saver()

    def check(exported):
        for got, expected in zip(exported, want):
            for g, x in zip(_sorted_rows(*got), _sorted_rows(*expected)):
                np.testing.assert_array_equal(g, x)

    with tf.Graph().as_default():
        tables, w, saver = build()
        fill = [sok.assign(t, k, r) for t, (k, r) in zip(tables, want)]
        change = [sok.assign(tables[0], np.array([3, 99], np.int64),
                             np.zeros((2, 2), np.float32)),
                  sok.assign(tables[1], np.array([5], np.int64), np.ones((1, 2), np.float32)),
                  tables[2].remove(tf.constant(keys_c)), w.assign(tf.zeros([2, 2]))]
        exports = [sok.export(t) for t in tables]
        meta = tf.compat.v1.train.export_meta_graph()
        # A {name: variable} dict would save a tf.Variable's dense value.
        with pytest.raises(NotImplementedError, match="in a var_list list"):
            tf.compat.v1.train.Saver({"table": tables[0]})
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(fill)
            path = saver.save(sess, str(tmp_path / "ckpt"))
            sess.run(change)
            saver.restore(sess, path)
            check(sess.run(exports))
            np.testing.assert_array_equal(sess.run(w), dense)
    names = {n for n, _ in tf.train.list_variables(path)}
    saved = {n[:-len("-keys")] for n in names if n.endswith("-keys")}
    assert len(saved) == 3 and {"DynamicVariable", "tower/DynamicVariable"} <= saved
    for table in saved:
        assert {table + s for s in ("-values", "-timestamps", "-frequencies")} <= names
    # The meta graph keeps the other variables (a table is not rebuilt from
    # a VariableDef, so it alone is left out).
    assert len(meta.collection_def["variables"].bytes_list.value) == 1

    with tf.Graph().as_default():
        tables, w, saver = build()
        exports = [sok.export(t) for t in tables]
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, path)
            check(sess.run(exports))
            np.testing.assert_array_equal(sess.run(w), dense)


def test_tf1_optimizers_see_a_dynamic_variable_as_trainable():
    """In trainable_variables(), the table gets its gradient (IndexedSlices of
    keys) from optimizer.minimize(loss): plain gradient descent updates it
    through scatter_sub, and inside sok.OptimizerScope a native Adam does
    (lazily); outside the scope Adam cannot make dense slots for it and says
    so."""
    ids = np.array([5, 7, 5], np.int64)
    weights = np.array([[1.0], [2.0]], np.float32)
    # d(sum(rows[ids] @ weights))/d row = count of the key * weights^T
    grad = {5: 2 * weights[:, 0], 7: weights[:, 0]}
    lr, b1, b2, eps = 0.1, 0.9, 0.999, 1e-8
    want = {
        "sgd": {k: 1.0 - lr * g for k, g in grad.items()},
        "adam": {k: 1.0 - lr * np.sqrt(1 - b2) / (1 - b1) * ((1 - b1) * g)
                 / (np.sqrt((1 - b2) * g * g) + eps) for k, g in grad.items()},
    }
    for kind in ("sgd", "adam"):
        with tf.Graph().as_default():
            table = sok.DynamicVariable(dimension=2, initializer="1")
            w = tf.compat.v1.Variable(weights, trainable=False)
            loss = tf.reduce_sum(tf.matmul(tf.nn.embedding_lookup(table, ids), w))
            if kind == "sgd":
                train = tf.compat.v1.train.GradientDescentOptimizer(lr).minimize(loss)
            else:
                opt = tf.compat.v1.train.AdamOptimizer(lr, b1, b2, eps)
                with sok.OptimizerScope([table]):
                    train = opt.minimize(loss)
                with pytest.raises(NotImplementedError, match="DynamicVariable 'DynamicVariable'"):
                    tf.compat.v1.train.AdamOptimizer(lr).minimize(loss)
            export = sok.export(table)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                sess.run(train)
                keys, rows = sess.run(export)
        assert sorted(keys.tolist()) == [5, 7]
        for k, r in zip(keys, rows):
            np.testing.assert_allclose(r, want[kind][int(k)], rtol=1e-5, err_msg=kind)


def test_dynamic_variable_as_a_tf_variable_eagerly():
    """Eagerly: a tf.Variable that tf.Module (and Keras 2 layers) list among
    their variables, whose tape gradient stays IndexedSlices addressed by
    key, and whose dense reads raise NotImplementedError naming the table,
    as SOK's do in dynamic mode."""
    table = sok.DynamicVariable(dimension=2, initializer="1", name="emb")
    frozen = sok.DynamicVariable(dimension=2, trainable=False, name="frozen")
    assert isinstance(table, tf.Variable)
    module = tf.Module()
    module.table, module.frozen = table, frozen
    assert [v.name for v in module.trainable_variables] == ["emb"]
    assert sorted(v.name for v in module.variables) == ["emb", "frozen"]

    class Layer(tf.keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.table = table

    layer = Layer()
    if compat.KERAS_MAJOR_VERSION == 2:  # Keras 3 lists only its own variables
        assert [v.name for v in layer.trainable_weights] == ["emb"]
        # Dense weight lists (get_weights, HDF5 / .keras files) cannot hold
        # the table: they say so rather than leave it out.
        with pytest.raises(NotImplementedError, match="DynamicVariable 'emb'"):
            layer.get_weights()

    ids = tf.constant([9, 2 ** 40, 9], tf.int64)
    scale = np.array([1.0, -2.0], np.float32)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(table, ids) * scale)
    grad = tape.gradient(loss, [table])[0]
    assert isinstance(grad, tf.IndexedSlices)
    # One row per distinct key, its repeats summed (key 9 is read twice).
    np.testing.assert_array_equal(grad.indices.numpy(), [9, 2 ** 40])
    np.testing.assert_array_equal(grad.values.numpy(), [2 * scale, scale])

    for attempt in (table.value, table.read_value, table.numpy,
                    lambda: table.assign(np.zeros((1, 2), np.float32)),
                    lambda: tf.convert_to_tensor(table), lambda: table + 1.0):
        with pytest.raises(NotImplementedError, match="DynamicVariable 'emb'.*dense value"):
            attempt()


# ------------------------------------------------------------------- lookup


def test_lookup_sparse_as_documented():
    """The lookup_sparse example of SOK's docs, checked with numpy."""
    t1 = np.arange(17 * 3).reshape(17, 3)
    t2 = np.arange(7 * 5).reshape(7, 5)
    v1 = sok.Variable(t1, dtype=tf.float32)
    v2 = sok.Variable(t2, dtype=tf.float32)
    indices1 = tf.SparseTensor(indices=[[0, 0], [0, 1], [1, 0], [1, 1], [1, 2]],
                               values=tf.constant([1, 1, 3, 4, 5], tf.int64),
                               dense_shape=[2, 3])
    indices2 = tf.SparseTensor(indices=[[0, 0], [1, 0], [1, 1]],
                               values=tf.constant([1, 2, 3], tf.int64), dense_shape=[2, 2])
    emb = sok.lookup_sparse([v1, v2], [indices1, indices2], combiners=["sum", "sum"])
    assert isinstance(emb, list) and len(emb) == 2
    np.testing.assert_allclose(emb[0].numpy(), [t1[1] + t1[1], t1[3] + t1[4] + t1[5]])
    np.testing.assert_allclose(emb[1].numpy(), [t2[1], t2[2] + t2[3]])
    mean = sok.lookup_sparse([v1], [indices1])  # SOK's default combiner is mean
    np.testing.assert_allclose(mean[0].numpy(), [t1[1], (t1[3] + t1[4] + t1[5]) / 3])
    single = sok.lookup_sparse(v1, indices1, combiners="sum")
    assert isinstance(single, tf.Tensor)


def test_lookup_sparse_weights_match_tf():
    table = np.random.default_rng(3).standard_normal((9, 4)).astype(np.float32)
    v = sok.Variable(table)
    ids = tf.ragged.constant([[1, 2], [8]], tf.int64)
    weights = tf.ragged.constant([[0.5, 2.0], [3.0]], tf.float32)
    got = sok.lookup_sparse([v], [ids], [weights], combiners=["sum"])[0]
    ref = tf.nn.embedding_lookup_sparse(tf.constant(table), ids.to_sparse(),
                                        weights.to_sparse(), combiner="sum")
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-6)


def test_all2all_dense_embedding_is_a_gather():
    table = np.arange(20, dtype=np.float32).reshape(10, 2)
    v = sok.Variable(table)
    ids = tf.constant([[0, 9], [3, 3]], tf.int64)
    np.testing.assert_array_equal(sok.all2all_dense_embedding(v, ids).numpy(),
                                  tf.gather(table, ids).numpy())


def test_sok_sgd_updates_rows():
    table = np.ones((5, 2), np.float32)
    v = sok.Variable(table)
    opt = sok.SGD(lr=0.5)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(sok.lookup_sparse(v, tf.ragged.constant([[2]], tf.int64),
                                               combiners="sum"))
    opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
    expected = table.copy()
    expected[2] -= 0.5
    np.testing.assert_allclose(v.numpy(), expected)


# ---------------------------------------------------------------- dump/load


def test_dump_load_as_documented(tmp_path):
    """The dump/load example of SOK's docs: a DynamicVariable trained one
    step with a wrapped SGD, dumped, loaded into a fresh table."""
    v = sok.DynamicVariable(dimension=3, initializer="13")
    optimizer = sok.OptimizerWrapper(tf.keras.optimizers.SGD(learning_rate=1.0))
    indices = tf.convert_to_tensor([0, 1, 2 ** 40], dtype=tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(v, indices))
    grads = tape.gradient(loss, [v])
    optimizer.apply_gradients(zip(grads, [v]))
    sok.dump(str(tmp_path), v, optimizer)
    fresh = sok.DynamicVariable(dimension=3, initializer="0", name=v.name)
    sok.load(str(tmp_path), fresh, sok.OptimizerWrapper(tf.keras.optimizers.SGD(1.0)))
    keys, rows = sok.export(fresh)
    order = np.argsort(keys.numpy())
    np.testing.assert_array_equal(keys.numpy()[order], [0, 1, 2 ** 40])
    np.testing.assert_allclose(rows.numpy()[order], np.full((3, 3), 12.0))


def test_incremental_model_dump_returns_updated_rows():
    import datetime
    import time

    v = sok.DynamicVariable(dimension=2, var_type="hybrid", init_capacity=16, max_capacity=16,
                            initializer="1")
    tf.nn.embedding_lookup(v, tf.constant([1, 2], tf.int64))
    time.sleep(0.01)
    threshold = datetime.datetime.now(datetime.timezone.utc)
    time.sleep(0.01)
    tf.nn.embedding_lookup(v, tf.constant([5], tf.int64))
    keys, values = sok.incremental_model_dump([v], threshold)
    assert np.asarray(keys[0]).tolist() == [5]
    np.testing.assert_array_equal(np.asarray(values[0]), [[1.0, 1.0]])


def test_a_naive_threshold_on_a_machine_off_utc_is_warned_of(monkeypatch):
    """A naive datetime is UTC (SOK's datetime.utcnow()); on a machine whose
    local time is UTC+9, datetime.now() given by mistake dumped nothing
    (9 h in the future), without a word. A warning names the offset; an
    aware datetime, and any threshold on a machine on UTC, give none."""
    import datetime
    import time
    import warnings

    if not hasattr(time, "tzset"):
        pytest.skip("time.tzset is Unix only")
    v = sok.DynamicVariable(dimension=2, initializer="1")
    tf.nn.embedding_lookup(v, tf.constant([1, 2], tf.int64))
    naive = datetime.datetime(2000, 1, 1)
    try:
        monkeypatch.setenv("TZ", "Asia/Tokyo")
        time.tzset()
        with pytest.warns(UserWarning, match=r"time_threshold=.* has no time zone and is taken "
                                             r"as UTC .* local time is UTC\+9 h"):
            keys, _ = sok.incremental_model_dump([v], naive)
        assert sorted(np.asarray(keys[0]).tolist()) == [1, 2]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            sok.incremental_model_dump([v], naive.replace(tzinfo=datetime.timezone.utc))
        monkeypatch.setenv("TZ", "UTC")
        time.tzset()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            sok.incremental_model_dump([v], naive)
    finally:
        monkeypatch.undo()
        time.tzset()


# ------------------------------------- dump/load: a plain optimizer's own slots
#
# A plain legacy Keras optimizer (or a tf.compat.v1.train one) trains static
# sok.Variables with its own apply_gradients and keeps their slots itself;
# sok.dump / sok.load with that optimizer carry those slots and its step.
# Each case: (native slot name, name in the dump), the slot names from
# TensorFlow's optimizer documentation.

NATIVE_KERAS = [
    pytest.param("SGD", dict(learning_rate=0.1, decay=0.5), [], id="SGD"),
    pytest.param("SGD", dict(learning_rate=0.05, momentum=0.9, nesterov=True),
                 [("momentum", "momentum")], id="SGD-momentum"),
    pytest.param("Adamax", dict(learning_rate=0.05), [("m", "m"), ("v", "v")], id="Adamax"),
    pytest.param("Adadelta", dict(learning_rate=1.0),
                 [("accum_grad", "accum"), ("accum_var", "accum_update")], id="Adadelta"),
    pytest.param("Adagrad", dict(learning_rate=0.1), [("accumulator", "accumulator")],
                 id="Adagrad"),
    pytest.param("Ftrl", dict(learning_rate=0.1, l1_regularization_strength=0.01,
                              l2_regularization_strength=0.01),
                 [("accumulator", "accumulator"), ("linear", "linear")], id="Ftrl"),
    pytest.param("Adam", dict(learning_rate=0.05), [("m", "m"), ("v", "v")], id="Adam"),
    pytest.param("RMSprop", dict(learning_rate=0.05, momentum=0.5, centered=True),
                 [("rms", "rms"), ("momentum", "momentum"), ("mg", "mg")], id="RMSprop"),
]

# TensorFlow registers no GPU kernel for the sparse updates of TF1's Momentum
# and RMSProp (ResourceSparseApplyMomentum / -RMSProp): on a GPU they cannot
# train a table there, a plain tf.Variable's as little as a sok table's.
_NO_GPU_SPARSE_APPLY = pytest.mark.cpu_only(
    reason="TensorFlow has no GPU kernel for this optimizer's sparse update")
NATIVE_TF1 = [
    pytest.param("MomentumOptimizer", dict(learning_rate=0.05, momentum=0.9, use_nesterov=True),
                 [("momentum", "momentum")], id="Momentum", marks=_NO_GPU_SPARSE_APPLY),
    pytest.param("AdagradOptimizer", dict(learning_rate=0.1), [("accumulator", "accumulator")],
                 id="Adagrad"),
    pytest.param("AdadeltaOptimizer", dict(learning_rate=1.0),
                 [("accum", "accum"), ("accum_update", "accum_update")], id="Adadelta"),
    pytest.param("FtrlOptimizer", dict(learning_rate=0.1, l1_regularization_strength=0.01),
                 [("accum", "accumulator"), ("linear", "linear")], id="Ftrl"),
    pytest.param("AdamOptimizer", dict(learning_rate=0.05), [("m", "m"), ("v", "v")], id="Adam"),
    pytest.param("RMSPropOptimizer", dict(learning_rate=0.05, momentum=0.5, centered=True),
                 [("rms", "rms"), ("momentum", "momentum"), ("mg", "mg")], id="RMSProp",
                 marks=_NO_GPU_SPARSE_APPLY),
]


def _legacy_keras_optimizers():
    """Where a SOK script finds OptimizerV2 optimizers: tf.keras.optimizers
    after sok.init() (TF 2.15: the legacy ones; TF 1.15: all of them), else
    tf_keras' legacy ones; None on Keras 3 without tf_keras."""
    sok.init(comm_tool="none")
    if "OptimizerV2" in [c.__name__ for c in tf.keras.optimizers.SGD.__mro__]:
        return tf.keras.optimizers
    if HAVE_TF_KERAS:
        import tf_keras

        return tf_keras.optimizers.legacy
    return None


def _native_tables(values):
    """A distributed and a localized table, named as the dump names them."""
    return [sok.Variable(values[0], name="dist"),
            sok.Variable(values[1], mode="localized:0", name="loc")]


def _native_loss(tables, i):
    rng = np.random.RandomState(i)
    a = tf.ragged.constant([list(rng.randint(0, 20, 3)) for _ in range(5)], tf.int64)
    b = tf.ragged.constant([list(rng.randint(0, 9, 2)) for _ in range(5)], tf.int64)
    x, y = sok.lookup_sparse(tables, [a, b], combiners=["sum", "mean"])
    return tf.reduce_sum(tf.square(x - 0.5)) + tf.reduce_sum(tf.square(y + 1.0))


def _native_step(opt, tables, i):
    with tf.GradientTape() as tape:
        loss = _native_loss(tables, i)
    opt.apply_gradients(zip(tape.gradient(loss, tables), tables))


def _native_start():
    rng = np.random.default_rng(5)
    return [rng.normal(size=(20, 4)).astype(np.float32),
            rng.normal(size=(9, 4)).astype(np.float32)]


def test_a_keras_optimizers_state_is_dumped_as_it_is_or_refused(tmp_path):
    """An optimizer that keeps a variable's state indexed by variable (Keras
    3's) holds it out of sok's reach: sok.dump wrote the wrapper's zero
    momentum and step 0 for tables such an optimizer trained itself, and
    sok.load filled slots its updates never read; both are refused now,
    naming the table. An optimizer whose slots sok reads (OptimizerV2: TF
    2.15's tf.keras after sok.init(), TF 1.15's) dumps its own state."""
    sok.init(comm_tool="none")
    tables, opt = _native_tables(_native_start()), tf.keras.optimizers.SGD(0.1, momentum=0.9)
    for i in range(3):
        _native_step(opt, tables, i)
    path = str(tmp_path / "native")
    if not callable(getattr(opt, "get_slot", None)):
        with pytest.raises(ValueError, match=r"updated sok variable 'dist.*momentum.*OptimizerScope"):
            sok.dump(path, tables, opt)
        assert not os.path.exists(path)
        wrapped = sok.OptimizerWrapper(tf.keras.optimizers.SGD(0.1, momentum=0.9))
        sok.dump(path, _native_tables(_native_start()), wrapped)
        with pytest.raises(ValueError, match=r"updated sok variable 'dist"):
            sok.load(path, tables, opt)
        return
    momentum = opt.get_slot(tables[0], "momentum").numpy()
    sok.dump(path, tables, opt)
    opt.get_slot(tables[0], "momentum").assign(tf.zeros_like(momentum))
    sok.load(path, tables, opt)
    np.testing.assert_array_equal(opt.get_slot(tables[0], "momentum").numpy(), momentum)
    assert np.abs(momentum).max() > 0


@pytest.mark.parametrize("name,kwargs,slots", NATIVE_KERAS)
def test_dump_load_keeps_a_plain_keras_optimizers_slots(tmp_path, name, kwargs, slots):
    module = _legacy_keras_optimizers()
    if module is None:
        pytest.skip("Keras 3 has no OptimizerV2 optimizers to train sok.Variables directly, "
                    "and tf_keras is not installed")

    def make():
        return getattr(module, name)(**kwargs)

    start = _native_start()
    tables, opt = _native_tables(start), make()
    for i in range(3):
        _native_step(opt, tables, i)
    values = [t.numpy() for t in tables]
    state = {(j, n): opt.get_slot(t, n).numpy() for j, t in enumerate(tables) for n, _ in slots}
    assert int(opt.iterations.numpy()) == 3
    path = str(tmp_path / "native")
    sok.dump(path, tables, opt)

    # Everything overwritten, then loaded back into the same optimizer.
    for t in tables:
        t.assign(tf.fill(t.shape, 7.0))
        for n, _ in slots:
            opt.get_slot(t, n).assign(tf.fill(t.shape, -3.0))
    opt.iterations.assign(50)
    sok.load(path, tables, opt)
    for t, want in zip(tables, values):
        np.testing.assert_array_equal(t.numpy(), want)
    for (j, n), want in state.items():
        np.testing.assert_array_equal(opt.get_slot(tables[j], n).numpy(), want)
    assert int(opt.iterations.numpy()) == 3

    # Restored at the start into a fresh optimizer: the next step is the
    # original optimizer's next step.
    fresh_tables, fresh = _native_tables([np.zeros_like(s) for s in start]), make()
    sok.load(path, fresh_tables, fresh)
    for (j, n), want in state.items():
        np.testing.assert_array_equal(fresh.get_slot(fresh_tables[j], n).numpy(), want)
    assert int(fresh.iterations.numpy()) == 3
    _native_step(opt, tables, 3)
    _native_step(fresh, fresh_tables, 3)
    for got, want in zip(fresh_tables, tables):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    for j, n in state:
        np.testing.assert_array_equal(fresh.get_slot(fresh_tables[j], n).numpy(),
                                      opt.get_slot(tables[j], n).numpy())

    # The dump names slots as an OptimizerWrapper's dump does. (A wrapper
    # refuses Keras 2's learning-rate decay, which its row updates would
    # ignore; the native optimizer applies it itself.)
    without_decay = {k: v for k, v in kwargs.items() if k != "decay"}
    wrapped_tables = _native_tables(start)
    wrapped = sok.OptimizerWrapper(getattr(module, name)(**without_decay))
    sok.load(path, wrapped_tables, wrapped)
    assert int(wrapped.iterations.numpy()) == 3
    for j in range(2):
        for n, dumped in slots:
            np.testing.assert_array_equal(wrapped.get_slot(wrapped_tables[j], dumped).numpy(),
                                          state[(j, n)])


@pytest.mark.parametrize("name,kwargs,slots", NATIVE_TF1)
def test_dump_load_keeps_a_plain_tf1_optimizers_slots_in_a_session(tmp_path, name, kwargs,
                                                                   slots):
    """The TF1 script: train ops of a tf.compat.v1.train optimizer on sok
    tables, run in a Session; the restore at the start builds its train op
    after sok.load (which made the slots) and runs no initializer after it."""
    def make():
        return getattr(tf.compat.v1.train, name)(**kwargs)

    def train_op(opt, tables, i):
        grads = tf.gradients(_native_loss(tables, i), tables)
        return opt.apply_gradients(zip(grads, tables))

    def slot_vars(opt, tables):
        return {(j, n): opt.get_slot(t, n) for j, t in enumerate(tables) for n, _ in slots}

    def beta_powers(opt):
        # Adam's step is in its beta powers.
        return list(opt._get_beta_accumulators()) if name == "AdamOptimizer" else []

    start = _native_start()
    path = str(tmp_path / "native")
    graph = tf.Graph()
    with graph.as_default():
        tables, opt = _native_tables(start), make()
        steps = [train_op(opt, tables, i) for i in range(4)]
        slot_of, powers = slot_vars(opt, tables), beta_powers(opt)
        overwrite = ([t.assign(tf.fill(tf.shape(t), 7.0)) for t in tables]
                     + [s.assign(tf.fill(tf.shape(s), -3.0)) for s in slot_of.values()]
                     + [p.assign(0.5) for p in powers])
        with tf.compat.v1.Session(graph=graph) as sess, sess.as_default():
            sess.run(tf.compat.v1.global_variables_initializer())
            for i in range(3):
                sess.run(steps[i])
            values, state, saved_powers = sess.run([tables, slot_of, powers])
            sok.dump(path, tables, opt)
            sess.run(overwrite)
            sok.load(path, tables, opt)
            got_values, got_state, got_powers = sess.run([tables, slot_of, powers])
            sess.run(steps[3])
            next_values, next_state = sess.run([tables, slot_of])
    for got, want in zip(got_values, values):
        np.testing.assert_array_equal(got, want)
    for key, want in state.items():
        np.testing.assert_array_equal(got_state[key], want)
    for got, want in zip(got_powers, saved_powers):
        np.testing.assert_array_equal(got, want)

    graph = tf.Graph()
    with graph.as_default():
        tables, opt = _native_tables([np.zeros_like(s) for s in start]), make()
        init = tf.compat.v1.global_variables_initializer()
        with tf.compat.v1.Session(graph=graph) as sess, sess.as_default():
            sess.run(init)
            sok.load(path, tables, opt)
            restored = sess.run(slot_vars(opt, tables))
            sess.run(train_op(opt, tables, 3))
            fresh_values, fresh_state = sess.run([tables, slot_vars(opt, tables)])
    for key, want in state.items():
        np.testing.assert_array_equal(restored[key], want)
    for got, want in zip(fresh_values, next_values):
        np.testing.assert_array_equal(got, want)
    for key, want in next_state.items():
        np.testing.assert_array_equal(fresh_state[key], want)


def test_plain_optimizer_restored_at_start_goes_on_inside_optimizer_scope(tmp_path):
    """A native optimizer that trains sok tables inside sok.OptimizerScope
    (its slots are the scope's), restored before its first step: sok.load
    gives its slots to the optimizer itself, and the scope takes them (and
    the step) over on the first update."""
    def make():
        return tf.compat.v1.train.AdamOptimizer(0.05)

    def step(opt, tables, i):
        with sok.OptimizerScope(tables):
            _native_step(opt, tables, i)

    start = _native_start()
    tables, opt = _native_tables(start), make()
    for i in range(3):
        step(opt, tables, i)
    path = str(tmp_path / "scoped")
    sok.dump(path, tables, opt)
    fresh_tables, fresh = _native_tables([np.zeros_like(s) for s in start]), make()
    sok.load(path, fresh_tables, fresh)
    step(opt, tables, 3)
    step(fresh, fresh_tables, 3)
    for got, want in zip(fresh_tables, tables):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_a_keras_optimizer_built_before_a_load_takes_it(tmp_path):
    """Keras 3's fit builds its optimizer over every trainable variable
    before the first step, and a restore often builds it first: such an
    optimizer has updated no table itself, so sok.load gives the dumped
    state to the OptimizerScope that trains the tables (a built Keras 3
    optimizer was refused as if it had trained them natively)."""
    sok.init(comm_tool="none")

    def step(opt, tables, i):
        with sok.OptimizerScope(tables):
            _native_step(opt, tables, i)

    start = _native_start()
    tables, opt = _native_tables(start), tf.keras.optimizers.Adam(0.05)
    for i in range(3):
        step(opt, tables, i)
    path = str(tmp_path / "built")
    sok.dump(path, tables, opt)
    fresh_tables = _native_tables([np.zeros_like(s) for s in start])
    fresh = tf.keras.optimizers.Adam(0.05)
    if not callable(getattr(fresh, "get_slot", None)):  # indexes its state by variable
        fresh.build(fresh_tables)
    sok.load(path, fresh_tables, fresh)
    step(opt, tables, 3)
    step(fresh, fresh_tables, 3)
    for got, want in zip(fresh_tables, tables):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


# ---------------------------------------------------------- a SOK script


SCRIPT = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf
    if tf.__version__.startswith("1."):  # a TF2 script; TF 1.x starts in graph mode
        tf.compat.v1.enable_eager_execution()
    try:
        import horovod.tensorflow as hvd
    except ImportError:  # the script's habits, without Horovod
        class hvd:
            init = staticmethod(lambda: None)
            local_rank = staticmethod(lambda: 0)
    import sparse_operation_kit as sok

    hvd.init()
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    sok.init()

    v = sok.Variable(np.arange(4 * 3).reshape(4, 3), dtype=tf.float32)
    d = sok.DynamicVariable(dimension=3, initializer="13")
    print("v.size:", d.size)
    emb = tf.nn.embedding_lookup(d, tf.convert_to_tensor([0, 1, 2**40], dtype=tf.int64))
    print("v.size:", d.size)
    sp = tf.SparseTensor(indices=[[0, 0], [0, 1], [1, 0]],
                         values=tf.constant([0, 3, 2], tf.int64), dense_shape=[2, 2])
    out = sok.lookup_sparse([v], [sp], combiners=["sum"])[0]
    opt = tf.keras.optimizers.SGD(learning_rate=0.1)
    sok_vars, others = sok.filter_variables([v, d])
    assert len(sok_vars) == 2 and not others
    import json
    print("RESULT " + json.dumps(dict(keys=int(d.size[0]), emb=emb.numpy().tolist(),
                                      out=out.numpy().tolist())))
""")


def test_sok_documentation_script_runs_unchanged(tmp_path):
    path = tmp_path / "script.py"
    path.write_text(SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(sok_graph.__file__))] + sys.path)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    done = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")][-1]
    result = json.loads(line[len("RESULT "):])
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    assert result["keys"] == 3
    np.testing.assert_array_equal(result["emb"], np.full((3, 3), 13.0))
    np.testing.assert_array_equal(result["out"], [table[0] + table[3], table[2]])
