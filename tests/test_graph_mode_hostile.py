"""TF1-style graph mode (tf.compat.v1.Session) as its users write it, with
the patterns that broke: each test compares sok tables with a plain
tf.Variable looked up with tf.nn.embedding_lookup_sparse and trained by the
same tf.compat.v1.train optimizer (TensorFlow's sparse kernels touch only
the batch's rows, as sok's updates do)."""

import numpy as np
import pytest
import tensorflow as tf

import sok_graph as sok

VOCAB, DIM = 8, 2
W0 = np.random.default_rng(0).normal(size=(VOCAB, DIM)).astype(np.float32)
BATCHES = [np.random.default_rng(1 + i).integers(0, 6, size=(3, 2)) for i in range(4)]
PROBE = np.array([[0, 1], [2, 3], [4, 5]], np.int64)

OPTIMIZERS = {
    "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
    "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.05, 0.9),
    "ftrl": lambda: tf.compat.v1.train.FtrlOptimizer(0.1, l2_regularization_strength=0.01),
    "rmsprop": lambda: tf.compat.v1.train.RMSPropOptimizer(0.05, momentum=0.3),
}


def _ids_to_sparse(ids):
    """A SparseTensor of a dense [batch, n] id tensor, every entry kept."""
    sp = tf.sparse.from_dense(ids + 1)
    return tf.SparseTensor(sp.indices, sp.values - 1, sp.dense_shape)


def _table_lookup(kind):
    """(ids placeholder, table, summed embeddings) for a plain table
    ("plain", tf.nn.embedding_lookup_sparse), a sok.Variable ("static") or a
    DynamicVariable ("dynamic"; _fill_dynamic gives it W0's rows)."""
    ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
    sp = _ids_to_sparse(ids)
    if kind == "plain":
        table = tf.compat.v1.get_variable("table", initializer=W0, use_resource=True)
        return ids, table, tf.nn.embedding_lookup_sparse(table, sp, None, combiner="sum")
    if kind == "static":
        table = sok.Variable(W0, name="table")
    else:
        table = sok.DynamicVariable(dimension=DIM, initializer="zeros", name="table")
    return ids, table, sok.lookup_sparse(table, sp, combiners="sum")


def _model(kind, make_optimizer):
    """ids placeholder, the table, a dense weight, the lookup, loss, the
    optimizer and its train op, for a plain table ("plain"), a sok.Variable
    ("static") or a DynamicVariable ("dynamic"; its rows start as W0's)."""
    ids, table, emb = _table_lookup(kind)
    dense = tf.compat.v1.get_variable("dense", initializer=np.full((DIM, 1), 0.5, np.float32),
                                      use_resource=True)
    loss = tf.reduce_sum(tf.square(tf.matmul(emb, dense) - 3.0))
    opt = make_optimizer()
    if kind == "plain":
        train = opt.minimize(loss)
    else:
        with sok.OptimizerScope([table]):
            train = opt.minimize(loss)
    return ids, table, dense, emb, loss, opt, train


def _fill_dynamic(sess, kind, table):
    if kind == "dynamic":
        sess.run(sok.assign(table, tf.range(VOCAB, dtype=tf.int64), W0))


