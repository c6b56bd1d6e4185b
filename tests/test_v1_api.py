"""The SOK 1.x API against plain TensorFlow.

Both layers (static and hashtable tables) start from the same rows as a
tf.Variable looked up with tf.nn.embedding_lookup / embedding_lookup_sparse;
forward results and the rows after 20 steps of each optimizer path must
agree (atol/rtol 1e-5) in graph mode (tf.compat.v1.Session) and in
tf.function. References:
- sok.optimizers.Adam: TensorFlow's own Adam (tf.compat.v1.train.AdamOptimizer
  in graph mode, tf.keras.optimizers.Adam in tf.function) on the plain table;
- sok.optimizers.LazyAdam and native Adam inside OptimizerScope (lazy: only
  rows in the batch move): a lazy Adam written below with plain TF ops;
- native Adagrad / SGD inside OptimizerScope: the same native optimizer on
  the plain table (TF's sparse Adagrad and SGD touch only the batch's rows).
Also: the graph-mode ordering rules of sok.Init, the session helpers, Saver.
"""

import inspect
import contextlib
import os
import re

import numpy as np
import pytest
import tensorflow as tf
from conftest import strategy_run

import sok_graph as sok
from sok_graph import compat, context

VOCAB, DIM, SLOTS, NNZ, BATCH, STEPS = 48, 4, 3, 2, 16, 20
LR = 0.05
TOL = dict(rtol=1e-5, atol=1e-5)


def _data(seed=0):
    """STEPS batches: dense ids [BATCH, SLOTS, NNZ] (skewed, with repeats),
    per-row lengths for the sparse layer (1..NNZ), targets."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(STEPS):
        ids = np.minimum(rng.zipf(1.3, size=(BATCH, SLOTS, NNZ)) - 1, VOCAB - 1)
        lengths = rng.integers(1, NNZ + 1, size=BATCH * SLOTS)
        y = rng.normal(size=(BATCH, 1)).astype(np.float32)
        batches.append((ids.astype(np.int64), lengths, y))
    return batches


def _sparse_value(ids, lengths):
    """(indices, values, dense_shape) of a [BATCH*SLOTS, NNZ] sparse tensor
    holding the first lengths[r] ids of row r."""
    flat = ids.reshape(BATCH * SLOTS, NNZ)
    idx = [(r, j) for r in range(flat.shape[0]) for j in range(lengths[r])]
    vals = [flat[r, j] for r, j in idx]
    return (np.array(idx, np.int64), np.array(vals, np.int64),
            np.array([BATCH * SLOTS, NNZ], np.int64))


def _sparse(ids, lengths):
    return tf.SparseTensor(*_sparse_value(ids, lengths))


W0 = np.random.default_rng(1).normal(scale=0.1, size=(VOCAB, DIM)).astype(np.float32)
DENSE_W = {"a2a": np.random.default_rng(2).normal(size=(SLOTS * NNZ * DIM, 1)).astype(np.float32),
           "dist": np.random.default_rng(3).normal(size=(SLOTS * DIM, 1)).astype(np.float32)}


def _make_layer(kind, use_hashtable):
    init = None if use_hashtable else tf.keras.initializers.Constant(W0)
    if kind == "a2a":
        return sok.All2AllDenseEmbedding(VOCAB, DIM, SLOTS, NNZ, use_hashtable=use_hashtable,
                                         embedding_initializer=init)
    return sok.DistributedEmbedding("mean", VOCAB, DIM, SLOTS, NNZ,
                                    use_hashtable=use_hashtable, embedding_initializer=init)


def _loss(emb, y, kind):
    flat = tf.reshape(emb, [BATCH, -1])
    return tf.reduce_mean(tf.square(tf.matmul(flat, DENSE_W[kind]) - y))


def _ref_forward(table, kind, ids, lengths):
    if kind == "a2a":
        return tf.nn.embedding_lookup(table, ids)
    out = tf.nn.embedding_lookup_sparse(table, _sparse(ids, lengths), None, combiner="mean")
    return tf.reshape(out, [BATCH, SLOTS, DIM])


def _sok_inputs(kind, ids, lengths):
    return tf.constant(ids) if kind == "a2a" else _sparse(ids, lengths)


class _LazyAdamRef:
    """Lazy Adam in plain TF ops: rows (and moments) of the batch's ids only."""

    def __init__(self, var, lr, b1=0.9, b2=0.999, eps=1e-7):
        self.var, self.lr, self.b1, self.b2, self.eps = var, lr, b1, b2, eps
        self.m = tf.Variable(tf.zeros_like(var))
        self.v = tf.Variable(tf.zeros_like(var))
        self.t = tf.Variable(0.0)

    def variables(self):
        return [self.m, self.v, self.t]

    def apply(self, grad):
        t = self.t.assign_add(1.0)
        ids, pos = tf.unique(grad.indices)
        g = tf.math.unsorted_segment_sum(grad.values, pos, tf.size(ids))
        m = self.b1 * tf.gather(self.m, ids) + (1 - self.b1) * g
        v = self.b2 * tf.gather(self.v, ids) + (1 - self.b2) * g * g
        alpha = self.lr * tf.sqrt(1 - self.b2 ** t) / (1 - self.b1 ** t)
        new = tf.gather(self.var, ids) - alpha * m / (tf.sqrt(v) + self.eps)
        return tf.group(self.var.scatter_update(tf.IndexedSlices(new, ids)),
                        self.m.scatter_update(tf.IndexedSlices(m, ids)),
                        self.v.scatter_update(tf.IndexedSlices(v, ids)))


