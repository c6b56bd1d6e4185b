"""sok tables a Keras 3 model holds as attributes, in its weights files
(model.save_weights, model.save, what ModelCheckpoint writes): Keras 3
left them out and load_weights restored the dense layers only, without a
word. Refusals are ValueErrors (sok's CheckpointError, or the ValueError
in which recent Keras 3 releases gather load errors, quoting them). Each table is compared with the table that was saved, key by key, by
sok.export (and the model's outputs with the saved model's)."""

import h5py
import numpy as np
import pytest
import tensorflow as tf

import sok_graph as sok
from sok_graph.compat.keras import keras_saveable_class

pytestmark = pytest.mark.skipif(
    keras_saveable_class() is object,
    reason="Keras 3's weights files (Keras 2 and TF 1.x save tf.Variables themselves: a "
           "static table's rows, and a NoDenseValueError for a dynamic one)")

IDS = tf.ragged.constant([[1, 2, 2], [3], [1, 9]], tf.int64)


def _model(kind, dim=4, **table):
    """A subclassed Keras model whose embedding is one sok table."""
    import keras

    class Model(keras.Model):
        def __init__(self):
            super().__init__()
            if kind == "static":
                self.table = sok.Variable(tf.random.normal([10, dim], seed=None), name="t")
            else:
                self.table = sok.DynamicVariable(dim, name="t", **table)
            self.dense = keras.layers.Dense(1)

        def call(self, ids):
            emb = sok.lookup_sparse(self.table, ids, combiners="sum")
            return self.dense(tf.reduce_sum(emb, axis=1, keepdims=True))

    return Model()


def _table(model):
    keys, rows = (np.asarray(t) for t in sok.export(model.table))
    order = np.argsort(keys)
    return keys[order], rows[order]


def _train(model, steps=2):
    """Adam under OptimizerScope: the table gets slot tables (kept out of
    the file: a weights file holds no optimizer state)."""
    opt = tf.keras.optimizers.Adam(0.1)
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(model(IDS)))
        variables = [model.table] + model.dense.trainable_variables
        grads = tape.gradient(loss, variables)
        with sok.OptimizerScope([model.table]):
            opt.apply_gradients(zip(grads, variables))


