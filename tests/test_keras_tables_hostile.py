"""A Keras user's ways with a model holding sok tables (Keras 3 lists them
among its layers' weights: compat/keras.py's
list_tables_among_keras3_layer_weights). Each test compares with an
independent reference: the same model on plain Keras weights read by
tf.nn.embedding_lookup_sparse (a dynamic table's keys are rows
0..ROWS-1 of a zero weight), or the same fit left uninterrupted."""

import numpy as np
import pytest
import tensorflow as tf

import sok_graph as sok
from sok_graph.compat import keras as keras_compat

pytestmark = pytest.mark.skipif(not tf.executing_eagerly(), reason="Keras Model.fit (TF2)")

KERAS3 = keras_compat.KERAS_MAJOR_VERSION >= 3
ROWS, DIM = 12, 3
START = np.linspace(-0.5, 0.5, ROWS * DIM, dtype=np.float32).reshape(ROWS, DIM)
KERNEL = np.linspace(0.2, 1.4, 2 * DIM, dtype=np.float32).reshape(2 * DIM, 1)


def _data():
    rng = np.random.RandomState(3)
    ids = rng.randint(0, ROWS, (16, 3)).astype(np.int64)
    labels = rng.normal(size=(16, 1)).astype(np.float32)
    return ids, labels


def _sparse(ids):
    return tf.RaggedTensor.from_tensor(tf.cast(ids, tf.int64)).to_sparse()


def _dense():
    return tf.keras.layers.Dense(1, use_bias=False,
                                 kernel_initializer=tf.keras.initializers.Constant(KERNEL))


class SokEmbedding(tf.keras.layers.Layer):
    """Two features: a static table (an attribute) and a second table,
    static or dynamic, in a dict."""

    def __init__(self, dynamic=True, **kwargs):
        super().__init__(**kwargs)
        self.hashed = dynamic
        self.table = sok.Variable(START, name="static_rows")
        second = (sok.DynamicVariable(dimension=DIM, initializer="zeros", name="hashed_rows")
                  if dynamic else sok.Variable(np.zeros((ROWS, DIM), np.float32),
                                               name="zero_rows"))
        self.tables = {"second": second}

    def call(self, ids):
        first, second = sok.lookup_sparse([self.table, self.tables["second"]],
                                          [_sparse(ids[:, :2]), _sparse(ids[:, 2:])],
                                          combiners=["sum", "sum"])
        return tf.concat([first, second], 1)

    def get_config(self):
        return dict(super().get_config(), dynamic=self.hashed)