# path -> (sok side: ("sok", factory) or ("scope", native factory); reference factory)
# Factories take the mode ("graph" / "function").
def _native(mode, name):
    if mode == "graph":
        return {"adam": lambda: tf.compat.v1.train.AdamOptimizer(LR, epsilon=1e-7),
                "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(LR),
                "sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(LR)}[name]()
    return {"adam": lambda: tf.keras.optimizers.Adam(LR, epsilon=1e-7),
            "adagrad": lambda: tf.keras.optimizers.Adagrad(LR),
            "sgd": lambda: tf.keras.optimizers.SGD(LR)}[name]()


PATHS = {
    "sok_adam": (lambda mode: ("sok", sok.optimizers.Adam(LR)), lambda mode, v: _native(mode, "adam")),
    "sok_lazy_adam": (lambda mode: ("sok", sok.optimizers.LazyAdam(LR)),
                      lambda mode, v: _LazyAdamRef(v, LR)),
    "scope_adam": (lambda mode: ("scope", _native(mode, "adam")),
                   lambda mode, v: _LazyAdamRef(v, LR)),
    "scope_adagrad": (lambda mode: ("scope", _native(mode, "adagrad")),
                      lambda mode, v: _native(mode, "adagrad")),
    "scope_sgd": (lambda mode: ("scope", _native(mode, "sgd")),
                  lambda mode, v: _native(mode, "sgd")),
}


def _apply(how, opt, grads, variables):
    if how == "scope":
        with sok.OptimizerScope(list(variables)):
            return opt.apply_gradients(zip(grads, variables),
                                       **({} if isinstance(opt, tf.compat.v1.train.Optimizer)
                                          else {"experimental_aggregate_gradients": False}))
    return opt.apply_gradients(zip(grads, variables), experimental_aggregate_gradients=False)


def _ref_apply(ref, grad, var):
    if isinstance(ref, _LazyAdamRef):
        return ref.apply(grad)
    if not isinstance(ref, tf.compat.v1.train.Optimizer):
        # Keras 3 squares IndexedSlices values before summing repeated
        # indices; the dense gradient is the exact one.
        grad = tf.convert_to_tensor(grad)
    return ref.apply_gradients([(grad, var)])


def _table_rows(var, run):
    if isinstance(var, sok.DynamicVariable):
        return run(var.find(tf.range(VOCAB, dtype=tf.int64))[0])
    return run(tf.convert_to_tensor(var))


@pytest.fixture(autouse=True)
def _fresh_context():
    context.reset()
    yield
    context.reset()


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("use_hashtable", [False, True], ids=["static", "hashtable"])
@pytest.mark.parametrize("kind", ["a2a", "dist"])
def test_function_mode_equals_plain_tf(kind, use_hashtable, path):
    sok_side, ref_side = PATHS[path]
    assert sok.Init(global_batch_size=BATCH) is None
    layer = _make_layer(kind, use_hashtable)
    var = layer.embedding_variable
    if use_hashtable:
        sok.Saver().load_embedding_values(var, W0)
    ref_var = tf.Variable(W0)
    how, opt = sok_side("function")
    ref = ref_side("function", ref_var)

    @tf.function
    def sok_step(inputs, y):
        with tf.GradientTape() as tape:
            emb = layer(inputs, training=True)
            loss = _loss(emb, y, kind)
        emb_vars, _ = sok.split_embedding_variable_from_others(layer.trainable_variables)
        grads = tape.gradient(loss, list(emb_vars))
        _apply(how, opt, grads, emb_vars)
        return emb

    for step, (ids, lengths, y) in enumerate(_data()):
        got = sok_step(_sok_inputs(kind, ids, lengths), y)
        want = _eager_ref_step(ref_var, ref, kind, ids, lengths, y)
        np.testing.assert_allclose(got.numpy(), want.numpy(), **TOL,
                                   err_msg=f"forward, step {step}")
    np.testing.assert_allclose(_table_rows(var, lambda t: t.numpy()), ref_var.numpy(), **TOL)


def _eager_ref_step(ref_var, ref, kind, ids, lengths, y):
    """The plain-TF step, eagerly (a Keras 3 optimizer inside a tf.function
    that is fed numpy arrays is not what is under test here)."""
    with tf.GradientTape() as tape:
        emb = _ref_forward(ref_var, kind, ids, lengths)
        loss = _loss(emb, y, kind)
    _ref_apply(ref, tape.gradient(loss, ref_var), ref_var)
    return emb


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("use_hashtable", [False, True], ids=["static", "hashtable"])
@pytest.mark.parametrize("kind", ["a2a", "dist"])
def test_graph_mode_equals_plain_tf(kind, use_hashtable, path):
    sok_side, ref_side = PATHS[path]
    with tf.Graph().as_default():
        init_op = sok.Init(global_batch_size=BATCH)
        assert isinstance(init_op, tf.Operation)
        layer = _make_layer(kind, use_hashtable)
        var = layer.embedding_variable
        ref_var = tf.compat.v1.Variable(W0, use_resource=True)
        how, opt = sok_side("graph")
        ref = ref_side("graph", ref_var)
        ids_ph = tf.compat.v1.placeholder(tf.int64, [BATCH, SLOTS, NNZ])
        sp_ph = tf.compat.v1.sparse_placeholder(tf.int64, [BATCH * SLOTS, NNZ])
        y_ph = tf.compat.v1.placeholder(tf.float32, [BATCH, 1])
        inputs = ids_ph if kind == "a2a" else sp_ph
        emb = layer(inputs, training=True)
        emb_vars, _ = sok.split_embedding_variable_from_others(layer.trainable_variables)
        grads = tf.gradients(_loss(emb, y_ph, kind), list(emb_vars))
        train = _apply(how, opt, grads, emb_vars)
        if kind == "a2a":
            ref_emb = tf.nn.embedding_lookup(ref_var, ids_ph)
        else:
            ref_emb = tf.reshape(tf.nn.embedding_lookup_sparse(ref_var, sp_ph, None,
                                                               combiner="mean"),
                                 [BATCH, SLOTS, DIM])
        ref_grad = tf.gradients(_loss(ref_emb, y_ph, kind), [ref_var])[0]
        ref_train = _ref_apply(ref, ref_grad, ref_var)
        load = (sok.Saver().load_embedding_values(var, W0) if use_hashtable else tf.no_op())
        rows = _table_rows(var, lambda t: t)
        with tf.compat.v1.Session() as sess:
            sess.run(init_op)
            sess.run([tf.compat.v1.global_variables_initializer(),
                      tf.compat.v1.local_variables_initializer()])
            sess.run(load)
            for step, (ids, lengths, y) in enumerate(_data()):
                # Indices and values only: TF 1.x's sparse_placeholder of a
                # fully defined shape has a constant dense_shape, which Keras
                # layers (1.x) read statically and so make unfeedable.
                indices, values, _ = _sparse_value(ids, lengths)
                feed = {ids_ph: ids, y_ph: y, sp_ph.indices: indices, sp_ph.values: values}
                got, want = sess.run([emb, ref_emb], feed)
                np.testing.assert_allclose(got, want, **TOL, err_msg=f"forward, step {step}")
                sess.run([train, ref_train], feed)
            np.testing.assert_allclose(sess.run(rows), sess.run(ref_var), **TOL)


# ------------------------------------------------------------------ layers

def test_output_shapes_and_argument_errors():
    sok.Init(global_batch_size=8)
    layer = sok.All2AllDenseEmbedding(100, 5, slot_num=3, nnz_per_slot=2)
    out = layer(tf.zeros([8, 3, 2], tf.int64))
    assert out.shape == (8, 3, 2, 5)
    with pytest.raises(ValueError, match="nnz_per_slot=2"):
        layer(tf.zeros([8, 3, 4], tf.int64))
    dyn = sok.All2AllDenseEmbedding(100, 5, 3, 2, dynamic_input=True)
    assert dyn(tf.constant([7, 9, 7], tf.int64)).shape == (3, 5)
    sparse = sok.DistributedEmbedding("sum", 100, 6, slot_num=4, max_nnz=3)
    sp = tf.sparse.from_dense(tf.ones([8 * 4, 3], tf.int64))
    assert sparse(sp).shape == (8, 4, 6)
    with pytest.raises(TypeError, match="SparseTensor"):
        sparse(tf.ones([32, 3], tf.int64))
    with pytest.raises(ValueError, match="combiner"):
        sok.DistributedEmbedding("max", 100, 6, 4, 3)
    with pytest.raises(ValueError, match="max_vocabulary_size_per_gpu"):
        sok.All2AllDenseEmbedding(0, 4, 1, 1)
    with pytest.raises(ValueError, match="embedding_vec_size"):
        sok.DistributedEmbedding("sum", 10, -1, 1, 1)
    with pytest.raises(TypeError, match="key_dtype"):
        sok.All2AllDenseEmbedding(10, 4, 1, 1, key_dtype=tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="out of range|>= rows|row"):
        sok.All2AllDenseEmbedding(10, 4, 1, 1, use_hashtable=False)(
            tf.constant([[[10]]], tf.int64))


def test_distributed_embedding_empty_slots_are_zero_and_hashtable_takes_any_key():
    sok.Init(global_batch_size=2)
    layer = sok.DistributedEmbedding("mean", 16, 3, slot_num=2, max_nnz=2,
                                     embedding_initializer="ones")
    keys = tf.SparseTensor([[0, 0], [0, 1], [3, 0]], tf.constant([2**40, -5, 77], tf.int64),
                           [4, 2])
    out = layer(keys).numpy()
    np.testing.assert_array_equal(out[0, 1], np.zeros(3))
    np.testing.assert_array_equal(out[1, 0], np.zeros(3))
    np.testing.assert_allclose(out[0, 0], np.ones(3))
    np.testing.assert_allclose(out[1, 1], np.ones(3))


@pytest.mark.parametrize("vocabulary", [2 ** 40, 2 ** 30])
def test_hashtable_layer_vocabulary_errors_name_the_layer_argument(vocabulary):
    sok.Init(global_batch_size=1)
    with pytest.raises(ValueError, match=f"max_vocabulary_size_per_gpu={vocabulary} does not"):
        sok.All2AllDenseEmbedding(vocabulary, 2, 1, 1, use_hashtable=True)


def test_hashtable_layer_is_bounded_by_the_vocabulary():
    sok.Init(global_batch_size=1)
    layer = sok.All2AllDenseEmbedding(10, 2, 1, 1, dynamic_input=True)
    for start in range(0, 100, 5):
        layer(tf.range(start, start + 5, dtype=tf.int64))
    assert int(layer.embedding_variable.size[0]) <= 10


def test_model_trainable_variables_hold_the_tables():
    sok.Init(global_batch_size=4)

    class Model(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.emb = sok.All2AllDenseEmbedding(32, 4, 2, 1, name="user_emb")
            self.dense = tf.keras.layers.Dense(1)

        def call(self, x):
            return self.dense(tf.reshape(self.emb(x), [-1, 8]))

    model = Model()
    model(tf.zeros([4, 2, 1], tf.int64))
    emb, other = sok.split_embedding_variable_from_others(model.trainable_variables)
    assert len(emb) == 1 and emb[0] is model.emb.embedding_variable
    assert len(other) == 2 and all(not isinstance(v, sok.DynamicVariable) for v in other)
    assert sok.get_embedding("user_emb") is model.emb
    with pytest.raises(ValueError, match="no sok embedding layer"):
        sok.get_embedding("missing")


def test_layers_need_init():
    with pytest.raises(RuntimeError, match=r"sok.Init"):
        sok.All2AllDenseEmbedding(10, 4, 1, 1)
    with pytest.raises(TypeError, match="global_batch_size"):
        sok.Init()
    with pytest.raises(TypeError, match="unexpected"):
        sok.Init(global_batch_size=4, batch=3)
    with pytest.raises(ValueError, match="global_batch_size"):
        sok.Init(global_batch_size=0)


def test_init_under_mirrored_strategy_runs_at_once():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        assert sok.Init(global_batch_size=8) is None
        layer = sok.All2AllDenseEmbedding(16, 2, 1, 1)
    out = strategy_run(strategy, tf.function(lambda x: layer(x)),
                       args=(tf.zeros([8, 1, 1], tf.int64),))
    assert out.shape == (8, 1, 1, 2)


# ------------------------------------------------------------ graph ordering

def _graph_with_layer(use_hashtable):
    init_op = sok.Init(global_batch_size=4, seed=7)
    layer = sok.All2AllDenseEmbedding(16, 3, 2, 1, use_hashtable=use_hashtable,
                                      embedding_initializer=tf.keras.initializers.RandomUniform(
                                          -1.0, 1.0, seed=3))
    ids = tf.constant([[[1], [5]], [[5], [9]], [[0], [1]], [[2], [3]]], tf.int64)
    return init_op, layer(ids)


@pytest.mark.parametrize("use_hashtable", [False, True], ids=["static", "hashtable"])
def test_graph_lookup_before_init_op_says_to_run_it(use_hashtable):
    with tf.Graph().as_default():
        _, out = _graph_with_layer(use_hashtable)
        with tf.compat.v1.Session() as sess:
            with pytest.raises(tf.errors.InvalidArgumentError, match="op returned by sok.Init has not run in this session"):
                sess.run(out)


@pytest.mark.parametrize("use_hashtable", [False, True], ids=["static", "hashtable"])
def test_graph_init_order_is_automatic(use_hashtable):
    """Right order, variable initializer only, init op after the variable
    initializer, and the helpers: all give the same rows."""
    results = []
    for order in ("init_first", "variables_only", "init_last", "helper", "initializer_op"):
        with tf.Graph().as_default():
            init_op, out = _graph_with_layer(use_hashtable)
            variables_init = tf.compat.v1.global_variables_initializer()
            helper_op = sok.global_variables_initializer()
            with tf.compat.v1.Session() as sess:
                if order == "init_first":
                    sess.run(init_op)
                    sess.run(variables_init)
                elif order == "variables_only":
                    sess.run(variables_init)
                elif order == "init_last":
                    sess.run(variables_init)
                    sess.run(init_op)
                elif order == "helper":
                    sok.initialize_session(sess)
                else:
                    sess.run(helper_op)
                results.append(sess.run(out))
    for order, r in zip(("variables_only", "init_last", "helper", "initializer_op"),
                        results[1:]):
        np.testing.assert_array_equal(r, results[0], err_msg=order)
    assert np.abs(results[0]).max() > 0  # the seeded initializer ran


def test_the_layers_take_placeholders_of_no_known_shape_in_a_session():
    """A tf.compat.v1.placeholder / sparse_placeholder made without a shape
    (both layers take such ids): Keras 3 failed building the layer from its
    input's shape, "as_list() is not defined on an unknown TensorShape",
    naming neither the layer nor inputs. The rows now come as numpy's, and
    fed ids of another rank fail with the layer's message."""
    rows = np.arange(30, dtype=np.float32).reshape(10, 3) / 10
    with tf.Graph().as_default():
        sok.Init(global_batch_size=2)
        dense = sok.All2AllDenseEmbedding(10, 3, 1, 2, use_hashtable=False, dynamic_input=True,
                                          embedding_initializer=rows)
        sparse = sok.DistributedEmbedding("sum", 10, 3, 1, 2, use_hashtable=False,
                                          embedding_initializer=rows)
        ids = tf.compat.v1.placeholder(tf.int64)
        sp_ids = tf.compat.v1.sparse_placeholder(tf.int64)
        dense_out, sparse_out = dense(ids), sparse(sp_ids)
        with tf.compat.v1.Session() as sess:
            sok.initialize_session(sess)
            np.testing.assert_array_equal(sess.run(dense_out, {ids: [[1, 2], [7, 0]]}),
                                          rows[np.array([[1, 2], [7, 0]])])
            fed = tf.compat.v1.SparseTensorValue([[0, 0], [0, 1], [1, 1]], [3, 4, 9], [2, 2])
            np.testing.assert_array_equal(sess.run(sparse_out, {sp_ids: fed}),
                                          np.stack([rows[3] + rows[4], rows[9]])[:, None])
            three = tf.compat.v1.SparseTensorValue([[0, 0, 0]], [3], [2, 2, 2])
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match="inputs must be a 2-D SparseTensor"):
                sess.run(sparse_out, {sp_ids: three})


def _two_default_layers(use_hashtable):
    init_op = sok.Init(global_batch_size=4, seed=7)
    layers = [sok.All2AllDenseEmbedding(16, 3, 2, 1, use_hashtable=use_hashtable)
              for _ in range(2)]
    ids = tf.constant([[[1], [5]], [[5], [9]], [[0], [1]], [[2], [3]]], tf.int64)
    return init_op, [layer(ids) for layer in layers]


@pytest.mark.parametrize("use_hashtable", [False, True], ids=["static", "hashtable"])
def test_init_seed_gives_each_layer_rows_of_its_own(use_hashtable):
    """sok.Init(seed=7) gave every default-initialized layer the seed 7, so
    two layers of one shape were identical copies (the same row for a key
    in both). Each layer now draws from a seed of its own derived from 7:
    its rows differ from the other's, and the same graph built again gets
    the same rows."""
    results = []
    for _ in range(2):
        with tf.Graph().as_default():
            init_op, outs = _two_default_layers(use_hashtable)
            with tf.compat.v1.Session() as sess:
                sok.initialize_session(sess)
                results.append(sess.run(outs))
    for a, b in zip(results[0], results[1]):
        np.testing.assert_array_equal(a, b)
    first, second = (r.reshape(-1, 3) for r in results[0])
    assert np.abs(first).max() > 0 and np.abs(first).max() <= 0.05
    assert not np.any(np.all(first == second, axis=1))


@pytest.mark.parametrize("use_hashtable", [False, True], ids=["static", "hashtable"])
def test_a_graph_with_a_1x_layer_exports_meta_graphs_that_import(tmp_path, use_hashtable):
    """A Saver's meta graph and a TF1 serving export of a graph holding a
    1.x layer: the layer and its table are in sok.GraphKeys' collections,
    which were written as lists of their names, and importing either file
    failed ("The name 'de' refers to an Operation not in the graph"). The
    files hold those collections empty; the imports work, and the served
    model computes what the layer did."""
    batch = tf.compat.v1.SparseTensorValue([[0, 0], [0, 1], [1, 0]], [1, 5, 9], [2, 3])
    with tf.Graph().as_default():
        init = sok.Init(global_batch_size=2)

        def build():
            ids = tf.compat.v1.sparse_placeholder(tf.int64, name="ids")
            layer = sok.DistributedEmbedding("sum", 64, 4, slot_num=1, max_nnz=3, name="de",
                                             use_hashtable=use_hashtable)
            return {"ids": ids}, {"out": layer(ids)}

        inputs, outputs = build()
        assert tf.compat.v1.get_collection(sok.GraphKeys.SparseOperationKitEmbeddingLayers)
        with tf.compat.v1.Session() as sess:
            sess.run(init)
            sess.run(tf.compat.v1.global_variables_initializer())
            want = sess.run(outputs["out"], {inputs["ids"]: batch})
            tf.compat.v1.train.Saver().save(sess, str(tmp_path / "ckpt" / "model"))
            export_dir = sok.export_for_serving(build, str(tmp_path / "export"), session=sess)
    with tf.Graph().as_default():
        tf.compat.v1.train.import_meta_graph(str(tmp_path / "ckpt" / "model.meta"))
        assert not tf.compat.v1.get_collection(sok.GraphKeys.SparseOperationKitEmbeddingLayers)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], export_dir)
        signature = meta.signature_def["serving_default"]
        ids = signature.inputs["ids"].coo_sparse
        feeds = {ids.indices_tensor_name: batch.indices, ids.values_tensor_name: batch.values,
                 ids.dense_shape_tensor_name: batch.dense_shape}
        np.testing.assert_allclose(sess.run(signature.outputs["out"].name, feeds), want,
                                   rtol=1e-6)


def test_init_hook_with_monitored_training_session():
    with tf.Graph().as_default():
        _, out = _graph_with_layer(True)
        loss = tf.reduce_sum(out)
        emb_vars = tf.compat.v1.get_collection(sok.GraphKeys.SparseOperationKitEmbeddingVariables)
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        with sok.OptimizerScope(emb_vars):
            train = opt.apply_gradients(zip(tf.gradients(loss, emb_vars), emb_vars))
        losses = []
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=[sok.InitHook()]) as sess:
            for _ in range(3):
                losses.append(sess.run([loss, train])[0])
        assert losses[2] < losses[1] < losses[0]


def _decayed_rows(minimize, use_hashtable):
    """Rows 0 and 1 of a table of ones after three steps of
    GradientDescentOptimizer(0.1 * 0.5**global_step) on the sum of their
    lookup, and the global step: minimize(opt, loss, var_list, gs) builds
    the update."""
    with tf.Graph().as_default():
        sok.Init(global_batch_size=1)
        gs = tf.compat.v1.train.get_or_create_global_step()
        layer = sok.All2AllDenseEmbedding(4, 2, 1, 2, embedding_initializer="ones",
                                          use_hashtable=use_hashtable)
        ids = tf.constant([[[0, 1]]], tf.int64)
        loss = tf.reduce_sum(layer(ids))
        lr = tf.compat.v1.train.exponential_decay(0.1, gs, 1, 0.5)
        opt = tf.compat.v1.train.GradientDescentOptimizer(lr)
        with sok.OptimizerScope(layer.trainable_variables):
            train = minimize(opt, loss, layer.trainable_variables, gs)
        rows = layer(ids)
        with tf.compat.v1.Session() as sess:
            sok.initialize_session(sess)
            for _ in range(3):
                sess.run(train)
            return sess.run(rows)[0, 0], sess.run(gs)


@pytest.mark.parametrize("use_hashtable", [False, True], ids=["static", "hashtable"])
def test_a_scope_with_only_sok_variables_counts_the_global_step(use_hashtable):
    """tf.compat.v1's global_step, counted by the native apply_gradients, was
    never counted where every variable was a sok variable: the step stayed
    0, a learning rate decayed by it never decayed, and a loop stopped by it
    (StopAtStepHook) never ended. The reference: a plain tf.Variable trained
    the same way."""
    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        table = tf.Variable(tf.ones([4, 2]))
        loss = tf.reduce_sum(tf.gather(table, [0, 1]))
        lr = tf.compat.v1.train.exponential_decay(0.1, gs, 1, 0.5)
        train = tf.compat.v1.train.GradientDescentOptimizer(lr).minimize(loss, global_step=gs)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(3):
                sess.run(train)
            want, want_step = sess.run(table)[:2], sess.run(gs)
    assert want_step == 3
    ways = {
        "minimize": lambda opt, loss, v, gs: opt.minimize(loss, global_step=gs),
        "by name": lambda opt, loss, v, gs: opt.apply_gradients(
            zip(tf.gradients(loss, v), v), global_step=gs),
        "by position": lambda opt, loss, v, gs: opt.apply_gradients(
            list(zip(tf.gradients(loss, v), v)), gs),
    }
    for way, minimize in ways.items():
        rows, step = _decayed_rows(minimize, use_hashtable)
        assert step == 3, way
        np.testing.assert_allclose(rows, want, rtol=1e-6, err_msg=way)

    # A loop stopped by the step ends.
    with tf.Graph().as_default():
        _, out = _graph_with_layer(use_hashtable)
        gs = tf.compat.v1.train.get_or_create_global_step()
        emb_vars = tf.compat.v1.get_collection(sok.GraphKeys.SparseOperationKitEmbeddingVariables)
        with sok.OptimizerScope(emb_vars):
            train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
                tf.reduce_sum(out), global_step=gs)
        steps = 0
        with tf.compat.v1.train.MonitoredTrainingSession(
                hooks=[sok.InitHook(), tf.compat.v1.train.StopAtStepHook(last_step=3)]) as sess:
            while not sess.should_stop() and steps < 10:
                sess.run(train)
                steps += 1
        assert steps == 3


