"""sok.CollectiveStrategy (DeepRec's synchronous-training front end).

Single process: engine selection, world_size/rank, embedding_scope making one
sok.Variable from a partitioned get_variable, lookups routed to sok for sok
variables and to TensorFlow for everything else (compared with TensorFlow's
own results), the patches undone when the scopes close, the estimator (TF
versions with tf.estimator) against a plain-TensorFlow estimator.

Two workers under the launcher (Horovod): DeepRec's MonitoredTrainingSession
example, and training with native Adagrad / Ftrl through
tf.nn.embedding_lookup(_sparse) and feature columns compared with plain
TensorFlow in one process (a PartitionedVariable table), and the exported
SavedModel served by plain TensorFlow.
"""

import os
import re
import sys

import numpy as np
import pytest
import tensorflow as tf

import sok_graph as sok
from sok_graph.collective_strategy import lookups as cs_lookups
from sok_graph import context
from multiworker.launching import launch, needs_horovod, run_process

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The seed's example itself (examples_tf1/collective_strategy.py) runs with
# the other examples, against the installed package: tests/examples.
WORKER = os.path.join(HERE, "multiworker", "collective_worker.py")

HAVE_ESTIMATOR = hasattr(tf, "estimator") and hasattr(tf.estimator, "Estimator")


def _run(argv, timeout=300, **env):
    return run_process(argv, timeout, cwd=HERE, **env)


def _launch(n, script, args=(), timeout=300):
    return launch(n, script, args, timeout)


def _rel_sq_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sum((a - b) ** 2) / max(np.sum(b ** 2), 1e-30))


@pytest.fixture
def none_engine(monkeypatch):
    monkeypatch.setenv("COLLECTIVE_STRATEGY", "none")
    yield
    context.reset()


# ------------------------------------------------------------ single process


@pytest.mark.parametrize("value", ["hb", "horovod", "mpi"])
def test_unknown_engine_names_variable_value_and_choices(monkeypatch, value):
    monkeypatch.setenv("COLLECTIVE_STRATEGY", value)
    with pytest.raises(ValueError) as e:
        sok.CollectiveStrategy()
    text = str(e.value)
    assert "COLLECTIVE_STRATEGY" in text and repr(value) in text
    assert "'sok'" in text and "'none'" in text


def test_world_size_and_rank_single_process(none_engine):
    s = sok.CollectiveStrategy()
    assert s.engine == "none"
    assert s.world_size() == 1 and s.rank() == 0
    # DeepRec's estimator example hands strategy.world_size uncalled to the partitioner.
    assert s.world_size == 1 and int(s.world_size) == 1 and s.rank == 0
    tf.compat.v1.fixed_size_partitioner(s.world_size)  # accepted as an int


def test_default_engine_is_sok_and_one_process_without_launcher(monkeypatch):
    monkeypatch.delenv("COLLECTIVE_STRATEGY", raising=False)
    for key in ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(key, raising=False)
    try:
        s = sok.CollectiveStrategy()
        assert s.engine == "sok" and s.world_size() == 1 and s.rank() == 0
    finally:
        context.reset()


def _table_values(rows, dim):
    return (np.arange(rows * dim, dtype=np.float32).reshape(rows, dim) % 11) / 10 - 0.5


