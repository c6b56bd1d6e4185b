"""The fused lookup op against numpy and tf.nn.embedding_lookup_sparse."""

import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import op_determinism_on, run_in_graph, strategy_run

import sok_graph as sok
from sok_graph.ops import lookup as lookup_ops

COMBINERS = ["sum", "mean", "sqrtn"]


def test_python_reads_the_combiners_the_op_allows():
    """The combiner names are one list in C++ (tf_ops/lookup/core/combiner.h),
    the allowed values of the ops' attribute; Python reads them back, and
    the op itself refuses another name."""
    assert lookup_ops.combiner_names() == tuple(COMBINERS)
    v = tf.Variable(np.ones((3, 2), np.float32))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="max"):
        lookup_ops.fused_lookup([v], [tf.constant([0], tf.int64)],
                                [tf.constant([0, 1], tf.int64)], combiners=["max"])


def random_ragged(rng, batch, rows, max_hot, empty_fraction=0.2, dtype=np.int64):
    """Python lists of ids per sample, some samples empty; ids span [0, rows)."""
    out = []
    for _ in range(batch):
        if rng.random() < empty_fraction:
            out.append([])
        else:
            out.append(list(rng.integers(0, rows, size=rng.integers(1, max_hot + 1)).astype(dtype)))
    if batch > 0 and rows > 1:  # make sure the boundary ids appear
        out[0] = out[0] + [0, rows - 1]
    return out


def numpy_lookup(params, samples, weights, combiner, max_norm=None):
    params = np.asarray(params, np.float64)
    out = np.zeros((len(samples), params.shape[1]))
    for b, ids in enumerate(samples):
        if len(ids) == 0:
            continue
        rows = params[np.asarray(ids, np.int64)]
        if max_norm:
            norms = np.linalg.norm(rows, axis=1, keepdims=True)
            rows = rows * (max_norm / np.maximum(norms, max_norm))
        w = np.ones(len(ids)) if weights is None else np.asarray(weights[b], np.float64)
        s = (w[:, None] * rows).sum(0)
        if combiner == "mean":
            s /= w.sum()
        elif combiner == "sqrtn":
            s /= np.sqrt((w ** 2).sum())
        out[b] = s
    return out


def ragged(samples, dtype=tf.int64):
    return tf.ragged.constant(samples, dtype=dtype, ragged_rank=1, inner_shape=None) \
        if any(len(s) for s in samples) else tf.RaggedTensor.from_row_lengths(
            tf.zeros([0], dtype), [0] * len(samples))