@pytest.mark.parametrize("kind", ["static", "dynamic"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_an_optimizer_initialized_from_its_variables_trains_sok_tables(kind, name):
    """tf.compat.v1.variables_initializer(opt.variables()) after the model's
    own variables were initialized (or restored): the slots the optimizer
    keeps for sok tables inside sok.OptimizerScope, and its step, were not
    among opt.variables(), and the first step failed with "Attempting to use
    uninitialized value table/accumulator"."""
    results = {}
    for k in ("plain", kind):
        with tf.Graph().as_default():
            ids, table, dense, emb, loss, opt, train = _model(k, OPTIMIZERS[name])
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.variables_initializer([table, dense]))
                sess.run(tf.compat.v1.variables_initializer(opt.variables()))
                assert not sess.run(tf.compat.v1.report_uninitialized_variables()).size
                _fill_dynamic(sess, k, table)
                losses = [sess.run([loss, train], {ids: b})[0] for b in BATCHES]
                results[k] = losses, sess.run(emb, {ids: PROBE}), sess.run(dense)
    for got, want in zip(results[kind], results["plain"]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_an_optimizer_reinitialized_after_a_model_restore_starts_its_slots_again(tmp_path):
    """Fine-tuning as TF1 scripts do it: restore only the model's variables
    with a Saver, then start the optimizer afresh with
    variables_initializer(opt.variables()); sok tables go on as a plain
    table does (their accumulators start again from the initial value)."""
    results = {}
    for k in ("plain", "static", "dynamic"):
        with tf.Graph().as_default():
            ids, table, dense, emb, loss, opt, train = _model(k, OPTIMIZERS["adagrad"])
            saver = tf.compat.v1.train.Saver([table, dense])
            path = str(tmp_path / k / "model")
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                _fill_dynamic(sess, k, table)
                for b in BATCHES[:2]:
                    sess.run(train, {ids: b})
                saver.save(sess, path)
            with tf.compat.v1.Session() as sess:
                saver.restore(sess, path)
                sess.run(tf.compat.v1.variables_initializer(opt.variables()))
                losses = [sess.run([loss, train], {ids: b})[0] for b in BATCHES[2:]]
                results[k] = losses, sess.run(emb, {ids: PROBE})
    for k in ("static", "dynamic"):
        for got, want in zip(results[k], results["plain"]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_an_optimizers_variables_list_only_the_default_graphs_sok_slots():
    """One tf.compat.v1 optimizer object used in two graphs: variables()
    in each lists that graph's slots only, as TensorFlow's own does."""
    opt = tf.compat.v1.train.AdagradOptimizer(0.1)
    names = []
    for _ in range(2):
        with tf.Graph().as_default() as graph:
            ids, table, dense, emb, loss, _, train = _model("static", lambda: opt)
            assert all(v.graph is graph for v in opt.variables())
            names.append(sorted(v.name for v in opt.variables()))
    assert names[0] == names[1]
    assert "table/accumulator:0" in names[0] and "dense/Adagrad:0" in names[0]


@pytest.mark.parametrize("name", ["adagrad", "adam"])
def test_one_optimizer_object_builds_a_second_graph(name):
    """One optimizer object, two graphs built one after the other in the
    process (a model rebuilt, as a tf.compat.v1.train optimizer allows):
    building the second one's sok update failed with "... must be from the
    same graph as Tensor("AssignAdd_1:0" ...)" (the step counter of the
    first graph). Each graph trains as a plain table with its own optimizer
    object does. "adam": sok.optimizers.Adam, which updates as TensorFlow's
    own Adam."""
    if name == "adagrad":
        shared = {k: tf.compat.v1.train.AdagradOptimizer(0.1) for k in ("plain", "sok")}
    else:
        shared = {"plain": tf.compat.v1.train.AdamOptimizer(0.05, epsilon=1e-7),
                  "sok": sok.optimizers.Adam(0.05, epsilon=1e-7)}
    results = {}
    for k in ("plain", "static", "dynamic"):
        opt = shared["plain" if k == "plain" else "sok"]
        for run in range(2):
            with tf.Graph().as_default():
                ids, table, emb = _table_lookup(k)
                loss = tf.reduce_sum(tf.square(emb - 3.0))
                grads = tf.gradients(loss, [table])
                with sok.OptimizerScope([table]) if k != "plain" and name == "adagrad" \
                        else _nothing():
                    train = opt.apply_gradients(zip(grads, [table]))
                with tf.compat.v1.Session() as sess:
                    sess.run(tf.compat.v1.global_variables_initializer())
                    _fill_dynamic(sess, k, table)
                    losses = [sess.run([loss, train], {ids: b})[0] for b in BATCHES]
                    results[k, run] = losses, sess.run(emb, {ids: PROBE})
    for k in ("static", "dynamic"):
        for run in range(2):
            for got, want in zip(results[k, run], results["plain", run]):
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
