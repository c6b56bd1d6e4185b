"""The CollectiveStrategy as a hostile user drives it. One process: exports
of dynamic tables, TensorFlow's safe lookup with negative weights and ragged
ids, reuse of a table with another shape or dtype, its estimator's
directories. Two workers under the launcher (Horovod,
multiworker/collective_hostile_worker.py): gradients clipped by their norm,
the v1 loss scale's skipped steps, MonitoredTrainingSession's restores. Each
test is one defect, checked against an independent reference (numpy,
TensorFlow's own ops, the strategy in one process, what the arguments
were)."""

import contextlib
import json
import os
import shutil
import sys

import numpy as np
import pytest
import tensorflow as tf

import sok_graph as sok
from sok_graph import context
from multiworker import collective_hostile_worker as worker
from multiworker.launching import launch, needs_horovod, rel_sq_err, run_process

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "multiworker", "collective_hostile_worker.py")


def _run(argv, timeout=300, **env):
    return run_process(argv, timeout, cwd=HERE, **env)


def _launch(n, script, args=(), timeout=300):
    return launch(n, script, args, timeout)


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


def _partitioned_init(values):
    """`values` as an initializer: the whole table under embedding_scope,
    each part its slice for plain TensorFlow's PartitionedVariable."""
    def init(shape, dtype=None, partition_info=None):
        start = 0 if partition_info is None else partition_info.var_offset[0]
        return tf.constant(values[start:start + shape[0]], dtype=dtype)
    return init


@pytest.mark.skipif(sok.compat.IS_TF1,
                    reason="TensorFlow 1.x's sparse lookups take no ragged ids")
def test_ragged_ids_in_sparse_lookups_as_tensorflow(none_engine):
    """tf.nn.embedding_lookup_sparse and tf.nn.safe_embedding_lookup_sparse
    take ragged ids and weights in TensorFlow 2.x; on a model-parallel table
    they failed with "'RaggedTensor' object has no attribute 'dense_shape'".
    They must give plain TensorFlow's result on the same partitioned table."""
    rows = (np.arange(30, dtype=np.float32).reshape(10, 3) % 7) / 5 - 0.6

    def lookups(t):
        ids = tf.ragged.constant([[1, 2, 2], [], [9, 0]], dtype=tf.int64)
        # The safe lookup drops the negative id, and the weight of -2 unless it sums.
        with_negative = tf.ragged.constant([[1, 2, 2], [], [9, -1]], dtype=tf.int64)
        weights = tf.ragged.constant([[1.0, 0.5, -2.0], [], [2.0, 1.0]], dtype=tf.float32)
        return [tf.nn.embedding_lookup_sparse(t, ids, None),
                tf.nn.embedding_lookup_sparse(t, ids, weights, combiner="sum"),
                tf.nn.safe_embedding_lookup_sparse(t, with_negative, weights),
                tf.nn.safe_embedding_lookup_sparse(t, with_negative, weights, combiner="sum"),
                tf.nn.safe_embedding_lookup_sparse(t, with_negative, None, combiner="sqrtn")]

    s = sok.CollectiveStrategy()
    with s.scope(), tf.Graph().as_default():
        with s.embedding_scope():
            table = tf.compat.v1.get_variable(
                "table", shape=rows.shape, initializer=_partitioned_init(rows),
                partitioner=tf.compat.v1.fixed_size_partitioner(2))
        plain = tf.compat.v1.get_variable(
            "plain", shape=rows.shape, initializer=_partitioned_init(rows),
            partitioner=tf.compat.v1.fixed_size_partitioner(2))
        assert isinstance(table, sok.Variable) and not isinstance(plain, sok.Variable)
        got, want = lookups(table), lookups(plain)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            got, want = sess.run([got, want])
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=f"lookup {i}")


# ------------------------------------------------ CollectiveStrategy tables

@pytest.mark.parametrize("again", [dict(shape=(16, 8)), dict(shape=(10, 3), dtype=tf.float16)],
                         ids=["shape", "dtype"])