def parts(samples, dtype=tf.int64):
    rt = ragged(samples, dtype)
    return rt.values, tf.cast(rt.row_splits, tf.int64)


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("id_dtype", [tf.int32, tf.int64])
def test_matches_numpy_for_several_tables(rng, combiner, weighted, id_dtype):
    shapes = [(50, 8), (7, 3), (1, 5), (300, 1)]
    tables = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    batches = [33, 33, 4, 0]
    samples = [random_ragged(rng, b, s[0], 6) for b, s in zip(batches, shapes)]
    weights = None
    if weighted:
        weights = [[list(rng.uniform(0.5, 2.0, len(ids))) for ids in sm] for sm in samples]
    ids, splits = zip(*(parts(s, id_dtype) for s in samples))
    w_tensors = None
    if weighted:
        w_tensors = [tf.constant([x for ws in wt for x in ws], tf.float32) for wt in weights]
    out = lookup_ops.fused_lookup(
        [tf.constant(t) for t in tables], ids, splits, weights=w_tensors,
        combiners=[combiner] * 4)
    for t in range(4):
        expected = numpy_lookup(tables[t], samples[t], weights[t] if weighted else None, combiner)
        assert out[t].shape == (batches[t], shapes[t][1])
        np.testing.assert_allclose(out[t].numpy(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("combiner", COMBINERS)
def test_matches_tf_embedding_lookup_sparse(rng, combiner):
    table = rng.standard_normal((1000, 16)).astype(np.float32)
    samples = random_ragged(rng, 64, 1000, 5, empty_fraction=0.0)
    weights = [list(rng.uniform(0.1, 1.0, len(s))) for s in samples]
    rt = ragged(samples)
    wt = tf.ragged.constant(weights, dtype=tf.float32)
    for use_weights in (False, True):
        expected = tf.nn.embedding_lookup_sparse(
            tf.constant(table), rt.to_sparse(), wt.to_sparse() if use_weights else None,
            combiner=combiner)
        got = sok.lookup_sparse(tf.constant(table), rt, wt if use_weights else None,
                                combiners=combiner)
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("combiner", COMBINERS)
def test_max_norm_forward_and_gradient_match_tf(rng, combiner):
    table = (3.0 * rng.standard_normal((40, 6))).astype(np.float32)
    samples = random_ragged(rng, 20, 40, 4, empty_fraction=0.0)
    rt = ragged(samples)
    var_ref = tf.Variable(table)
    var_sok = tf.Variable(table)
    with tf.GradientTape(persistent=True) as tape:
        ref = tf.nn.embedding_lookup_sparse(var_ref, rt.to_sparse(), None, combiner=combiner,
                                            max_norm=2.5)
        got = sok.lookup_sparse(var_sok, rt, combiners=combiner, max_norm=2.5)
        upstream = tf.constant(rng.standard_normal(ref.shape).astype(np.float32))
        loss_ref = tf.reduce_sum(ref * upstream)
        loss_got = tf.reduce_sum(got * upstream)
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got.numpy(), numpy_lookup(table, samples, None, combiner, 2.5),
                               rtol=1e-5, atol=1e-5)
    g_ref = tf.convert_to_tensor(tape.gradient(loss_ref, var_ref))
    g_got = tf.convert_to_tensor(tape.gradient(loss_got, var_sok))
    np.testing.assert_allclose(g_got.numpy(), g_ref.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("combiner", COMBINERS)
def test_max_norm_of_a_row_holding_nan_or_inf_is_tfs(combiner):
    """A row holding a NaN has a NaN norm: TensorFlow's clip makes the whole
    row and its gradient NaN. It was left unclipped (its other values and
    its gradient finite, the NaN hidden). An infinite value: NaN there,
    zeros elsewhere, in both."""
    table = np.array([[np.nan, 1.0, 2.0], [3.0, 4.0, 0.0], [np.inf, 0.5, 0.5],
                      [0.1, 0.2, 0.3]], np.float32)
    rt = tf.ragged.constant([[0], [0, 1], [2, 3], [1, 3]], tf.int64)
    for make in (tf.Variable, sok.Variable):
        var_ref, var_got = tf.Variable(table), make(table)
        with tf.GradientTape(persistent=True) as tape:
            ref = tf.nn.embedding_lookup_sparse(var_ref, rt.to_sparse(), None,
                                                combiner=combiner, max_norm=1.0)
            got = sok.lookup_sparse(var_got, rt, combiners=combiner, max_norm=1.0)
            loss_ref, loss_got = tf.reduce_sum(ref), tf.reduce_sum(got)
        assert np.isnan(ref.numpy()[0]).all()
        np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
        g_ref = tf.convert_to_tensor(tape.gradient(loss_ref, var_ref)).numpy()
        g_got = tf.convert_to_tensor(tape.gradient(loss_got, var_got)).numpy()
        np.testing.assert_allclose(g_got, g_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("weighted", [False, True])
def test_gradient_is_unique_indexed_slices_equal_to_tf(rng, combiner, weighted):
    tables = [rng.standard_normal((30, 4)).astype(np.float32),
              rng.standard_normal((9, 2)).astype(np.float32)]
    samples = [random_ragged(rng, 25, 30, 5, empty_fraction=0.0),
               random_ragged(rng, 25, 9, 3, empty_fraction=0.0)]
    samples[1][3] = [4, 4, 4, 4]  # all ids of a sample equal
    rts = [ragged(s) for s in samples]
    wts = [tf.ragged.constant([list(rng.uniform(0.5, 1.5, len(x))) for x in s], tf.float32)
           for s in samples] if weighted else [None, None]
    sok_vars = [sok.Variable(t) for t in tables]
    ref_vars = [tf.Variable(t) for t in tables]
    upstream = [tf.constant(rng.standard_normal((25, t.shape[1])).astype(np.float32))
                for t in tables]
    with tf.GradientTape(persistent=True) as tape:
        got = sok.lookup_sparse(sok_vars, rts, wts, combiners=[combiner] * 2)
        ref = [tf.nn.embedding_lookup_sparse(v, r.to_sparse(),
                                             None if w is None else w.to_sparse(),
                                             combiner=combiner)
               for v, r, w in zip(ref_vars, rts, wts)]
        loss_got = sum(tf.reduce_sum(g * u) for g, u in zip(got, upstream))
        loss_ref = sum(tf.reduce_sum(g * u) for g, u in zip(ref, upstream))
    grads = tape.gradient(loss_got, sok_vars)
    refs = tape.gradient(loss_ref, ref_vars)
    for g, r, s in zip(grads, refs, samples):
        assert isinstance(g, tf.IndexedSlices)
        idx = g.indices.numpy()
        assert len(np.unique(idx)) == len(idx), "gradient indices must be unique"
        # first-appearance order, as tf.unique
        flat = [i for x in s for i in x]
        np.testing.assert_array_equal(idx, tf.unique(tf.constant(flat, tf.int64))[0].numpy())
        np.testing.assert_allclose(tf.convert_to_tensor(g).numpy(),
                                   tf.convert_to_tensor(r).numpy(), rtol=1e-5, atol=1e-5)


def _cpu_threads():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@pytest.mark.parametrize("many", [False, True], ids=["few_tables", "many_tables"])
@pytest.mark.parametrize("dtype", [tf.float32, tf.float16])
@pytest.mark.parametrize("combiner", COMBINERS)
def test_gradient_of_few_and_of_many_tables_equals_tf(rng, many, dtype, combiner):
    """The CPU gradient sums a call's tables one whole table per thread when
    there are at least twice as many tables as threads, and splits each
    table's rows over the threads when there are fewer: both ways, with
    widths the kernels compile for (4, 16) and others (3), weights, a
    max_norm, a dense table and hot ids, the gradients equal
    tf.nn.embedding_lookup_sparse's and sparse ones list their ids in order
    of first appearance."""
    n = 2 * _cpu_threads() + 1 if many else 2
    dims = [(4, 16, 3)[t % 3] for t in range(n)]
    rows = [(40, 300, 9)[t % 3] for t in range(n)]
    batch = 24
    tables = [rng.standard_normal((r, d)).astype(np.float32) for r, d in zip(rows, dims)]
    # An empty sample inside the batch, not at its end (tf.nn's output
    # would lose trailing empty samples).
    samples = [random_ragged(rng, batch, r, 6, empty_fraction=0.0) for r in rows]
    for s in samples:
        s[batch // 2] = []
    samples[0][5] = [1, 1, 1, 1, 1]  # a hot id
    weighted = [t % 2 == 1 for t in range(n)]
    wts = [tf.constant([x for ids in s for x in rng.uniform(0.5, 1.5, len(ids))], dtype)
           if w else None for s, w in zip(samples, weighted)]
    max_norms = [1.5 if t % 4 == 2 else None for t in range(n)]
    dense = [t == n - 1 for t in range(n)]
    consts = [tf.cast(tf.constant(t), dtype) for t in tables]
    rts = [ragged(s) for s in samples]
    upstream = [tf.cast(tf.constant(rng.standard_normal((batch, d)).astype(np.float32)), dtype)
                for d in dims]
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(consts)
        got = lookup_ops.fused_lookup(
            consts, [r.values for r in rts], [r.row_splits for r in rts],
            weights=wts,
            combiners=[combiner] * n, max_norms=max_norms, dense_grads=dense)
        loss = sum(tf.reduce_sum(tf.cast(g, tf.float32) * tf.cast(u, tf.float32))
                   for g, u in zip(got, upstream))
    grads = tape.gradient(loss, consts)
    tol = 1e-5 if dtype == tf.float32 else 2e-2
    for t in range(n):
        ref_table = tf.Variable(tf.cast(consts[t], tf.float32))
        with tf.GradientTape() as ref_tape:
            w = None
            if wts[t] is not None:
                w = tf.RaggedTensor.from_row_splits(tf.cast(wts[t], tf.float32),
                                                    rts[t].row_splits).to_sparse()
            ref = tf.nn.embedding_lookup_sparse(ref_table, rts[t].to_sparse(), w,
                                                combiner=combiner, max_norm=max_norms[t])
            ref_loss = tf.reduce_sum(ref * tf.cast(upstream[t], tf.float32))
        want = tf.convert_to_tensor(ref_tape.gradient(ref_loss, ref_table)).numpy()
        g = grads[t]
        assert isinstance(g, tf.IndexedSlices) != dense[t], f"table {t}"
        if not dense[t]:
            flat = [i for ids in samples[t] for i in ids]
            np.testing.assert_array_equal(
                g.indices.numpy(), tf.unique(tf.constant(flat, tf.int64))[0].numpy(),
                err_msg=f"table {t}")
        np.testing.assert_allclose(tf.cast(tf.convert_to_tensor(g), tf.float32).numpy(), want,
                                   rtol=tol, atol=tol, err_msg=f"table {t}")


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("max_norm", [None, 1.5])
def test_dense_gradient_of_a_table_equals_tf(rng, combiner, max_norm):
    """dense_grads: the marked table's gradient is one [rows, dim] tensor
    (zero for ids that never occur), the unmarked one stays sparse; both
    equal tf.nn.embedding_lookup_sparse's gradient."""
    tables = [(2.0 * rng.standard_normal((12, 4))).astype(np.float32),
              rng.standard_normal((7, 3)).astype(np.float32)]
    samples = [random_ragged(rng, 20, 12, 4, empty_fraction=0.1),
               random_ragged(rng, 20, 7, 3, empty_fraction=0.1)]
    samples[0] = [[i for i in s if i != 5] for s in samples[0]]  # row 5 never looked up
    weights = [[list(rng.uniform(0.5, 1.5, len(x))) for x in s] for s in samples]
    rts = [ragged(s) for s in samples]
    wts = [tf.ragged.constant(w, tf.float32, ragged_rank=1, inner_shape=()) for w in weights]
    consts = [tf.constant(t) for t in tables]
    upstream = [tf.constant(rng.standard_normal((20, t.shape[1])).astype(np.float32))
                for t in tables]
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(consts)
        got = lookup_ops.fused_lookup(
            consts, [r.values for r in rts], [r.row_splits for r in rts],
            weights=[w.values for w in wts], combiners=[combiner] * 2,
            max_norms=[max_norm] * 2, dense_grads=[True, False])
        ref = [tf.nn.embedding_lookup_sparse(c, r.to_sparse(), w.to_sparse(), combiner=combiner,
                                             max_norm=max_norm)
               for c, r, w in zip(consts, rts, wts)]
        loss_got = sum(tf.reduce_sum(g * u) for g, u in zip(got, upstream))
        loss_ref = sum(tf.reduce_sum(g * u) for g, u in zip(ref, upstream))
    grads = tape.gradient(loss_got, consts)
    refs = tape.gradient(loss_ref, consts)
    assert not isinstance(grads[0], tf.IndexedSlices)
    assert grads[0].shape == (12, 4)
    assert isinstance(grads[1], tf.IndexedSlices)
    np.testing.assert_array_equal(grads[0].numpy()[5], np.zeros(4, np.float32))
    for g, r in zip(grads, refs):
        np.testing.assert_allclose(tf.convert_to_tensor(g).numpy(),
                                   tf.convert_to_tensor(r).numpy(), rtol=1e-5, atol=1e-5)


def test_dense_gradient_in_a_graph_and_every_table_dense(rng):
    table = rng.standard_normal((6, 2)).astype(np.float32)
    samples = random_ragged(rng, 9, 6, 3, empty_fraction=0.0)
    upstream = rng.standard_normal((9, 2)).astype(np.float32)

    def build():
        rt = ragged(samples)
        x = tf.constant(table)
        got = lookup_ops.fused_lookup([x], [rt.values], [rt.row_splits], combiners=["mean"],
                                      dense_grads=[True])[0]
        ref = tf.nn.embedding_lookup_sparse(x, rt.to_sparse(), None, combiner="mean")
        g = tf.gradients(tf.reduce_sum(got * upstream), x)[0]
        r = tf.gradients(tf.reduce_sum(ref * upstream), x)[0]
        return g, tf.convert_to_tensor(r)

    g, r = run_in_graph(build)
    assert g.shape == (6, 2)
    np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def raw_grad(params, ids, splits, grads, combiner="sum", weights=None, dense=False):
    """SokFusedLookupGrad of one table named 'user': (unique ids, rows)."""
    u, g = sok.ops.library.load().sok_fused_lookup_grad(
        params=[params], ids=[ids], row_splits=[splits],
        weights=[tf.zeros([0]) if weights is None else weights], grads=[grads],
        combiners=[combiner], weighted=[weights is not None], max_norms=[0.0],
        table_names=["user"], dense_grads=[dense])
    return u[0].numpy(), g[0].numpy()


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("id_dtype", [tf.int32, tf.int64])
def test_gradient_of_one_id_samples_without_row_splits(rng, combiner, dense, id_dtype,
                                                       op_determinism):
    """An empty row_splits in the gradient op stands for one id per sample:
    bit for bit the gradient that the splits 0, 1, ..., n give (with op
    determinism on: a GPU sums dense gradients in no fixed order otherwise),
    and each id's upstream rows summed (numpy)."""
    rows, n, dim = 9, 40, 3
    params = tf.constant(rng.standard_normal((rows, dim)).astype(np.float32))
    ids_np = rng.integers(0, rows - 1, n)  # the last row never occurs
    ids = tf.constant(ids_np, id_dtype)
    dy = tf.constant(rng.standard_normal((n, dim)).astype(np.float32))
    u0, g0 = raw_grad(params, ids, tf.range(n + 1, dtype=tf.int64), dy, combiner, dense=dense)
    u1, g1 = raw_grad(params, ids, tf.zeros([0], tf.int64), dy, combiner, dense=dense)
    np.testing.assert_array_equal(u1, u0)
    assert g1.tobytes() == g0.tobytes()
    want = np.zeros((rows, dim))
    np.add.at(want, ids_np, dy.numpy().astype(np.float64))
    if dense:
        assert u1.shape == (0,) and g1.shape == (rows, dim)
        got = g1
    else:
        np.testing.assert_array_equal(u1, list(dict.fromkeys(ids_np)))  # first appearance
        got = np.zeros((rows, dim))
        got[u1] = g1
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("one_id", [False, True])
def test_dense_gradient_with_and_without_op_determinism(rng, one_id):
    """A dense gradient is numpy's per-id sums either way. Without op
    determinism a GPU adds them with atomics in no fixed order (no sort);
    with it, in the ordered plan's order: the sparse gradient's bits."""
    rows, n, dim = 50, 3000, 8
    ids_np = rng.integers(0, rows, n)
    ids = tf.constant(ids_np, tf.int64)
    if one_id:
        splits, weights, samples = tf.zeros([0], tf.int64), None, np.arange(n)
        factors = np.ones(n)
    else:  # 1000 samples of any length (some empty), weighted, mean
        bounds = np.concatenate([[0], np.sort(rng.integers(0, n + 1, 999)), [n]])
        splits = tf.constant(bounds, tf.int64)
        w = rng.uniform(0.5, 1.5, n).astype(np.float32)
        weights = tf.constant(w)
        samples = np.repeat(np.arange(1000), np.diff(bounds))
        factors = w / np.bincount(samples, weights=w.astype(np.float64), minlength=1000)[samples]
    batch = n if one_id else len(bounds) - 1
    dy_np = rng.standard_normal((batch, dim)).astype(np.float32)
    want = np.zeros((rows, dim))
    np.add.at(want, ids_np, dy_np[samples].astype(np.float64) * factors[:, None])
    combiner = "sum" if one_id else "mean"
    params = tf.zeros([rows, dim])

    def grad(dense=True):
        return raw_grad(params, ids, splits, tf.constant(dy_np), combiner, weights, dense=dense)

    np.testing.assert_allclose(grad()[1], want, rtol=1e-5, atol=1e-5)
    with op_determinism_on():
        first, second = grad()[1], grad()[1]
        # The sparse layout always takes the ordered plan: with determinism
        # on, the dense gradient is its rows, bit for bit, at their ids.
        unique, sparse_rows = grad(dense=False)
    ordered = np.zeros((rows, dim), np.float32)
    ordered[unique] = sparse_rows
    assert first.tobytes() == ordered.tobytes() == second.tobytes()
    np.testing.assert_allclose(first, want, rtol=1e-5, atol=1e-5)


def test_one_id_samples_without_row_splits_are_refused_where_they_cannot_be():
    params = tf.zeros([4, 2])
    ids = tf.constant([0, 3, 1], tf.int64)
    empty = tf.zeros([0], tf.int64)
    dy = tf.ones([3, 2])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"row_splits of table 'user' \(table 0\) may be empty \(one id "
                             r"per sample\) only for an unweighted table"):
        raw_grad(params, ids, empty, dy, weights=tf.ones([3]))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"grads of table 'user' .*must have shape \[3, 2\].*got \[2,2\]"):
        raw_grad(params, ids, empty, tf.ones([2, 2]))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"ids of table 'user' .*must be in \[0, 4\).*got 4 at position 1"):
        raw_grad(params, tf.constant([0, 4, 1], tf.int64), empty, dy)
    # The forward takes no such shorthand: its output's batch is the splits'.
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                       match=r"row_splits of table 'user' .*must be a vector of batch \+ 1 "
                             r">= 1 entries; got shape \[0\]"):
        call_raw([params], [ids], [empty])


