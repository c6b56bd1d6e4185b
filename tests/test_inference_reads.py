"""Keras inference (model.predict, model.evaluate, fit's validation pass:
a model's predict_step and test_step) reads dynamic tables without changing them: keys
the table holds give their rows, the others the default row (zeros, or an
admission filter's filter_default), and nothing is inserted, evicted or
counted. A read for training inserted the keys it had not seen, so
predict or evaluate on ids training never saw evicted a bounded table's
trained rows, admitted keys early and moved keys up an LRU / LFU order,
without an error; a keras.layers.Embedding model is left as it was.

Each table is compared with its own export before the inference (keys,
rows, last-use times and use counts), and predictions with the model's
dense layer applied by numpy to the rows the table holds (zeros where it
holds none)."""

import numpy as np
import pytest
import tensorflow as tf

import sok_graph as sok

pytestmark = pytest.mark.skipif(tf.__version__.startswith("1."),
                                reason="Keras' fit / predict / evaluate of TF 2.x")


def _keras():
    from sok_graph.compat.keras import KERAS_MAJOR_VERSION

    if KERAS_MAJOR_VERSION >= 3:
        import keras

        return keras
    return tf.keras


BOUNDED = dict(var_type="hybrid", init_capacity=16, max_capacity=16, evict_strategy="lru")


def _model(with_training_arg, **table):
    keras = _keras()

    class Model(keras.Model):
        def __init__(self):
            super().__init__()
            self.table = sok.DynamicVariable(dimension=4, initializer="uniform", name="t",
                                             **table)
            self.dense = keras.layers.Dense(1)

        def lookup(self, ids):
            return sok.lookup_sparse(self.table, tf.RaggedTensor.from_tensor(ids),
                                     combiners="sum")

    if with_training_arg:
        class WithTraining(Model):
            def call(self, ids, training=None):
                return self.dense(self.lookup(ids))

        return WithTraining()

    class WithoutTraining(Model):  # Keras 3's predict and evaluate pass no training then
        def call(self, ids):
            return self.dense(self.lookup(ids))

    return WithoutTraining()


def _state(table):
    """{key: (row, last-use time, use count)} of everything the table holds."""
    keys, rows, meta = table.read_all()
    return {k: (tuple(r), t, f) for k, r, t, f in zip(
        keys.numpy().tolist(), rows.numpy().tolist(), meta["timestamps"].numpy().tolist(),
        meta["frequencies"].numpy().tolist())}


def _data(seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 10, (32, 1)).astype(np.int64)
    labels = rng.normal(size=(32, 1)).astype(np.float32)
    return ids, labels


def _trained(model, ids, labels, **fit):
    model.compile(optimizer=_keras().optimizers.Adagrad(0.3), loss="mse")
    with sok.OptimizerScope([model.table]):
        history = model.fit(ids, labels, batch_size=8, epochs=3, verbose=0, **fit)
    return history


def _expected(model, ids):
    """The model's outputs by numpy: the summed rows the table holds (zeros
    for keys it does not hold) through the dense layer."""
    held = {k: np.array(r) for k, (r, _, _) in _state(model.table).items()}
    rows = np.stack([sum((held.get(k, np.zeros(4)) for k in sample), np.zeros(4))
                     for sample in ids.tolist()])
    kernel, bias = (w.numpy() for w in model.dense.weights)
    return rows @ kernel + bias