def _momentum_rows(use_sok, momentum):
    with tf.Graph().as_default():
        sok.Init(global_batch_size=1)
        fed = tf.compat.v1.placeholder_with_default(momentum, [])
        if use_sok:
            layer = sok.All2AllDenseEmbedding(4, 2, 1, 2, use_hashtable=False,
                                              embedding_initializer="ones")
            out, var_list = layer(tf.constant([[[0, 1]]], tf.int64)), layer.trainable_variables
        else:
            table = tf.Variable(tf.ones([4, 2]))
            out, var_list = tf.gather(table, [0, 1]), [table]
        opt = tf.compat.v1.train.MomentumOptimizer(0.1, fed)
        with sok.OptimizerScope(var_list) if use_sok else contextlib.nullcontext():
            train = opt.minimize(tf.reduce_sum(out * out), var_list=var_list)
        with tf.compat.v1.Session() as sess:
            sok.initialize_session(sess) if use_sok else \
                sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(3):
                sess.run(train)
            return sess.run(out).reshape(-1)


@pytest.mark.parametrize("momentum", [0.9, 0.0])
def test_a_momentum_given_as_a_tensor_trains_as_tensorflow(momentum):
    """A graph tensor momentum (a placeholder) made OptimizerScope fail with
    "using a tf.Tensor as a Python bool" while the update was built."""
    np.testing.assert_allclose(_momentum_rows(True, momentum), _momentum_rows(False, momentum),
                               rtol=1e-6)


def test_sok_adam_counts_the_global_step():
    """sok.optimizers.Adam(...).apply_gradients(..., global_step=gs) dropped
    gs; it is counted once the rows are updated, eagerly and in a graph."""
    sok.Init(global_batch_size=1)
    layer = sok.All2AllDenseEmbedding(4, 2, 1, 2, use_hashtable=False)
    gs = tf.compat.v1.train.get_or_create_global_step()
    opt = sok.optimizers.Adam(0.1)
    ids = tf.constant([[[0, 1]]], tf.int64)
    for _ in range(2):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(ids))
        grads = tape.gradient(loss, layer.trainable_variables)
        opt.apply_gradients(zip(grads, layer.trainable_variables), global_step=gs)
    assert int(gs.numpy()) == 2
    before = layer.embedding_variable.numpy()
    with pytest.raises(TypeError, match="global_step must be a variable"):
        opt.apply_gradients(zip(grads, layer.trainable_variables), global_step=3)
    np.testing.assert_array_equal(layer.embedding_variable.numpy(), before)


def test_init_hook_without_init_is_an_error():
    with tf.Graph().as_default():
        sok.init()  # 2.x initialization creates no op
        with pytest.raises(RuntimeError, match="sok.Init"):
            sok.InitHook().begin()


# ------------------------------------------------------------------- Saver

@pytest.mark.parametrize("use_hashtable", [False, True], ids=["static", "hashtable"])
def test_load_embedding_values_of_a_nested_list_and_of_non_finite_rows(use_hashtable):
    """W.tolist() was read as a list of tensors, one per row ("tensors[0]
    must be [rows, 2]; got shape (2,)"); NaN and infinite rows were loaded
    (every lookup of their keys, and the loss, NaN)."""
    sok.Init(global_batch_size=1)
    layer = sok.All2AllDenseEmbedding(4, 2, 1, 1, use_hashtable=use_hashtable)
    var = layer.embedding_variable
    saver = sok.Saver()
    values = np.arange(8, dtype=np.float32).reshape(4, 2)
    saver.load_embedding_values(var, values.tolist())
    ids = tf.constant([[[0]], [[3]]], tf.int64)
    np.testing.assert_array_equal(layer(ids).numpy().reshape(2, 2), values[[0, 3]])
    for bad in (np.nan, np.inf):
        broken = values.copy()
        broken[2, 1] = bad
        with pytest.raises(ValueError, match=r"tensors hold a NaN or infinite value in row 2 "
                                             r"\(key 2\)"):
            saver.load_embedding_values(var, broken)
    np.testing.assert_array_equal(layer(ids).numpy().reshape(2, 2), values[[0, 3]])
    # In a graph, when the step runs.
    with tf.Graph().as_default():
        sok.Init(global_batch_size=1)
        layer = sok.All2AllDenseEmbedding(4, 2, 1, 1, use_hashtable=use_hashtable)
        fed = tf.compat.v1.placeholder(tf.float32, [4, 2])
        load = sok.Saver().load_embedding_values(layer.embedding_variable, fed)
        with tf.compat.v1.Session() as sess:
            sok.initialize_session(sess)
            sess.run(load, {fed: values})
            broken = values.copy()
            broken[1, 0] = np.nan
            with pytest.raises(tf.errors.InvalidArgumentError, match="NaN or infinite"):
                sess.run(load, {fed: broken})


def test_a_key_dtype_that_is_no_dtype_is_named():
    """key_dtype="foo" gave TensorFlow's "Cannot convert the argument
    `type_value`", naming no argument of the layer."""
    sok.Init(global_batch_size=1)
    for make in (lambda kd: sok.All2AllDenseEmbedding(4, 2, 1, 1, key_dtype=kd),
                 lambda kd: sok.DistributedEmbedding("sum", 4, 2, 1, 1, key_dtype=kd)):
        with pytest.raises(TypeError, match="key_dtype must be int32 or int64; got 'foo'"):
            make("foo")
        with pytest.raises(TypeError, match="key_dtype must be int32 or int64; got float32"):
            make(tf.float32)


def _layer_dumped_by_a_saver(directory):
    """A one-worker layer 'emb' with keys 3 and 9, dumped by a sok.Saver into
    `directory` (as 'emb_table'); (layer, saver)."""
    sok.Init(global_batch_size=1)
    layer = sok.All2AllDenseEmbedding(4, 2, 1, 1, embedding_initializer="ones", name="emb")
    layer(tf.constant([[[3]], [[9]]], tf.int64))
    saver = sok.Saver()
    saver.dump_to_file(layer.embedding_variable, directory)
    return layer, saver


def test_saver_restore_says_a_damaged_manifest_is_damaged(tmp_path):
    """A truncated, empty or deleted manifest.json of a Saver dump was
    reported as "no Saver dump of 'emb_table'" (a directory that "holds
    ['emb_table']")."""
    import os

    from sok_graph.dump_load import CheckpointError

    layer, saver = _layer_dumped_by_a_saver(tmp_path / "ck")
    table = tmp_path / "ck" / "emb_table"
    manifest = table / "manifest.json"
    whole = manifest.read_bytes()
    for damage, message in ((whole[:-10], "its manifest.json does not read"),
                            (b"", "its manifest.json does not read"),
                            (None, "its manifest.json is missing beside")):
        if damage is None:
            os.remove(manifest)
        else:
            manifest.write_bytes(damage)
        with pytest.raises(CheckpointError, match=re.escape(
                f"the Saver dump of 'emb_table' in {table} is damaged: {message}")):
            saver.restore_from_file(layer.embedding_variable, tmp_path / "ck")
        manifest.write_bytes(whole)
    saver.restore_from_file(layer.embedding_variable, tmp_path / "ck")


def test_saver_restore_refuses_a_newer_dump_made_by_another_number_of_workers(tmp_path):
    """A directory holding a one-worker dump ('emb_table') and a newer
    two-worker one ('emb_table.shard-<r>-of-2') restored the older rows
    into a one-worker job without a word. Now a CheckpointError names both;
    an older dump of another number of workers beside is no obstacle. (The
    two-worker dump is the one-worker's copied under a shard's name, its
    time set later.)"""
    import os
    import shutil

    from sok_graph.dump_load import CheckpointError

    layer, saver = _layer_dumped_by_a_saver(tmp_path / "ck")
    mine = tmp_path / "ck" / "emb_table"
    when = os.path.getmtime(mine)
    for rank in range(2):
        shard = tmp_path / "ck" / f"emb_table.shard-{rank}-of-2"
        shutil.copytree(mine, shard)
        os.utime(shard, (when + 60, when + 60))
    with pytest.raises(CheckpointError, match=re.escape(
            "holds a dump of 'emb_table' made by 1 worker(s) ('emb_table') and newer ones made "
            "by another number of workers (['emb_table.shard-0-of-2', "
            "'emb_table.shard-1-of-2'])")):
        saver.restore_from_file(layer.embedding_variable, tmp_path / "ck")
    os.utime(mine, (when + 120, when + 120))  # the one-worker dump is the newest
    saver.restore_from_file(layer.embedding_variable, tmp_path / "ck")


def test_saver_restore_of_another_number_of_workers_dump_says_so(tmp_path):
    """A directory holding only a two-worker dump ('emb_table.shard-<r>-of-2')
    restored in one worker: refused as "no Saver dump" listing the files,
    without saying that the number of workers differs or what moves a table
    between numbers of workers. (The two-worker dump is the one-worker's
    moved to a shard's name.)"""
    import os

    from sok_graph.dump_load import CheckpointError

    layer, saver = _layer_dumped_by_a_saver(tmp_path / "ck")
    os.rename(tmp_path / "ck" / "emb_table", tmp_path / "ck" / "emb_table.shard-0-of-2")
    with pytest.raises(CheckpointError, match=re.escape(
            "it was dumped by another number of workers (['emb_table.shard-0-of-2']); a Saver "
            "dump restores with the number of workers that wrote it, and sok.dump / sok.load "
            "move tables between numbers of workers")):
        saver.restore_from_file(layer.embedding_variable, tmp_path / "ck")


@pytest.mark.parametrize("use_hashtable", [False, True], ids=["static", "hashtable"])
def test_saver_round_trip_eager(tmp_path, use_hashtable):
    sok.Init(global_batch_size=4)
    layer = sok.All2AllDenseEmbedding(8, 3, 1, 1, dynamic_input=True, use_hashtable=use_hashtable)
    var = layer.embedding_variable
    saver = sok.Saver()
    values = np.arange(24, dtype=np.float32).reshape(8, 3)
    saver.load_embedding_values(var, [values[:5], values[5:]])
    ids = tf.constant([0, 7, 3], tf.int64)
    np.testing.assert_array_equal(layer(ids).numpy(), values[[0, 7, 3]])
    saver.dump_to_file(var, tmp_path / "table")
    saver.load_embedding_values(var, np.zeros((8, 3), np.float32))
    if use_hashtable:
        layer(tf.constant([100, 101], tf.int64))  # keys the dump does not hold
    saver.restore_from_file(var, tmp_path / "table")
    np.testing.assert_array_equal(layer(ids).numpy(), values[[0, 7, 3]])
    if use_hashtable:
        assert int(var.size[0]) == 8  # restore replaced the table's contents
    with pytest.raises(ValueError, match=r"\[rows, 3\]"):
        saver.load_embedding_values(var, np.zeros((8, 4), np.float32))
    with pytest.raises(TypeError, match="sok embedding variable"):
        saver.dump_to_file(tf.Variable(values), tmp_path / "x")


def test_load_embedding_values_refuses_more_rows_than_a_bounded_table_holds():
    """Ten rows into a hash table of at most four failed in the table's
    import op, with a message that named neither the table nor tensors;
    the table keeps what it held."""
    sok.Init(global_batch_size=4)
    layer = sok.DistributedEmbedding("sum", 4, 2, slot_num=1, max_nnz=1)
    layer(tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [1, 1]))
    var = layer.embedding_variable
    before = sorted(sok.export(var)[0].numpy().tolist())
    with pytest.raises(ValueError, match=r"load_embedding_values: table '.*' holds at most 4 "
                                         r"rows \(its max_capacity\); tensors give it 10"):
        sok.Saver().load_embedding_values(var, np.zeros((10, 2), np.float32))
    assert sorted(sok.export(var)[0].numpy().tolist()) == before
    sok.Saver().load_embedding_values(var, np.ones((4, 2), np.float32))
    keys, rows = sok.export(var)
    assert sorted(keys.numpy().tolist()) == [0, 1, 2, 3]
    np.testing.assert_array_equal(rows.numpy(), np.ones((4, 2), np.float32))


def test_load_embedding_values_refuses_rows_beyond_the_tables_dtype():
    """float64 rows whose values float32 cannot hold became inf in a float32
    table without an error (a load of a dump refuses them); a tensor of
    another dtype failed with TensorFlow's message naming no argument."""
    sok.Init(global_batch_size=1)
    var = sok.Variable(np.ones((4, 2), np.float32))
    rows = np.zeros((4, 2), np.float64)
    rows[2, 1] = 1e39
    with pytest.raises(ValueError, match=r"tensors\[1\] holds 1e\+39 at \[0, 1\], beyond "
                                         r"float32's largest finite value"):
        sok.Saver().load_embedding_values(var, [rows[:2], rows[2:]])
    with pytest.raises(TypeError, match=r"tensors\[0\] must be float32 .*got a float64 tensor"):
        sok.Saver().load_embedding_values(var, tf.constant(rows[:1].repeat(4, 0)))
    np.testing.assert_array_equal(var.numpy(), np.ones((4, 2), np.float32))
    rows[2, 1] = 0.1  # rounds to float32: taken
    sok.Saver().load_embedding_values(var, rows)
    np.testing.assert_array_equal(var.numpy(), rows.astype(np.float32))


@pytest.mark.parametrize("layer", ["all2all", "distributed"])
def test_int32_key_layer_refuses_int64_keys_beyond_int32(layer):
    """A hashtable layer of key_dtype=tf.int32 cast int64 keys: 2^32 + 5 read
    (and trained) key 5's row. Keys within int32's range still go in."""
    sok.Init(global_batch_size=2)
    init = tf.keras.initializers.RandomUniform(-1.0, 1.0, seed=4)
    if layer == "all2all":
        emb = sok.All2AllDenseEmbedding(8, 3, 1, 1, key_dtype=tf.int32,
                                        embedding_initializer=init)

        def call(keys):
            return emb(tf.constant(keys, tf.int64)[:, None, None])[:, 0, 0]
    else:
        emb = sok.DistributedEmbedding("sum", 8, 3, 1, 1, key_dtype=tf.int32,
                                       embedding_initializer=init)

        def call(keys):
            return emb(tf.SparseTensor([[0, 0], [1, 0]], tf.constant(keys, tf.int64),
                                       [2, 1]))[:, 0]
    within = call([5, -(2 ** 31)]).numpy()
    table = emb.embedding_variable
    np.testing.assert_array_equal(
        within, table.sparse_read(tf.constant([5, -(2 ** 31)], tf.int32)).numpy())
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"inputs must hold keys in int32's range"):
        call([5, 2 ** 32 + 5])
    with pytest.raises(tf.errors.InvalidArgumentError, match="int32's range"):
        call([-(2 ** 31) - 1, 1])


def test_init_seed_beyond_int64_is_refused_by_init():
    """sok.Init(seed=2**70) was taken; the first layer then failed with
    "int too big to convert" (hashtable) or "Can't convert Python sequence
    with out-of-range integer" (static), naming nothing."""
    with pytest.raises(ValueError, match="seed must be None or a non-negative integer below 2"):
        sok.Init(global_batch_size=1, seed=2 ** 70)
    sok.Init(global_batch_size=1, seed=2 ** 63 - 1)


