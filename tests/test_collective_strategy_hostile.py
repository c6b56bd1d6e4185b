"""The CollectiveStrategy (single process) as a hostile user drives it:
exports of dynamic tables, TensorFlow's safe lookup with negative weights,
its estimator's directories. Each test is one defect, checked against an
independent reference (numpy, TensorFlow's own ops, what the arguments
were)."""

import os

import numpy as np
import pytest
import tensorflow as tf

import sok_graph as sok
from sok_graph import context


@pytest.fixture
def none_engine(monkeypatch):
    monkeypatch.setenv("COLLECTIVE_STRATEGY", "none")
    yield
    context.reset()


# ------------------------------------------------ CollectiveStrategy export

_TRAIN_IDS = np.array([[1, 2], [2, 5]], np.int64)
_SERVE_IDS = np.array([[1, 5], [2, 2]], np.int64)
_LR = 0.1


def _dynamic_model():
    """A DynamicVariable (rows start at 0.5) read by tf.nn.embedding_lookup,
    as DeepRec models read their tables under the strategy's scope."""
    ids = tf.compat.v1.placeholder(tf.int64, [None, 2], name="ids")
    table = sok.DynamicVariable(2, initializer=0.5, name="dyn")
    pred = tf.reduce_sum(tf.nn.embedding_lookup(table, ids), [1, 2])
    return ids, pred


def _served_reference():
    """One SGD step of loss = sum(pred) on _TRAIN_IDS: every occurrence of a
    key subtracts lr from each of its row's values (numpy)."""
    rows = {}
    for k in _TRAIN_IDS.ravel():
        rows[int(k)] = rows.get(int(k), 0.5) - _LR
    return np.array([sum(2 * rows[int(k)] for k in sample) for sample in _SERVE_IDS])


def _signature():
    ids, pred = _dynamic_model()
    return {"serving_default": tf.compat.v1.saved_model.predict_signature_def(
        {"ids": ids}, {"p": pred})}


def _serve(export):
    with tf.Graph().as_default() as g, tf.compat.v1.Session(graph=g) as sess:
        meta = tf.compat.v1.saved_model.load(sess, [tf.saved_model.SERVING], export)
        sig = meta.signature_def["serving_default"]
        return sess.run(sig.outputs["p"].name, {sig.inputs["ids"].name: _SERVE_IDS})


def _train_dynamic_model(strategy, then):
    with strategy.scope(), tf.Graph().as_default():
        ids, pred = _dynamic_model()
        train = tf.compat.v1.train.GradientDescentOptimizer(_LR).minimize(tf.reduce_sum(pred))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train, {ids: _TRAIN_IDS})
            return then(sess)


def test_strategy_export_of_a_dynamic_table_read_by_tf_nn_embedding_lookup(none_engine,
                                                                           tmp_path):
    """Under strategy.scope() tf.nn.embedding_lookup on a sok.DynamicVariable
    trains (routed to sok), but export_saved_model(session=...) rebuilt the
    same model in serving mode, where the table is a serving table the
    routing did not recognise: TensorFlow's own lookup got it and failed with
    "Failed to convert ... DynamicTable ... to Tensor". The export must serve
    the trained rows."""
    s = sok.CollectiveStrategy()
    export = str(tmp_path / "served")

    def export_it(sess):
        return s.export_saved_model(export, signature_def_fn=_signature, session=sess)

    assert _train_dynamic_model(s, export_it) == export
    np.testing.assert_allclose(_serve(export), _served_reference(), rtol=1e-6)


def test_strategy_export_from_checkpoint_dir_with_a_dynamic_table(none_engine, tmp_path):
    """export_saved_model(checkpoint_dir=...) in a graph holding a
    sok.DynamicVariable failed with AttributeError: 'DynamicVariable' object
    has no attribute 'global_shape' (_known_tables took every sok table for
    a static one). Either the export serves the trained rows, or it is a
    clear error naming the table (and the way that works: session=)."""
    s = sok.CollectiveStrategy()
    ckpt_dir = str(tmp_path / "ckpt")
    export = str(tmp_path / "served")

    def save(sess):
        tf.compat.v1.train.Saver().save(sess, os.path.join(ckpt_dir, "model"))
        return s.export_saved_model(export, signature_def_fn=_signature,
                                    checkpoint_dir=ckpt_dir)

    try:
        written = _train_dynamic_model(s, save)
    except AttributeError as e:
        pytest.fail(f"an unclear AttributeError: {e}")
    except (ValueError, NotImplementedError) as e:
        assert "dyn" in str(e) and "session" in str(e), str(e)
        assert not os.path.exists(export)
        return
    assert written == export
    np.testing.assert_allclose(_serve(export), _served_reference(), rtol=1e-6)