def test_dense_grads_of_the_wrong_length_is_rejected():
    with pytest.raises(ValueError, match=r"dense_grads must have one entry per table \(1\); got 2"):
        lookup_ops.fused_lookup([tf.zeros([3, 2])], [tf.constant([0], tf.int64)],
                                [tf.constant([0, 1], tf.int64)], combiners=["sum"],
                                dense_grads=[True, False])


def test_combiners_that_are_no_list_of_names_are_named():
    """fused_lookup's combiners default None failed with "'NoneType' object
    is not iterable", a str was taken letter by letter (TensorFlow's "Value
    for attr 'combiners' of \"s\""), and an unknown name failed inside the
    op, naming no entry. Errors naming combiners (or combiners[t]) now; a
    list of names reads as numpy does."""
    table = tf.reshape(tf.range(8.0), [4, 2])
    args = ([table], [tf.constant([1, 3], tf.int64)], [tf.constant([0, 2], tf.int64)])
    names = "('sum', 'mean', 'sqrtn')"
    for combiners in (None, "sum", b"sum"):
        with pytest.raises(TypeError) as refused:
            lookup_ops.fused_lookup(*args, combiners=combiners)
        assert str(refused.value) == (f"combiners must be a list of one combiner name per table "
                                      f"(1), each one of {names}; got {combiners!r}")
    for bad in ("max", "Sum", None):
        with pytest.raises(ValueError) as refused:
            lookup_ops.fused_lookup(*args, combiners=[bad])
        assert str(refused.value) == f"combiners[0] must be one of {names}; got {bad!r}"
    got = lookup_ops.fused_lookup(*args, combiners=("mean",))[0].numpy()
    np.testing.assert_array_equal(got, [(np.arange(8.0).reshape(4, 2)[[1, 3]]).mean(0)])