def test_hashtable_layer_initializer_errors_name_embedding_initializer():
    """A non-finite initializer of a hashtable layer was reported as a
    table that max_vocabulary_size_per_gpu does not make."""
    sok.Init(global_batch_size=1)
    with pytest.raises(ValueError, match=r"^embedding_initializer: initializer Constant: its "
                                         r"value must be a finite float32 number"):
        sok.All2AllDenseEmbedding(8, 3, 1, 1, embedding_initializer=tf.keras.initializers.Constant(
            float("nan")))
    with pytest.raises(ValueError, match=r"^embedding_initializer: initializer='nan'"):
        sok.DistributedEmbedding("sum", 8, 3, 1, 1, embedding_initializer="nan")


@pytest.mark.parametrize("kwargs,exc,pattern", [
    (dict(learning_rate=float("nan")), ValueError, "learning_rate must be a finite number >= 0"),
    (dict(learning_rate=float("inf")), ValueError, "learning_rate must be a finite number >= 0"),
    (dict(learning_rate=-0.1), ValueError, "learning_rate must be a finite number >= 0"),
    (dict(learning_rate="0.1"), TypeError, "learning_rate must be a number, a tensor"),
    (dict(learning_rate=None), TypeError, "learning_rate must be a number, a tensor"),
    (dict(epsilon=float("nan")), ValueError, "epsilon must be a finite number > 0"),
    (dict(epsilon=None), TypeError, "epsilon must be a number; got None"),
    (dict(beta_1="x"), TypeError, "beta_1 must be a number; got 'x'"),
    (dict(beta_2=None), TypeError, "beta_2 must be a number; got None"),
])
@pytest.mark.parametrize("cls", ["Adam", "LazyAdam"])
def test_sok_adam_hyperparameters_are_checked(cls, kwargs, exc, pattern):
    """sok.optimizers.Adam / LazyAdam took a NaN or infinite learning rate or
    a NaN epsilon and made every updated row NaN; a str or None failed at the
    first update (in a Cast) or named nothing (float())."""
    with pytest.raises(exc, match=pattern):
        getattr(sok.optimizers, cls)(**kwargs)


def test_sok_adam_with_a_schedule_or_tensor_rate_still_trains():
    """What the checks above let through: the rows move as plain TensorFlow
    moves them (one lazy Adam step of a gradient of ones from zero moments)."""
    sok.Init(global_batch_size=1)
    for lr in (tf.constant(0.1), tf.keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)):
        var = sok.Variable(np.ones((3, 2), np.float32))
        opt = sok.optimizers.LazyAdam(learning_rate=lr)
        opt.apply_gradients([(tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1], tf.int64),
                                               tf.constant([3, 2], tf.int64)), var)])
        want = np.ones((3, 2), np.float32)
        want[1] -= 0.1 * 1.0 / (1.0 + 1e-7)  # m_hat = v_hat = 1
        np.testing.assert_allclose(var.numpy(), want, rtol=1e-6)


def test_load_embedding_values_into_a_float64_table():
    """load_embedding_values took every tensor as float32, so a float64
    sok.Variable refused its own rows (TypeError); they now go in at the
    table's dtype, bit for bit."""
    values = (np.arange(8, dtype=np.float64).reshape(4, 2) + 1) / 3.0  # not float32-exact
    if tf.executing_eagerly():
        sok.Init(global_batch_size=1)
        var = sok.Variable(np.zeros((4, 2), np.float64))
        sok.Saver().load_embedding_values(var, values)
        got = var.numpy()
    else:
        with tf.Graph().as_default():
            init_op = sok.Init(global_batch_size=1)
            var = sok.Variable(np.zeros((4, 2), np.float64))
            load = sok.Saver().load_embedding_values(var, values)
            with tf.compat.v1.Session() as sess:
                sess.run(init_op)
                sess.run(tf.compat.v1.global_variables_initializer())
                sess.run(load)
                got = sess.run(var)
    np.testing.assert_array_equal(got, values)


def test_saver_round_trip_graph(tmp_path):
    with tf.Graph().as_default():
        init_op = sok.Init(global_batch_size=2)
        layer = sok.DistributedEmbedding("sum", 6, 2, 1, 1)
        var = layer.embedding_variable
        saver = sok.Saver()
        values = np.arange(12, dtype=np.float32).reshape(6, 2)
        load = saver.load_embedding_values(var, values)
        dump = saver.dump_to_file(var, str(tmp_path / "t"))
        wipe = saver.load_embedding_values(var, np.full((6, 2), -1.0, np.float32))
        restore = saver.restore_from_file(var, str(tmp_path / "t"))
        out = layer(tf.SparseTensor([[0, 0], [1, 0]], tf.constant([5, 2], tf.int64), [2, 1]))
        with tf.compat.v1.Session() as sess:
            sess.run(init_op)
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(load)
            sess.run(dump)
            sess.run(wipe)
            np.testing.assert_array_equal(sess.run(out)[:, 0], [[-1, -1], [-1, -1]])
            sess.run(restore)
            np.testing.assert_array_equal(sess.run(out)[:, 0], values[[5, 2]])


def test_saver_keeps_every_table_dumped_into_one_directory(tmp_path):
    """SOK's Saver takes a directory for all its tables: two tables dumped
    into one keep their own files and restore their own rows (the second
    dump used to replace the first, and restoring the first table gave it
    the second's rows)."""
    sok.init(comm_tool="none")
    saver = sok.Saver()
    user = sok.DynamicVariable(dimension=2, initializer="0", name="user")
    item = sok.DynamicVariable(dimension=2, initializer="0", name="item")
    static = sok.Variable(np.arange(6, dtype=np.float32).reshape(3, 2), name="static")
    user.scatter_update(tf.constant([1, 2], tf.int64), tf.constant([[1.0, 1.0], [2.0, 2.0]]))
    item.scatter_update(tf.constant([7, 8, 9], tf.int64), tf.fill([3, 2], 7.0))
    for var in (user, item, static):
        saver.dump_to_file(var, tmp_path)
    user.scatter_update(tf.constant([5], tf.int64), tf.constant([[5.0, 5.0]]))
    static.assign(np.zeros((3, 2), np.float32))
    for var in (user, item, static):
        saver.restore_from_file(var, tmp_path)
    assert sorted(sok.export(user)[0].numpy().tolist()) == [1, 2]
    assert sorted(sok.export(item)[0].numpy().tolist()) == [7, 8, 9]
    np.testing.assert_array_equal(static.numpy(), np.arange(6).reshape(3, 2))
    other = sok.DynamicVariable(dimension=2, name="other")
    from sok_graph.dump_load import CheckpointError

    with pytest.raises(CheckpointError, match="no Saver dump of 'other'"):
        saver.restore_from_file(other, tmp_path)
    # A filepath that is not there is said to be missing ("it holds []").
    with pytest.raises(CheckpointError, match="no Saver dump of 'other' in .*missing: there is "
                                              "no such directory"):
        saver.restore_from_file(other, str(tmp_path / "missing"))


def test_saver_refuses_two_tables_of_one_name_in_one_directory(tmp_path):
    """A sok.DynamicVariable and a sok.Variable both named "t" (or two
    DynamicVariables named "t") dumped into one Saver directory: the second
    dump used to replace the first one's files without an error. It is
    refused, naming both tables and the name, before anything is written;
    the same table dumps again, and a table of that name dumps once the
    other is gone."""
    import gc

    sok.init(comm_tool="none")
    saver = sok.Saver()
    dyn = sok.DynamicVariable(dimension=2, initializer="0", name="t")
    dyn.scatter_update(tf.constant([7], tf.int64), tf.constant([[7.0, 8.0]]))
    static = sok.Variable(np.full((3, 2), 5.0, np.float32), name="t")
    twin = sok.DynamicVariable(dimension=2, initializer="0", name="t")
    saver.dump_to_file(dyn, tmp_path)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / "t").iterdir())
    where = re.escape(str(tmp_path / "t"))
    with pytest.raises(ValueError, match=r"^Saver.dump_to_file: sok.Variable \(3 rows of "
                       r"dimension 2\) and sok.DynamicVariable \(dimension 2\) are both named "
                       r"'t': .*\(" + where + r"\), .*give the tables distinct names"):
        saver.dump_to_file(static, tmp_path)
    with pytest.raises(ValueError, match=r"^Saver.dump_to_file: this sok.DynamicVariable "
                       r"\(dimension 2\) and another sok.DynamicVariable \(dimension 2\) are "
                       r"both named 't'"):
        saver.dump_to_file(twin, tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["t"]
    assert sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / "t").iterdir()) == before
    dyn.scatter_update(tf.constant([7], tf.int64), tf.constant([[0.0, 0.0]]))
    saver.restore_from_file(dyn, tmp_path)
    assert [x.numpy().tolist() for x in sok.export(dyn)] == [[7], [[7.0, 8.0]]]

    saver.dump_to_file(dyn, tmp_path)  # the same table again
    saver.dump_to_file(static, tmp_path / "other")
    del dyn, twin
    gc.collect()
    saver.dump_to_file(static, tmp_path)  # the other "t" is gone
    static.assign(np.zeros((3, 2), np.float32))
    saver.restore_from_file(static, tmp_path)
    np.testing.assert_array_equal(static.numpy(), np.full((3, 2), 5.0))