def test_embedding_scope_makes_one_sok_variable(none_engine):
    s = sok.CollectiveStrategy()
    values = _table_values(30, 4)

    def init(shape, dtype=None, partition_info=None):
        assert partition_info is None and list(shape) == [30, 4]  # the whole table
        return tf.constant(values, dtype=dtype)

    with s.scope(), tf.Graph().as_default():
        with s.embedding_scope(), tf.compat.v1.variable_scope(
                "emb", partitioner=tf.compat.v1.fixed_size_partitioner(3)):
            var = tf.compat.v1.get_variable("t", shape=(30, 4), initializer=init)
            bias = tf.compat.v1.get_variable("bias", shape=(6,))  # 1-D: TF's own
            with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), reuse=True):
                again = tf.compat.v1.get_variable("t", shape=(30, 4), initializer=init)
            with pytest.raises(ValueError, match="already exists"):
                tf.compat.v1.get_variable("t", shape=(30, 4), initializer=init)
        assert isinstance(var, sok.Variable) and again is var
        assert var.op.name == "emb/t" and var.global_shape.as_list() == [30, 4]
        assert not isinstance(bias, sok.Variable)
        assert var in tf.compat.v1.trainable_variables()
        # Outside embedding_scope a partitioner gives TensorFlow's PartitionedVariable.
        with tf.compat.v1.variable_scope(
                "plain", partitioner=tf.compat.v1.fixed_size_partitioner(3)):
            plain = tf.compat.v1.get_variable("t", shape=(30, 4))
        assert type(plain).__name__ == "PartitionedVariable"
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            np.testing.assert_array_equal(sess.run(var), values)


def test_lookups_route_sok_variables_and_leave_others_to_tensorflow(none_engine):
    s = sok.CollectiveStrategy()
    values = _table_values(20, 3)
    ids = np.array([[0, 5], [19, 5], [7, 7]], np.int64)
    sp = tf.compat.v1.SparseTensorValue(np.array([[0, 0], [0, 1], [1, 0], [2, 0], [2, 1]]),
                                        np.array([3, 4, 9, 9, 0], np.int64), [3, 2])
    weights = tf.compat.v1.SparseTensorValue(sp.indices, np.array([1, 2, .5, 1, 3], np.float32),
                                             [3, 2])
    calls = []

    def spy(real):
        def call(*args, **kwargs):
            calls.append(real.__name__)
            return real(*args, **kwargs)
        return call

    with s.scope(), tf.Graph().as_default():
        with s.embedding_scope():
            table = tf.compat.v1.get_variable(
                "table", shape=values.shape, initializer=tf.constant_initializer(values),
                partitioner=tf.compat.v1.fixed_size_partitioner(2))
        # The reference is the same partitioned variable in plain TensorFlow:
        # TF 1's tf.nn lookups and every compat.v1 one default to
        # partition_strategy='mod', where id i is row i // 2 of part i % 2.
        def parts_of_values(shape, dtype=None, partition_info=None):
            start = partition_info.var_offset[0]
            return tf.constant(values[start:start + shape[0]], dtype=dtype)

        plain = tf.compat.v1.get_variable(
            "plain", shape=values.shape, initializer=parts_of_values,
            partitioner=tf.compat.v1.fixed_size_partitioner(2))
        assert isinstance(table, sok.Variable) and not isinstance(plain, sok.Variable)
        sp, weights = tf.SparseTensor.from_value(sp), tf.SparseTensor.from_value(weights)
        old = cs_lookups.lookup_sparse, cs_lookups.all2all_dense_embedding
        cs_lookups.lookup_sparse, cs_lookups.all2all_dense_embedding = spy(old[0]), spy(old[1])
        try:
            got = [tf.nn.embedding_lookup(table, ids),
                   tf.compat.v1.nn.embedding_lookup(table, ids),
                   tf.nn.embedding_lookup(table, ids, max_norm=0.5),
                   tf.nn.embedding_lookup_sparse(table, sp, weights, combiner="sqrtn"),
                   tf.compat.v1.nn.embedding_lookup_sparse(table, sp, None),
                   tf.nn.safe_embedding_lookup_sparse(table, sp, weights, combiner="sum"),
                   tf.compat.v1.nn.safe_embedding_lookup_sparse([table], sp, None),
                   tf.compat.v1.nn.embedding_lookup(table, ids, partition_strategy="div"),
                   tf.compat.v1.nn.embedding_lookup_sparse(table, sp, None,
                                                           partition_strategy="div")]
            want = [tf.nn.embedding_lookup(plain, ids),
                    tf.compat.v1.nn.embedding_lookup(plain, ids),
                    tf.nn.embedding_lookup(plain, ids, max_norm=0.5),
                    tf.nn.embedding_lookup_sparse(plain, sp, weights, combiner="sqrtn"),
                    tf.compat.v1.nn.embedding_lookup_sparse(plain, sp, None),
                    tf.nn.safe_embedding_lookup_sparse(plain, sp, weights, combiner="sum"),
                    tf.compat.v1.nn.safe_embedding_lookup_sparse(plain, sp, None),
                    tf.compat.v1.nn.embedding_lookup(plain, ids, partition_strategy="div"),
                    tf.compat.v1.nn.embedding_lookup_sparse(plain, sp, None,
                                                            partition_strategy="div")]
        finally:
            cs_lookups.lookup_sparse, cs_lookups.all2all_dense_embedding = old
        # Every lookup on the sok table went to sok (the first two to
        # all2all_dense_embedding), none on the plain one (TF's own).
        assert calls == (["all2all_dense_embedding"] * 2 + ["lookup_sparse"] * 5
                         + ["all2all_dense_embedding", "lookup_sparse"]), calls
        grad = tf.gradients(tf.reduce_sum(got[3]), [table])[0]
        assert isinstance(grad, tf.IndexedSlices)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            got, want = sess.run([got, want])
    assert len(got) == len(want) == 9
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=f"lookup {i}")