class PlainEmbedding(tf.keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.table = self.add_weight(name="table", shape=(ROWS, DIM),
                                     initializer=tf.keras.initializers.Constant(START))
        self.second = self.add_weight(name="second", shape=(ROWS, DIM), initializer="zeros")

    def call(self, ids):
        first = tf.nn.embedding_lookup_sparse(tf.convert_to_tensor(self.table),
                                              _sparse(ids[:, :2]), None, combiner="sum")
        second = tf.nn.embedding_lookup_sparse(tf.convert_to_tensor(self.second),
                                               _sparse(ids[:, 2:]), None, combiner="sum")
        return tf.concat([first, second], 1)


class Model(tf.keras.Model):
    def __init__(self, embedding):
        super().__init__()
        self.emb = embedding
        self.dense = _dense()

    def call(self, ids):
        return self.dense(self.emb(ids))


def _second_rows(layer):
    table = layer.tables["second"]
    if not layer.hashed:
        return table.numpy()
    keys, rows = (t.numpy() for t in sok.export(table))
    full = np.zeros((ROWS, DIM), np.float32)
    full[keys] = rows
    return full


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_frozen_sub_layer_s_tables_stay_as_they_are_in_fit():
    """`model.emb.trainable = False` froze the plain layer's weights (and
    Keras 2's tables), but Keras 3 fit still trained the tables the frozen
    layer held: they were in model.trainable_variables, since a table's
    `trainable` cannot be cleared as a Keras variable's is."""
    sok.init(comm_tool="none")
    ids, labels = _data()
    got, want = Model(SokEmbedding()), Model(PlainEmbedding())
    for model in (got, want):
        model(ids[:2])
        model.emb.trainable = False
        model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse", jit_compile=False)
        model.fit(ids, labels, batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert [id(v) for v in got.trainable_variables] == [id(got.dense.kernel)]
    assert {id(v) for v in got.non_trainable_weights} == {
        id(got.emb.table), id(got.emb.tables["second"])}
    _close(got.emb.table.numpy(), START)
    _close(got.emb.table.numpy(), want.emb.table.numpy())
    _close(_second_rows(got.emb), want.emb.second.numpy())
    _close(got.dense.kernel.numpy(), want.dense.kernel.numpy())
    assert not np.allclose(got.dense.kernel.numpy(), KERNEL)  # the rest trained


def _functional(dynamic):
    import keras

    inputs = keras.Input((3,), dtype="int64")
    return keras.Model(inputs, _dense()(SokEmbedding(dynamic)(inputs)))


def _fit_in_scope(model, epochs, callbacks=()):
    tables = [v for v in model.weights if sok.filter_variables([v])[0]]
    with sok.OptimizerScope(tables):
        model.fit(*_data(), batch_size=4, epochs=epochs, shuffle=False, verbose=0,
                  callbacks=list(callbacks))


@pytest.mark.skipif(keras_compat.keras_saveable_class() is object,
                    reason="Keras 3's .keras files (tables/keras_weights.py)")
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_load_model_of_a_fit_under_optimizer_scope_goes_on_as_the_saved_model(tmp_path,
                                                                              dynamic):
    """load_model compiles the model again and builds its optimizer for
    model.trainable_variables, which now hold the tables: Adam got slots
    for them that the saved optimizer (which OptimizerScope kept off the
    tables) lacks, and Keras skipped the whole optimizer's state (the
    dense layer's moments, the step) with a warning only; a dynamic table
    was a NoDenseValueError inside load_model. Inside sok.OptimizerScope a
    Keras 3 optimizer's build leaves the tables out, as the scope's updates
    do: loaded inside one, the model goes on as the saved one."""
    import keras

    sok.init(comm_tool="none")
    keras.saving.get_custom_objects()["SokEmbedding"] = SokEmbedding
    saved = _functional(dynamic)
    saved.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse", jit_compile=False)
    _fit_in_scope(saved, 1)
    path = str(tmp_path / "model.keras")
    saved.save(path)
    # Loaded as it trains: inside the scope (which keeps the compiled
    # optimizer's build off the tables, as during the fit that saved it).
    with sok.OptimizerScope([]):
        loaded = keras.models.load_model(path)
    _fit_in_scope(saved, 1)
    _fit_in_scope(loaded, 1)
    assert int(loaded.optimizer.iterations) == int(saved.optimizer.iterations) == 8
    ids = _data()[0]
    _close(loaded.predict(ids, verbose=0), saved.predict(ids, verbose=0))


@pytest.mark.skipif(not KERAS3, reason="Keras 2 restores through a tf.train.Checkpoint")
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_backup_and_restore_resumes_a_fit_under_optimizer_scope(tmp_path, dynamic):
    """BackupAndRestore builds the optimizer for model.trainable_variables
    before loading its weights file: with the tables among them Keras
    skipped the optimizer's state (the step went on from 0, the dense
    layer's accumulator afresh) with a warning only, and a dynamic table
    was a NoDenseValueError inside fit. Reference: the same fit left
    uninterrupted (Keras 2 resumes it exactly)."""
    import keras

    class Interrupt(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise RuntimeError("interrupted")

    def model():
        made = Model(SokEmbedding(dynamic))
        made(_data()[0][:2])
        made.compile(optimizer=keras.optimizers.Adagrad(0.1), loss="mse", jit_compile=False)
        return made

    sok.init(comm_tool="none")
    backup = str(tmp_path / "backup")
    whole = model()
    _fit_in_scope(whole, 4)
    with pytest.raises(RuntimeError, match="interrupted"):
        _fit_in_scope(model(), 4, [keras.callbacks.BackupAndRestore(backup), Interrupt()])
    resumed = model()
    _fit_in_scope(resumed, 4, [keras.callbacks.BackupAndRestore(backup)])
    assert int(resumed.optimizer.iterations) == int(whole.optimizer.iterations) == 16
    _close(resumed.emb.table.numpy(), whole.emb.table.numpy())
    _close(_second_rows(resumed.emb), _second_rows(whole.emb))
    _close(resumed.dense.kernel.numpy(), whole.dense.kernel.numpy())


@pytest.mark.skipif(not KERAS3, reason="Keras 2 saves the tf.Variables of an .h5 file itself")
def test_a_legacy_h5_file_of_a_static_table_round_trips_or_is_refused_clearly(tmp_path):
    """model.save("m.h5") (Keras' legacy format, which saves layer.weights
    by position) now meets the tables among the weights: an AttributeError
    "'DistributedVariable' object has no attribute 'path'" from inside
    Keras. Reference: the saved model's own predictions."""
    import keras

    sok.init(comm_tool="none")
    saved = _functional(dynamic=False)
    saved.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=False)
    saved.fit(*_data(), batch_size=4, epochs=1, shuffle=False, verbose=0)
    path = str(tmp_path / "model.h5")
    try:
        saved.save(path)
        fresh = _functional(dynamic=False)
        fresh(_data()[0][:2])
        fresh.load_weights(path)
    except (AttributeError, ValueError, TypeError, NotImplementedError) as e:
        # A clear refusal: the table, the format and what to use instead.
        assert "static_rows" in str(e) and ".h5" in str(e) and "m.keras" in str(e), str(e)
        return
    ids = _data()[0]
    _close(fresh.predict(ids, verbose=0), saved.predict(ids, verbose=0))