# ------------------------------------------------ CollectiveStrategy lookups

def test_safe_lookup_with_sum_keeps_negative_weights_as_tensorflow(none_engine):
    """tf.nn.safe_embedding_lookup_sparse(combiner="sum") prunes only
    negative ids: TensorFlow (1.15 to 2.21) keeps non-positive weights with
    "sum" (it drops them for "mean" and "sqrtn"). Routed to sok under the
    strategy's scope, weights <= 0 were dropped as well, so a sample with
    weights [-1, 2] lost its first row, and a sample of only negative
    weights came out as zeros, silently (weighted_categorical_column with
    combiner="sum" trains on the wrong rows)."""
    rows = (np.arange(18, dtype=np.float32).reshape(6, 3) % 5) / 4 - 0.4
    indices = np.array([[0, 0], [0, 1], [1, 0], [2, 0], [2, 1]], np.int64)
    ids = np.array([2, 4, 1, 3, -1], np.int64)
    weights = np.array([-1.0, 2.0, -0.5, 0.0, 3.0], np.float32)
    # TensorFlow's "sum": ids < 0 dropped, every weight kept.
    want = np.stack([-1.0 * rows[2] + 2.0 * rows[4], -0.5 * rows[1], 0.0 * rows[3]])
    s = sok.CollectiveStrategy()
    with s.scope(), tf.Graph().as_default():
        with s.embedding_scope():
            table = tf.compat.v1.get_variable(
                "table", shape=rows.shape, initializer=tf.constant_initializer(rows),
                partitioner=tf.compat.v1.fixed_size_partitioner(1 if sok.compat.IS_TF1 else 2))
        plain = tf.compat.v1.get_variable("plain", initializer=tf.constant(rows))
        sp_ids = tf.SparseTensor(indices, ids, [3, 2])
        sp_w = tf.SparseTensor(indices, weights, [3, 2])
        got = tf.nn.safe_embedding_lookup_sparse(table, sp_ids, sp_w, combiner="sum")
        ref = tf.nn.safe_embedding_lookup_sparse(plain, sp_ids, sp_w, combiner="sum")
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            got, ref = sess.run([got, ref])
    np.testing.assert_allclose(ref, want, rtol=1e-6, atol=1e-7)  # TensorFlow's own
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


# ------------------------------------------------ CollectiveStrategy.estimator

HAVE_ESTIMATOR = hasattr(tf, "estimator") and hasattr(tf.estimator, "Estimator")


@pytest.mark.skipif(not HAVE_ESTIMATOR,
                    reason=f"TensorFlow {tf.__version__} has no tf.estimator (removed in 2.16)")
def test_strategy_estimator_refuses_two_different_model_dirs(none_engine, tmp_path):
    """tf.estimator.Estimator(model_fn, model_dir=a, config=RunConfig(model_dir=b))
    is a ValueError (TensorFlow's own check); strategy.estimator took `a`
    without a word, so the checkpoints went where the RunConfig did not say."""
    def model_fn(features, labels, mode):
        raise AssertionError("not called")

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    with pytest.raises(ValueError, match="model_dir"):  # the reference: TensorFlow
        tf.estimator.Estimator(model_fn, model_dir=a, config=tf.estimator.RunConfig(model_dir=b))
    s = sok.CollectiveStrategy()
    with pytest.raises(ValueError, match="model_dir"):
        s.estimator(model_fn, model_dir=a, config=tf.estimator.RunConfig(model_dir=b))
    # The same directory in both is fine, as in TensorFlow.
    est = s.estimator(model_fn, model_dir=a, config=tf.estimator.RunConfig(model_dir=a))
    assert est.model_dir == a