def test_empty_batch_and_all_empty_rows(rng):
    table = tf.constant(rng.standard_normal((5, 3)).astype(np.float32))
    empty_batch = tf.RaggedTensor.from_row_splits(tf.zeros([0], tf.int64), [0])
    no_ids = tf.RaggedTensor.from_row_splits(tf.zeros([0], tf.int64), [0, 0, 0])
    v = tf.Variable(table)
    with tf.GradientTape() as tape:
        a, b = sok.lookup_sparse([v, v], [empty_batch, no_ids], combiners=["mean", "sqrtn"])
        loss = tf.reduce_sum(a) + tf.reduce_sum(b)
    assert a.shape == (0, 3)
    np.testing.assert_array_equal(b.numpy(), np.zeros((2, 3), np.float32))
    g = tape.gradient(loss, v)
    assert g.indices.shape[0] == 0


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_half_precision_tables(rng, dtype):
    table = rng.standard_normal((20, 8)).astype(np.float32)
    samples = random_ragged(rng, 10, 20, 4)
    got = sok.lookup_sparse(tf.cast(tf.constant(table), dtype), ragged(samples), combiners="mean")
    assert got.dtype == dtype
    expected = numpy_lookup(tf.cast(tf.cast(table, dtype), tf.float32).numpy(), samples, None,
                            "mean")
    np.testing.assert_allclose(tf.cast(got, tf.float32).numpy(), expected, rtol=2e-2, atol=2e-2)