def test_saver_restore_refuses_rows_that_are_another_tables(tmp_path):
    """A DynamicVariable "t" of keys 0..2 dumped into a Saver directory,
    beside a sok.Variable "t" and another DynamicVariable "t" whose own
    dumps there were refused: restoring either took the dumped table's
    rows without an error. Both are refused, naming the tables, and keep
    their rows; a DynamicVariable "t" that never dumped there takes the rows
    (a copy), the dumped table restores, and once it is gone the others
    restore too."""
    import gc

    sok.init(comm_tool="none")
    saver = sok.Saver()
    dyn = sok.DynamicVariable(dimension=2, initializer="0", name="t")
    dyn.scatter_update(tf.constant([0, 1, 2], tf.int64),
                       tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]))
    twin = sok.DynamicVariable(dimension=2, initializer="0", name="t")
    twin.scatter_update(tf.constant([9], tf.int64), tf.constant([[9.0, 9.0]]))
    static = sok.Variable(np.full((3, 2), 5.0, np.float32), name="t")
    copy = sok.DynamicVariable(dimension=2, initializer="0", name="t")
    saver.dump_to_file(dyn, tmp_path)
    with pytest.raises(ValueError, match="are both named 't'"):
        saver.dump_to_file(twin, tmp_path)
    where = str(tmp_path / "t")
    with pytest.raises(ValueError) as refused:
        saver.restore_from_file(twin, tmp_path)
    assert str(refused.value) == (
        f"Saver.restore_from_file: this sok.DynamicVariable (dimension 2) and another "
        f"sok.DynamicVariable (dimension 2) are both named 't': in filepath a Saver keeps each "
        f"table in the directory of its name ({where}), which holds the rows of the other one "
        f"(this table's own dump there was refused); give the tables distinct names "
        f"(name=...) and dump each (the table was not changed)")
    assert [x.numpy().tolist() for x in sok.export(twin)] == [[9], [[9.0, 9.0]]]
    with pytest.raises(ValueError) as refused:
        saver.restore_from_file(static, tmp_path)
    assert str(refused.value) == (
        f"Saver.restore_from_file: sok.Variable (3 rows of dimension 2) and "
        f"sok.DynamicVariable (dimension 2) are both named 't': in filepath a Saver keeps each "
        f"table in the directory of its name ({where}), which holds the rows of the other one "
        f"(a static table's rows are not a dynamic table's); give the tables distinct names "
        f"(name=...) and dump each (the table was not changed)")
    np.testing.assert_array_equal(static.numpy(), np.full((3, 2), 5.0))

    def rows_of(table):
        keys, rows = sok.export(table)
        return rows.numpy()[np.argsort(keys.numpy())].tolist()

    saver.restore_from_file(copy, tmp_path)  # never dumped there: a copy
    assert rows_of(copy) == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    dyn.scatter_update(tf.constant([0], tf.int64), tf.constant([[0.0, 0.0]]))
    saver.restore_from_file(dyn, tmp_path)  # the table that was dumped
    assert rows_of(dyn) == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    del dyn, refused
    gc.collect()
    saver.restore_from_file(static, tmp_path)  # the dumped "t" is gone
    np.testing.assert_array_equal(static.numpy(), [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    saver.restore_from_file(twin, tmp_path)
    assert rows_of(twin) == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]


def test_saver_restore_refuses_another_tables_rows_in_one_graph(tmp_path):
    """The same in a Session's graph, where the dumps and the restore run:
    two DynamicVariables named "t" in one graph, the second's dump refused;
    its restore op fails naming both, and it keeps its rows."""
    with tf.Graph().as_default():
        sok.init()
        first = sok.DynamicVariable(dimension=1, initializer="0", name="t")
        second = sok.DynamicVariable(dimension=1, initializer="0", name="t")
        fill = [first.scatter_update(tf.constant([1], tf.int64), tf.constant([[1.0]])),
                second.scatter_update(tf.constant([2], tf.int64), tf.constant([[2.0]]))]
        saver = sok.Saver()
        dumps = [saver.dump_to_file(t, str(tmp_path)) for t in (first, second)]
        restore = saver.restore_from_file(second, str(tmp_path))
        exported = sok.export(second)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(fill)
            sess.run(dumps[0])
            with pytest.raises(tf.errors.OpError, match="are both named 't'"):
                sess.run(dumps[1])
            with pytest.raises(tf.errors.OpError, match=r"Saver.restore_from_file: this "
                               r"sok.DynamicVariable \(dimension 1\) and another "
                               r"sok.DynamicVariable \(dimension 1\) are both named 't'.*"
                               r"this table's own dump there was refused"):
                sess.run(restore)
            keys, rows = sess.run(exported)
            assert (keys.tolist(), rows.tolist()) == ([2], [[2.0]])


def test_saver_refuses_two_tables_of_one_name_in_one_graph(tmp_path):
    """The same in a Session's graph, where the dumps run: two
    DynamicVariables named "t" (TensorFlow does not rename them) dumped
    into one directory. A table named "t" in a new graph replaces the old
    graph's "t"."""
    graphs = []
    for _ in range(2):
        with tf.Graph().as_default() as graph:
            sok.init()
            first = sok.DynamicVariable(dimension=1, initializer="0", name="t")
            second = sok.DynamicVariable(dimension=1, initializer="0", name="t")
            fill = [first.scatter_update(tf.constant([1], tf.int64), tf.constant([[1.0]])),
                    second.scatter_update(tf.constant([2], tf.int64), tf.constant([[2.0]]))]
            saver = sok.Saver()
            dumps = [saver.dump_to_file(t, str(tmp_path)) for t in (first, second)]
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                sess.run(fill)
                sess.run(dumps[0])
                with pytest.raises(tf.errors.OpError, match=r"this sok.DynamicVariable "
                                   r"\(dimension 1\) and another sok.DynamicVariable "
                                   r"\(dimension 1\) are both named 't'"):
                    sess.run(dumps[1])
            graphs.append((graph, first, second))  # the old graph's tables live on
        keys, rows = read_saver_dump(tmp_path / "t")
        assert (keys.tolist(), rows.tolist()) == ([1], [[1.0]])


def read_saver_dump(directory):
    """The keys and rows a Saver wrote for one table, read as a sok.dump."""
    from sok_graph.dump_load import read_dump

    arrays = read_dump(str(directory), {"t": 1})[1]["t"]
    return arrays["keys"], arrays["values"]


@pytest.mark.parametrize("suffix", [".old-00000000000000000001-abcdef12",
                                    ".tmp-999999999-abcdef12"])
def test_saver_refuses_a_table_named_as_another_tables_copy(tmp_path, suffix):
    """A table named as the copy a dump of table 't' keeps beside its
    directory ('t' + suffix) had its directory deleted, without an error,
    by the next dump of 't'; it is refused before anything is written, and
    't' and names that only look alike still dump and restore."""
    sok.init(comm_tool="none")
    saver = sok.Saver()
    t = sok.Variable(np.full((2, 2), 1.0, np.float32), name="t")
    saver.dump_to_file(t, tmp_path)
    copy = sok.Variable(np.full((2, 2), 2.0, np.float32), name="t" + suffix)
    with pytest.raises(ValueError, match=r"^Saver.dump_to_file: variable 't" + re.escape(suffix)
                       + r"' would be kept in the directory .* the table 't' makes beside"):
        saver.dump_to_file(copy, tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["t"]
    alike = sok.Variable(np.full((2, 2), 3.0, np.float32), name="t" + suffix + "x")
    for var in (alike, t):
        saver.dump_to_file(var, tmp_path)
    assert sorted(os.listdir(tmp_path)) == sorted(["t", "t" + suffix + "x"])
    alike.assign(np.zeros((2, 2), np.float32))
    saver.restore_from_file(alike, tmp_path)
    np.testing.assert_array_equal(alike.numpy(), np.full((2, 2), 3.0))


def test_saver_restores_a_dump_of_the_earlier_layout(tmp_path):
    """A directory holding one table's dump directly (what dump_to_file wrote
    before it kept tables by name) restores into any table."""
    from sok_graph.dump_load import write_dump

    sok.init(comm_tool="none")
    write_dump(str(tmp_path / "old"), {"table": ("dynamic", {
        "keys": np.array([4, 6], np.int64), "values": np.array([[4.0], [6.0]], np.float32)})})
    var = sok.DynamicVariable(dimension=1, initializer="0", name="anything")
    sok.Saver().restore_from_file(var, tmp_path / "old")
    got = dict(zip(*(x.numpy().tolist() for x in sok.export(var))))
    assert got == {4: [4.0], 6: [6.0]}


def test_saver_keeps_each_workers_shard_apart(tmp_path):
    """Every worker dumps its shard of a table to the same directory (as in
    SOK 1.x): each restores its own rows (the last worker's used to
    overwrite the others'). Two shards of one table, their placement set
    by hand as two workers would have it."""
    sok.init(comm_tool="none")
    whole = np.arange(12, dtype=np.float32).reshape(6, 2)
    shards = []
    for rank in (0, 1):
        shard = sok.Variable(whole[rank::2].copy(), name="emb")
        shard._sok_world_size, shard._sok_rank = 2, rank
        shard._sok_global_shape = tf.TensorShape([6, 2])
        shards.append(shard)
    saver = sok.Saver()
    for shard in shards:
        saver.dump_to_file(shard, tmp_path)
    for shard in shards:
        shard.assign(np.zeros((3, 2), np.float32))
        saver.restore_from_file(shard, tmp_path)
    np.testing.assert_array_equal(shards[0].numpy(), whole[0::2])
    np.testing.assert_array_equal(shards[1].numpy(), whole[1::2])


def test_saver_takes_its_directory_as_a_string_tensor(tmp_path):
    """In a Session the directory may be fed per run; anything but a path or
    a string is refused naming filepath (a tensor's repr used to become the
    directory's name)."""
    with tf.Graph().as_default():
        sok.init()
        var = sok.DynamicVariable(dimension=1, initializer="0", name="t")
        path = tf.compat.v1.placeholder(tf.string, [])
        write = var.scatter_update(tf.constant([3], tf.int64), tf.constant([[3.0]]))
        saver = sok.Saver()
        dump, restore = saver.dump_to_file(var, path), saver.restore_from_file(var, path)
        wipe = var.scatter_update(tf.constant([3], tf.int64), tf.constant([[0.0]]))
        read = var.sparse_read(tf.constant([3], tf.int64))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(write)
            sess.run(dump, {path: str(tmp_path / "step1")})
            sess.run(wipe)
            sess.run(restore, {path: str(tmp_path / "step1")})
            assert sess.run(read).tolist() == [[3.0]]
        assert (tmp_path / "step1").is_dir()
        with pytest.raises(TypeError, match="filepath must be"):
            saver.dump_to_file(var, 7)
        with pytest.raises(TypeError, match="filepath must be"):
            saver.dump_to_file(var, tf.constant([1, 2]))


def test_saver_refuses_int64_keys_for_an_int32_table(tmp_path):
    """Keys past int32 restored into an int32-key table used to be cast:
    2^32 + 5 became 5, 2^31 became -2^31. A CheckpointError instead, and the
    table keeps its rows."""
    saver = sok.Saver()
    src = sok.DynamicVariable(dimension=1, initializer="0")
    keys = tf.constant([2 ** 32 + 5, 2 ** 31], tf.int64)
    src.sparse_read(keys)
    src.scatter_update(keys, tf.constant([[1.0], [2.0]]))
    saver.dump_to_file(src, tmp_path / "t")
    dst = sok.DynamicVariable(dimension=1, initializer="0", key_type=tf.int32)
    dst.scatter_update(tf.constant([3], tf.int32), tf.constant([[9.0]]))
    from sok_graph.dump_load import CheckpointError

    # Either key may be named: a GPU table dumps its keys in its own order.
    with pytest.raises(CheckpointError, match="key (4294967301|2147483648), .*int32"):
        saver.restore_from_file(dst, tmp_path / "t")
    exported = [x.numpy().tolist() for x in sok.export(dst)]
    assert exported == [[3], [[9.0]]]


# filter_ratio's draw, as sok_graph/tables/admission.py describes it: keys
# cut into 31-bit pieces, mixed modulo 2^31 - 1; a new key enters in call
# number `call` when hash(key, call) / (2^31 - 1) < filter_ratio. Plain
# Python, the reference of the Saver's draw tests below.
_P = (1 << 31) - 1
_M = (1103515245, 2147001325, 1664525013, 1013904223, 2027382509, 1597334677)


def _mix(v, m):
    return ((v % _P) * m) % _P


def _draw_hash(key, salt):
    k = int(key) & ((1 << 64) - 1)
    low, mid, high = k & _P, (k >> 31) & _P, (k >> 62) & 3
    h = _mix(low, _M[0]) + _mix(mid, _M[1]) + _mix(high + 1, _M[2]) + _mix(salt, _M[3])
    h = _mix(h, _M[4])
    h ^= h >> 15
    return _mix(h + salt, _M[5])


def _drawn(keys, ratio, calls):
    """The keys that filter_ratio=ratio admits in the given call numbers."""
    return {int(k) for k in keys if any(_draw_hash(k, c) / _P < ratio for c in calls)}


def _filtered_read(var, keys):
    """One filtered read (a call) of `keys`, repeats included."""
    ids = tf.RaggedTensor.from_row_lengths(tf.constant(keys, tf.int64), [len(keys)])
    return sok.lookup_sparse(var, ids, combiners="sum", use_low_frequency_filter=True)


def _held_after_a_saver_round_trip(mode, settings, before, after, path):
    """The keys a DynamicVariable(**settings) holds after a read (a call) of
    each key list in `before`, a sok.Saver dump to `path`, a restore into a
    new table of the same settings (a restarted job) and a read of each key
    list in `after`: eagerly, with the dump and the restore in tf.functions,
    or in Sessions (the restore in a graph of its own)."""
    sok.init(comm_tool="none")
    saver = sok.Saver()
    if mode == "session":
        with tf.Graph().as_default():
            sok.init()
            var = sok.DynamicVariable(DIM, **settings)
            reads = [_filtered_read(var, keys) for keys in before]
            dump = saver.dump_to_file(var, path)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                for read in reads:
                    sess.run(read)
                sess.run(dump)
        with tf.Graph().as_default():
            sok.init()
            var = sok.DynamicVariable(DIM, **settings)
            restore = saver.restore_from_file(var, path)
            reads = [_filtered_read(var, keys) for keys in after]
            held = sok.export(var)[0]
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                sess.run(restore)
                for read in reads:
                    sess.run(read)
                return set(sess.run(held).tolist())
    var = sok.DynamicVariable(DIM, **settings)
    for keys in before:
        _filtered_read(var, keys)
    restored = sok.DynamicVariable(DIM, **settings)

    def dump():
        saver.dump_to_file(var, path)

    def restore():
        saver.restore_from_file(restored, path)

    if mode == "function":
        dump, restore = tf.function(dump), tf.function(restore)
    dump()
    restore()
    for keys in after:
        _filtered_read(restored, keys)
    return set(restored.export()[0].numpy().tolist())


_SAVER_MODES = ["eager", "function", "session"]


@pytest.mark.parametrize("mode", _SAVER_MODES)
@pytest.mark.parametrize("sketch", [False, True], ids=["exact_counts", "sketch"])
def test_saver_keeps_a_counting_filters_counts(tmp_path, mode, sketch):
    """sok.Saver().dump_to_file / restore_from_file dropped the admission
    counts (sok.dump, tf.train.Checkpoint and Keras weights files keep
    them): a key seen twice before the save and once after it (3 =
    min_count occurrences) got no row. A key that entered before the save
    comes back as a row."""
    settings = dict(initializer="ones", name="saver_counts", min_count=3)
    if sketch:  # 4096 counters for 4 keys: the counts of each key alone
        settings["min_count_counters"] = 4096
    before, after = [[1, 1, 2], [7, 7, 7]], [[1, 2]]
    held = _held_after_a_saver_round_trip(mode, settings, before, after, str(tmp_path))
    # Plain count of occurrences: 7 entered before the save (3), 1 after it
    # (2 + 1), 2 was seen twice.
    seen = {}
    for keys in before + after:
        for k in keys:
            seen[k] = seen.get(k, 0) + 1
    assert held == {k for k, n in seen.items() if n >= 3} == {1, 7}


@pytest.mark.parametrize("mode", _SAVER_MODES)
def test_saver_keeps_the_draws_call_count(tmp_path, mode):
    """The same for filter_ratio's call count, which salts the draws: after
    a Saver restore the draws started again at call 1, repeating the draws
    that had turned keys away (the table that never stopped draws with
    call 3)."""
    keys = (np.arange(1, 2001, dtype=np.int64) * 7919).tolist()
    settings = dict(initializer="ones", name="saver_draws", filter_ratio=0.3)
    held = _held_after_a_saver_round_trip(mode, settings, [keys, keys], [keys], str(tmp_path))
    # Calls 1 and 2 before the save, 3 after it.
    assert held == _drawn(keys, 0.3, (1, 2, 3))
    assert held != _drawn(keys, 0.3, (1, 2))  # call 3 admitted keys of its own


@pytest.mark.parametrize("mode", _SAVER_MODES)
@pytest.mark.parametrize("evict", ["lfu", "lru"])
def test_saver_keeps_use_counts_and_times_so_a_bounded_table_evicts_as_before(tmp_path, mode,
                                                                             evict):
    """A bounded table of 8 rows holds keys 0-7; after the restore one new
    key evicts one of them. LFU must evict the least used key (1: key k
    was read k + 1 times, key 0 twenty times), LRU the key read longest
    ago (3: the last read before the save left it out). The Saver kept keys
    and rows only, so every restored key had a use count of 0 and was last
    used at the restore: key 0 was evicted in both cases."""
    if evict == "lfu":
        before = [list(range(8))] + [[0]] * 19 + [[k] for k in range(1, 8) for _ in range(k)]
        evicted = 1
    else:
        before = [list(range(8)), [0, 1, 2, 4, 5, 6, 7]]
        evicted = 3
    settings = dict(initializer="ones", name="saver_" + evict, var_type="hybrid",
                    max_capacity=8, evict_strategy=evict)
    held = _held_after_a_saver_round_trip(mode, settings, before, [[100]], str(tmp_path))
    assert held == set(range(8)) - {evicted} | {100}


def test_saver_restores_each_keys_use_count_and_time(tmp_path):
    """The restored table's last-use times and use counts are the dumped
    table's, key by key (read back with sok.export's read_all)."""
    sok.init(comm_tool="none")
    var = sok.DynamicVariable(DIM, initializer="ones", name="saver_meta")
    for keys in ([1, 2, 3], [2, 3], [3], [9]):
        _filtered_read(var, keys)

    def metadata(table):
        keys, _, meta = table.read_all()
        order = np.argsort(keys.numpy())
        return {m: dict(zip(keys.numpy()[order].tolist(), v.numpy()[order].tolist()))
                for m, v in meta.items()}

    sok.Saver().dump_to_file(var, str(tmp_path))
    restored = sok.DynamicVariable(DIM, initializer="zeros", name="saver_meta")
    _filtered_read(restored, [5])
    sok.Saver().restore_from_file(restored, str(tmp_path))
    got, want = metadata(restored), metadata(var)
    assert got == want
    assert want["frequencies"] == {1: 1, 2: 2, 3: 3, 9: 1}


@pytest.mark.parametrize("where", ["sok_dump", "saver_entry"])
def test_saver_refuses_a_later_dump_of_a_table_named_table_for_another_table(tmp_path, where):
    """A dump of one table named "table" read as the earlier one-table layout
    gave its rows to any table restored from it, which lost its own rows
    without an error: a sok.dump of such a table, or the directory a Saver
    keeps it in (filepath given one level too deep). Refused now, the
    table unchanged; a dump of the earlier layout itself still restores
    (test_saver_restores_a_dump_of_the_earlier_layout)."""
    from sok_graph.dump_load import CheckpointError

    sok.init(comm_tool="none")
    other = sok.DynamicVariable(1, initializer="ones", name="table")
    other.sparse_read(tf.constant([1, 2], tf.int64))
    if where == "sok_dump":
        path = str(tmp_path / "dump")
        sok.dump(path, [other])
    else:
        sok.Saver().dump_to_file(other, str(tmp_path / "saver"))
        path = str(tmp_path / "saver" / "table")
    mine = sok.DynamicVariable(1, initializer="zeros", name="user_emb")
    mine.sparse_read(tf.constant([9], tf.int64))
    with pytest.raises(CheckpointError, match=r"the dump of one table named 'table' .*not a "
                                              r"Saver's directory: it holds no 'user_emb'"):
        sok.Saver().restore_from_file(mine, path)
    assert sok.export(mine)[0].numpy().tolist() == [9]


@pytest.mark.parametrize("kind", ["static", "dynamic"])
@pytest.mark.parametrize("dense", [True, False], ids=["with_dense", "table_only"])
def test_a_train_op_run_by_its_name_trains_the_tables(kind, dense):
    """minimize(loss, global_step, name="train") inside sok.OptimizerScope:
    the op named "train" (what sess.run("train") and a meta graph imported
    elsewhere run) and the graph's TRAIN_OP collection were the native
    update of the dense variable alone, so the table never trained without
    an error; with the table alone the name was dropped. Both are now the
    whole update, compared with the same model on a plain tf.Variable."""
    init_rows = np.full((3, 2), 0.5, np.float32)

    def train_by_name(table_kind):
        with tf.Graph().as_default() as graph:
            sok.Init(global_batch_size=1)
            step = tf.compat.v1.train.get_or_create_global_step()
            if table_kind == "plain":
                table = tf.compat.v1.get_variable("t", initializer=init_rows, use_resource=True)
            elif table_kind == "static":
                table = sok.Variable(init_rows, name="t")
            else:
                table = sok.DynamicVariable(dimension=2, initializer="0.5", name="t")
            weight = tf.compat.v1.get_variable("d", initializer=np.ones((2, 1), np.float32),
                                               use_resource=True, trainable=dense)
            ids = tf.constant([0, 1, 2], tf.int64)
            rows = tf.nn.embedding_lookup(table, ids)
            loss = tf.reduce_sum(tf.square(tf.matmul(rows, weight) - 2.0))
            opt = tf.compat.v1.train.AdagradOptimizer(0.3)
            with sok.OptimizerScope([table] if table_kind != "plain" else []):
                returned = opt.minimize(loss, global_step=step, name="train")
            assert returned.name == "train"
            assert tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP) == [returned]
            assert graph.get_operation_by_name("train") is returned
            with tf.compat.v1.Session() as sess:
                sok.initialize_session(sess)
                for _ in range(3):
                    sess.run("train")
                return sess.run([rows, weight, step])

    want = train_by_name("plain")
    got = train_by_name(kind)
    np.testing.assert_allclose(got[0], want[0], **TOL)
    np.testing.assert_allclose(got[1], want[1], **TOL)
    assert got[2] == want[2] == 3
    assert not np.allclose(got[0], init_rows)


def test_saver_keeps_each_workers_shard_of_the_filter_state_apart(tmp_path):
    """Every worker dumps its shard's counts with its rows (as in
    test_saver_keeps_each_workers_shard_apart, two shards of one table,
    placed by hand as two workers would have them): each restores its own."""
    sok.init(comm_tool="none")

    def shards():
        made = []
        for rank in (0, 1):
            shard = sok.DynamicVariable(DIM, initializer="ones", name="counted", min_count=3)
            shard._placement = (2, rank, -1)  # keys k with k mod 2 == rank
            made.append(shard)
        return made

    def read(shard, keys):  # the shard's own read, as a worker's side of a lookup
        shard.sparse_read(tf.constant(keys, tf.int64))

    # Each shard reads the keys it owns: 2 twice and 4 once on worker 0; 1
    # once and 3 three times (it enters) on worker 1.
    before = [[2, 2, 4], [1, 3, 3, 3]]
    saver = sok.Saver()
    for shard, keys in zip(shards(), before):
        read(shard, keys)
        saver.dump_to_file(shard, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["counted.shard-0-of-2",
                                                          "counted.shard-1-of-2"]
    after = [[2, 4], [1]]
    for shard, again, keys in zip(shards(), before, after):
        saver.restore_from_file(shard, tmp_path)
        read(shard, keys)
        # Plain count of occurrences on the shard: those seen 3 times.
        want = {k for k in set(keys + again) if (keys + again).count(k) >= 3}
        assert set(shard.export()[0].numpy().tolist()) == want
    assert want == {3}


def test_saver_restores_a_dump_without_filter_state(tmp_path):
    """A Saver dump written before the filter's state was kept (keys and
    rows only) still restores: the rows, and counting and drawing start
    afresh (the counts and call count the table had are dropped), as
    sok.load of a dump without them does."""
    from sok_graph.dump_load import write_dump

    sok.init(comm_tool="none")
    for name in ("old_counts", "old_draws"):
        write_dump(str(tmp_path / name), {name: ("dynamic", {
            "keys": np.array([100], np.int64), "values": np.full([1, DIM], 5.0, np.float32)})})
    counting = sok.DynamicVariable(DIM, initializer="ones", name="old_counts", min_count=3)
    _filtered_read(counting, [1, 1])  # two of key 1's three occurrences
    sok.Saver().restore_from_file(counting, tmp_path)
    _filtered_read(counting, [1])  # its first occurrence after the restore
    assert set(counting.export()[0].numpy().tolist()) == {100}

    keys = (np.arange(1, 2001, dtype=np.int64) * 7919).tolist()
    drawing = sok.DynamicVariable(DIM, initializer="ones", name="old_draws", filter_ratio=0.3)
    _filtered_read(drawing, keys)
    _filtered_read(drawing, keys)
    drawing.remove(tf.constant(keys, tf.int64))
    sok.Saver().restore_from_file(drawing, tmp_path)
    _filtered_read(drawing, keys)  # call 1 again
    assert set(drawing.export()[0].numpy().tolist()) == {100} | _drawn(keys, 0.3, (1,))


def test_saver_restore_refuses_counts_kept_another_way(tmp_path):
    """A Saver dump of a count-min sketch's counters restored into a table
    that counts per key (or the other way round) is a CheckpointError naming
    the variable and both ways, before the table changes, as sok.load's."""
    from sok_graph.dump_load import CheckpointError

    sok.init(comm_tool="none")
    sketch = sok.DynamicVariable(DIM, initializer="ones", name="kept", min_count=2,
                                 min_count_counters=64)
    _filtered_read(sketch, [1, 3, 3])
    sok.Saver().dump_to_file(sketch, tmp_path)
    exact = sok.DynamicVariable(DIM, initializer="ones", name="kept", min_count=2)
    _filtered_read(exact, [5, 5, 6])
    with pytest.raises(CheckpointError, match=re.escape(
            f"variable 'kept' counts keys for its admission filter as {{'kind': 'keys'}}; the "
            f"Saver dump at {tmp_path / 'kept'} kept its counts as {{'counters': 64, "
            f"'hashes': 3, 'kind': 'sketch'}}")):
        sok.Saver().restore_from_file(exact, tmp_path)
    assert set(exact.export()[0].numpy().tolist()) == {5}
    _filtered_read(exact, [6])  # its count (1) was kept: 2 now
    assert set(exact.export()[0].numpy().tolist()) == {5, 6}


def test_load_embedding_values_checks_rows_fed_in_a_session():
    """A static table's rows from a placeholder of unknown length: a count
    other than the table's rows fails when the Session runs it, before any
    row changes (two rows used to fill half the table)."""
    with tf.Graph().as_default():
        sok.init()
        var = sok.Variable(np.full((4, 2), 7.0, np.float32))
        rows = tf.compat.v1.placeholder(tf.float32, [None, 2])
        load = sok.Saver().load_embedding_values(var, rows)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for count in (2, 6):
                with pytest.raises(tf.errors.InvalidArgumentError, match="has 4 rows"):
                    sess.run(load, {rows: np.zeros((count, 2), np.float32)})
            np.testing.assert_array_equal(sess.run(var.value()), np.full((4, 2), 7.0))
            sess.run(load, {rows: np.ones((4, 2), np.float32)})
            np.testing.assert_array_equal(sess.run(var.value()), np.ones((4, 2)))


def test_dump_with_native_optimizer_in_scope(tmp_path):
    sok.Init(global_batch_size=2)
    layer = sok.All2AllDenseEmbedding(8, 2, 1, 1, dynamic_input=True)
    var = layer.embedding_variable
    opt = tf.keras.optimizers.Adagrad(0.1)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(tf.constant([1, 2], tf.int64)))
    with sok.OptimizerScope([var]):
        opt.apply_gradients([(tape.gradient(loss, var), var)])
    sok.dump(str(tmp_path / "d"), [var], optimizer=opt)
    before = var.find(tf.constant([1, 2], tf.int64))[0].numpy()
    var.scatter_update(tf.constant([1, 2], tf.int64), tf.zeros([2, 2]))
    sok.load(str(tmp_path / "d"), [var], optimizer=opt)
    np.testing.assert_array_equal(var.find(tf.constant([1, 2], tf.int64))[0].numpy(), before)


def test_optimizer_scope_rejects_plain_variables_and_leaves_no_trace():
    sok.Init(global_batch_size=2)
    plain = tf.Variable([[1.0]])
    with pytest.raises(TypeError, match="embedding_variables\\[0\\]"):
        sok.OptimizerScope([plain])
    original = type(tf.keras.optimizers.SGD(0.1)).apply_gradients
    layer = sok.All2AllDenseEmbedding(4, 1, 1, 1, dynamic_input=True)
    with sok.OptimizerScope([layer.embedding_variable]):
        pass
    assert type(tf.keras.optimizers.SGD(0.1)).apply_gradients is original
    # Outside the scope a native optimizer is untouched for plain variables.
    opt = tf.keras.optimizers.SGD(1.0)
    opt.apply_gradients([(tf.constant([[0.5]]), plain)])
    np.testing.assert_allclose(plain.numpy(), [[0.5]])


@pytest.mark.skipif(compat.KERAS_MAJOR_VERSION < 3, reason="Keras 3's optimizer.apply")
@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_keras_3s_apply_inside_the_scope_updates_sok_tables_row_by_row(kind):
    """Keras 3's own custom-loop call, opt.apply(grads, trainable_variables),
    inside sok.OptimizerScope: the sok table takes the wrapper's sparse
    update and the dense weight Keras' own, as with apply_gradients, and the
    table ends as a plain tf.Variable trained by another Adagrad. apply went
    past the scope: Keras made its own slot for a static table, and a
    dynamic table was refused as if outside the scope."""
    sok.init(comm_tool="none")
    start = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    if kind == "static":
        table = sok.Variable(start)
    else:
        table = sok.DynamicVariable(3, initializer="zeros")
        sok.assign(table, tf.range(4, dtype=tf.int64), start)
    plain, dense, plain_dense = (tf.Variable(start), tf.Variable([[1.0], [2.0], [3.0]]),
                                 tf.Variable([[1.0], [2.0], [3.0]]))
    ids = tf.ragged.constant([[0, 1], [1, 3]], tf.int64)
    opt, reference = tf.keras.optimizers.Adagrad(0.1), tf.keras.optimizers.Adagrad(0.1)
    for _ in range(3):
        with tf.GradientTape(persistent=True) as tape:
            rows = sok.lookup_sparse([table], [ids], combiners=["sum"])[0]
            loss = tf.reduce_sum(tf.matmul(rows, dense) ** 2)
            plain_rows = tf.nn.embedding_lookup_sparse(plain, ids.to_sparse(), None,
                                                       combiner="sum")
            plain_loss = tf.reduce_sum(tf.matmul(plain_rows, plain_dense) ** 2)
        with sok.OptimizerScope([table]):
            opt.apply(tape.gradient(loss, [table, dense]), [table, dense])
        reference.apply(tape.gradient(plain_loss, [plain, plain_dense]), [plain, plain_dense])
    keys, got = (t.numpy() for t in sok.export(table))
    np.testing.assert_allclose(got[np.argsort(keys)][[0, 1, 3]], plain.numpy()[[0, 1, 3]],
                               rtol=1e-5)
    np.testing.assert_allclose(dense.numpy(), plain_dense.numpy(), rtol=1e-5)
    assert not np.allclose(plain.numpy()[[0, 1, 3]], start[[0, 1, 3]])
    # Keras' own state holds the dense weight's accumulator only.
    assert all(v.shape != (4, 3) for v in opt.variables), [v.name for v in opt.variables]


# ------------------------------------------------- hostile arguments (layers)

@pytest.mark.parametrize("dtype", [tf.float16, "float16", tf.float64, "bfloat16", tf.int32])
@pytest.mark.parametrize("kind", ["a2a", "dist"])
def test_layers_refuse_a_dtype_their_float32_tables_do_not_have(kind, dtype):
    """dtype=tf.float16 (or float64, ...) was passed on to Keras and ignored:
    the layer kept float32 rows and returned float32. Refused now, naming
    dtype, before a table is made."""
    sok.Init(global_batch_size=2)
    name = tf.as_dtype(dtype).name
    with pytest.raises(ValueError, match=rf"dtype=.*{name}.*must be float32"):
        if kind == "a2a":
            sok.All2AllDenseEmbedding(10, 4, 1, 2, dtype=dtype)
        else:
            sok.DistributedEmbedding("sum", 10, 4, 1, 2, dtype=dtype)
    layer = (sok.All2AllDenseEmbedding(10, 4, 1, 2, dtype="float32") if kind == "a2a" else
             sok.DistributedEmbedding("sum", 10, 4, 1, 2, dtype=tf.float32))
    assert layer.embedding_variable.dtype == tf.float32


@pytest.mark.skipif(sok.compat.IS_TF1, reason="TF 1.15's Keras has no dtype policy names")
@pytest.mark.parametrize("policy, out", [("mixed_float16", tf.float16),
                                         ("mixed_bfloat16", tf.bfloat16)])
def test_a_mixed_precision_layer_returns_its_compute_dtype(policy, out):
    """Under a mixed-precision policy (float32 variables) the output is the
    float32 rows cast to the compute dtype, as Keras's Embedding gives them
    (it was float32 whatever the policy)."""
    sok.Init(global_batch_size=2)
    w = np.random.default_rng(4).normal(size=(10, 4)).astype(np.float32)
    dense = tf.constant([[[1, 7]], [[3, 3]]], tf.int64)
    a2a = sok.All2AllDenseEmbedding(10, 4, 1, 2, use_hashtable=False, dtype=policy,
                                    embedding_initializer=w)
    got = a2a(dense)
    assert got.dtype == out
    np.testing.assert_array_equal(got.numpy(), tf.cast(tf.nn.embedding_lookup(w, dense),
                                                       out).numpy())
    sp = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant([1, 7, 3], tf.int64), [2, 2])
    dist = sok.DistributedEmbedding("sum", 10, 4, 1, 2, use_hashtable=False, dtype=policy,
                                    embedding_initializer=w)
    got = dist(sp)
    assert got.dtype == out
    want = tf.nn.embedding_lookup_sparse(w, sp, None, combiner="sum")
    np.testing.assert_array_equal(got.numpy(), tf.cast(tf.reshape(want, [2, 1, 4]), out).numpy())