@pytest.mark.parametrize("with_training_arg", [True, False], ids=["training_arg", "no_arg"])
def test_predict_and_evaluate_change_no_table(with_training_arg):
    """A bounded table of 16 rows trained on keys 0-9, then predict and
    evaluate of 16 ids it never saw: every trained row stays (all ten were
    evicted), and so do their last-use times and use counts; the unseen ids
    read zeros."""
    sok.init(comm_tool="none")
    model = _model(with_training_arg, **BOUNDED)
    ids, labels = _data()
    _trained(model, ids, labels)
    before = _state(model.table)
    assert sorted(before) == sorted(set(ids.ravel().tolist()))
    want = model.predict(ids, verbose=0)
    unseen = (1000 + np.arange(16)).reshape(16, 1).astype(np.int64)
    got_unseen = model.predict(unseen, verbose=0)
    model.evaluate(unseen, np.zeros((16, 1), np.float32), verbose=0)
    assert _state(model.table) == before
    np.testing.assert_allclose(got_unseen, _expected(model, unseen), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(model.predict(ids, verbose=0), want, rtol=0, atol=0)
    np.testing.assert_allclose(want, _expected(model, ids), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("with_training_arg", [True, False], ids=["training_arg", "no_arg"])
def test_validation_data_does_not_change_what_fit_trains(with_training_arg):
    """fit with validation_data of ids the bounded table has not seen (and,
    with min_count, ids it is still counting) trains the same rows and
    dense weights as fit without it: the validation pass evicted trained
    rows, and counted keys into the table early."""
    ids, labels = _data()
    val_ids = np.concatenate([(100 + np.arange(16)), np.arange(16) % 10]).reshape(32, 1)
    val = (val_ids.astype(np.int64), np.zeros((32, 1), np.float32))
    results = []
    for table in (BOUNDED, dict(min_count=3)):
        for fit in ({}, {"validation_data": val}):
            sok.init(comm_tool="none")
            _keras().utils.set_random_seed(7)
            model = _model(with_training_arg, **table)
            _trained(model, ids, labels, **fit)
            rows = {k: r for k, (r, _, _) in _state(model.table).items()}
            results.append((rows, [w.numpy() for w in model.dense.weights]))
        (rows_plain, dense_plain), (rows_val, dense_val) = results[-2:]
        assert rows_val == rows_plain
        for a, b in zip(dense_val, dense_plain):
            np.testing.assert_array_equal(a, b)


def test_predict_with_an_admission_filter_counts_nothing_and_repeats():
    """min_count=2: predict of the same ids twice gave other outputs (the
    first read counted the keys, the second admitted them with random
    rows). Both reads give the filter's default row; nothing is counted, and
    an incremental dump after predict and evaluate alone is empty."""
    sok.init(comm_tool="none")
    model = _model(False, min_count=2, filter_default=0.25)
    ids, labels = _data()
    _trained(model, ids, labels)
    before, counts = _state(model.table), [x.numpy().tolist() for x in
                                             model.table.admission.export()]
    import time

    since = time.time() * 1e6
    unseen = (500 + np.arange(8)).reshape(8, 1).astype(np.int64)
    first, second = (model.predict(unseen, verbose=0) for _ in range(2))
    model.evaluate(unseen, np.zeros((8, 1), np.float32), verbose=0)
    np.testing.assert_array_equal(first, second)
    kernel, bias = (w.numpy() for w in model.dense.weights)
    np.testing.assert_allclose(first, np.full((8, 4), 0.25) @ kernel + bias, rtol=1e-6)
    assert _state(model.table) == before
    assert [x.numpy().tolist() for x in model.table.admission.export()] == counts
    keys, _ = sok.incremental_model_dump([model.table], since)
    assert keys[0].tolist() == []


def test_reads_for_training_still_insert():
    """What training reads do is unchanged: model(x) under a GradientTape
    (no training value, a custom loop), model(x, training=True), and a
    sparse_read outside any Keras call insert the keys they read."""
    sok.init(comm_tool="none")
    model = _model(True)
    with tf.GradientTape():
        model(np.array([[1], [2]], np.int64))
    model(np.array([[3]], np.int64), training=True)
    model.table.sparse_read(tf.constant([4], tf.int64))
    assert sorted(_state(model.table)) == [1, 2, 3, 4]


def test_reads_after_a_sub_layer_called_with_training_false_still_train():
    """Keras 3 leaves a sub-layer's training=False (a frozen BatchNorm, a
    Dropout's own default) in its shared call context for the layers after
    it, and fine-tuning calls model(x, training=False) under a tape: reads
    there are for training, and fit trains the table as before."""
    keras = _keras()

    class Model(keras.Model):
        def __init__(self):
            super().__init__()
            self.table = sok.DynamicVariable(dimension=4, initializer="uniform", name="t")
            self.drop = keras.layers.Dropout(0.0)
            self.dense = keras.layers.Dense(1)

        def call(self, ids, training=None):
            gate = self.drop(tf.ones([1, 1]), training=False)
            rows = sok.lookup_sparse(self.table, tf.RaggedTensor.from_tensor(ids),
                                     combiners="sum")
            return self.dense(rows * gate)

    sok.init(comm_tool="none")
    model = Model()
    ids, labels = _data()
    _trained(model, ids, labels)
    assert sorted(_state(model.table)) == sorted(set(ids.ravel().tolist()))
    with tf.GradientTape() as tape:
        out = model(np.array([[50]], np.int64), training=False)
    assert tape.gradient(out, model.table) is not None
    assert 50 in _state(model.table)


@pytest.mark.parametrize("layer", ["All2AllDenseEmbedding", "DistributedEmbedding"])
def test_a_1x_hashtable_layer_in_predict_reads_for_inference(layer):
    """A SOK 1.x hashtable layer inside a model's predict inserts nothing
    (Keras 3 hands the layer its default training=True there); called for
    training it inserts as before."""
    keras = _keras()
    sok.Init(global_batch_size=2)
    if layer == "All2AllDenseEmbedding":
        emb = sok.All2AllDenseEmbedding(16, 2, 1, 1, use_hashtable=True)
        shape = (1, 1)
    else:
        emb = sok.DistributedEmbedding("sum", 16, 2, 1, 1, use_hashtable=True)
        shape = None

    class Model(keras.Model):
        def __init__(self):
            super().__init__()
            self.emb = emb

        def call(self, ids):
            if shape is None:
                return self.emb(tf.RaggedTensor.from_tensor(ids))
            return self.emb(tf.reshape(ids, [-1, 1, 1]))

    model = Model()
    inputs = np.array([[5], [6]], np.int64)
    out = model.predict(inputs, verbose=0)
    np.testing.assert_array_equal(np.asarray(out), np.zeros(np.shape(out), np.float32))
    assert emb.embedding_variable.export()[0].numpy().tolist() == []
    model(inputs)
    assert sorted(emb.embedding_variable.export()[0].numpy().tolist()) == [5, 6]