def test_reuse_with_another_shape_or_dtype_is_refused_as_tensorflow(none_engine, again):
    """get_variable(reuse=True) of a model-parallel table with another shape
    or dtype returned the table as it was (a (16, 8) request got the (10, 3)
    table, a float16 one the float32 table); plain TensorFlow refuses the
    reuse of a partitioned variable so. It must be the same ValueError."""
    def reuse(embedding_scope):
        with tf.Graph().as_default():
            with embedding_scope, tf.compat.v1.variable_scope(
                    "e", partitioner=tf.compat.v1.fixed_size_partitioner(2)):
                table = tf.compat.v1.get_variable("t", shape=(10, 3))
                with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), reuse=True):
                    with pytest.raises(ValueError) as e:
                        tf.compat.v1.get_variable("t", **again)
        return table, str(e.value)

    plain, want = reuse(contextlib.nullcontext())
    assert type(plain).__name__ == "PartitionedVariable"
    found = "shape (10, 3)" if "dtype" not in again else "dtype float32"
    assert want.startswith("Trying to reuse partitioned variable e/t, but specified ")
    assert want.endswith(f"and found {found}."), want
    s = sok.CollectiveStrategy()
    with s.scope():
        table, got = reuse(s.embedding_scope())
    assert isinstance(table, sok.Variable)
    assert got == want


def test_a_float64_table_is_refused_where_it_is_made(none_engine):
    """A float64 partitioned get_variable under embedding_scope made a sok
    table, and its first lookup failed with "param must be float32, float16
    or bfloat16; got float64", naming neither the table nor the get_variable
    that made it. It is a TypeError there now, naming both, nothing made."""
    s = sok.CollectiveStrategy()
    with s.scope(), tf.Graph().as_default():
        with s.embedding_scope(), tf.compat.v1.variable_scope(
                "e", partitioner=tf.compat.v1.fixed_size_partitioner(2)):
            with pytest.raises(TypeError, match=r"'e/t'.*float64"):
                tf.compat.v1.get_variable("t", shape=(10, 3), dtype=tf.float64)
        assert tf.compat.v1.global_variables() == []


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


# ------------------------------------------------ two workers


def _shards(directory, world):
    """Every worker's <directory>/rank<r>.npz, in rank order."""
    return [dict(np.load(os.path.join(directory, f"rank{r}.npz"))) for r in range(world)]


def _reports(directory, world):
    """Every worker's <directory>/rank<r>.json, in rank order."""
    out = []
    for r in range(world):
        with open(os.path.join(directory, f"rank{r}.json")) as f:
            out.append(json.load(f))
    return out


def _whole_table(parts):
    keys = np.concatenate([p["keys"] for p in parts])
    assert sorted(keys) == list(range(len(keys))), "every row held by one worker"
    return np.concatenate([p["rows"] for p in parts])[np.argsort(keys)]


@needs_horovod
@pytest.mark.parametrize("how", ["global", "table", "both"])
def test_two_workers_clip_by_the_norm_of_every_workers_rows(tmp_path, how):
    """tf.clip_by_global_norm (how="global") and tf.clip_by_norm of a
    table's gradient ("table"; "both": the table's clipped, then all)
    between compute_gradients and apply_gradients took the norm of each
    worker's own rows of the table: the workers clipped by different norms,
    so the tables trained unlike one process and the dense weights drifted
    apart between workers, without an error."""
    args = ["--phase", "clip", "--clip", how]
    _launch(2, WORKER, args + ["--out", str(tmp_path / "two")])
    # The reference is the strategy in one process, not plain TensorFlow,
    # whose IndexedSlices keep a repeated id's rows apart in the norm.
    _run([sys.executable, WORKER] + args + ["--out", str(tmp_path / "one")],
         COLLECTIVE_STRATEGY="none")
    parts, want = _shards(tmp_path / "two", 2), _shards(tmp_path / "one", 1)[0]
    # Without the clip biting at every step a wrong norm would not show.
    if how in ("global", "both"):
        assert np.all(want["global_norms"] > worker.GLOBAL_CLIP), want["global_norms"]
    if how in ("table", "both"):
        assert np.all(want["table_norms"] > worker.TABLE_CLIP), want["table_norms"]
    np.testing.assert_array_equal(parts[1]["w"], parts[0]["w"])
    got = {"rows": _whole_table(parts), "w": parts[0]["w"],
           "losses": np.mean([p["losses"] for p in parts], 0)}  # equal local batches
    for r, p in enumerate(parts):
        got[f"table_norms of rank {r}"] = p["table_norms"]
        want[f"table_norms of rank {r}"] = want["table_norms"]
        if how in ("global", "both"):
            got[f"global_norms of rank {r}"] = p["global_norms"]
            want[f"global_norms of rank {r}"] = want["global_norms"]
    for k in got:
        err = rel_sq_err(got[k], want[k])
        assert err < 1e-6, f"{how}: {k} differs from one process (rel. sq. error {err:.3g})"