@pytest.mark.parametrize("init", [
    np.full((3, 4), 1e39),  # float64 beyond float32: became inf
    np.full((3, 4), np.nan),
    lambda: tf.keras.initializers.Constant(float("nan")),
    lambda: tf.keras.initializers.RandomUniform(0.0, float("inf")),
], ids=["float64_beyond_float32", "nan_array", "Constant_nan", "RandomUniform_inf"])
def test_static_layer_initializer_must_give_finite_rows(init):
    """A static (use_hashtable=False) layer's table took NaN or infinite
    initial rows without an error (a hashtable layer refuses the same
    initializers)."""
    sok.Init(global_batch_size=1)
    init = init() if callable(init) else init
    with pytest.raises(ValueError, match="embedding_initializer gives NaN or infinite rows"):
        sok.DistributedEmbedding("sum", 3, 4, 1, 2, use_hashtable=False,
                                 embedding_initializer=init)
    with pytest.raises(TypeError, match="embedding_initializer must be .* array of numbers"):
        sok.All2AllDenseEmbedding(3, 4, 1, 2, use_hashtable=False, embedding_initializer=True)
    with pytest.raises(ValueError, match="^embedding_initializer: .*bogus"):
        sok.All2AllDenseEmbedding(3, 4, 1, 2, use_hashtable=False, embedding_initializer="bogus")
    big = np.full((3, 4), 3e38)  # float64, within float32: taken as float32
    layer = sok.All2AllDenseEmbedding(3, 4, 1, 2, use_hashtable=False, embedding_initializer=big)
    np.testing.assert_array_equal(tf.convert_to_tensor(layer.embedding_variable).numpy(),
                                  big.astype(np.float32))


