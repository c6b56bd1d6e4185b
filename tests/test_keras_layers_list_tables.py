"""sok tables a Keras layer or model holds as attributes are among its
weights, as Keras 2 lists the tf.Variables a layer holds: `fit` trains
them and SOK's `filter_variables(model.trainable_variables)` finds them.
Keras 3 lists only its own variable class, and on TF 2.16+ both trained
the dense layers alone, without an error. References: the same model with
its rows in a Keras weight read by tf.nn.embedding_lookup_sparse, and the
tables the test made."""

import numpy as np
import pytest
import tensorflow as tf

import sok_graph as sok
from sok_graph.compat import keras as keras_compat

pytestmark = pytest.mark.skipif(not tf.executing_eagerly(), reason="Keras Model.fit (TF2)")

ROWS, DIM = 12, 3
START = np.linspace(-0.5, 0.5, ROWS * DIM, dtype=np.float32).reshape(ROWS, DIM)
KERNEL = np.linspace(0.2, 1.4, 2 * DIM, dtype=np.float32).reshape(2 * DIM, 1)


def _batches():
    rng = np.random.RandomState(3)
    ids = rng.randint(0, ROWS, (16, 3)).astype(np.int64)
    labels = rng.normal(size=(16, 1)).astype(np.float32)
    return ids, labels


def _sparse(ids):
    return tf.RaggedTensor.from_tensor(tf.cast(ids, tf.int64)).to_sparse()


def _dense_layer():
    return tf.keras.layers.Dense(1, use_bias=False,
                                 kernel_initializer=tf.keras.initializers.Constant(KERNEL))


class SokModel(tf.keras.Model):
    """Two features, one static table and one dynamic table, held the ways
    a model holds them: an attribute and a list."""

    def __init__(self):
        super().__init__()
        self.table = sok.Variable(START)
        self.hashed = [sok.DynamicVariable(dimension=DIM, initializer="zeros")]
        self.dense = _dense_layer()

    def call(self, ids):
        first, second = sok.lookup_sparse([self.table, self.hashed[0]],
                                          [_sparse(ids[:, :2]), _sparse(ids[:, 2:])],
                                          combiners=["sum", "sum"])
        return self.dense(tf.concat([first, second], 1))


class PlainModel(tf.keras.Model):
    """The same model on Keras weights (the dynamic table's keys are rows
    0..ROWS-1 of a zero weight)."""

    def __init__(self):
        super().__init__()
        self.table = self.add_weight(name="table", shape=(ROWS, DIM),
                                     initializer=tf.keras.initializers.Constant(START))
        self.hashed = self.add_weight(name="hashed", shape=(ROWS, DIM), initializer="zeros")
        self.dense = _dense_layer()

    def call(self, ids):
        first = tf.nn.embedding_lookup_sparse(tf.convert_to_tensor(self.table),
                                              _sparse(ids[:, :2]), None, combiner="sum")
        second = tf.nn.embedding_lookup_sparse(tf.convert_to_tensor(self.hashed),
                                               _sparse(ids[:, 2:]), None, combiner="sum")
        return self.dense(tf.concat([first, second], 1))


def _fit(model, epochs=2):
    ids, labels = _batches()
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse", jit_compile=False)
    model.fit(ids, labels, batch_size=4, epochs=epochs, shuffle=False, verbose=0)


def _hashed_rows(model):
    keys, rows = [t.numpy() for t in sok.export(model.hashed[0])]
    full = np.zeros((ROWS, DIM), np.float32)
    full[keys] = rows
    return full


@pytest.mark.skipif(keras_compat.KERAS_MAJOR_VERSION < 3,
                    reason="Keras 2's optimizer on a dynamic table: see test_optimizer.py")
def test_fit_trains_the_tables_a_model_holds_as_attributes():
    sok.init(comm_tool="none")
    got, want = SokModel(), PlainModel()
    _fit(got)
    _fit(want)
    np.testing.assert_allclose(got.table.numpy(), want.table.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_hashed_rows(got), want.hashed.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.dense.kernel.numpy(), want.dense.kernel.numpy(),
                               rtol=1e-5, atol=1e-6)
    assert not np.allclose(got.table.numpy(), START)  # it trained


def test_the_tables_are_among_the_models_trainable_variables():
    """SOK's own loop splits model.trainable_variables into tables and the
    rest: on Keras 3 it found no table, and the loop trained none."""
    sok.init(comm_tool="none")
    model = SokModel()
    model(_batches()[0][:2])
    tables, others = sok.filter_variables(model.trainable_variables)
    assert sorted(id(t) for t in tables) == sorted([id(model.table), id(model.hashed[0])])
    assert [id(v) for v in others] == [id(model.dense.kernel)]
    assert {id(v) for v in model.weights} == {id(model.table), id(model.hashed[0]),
                                               id(model.dense.kernel)}
    model.trainable = False
    assert model.trainable_variables == []
    assert {id(v) for v in model.non_trainable_weights} == {id(v) for v in model.weights}