def test_graph_mode_session_and_tf_gradients(rng):
    table = rng.standard_normal((12, 4)).astype(np.float32)
    samples = random_ragged(rng, 8, 12, 4, empty_fraction=0.0)

    def build():
        v_sok = tf.compat.v1.get_variable("sok", initializer=table, use_resource=True)
        v_ref = tf.compat.v1.get_variable("ref", initializer=table, use_resource=True)
        rt = ragged(samples)
        got = sok.lookup_sparse([v_sok], [rt], combiners=["sqrtn"])[0]
        ref = tf.nn.embedding_lookup_sparse(v_ref, rt.to_sparse(), None, combiner="sqrtn")
        g_got = tf.gradients(tf.reduce_sum(got * got), [v_sok])[0]
        g_ref = tf.gradients(tf.reduce_sum(ref * ref), [v_ref])[0]
        assert isinstance(g_got, tf.IndexedSlices)
        return got, ref, tf.convert_to_tensor(g_got), tf.convert_to_tensor(g_ref)

    got, ref, g_got, g_ref = run_in_graph(build)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_got, g_ref, rtol=1e-5, atol=1e-6)


def test_tf_function_training_step_matches_reference(rng):
    table = rng.standard_normal((64, 8)).astype(np.float32)
    samples = random_ragged(rng, 32, 64, 5, empty_fraction=0.1)
    rt = ragged(samples)
    v_sok, v_ref = sok.Variable(table), tf.Variable(table)
    opt_sok, opt_ref = tf.keras.optimizers.SGD(0.5), tf.keras.optimizers.SGD(0.5)

    @tf.function
    def step():
        with tf.GradientTape(persistent=True) as tape:
            a = sok.lookup_sparse([v_sok], [rt], combiners=["mean"])[0]
            b = tf.nn.embedding_lookup_sparse(v_ref, rt.to_sparse(), None, combiner="mean")
            la = tf.reduce_sum(tf.square(a - 1.0))
            lb = tf.reduce_sum(tf.square(b - 1.0))
        opt_sok.apply_gradients([(tape.gradient(la, v_sok), v_sok)])
        opt_ref.apply_gradients([(tape.gradient(lb, v_ref), v_ref)])
        return la, lb

    for _ in range(5):
        la, lb = step()
        np.testing.assert_allclose(la.numpy(), lb.numpy(), rtol=1e-5)
    np.testing.assert_allclose(v_sok.numpy(), v_ref.numpy(), rtol=1e-5, atol=1e-6)