def test_static_layer_initializer_is_checked_when_the_graph_runs():
    """In graph mode the rows an initializer gives are known only when the
    variable initializer runs: it fails then, naming embedding_initializer."""
    with tf.Graph().as_default():
        init_op = sok.Init(global_batch_size=1)
        layer = sok.All2AllDenseEmbedding(3, 4, 1, 2, use_hashtable=False,
                                          embedding_initializer=tf.keras.initializers.Constant(
                                              float("nan")))
        with tf.compat.v1.Session() as sess:
            sess.run(init_op)
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match="embedding_initializer gives NaN or infinite rows"):
                sess.run(layer.embedding_variable.initializer)


@pytest.mark.parametrize("make", [
    lambda: tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [1, 2]),
    lambda: tf.ragged.constant([[1, 2], [3]], tf.int64),
], ids=["SparseTensor", "RaggedTensor"])
def test_all2all_layer_names_sparse_and_ragged_inputs(make):
    """All2AllDenseEmbedding takes a dense tensor of keys; a SparseTensor or
    RaggedTensor failed inside tf.convert_to_tensor, naming neither the
    layer nor its argument."""
    sok.Init(global_batch_size=1)
    layer = sok.All2AllDenseEmbedding(10, 4, 1, 2, name="dense_keys")
    with pytest.raises(TypeError, match=r"dense_keys: inputs must be a dense tensor .* got a "
                                        r"(SparseTensor|RaggedTensor)"):
        layer(make())


# ------------------------------------------------- hostile arguments (Saver)

def test_saver_refuses_a_directory_holding_a_sok_dump(tmp_path):
    """dump_to_file into the directory of a sok.dump (or a directory inside
    it) wrote the table's directory in among the dump's files (a sok.dump
    there then refused to replace the mixed directory). Refused before anything is written,
    eagerly and from a Session; the dump stays as it was and loads."""
    sok.init(comm_tool="none")
    dumped = np.arange(6, dtype=np.float32).reshape(3, 2)
    var = sok.Variable(dumped, name="emb")
    path = str(tmp_path / "ckpt")
    sok.dump(path, [var])
    before = sorted(os.listdir(path))
    with pytest.raises(FileExistsError, match=r"filepath=.*ckpt.* is a sok.dump \(of \['emb'\]\)"):
        sok.Saver().dump_to_file(var, path)
    # A directory to make inside the dump mixes in as well.
    with pytest.raises(FileExistsError, match=r"filepath=.*sub.* is inside the sok.dump"):
        sok.Saver().dump_to_file(var, os.path.join(path, "sub"))
    assert sorted(os.listdir(path)) == before
    with tf.Graph().as_default():
        sok.init(comm_tool="none")
        gvar = sok.Variable(dumped, name="emb")
        feed = tf.compat.v1.placeholder(tf.string, [])
        op = sok.Saver().dump_to_file(gvar, feed)
        with tf.compat.v1.Session() as sess:
            sess.run(gvar.initializer)
            with pytest.raises(Exception, match="is a sok.dump"):
                sess.run(op, {feed: path})
    assert sorted(os.listdir(path)) == before
    sok.init(comm_tool="none")
    var.assign(np.zeros((3, 2), np.float32))
    sok.load(path, [var])
    np.testing.assert_array_equal(var.numpy(), dumped)


def test_saver_dumps_beneath_another_programs_manifest_and_restores_only_its_own_rows(tmp_path):
    """A manifest.json of another program in a directory above (a web app's,
    a data set's) refused every Saver dump beneath it, "inside the sok.dump
    ... (of [])". A sok.dump of several tables, one of them named "table"
    (the earlier one-table layout's name), gave its rows to any table
    restored from it; the Saver now refuses such a directory."""
    from sok_graph.dump_load import CheckpointError

    sok.init(comm_tool="none")
    project = tmp_path / "project"
    project.mkdir()
    (project / "manifest.json").write_text('{"name": "web app", "version": 3}')
    rows = np.arange(6, dtype=np.float32).reshape(3, 2)
    var = sok.Variable(rows, name="emb")
    ckpt = str(project / "runs" / "ckpt")
    sok.Saver().dump_to_file(var, ckpt)
    var.assign(np.zeros((3, 2), np.float32))
    sok.Saver().restore_from_file(var, ckpt)
    np.testing.assert_array_equal(var.numpy(), rows)

    other = sok.Variable(np.full((3, 2), 7.0, np.float32), name="table")
    mine = sok.Variable(np.ones((3, 2), np.float32), name="user_emb")
    dump = str(tmp_path / "dump")
    sok.dump(dump, [other, mine])
    mine.assign(np.zeros((3, 2), np.float32))
    with pytest.raises(CheckpointError, match=r"is a sok.dump of \['table', 'user_emb'\], not a "
                                              r"Saver's directory .* restore it with sok.load"):
        sok.Saver().restore_from_file(mine, dump)
    np.testing.assert_array_equal(mine.numpy(), np.zeros((3, 2), np.float32))
    sok.load(dump, [mine])
    np.testing.assert_array_equal(mine.numpy(), np.ones((3, 2), np.float32))


def test_saver_filepath_empty_or_bytes(tmp_path, monkeypatch):
    """filepath="" was the current directory: dump_to_file wrote the table's
    directory into wherever the process ran, and restore_from_file read
    from there. "" is a ValueError naming filepath now (as sok.dump's path);
    bytes are a path, as sok.dump takes them."""
    sok.init(comm_tool="none")
    monkeypatch.chdir(tmp_path)
    rows = np.arange(4, dtype=np.float32).reshape(2, 2)
    var = sok.Variable(rows, name="t")
    saver = sok.Saver()
    with pytest.raises(ValueError, match="Saver.dump_to_file: filepath must name a directory"):
        saver.dump_to_file(var, "")
    with pytest.raises(ValueError, match="Saver.dump_to_file: filepath must name a directory"):
        saver.dump_to_file(var, tf.constant(""))
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="Saver.restore_from_file: filepath must name a dir"):
        saver.restore_from_file(var, "")
    saver.dump_to_file(var, os.fsencode(str(tmp_path / "d")))
    var.assign(np.zeros((2, 2), np.float32))
    saver.restore_from_file(var, os.fsencode(str(tmp_path / "d")))
    np.testing.assert_array_equal(var.numpy(), rows)


@pytest.mark.parametrize("bad", [{"a": 1}, "abc", [[True, False], [True, True]]],
                         ids=["dict", "str", "bool"])
def test_load_embedding_values_names_tensors_that_are_not_numbers(bad):
    """A dict, a string or bools failed in float() or a conversion naming no
    argument."""
    sok.init(comm_tool="none")
    var = sok.Variable(np.ones((2, 2), np.float32), name="t")
    with pytest.raises(TypeError, match=r"tensors\[0\] must be a \[rows, dim\] array or tensor "
                                        r"of numbers"):
        sok.Saver().load_embedding_values(var, bad)
    np.testing.assert_array_equal(var.numpy(), np.ones((2, 2)))


def test_distributed_embedding_checks_a_sparse_shape_known_only_when_run():
    """A SparseTensor whose dense shape is known only when the graph runs (a
    tf.function of SparseTensorSpec([None, None])): rows not a multiple of
    slot_num failed in a reshape naming nothing, and a second dimension
    beyond max_nnz was accepted (eagerly both are refused). Both fail now
    with the layer's messages; valid input is tf.nn.embedding_lookup_sparse's."""
    sok.Init(global_batch_size=2)
    w = np.random.default_rng(7).normal(size=(10, 4)).astype(np.float32)
    layer = sok.DistributedEmbedding("sum", 10, 4, 2, 2, use_hashtable=False,
                                     embedding_initializer=w, name="late_shape")

    @tf.function(input_signature=[tf.SparseTensorSpec([None, None], tf.int64)])
    def run(sp):
        return layer(sp)

    def sparse(rows, cols):
        return tf.SparseTensor([[0, 0], [rows - 1, cols - 1]], tf.constant([1, 2], tf.int64),
                               [rows, cols])

    want = tf.nn.embedding_lookup_sparse(w, sparse(4, 2), None, combiner="sum")
    np.testing.assert_allclose(run(sparse(4, 2)).numpy(), tf.reshape(want, [2, 2, 4]).numpy(),
                               **TOL)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"late_shape: the SparseTensor must have batch \* slot_num rows"):
        run(sparse(3, 2))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="late_shape: the second dimension of the SparseTensor exceeds "
                             "max_nnz=2"):
        run(sparse(4, 5))


def test_distributed_embedding_names_inputs_of_another_rank():
    """A RaggedTensor of ragged rank 2 or of 2-D values, a SparseTensor of a
    static rank 3 (tf.function of SparseTensorSpec([None, None, None])) or
    one of rank 3 fed to a sparse placeholder of no shape: the errors named
    sp_ids[0], the argument of the lookup inside the layer (the layer's own
    checks were skipped). They name the layer and inputs now; 2-D input
    still matches tf.nn.embedding_lookup_sparse."""
    sok.Init(global_batch_size=2)
    w = np.random.default_rng(3).normal(size=(10, 4)).astype(np.float32)
    layer = sok.DistributedEmbedding("sum", 10, 4, 1, 3, use_hashtable=False,
                                     embedding_initializer=w, name="ranked")
    nested = tf.RaggedTensor.from_row_splits(
        tf.RaggedTensor.from_row_splits(tf.constant([1, 2, 3], tf.int64), [0, 1, 3]), [0, 1, 2])
    with pytest.raises(ValueError, match=r"ranked: inputs must be a 2-D RaggedTensor \[batch "
                       r"\* slot_num, \(keys\)\]; got ragged rank 2 with values of rank 1"):
        layer(nested)
    column = tf.RaggedTensor.from_row_splits(tf.constant([[1], [2], [3]], tf.int64), [0, 1, 3])
    with pytest.raises(ValueError, match=r"ranked: inputs must be a 2-D RaggedTensor .*got "
                       r"ragged rank 1 with values of rank 2"):
        layer(column)

    @tf.function(input_signature=[tf.SparseTensorSpec([None, None, None], tf.int64)])
    def run(sp):
        return layer(sp)

    with pytest.raises(ValueError, match=r"ranked: inputs must be a 2-D SparseTensor \[batch "
                       r"\* slot_num, max_nnz\]; got rank 3"):
        run.get_concrete_function()
    ragged = tf.ragged.constant([[1], [2, 3]], tf.int64)
    want = tf.reshape(tf.nn.embedding_lookup_sparse(w, ragged.to_sparse(), None,
                                                    combiner="sum"), [2, 1, 4]).numpy()
    np.testing.assert_allclose(layer(ragged).numpy(), want, **TOL)
    from sok_graph.compat.keras import KERAS_MAJOR_VERSION

    if KERAS_MAJOR_VERSION >= 3:
        return  # Keras 3 itself refuses a placeholder of unknown rank ("as_list()")
    with tf.Graph().as_default():
        sok.Init(global_batch_size=2)
        graph_layer = sok.DistributedEmbedding("sum", 10, 4, 1, 3, use_hashtable=False,
                                               embedding_initializer=w, name="ranked_graph")
        sp = tf.compat.v1.sparse_placeholder(tf.int64)
        out = graph_layer(sp)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match=r"ranked_graph: inputs must be a 2-D SparseTensor \[batch "
                                     r"\* slot_num, max_nnz\]; its dense_shape has another "
                                     r"rank"):
                sess.run(out, {sp: tf.compat.v1.SparseTensorValue([[0, 0, 0]], [1], [2, 2, 2])})
            got = sess.run(out, {sp: tf.compat.v1.SparseTensorValue([[0, 0], [1, 0], [1, 1]],
                                                                    [1, 2, 3], [2, 2])})
            np.testing.assert_allclose(got, want, **TOL)


def test_all2all_layer_checks_an_input_shape_known_only_when_run():
    """Inputs whose shape is known only when the graph runs (a tf.function
    of TensorSpec([None, None, None]) or of no shape, a placeholder of no
    shape): [1, 1, 2], [1, 4, 1] or [1, 2] keys were looked up and gave
    rows of their shape ([1, 1, 2, dim]), where eagerly they are refused
    for not being [batch, slot_num, nnz_per_slot]. They fail with the
    layer's message, a hashtable layer inserting none of their keys; the
    right shape reads as tf.nn.embedding_lookup."""
    sok.Init(global_batch_size=2)
    w = np.random.default_rng(11).normal(size=(10, 3)).astype(np.float32)
    layer = sok.All2AllDenseEmbedding(10, 3, slot_num=2, nnz_per_slot=2, use_hashtable=False,
                                      embedding_initializer=w, name="late_keys")
    hashed = sok.All2AllDenseEmbedding(16, 3, slot_num=2, nnz_per_slot=2, name="late_hashed")
    message = (r"late_(keys|hashed): inputs must have shape \[batch, slot_num=2, "
               r"nnz_per_slot=2\] \(pass dynamic_input=True for inputs of any shape\); got "
               r"shape")
    for spec in (tf.TensorSpec([None, None, None], tf.int64), tf.TensorSpec(None, tf.int64)):
        for table in (layer, hashed):
            run = tf.function(table.__call__, input_signature=[spec])
            for keys in ([[[6, 7]]], [[[6], [7], [8], [6]]], [[7, 8]]):
                if spec.shape.rank == 3 and np.ndim(keys) != 3:
                    continue
                with pytest.raises(tf.errors.InvalidArgumentError, match=message):
                    run(tf.constant(keys, tf.int64))
            keys = [[[1, 2], [3, 9]], [[0, 0], [5, 4]]]
            got = run(tf.constant(keys, tf.int64)).numpy()
            if table is layer:
                np.testing.assert_allclose(got, tf.nn.embedding_lookup(w, keys).numpy(), **TOL)
    assert int(hashed.embedding_variable.size[0]) == 7  # the keys of the right shape only
    with tf.Graph().as_default():
        sok.Init(global_batch_size=2)
        graph_layer = sok.All2AllDenseEmbedding(10, 3, slot_num=2, nnz_per_slot=2,
                                                use_hashtable=False, embedding_initializer=w,
                                                name="late_keys")
        keys = tf.compat.v1.placeholder(tf.int64, [None, None, None])
        out = graph_layer(keys)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            with pytest.raises(tf.errors.InvalidArgumentError, match=message):
                sess.run(out, {keys: [[[1, 2]]]})
            np.testing.assert_allclose(sess.run(out, {keys: [[[1, 2], [3, 9]]]}),
                                       w[np.array([[[1, 2], [3, 9]]])], **TOL)