HAVE_V1_LOSS_SCALE = hasattr(getattr(tf.compat.v1, "mixed_precision", None),
                             "MixedPrecisionLossScaleOptimizer")


@needs_horovod
@pytest.mark.skipif(not HAVE_V1_LOSS_SCALE,
                    reason=f"TensorFlow {tf.__version__} has no "
                           f"tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer")
def test_two_workers_skip_a_step_that_overflows_on_one_of_them(tmp_path):
    """MixedPrecisionLossScaleOptimizer checked only this worker's gradients:
    a step whose scaled gradient overflowed in rank 0's table rows only was
    skipped on rank 0 (its loss scale halved) and applied on rank 1, whose
    dense weights and loss scale parted from rank 0's."""
    _launch(2, WORKER, ["--phase", "loss_scale", "--out", str(tmp_path)])
    for r, got in enumerate(_shards(tmp_path, 2)):
        # Before the steps, after the overflowing one, after a finite one.
        np.testing.assert_array_equal(got["scales"], [2.0 ** 15, 2.0 ** 14, 2.0 ** 14],
                                      err_msg=f"rank {r}")
        np.testing.assert_array_equal(got["w"][1], got["w"][0], err_msg=f"rank {r}")
        # Then one SGD step (0.1) of sum(w ** 2): w * (1 - 0.2), on every worker.
        np.testing.assert_allclose(got["w"][2], 0.8 * got["w"][0], rtol=1e-6,
                                   err_msg=f"rank {r}")


@needs_horovod
def test_two_workers_refuse_table_gradients_that_compute_gradients_did_not_average(tmp_path):
    """apply_gradients given gradients from tf.gradients (compute_gradients
    averages them over the workers; tf.gradients does not): each worker
    applied its own, the dense weights parted and the tables trained N
    times too fast, without an error. A ValueError on every worker now."""
    _launch(2, WORKER, ["--phase", "unaveraged", "--out", str(tmp_path)])
    for r in range(2):
        with open(os.path.join(tmp_path, f"rank{r}.json")) as f:
            message = json.load(f)["error"]
        assert message is not None, f"rank {r}: apply_gradients took unaveraged gradients"
        assert "did not come from this graph's Optimizer.compute_gradients" in message, message
        assert "'emb/table" in message, message


def _drop_the_latest_checkpoint(directory, step):
    """`directory`'s checkpoint of `step` removed, the one before it made
    the latest (as a worker whose last timed save did not come)."""
    for name in os.listdir(directory):
        if name.startswith(f"model.ckpt-{step}."):
            os.remove(os.path.join(directory, name))
    earlier = [f"model.ckpt-{s}" for s in range(1, step)]
    with open(os.path.join(directory, "checkpoint"), "w") as f:
        f.write(f'model_checkpoint_path: "{earlier[-1]}"\n')
        f.writelines(f'all_model_checkpoint_paths: "{e}"\n' for e in earlier)