def test_sparse_tensor_input_equals_ragged(rng):
    table = tf.constant(rng.standard_normal((10, 3)).astype(np.float32))
    samples = [[1, 2], [], [3, 3, 9], []]  # trailing empty row kept
    rt = ragged(samples)
    a = sok.lookup_sparse([table], [rt], combiners=["sum"])[0]
    b = sok.lookup_sparse([table], [rt.to_sparse()], combiners=["sum"])[0]
    assert a.shape == (4, 3)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_allclose(a.numpy(), numpy_lookup(table.numpy(), samples, None, "sum"),
                               rtol=1e-6)


# ---------------------------------------------------------------- bad input

def call_raw(params, ids, splits, combiners=("sum",), weighted=(False,), weights=None,
             names=("user",)):
    """The raw op and, as its contract asks, SokLookupCheck of its check
    output (a GPU kernel reports bad input there; the CPU kernel at once)."""
    n = len(params)
    lib = sok.ops.library.load()
    embeddings, checks = lib.sok_fused_lookup(
        params=params, ids=ids, row_splits=splits,
        weights=weights if weights is not None else [tf.zeros([0])] * n,
        combiners=list(combiners), weighted=list(weighted), max_norms=[0.0] * n,
        table_names=list(names))
    # sok_graph's own way (ops/lookup.py): eagerly at once, in a TF1 graph
    # as a control dependency of the embeddings.
    return lookup_ops._checked(list(embeddings), checks, list(names))


def test_id_out_of_range_names_table_and_position():
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"ids of table 'user' \(table 0\) must be in \[0, 4\).*got 4 at position 2"):
        call_raw([tf.zeros([4, 2])], [tf.constant([0, 1, 4, 2], tf.int64)],
                 [tf.constant([0, 2, 4], tf.int64)])


def test_negative_id_rejected():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"got -1 at position 1"):
        call_raw([tf.zeros([4, 2])], [tf.constant([0, -1], tf.int32)],
                 [tf.constant([0, 2], tf.int64)])


@pytest.mark.parametrize("splits,pattern", [
    ([1, 2], r"row_splits\[0\]=1"),
    ([0, 2, 1, 3], r"row_splits\[2\]=1 after row_splits\[1\]=2"),
    ([0, 1, 2], r"end at the number of ids \(3\); got row_splits\[2\]=2"),
])
def test_malformed_row_splits(splits, pattern):
    with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
        call_raw([tf.zeros([4, 2])], [tf.constant([0, 1, 2], tf.int64)],
                 [tf.constant(splits, tf.int64)])