@pytest.mark.parametrize("bad", [21, 20, -1])
def test_mod_lookup_rejects_ids_outside_the_table(none_engine, bad):
    """With partition_strategy='mod' over 3 parts of a 20-row table, id 21
    would land on part 0's row 7 if it were translated: ids outside
    [0, rows) stay as they are and are rejected, naming the table."""
    s = sok.CollectiveStrategy()
    with s.scope(), tf.Graph().as_default():
        with s.embedding_scope():
            table = tf.compat.v1.get_variable(
                "table", shape=(20, 3), initializer=tf.compat.v1.zeros_initializer(),
                partitioner=tf.compat.v1.fixed_size_partitioner(3))
        out = tf.compat.v1.nn.embedding_lookup(table, tf.constant([1, bad], tf.int64),
                                               partition_strategy="mod")
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match=rf"table.*must be in \[0, 20\).*got {bad}"):
                sess.run(out)


def test_scope_patches_are_undone(none_engine):
    from tensorflow.python.ops import embedding_ops, variable_scope
    from tensorflow.python.training import monitored_session, optimizer

    before = (tf.nn.embedding_lookup, tf.compat.v1.nn.embedding_lookup_sparse,
              embedding_ops.safe_embedding_lookup_sparse, optimizer.Optimizer.compute_gradients,
              monitored_session.MonitoredTrainingSession,
              tf.compat.v1.train.MonitoredTrainingSession,
              variable_scope._VariableStore.get_variable)
    s = sok.CollectiveStrategy()
    with s.scope():
        assert tf.nn.embedding_lookup is not before[0]
        assert optimizer.Optimizer.compute_gradients is not before[3]
        assert variable_scope._VariableStore.get_variable is before[6]
        with s.embedding_scope(), s.scope():  # nesting keeps the patches in place
            assert variable_scope._VariableStore.get_variable is not before[6]
        assert variable_scope._VariableStore.get_variable is before[6]
        assert tf.nn.embedding_lookup is not before[0]
    with pytest.raises(RuntimeError):
        with s.scope():
            raise RuntimeError("a failure inside the scope")
    after = (tf.nn.embedding_lookup, tf.compat.v1.nn.embedding_lookup_sparse,
             embedding_ops.safe_embedding_lookup_sparse, optimizer.Optimizer.compute_gradients,
             monitored_session.MonitoredTrainingSession,
             tf.compat.v1.train.MonitoredTrainingSession,
             variable_scope._VariableStore.get_variable)
    assert all(a is b for a, b in zip(before, after))