def test_an_initializer_class_given_for_an_instance_is_named():
    """embedding_initializer=tf.keras.initializers.Zeros (the class, not
    Zeros()): a static layer failed with "Zeros() takes no arguments" or
    "RandomNormal.__init__() got an unexpected keyword argument 'shape'", a
    hashtable layer and a DynamicVariable with "get_config() missing 1
    required positional argument: 'self'"; a callable of another signature
    (np.zeros) with "Cannot interpret 'tf.float32' as a data type". Each
    names the layer or the argument now; an instance gives its rows."""
    sok.Init(global_batch_size=2)
    for cls in (tf.keras.initializers.Zeros, tf.keras.initializers.RandomNormal):
        name = cls.__name__
        with pytest.raises(TypeError) as refused:
            sok.All2AllDenseEmbedding(4, 2, 1, 1, use_hashtable=False, embedding_initializer=cls,
                                      name="by_class")
        assert str(refused.value) == (
            f"by_class: embedding_initializer must be an initializer object, a name, a number "
            f"or a [4, 2] array; got the class {name} (give an instance: {name}())")
        spec_message = (f"initializer must be a name, a number or a Keras/TF initializer "
                        f"object; got the class {name} (give an instance: {name}())")
        with pytest.raises(TypeError) as refused:
            sok.All2AllDenseEmbedding(4, 2, 1, 1, embedding_initializer=cls)
        assert str(refused.value) == "embedding_initializer: " + spec_message
        with pytest.raises(TypeError) as refused:
            sok.DynamicVariable(2, initializer=cls)
        assert str(refused.value) == spec_message
    with pytest.raises(TypeError, match=r"^by_numpy: embedding_initializer <built-in function "
                                        r"zeros> failed when called as init\(shape=\[4, 2\], "
                                        r"dtype=tf.float32\): "):
        sok.All2AllDenseEmbedding(4, 2, 1, 1, use_hashtable=False, embedding_initializer=np.zeros,
                                  name="by_numpy")
    layer = sok.All2AllDenseEmbedding(4, 2, 1, 1, use_hashtable=False,
                                      embedding_initializer=tf.keras.initializers.Constant(3.0))
    np.testing.assert_array_equal(layer(tf.constant([[[1]], [[3]]], tf.int64)).numpy(),
                                  np.full((2, 1, 1, 2), 3.0))


def test_init_takes_numpy_integers():
    """sok.Init(global_batch_size=np.int64(4)) and seed=np.int64(3) (a numpy
    computation's result) were refused as "not a positive integer"; they
    are the integers they hold now. numpy bools and floats stay refused."""
    sok.Init(global_batch_size=np.int64(4), seed=np.int64(3))
    assert context.v1_config("global_batch_size") == 4
    assert type(context.v1_config("seed")) is int and context.v1_config("seed") == 3
    layer = sok.DistributedEmbedding("sum", 10, 4, 1, 2)
    assert layer(tf.SparseTensor([[0, 0]], tf.constant([5], tf.int64), [4, 2])).shape == (4, 1, 4)
    for bad in (dict(global_batch_size=np.bool_(True)), dict(global_batch_size=np.float64(4)),
                dict(global_batch_size=4, seed=np.float32(1))):
        with pytest.raises(ValueError, match="global_batch_size|seed"):
            sok.Init(**bad)


@pytest.mark.skipif(not tf.executing_eagerly(), reason="eager layers (TF2)")
@pytest.mark.parametrize("use_hashtable", [False, True], ids=["static", "hashtable"])
def test_init_seed_gives_the_same_layers_again_eagerly(use_hashtable):
    """Eagerly, sok.Init(seed=7) then a layer, twice in one process, gives the
    same rows both times (each layer's seed is numbered from sok.Init, as
    in a new graph); a second layer after the same Init has rows of its own."""
    if not use_hashtable and tf.__version__.startswith("1."):
        pytest.skip("TF 1.x's Keras RandomUniform draws anew from one seed eagerly (its "
                    "kernel for a seed keeps its state), so a static table cannot repeat")
    ids = tf.constant([[[1], [5]], [[5], [9]], [[0], [1]], [[2], [3]]], tf.int64)
    outs = []
    for _ in range(2):
        sok.Init(global_batch_size=4, seed=7)
        outs.append([sok.All2AllDenseEmbedding(16, 3, 2, 1, use_hashtable=use_hashtable)(ids)
                     .numpy().reshape(-1, 3) for _ in range(2)])
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
    assert not np.any(np.all(outs[0][0] == outs[0][1], axis=1))


@pytest.mark.skipif(not tf.executing_eagerly() or tf.__version__.startswith("1."),
                    reason="the .weights.h5 format (TF 2.x Keras; TF 1.x's Keras writes legacy "
                           "HDF5 from layer.weights, where a hashtable layer's table raises "
                           "NoDenseValueError)")
@pytest.mark.parametrize("use_hashtable", [False, True], ids=["static", "hashtable"])
def test_keras_weights_files_hold_a_1x_layers_table(tmp_path, use_hashtable):
    """model.save_weights("*.weights.h5") / load_weights (what ModelCheckpoint
    writes) kept no rows of a 1.x layer under Keras 3: an empty group, and a
    load that restored nothing without a word. The table's keys and rows are
    saved and loaded back, exactly."""
    sok.init(comm_tool="none")
    ids = np.array([[1, 5, 9], [5, 0, 2]], np.int64)

    class Model(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.embed = sok.DistributedEmbedding("sum", 16, 4, slot_num=1, max_nnz=3,
                                                  use_hashtable=use_hashtable)
            self.dense = tf.keras.layers.Dense(1)

        def call(self, x):
            sparse = tf.RaggedTensor.from_tensor(x).to_sparse()
            return self.dense(tf.reshape(self.embed(sparse), [-1, 4]))

    def table_of(model):
        keys, rows = (np.asarray(t) for t in sok.export(model.embed.embedding_variable))
        return keys[np.argsort(keys)], rows[np.argsort(keys)]

    trained, fresh = Model(), Model()
    want = trained(ids).numpy()
    fresh(ids[:1, :1])  # built, its table drawn apart (and holding other keys)
    path = str(tmp_path / "model.weights.h5")
    trained.save_weights(path)
    fresh.load_weights(path)
    for got, saved in zip(table_of(fresh), table_of(trained)):
        np.testing.assert_array_equal(got, saved)
    np.testing.assert_array_equal(fresh(ids).numpy(), want)


def _keras3_model_supports_jit():
    """Keras 3's own test of whether compile(jit_compile="auto") may use XLA
    for a model (None under Keras 2, which never chooses XLA itself)."""
    try:
        from keras.src.trainers.trainer import model_supports_jit
    except ImportError:
        return None
    return model_supports_jit if tf.keras.__name__.startswith("keras") else None


@pytest.mark.skipif(_keras3_model_supports_jit() is None,
                    reason="Keras 3 decides on XLA for Model.fit by its layers")
@pytest.mark.parametrize("use_hashtable", [False, True])
def test_keras_does_not_compile_a_model_with_a_1x_layer_with_xla(use_hashtable):
    """On a GPU, Keras 3 compiles Model.fit's step with XLA unless a layer
    says it cannot; sok's ops have no XLA kernels, so fit of a model with a
    1.x layer failed on a GPU ("Detected unsupported operations when trying
    to compile graph ... on XLA_GPU_JIT"). Keras' own decision, asked here,
    is the one fit makes (on a CPU it never chooses XLA)."""
    sok.init(comm_tool="none")
    layer = sok.DistributedEmbedding("sum", 16, 4, slot_num=1, max_nnz=3,
                                     use_hashtable=use_hashtable)
    inputs = tf.keras.Input(shape=(3,))
    plain = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(inputs))
    assert _keras3_model_supports_jit()(plain)  # a model of XLA-able layers

    class Model(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.embed = layer
            self.dense = tf.keras.layers.Dense(1)

        def call(self, sparse):
            return self.dense(tf.reshape(self.embed(sparse), [-1, 4]))

    assert not _keras3_model_supports_jit()(Model())


@pytest.mark.skipif(not tf.executing_eagerly(), reason="Keras Model.fit (TF2)")
@pytest.mark.parametrize("use_hashtable", [False, True])
def test_a_1x_layer_in_a_functional_model_trains_as_keras_embedding_does(use_hashtable):
    """A functional model (keras.Input) holding All2AllDenseEmbedding, its
    table trained by fit inside sok.OptimizerScope, ends as the same model
    on Keras' Embedding. Under Keras 3 the layer failed on the input's
    shape, a tuple there ("'tuple' object has no attribute 'rank'")."""
    sok.init(comm_tool="none")
    rng = np.random.RandomState(1)
    x = rng.randint(0, 16, (12, 1, 3)).astype(np.int64)
    y = rng.normal(size=(12, 1)).astype(np.float32)
    start = tf.keras.initializers.Constant(0.1)

    def functional(embed):
        ids = tf.keras.Input(shape=(1, 3), dtype="int64")
        rows = tf.keras.layers.Reshape((12,))(embed(ids))
        out = tf.keras.layers.Dense(1, use_bias=False,
                                    kernel_initializer=tf.keras.initializers.Constant(0.5))(rows)
        model = tf.keras.Model(ids, out)
        model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
        return model

    layer = sok.All2AllDenseEmbedding(16, 4, slot_num=1, nnz_per_slot=3,
                                      use_hashtable=use_hashtable, embedding_initializer=start)
    plain = tf.keras.layers.Embedding(16, 4, embeddings_initializer=start)
    models = [functional(layer), functional(plain)]
    with sok.OptimizerScope([layer.embedding_variable]):
        models[0].fit(x, y, batch_size=6, epochs=2, shuffle=False, verbose=0)
    models[1].fit(x, y, batch_size=6, epochs=2, shuffle=False, verbose=0)
    table = plain.embeddings.numpy()
    if use_hashtable:
        keys, rows = [t.numpy() for t in sok.export(layer.embedding_variable)]
        np.testing.assert_allclose(rows, table[keys], rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_allclose(layer.embedding_variable.numpy(), table, rtol=1e-5,
                                   atol=1e-6)
    np.testing.assert_allclose(models[0].layers[-1].kernel.numpy(),
                               models[1].layers[-1].kernel.numpy(), rtol=1e-5, atol=1e-6)
    assert not np.allclose(table, 0.1)


@pytest.mark.skipif(not tf.executing_eagerly(), reason="Keras Model.fit (TF2)")
@pytest.mark.parametrize("use_hashtable", [False, True])
@pytest.mark.parametrize("steps_per_execution", [1, 2])
def test_a_1x_layer_trains_in_keras_fit_as_a_plain_table_does(use_hashtable, steps_per_execution):
    """Model.fit of a model holding a 1.x layer, its table trained inside
    sok.OptimizerScope: the table and the dense kernel end as those of the
    same model on a plain tf.Variable with tf.nn.embedding_lookup_sparse.
    Keras 3 reads every weight's regularizer at each step (Layer.losses): fit
    failed with "'DistributedVariable' object has no attribute 'regularizer'"
    before any step. With steps_per_execution=2 Keras runs two steps in
    one tf.function loop, each step's tape and update inside the loop's
    body (where a dynamic table gets its gradient)."""
    sok.init(comm_tool="none")
    rng = np.random.RandomState(0)
    x = rng.randint(0, 16, (12, 3)).astype(np.int64)
    y = rng.normal(size=(12, 1)).astype(np.float32)
    start = tf.keras.initializers.Constant(0.1)

    class Model(tf.keras.Model):
        def __init__(self, embed):
            super().__init__()
            self.embed = embed
            self.dense = tf.keras.layers.Dense(1, use_bias=False,
                                               kernel_initializer=tf.keras.initializers.Constant(0.5))

        def call(self, ids):
            sparse = tf.RaggedTensor.from_tensor(tf.cast(ids, tf.int64)).to_sparse()
            return self.dense(tf.reshape(self.embed(sparse), [-1, 4]))

    class PlainEmbedding(tf.keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.table = self.add_weight(name="table", shape=(16, 4), initializer=start)

        def call(self, sparse):
            return tf.nn.embedding_lookup_sparse(tf.convert_to_tensor(self.table), sparse, None,
                                                 combiner="sum")

    layer = sok.DistributedEmbedding("sum", 16, 4, slot_num=1, max_nnz=3,
                                     use_hashtable=use_hashtable, embedding_initializer=start)
    plain = PlainEmbedding()
    models = [Model(layer), Model(plain)]
    # The reference turns XLA off itself: Keras 3 compiles fit's step with it
    # on a GPU, and its RaggedTensorToSparse has no XLA kernel. The sok
    # model must not need that (its layer says supports_jit = False).
    no_xla = {"jit_compile": False} if "jit_compile" in inspect.signature(
        tf.keras.Model.compile).parameters else {}
    for model, options in zip(models, ({}, no_xla)):
        model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse",
                      steps_per_execution=steps_per_execution, **options)
        model(x[:2])
    with sok.OptimizerScope([layer.embedding_variable]):
        models[0].fit(x, y, batch_size=6, epochs=2, shuffle=False, verbose=0)
    models[1].fit(x, y, batch_size=6, epochs=2, shuffle=False, verbose=0)
    got = sok.export(layer.embedding_variable) if use_hashtable else None
    if use_hashtable:
        keys, rows = [t.numpy() for t in got]
        want = plain.table.numpy()[keys]
        np.testing.assert_allclose(rows, want, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_allclose(layer.embedding_variable.numpy(), plain.table.numpy(),
                                   rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(models[0].dense.kernel.numpy(), models[1].dense.kernel.numpy(),
                               rtol=1e-5, atol=1e-6)
    assert not np.allclose(plain.table.numpy(), 0.1)