KINDS = {
    "static": {},
    "dynamic": {},
    "hybrid_lfu": dict(var_type="hybrid", max_capacity=64, evict_strategy="lfu"),
    "min_count": dict(var_type="hybrid", max_capacity=64, min_count=2),
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("suffix", [".weights.h5", ".keras"])
def test_a_models_table_goes_in_its_keras_weights_file(tmp_path, kind, suffix):
    sok.init(comm_tool="none")
    saved, fresh = _model(kind, **KINDS[kind]), _model(kind, **KINDS[kind])
    _train(saved)
    if kind == "min_count":
        # Key 9 seen once (not admitted yet): its count must come back too.
        saved(tf.ragged.constant([[9, 11]], tf.int64))
    fresh(tf.ragged.constant([[5, 7, 8]], tf.int64))  # other keys, to be dropped by the load
    path = str(tmp_path / ("model" + suffix))
    if suffix == ".keras":
        saved.save(path)
    else:
        saved.save_weights(path)
        with h5py.File(path, "r") as f:
            # The table and the dense layer, nothing of the optimizer's slots.
            assert sorted(f.keys()) == ["dense", "table", "vars"], sorted(f.keys())
            entries = sorted(f["table/vars"].keys())
        want = {"static": ["keys", "values"],
                "dynamic": ["frequencies", "keys", "timestamps", "values"],
                "hybrid_lfu": ["frequencies", "keys", "timestamps", "values"],
                "min_count": ["filter.counts", "filter.keys", "filter_json", "frequencies",
                              "keys", "timestamps", "values"]}[kind]
        assert entries == want
    fresh.load_weights(path)
    for got, kept in zip(_table(fresh), _table(saved)):
        np.testing.assert_array_equal(got, kept)
    if kind != "static":
        assert 5 not in _table(fresh)[0]
    np.testing.assert_array_equal(fresh(IDS).numpy(), saved(IDS).numpy())
    if kind == "min_count":
        # Key 9's second sighting admits it in both; 11 was seen once in both.
        second = tf.ragged.constant([[9]], tf.int64)
        saved(second), fresh(second)
        for got, kept in zip(_table(fresh), _table(saved)):
            np.testing.assert_array_equal(got, kept)
        assert 9 in _table(fresh)[0] and 11 not in _table(fresh)[0]


def test_a_file_without_the_tables_entry_is_refused_naming_it(tmp_path):
    sok.init(comm_tool="none")
    saved, fresh = _model("dynamic"), _model("dynamic")
    saved(IDS), fresh(IDS)
    path = str(tmp_path / "model.weights.h5")
    saved.save_weights(path)
    with h5py.File(path, "a") as f:  # a file from before tables were saved
        for part in list(f["table/vars"].keys()):
            del f["table/vars"][part]
    before = _table(fresh)
    with pytest.raises(ValueError, match=r"entry for sok table 't' holds \[\], not the "
                                              r"table's keys and values"):
        fresh.load_weights(path)
    for got, kept in zip(_table(fresh), before):
        np.testing.assert_array_equal(got, kept)


def test_rows_that_do_not_fit_the_table_are_refused_before_it_changes(tmp_path):
    sok.init(comm_tool="none")
    saved = _model("dynamic")
    saved(tf.ragged.constant([[1, 2, 3, 4, 5, 6]], tf.int64))
    path = str(tmp_path / "model.weights.h5")
    saved.save_weights(path)
    wider = _model("dynamic", dim=8)
    wider(IDS)
    with pytest.raises(ValueError, match="rows of dimension 4; the table has dimension 8"):
        wider.load_weights(path)
    small = _model("dynamic", var_type="hybrid", max_capacity=4)
    small(IDS)
    before = _table(small)
    with pytest.raises(ValueError, match="holds at most 4 rows"):
        small.load_weights(path)
    for got, kept in zip(_table(small), before):
        np.testing.assert_array_equal(got, kept)
    static = _model("static")
    static(IDS)
    with pytest.raises(ValueError, match="variable 't' has 10 rows; the file holds 6 rows"):
        static.load_weights(path)


def _fit_model(kind):
    """A Keras 3 model whose train_step trains its sok table under
    sok.OptimizerScope with the compiled optimizer (Adagrad on a decaying
    schedule: a slot per row, and a rate that depends on the step)."""
    import keras

    model = _model(kind)
    # The same start for every model made (_model's are drawn afresh).
    start = np.random.default_rng(3).normal(size=[10, 4]).astype(np.float32)
    if kind == "static":
        model.table = sok.Variable(start, name="t")
    else:
        sok.assign(model.table, tf.range(10, dtype=tf.int64), start)
    model.dense = keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(0.3))

    def train_step(data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        variables = model.dense.trainable_variables + [model.table]
        grads = tape.gradient(loss, variables)
        with sok.OptimizerScope([model.table]):
            model.optimizer.apply_gradients(zip(grads, variables))
        return {"loss": loss}

    model.train_step = train_step
    model(IDS)
    rate = keras.optimizers.schedules.ExponentialDecay(0.5, 2, 0.3, staircase=True)
    model.compile(keras.optimizers.Adagrad(rate), jit_compile=False)
    return model


def _fit_data():
    rng = np.random.default_rng(5)
    ids = tf.ragged.constant([list(rng.integers(0, 10, rng.integers(1, 4))) for _ in range(16)],
                             tf.int64)
    return tf.data.Dataset.from_tensor_slices((ids, rng.normal(size=[16, 1]).astype(
        np.float32))).batch(4)


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_a_fit_resumed_from_a_weights_file_goes_on_with_the_tables_slots_and_step(tmp_path,
                                                                                  kind):
    """Keras 3 keeps the compiled optimizer's variables in the file (its
    iterations, the dense layers' slots): the table's slots and step went
    missing, so a resumed fit trained the rows with fresh accumulators and
    a schedule started again, while the dense layers went on (the table
    0.07-0.1 off an uninterrupted fit after two more epochs)."""
    sok.init(comm_tool="none")
    whole = _fit_model(kind)
    whole.fit(_fit_data(), epochs=4, verbose=0)
    first = _fit_model(kind)
    first.fit(_fit_data(), epochs=2, verbose=0)
    path = str(tmp_path / "half.weights.h5")
    first.save_weights(path)
    with h5py.File(path, "r") as f:
        assert "slot.accumulator" in f["table/vars"], sorted(f["table/vars"].keys())
    resumed = _fit_model(kind)
    # Keras loads its optimizer's variables into a built optimizer only.
    resumed.optimizer.build(resumed.dense.trainable_variables)
    resumed.load_weights(path)
    resumed.fit(_fit_data(), epochs=2, verbose=0)
    assert int(resumed.optimizer.iterations) == int(whole.optimizer.iterations) == 16
    for got, want in zip(_table(resumed), _table(whole)):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(resumed.dense.kernel.numpy(), whole.dense.kernel.numpy())
    # Loaded again into the model that trained on: its optimizer holds the
    # table's slots, which the file's replace.
    resumed.load_weights(path)
    first.fit(_fit_data(), epochs=2, verbose=0)
    resumed.fit(_fit_data(), epochs=2, verbose=0)
    for got, want in zip(_table(resumed), _table(first)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kept, then, words", [
    ("adagrad", "sgd", r"\['accumulator'\] of sok table 't' for adagrad .*its optimizer is sgd"),
    ("rmsprop", "centered", r"\['rms'\] of sok table 't' for rmsprop .*with slots \['rms', 'mg'\]")])
