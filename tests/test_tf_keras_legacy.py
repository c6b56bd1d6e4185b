"""Keras 2 through the `tf_keras` package on TensorFlow >= 2.16.

SOK users on TF >= 2.16 whose scripts were written for tf.keras 2 install
tf_keras and set TF_USE_LEGACY_KERAS=1: `tf.keras` is then tf_keras (Keras
2: its new optimizers, its `legacy` OptimizerV2 ones, its LossScaleOptimizer,
its fit/save_weights). The variable must be set before TensorFlow is
imported, so every scenario here runs in a subprocess of its own (the suite's
process already imported TensorFlow with Keras 3). Each scenario compares
sok_graph against an independent reference: a plain tf.Variable (or a Keras
Embedding) trained by the same Keras optimizer class, or the same training
run without the interruption being tested.

Skipped where tf_keras is not importable and on TensorFlow before 2.16
(1.15, 2.15: their tf.keras is Keras 2 already; the rest of the suite covers
it). Python 3.7 syntax (TF 1.15's interpreter collects this file too).
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

import sok_graph as sok


def _tf_version():
    parts = []
    for piece in tf.__version__.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _tf_keras_importable():
    try:
        return importlib.util.find_spec("tf_keras") is not None
    except (ImportError, ValueError):
        return False


pytestmark = [
    pytest.mark.skipif(_tf_version() < (2, 16),
                       reason="tf_keras / TF_USE_LEGACY_KERAS is for TensorFlow >= 2.16 "
                              "(before, tf.keras is Keras 2 already)"),
    pytest.mark.skipif(not _tf_keras_importable(),
                       reason="tf_keras is not installed (pip install --no-deps tf_keras)"),
]

# ------------------------------------------------------------------ runner

PRELUDE = r'''
import json, os, sys, tempfile, traceback
import numpy as np
import tensorflow as tf
import sok_graph as sok

LEGACY_KERAS = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
if LEGACY_KERAS:
    if not tf.keras.__name__.startswith("tf_keras"):
        print("SETUP tf.keras is %s, not tf_keras" % tf.keras.__name__, flush=True)
        sys.exit(3)
    K = tf.keras
else:
    import tf_keras as K
sok.init(comm_tool="none", use_legacy_optimizer=False)


def report(key, **value):
    print("RESULT " + key + " " + json.dumps(value), flush=True)


def attempt(key, fn):
    try:
        report(key, **fn())
    except Exception as e:  # noqa: BLE001 - reported to the test
        if os.environ.get("SOK_TFK_TRACEBACK"):
            traceback.print_exc()
        report(key, error=type(e).__name__, message=str(e)[-2000:])


def make_opt(name, **kw):
    """"new.Adam", "legacy.Momentum", ...: a tf_keras optimizer."""
    family, cls = name.split(".")
    module = K.optimizers.legacy if family == "legacy" else K.optimizers
    kw.setdefault("learning_rate", 0.1)
    if cls == "Momentum":
        cls = "SGD"
        kw["momentum"] = 0.9
    return getattr(module, cls)(**kw)


def maxdiff(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
'''


def _run(body, legacy=True, timeout=420):
    """Runs PRELUDE + body in a fresh Python with TF_USE_LEGACY_KERAS=1 (or
    without it: tf_keras imported explicitly under Keras 3); returns
    {key: value} of its RESULT lines."""
    site = os.path.dirname(os.path.dirname(os.path.abspath(sok.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [site] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if legacy:
        env["TF_USE_LEGACY_KERAS"] = "1"
    else:
        env.pop("TF_USE_LEGACY_KERAS", None)
    script = PRELUDE + body + "\nprint('DONE', flush=True)\n"
    proc = subprocess.run([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=timeout)
    assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stdout[-6000:]
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            _, key, value = line.split(" ", 2)
            results[key] = json.loads(value)
    return results


def _failures(results, check):
    """The cases of `results` for which check(key, value) gives a reason."""
    bad = []
    for key in sorted(results):
        reason = check(key, results[key])
        if reason:
            bad.append("%s: %s" % (key, reason))
    return bad


def _within(tolerance):
    def check(key, value):
        if "error" in value:
            return "%s: %s" % (value["error"], value["message"][-600:])
        limit = tolerance(key) if callable(tolerance) else tolerance
        far = {k: v for k, v in value.items() if k.startswith("diff") and v > limit}
        if far:
            return "differs from the reference by %s (tolerance %g)" % (far, limit)
        if value.get("moved", 1.0) < 1e-3:
            return "the reference rows did not move (%s): nothing was compared" % value
        if value.get("iterations") is not None and value["iterations"] != value.get(
                "ref_iterations", value["iterations"]):
            return "optimizer.iterations %s, reference %s" % (value["iterations"],
                                                              value["ref_iterations"])
        return None
    return check


def _adam_tolerance(key):
    # Keras 2's newer Adam subtracts beta_2 from 1 in Python before the cast,
    # the fused float32 update after it (documented in
    # optimization/algorithms.py _one_minus: within 5e-5 relative).
    return 1e-5 if "new.Adam" in key else 1e-6


# ------------------------------------------- 1. OptimizerWrapper, 2.x API

WRAPPER_SCRIPT = r'''
V, D = 6, 3
KEYS = np.array([10 ** 12 + 7 * i for i in range(V)], np.int64)
rng = np.random.RandomState(0)
INIT = rng.uniform(-0.5, 0.5, (V, D)).astype(np.float32)
W0 = rng.uniform(-0.5, 0.5, (D, 1)).astype(np.float32)
TARGET = rng.uniform(-1, 1, (4, 1)).astype(np.float32)
# Every batch reads every row (some twice): lazy per-row updates and the
# reference's dense ones agree on rows that every step reads.
BATCHES = [[list(np.roll(r, s)) for r in [[0, 1, 1], [2, 3], [4, 5, 0], [5, 2, 3, 3]]]
           for s in range(3)]


def table(kind):
    if kind == "static":
        return sok.Variable(INIT.copy())
    t = sok.DynamicVariable(dimension=D, initializer="zeros")
    sok.assign(t, tf.constant(KEYS), tf.constant(INIT))
    return t


def ids_of(rows, kind):
    if kind == "dynamic":
        rows = [[KEYS[i] for i in r] for r in rows]
    return tf.ragged.constant(rows, dtype=tf.int64)


def rows_of(t, kind):
    if kind == "static":
        return t.numpy()
    return tf.nn.embedding_lookup(t, tf.constant(KEYS)).numpy()


def case(optname, kind, mode, how):
    ref, ref_w = tf.Variable(INIT), tf.Variable(W0)
    ref_opt = make_opt(optname)
    var, w = table(kind), tf.Variable(W0)
    native = make_opt(optname)
    opt = sok.OptimizerWrapper(native) if how == "wrapper" else native

    def sok_step(ids):
        with tf.GradientTape() as tape:
            emb = sok.lookup_sparse(var, ids, combiners="mean")
            loss = tf.reduce_sum(tf.square(tf.matmul(emb, w) - TARGET))
        grads = tape.gradient(loss, [var, w])
        if how == "scope":
            with sok.OptimizerScope([var]):
                opt.apply_gradients(zip(grads, [var, w]))
        else:
            opt.apply_gradients(zip(grads, [var, w]))

    def ref_step(sp):
        with tf.GradientTape() as tape:
            emb = tf.nn.embedding_lookup_sparse(ref, sp, None, combiner="mean")
            loss = tf.reduce_sum(tf.square(tf.matmul(emb, ref_w) - TARGET))
        grads = tape.gradient(loss, [ref, ref_w])
        ref_opt.apply_gradients(zip(grads, [ref, ref_w]))

    if mode == "function":
        sok_step = tf.function(sok_step, reduce_retracing=True)
        ref_step = tf.function(ref_step, reduce_retracing=True)
    for rows in BATCHES:
        sok_step(ids_of(rows, kind))
        ref_step(tf.ragged.constant(rows, dtype=tf.int64).to_sparse())
    out = dict(diff_rows=maxdiff(rows_of(var, kind), ref.numpy()),
               diff_dense=maxdiff(w.numpy(), ref_w.numpy()),
               moved=maxdiff(ref.numpy(), INIT))
    if how == "scope":
        out.update(iterations=int(native.iterations.numpy()),
                   ref_iterations=int(ref_opt.iterations.numpy()))
    return out


HOW = sys.argv[1]
for optname in sys.argv[2].split(","):
    for kind in ("static", "dynamic"):
        for mode in ("eager", "function"):
            key = "%s/%s/%s" % (optname, kind, mode)
            attempt(key, lambda: case(optname, kind, mode, HOW))
'''

_OPTIMIZERS = ("new.SGD,new.Momentum,new.Adam,new.Adagrad,new.Ftrl,"
               "legacy.SGD,legacy.Momentum,legacy.Adam,legacy.Adagrad,legacy.Ftrl,legacy.RMSprop")


def _run_argv(body, *argv, **kwargs):
    return _run("sys.argv[1:] = %r\n" % (list(argv),) + body, **kwargs)


def test_optimizer_wrapper_over_tf_keras_optimizers_matches_keras_on_a_tf_variable():
    """sok.OptimizerWrapper(tf.keras.optimizers.X) and (...legacy.X), with
    tf.keras == tf_keras: static and dynamic tables, eager and tf.function,
    a dense variable passed through to the optimizer. Rows and the dense
    weights equal the same optimizer class training a tf.Variable read by
    tf.nn.embedding_lookup_sparse."""
    results = _run_argv(WRAPPER_SCRIPT, "wrapper", _OPTIMIZERS)
    assert len(results) == 44, results
    assert not _failures(results, _within(_adam_tolerance)), \
        "\n".join(_failures(results, _within(_adam_tolerance)))


def test_native_tf_keras_optimizers_inside_optimizer_scope_match_keras_on_a_tf_variable():
    """SOK's TF2 path: a native tf.keras (tf_keras) optimizer's
    apply_gradients inside sok.OptimizerScope updates the tables row by row
    and the dense variable itself, counting its iterations once a step."""
    results = _run_argv(WRAPPER_SCRIPT, "scope", _OPTIMIZERS)
    assert len(results) == 44, results
    assert not _failures(results, _within(_adam_tolerance)), \
        "\n".join(_failures(results, _within(_adam_tolerance)))


# ----------------------------------------- 2. the 1.x layers and Model.fit

LAYERS_COMMON = r'''
V, D, S, N = 5, 3, 2, 2
rng = np.random.RandomState(1)
INIT = rng.uniform(-0.5, 0.5, (V, D)).astype(np.float32)
W0 = rng.uniform(-0.5, 0.5, (S * N * D, 1)).astype(np.float32)
# 8 samples in batches of 4: each batch reads every row.
IDS = np.array([[[0, 1], [2, 3]], [[4, 0], [1, 1]], [[2, 2], [3, 4]], [[0, 4], [3, 1]],
                [[1, 0], [4, 2]], [[3, 3], [0, 1]], [[2, 4], [4, 0]], [[1, 2], [3, 0]]],
               np.int64)
Y = rng.uniform(-1, 1, (8, 1)).astype(np.float32)
HASH_INIT = 0.25


def sok_layer(hashtable):
    return sok.All2AllDenseEmbedding(
        max_vocabulary_size_per_gpu=64 if hashtable else V, embedding_vec_size=D,
        slot_num=S, nnz_per_slot=N, use_hashtable=hashtable,
        embedding_initializer=HASH_INIT if hashtable else INIT)


def ref_layer(hashtable):
    init = np.full((V, D), HASH_INIT, np.float32) if hashtable else INIT
    return K.layers.Embedding(V, D, embeddings_initializer=K.initializers.Constant(init))


class Sub(K.Model):
    def __init__(self, emb):
        super().__init__()
        self.emb = emb
        self.flat = K.layers.Flatten()
        self.dense = K.layers.Dense(1, use_bias=False,
                                    kernel_initializer=K.initializers.Constant(W0))

    def call(self, x):
        return self.dense(self.flat(self.emb(x)))


def functional(emb):
    inp = K.Input(shape=(S, N), dtype=tf.int64)
    out = K.layers.Dense(1, use_bias=False, kernel_initializer=K.initializers.Constant(W0))(
        K.layers.Flatten()(emb(inp)))
    return K.Model(inp, out)


def build(kind, emb):
    return Sub(emb) if kind == "sub" else functional(emb)


def rows_of(layer, hashtable):
    if hashtable:
        return tf.nn.embedding_lookup(layer.embedding_variable,
                                      tf.range(V, dtype=tf.int64)).numpy()
    return layer.embedding_variable.numpy()


def ref_rows(model):
    return [l for l in model.layers if isinstance(l, K.layers.Embedding)][0].get_weights()[0]


def dense_of(model):
    return model.layers[-1].get_weights()[0]


def compiled(optname, kind, hashtable):
    emb = sok_layer(hashtable)
    model = build(kind, emb)
    opt = make_opt(optname)
    with sok.OptimizerScope(emb.trainable_variables):
        model.compile(optimizer=opt, loss="mse")
    return emb, model, opt


def fit(emb, model, epochs, initial_epoch=0, callbacks=None):
    with sok.OptimizerScope(emb.trainable_variables):
        return model.fit(IDS, Y, batch_size=4, epochs=epochs, initial_epoch=initial_epoch,
                         shuffle=False, verbose=0, callbacks=callbacks)
'''

FIT_SCRIPT = LAYERS_COMMON + r'''
def fit_case(optname, kind, hashtable):
    emb, model, opt = compiled(optname, kind, hashtable)
    history = fit(emb, model, 2)
    ref = build(kind, ref_layer(hashtable))
    ref_opt = make_opt(optname)
    ref.compile(optimizer=ref_opt, loss="mse")
    ref_history = ref.fit(IDS, Y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    return dict(diff_rows=maxdiff(rows_of(emb, hashtable), ref_rows(ref)),
                diff_dense=maxdiff(dense_of(model), dense_of(ref)),
                diff_loss=maxdiff(history.history["loss"], ref_history.history["loss"]),
                diff_evaluate=maxdiff(model.evaluate(IDS, Y, batch_size=4, verbose=0),
                                      ref.evaluate(IDS, Y, batch_size=4, verbose=0)),
                diff_predict=maxdiff(model.predict(IDS, batch_size=4, verbose=0),
                                     ref.predict(IDS, batch_size=4, verbose=0)),
                moved=maxdiff(ref_rows(ref), np.full((V, D), HASH_INIT) if hashtable else INIT),
                iterations=int(opt.iterations.numpy()),
                ref_iterations=int(ref_opt.iterations.numpy()))


for optname in sys.argv[1].split(","):
    for kind in ("sub", "func"):
        for hashtable in (False, True):
            key = "%s/%s/%s" % (optname, kind, "hashtable" if hashtable else "static")
            attempt(key, lambda: fit_case(optname, kind, hashtable))
'''


def test_fit_evaluate_predict_of_1x_layers_inside_optimizer_scope_match_a_keras_embedding():
    """All2AllDenseEmbedding (static and hashtable) in a tf.keras.Model
    subclass and a functional model, compile/fit/evaluate/predict inside
    sok.OptimizerScope, against the same model with a Keras Embedding."""
    results = _run_argv(FIT_SCRIPT, "legacy.Adam,new.Adam,new.Adagrad,legacy.SGD")
    assert len(results) == 16, results
    assert not _failures(results, _within(_adam_tolerance)), \
        "\n".join(_failures(results, _within(_adam_tolerance)))


RESUME_SCRIPT = LAYERS_COMMON + r'''
TMP = tempfile.mkdtemp()


def resume_case(how, optname, kind, hashtable):
    straight = compiled(optname, kind, hashtable)
    fit(straight[0], straight[1], 2)
    emb, model, opt = compiled(optname, kind, hashtable)
    path = os.path.join(TMP, "%s_%s_%s_%s" % (how, optname, kind, hashtable))
    if how == "weights_tf":
        fit(emb, model, 1)
        model.save_weights(path, save_format="tf")
    elif how == "weights_h5":
        fit(emb, model, 1)
        model.save_weights(path + ".h5")
    elif how == "model_checkpoint":
        fit(emb, model, 1, callbacks=[K.callbacks.ModelCheckpoint(
            os.path.join(path, "ckpt"), save_weights_only=True)])
    elif how == "tf_train_checkpoint":
        fit(emb, model, 1)
        tf.train.Checkpoint(model=model, optimizer=opt).write(path)
    elif how == "backup_and_restore":
        class Interrupt(K.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                raise RuntimeError("interrupted")
        try:
            fit(emb, model, 2, callbacks=[K.callbacks.BackupAndRestore(path), Interrupt()])
        except RuntimeError:
            pass
    emb2, model2, opt2 = compiled(optname, kind, hashtable)
    if how == "weights_tf":
        model2.load_weights(path)
    elif how == "weights_h5":
        if kind == "sub":
            model2(IDS[:1])
        model2.load_weights(path + ".h5")
    elif how == "model_checkpoint":
        model2.load_weights(os.path.join(path, "ckpt"))
    elif how == "tf_train_checkpoint":
        tf.train.Checkpoint(model=model2, optimizer=opt2).read(path)
    if how == "weights_h5":
        # Keras 2's HDF5 files hold no optimizer state: compare the weights.
        return dict(diff_rows=maxdiff(rows_of(emb2, hashtable), rows_of(emb, hashtable)),
                    diff_dense=maxdiff(dense_of(model2), dense_of(model)),
                    moved=maxdiff(rows_of(emb, hashtable),
                                  np.full((V, D), HASH_INIT) if hashtable else INIT))
    if how == "backup_and_restore":
        fit(emb2, model2, 2, callbacks=[K.callbacks.BackupAndRestore(path)])
    else:
        fit(emb2, model2, 2, initial_epoch=1)
    return dict(diff_rows=maxdiff(rows_of(emb2, hashtable), rows_of(straight[0], hashtable)),
                diff_dense=maxdiff(dense_of(model2), dense_of(straight[1])),
                moved=maxdiff(rows_of(straight[0], hashtable),
                              np.full((V, D), HASH_INIT) if hashtable else INIT),
                iterations=int(opt2.iterations.numpy()),
                ref_iterations=int(straight[2].iterations.numpy()))


for how in ("weights_tf", "model_checkpoint", "tf_train_checkpoint", "backup_and_restore"):
    for optname in ("legacy.Adam", "new.Adam"):
        for kind in ("sub", "func"):
            for hashtable in (False, True):
                key = "%s/%s/%s/%s" % (how, optname, kind, "hashtable" if hashtable else "static")
                attempt(key, lambda: resume_case(how, optname, kind, hashtable))
for kind in ("sub", "func"):
    attempt("weights_h5/legacy.Adam/%s/static" % kind,
            lambda: resume_case("weights_h5", "legacy.Adam", kind, False))
    # Documented refusal (README): an HDF5 file cannot hold a dynamic table;
    # the error names the table and what to use instead.
    attempt("weights_h5/legacy.Adam/%s/hashtable" % kind,
            lambda: resume_case("weights_h5", "legacy.Adam", kind, True))
'''


def test_resuming_fit_from_keras_2_weights_and_checkpoints_goes_on_as_if_uninterrupted():
    """save_weights (TF format), ModelCheckpoint, tf.train.Checkpoint and
    BackupAndRestore of a tf_keras model holding 1.x layers: a fit resumed
    from them ends where one uninterrupted fit ends (tables, their Adam
    slots and step, the dense weights). HDF5 weights keep the rows of a
    static table; a hashtable is refused naming the table."""
    results = _run(RESUME_SCRIPT, timeout=560)
    assert len(results) == 36, results
    refused = {k: results.pop(k) for k in list(results)
               if k.startswith("weights_h5") and k.endswith("hashtable")}
    assert not _failures(results, _within(_adam_tolerance)), \
        "\n".join(_failures(results, _within(_adam_tolerance)))
    for key, value in refused.items():
        assert value.get("error") == "NoDenseValueError", (key, value)
        assert "all2_all_dense_embedding" in value["message"], (key, value)


MODEL_2X_SCRIPT = r'''
V, D = 5, 3
rng = np.random.RandomState(2)
INIT = rng.uniform(-0.5, 0.5, (V, D)).astype(np.float32)
W0 = rng.uniform(-0.5, 0.5, (D, 1)).astype(np.float32)
IDS = np.array([[0, 1], [2, 3], [4, 0], [1, 1], [2, 2], [3, 4], [0, 4], [3, 1]], np.int64)
Y = rng.uniform(-1, 1, (8, 1)).astype(np.float32)
OFFSET = 1000


class WithTable(K.Model):
    def __init__(self, table, keyed):
        super().__init__()
        self.table = table
        self.keyed = keyed
        self.dense = K.layers.Dense(1, use_bias=False,
                                    kernel_initializer=K.initializers.Constant(W0))

    def call(self, ids):
        ids = tf.cast(ids, tf.int64) + (OFFSET if self.keyed else 0)
        return self.dense(sok.lookup_sparse(self.table, tf.RaggedTensor.from_tensor(ids),
                                            combiners="sum"))


class Reference(K.Model):
    def __init__(self):
        super().__init__()
        self.table = tf.Variable(INIT)
        self.dense = K.layers.Dense(1, use_bias=False,
                                    kernel_initializer=K.initializers.Constant(W0))

    def call(self, ids):
        return self.dense(tf.reduce_sum(tf.gather(self.table, ids), 1))


def model_case(optname, dynamic):
    if dynamic:
        table = sok.DynamicVariable(dimension=D, initializer="zeros")
        sok.assign(table, tf.range(OFFSET, OFFSET + V, dtype=tf.int64), tf.constant(INIT))
    else:
        table = sok.Variable(INIT.copy())
    model = WithTable(table, dynamic)
    with sok.OptimizerScope([table]):
        model.compile(optimizer=make_opt(optname), loss="mse")
        model.fit(IDS, Y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    ref = Reference()
    ref.compile(optimizer=make_opt(optname), loss="mse")
    ref.fit(IDS, Y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    rows = (tf.nn.embedding_lookup(table, tf.range(OFFSET, OFFSET + V, dtype=tf.int64)).numpy()
            if dynamic else table.numpy())
    return dict(diff_rows=maxdiff(rows, ref.table.numpy()),
                diff_dense=maxdiff(model.dense.get_weights()[0], ref.dense.get_weights()[0]),
                moved=maxdiff(ref.table.numpy(), INIT))


for optname in ("legacy.SGD", "new.SGD", "legacy.Adagrad", "new.Adagrad", "new.Adam"):
    for dynamic in (False, True):
        key = "%s/%s" % (optname, "dynamic" if dynamic else "static")
        attempt(key, lambda: model_case(optname, dynamic))
'''


def test_fit_of_a_tf_keras_model_holding_sok_tables_inside_optimizer_scope():
    """SOK 2.x style: a tf.keras.Model holding a sok.Variable or a
    sok.DynamicVariable as an attribute; Keras 2 lists it among the
    trainable variables and fit inside sok.OptimizerScope trains it as the
    same model over a tf.Variable trains."""
    results = _run(MODEL_2X_SCRIPT)
    assert len(results) == 10, results
    assert not _failures(results, _within(_adam_tolerance)), \
        "\n".join(_failures(results, _within(_adam_tolerance)))


# ------------------------------------------------------ 3. sok.dump / load

DUMP_SCRIPT = r'''
V, D = 6, 3
KEYS = np.array([10 ** 12 + 7 * i for i in range(V)], np.int64)
rng = np.random.RandomState(3)
INIT = rng.uniform(-0.5, 0.5, (V, D)).astype(np.float32)
TARGET = rng.uniform(-1, 1, (2, D)).astype(np.float32)
# Each step reads some rows only: the slots of the rows a step skips matter.
STEPS = [[[0, 1], [2]], [[3, 0], [1, 1]], [[4], [5, 2]], [[0, 3], [5]], [[1], [4, 4]],
         [[2, 5], [3]]]
TMP = tempfile.mkdtemp()


def table(dynamic):
    if dynamic:
        t = sok.DynamicVariable(dimension=D, initializer="zeros", name="dyn")
        sok.assign(t, tf.constant(KEYS), tf.constant(INIT))
        return t
    return sok.Variable(INIT.copy(), name="static")


def rows_of(t, dynamic):
    return tf.nn.embedding_lookup(t, tf.constant(KEYS)).numpy() if dynamic else t.numpy()


def step(t, opt, rows, dynamic, how):
    ids = [[KEYS[i] for i in r] for r in rows] if dynamic else rows
    with tf.GradientTape() as tape:
        emb = sok.lookup_sparse(t, tf.ragged.constant(ids, dtype=tf.int64), combiners="sum")
        loss = tf.reduce_sum(tf.square(emb - TARGET))
    grads = tape.gradient(loss, [t])
    if how == "scope":
        with sok.OptimizerScope([t]):
            opt.apply_gradients(zip(grads, [t]))
    else:
        opt.apply_gradients(zip(grads, [t]))


def optimizer(optname, how):
    native = make_opt(optname)
    return sok.OptimizerWrapper(native) if how == "wrapper" else native


def dump_case(optname, how, dynamic):
    straight_table, straight_opt = table(dynamic), optimizer(optname, how)
    for rows in STEPS:
        step(straight_table, straight_opt, rows, dynamic, how)
    t, opt = table(dynamic), optimizer(optname, how)
    for rows in STEPS[:3]:
        step(t, opt, rows, dynamic, how)
    path = os.path.join(TMP, "%s_%s_%s" % (optname, how, dynamic))
    sok.dump(path, [t], opt)
    t2, opt2 = table(dynamic), optimizer(optname, how)
    sok.load(path, [t2], opt2)
    for rows in STEPS[3:]:
        step(t2, opt2, rows, dynamic, how)
    return dict(diff_rows=maxdiff(rows_of(t2, dynamic), rows_of(straight_table, dynamic)),
                moved=maxdiff(rows_of(straight_table, dynamic), INIT))


for optname in ("legacy.Adam", "new.Adam", "legacy.Adagrad", "new.Momentum", "legacy.Ftrl",
                "legacy.RMSprop"):
    for how in ("wrapper", "scope", "plain"):
        for dynamic in (False, True):
            if how == "plain" and dynamic:
                continue  # a native optimizer cannot update a dynamic table itself
            key = "%s/%s/%s" % (optname, how, "dynamic" if dynamic else "static")
            attempt(key, lambda: dump_case(optname, how, dynamic))
'''


def test_dump_and_load_keep_a_tf_keras_optimizers_slots():
    """sok.dump / sok.load with a tf_keras optimizer's slots: through
    sok.OptimizerWrapper, a native optimizer under sok.OptimizerScope, and a
    plain legacy (OptimizerV2) optimizer that trained a static table itself.
    Training resumed from the load ends where uninterrupted training ends.
    A newer Keras 2 optimizer that trained a static table itself keeps its
    slots where sok cannot read them: refused naming the table."""
    results = _run(DUMP_SCRIPT)
    assert len(results) == 30, results
    refused = {k: results.pop(k) for k in list(results)
               if k.startswith("new.") and "/plain/" in k}
    assert not _failures(results, _within(1e-6)), "\n".join(_failures(results, _within(1e-6)))
    assert sorted(refused) == ["new.Adam/plain/static", "new.Momentum/plain/static"], refused
    for key, value in refused.items():
        assert value.get("error") == "ValueError", (key, value)
        assert "static" in value["message"] and "OptimizerScope" in value["message"], (key, value)


# -------------------------------------------------- 4. mixed precision

MIXED_SCRIPT = LAYERS_COMMON + r'''
K.mixed_precision.set_global_policy("mixed_float16")
# Large targets: the first steps' scaled gradients overflow float16, so the
# LossScaleOptimizer skips them (and lowers its scale) before it trains.
Y = Y * 30


def mixed_case(optname, kind, hashtable):
    emb, model, opt = compiled(optname, kind, hashtable)
    history = fit(emb, model, 4)
    ref = build(kind, ref_layer(hashtable))
    ref.compile(optimizer=make_opt(optname), loss="mse")
    ref_history = ref.fit(IDS, Y, batch_size=4, epochs=4, shuffle=False, verbose=0)
    return dict(diff_rows=maxdiff(rows_of(emb, hashtable), ref_rows(ref)),
                diff_dense=maxdiff(dense_of(model), dense_of(ref)),
                diff_loss=maxdiff(history.history["loss"], ref_history.history["loss"]),
                moved=maxdiff(ref_rows(ref), np.full((V, D), HASH_INIT) if hashtable else INIT),
                loss_scale_optimizer=type(model.optimizer).__name__)


for optname in ("legacy.Adam", "new.Adam"):
    for kind in ("sub", "func"):
        for hashtable in (False, True):
            key = "%s/%s/%s" % (optname, kind, "hashtable" if hashtable else "static")
            attempt(key, lambda: mixed_case(optname, kind, hashtable))


def custom_loop_case(family, dynamic):
    """A custom loop: LossScaleOptimizer's scaled loss and unscaled
    gradients, apply_gradients inside the scope; against a tf.Variable."""
    if dynamic:
        t = sok.DynamicVariable(dimension=2, initializer="ones")
    else:
        t = sok.Variable(np.ones((4, 2), np.float32))
    ref = tf.Variable(np.ones((4, 2), np.float32))
    ws = [tf.Variable([[1.0], [2.0]]) for _ in range(2)]
    opts = [K.mixed_precision.LossScaleOptimizer(make_opt(family + ".SGD")) for _ in range(2)]
    ids = tf.constant([1, 2], tf.int64)
    for table, w, lso, scope in ((t, ws[0], opts[0], True), (ref, ws[1], opts[1], False)):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(tf.nn.embedding_lookup(table, ids), w))
            scaled = lso.get_scaled_loss(loss)
        grads = lso.get_unscaled_gradients(tape.gradient(scaled, [table, w]))
        if scope:
            with sok.OptimizerScope([table]):
                lso.apply_gradients(zip(grads, [table, w]))
        else:
            lso.apply_gradients(zip(grads, [table, w]))
    return dict(diff_rows=maxdiff(tf.nn.embedding_lookup(t, ids).numpy(),
                                  tf.gather(ref, ids).numpy()),
                diff_dense=maxdiff(ws[0].numpy(), ws[1].numpy()),
                moved=maxdiff(tf.gather(ref, ids).numpy(), 1.0))


for family in ("legacy", "new"):
    for dynamic in (False, True):
        key = "custom_loop/%s/%s" % (family, "dynamic" if dynamic else "static")
        attempt(key, lambda: custom_loop_case(family, dynamic))
'''


def test_mixed_float16_fit_and_loss_scale_optimizer_inside_optimizer_scope():
    """mixed_float16 policy: compile wraps the tf_keras optimizer in its
    LossScaleOptimizer (the legacy one, or LossScaleOptimizerV3); fit inside
    sok.OptimizerScope trains as the Keras Embedding model does, steps whose
    scaled gradients overflow skipped alike. A custom loop with the
    LossScaleOptimizer too."""
    results = _run(MIXED_SCRIPT)
    assert len(results) == 12, results
    assert not _failures(results, _within(1e-5)), "\n".join(_failures(results, _within(1e-5)))


REFUSAL_SCRIPT = r'''
report("keras_major_version", value=sok.compat.KERAS_MAJOR_VERSION)

KEYS = tf.constant([5, 9, 11], tf.int64)


def outside_scope(optname, loss_scale):
    """A tf.keras optimizer's own apply_gradients on a DynamicVariable,
    outside sok.OptimizerScope."""
    opt = make_opt(optname)
    if loss_scale:
        opt = K.mixed_precision.LossScaleOptimizer(opt)
    var = sok.DynamicVariable(dimension=3, name="my_dynamic_table")
    w = tf.Variable([[1.0], [2.0], [3.0]])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.matmul(tf.nn.embedding_lookup(var, KEYS), w))
    opt.apply_gradients(zip(tape.gradient(loss, [var, w]), [var, w]))
    return dict(accepted=True)


for optname in ("new.SGD", "new.Adam", "legacy.SGD", "legacy.Adam"):
    attempt("outside_scope/" + optname, lambda: outside_scope(optname, False))
    attempt("outside_scope_loss_scale/" + optname, lambda: outside_scope(optname, True))


class WithTable(K.Model):
    def __init__(self, table):
        super().__init__()
        self.table = table
        self.dense = K.layers.Dense(1)

    def call(self, ids):
        return self.dense(sok.lookup_sparse(self.table, tf.RaggedTensor.from_tensor(ids),
                                            combiners="sum"))


def fit_outside_scope(optname):
    model = WithTable(sok.DynamicVariable(dimension=3, name="my_dynamic_table"))
    model.compile(optimizer=make_opt(optname), loss="mse")
    model.fit(np.array([[1, 2], [3, 4]], np.int64), np.ones((2, 1), np.float32), verbose=0)
    return dict(accepted=True)


for optname in ("legacy.SGD", "new.SGD"):
    attempt("fit_outside_scope/" + optname, lambda: fit_outside_scope(optname))


def wrap_loss_scale(family):
    sok.OptimizerWrapper(K.mixed_precision.LossScaleOptimizer(make_opt(family + ".Adam")))
    return dict(accepted=True)


for family in ("legacy", "new"):
    attempt("wrapper_of_loss_scale/" + family, lambda: wrap_loss_scale(family))
'''


@pytest.fixture(scope="module")
def refusals():
    return _run(REFUSAL_SCRIPT)


def test_sok_graph_sees_tf_keras_as_keras_2(refusals):
    """With TF_USE_LEGACY_KERAS=1, tf.keras is tf_keras: Keras 2. sok_graph
    chooses its Keras 2 behaviour by compat.KERAS_MAJOR_VERSION (the
    dynamic-table refusals of Keras 2's optimizers, the Keras 3 patches it
    leaves out), which must say 2 here."""
    assert refusals["keras_major_version"] == {"value": 2}


def _refused_naming_the_table(value):
    return (value.get("error") == "NoDenseValueError"
            and "my_dynamic_table" in value.get("message", "")
            and "OptimizerScope" in value.get("message", ""))


@pytest.mark.parametrize("optname", ["new.SGD", "new.Adam", "legacy.SGD", "legacy.Adam"])
def test_a_tf_keras_optimizer_outside_optimizer_scope_refuses_a_dynamic_table_by_name(
        refusals, optname):
    """A tf.keras (tf_keras) optimizer's apply_gradients on a DynamicVariable
    outside sok.OptimizerScope cannot update it: the error must name the
    table and the way out (the scope, or sok.OptimizerWrapper), as it does on
    Keras 2 in TF 2.15 — not TensorFlow's "Trying to access a handle's
    resource using the wrong type ... TableResource" (legacy SGD) or
    "Cannot convert a partially known TensorShape (None, 3)" (newer ones)."""
    value = refusals["outside_scope/" + optname]
    assert _refused_naming_the_table(value), value


@pytest.mark.parametrize("optname", ["new.SGD", "new.Adam", "legacy.SGD", "legacy.Adam"])
def test_a_loss_scale_optimizer_outside_optimizer_scope_refuses_a_dynamic_table_by_name(
        refusals, optname):
    """The same through tf.keras.mixed_precision.LossScaleOptimizer (Keras
    2's new one failed with a KeyError telling to "use legacy optimizer")."""
    value = refusals["outside_scope_loss_scale/" + optname]
    assert _refused_naming_the_table(value), value


@pytest.mark.parametrize("optname", ["legacy.SGD", "new.SGD"])
def test_fit_outside_optimizer_scope_refuses_a_dynamic_table_by_name(refusals, optname):
    """model.fit of a tf_keras model holding a DynamicVariable, compiled
    outside sok.OptimizerScope: refused naming the table (StagingError and
    friends may wrap it, but the message must say what to do)."""
    value = refusals["fit_outside_scope/" + optname]
    assert "accepted" not in value, value
    assert "my_dynamic_table" in value["message"] and "OptimizerScope" in value["message"], value


@pytest.mark.parametrize("family", ["legacy", "new"])
def test_optimizer_wrapper_refuses_a_loss_scale_optimizer_saying_what_to_do(refusals, family):
    """sok.OptimizerWrapper(LossScaleOptimizer(...)): a TypeError naming
    mixed precision's LossScaleOptimizer and inner_optimizer (the legacy
    one failed with AttributeError "'LossScaleOptimizer' object has no
    attribute '_hypers_created'")."""
    value = refusals["wrapper_of_loss_scale/" + family]
    assert value.get("error") == "TypeError", value
    assert "LossScaleOptimizer" in value["message"] and "inner_optimizer" in value["message"], \
        value


def test_init_gives_tf_keras_legacy_optimizers_as_sok_does():
    """sok.init() (use_legacy_optimizer=True, SOK's default) makes
    tf.keras.optimizers the legacy OptimizerV2 ones where tf.keras has them,
    which tf_keras does; the rest of the module stays (schedules)."""
    results = _run(r'''
sok.init(comm_tool="none")
report("rebound", adam=[c.__name__ for c in K.optimizers.Adam.__mro__],
       schedules=hasattr(K.optimizers, "schedules"))
''')
    assert "OptimizerV2" in results["rebound"]["adam"], results
    assert results["rebound"]["schedules"], results


# ------------- tf_keras imported explicitly under Keras 3 (no env variable)

EXPLICIT_SCRIPT = r'''
V, D = 4, 2
rng = np.random.RandomState(5)
INIT = rng.uniform(-0.5, 0.5, (V, D)).astype(np.float32)
TARGET = rng.uniform(-1, 1, (2, D)).astype(np.float32)
IDS = [[0, 1], [2, 3]]


def schedule_case(optname, dynamic):
    def opt():
        return make_opt(optname, learning_rate=K.optimizers.schedules.ExponentialDecay(
            0.5, decay_steps=1, decay_rate=0.5))
    ref, ref_opt = tf.Variable(INIT), opt()
    if dynamic:
        var = sok.DynamicVariable(dimension=D)
        sok.assign(var, tf.range(V, dtype=tf.int64), tf.constant(INIT))
    else:
        var = sok.Variable(INIT.copy())
    wrapper = sok.OptimizerWrapper(opt())
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(
                sok.lookup_sparse(var, tf.ragged.constant(IDS, dtype=tf.int64),
                                  combiners="sum") - TARGET))
        wrapper.apply_gradients(zip(tape.gradient(loss, [var]), [var]))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(
                tf.reduce_sum(tf.gather(ref, tf.constant(IDS)), 1) - TARGET))
        ref_opt.apply_gradients(zip(tape.gradient(loss, [ref]), [ref]))
    rows = (tf.nn.embedding_lookup(var, tf.range(V, dtype=tf.int64)).numpy() if dynamic
            else var.numpy())
    return dict(diff_rows=maxdiff(rows, ref.numpy()), moved=maxdiff(ref.numpy(), INIT))


for optname in ("legacy.SGD", "legacy.Adagrad", "new.SGD"):
    for dynamic in (False, True):
        key = "schedule/%s/%s" % (optname, "dynamic" if dynamic else "static")
        attempt(key, lambda: schedule_case(optname, dynamic))



def outside_scope(optname):
    opt = make_opt(optname)
    var = sok.DynamicVariable(dimension=3, name="my_dynamic_table")
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(var, tf.constant([5, 9], tf.int64)))
    opt.apply_gradients(zip(tape.gradient(loss, [var]), [var]))
    return dict(accepted=True)


for optname in ("legacy.SGD", "new.SGD"):
    attempt("outside_scope/" + optname, lambda: outside_scope(optname))
'''


@pytest.fixture(scope="module")
def explicit_tf_keras():
    return _run(EXPLICIT_SCRIPT, legacy=False)


@pytest.mark.parametrize("case", ["legacy.SGD/static", "legacy.SGD/dynamic",
                                  "legacy.Adagrad/static", "legacy.Adagrad/dynamic",
                                  "new.SGD/static", "new.SGD/dynamic"])
def test_wrapper_takes_a_tf_keras_learning_rate_schedule_under_keras_3(explicit_tf_keras, case):
    """Without TF_USE_LEGACY_KERAS (tf.keras is Keras 3), SOK scripts on
    TF >= 2.17 use tf_keras.optimizers.legacy.* explicitly (docs/sok_compat.md),
    with tf_keras' own learning-rate schedules. sok.OptimizerWrapper must
    follow the schedule as the optimizer does on a tf.Variable; it refused
    it ("learning_rate must be a number, a tensor or a variable (or a
    callable or schedule giving one)"): the schedule is tf_keras', not
    tf.keras' (Keras 3's) LearningRateSchedule."""
    value = explicit_tf_keras["schedule/" + case]
    reason = _within(1e-6)(case, value)
    assert reason is None, reason


@pytest.mark.parametrize("optname", ["legacy.SGD", "new.SGD"])
def test_an_explicit_tf_keras_optimizer_outside_scope_refuses_a_dynamic_table_by_name(
        explicit_tf_keras, optname):
    """Under Keras 3 with tf_keras imported explicitly (after sok_graph), a
    tf_keras optimizer's own apply_gradients on a DynamicVariable outside
    the scope: refused naming the table and the way out, as on Keras 2 (the
    refusals are installed again when a table is made)."""
    value = explicit_tf_keras["outside_scope/" + optname]
    assert _refused_naming_the_table(value), value