# ------------------------------------------------------------ estimator

ROWS, DIM = 40, 4


def _estimator_input():
    rng = np.random.default_rng(3)
    ids = rng.integers(0, ROWS, size=(64, 2)).astype(np.int64)
    labels = rng.integers(0, 2, size=(64, 1)).astype(np.float32)

    def input_fn():
        ds = tf.data.Dataset.from_tensor_slices(({"f": ids}, labels))
        return ds.batch(16)
    return input_fn


def _estimator_model_fn(strategy):
    def init(shape, dtype=None, partition_info=None):
        full = _table_values(ROWS, DIM)
        start = 0 if partition_info is None else partition_info.var_offset[0]
        return tf.constant(full[start:start + shape[0]], dtype=dtype)

    def model_fn(features, labels, mode, params):
        column = tf.feature_column.embedding_column(
            tf.feature_column.categorical_column_with_identity("f", ROWS), DIM,
            initializer=init)
        embedding = strategy.embedding_scope() if strategy else _null()
        with embedding, tf.compat.v1.variable_scope(
                "embedding", partitioner=tf.compat.v1.fixed_size_partitioner(
                    strategy.world_size if strategy else 2)):
            emb = tf.compat.v1.feature_column.input_layer(features, [column])
        w = tf.compat.v1.get_variable("w", initializer=tf.constant(
            np.linspace(-1, 1, DIM, dtype=np.float32).reshape(DIM, 1)))
        logits = tf.matmul(emb, w)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                      logits=logits))
        step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.train.AdagradOptimizer(0.5).minimize(loss, global_step=step)
        return tf.estimator.EstimatorSpec(mode=mode, loss=loss, train_op=train_op)
    return model_fn


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.skipif(not HAVE_ESTIMATOR,
                    reason=f"TensorFlow {tf.__version__} has no tf.estimator (removed in 2.16)")
def test_estimator_trains_as_plain_tensorflow(none_engine, tmp_path, monkeypatch):
    # The launcher's TF_CONFIG lists workers only, which RunConfig rejects.
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["localhost:1", "localhost:2"]}, '
                                    '"task": {"type": "worker", "index": 0}}')
    s = sok.CollectiveStrategy()
    with s.scope():
        est = s.estimator(_estimator_model_fn(s), model_dir=str(tmp_path / "sok"))
    assert os.environ["TF_CONFIG"].startswith('{"cluster"')  # put back
    est.train(_estimator_input(), max_steps=4)
    monkeypatch.delenv("TF_CONFIG")
    ref = tf.estimator.Estimator(_estimator_model_fn(None), model_dir=str(tmp_path / "tf"))
    ref.train(_estimator_input(), max_steps=4)
    name = "embedding/input_layer/f_embedding/embedding_weights"
    assert name in est.get_variable_names()
    got, want = est.get_variable_value(name), ref.get_variable_value(name)
    assert got.shape == (ROWS, DIM)
    assert _rel_sq_err(got, want) < 1e-10, _rel_sq_err(got, want)
    assert _rel_sq_err(est.get_variable_value("w"), ref.get_variable_value("w")) < 1e-10
    assert est.get_variable_value("global_step") == 4


@pytest.mark.skipif(HAVE_ESTIMATOR, reason="this TensorFlow has tf.estimator")
def test_estimator_missing_is_a_clear_error(none_engine):
    with pytest.raises(NotImplementedError, match=tf.__version__):
        sok.CollectiveStrategy().estimator(lambda features, labels, mode: None)


# ------------------------------------------------------------ two workers