@pytest.mark.parametrize("split", ["split_embedding_variable_from_others", "filter_variables"])
def test_sok_s_loop_over_model_trainable_variables_steps_each_table_once(split):
    """SOK's training step: the tables split from model.trainable_variables
    go to a sok optimizer, the rest to a Keras one. Keras 3 listed no table
    (none trained); TF 1.15's Keras lists a table held in a list twice, and
    the table took the step twice."""
    sok.init(comm_tool="none")
    got, want = SokModel(), PlainModel()
    ids, labels = _batches()
    sok_opt = sok.OptimizerWrapper(tf.keras.optimizers.SGD(0.1))
    dense_opt, plain_opt = tf.keras.optimizers.SGD(0.1), tf.keras.optimizers.SGD(0.1)
    for start in (0, 4):
        batch, target = ids[start:start + 4], labels[start:start + 4]
        with tf.GradientTape(persistent=True) as tape:
            got_loss = tf.reduce_mean(tf.square(got(batch) - target))
            want_loss = tf.reduce_mean(tf.square(want(batch) - target))
        tables, others = getattr(sok, split)(got.trainable_variables)
        assert len(tables) == 2
        sok_opt.apply_gradients(zip(tape.gradient(got_loss, list(tables)), tables))
        dense_opt.apply_gradients(zip(tape.gradient(got_loss, list(others)), others))
        plain = want.trainable_variables
        plain_opt.apply_gradients(zip(tape.gradient(want_loss, plain), plain))
    np.testing.assert_allclose(got.table.numpy(), want.table.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_hashed_rows(got), want.hashed.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.dense.kernel.numpy(), want.dense.kernel.numpy(),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(keras_compat.KERAS_MAJOR_VERSION < 3, reason="Keras 3's layer tracking")
def test_a_table_made_after_the_layer_is_built_is_refused_as_a_keras_variable_is():
    """Keras 3 refuses state added to a built layer (fit would not know
    it); a table gets Keras' own words, as a Keras variable does."""
    sok.init(comm_tool="none")

    class Late(tf.keras.layers.Layer):
        def call(self, ids):
            return tf.cast(ids, tf.float32)

    late = Late()
    late(tf.constant([[1]]))
    with pytest.raises(ValueError, match="already built"):
        late.table = sok.Variable(START)


@pytest.mark.skipif(keras_compat.KERAS_MAJOR_VERSION < 3, reason="Keras 3's summary")
def test_the_summary_counts_a_dynamic_tables_rows_as_unknown():
    """Keras 3's summary multiplied the shape (None, dimension) of a dynamic
    table, a 1.x hashtable layer's included: a TypeError. It counts the
    weights of known shape, as Keras 2 counts an unknown dimension as 0."""
    sok.init(comm_tool="none")
    model = SokModel()
    model(_batches()[0][:2])
    lines = []
    model.summary(print_fn=lambda line, **kwargs: lines.append(line))
    text = "\n".join(lines)
    assert f"Trainable params: {ROWS * DIM + 2 * DIM:,}" in text, text
    assert model.count_params() == ROWS * DIM + 2 * DIM

    class Holder(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.embed = sok.DistributedEmbedding("sum", 16, DIM, slot_num=1, max_nnz=3,
                                                  use_hashtable=True)
            self.dense = tf.keras.layers.Dense(1)

        def call(self, ids):
            return self.dense(tf.reshape(self.embed(_sparse(ids)), [-1, DIM]))

    holder = Holder()
    holder(np.array([[1, 2, 3]], np.int64))
    lines.clear()
    holder.summary(print_fn=lambda line, **kwargs: lines.append(line))
    assert f"Trainable params: {DIM + 1}" in "\n".join(lines), lines


@pytest.mark.skipif(keras_compat.KERAS_MAJOR_VERSION < 3,
                    reason="Keras 3 decides on XLA for Model.fit by its layers")
def test_a_layer_holding_a_table_is_not_compiled_with_xla():
    """compile()'s default jit_compile="auto" compiles fit's step with XLA
    on a GPU unless a layer says it cannot; sok's ops have no XLA kernels
    ("Detected unsupported operations ... XLA_GPU_JIT")."""
    from keras.src.trainers.trainer import model_supports_jit

    sok.init(comm_tool="none")
    plain = PlainModel()
    plain(_batches()[0][:2])
    assert model_supports_jit(plain)
    model = SokModel()
    model(_batches()[0][:2])
    assert not model_supports_jit(model)
