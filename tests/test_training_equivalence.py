"""Training with sok equals training the same model in plain TensorFlow.

The workload of SOK's own tests: two tables (40960 x 128, hotness 10,
combiner mean; 8192 x 4, hotness 3, combiner sum), batch 8192, 100 SGD steps
with learning rate 1, against tf.nn.embedding_lookup_sparse on tf.Variables.
"""

import contextlib

import numpy as np
import pytest
import tensorflow as tf

import sok_graph as sok

SHAPES = [(40960, 128), (8192, 4)]
HOTNESS = [10, 3]
COMBINERS = ["mean", "sum"]
BATCH = 8192


def rel_sq_error(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.sum((got - want) ** 2) / max(np.sum(want ** 2), 1e-30))


def make_batches(steps, weighted, seed=0):
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(steps):
        ids, weights = [], []
        for (rows, _), hot in zip(SHAPES, HOTNESS):
            lengths = rng.integers(1, hot + 1, size=BATCH)
            splits = np.concatenate([[0], np.cumsum(lengths)])
            ids.append(tf.RaggedTensor.from_row_splits(
                tf.constant(rng.integers(0, rows, size=splits[-1])), tf.constant(splits)))
            weights.append(tf.RaggedTensor.from_row_splits(
                tf.constant(rng.uniform(0.5, 1.5, size=splits[-1]), tf.float32),
                tf.constant(splits)) if weighted else None)
        targets = [tf.constant(rng.standard_normal((BATCH, d)), tf.float32) for _, d in SHAPES]
        batches.append((ids, weights, targets))
    return batches


def loss_fn(embs, targets):
    return tf.add_n([tf.reduce_sum(tf.square(e - t)) / BATCH for e, t in zip(embs, targets)])


def train(kind, make_opt, batches, tables):
    # TensorFlow's sparse optimizers (ResourceSparseApplyMomentum, ...) have
    # no GPU kernels: the plain-TF reference runs on the CPU, where TF can.
    with tf.device("/CPU:0") if kind == "tf" else contextlib.nullcontext():
        return _train(kind, make_opt, batches, tables)


def _train(kind, make_opt, batches, tables):
    if kind == "tf":
        variables = [tf.Variable(t) for t in tables]
    elif kind == "static":
        variables = [sok.Variable(t) for t in tables]
    else:
        variables = []
        for t in tables:
            v = sok.DynamicVariable(t.shape[1], initializer="zeros")
            sok.assign(v, tf.range(t.shape[0], dtype=tf.int64), t)
            variables.append(v)
    opt = make_opt() if kind == "tf" else sok.OptimizerWrapper(make_opt())
    spec = tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1, row_splits_dtype=tf.int64)
    wspec = tf.RaggedTensorSpec([None, None], tf.float32, ragged_rank=1,
                                row_splits_dtype=tf.int64)
    weighted = batches[0][1][0] is not None

    @tf.function(input_signature=[[spec, spec], [wspec, wspec] if weighted else [],
                                  [tf.TensorSpec([None, d]) for _, d in SHAPES]])
    def step(ids, weights, targets):
        weights = list(weights) if weighted else [None, None]
        with tf.GradientTape() as tape:
            if kind == "tf":
                embs = [tf.nn.embedding_lookup_sparse(
                    v, i.to_sparse(), None if w is None else w.to_sparse(), combiner=c)
                    for v, i, w, c in zip(variables, ids, weights, COMBINERS)]
            else:
                embs = sok.lookup_sparse(variables, list(ids), weights, combiners=COMBINERS)
            loss = loss_fn(embs, targets)
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    losses = [float(step(ids, weights if weighted else [], targets))
              for ids, weights, targets in batches]
    if kind == "dynamic":
        values = []
        for v, t in zip(variables, tables):
            rows, found = v.find(tf.range(t.shape[0], dtype=tf.int64))
            assert bool(tf.reduce_all(found))
            values.append(rows.numpy())
    else:
        values = [v.numpy() for v in variables]
    return np.array(losses), values


@pytest.fixture(scope="module")
def tables():
    rng = np.random.default_rng(42)
    return [rng.normal(0, 0.1, s).astype(np.float32) for s in SHAPES]


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_100_sgd_steps_equal_plain_tensorflow(tables, kind):
    batches = make_batches(100, weighted=False)
    sgd = lambda: tf.compat.v1.train.GradientDescentOptimizer(1.0)  # noqa: E731
    ref_loss, ref_vals = train("tf", sgd, batches, tables)
    loss, vals = train(kind, sgd, batches, tables)
    assert rel_sq_error(loss, ref_loss) < 1e-6
    for got, want, start in zip(vals, ref_vals, tables):
        # Compared on what training changed, not on the (much larger) tables.
        assert rel_sq_error(got - start, want - start) < 1e-6
        assert rel_sq_error(start, want) > 1e-5  # training moved the table


def test_weighted_sgd_equals_plain_tensorflow(tables):
    batches = make_batches(20, weighted=True, seed=1)
    sgd = lambda: tf.compat.v1.train.GradientDescentOptimizer(1.0)  # noqa: E731
    ref_loss, ref_vals = train("tf", sgd, batches, tables)
    loss, vals = train("static", sgd, batches, tables)
    assert rel_sq_error(loss, ref_loss) < 1e-4
    for got, want, start in zip(vals, ref_vals, tables):
        assert rel_sq_error(got - start, want - start) < 1e-4


@pytest.mark.parametrize("name", ["adagrad", "ftrl", "momentum"])
def test_sparse_optimizers_equal_tensorflow(tables, name):
    make = {"adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.5),
            "ftrl": lambda: tf.compat.v1.train.FtrlOptimizer(0.5, l1_regularization_strength=1e-4),
            "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.5, 0.9)}[name]
    batches = make_batches(10, weighted=False, seed=2)
    ref_loss, ref_vals = train("tf", make, batches, tables)
    for kind in ("static", "dynamic"):
        loss, vals = train(kind, make, batches, tables)
        assert rel_sq_error(loss, ref_loss) < 1e-6, kind
        for got, want, start in zip(vals, ref_vals, tables):
            assert rel_sq_error(got - start, want - start) < 1e-6, kind