def _merged(directory, world):
    parts = [dict(np.load(os.path.join(directory, f"rank{r}.npz"))) for r in range(world)]
    keys = np.concatenate([p["keys"] for p in parts])
    assert len(np.unique(keys)) == len(keys), "a row is held by two workers"
    rows = np.concatenate([p["rows"] for p in parts])[np.argsort(keys)]
    for p in parts[1:]:  # data-parallel weights: the same everywhere (broadcast + allreduce)
        np.testing.assert_array_equal(p["w"], parts[0]["w"])
        np.testing.assert_array_equal(p["b"], parts[0]["b"])
    losses = np.mean([p["losses"] for p in parts], 0)  # equal local batches
    return {"rows": rows, "w": parts[0]["w"], "b": parts[0]["b"], "losses": losses}


@needs_horovod
@pytest.mark.parametrize("api,opt", [
    ("lookup", "adagrad"), ("fc", "ftrl")])
def test_two_workers_train_as_one_process(tmp_path, api, opt):
    args = ["--api", api, "--opt", opt]
    export = str(tmp_path / "saved_model") if api == "lookup" else None
    _launch(2, WORKER, ["--mode", "strategy", "--out", str(tmp_path / "two")] + args
            + (["--export", export] if export else []))
    _run([sys.executable, WORKER, "--mode", "plain", "--out", str(tmp_path / "ref")] + args)
    got, want = _merged(tmp_path / "two", 2), _merged(tmp_path / "ref", 1)
    for k in ("rows", "w", "b", "losses"):
        err = _rel_sq_err(got[k], want[k])
        assert err < 1e-6, f"{api}/{opt}: {k} differs from one process (rel. sq. error {err:.3g})"
    if export:
        _check_saved_model(export, want)


def test_an_export_as_text_is_checked_and_serves(tmp_path):
    """export_saved_model(as_text=True), as tf.estimator's exporters offer
    it, writes saved_model.pbtxt: the check that no sok op is left read
    only saved_model.pb and failed the export with TensorFlow's "not
    found". One process (engine "none"); the export serves in plain
    TensorFlow as the binary one does."""
    export = str(tmp_path / "saved_model")
    _run([sys.executable, WORKER, "--mode", "strategy", "--api", "lookup", "--opt", "adagrad",
          "--out", str(tmp_path / "one"), "--export", export, "--as_text"],
         COLLECTIVE_STRATEGY="none")
    assert os.path.exists(os.path.join(export, "saved_model.pbtxt"))
    assert not os.path.exists(os.path.join(export, "saved_model.pb"))
    _check_saved_model(export, _merged(tmp_path / "one", 1))