@needs_horovod
def test_monitored_training_session_restores_alike_on_every_worker(tmp_path):
    """MonitoredTrainingSession(checkpoint_dir) restores each worker's own
    checkpoint (rank r under <dir>/worker<r>). A worker without its
    directory started its shard from the initializer while rank 0 restored
    its own and the global step; a checkpoint of another number of workers
    was restored as it was (the wrong rows, and a shard of another shape);
    all without an error. Both are ValueErrors on every worker now, before
    anything is restored; a restart with every directory in place still
    restores exactly, and one whose workers' latest checkpoints are of
    different steps (time-based saves on each worker's clock, a crash
    between them) restores each worker's own latest, as before."""
    two, one = str(tmp_path / "two"), str(tmp_path / "one")
    lost = str(tmp_path / "two_without_worker1")
    skewed = str(tmp_path / "two_a_step_apart")
    _launch(2, WORKER, ["--phase", "checkpoint", "--save", two, "--out", str(tmp_path / "train")])
    shutil.copytree(two, lost)
    shutil.rmtree(os.path.join(lost, "worker1"))
    shutil.copytree(two, skewed)
    _drop_the_latest_checkpoint(os.path.join(skewed, "worker1"), worker.CKPT_STEPS)
    # One process: writes its own checkpoint (whole tables), and restores
    # the two workers' one.
    _run([sys.executable, WORKER, "--phase", "checkpoint", "--save", one, "--restore", two,
          "--out", str(tmp_path / "one_process")], COLLECTIVE_STRATEGY="none")
    _launch(2, WORKER, ["--phase", "checkpoint", "--restore", two, lost, one, skewed,
                        "--out", str(tmp_path / "restore")])
    another_number = ("'emb/table'", "another number of workers")

    single = _reports(tmp_path / "one_process", 1)[0]
    (two_in_one,) = single["restores"]
    assert "error" in two_in_one, "one process restored a two-worker checkpoint"
    assert all(words in two_in_one["error"] for words in another_number), two_in_one["error"]

    trained = _reports(tmp_path / "train", 2)
    for r, got in enumerate(_reports(tmp_path / "restore", 2)):
        own, without_worker1, one_in_two, a_step_apart = got["restores"]
        assert "error" not in a_step_apart, a_step_apart["error"]
        assert "error" not in own, own["error"]
        assert own["step"] == worker.CKPT_STEPS
        np.testing.assert_array_equal(own["rows"], trained[r]["trained"], err_msg=f"rank {r}")
        assert "error" in without_worker1, f"rank {r} restored without rank 1's checkpoint"
        assert "some workers would restore a checkpoint and others none" in \
            without_worker1["error"]
        assert "rank 1: none" in without_worker1["error"], without_worker1["error"]
        assert "error" in one_in_two, f"rank {r} restored a one-process checkpoint"
        assert all(words in one_in_two["error"] for words in another_number), one_in_two["error"]


@pytest.mark.parametrize("outer", ["optimizer_scope", "strategy_scope"])
def test_an_optimizer_scope_around_or_inside_the_strategy_scope_routes_the_tables(none_engine,
                                                                                  outer):
    """sok.OptimizerScope and CollectiveStrategy.scope() both replace
    tf.compat.v1.train.Optimizer.apply_gradients. With the OptimizerScope
    outside, the strategy's check called TensorFlow's own method, not the
    scope's routing: TensorFlow's Adam updated every row of a static table
    with slots of its own (a dynamic table failed to build). The rows of
    either nesting equal the OptimizerScope alone's."""
    strategy = sok.CollectiveStrategy()
    init = np.random.RandomState(0).normal(size=(8, 3)).astype(np.float32)

    def train(nesting):
        with tf.Graph().as_default():
            table = sok.Variable(init)
            ids = tf.RaggedTensor.from_tensor(tf.constant([[0, 1], [2, 3]], tf.int64))
            opt = tf.compat.v1.train.AdamOptimizer(0.1)
            scopes = {"optimizer_scope": [sok.OptimizerScope([table]), strategy.scope()],
                      "strategy_scope": [strategy.scope(), sok.OptimizerScope([table])],
                      "alone": [sok.OptimizerScope([table])]}[nesting]
            with contextlib.ExitStack() as stack:
                for scope in scopes:
                    stack.enter_context(scope)
                loss = tf.reduce_sum(tf.square(sok.lookup_sparse(table, ids, combiners="sum")
                                               - 1.0))
                step = opt.minimize(loss)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                for _ in range(3):
                    sess.run(step)
                return sess.run(table)

    got, want = train(outer), train("alone")
    np.testing.assert_array_equal(got[4:], init[4:])  # rows no id reads stay (lazy)
    np.testing.assert_array_equal(got, want)