def test_weights_length_mismatch():
    with pytest.raises(tf.errors.InvalidArgumentError, match="one weight per id"):
        call_raw([tf.zeros([4, 2])], [tf.constant([0, 1], tf.int64)],
                 [tf.constant([0, 2], tf.int64)], weighted=[True], weights=[tf.ones([3])])


def test_wrong_rank_params():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="matrix|rank"):
        call_raw([tf.zeros([4])], [tf.constant([0], tf.int64)], [tf.constant([0, 1], tf.int64)])


def test_attr_list_length_mismatch():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="num_tables"):
        call_raw([tf.zeros([4, 2])], [tf.constant([0], tf.int64)],
                 [tf.constant([0, 1], tf.int64)], combiners=["sum", "sum"])


def test_raw_op_with_more_tables_than_ids_is_rejected():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                       match="params must have 1 entries"):
        sok.ops.library.load().sok_fused_lookup(
            params=[tf.zeros([4, 2]), tf.zeros([4, 2])], ids=[tf.constant([0], tf.int64)],
            row_splits=[tf.constant([0, 1], tf.int64)], weights=[tf.zeros([0])],
            combiners=["sum"], weighted=[False], max_norms=[0.0], table_names=["user"])


def test_raw_op_table_of_another_dtype_than_the_weights_is_rejected():
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="params of table 'user' .* must be float.*got half"):
        call_raw([tf.zeros([4, 2], tf.float16)], [tf.constant([0], tf.int64)],
                 [tf.constant([0, 1], tf.int64)])


def test_unknown_combiner_in_raw_op():
    # TensorFlow's check of the attribute's allowed values (the one list of
    # tf_ops/lookup/core/combiner.h) names the value.
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                       match=r"""['"]max['"].*sum.*mean.*sqrtn"""):
        call_raw([tf.zeros([4, 2])], [tf.constant([0], tf.int64)],
                 [tf.constant([0, 1], tf.int64)], combiners=["max"])


def test_graph_mode_errors_at_run_time_name_the_table():
    def build():
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        out = call_raw([tf.zeros([4, 2])], [ids], [tf.constant([0, 1], tf.int64)])
        return ids, out

    graph = tf.Graph()
    with graph.as_default():
        ids, out = build()
        with tf.compat.v1.Session(graph=graph) as sess:
            with pytest.raises(tf.errors.InvalidArgumentError, match="table 'user'.*got 9"):
                sess.run(out, {ids: [9]})


# --------------------------------------------- tables that are variables

def test_variable_tables_are_read_in_place_not_copied_whole(rng):
    """A plain resource variable reaches the op as its handle: no
    ReadVariableOp of the whole table (which copies it once sparse updates
    have touched the variable)."""
    graph = tf.Graph()
    with graph.as_default():
        v = tf.compat.v1.get_variable("t", initializer=rng.standard_normal((50, 4)).astype(
            np.float32), use_resource=True)
        before = set(graph.get_operations())
        sok.lookup_sparse(v, ragged([[1, 2], [3]]))
        added = [op for op in graph.get_operations() if op not in before]
        lookups = [op for op in added if op.type == "SokFusedLookup"]
        assert len(lookups) == 1
        assert lookups[0].inputs[0].dtype == tf.resource
        assert not [op for op in added if op.type == "ReadVariableOp"]


@pytest.mark.parametrize("in_function", [False, True])
def test_variables_after_sparse_updates_tensors_and_dynamic_tables_in_one_call(rng, in_function):
    tables = [rng.standard_normal((30, 4)).astype(np.float32) for _ in range(3)]
    tf_var, sok_var = tf.Variable(tables[0]), sok.Variable(tables[1])
    dyn = sok.DynamicVariable(dimension=4, initializer="zeros")
    new_rows = rng.standard_normal((3, 4)).astype(np.float32)
    for var, table in ((tf_var, tables[0]), (sok_var, tables[1])):
        var.scatter_update(tf.IndexedSlices(tf.constant(new_rows), tf.constant([0, 7, 29])))
        table[[0, 7, 29]] = new_rows  # the reference follows the updates
    samples = [random_ragged(rng, 12, 30, 4) for _ in range(4)]
    params = [tf_var, sok_var, tf.constant(tables[2]), dyn]

    def lookup():
        return sok.lookup_sparse(params, [ragged(s) for s in samples], combiners="sum")

    got = (tf.function(lookup) if in_function else lookup)()
    for t in range(3):
        np.testing.assert_allclose(got[t].numpy(), numpy_lookup(tables[t], samples[t], None,
                                                                "sum"), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[3].numpy(), np.zeros((12, 4), np.float32))