def _check_saved_model(export, want):
    """The SavedModel holds the whole table and serves in plain TensorFlow."""
    ids = np.array([3, 0, 7], np.int64)  # sample 0: ids 3, 0; sample 1: none; sample 2: 7
    single = np.array([49, 1, 2], np.int64)
    with tf.Graph().as_default() as g, tf.compat.v1.Session(graph=g) as sess:
        meta = tf.compat.v1.saved_model.load(sess, [tf.saved_model.SERVING], export)
        assert not [n.op for n in meta.graph_def.node if "Sok" in n.op]
        table = [v for v in tf.compat.v1.global_variables() if v.op.name == "emb/table"]
        assert len(table) == 1 and table[0].shape == want["rows"].shape, table
        table = sess.run(table[0])
        np.testing.assert_allclose(table, want["rows"], rtol=1e-5, atol=1e-6)
        sig = meta.signature_def["serving_default"]
        sp = sig.inputs["ids"].coo_sparse
        feed = {g.get_tensor_by_name(sp.indices_tensor_name):
                np.array([[0, 0], [0, 1], [2, 0]], np.int64),
                g.get_tensor_by_name(sp.values_tensor_name): ids,
                g.get_tensor_by_name(sp.dense_shape_tensor_name): np.array([3, 3], np.int64),
                g.get_tensor_by_name(sig.inputs["single"].name): single}
        logits = sess.run(g.get_tensor_by_name(sig.outputs["logits"].name), feed)
    rows = want["rows"]
    if sok.compat.IS_TF1:
        # The worker's tf.nn lookups are TF 1's, partition_strategy='mod' over
        # its 3 parts (17, 17, 16 rows): id i is row i // 3 of part i % 3.
        offsets = np.array([0, 17, 34])
        rows = rows[offsets[np.arange(len(rows)) % 3] + np.arange(len(rows)) // 3]
    mean = np.stack([rows[[3, 0]].mean(0), np.zeros(rows.shape[1]), rows[[7]].mean(0)])
    x = np.concatenate([mean, rows[single]], 1)
    np.testing.assert_allclose(logits, x @ want["w"] + want["b"], rtol=1e-5, atol=1e-6)


def _one_variable_signature(name):
    """A serving graph of one variable `name` ([1, 2]) and y = x @ it."""
    def build():
        x = tf.compat.v1.placeholder(tf.float32, [None, 1], name="x")
        v = tf.compat.v1.get_variable(name, initializer=tf.constant([[0.0, 0.0]]))
        return {"serving_default": tf.compat.v1.saved_model.predict_signature_def(
            {"x": x}, {"y": tf.matmul(x, v)})}
    return build


def _served(export):
    with tf.Graph().as_default() as g, tf.compat.v1.Session(graph=g) as sess:
        tf.compat.v1.saved_model.load(sess, [tf.saved_model.SERVING], export)
        return sess.run(tf.compat.v1.global_variables())


def test_export_saved_model_refuses_a_variable_without_a_trained_value(none_engine, tmp_path,
                                                                       monkeypatch):
    """A serving graph whose variable the training graph does not have (a
    renamed or misspelt variable) was exported with the variable's initial
    value, and only a warning logged: a model that serves untrained weights.
    It is a ValueError naming the variable now, nothing written. Bad
    arguments are named errors before anything is read: savedmodel_dir as
    bytes is a path (it made a directory "b'..." in the current directory
    before failing with "can't concat str to bytes"), None and "" are
    refused, as are a session that is not one, flags that are not bools
    (as_text="no" wrote text) and assets_extra names leaving assets.extra."""
    monkeypatch.chdir(tmp_path)
    s = sok.CollectiveStrategy()
    trained = np.array([[5.0, 6.0]], np.float32)
    with s.scope(), tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=tf.constant([[1.0, 2.0]]))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(w.assign(trained))
            out = str(tmp_path / "renamed")
            with pytest.raises(ValueError, match=r"no value for: \['w_other'\]"):
                s.export_saved_model(out, signature_def_fn=_one_variable_signature("w_other"),
                                     session=sess)
            assert not os.path.exists(out)
            good = _one_variable_signature("w")
            bad = [(dict(savedmodel_dir=None), TypeError, "savedmodel_dir must be a str"),
                   (dict(savedmodel_dir=""), ValueError, "savedmodel_dir must name a directory"),
                   (dict(session="sess"), TypeError, "session must be a tf.compat.v1.Session"),
                   (dict(as_text="no"), TypeError, "as_text must be True or False"),
                   (dict(clear_devices=None), TypeError, "clear_devices must be True or False"),
                   (dict(assets_extra={"../up": __file__}), ValueError, "'../up' must be a rel"),
                   (dict(assets_extra={"a": str(tmp_path / "none")}), ValueError,
                    "does not exist")]
            for kwargs, exc, words in bad:
                args = dict(savedmodel_dir=str(tmp_path / "bad"), signature_def_fn=good,
                            session=sess)
                args.update(kwargs)
                with pytest.raises(exc, match=re.escape(words)):
                    s.export_saved_model(**args)
            assert sorted(os.listdir(tmp_path)) == []
            export = str(tmp_path / "served")
            assert s.export_saved_model(os.fsencode(export), signature_def_fn=good,
                                        session=sess) == export
    assert sorted(os.listdir(tmp_path)) == ["served"]
    np.testing.assert_array_equal(_served(export)[0], trained)