def test_slots_kept_for_other_slots_start_afresh_with_a_warning(tmp_path, kept, then, words):
    """Another algorithm, or the same with other slots (RMSprop centered
    keeps 'mg' too, which the file lacked: a KeyError inside the first
    step, the slots left half made)."""
    import keras

    make = {"adagrad": lambda: keras.optimizers.Adagrad(0.1),
            "rmsprop": lambda: keras.optimizers.RMSprop(0.1),
            "sgd": lambda: keras.optimizers.SGD(0.1),
            "centered": lambda: keras.optimizers.RMSprop(0.1, centered=True)}
    sok.init(comm_tool="none")
    first = _fit_model("dynamic")
    first.compile(make[kept](), jit_compile=False)
    first.fit(_fit_data(), epochs=1, verbose=0)
    path = str(tmp_path / "kept.weights.h5")
    first.save_weights(path)
    other = _fit_model("dynamic")
    other.compile(make[then](), jit_compile=False)
    other.load_weights(path)
    with pytest.warns(UserWarning, match=words + ".*start afresh"):
        other.fit(_fit_data(), epochs=1, verbose=0)
    assert int(sok.export(other.table)[0].shape[0]) > 0


def test_a_table_with_slots_in_two_optimizers_keeps_none_with_a_warning(tmp_path):
    """Whose slots a file holds must be clear on both sides: a table with
    slots in two live optimizers is saved without them, and a file's slots
    are not given to either of two, each with a warning naming the table
    (the save left them out without a word)."""
    sok.init(comm_tool="none")

    def trained_by(*optimizers):
        model = _model("dynamic")
        model(IDS)
        for opt in optimizers:
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(model(IDS)))
            grads = tape.gradient(loss, [model.table] + model.dense.trainable_variables)
            with sok.OptimizerScope([model.table]):
                opt.apply_gradients(zip(grads, [model.table] + model.dense.trainable_variables))
        return model

    both = [tf.keras.optimizers.Adam(0.1), tf.keras.optimizers.Adagrad(0.1)]
    model = trained_by(*both)
    two = str(tmp_path / "two.weights.h5")
    with pytest.warns(UserWarning, match=r"save_weights: .* sok table 't' \(its slots are in "
                                         r"2 optimizers\)"):
        model.save_weights(two)
    with h5py.File(two, "r") as f:
        kept = sorted(f["table/vars"].keys())
    assert not [part for part in kept if part.startswith("slot.")], kept

    single = tf.keras.optimizers.Adam(0.1)
    saved = trained_by(single)
    one = str(tmp_path / "one.weights.h5")
    saved.save_weights(one)
    with h5py.File(one, "r") as f:
        assert "slot.m" in f["table/vars"], sorted(f["table/vars"].keys())
    other = [tf.keras.optimizers.Adam(0.1), tf.keras.optimizers.Adam(0.2)]
    into = trained_by(*other)
    with pytest.warns(UserWarning, match=r"load_weights: the file's slots and step of sok "
                                         r"table 't' are not restored \(its slots are in 2 "
                                         r"optimizers\)"):
        into.load_weights(one)
    # The rows are the file's all the same.
    for got, want in zip(_table(into), _table(saved)):
        np.testing.assert_array_equal(got, want)


def test_a_table_sharded_over_replicas_is_saved_without_its_slots_with_a_warning(tmp_path):
    """A MirroredStrategy's table keeps its slots per shard, which the
    holder check did not see: the file left them out without a word
    (tests/multiworker/mirrored_keras_file.py; a fresh process, as the
    logical CPUs must exist before TensorFlow starts)."""
    import os
    import subprocess
    import sys

    import sok_graph

    here = os.path.dirname(os.path.abspath(__file__))
    site = os.path.dirname(os.path.dirname(os.path.abspath(sok_graph.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [site, os.path.join(here, "multiworker")] +
        [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    proc = subprocess.run([sys.executable, os.path.join(here, "multiworker",
                                                        "mirrored_keras_file.py"),
                           str(tmp_path / "mirrored.weights.h5")],
                          check=False, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, (proc.stdout + proc.stderr)[-4000:]