def test_variable_in_a_mirrored_strategy_matches_tf(rng):
    """tf.distribute's variables pick a replica's component on read: their rows
    are gathered before the fused op."""
    table = rng.standard_normal((20, 3)).astype(np.float32)
    samples = random_ragged(rng, 6, 20, 3, empty_fraction=0.0)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        v = tf.Variable(table)

    def step():
        with tf.GradientTape() as tape:
            out = sok.lookup_sparse(v, ragged(samples), combiners="mean")
            loss = tf.reduce_sum(out * out)
        return out, tf.convert_to_tensor(tape.gradient(loss, v))

    out, grad = strategy_run(strategy, tf.function(step))
    ref_var = tf.Variable(table)
    with tf.GradientTape() as tape:
        ref = tf.nn.embedding_lookup_sparse(ref_var, ragged(samples).to_sparse(), None,
                                            combiner="mean")
        loss = tf.reduce_sum(ref * ref)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad.numpy(), tf.convert_to_tensor(
        tape.gradient(loss, ref_var)).numpy(), rtol=1e-5, atol=1e-6)


def test_uninitialized_variable_table_is_a_clear_error():
    graph = tf.Graph()
    with graph.as_default():
        v = tf.compat.v1.get_variable("emb", shape=[10, 2], use_resource=True)
        out = sok.lookup_sparse(v, ragged([[1]]))
        with tf.compat.v1.Session(graph=graph) as sess:
            with pytest.raises(tf.errors.FailedPreconditionError,
                               match="the variable of table 'emb' .*initialized"):
                sess.run(out)


def test_variable_tables_of_different_dtypes_are_rejected(rng):
    a = tf.Variable(rng.standard_normal((4, 2)).astype(np.float16))
    b = tf.constant(rng.standard_normal((4, 2)).astype(np.float32))
    with pytest.raises(TypeError, match="one dtype"):
        sok.lookup_sparse([a, b], [ragged([[1]]), ragged([[2]])])


# ------------------------------------------------------- the deferred check

def _check_of(bad_position=None, bad_id=0, split_key=None, values=(0, 0), rows=4, nnz=3):
    """A check output [7, 1] as a GPU forward leaves it (SOK_LOOKUP_CHECK_ROWS)."""
    none = np.iinfo(np.int64).max
    return tf.constant([[none if bad_position is None else bad_position], [bad_id], [rows],
                        [none if split_key is None else split_key], [values[0]], [values[1]],
                        [nnz]], tf.int64)


@pytest.mark.parametrize("check,pattern", [
    (dict(bad_position=2, bad_id=9), r"ids of table 'user' \(table 0\) must be in \[0, 4\).*"
                                     r"got 9 at position 2"),
    (dict(split_key=4, values=(1, 2)), r"row_splits\[2\]=1 after row_splits\[1\]=2"),
    (dict(split_key=0, values=(1, 0)), r"start at 0.*got row_splits\[0\]=1(?! after)"),
    (dict(split_key=5, values=(2, 0)), r"end at the number of ids \(3\); got row_splits\[2\]=2(?! after)"),
    # row_splits are reported first, as the CPU kernel checks them first
    (dict(bad_position=0, bad_id=-1, split_key=0, values=(1, 0)), r"row_splits\[0\]=1")])
def test_check_op_reports_what_a_gpu_forward_found(check, pattern):
    lib = sok.ops.library.load()
    with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
        lib.sok_lookup_check(_check_of(**check), num_tables=1, table_names=["user"])
    lib.sok_lookup_check(_check_of(), num_tables=1, table_names=["user"])  # nothing found


def test_check_op_rejects_a_check_of_the_wrong_shape():
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"checks must be \[7, 2\].*got shape \[7,1\]"):
        sok.ops.library.load().sok_lookup_check(_check_of(), num_tables=2)


def test_check_runs_in_a_function_without_holding_up_the_embeddings():
    """Inside a tf.function the check is a stateful op of its own (nothing
    consumes it) and still fails the call; in a TF1 graph the embeddings
    depend on it."""
    lib = sok.ops.library.load()

    @tf.function
    def step(check):
        lib.sok_lookup_check(check, num_tables=1, table_names=["user"])
        return tf.constant(1.0)

    assert float(step(_check_of())) == 1.0
    with pytest.raises(tf.errors.InvalidArgumentError, match="got 9 at position 2"):
        step(_check_of(bad_position=2, bad_id=9))

    @tf.function
    def lookup():
        return lookup_ops.fused_lookup([tf.ones([4, 2])], [tf.constant([1, 2], tf.int64)],
                                       [tf.constant([0, 2], tf.int64)], combiners=["sum"])[0]

    graph = lookup.get_concrete_function().graph
    ops = graph.get_operations()
    check = [o for o in ops if o.type == "SokLookupCheck"]
    assert len(check) == 1 and not check[0].outputs
    # Only the function's end waits for it: its control outputs' NoOp (TF 2),
    # or the Identity of its return value (TF 1.15).
    ends = {t.op for t in graph.outputs}
    waiting = [o for o in ops if check[0] in o.control_inputs]
    assert all(o.type == "NoOp" or o in ends for o in waiting), [o.type for o in waiting]
    with tf.Graph().as_default():
        out = lookup_ops.fused_lookup([tf.ones([4, 2])], [tf.constant([1, 2], tf.int64)],
                                      [tf.constant([0, 2], tf.int64)], combiners=["sum"])[0]
        assert [o.type for o in out.op.control_inputs] == ["SokLookupCheck"]
