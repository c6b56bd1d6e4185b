"""Property-based fuzzing of every op wrapper and Python entry point.

Each case is drawn by hypothesis: valid inputs (empty tensors, dimension 0
and 1, NaN/Inf weights, rows and gradients, extreme ids and keys) or inputs
with exactly one thing wrong (dtype, rank, negative / huge / out-of-range
ids, row_splits that decrease or overrun, list lengths that disagree, bad
attribute values). A valid case must equal an independent reference (numpy,
plain TensorFlow ops, or a dict model of a table); a malformed one must raise
TypeError, ValueError or tf.errors.InvalidArgumentError whose message names
what is wrong. A crash (abort, segfault) kills this pytest process and fails
the suite.

CI runs a fixed, derandomized set of >= 2,000 cases; SOK_GRAPH_FUZZ_LONG=1
runs 25 times as many with fresh random seeds (SOK_GRAPH_FUZZ_SCALE sets the
factor). The last test prints how many cases ran.
"""

import collections
import datetime
import os
import tempfile
import time

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import sok_graph as sok
from sok_graph.dump_load import CheckpointError
from sok_graph.ops import sharding as sharding_ops
from sok_graph.ops import dynamic as dynamic_ops
from sok_graph.ops import lookup as lookup_ops
from sok_graph.ops import util as util_ops

LONG = os.environ.get("SOK_GRAPH_FUZZ_LONG", "") not in ("", "0")
SCALE = int(os.environ.get("SOK_GRAPH_FUZZ_SCALE", "25" if LONG else "1"))
MIN_CI_CASES = 2000

CASES = collections.Counter()
ERRORS = (TypeError, ValueError, tf.errors.InvalidArgumentError)
# TF 1.x's eager runtime does not check attrs against an op's allowed types:
# a dtype no kernel takes is found at kernel lookup, as a NotFoundError that
# lists the registered kernels (TF 2.x: InvalidArgumentError naming the attr).
TF1_KERNEL_LOOKUP = "All kernels registered for op"
if tf.__version__.startswith("1."):
    ERRORS += (tf.errors.NotFoundError,)
I32 = np.iinfo(np.int32)
I64 = np.iinfo(np.int64)
COMBINERS = ("sum", "mean", "sqrtn")
SPECIAL_FLOATS = (float("nan"), float("inf"), float("-inf"))


def fuzz(examples):
    """hypothesis settings: `examples` cases in CI, SCALE times as many (and
    random rather than fixed seeds) in the long mode. CI reports a failing
    case as drawn (shrinking can take minutes); the long mode shrinks it."""
    phases = list(Phase) if LONG else [p for p in Phase if p != Phase.shrink]
    return settings(max_examples=examples * SCALE, deadline=None, derandomize=not LONG,
                    database=None, print_blob=True, phases=phases,
                    suppress_health_check=list(HealthCheck))


def count(name):
    CASES[name] += 1


def expect_error(fn, words):
    """fn() must raise one of ERRORS with a message containing one of `words`,
    and leave the process able to compute (still_computes)."""
    try:
        fn()
    except ERRORS as e:
        message = str(e)
        if isinstance(e, tf.errors.NotFoundError):
            words = [TF1_KERNEL_LOOKUP]
        assert any(w in message for w in words), (
            f"error message names none of {words}: {type(e).__name__}: {message}")
        still_computes()
        return e
    raise AssertionError(f"expected an error naming one of {words}; the call succeeded")


AFTER_ERROR_CHECKS = collections.Counter()


def still_computes():
    """A small fused lookup and its gradient on the default device give
    numpy's answer. On a GPU, a kernel that faulted on the rejected input
    would have poisoned the CUDA context and every later op fails."""
    table = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    with tf.GradientTape() as tape:
        tape.watch(table)
        out, = lookup_ops.fused_lookup([table], [tf.constant([2, 0, 2], tf.int64)],
                                       [tf.constant([0, 2, 3], tf.int64)], combiners=["sum"])
    grad = tape.gradient(out, table)
    np.testing.assert_array_equal(out.numpy(), [[6.0, 8.0], [5.0, 6.0]])
    np.testing.assert_array_equal(tf.convert_to_tensor(grad).numpy(),
                                  [[1.0, 1.0], [0.0, 0.0], [2.0, 2.0]])
    AFTER_ERROR_CHECKS["checks"] += 1


def close(got, want, rtol=1e-5, atol=1e-5):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
    with np.errstate(all="ignore"):
        ok = np.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True) | (got == want)
    assert ok.all(), f"got\n{got}\nexpected\n{want}"


def finite(lo, hi, width=32):
    """Floats in [lo, hi]: zero, or of magnitude >= 1/8. TensorFlow flushes
    denormals to zero in its kernels, so tiny values (and products of them)
    would make a float32 reference disagree for that reason alone."""
    return st.one_of(st.just(0.0), st.floats(0.125, hi, width=width),
                     st.floats(lo, -0.125, width=width))


def weights_strategy():
    """Per-id weights: mostly moderate finite values, sometimes NaN / +-Inf / 0."""
    return st.one_of(finite(-50, 50), st.sampled_from(SPECIAL_FLOATS + (0.0,)))


def ragged_ids(draw, batch, rows, dtype):
    """(ids, row_splits) of `batch` samples with 0..4 ids in [0, rows) each."""
    counts = [draw(st.integers(0, 4)) if rows > 0 else 0 for _ in range(batch)]
    nnz = sum(counts)
    ids = np.array([draw(st.integers(0, rows - 1)) for _ in range(nnz)], dtype) if nnz else \
        np.zeros([0], dtype)
    if nnz and draw(st.booleans()):  # the boundary ids
        ids[0], ids[-1] = 0, rows - 1
    return ids, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


# ------------------------------------------------------------ numpy references

F32 = np.float32


def ref_lookup(params, ids, splits, weights, combiner, max_norm):
    """embeddings [batch, dim] with the semantics of tf.nn.embedding_lookup_sparse
    (and the op's documented choices: an empty sample, or weights summing to
    zero, give a zero row; max_norm <= 0 disables clipping). Computed in
    float32, one id after another, as the op documents: with tiny or
    non-finite weights, float64 would round (and overflow) differently."""
    p = np.asarray(params, F32)
    batch, dim = len(splits) - 1, p.shape[1]
    out = np.zeros((batch, dim), F32)
    with np.errstate(all="ignore"):
        for b in range(batch):
            acc, wsum, wsq = np.zeros(dim, F32), F32(0), F32(0)
            for j in range(splits[b], splits[b + 1]):
                row = p[ids[j]]
                w = F32(1) if weights is None else F32(weights[j])
                acc = acc + (w * clip_scale(row, max_norm)) * row
                wsum = wsum + w
                wsq = wsq + w * w
            out[b] = acc * combiner_scale(combiner, wsum, wsq)
    return out


def norm32(row):
    sq = F32(0)
    for v in row:
        sq = sq + v * v
    return sq, np.sqrt(sq)


def clip_scale(row, max_norm):
    """tf.clip_by_norm's factor for one row."""
    if not max_norm or max_norm <= 0:
        return F32(1)
    _, norm = norm32(row)
    return F32(max_norm) / norm if norm > F32(max_norm) else F32(1)


def combiner_scale(combiner, wsum, wsq):
    if combiner == "sum":
        return F32(1)
    if combiner == "mean":
        return F32(1) / wsum if wsum != 0 else F32(0)
    # A NaN weight makes the factor NaN (TensorFlow's embedding_lookup_sparse
    # divides by it too), so every row of the sample gets a NaN gradient.
    return F32(1) / np.sqrt(wsq) if wsq != 0 else F32(0)


def ref_lookup_grad(params, ids, splits, weights, combiner, max_norm, grads):
    """d(sum(embeddings * grads)) / d(params), dense [rows, dim], in float32
    with each row summed in position order."""
    p = np.asarray(params, F32)
    g = np.asarray(grads, F32)
    out = np.zeros_like(p)
    with np.errstate(all="ignore"):
        for b in range(len(splits) - 1):
            ws = [F32(1) if weights is None else F32(weights[j])
                  for j in range(splits[b], splits[b + 1])]
            wsum, wsq = F32(0), F32(0)
            for w in ws:
                wsum, wsq = wsum + w, wsq + w * w
            scale = combiner_scale(combiner, wsum, wsq)
            for j, w in zip(range(splits[b], splits[b + 1]), ws):
                out[ids[j]] += (w * scale) * g[b]
        if max_norm and max_norm > 0:
            m = F32(max_norm)
            for r in np.unique(np.asarray(ids, np.int64)):
                x, a = p[r], out[r].copy()
                sq, norm = norm32(x)
                dot = F32(0)
                for v, gv in zip(x, a):
                    dot = dot + v * gv
                if norm > m:
                    out[r] = (m / norm) * (a - x * (dot / sq))
    return out


def dense_of(slices, shape):
    """A gradient (IndexedSlices with unique indices, or dense) as a dense array."""
    out = np.zeros(shape)
    if isinstance(slices, tf.IndexedSlices):
        idx = slices.indices.numpy()
        assert len(np.unique(idx)) == len(idx), f"duplicate gradient indices {idx}"
        out[idx] = slices.values.numpy()
    else:
        out[...] = slices.numpy()
    return out


# ------------------------------------------------------------- fused lookup op

LOOKUP_FAULTS = ("bad_id", "splits_decreasing", "splits_overrun", "splits_first", "splits_empty",
                 "splits_rank2", "ids_rank2", "params_rank", "weights_len", "weights_rank2",
                 "combiner", "combiners_len", "ids_list_len", "ids_float", "params_int",
                 "mixed_id_dtypes")


@fuzz(350)
@given(st.data())
def test_fused_lookup_op(data):
    draw = data.draw
    n = draw(st.integers(1, 3))
    dtype = draw(st.sampled_from([np.float32, np.float32, np.float16]))
    id_dtype = draw(st.sampled_from([np.int32, np.int64]))
    fault = draw(st.sampled_from((None,) * 6 + LOOKUP_FAULTS))
    tables = []
    for _ in range(n):
        rows, dim, batch = draw(st.integers(0, 12)), draw(st.integers(0, 4)), \
            draw(st.integers(0, 6))
        params = np.array(draw(st.lists(finite(-10, 10, 16), min_size=rows * dim,
                                        max_size=rows * dim)), dtype).reshape(rows, dim)
        ids, splits = ragged_ids(draw, batch, rows, id_dtype)
        weights = None
        if draw(st.booleans()):
            weights = np.array(draw(st.lists(weights_strategy(), min_size=len(ids),
                                             max_size=len(ids))), np.float32)
        combiner = draw(st.sampled_from(COMBINERS))
        max_norm = draw(st.sampled_from([None, None, 0.5, 2.0, -1.0]))
        tables.append([params, ids, splits, weights, combiner, max_norm])
    t = draw(st.integers(0, n - 1))
    T = tables[t]
    words = None
    if fault == "bad_id":
        bad = draw(st.sampled_from([-1, len(T[0]), len(T[0]) + 7, -(2 ** 31),
                                    2 ** 31 - 1] + ([2 ** 62, I64.min, I64.max]
                                                    if id_dtype == np.int64 else [])))
        if len(T[1]) == 0:
            T[1] = np.array([bad], id_dtype)
            T[2] = np.array([0] * (len(T[2]) - 1) + [0, 1], np.int64) if len(T[2]) > 1 else \
                np.array([0, 1], np.int64)
            T[3] = None if T[3] is None else np.ones(1, np.float32)
        else:
            T[1] = T[1].copy()
            T[1][draw(st.integers(0, len(T[1]) - 1))] = bad
        words = ["must be in [0,"]
    elif fault == "splits_decreasing":
        if len(T[2]) < 2:
            T[2] = np.array([0, 0], np.int64)
        k = draw(st.integers(1, len(T[2]) - 1))
        T[2] = T[2].copy()
        T[2][k] = T[2][k - 1] - draw(st.integers(1, 3))
        words = ["row_splits"]
    elif fault == "splits_overrun":
        T[2] = T[2].copy()
        T[2][-1] += draw(st.sampled_from([1, 5, 2 ** 40]))
        words = ["row_splits"]
    elif fault == "splits_first":
        T[2] = T[2].copy()
        T[2][0] = draw(st.sampled_from([-1, 1]))
        words = ["row_splits"]
    elif fault == "splits_empty":
        T[2] = np.zeros([0], np.int64)
        words = ["row_splits"]
    elif fault == "splits_rank2":
        T[2] = T[2].reshape(1, -1)
        words = ["row_splits"]
    elif fault == "ids_rank2":
        T[1] = T[1].reshape(-1, 1)
        words = ["ids of"]
    elif fault == "params_rank":
        T[0] = T[0].reshape(-1) if draw(st.booleans()) else T[0][..., None]
        words = ["params of"]
    elif fault == "weights_len":
        T[3] = np.ones(len(T[1]) + draw(st.sampled_from([1, 2])), np.float32)
        words = ["weights of"]
    elif fault == "weights_rank2":
        T[3] = np.ones((len(T[1]), 1), np.float32)
        words = ["weights of"]
    elif fault == "combiner":
        T[4] = draw(st.sampled_from(["max", "", "SUM", "mean "]))
        # TensorFlow checks the attribute against its allowed values (the
        # combiner list of tf_ops/lookup/core/combiner.h) before the kernel.
        words = ["'combiners'", "combiners["]
    elif fault == "ids_float":
        T[1] = T[1].astype(np.float32)
        words = ["Tindices", "ids"]
    elif fault == "params_int":
        T[0] = T[0].astype(np.int32)
        words = ["params of all tables must have one dtype"]
    elif fault == "mixed_id_dtypes":
        if n == 1:
            tables.append([np.zeros((1, 1), dtype), np.zeros([0], id_dtype),
                           np.zeros([1], np.int64), None, "sum", None])
            n = 2
        other = np.int32 if id_dtype == np.int64 else np.int64
        tables[-1][1] = tables[-1][1].astype(other)
        words = ["ids of all tables must have one dtype"]
    params, ids, splits, weights, combiners, max_norms = (list(x) for x in zip(*tables))
    if fault == "combiners_len":
        combiners.append("sum")
        words = ["num_tables"]
    if fault == "ids_list_len":
        if n == 1:
            ids.append(ids[0])
        else:
            ids.pop()
        words = ["ids must have one entry per table"]

    def run():
        return lookup_ops.fused_lookup(
            [tf.constant(p) for p in params], [tf.constant(i) for i in ids],
            [tf.constant(s) for s in splits],
            weights=[None if w is None else tf.constant(w) for w in weights],
            combiners=combiners, max_norms=max_norms)

    count("fused_lookup")
    if words is not None:
        expect_error(run, words)
        return
    # Forward against numpy; backward (upstream gradients with NaN/Inf
    # too) against the numpy derivative.
    tensors = [tf.constant(p) for p in params]
    upstream = []
    for p, s in zip(params, splits):
        g = np.array(draw(st.lists(st.one_of(finite(-5, 5, 32),
                                             st.sampled_from(SPECIAL_FLOATS)),
                                   min_size=(len(s) - 1) * p.shape[1],
                                   max_size=(len(s) - 1) * p.shape[1])), dtype)
        upstream.append(g.reshape(len(s) - 1, p.shape[1]))
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        out = lookup_ops.fused_lookup(
            tensors, [tf.constant(i) for i in ids], [tf.constant(s) for s in splits],
            weights=[None if w is None else tf.constant(w) for w in weights],
            combiners=combiners, max_norms=max_norms)
    grads = tape.gradient(out, tensors, output_gradients=[tf.constant(g) for g in upstream])
    tol = dict(rtol=2e-2, atol=5e-2) if dtype == np.float16 else dict(rtol=1e-4, atol=1e-4)
    for k in range(n):
        # Weights enter the op in the tables' dtype, and results leave in it
        # (float16 rounds, and overflows to Inf), as the reference does too.
        w = None if weights[k] is None else weights[k].astype(dtype).astype(np.float32)
        with np.errstate(over="ignore"):
            want = ref_lookup(params[k], ids[k], splits[k], w, combiners[k],
                              max_norms[k]).astype(dtype)
            want_grad = ref_lookup_grad(params[k], ids[k], splits[k], w, combiners[k],
                                        max_norms[k], upstream[k]).astype(dtype)
        assert out[k].shape == want.shape
        close(out[k].numpy(), want, **tol)
        close(dense_of(grads[k], params[k].shape), want_grad, **tol)


# ---------------------------------------------------------- sok.lookup_sparse

SPARSE_FAULTS = ("sp_ids_len", "weights_len", "combiner", "combiners_len", "numpy_ids",
                 "ragged_rank2", "sparse_rank3", "key_dtype", "int_weights", "params_f64",
                 "params_rank", "bad_static_id", "empty_params", "mixed_dtypes",
                 "sparse_duplicate", "sparse_outside")


@fuzz(220)
@given(st.data())
def test_lookup_sparse_static_and_dynamic(data):
    draw = data.draw
    n = draw(st.integers(1, 3))
    fault = draw(st.sampled_from((None,) * 5 + SPARSE_FAULTS))
    params, models, ids_list, weights_list, combiners, max_norms = [], [], [], [], [], []
    for t in range(n):
        dim, batch = draw(st.integers(1, 3)), draw(st.integers(0, 5))
        combiners.append(draw(st.sampled_from(COMBINERS)))
        max_norms.append(draw(st.sampled_from([None, None, 1.5])))
        if draw(st.booleans()):  # a static table
            rows = draw(st.integers(1, 8))
            value = np.array(draw(st.lists(finite(-4, 4, 32), min_size=rows * dim,
                                           max_size=rows * dim)), np.float32).reshape(rows, dim)
            kind = draw(st.sampled_from(["sok", "tf", "tensor"]))
            params.append(sok.Variable(value) if kind == "sok" else tf.Variable(value)
                          if kind == "tf" else tf.constant(value))
            models.append(value)
            ids, splits = ragged_ids(draw, batch, rows, np.int64)
        else:  # a dynamic table: keys of any int64 value; some rows assigned first
            var = sok.DynamicVariable(dim, initializer="zeros")
            pool = draw(st.lists(st.one_of(st.integers(-3, 12), st.sampled_from(
                [I64.min, I64.max, 2 ** 40, -(2 ** 40)])), min_size=1, max_size=8, unique=True))
            model = {}
            assigned = draw(st.lists(st.sampled_from(pool), unique=True))
            if assigned:
                rows_ = np.array(draw(st.lists(finite(-4, 4, 32),
                                               min_size=len(assigned) * dim,
                                               max_size=len(assigned) * dim)),
                                 np.float32).reshape(-1, dim)
                sok.assign(var, tf.constant(assigned, tf.int64), rows_)
                model.update(zip(assigned, rows_))
            params.append(var)
            models.append(model)
            counts = [draw(st.integers(0, 4)) for _ in range(batch)]
            ids = np.array([draw(st.sampled_from(pool)) for _ in range(sum(counts))], np.int64)
            splits = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        ids_list.append((ids, splits))
        weights_list.append(None if draw(st.booleans()) else np.array(draw(st.lists(
            weights_strategy(), min_size=len(ids), max_size=len(ids))), np.float32))
    as_sparse = draw(st.booleans())

    def ragged(values, splits, dtype):
        rt = tf.RaggedTensor.from_row_splits(tf.constant(values, dtype), splits)
        return rt.to_sparse() if as_sparse else rt

    sp_ids = [ragged(i, s, tf.int64) for i, s in ids_list]
    sp_weights = [None if w is None else ragged(w, s, tf.float32)
                  for w, (_, s) in zip(weights_list, ids_list)]
    if as_sparse and draw(st.booleans()):
        # The entries of each SparseTensor in any order (ids with their
        # weights): the lookup sorts them as tf.sparse.reorder would.
        for k, (ids, _) in enumerate(ids_list):
            perm = np.array(draw(st.permutations(range(len(ids)))), np.int64)
            shuffled = [tf.SparseTensor(tf.gather(sp.indices, perm), tf.gather(sp.values, perm),
                                        sp.dense_shape) for sp in (sp_ids[k], sp_weights[k])
                        if sp is not None]
            sp_ids[k] = shuffled[0]
            if sp_weights[k] is not None:
                sp_weights[k] = shuffled[1]
    if all(w is None for w in sp_weights) and draw(st.booleans()):
        sp_weights = None
    kwargs = dict(combiners=list(combiners), max_norm=list(max_norms))
    t = draw(st.integers(0, n - 1))
    words = None
    call_params = list(params)
    if fault == "sp_ids_len":
        sp_ids = sp_ids[:-1] if n > 1 else sp_ids + sp_ids
        words = ["sp_ids must have one entry per table"]
    elif fault == "weights_len":
        sp_weights = [None] * (n + 1)
        words = ["sp_weights must have one entry per table"]
    elif fault == "combiner":
        kwargs["combiners"][t] = draw(st.sampled_from(["max", "avg", None, 3]))
        words = [f"combiners[{t}]"]
    elif fault == "combiners_len":
        kwargs["combiners"] = kwargs["combiners"] + ["sum"]
        words = ["combiners must have one entry per table"]
    elif fault == "numpy_ids":
        sp_ids[t] = ids_list[t][0]
        words = [f"sp_ids[{t}] must be a tf.SparseTensor or tf.RaggedTensor"]
    elif fault == "ragged_rank2":
        sp_ids[t] = tf.RaggedTensor.from_row_splits(
            tf.RaggedTensor.from_row_splits(tf.constant(ids_list[t][0]), ids_list[t][1]),
            [0, len(ids_list[t][1]) - 1])
        words = [f"sp_ids[{t}] must be a 2-D RaggedTensor"]
    elif fault == "sparse_rank3":
        sp_ids[t] = tf.SparseTensor(tf.zeros([0, 3], tf.int64), tf.zeros([0], tf.int64),
                                    [2, 2, 2])
        words = [f"sp_ids[{t}] must be a 2-D SparseTensor"]
    elif fault == "key_dtype":
        # Float ids for any table (int32 ids of an int64 dynamic table are
        # widened, as SOK does).
        sp_ids[t] = ragged(ids_list[t][0].astype(np.float32), ids_list[t][1], tf.float32)
        words = [f"sp_ids[{t}] must hold"]
    elif fault == "int_weights":
        sp_weights = [None] * n
        sp_weights[t] = ragged(np.ones(len(ids_list[t][0]), np.int32), ids_list[t][1], tf.int32)
        words = [f"sp_weights[{t}] must hold floats"]
    elif fault == "params_f64":
        call_params[t] = tf.zeros([3, 2], tf.float64)
        words = [f"params[{t}] must be float32"]
    elif fault == "params_rank":
        call_params[t] = tf.zeros(draw(st.sampled_from([[3], [3, 2, 1], []])), tf.float32)
        words = [f"params[{t}] must be a [rows, dim] matrix"]
    elif fault == "bad_static_id":
        static = [k for k in range(n) if not isinstance(params[k], sok.DynamicVariable)]
        if not static:
            call_params.append(tf.zeros([2, 1]))
            sp_ids.append(tf.ragged.constant([[0]], tf.int64))
            kwargs["combiners"].append("sum")
            kwargs["max_norm"].append(None)
            sp_weights = None if sp_weights is None else sp_weights + [None]
            static = [n]
        k = static[0]
        bad = draw(st.sampled_from([-1, -(2 ** 63), 2 ** 63 - 1, 10 ** 6]))
        rt = tf.ragged.constant([[0, bad]], tf.int64)
        sp_ids[k] = rt.to_sparse() if as_sparse else rt
        if sp_weights is not None:
            sp_weights[k] = None
        words = ["must be in [0,"]
    elif fault == "empty_params":
        call_params = []
        words = ["params must name at least one table"]
    elif fault == "mixed_dtypes":
        call_params.append(tf.zeros([2, 1], tf.float16))
        sp_ids.append(tf.ragged.constant([[0]], tf.int64))
        kwargs["combiners"].append("sum")
        kwargs["max_norm"].append(None)
        sp_weights = None if sp_weights is None else sp_weights + [None]
        words = ["all tables must share one dtype", "must be float32"]

    elif fault in ("sparse_duplicate", "sparse_outside"):
        # Row 0 twice, or a row past dense_shape's two rows.
        second = [0, 0] if fault == "sparse_duplicate" else [draw(st.integers(2, 9)), 0]
        sp_ids[t] = tf.SparseTensor([[0, 0], second], tf.constant([0, 0], tf.int64), [2, 2])
        if sp_weights is not None:
            sp_weights[t] = None
        words = ["must not repeat an index" if fault == "sparse_duplicate"
                 else "inside its dense_shape"]

    count("lookup_sparse")
    if words is not None:
        expect_error(lambda: sok.lookup_sparse(call_params, sp_ids, sp_weights, **kwargs), words)
        return
    out = sok.lookup_sparse(call_params, sp_ids, sp_weights, **kwargs)
    for k in range(n):
        ids, splits = ids_list[k]
        w = weights_list[k] if sp_weights is not None else None
        if isinstance(params[k], sok.DynamicVariable):
            model, dim = models[k], params[k].dimension
            table = {key: model.get(key, np.zeros(dim, np.float32)) for key in ids.tolist()}
            keys = sorted(table)
            dense = np.array([table[key] for key in keys], np.float32).reshape(-1, dim)
            local = np.searchsorted(keys, ids).astype(np.int64) if keys else ids
            want = ref_lookup(dense, local, splits, w, combiners[k], max_norms[k])
            # Every key looked up is now in the table, with its row.
            assert int(params[k].size[0]) == len(set(model) | set(ids.tolist()))
            if keys:
                rows, found = params[k].find(tf.constant(keys, tf.int64))
                assert found.numpy().all()
                close(rows.numpy(), dense)
        else:
            want = ref_lookup(models[k], ids, splits, w, combiners[k], max_norms[k])
            if w is None and len(splits) > 1 and np.all(np.diff(splits) > 0):
                # Cross-check against TensorFlow itself where it is defined alike.
                tf_out = tf.nn.embedding_lookup_sparse(
                    tf.constant(models[k]), tf.RaggedTensor.from_row_splits(
                        ids, splits).to_sparse(), None, combiner=combiners[k],
                    max_norm=max_norms[k])
                close(tf_out.numpy(), want)
        close(out[k].numpy(), want)


@fuzz(60)
@given(st.data())
def test_all2all_dense_embedding_any_index_shape(data):
    draw = data.draw
    rows, dim = draw(st.integers(1, 6)), draw(st.integers(1, 3))
    value = np.arange(rows * dim, dtype=np.float32).reshape(rows, dim)
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    size = int(np.prod(shape)) if shape else 1
    idx = np.array(draw(st.lists(st.integers(0, rows - 1), min_size=size, max_size=size)),
                   np.int64).reshape(shape)
    bad = draw(st.booleans()) and size > 0
    if bad:
        idx.reshape(-1)[draw(st.integers(0, size - 1))] = draw(st.sampled_from([-1, rows]))
    count("all2all_dense_embedding")
    if bad:
        expect_error(lambda: sok.all2all_dense_embedding(tf.constant(value), idx),
                     ["must be in [0,"])
        return
    out = sok.all2all_dense_embedding(sok.Variable(value), tf.constant(idx))
    close(out.numpy(), value[idx])


# ------------------------------------------------------------------- util ops

@fuzz(250)
@given(st.data())
def test_unique_with_counts(data):
    draw = data.draw
    dtype = draw(st.sampled_from([np.int32, np.int64]))
    info = np.iinfo(dtype)
    values = draw(st.lists(st.one_of(st.integers(-3, 3), st.integers(int(info.min),
                                                                     int(info.max)),
                                     st.sampled_from([int(info.min), int(info.max)])),
                           max_size=40))
    x = np.array(values, dtype)
    out_idx = draw(st.sampled_from([tf.int32, tf.int64]))
    fault = draw(st.sampled_from([None] * 4 + ["rank0", "rank2", "float", "bool", "out_idx"]))
    # Bad input goes to either op (they share their checks).
    unique = draw(st.sampled_from([util_ops.unique_with_counts, util_ops.unique]))
    count("unique_with_counts")
    if fault == "rank0":
        expect_error(lambda: unique(tf.constant(dtype(3))), ["x must be a vector"])
    elif fault == "rank2":
        expect_error(lambda: unique(tf.constant(x.reshape(1, -1))), ["x must be a vector"])
    elif fault == "float":
        expect_error(lambda: unique(tf.constant(x.astype(np.float32))), ["'T'", "attr"])
    elif fault == "bool":
        expect_error(lambda: unique(tf.constant(x > 0)), ["'T'", "attr"])
    elif fault == "out_idx":
        expect_error(lambda: unique(tf.constant(x), out_idx=tf.float32), ["out_idx"])
    else:
        y, idx, counts = util_ops.unique_with_counts(tf.constant(x), out_idx=out_idx)
        # Reference: numpy's unique, reordered by first appearance.
        u, first, inverse, c = np.unique(x, return_index=True, return_inverse=True,
                                         return_counts=True)
        order = np.argsort(first)
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        np.testing.assert_array_equal(y.numpy(), u[order])
        np.testing.assert_array_equal(idx.numpy(), rank[inverse.reshape(-1)])
        np.testing.assert_array_equal(counts.numpy(), c[order])
        assert idx.dtype == out_idx and counts.dtype == out_idx
        # unique: the same values and positions, without the counts.
        y2, idx2 = util_ops.unique(tf.constant(x), out_idx=out_idx)
        np.testing.assert_array_equal(y2.numpy(), u[order])
        np.testing.assert_array_equal(idx2.numpy(), rank[inverse.reshape(-1)])
        assert idx2.dtype == out_idx


@fuzz(300)
@given(st.data())
def test_unsorted_segment_sum(data):
    draw = data.draw
    dtype = draw(st.sampled_from([np.float32, np.float64, np.float16]))
    n = draw(st.integers(0, 8))
    rest = draw(st.lists(st.integers(0, 3), max_size=2))
    num = draw(st.integers(0, 5))
    id_dtype = draw(st.sampled_from([np.int32, np.int64]))
    num_dtype = draw(st.sampled_from([np.int32, np.int64]))
    size = n * int(np.prod(rest))
    values = np.array(draw(st.lists(st.one_of(finite(-100, 100, 16),
                                              st.sampled_from(SPECIAL_FLOATS)),
                                    min_size=size, max_size=size)), dtype).reshape([n] + rest)
    seg = np.array([draw(st.integers(-2, num - 1)) for _ in range(n)], id_dtype)
    fault = draw(st.sampled_from([None] * 5 + ["id_too_large", "num_negative", "num_overflow",
                                               "num_vector", "ids_len", "ids_rank2",
                                               "data_scalar", "data_int"]))
    num_t = tf.constant(num, num_dtype)
    data_t, seg_t = tf.constant(values), tf.constant(seg)
    words = None
    if fault == "id_too_large":
        if n == 0:
            values, seg = np.zeros([1] + rest, dtype), np.zeros([1], id_dtype)
            data_t = tf.constant(values)
        seg = seg.copy()
        seg[draw(st.integers(0, len(seg) - 1))] = draw(st.sampled_from(
            [num, num + 3] + ([2 ** 40, I64.max] if id_dtype == np.int64 else [I32.max])))
        seg_t = tf.constant(seg)
        words = ["segment_ids must be < num_segments"]
    elif fault == "num_negative":
        num_t = tf.constant(draw(st.sampled_from([-1, -(2 ** 31)])), num_dtype)
        seg_t = tf.constant(np.full(n, -1, id_dtype))
        words = ["num_segments must be >= 0"]
    elif fault == "num_overflow":
        data_t = tf.zeros([0] + [2] + rest, dtype)
        seg_t = tf.zeros([0], id_dtype)
        num_t = tf.constant(draw(st.sampled_from([2 ** 62, I64.max, 2 ** 63 // 2 + 1])),
                            tf.int64)
        words = ["num_segments"]
    elif fault == "num_vector":
        num_t = tf.constant([num, num], num_dtype)
        words = ["num_segments must be a scalar"]
    elif fault == "ids_len":
        seg_t = tf.constant(np.zeros(n + draw(st.sampled_from([1, 2])), id_dtype))
        words = ["segment_ids must be a vector with one id per row"]
    elif fault == "ids_rank2":
        seg_t = tf.constant(seg.reshape(-1, 1))
        words = ["segment_ids must be a vector"]
    elif fault == "data_scalar":
        data_t = tf.constant(dtype(1))
        seg_t = tf.zeros([0], id_dtype)
        words = ["data must have rank >= 1"]
    elif fault == "data_int":
        data_t = tf.constant(np.zeros(values.shape, np.int32))
        words = ["'T'", "attr"]
    count("unsorted_segment_sum")
    if words is not None:
        expect_error(lambda: util_ops.unsorted_segment_sum(data_t, seg_t, num_t), words)
        return
    upstream = tf.constant(np.array(draw(st.lists(
        st.one_of(finite(-5, 5, 16), st.sampled_from(SPECIAL_FLOATS)),
        min_size=num * int(np.prod(rest)), max_size=num * int(np.prod(rest)))),
        dtype).reshape([num] + rest))
    with tf.GradientTape() as tape:
        tape.watch(data_t)
        out = util_ops.unsorted_segment_sum(data_t, seg_t, num_t)
    grad = tape.gradient(out, data_t, output_gradients=upstream)
    want = np.zeros([num] + rest, np.float64)
    keep = seg >= 0
    with np.errstate(all="ignore"):
        np.add.at(want, seg[keep], values[keep].astype(np.float64))
    tol = dict(rtol=1e-2, atol=1e-1) if dtype == np.float16 else dict(rtol=1e-5, atol=1e-5)
    assert out.shape == want.shape and out.dtype == dtype
    close(out.numpy(), want, **tol)
    want_grad = np.zeros(values.shape, np.float64)
    if keep.any():
        want_grad[keep] = upstream.numpy()[seg[keep]].astype(np.float64)
    close(grad.numpy(), want_grad, **tol)


# ------------------------------------------------------------------- dist ops

@fuzz(250)
@given(st.data())
def test_bucketize_and_local_rows(data):
    draw = data.draw
    dtype = draw(st.sampled_from([np.int32, np.int64]))
    hi = int(np.iinfo(dtype).max)
    ids = np.array(draw(st.lists(st.one_of(st.integers(0, 20), st.integers(0, hi),
                                           st.just(hi)), max_size=30)), dtype)
    world = draw(st.integers(1, 9))
    fixed = draw(st.sampled_from([-1, -1] + list(range(world))))
    fault = draw(st.sampled_from([None] * 4 + ["negative", "world_zero", "world_huge",
                                               "world_int64", "fixed_too_big", "float",
                                               "rank2"]))
    count("bucketize_by_owner")
    if fault == "negative":
        neg = np.append(ids, draw(st.sampled_from([-1, int(np.iinfo(dtype).min)]))).astype(dtype)
        expect_error(lambda: sharding_ops.bucketize_by_owner(neg, world, fixed), ["ids must be >= 0"])
        expect_error(lambda: sharding_ops.local_rows(neg, world), ["ids must be >= 0"])
        return
    if fault in ("world_zero", "world_huge", "world_int64"):
        w = {"world_zero": draw(st.sampled_from([0, -3])), "world_huge": 2 ** 31 - 1,
             "world_int64": 2 ** 40}[fault]
        expect_error(lambda: sharding_ops.bucketize_by_owner(ids, w), ["world_size"])
        expect_error(lambda: sharding_ops.local_rows(ids, w), ["world_size"]) \
            if fault != "world_huge" else None
        return
    if fault == "fixed_too_big":
        expect_error(lambda: sharding_ops.bucketize_by_owner(ids, world, world + 1), ["fixed_owner"])
        return
    if fault == "float":
        expect_error(lambda: sharding_ops.bucketize_by_owner(ids.astype(np.float32), world),
                     ["'T'", "attr"])
        return
    if fault == "rank2":
        expect_error(lambda: sharding_ops.bucketize_by_owner(ids.reshape(-1, 1), world),
                     ["ids must be a vector"])
        return
    b = sharding_ops.bucketize_by_owner(tf.constant(ids), world, fixed)
    owner = np.full(len(ids), fixed) if fixed >= 0 else ids.astype(np.int64) % world
    perm = np.argsort(owner, kind="stable")
    np.testing.assert_array_equal(b.permutation.numpy(), perm)
    np.testing.assert_array_equal(b.ids.numpy(), ids[perm])
    np.testing.assert_array_equal(b.sizes.numpy(), np.bincount(owner, minlength=world))
    np.testing.assert_array_equal(b.inverse_permutation.numpy(), np.argsort(perm))
    shaped = ids.reshape(draw(st.sampled_from([[-1], [1, -1], [-1, 1]]))) if len(ids) else ids
    np.testing.assert_array_equal(sharding_ops.local_rows(tf.constant(shaped), world).numpy(),
                                  shaped // world)


# ---------------------------------------------------------- dynamic table ops

def new_table(draw, bounded=False):
    dim = draw(st.integers(1, 4))
    key_type = draw(st.sampled_from([tf.int64, tf.int32]))
    init = draw(st.sampled_from([0.0, 1.5, -2.0]))
    if bounded:
        cap = draw(st.sampled_from([4, 8, 16]))
        var = sok.DynamicVariable(dim, initializer=init, key_type=key_type, var_type="hybrid",
                                  init_capacity=cap, max_capacity=cap,
                                  evict_strategy=draw(st.sampled_from(["lru", "lfu"])))
    else:
        var = sok.DynamicVariable(dim, initializer=init, key_type=key_type,
                                  init_capacity=draw(st.sampled_from([0, 1, 16])))
    return var, dim, key_type, init


def keys_strategy(key_type, pool):
    return st.lists(st.sampled_from(pool), max_size=8)


def key_pool(draw, key_type):
    info = np.iinfo(key_type.as_numpy_dtype)
    return draw(st.lists(st.one_of(st.integers(-5, 30), st.sampled_from(
        [int(info.min), int(info.max), int(info.max) - 1])), min_size=1, max_size=12,
        unique=True))


def export_dict(var):
    keys, rows = var.export(chunk_size=3)
    out = dict(zip(keys.numpy().tolist(), rows.numpy()))
    assert len(out) == len(keys.numpy()), "export listed a key twice"
    return out


def rows_strategy(n, dim):
    return st.lists(st.one_of(finite(-10, 10, 32), st.sampled_from(SPECIAL_FLOATS)),
                    min_size=n * dim, max_size=n * dim)


DYNAMIC_OPS = ("find_or_insert", "unique_read", "find", "add", "sub", "update", "remove", "import", "export",
               "clear", "stats", "bad_key_dtype", "bad_key_rank", "bad_rows", "bad_default",
               "bad_dim", "bad_import_meta", "bad_export_args", "bad_frequencies")


@fuzz(150)
@given(st.data())
def test_dynamic_table_ops_against_a_dict(data):
    """A random program of table ops (and malformed calls) on an unbounded
    table; after every op the table equals a dict model."""
    draw = data.draw
    var, dim, key_type, init = new_table(draw)
    np_key = key_type.as_numpy_dtype
    pool = key_pool(draw, key_type)
    model = {}
    init_row = np.full(dim, init, np.float32)
    for op in draw(st.lists(st.sampled_from(DYNAMIC_OPS), min_size=1, max_size=10)):
        keys = np.array(draw(keys_strategy(key_type, pool)), np_key)
        k = tf.constant(keys, key_type)
        count("dynamic_table_ops")
        if op == "find_or_insert":
            got = var.sparse_read(k).numpy()
            for key in keys.tolist():
                model.setdefault(key, init_row.copy())
            close(got, np.array([model[x] for x in keys.tolist()]).reshape(-1, dim))
        elif op == "unique_read":
            distinct, got, positions = var.unique_read(k)
            want = list(dict.fromkeys(keys.tolist()))
            assert distinct.numpy().tolist() == want and distinct.dtype == key_type
            assert positions.numpy().tolist() == [want.index(x) for x in keys.tolist()]
            for key in want:
                model.setdefault(key, init_row.copy())
            close(got.numpy(), np.array([model[x] for x in want]).reshape(-1, dim))
        elif op == "find":
            default = draw(st.sampled_from([0.0, -1.0, float("nan")]))
            rows, found = var.find(k, default)
            np.testing.assert_array_equal(found.numpy(), [x in model for x in keys.tolist()])
            close(rows.numpy(), np.array([model.get(x, np.full(dim, default))
                                          for x in keys.tolist()]).reshape(-1, dim))
        elif op in ("add", "sub", "update"):
            rows = np.array(draw(rows_strategy(len(keys), dim)), np.float32).reshape(-1, dim)
            getattr(var, "scatter_" + op)(k, tf.constant(rows))
            with np.errstate(all="ignore"):
                for x, r in zip(keys.tolist(), rows):
                    cur = model.setdefault(x, init_row.copy())
                    model[x] = cur + r if op == "add" else cur - r if op == "sub" else r.copy()
        elif op == "remove":
            removed = int(var.remove(k))
            assert removed == len(set(keys.tolist()) & set(model))
            for x in set(keys.tolist()):
                model.pop(x, None)
        elif op == "import":
            rows = np.array(draw(rows_strategy(len(keys), dim)), np.float32).reshape(-1, dim)
            with_meta = draw(st.booleans())
            var.import_rows(k, tf.constant(rows),
                            tf.range(len(keys), dtype=tf.int64) if with_meta else None,
                            tf.ones([len(keys)], tf.int64) if with_meta else None)
            for x, r in zip(keys.tolist(), rows):
                model[x] = r.copy()
        elif op == "export":
            chunk = draw(st.integers(1, 5))
            keys_out, rows_out = var.export(chunk_size=chunk)
            got = dict(zip(keys_out.numpy().tolist(), rows_out.numpy()))
            assert set(got) == set(model)
        elif op == "clear":
            var.clear()
            model.clear()
        elif op == "stats":
            s = var.stats()
            assert int(s["size"]) == len(model) and int(s["evicted_total"]) == 0
        elif op == "bad_key_dtype":
            other = tf.int32 if key_type == tf.int64 else tf.int64
            if other == tf.int64:  # int32 keys of an int64 table are widened (SOK's rule)
                expect_error(lambda: var.sparse_read(tf.constant(keys, other)), ["keys for"])
            expect_error(lambda: dynamic_ops.scatter(var.handle, tf.constant(keys, other),
                                                     tf.zeros([len(keys), dim]), "add"),
                         ["keys must be"])
            expect_error(lambda: dynamic_ops.unique_find_or_insert(
                var.handle, tf.constant(keys, other), dim), ["keys must be"])
        elif op == "bad_key_rank":
            # sparse_read takes keys of any shape (tf.nn.embedding_lookup's);
            # the ops take a vector.
            expect_error(lambda: dynamic_ops.find(var.handle, tf.reshape(k, [-1, 1]), dim),
                         ["keys must be a vector"])
            expect_error(lambda: dynamic_ops.unique_find_or_insert(
                var.handle, tf.reshape(k, [-1, 1]), dim), ["keys must be a vector"])
        elif op == "bad_rows":
            shape = draw(st.sampled_from([[len(keys) + 1, dim], [len(keys), dim + 1],
                                          [len(keys)], [len(keys), dim, 1]]))
            expect_error(lambda: var.scatter_add(k, tf.zeros(shape)), ["rows must be"])
            expect_error(lambda: var.import_rows(k, tf.zeros(shape)), ["rows must be"])
        elif op == "bad_default":
            expect_error(lambda: var.find(k, tf.zeros([dim + 1])), ["default_value"])
        elif op == "bad_dim":
            expect_error(lambda: dynamic_ops.find_or_insert(var.handle, k, dim + 1),
                         ["does not match the table's dimension"])
            expect_error(lambda: dynamic_ops.unique_find_or_insert(var.handle, k, dim + 1),
                         ["does not match the table's dimension"])
        elif op == "bad_import_meta":
            expect_error(lambda: var.import_rows(k, tf.zeros([len(keys), dim]),
                                                 tf.zeros([len(keys) + 1], tf.int64)),
                         ["timestamps and frequencies"])
        elif op == "bad_frequencies" and len(keys):
            freq = np.ones(len(keys), np.int64)
            freq[-1] = draw(st.sampled_from([-1, 2 ** 32, I64.max]))
            expect_error(lambda: var.import_rows(k, tf.zeros([len(keys), dim]), None,
                                                 tf.constant(freq)), ["frequencies must be"])
        elif op == "bad_export_args":
            bad = draw(st.sampled_from(["offset", "limit", "offset_vec", "limit_vec",
                                        "after_vec"]))
            args = dict(offset=0, limit=4, updated_after=dynamic_ops.INT64_MIN)
            args.update({"offset": dict(offset=-1), "limit": dict(limit=0),
                         "offset_vec": dict(offset=[0, 1]), "limit_vec": dict(limit=[[2]]),
                         "after_vec": dict(updated_after=[0, 0])}[bad])
            expect_error(lambda: dynamic_ops.export(var.handle, key_type, dim, **args),
                         [bad.split("_vec")[0].replace("after", "updated_after")])
        got = export_dict(var)
        assert set(got) == set(model)
        for x, r in model.items():
            close(got[x], r)


@fuzz(100)
@given(st.data())
def test_bounded_dynamic_table_stays_bounded(data):
    """Batches of keys on a bounded table: never more rows than the bound,
    every key of a batch present afterwards with either its last value or
    (if evicted since) its initial row, and a batch with more distinct keys
    than the bound rejected without changing the table."""
    draw = data.draw
    var, dim, key_type, init = new_table(draw, bounded=True)
    np_key = key_type.as_numpy_dtype
    limit = int(var.stats()["row_limit"])
    pool = draw(st.lists(st.integers(-50, 50), min_size=1, max_size=3 * limit, unique=True))
    model = {}
    init_row = np.full(dim, init, np.float32)
    for _ in range(draw(st.integers(1, 8))):
        keys = np.array(draw(st.lists(st.sampled_from(pool), max_size=limit + 4)), np_key)
        count("bounded_dynamic_table")
        if len(set(keys.tolist())) > limit:
            before = export_dict(var)
            expect_error(lambda: var.sparse_read(tf.constant(keys)), ["distinct keys"])
            after = export_dict(var)
            assert set(before) == set(after)
            continue
        if draw(st.booleans()):
            got = var.sparse_read(tf.constant(keys)).numpy()
            for x, r in zip(keys.tolist(), got):
                assert (x in model and np.array_equal(r, model[x])) or np.array_equal(r, init_row)
                model[x] = r
        else:
            rows = np.array(draw(st.lists(finite(-5, 5, 32), min_size=len(keys) * dim,
                                          max_size=len(keys) * dim)), np.float32).reshape(-1, dim)
            sok.assign(var, tf.constant(keys), rows)
            for x, r in zip(keys.tolist(), rows):
                model[x] = r
        table = export_dict(var)
        assert len(table) <= limit
        assert set(keys.tolist()) <= set(table)
        for x in keys.tolist():
            close(table[x], model[x])


# ----------------------------------------------- DynamicVariable constructor

@fuzz(200)
@given(st.data())
def test_dynamic_variable_arguments(data):
    draw = data.draw
    dimension = draw(st.sampled_from([1, 3, 16, 0, -1, True, 1.5, "4", None, 2 ** 31]))
    var_type = draw(st.sampled_from([None, "hbm", "hybrid", "gpu"]))
    cfg = {}
    for key, choices in (("init_capacity", [16, 64, 0, 3, -4, 2 ** 31, 1.0]),
                         ("max_capacity", [64, 256, 16, 12, 0, -8]),
                         ("evict_strategy", ["lru", "lfu", "kLFU", "fifo"])):
        if draw(st.booleans()):
            cfg[key] = draw(st.sampled_from(choices))
    key_type = draw(st.sampled_from([None, tf.int64, tf.int32, tf.float32, tf.string]))
    dtype = draw(st.sampled_from([None, tf.float32, tf.float64]))
    initializer = draw(st.sampled_from([None, "normal", "zeros", "ones", 2.5, "glorot",
                                        tf.keras.initializers.Constant(0.5)]))
    # The documented rules, in the order the constructor applies them.
    problem = None
    if isinstance(dimension, bool) or not isinstance(dimension, int) or dimension < 1:
        problem = "dimension"
    elif key_type not in (None, tf.int64, tf.int32):
        problem = "key_type"
    elif dtype not in (None, tf.float32):
        problem = "dtype"
    elif var_type not in (None, "hbm", "hybrid"):
        problem = "var_type"
    else:
        init_cap = cfg.get("init_capacity", 1 << 16)
        if not isinstance(init_cap, int) or init_cap < 0:
            problem = "init_capacity"
        elif var_type == "hybrid":
            max_cap = cfg.get("max_capacity", init_cap)
            if "init_capacity" not in cfg and isinstance(max_cap, int) and max_cap > 0 \
                    and max_cap & (max_cap - 1) == 0:
                init_cap = min(init_cap, max_cap)  # a bound alone below the default start
            pow2 = [x > 0 and x & (x - 1) == 0 for x in (init_cap, max_cap)]
            if not pow2[0]:
                problem = "init_capacity"
            elif not pow2[1]:
                problem = "max_capacity"
            elif init_cap > max_cap:
                problem = "init_capacity"
        elif cfg.get("max_capacity", 0) < 0:
            # An unbounded table takes SOK's capacity settings as sizes, not
            # limits: any non-negative number.
            problem = "max_capacity"
        elif "evict_strategy" in cfg:
            problem = "evict_strategy"  # an unbounded table never evicts
        if problem is None and str(cfg.get("evict_strategy", "lru")).lower() not in (
                "lru", "lfu", "klru", "klfu"):
            problem = "evict_strategy"
        if problem is None and initializer == "glorot":
            problem = "initializer"
        if problem is None and (dimension >= 2 ** 31 or init_cap >= 2 ** 30):
            problem = "dim" if dimension >= 2 ** 31 else "init_capacity"
    count("dynamic_variable_arguments")

    def make():
        return sok.DynamicVariable(dimension, initializer=initializer, var_type=var_type,
                                   key_type=key_type, dtype=dtype, **cfg)

    if problem is not None:
        expect_error(make, [problem])
        return
    var = make()
    rows = var.sparse_read(tf.constant([7, -7], var.key_type)).numpy()
    assert rows.shape == (2, dimension)
    want = {"zeros": 0.0, "ones": 1.0, 2.5: 2.5}.get(initializer) if not isinstance(
        initializer, tf.keras.initializers.Initializer) else 0.5
    if want is not None:
        np.testing.assert_array_equal(rows, np.full((2, dimension), want, np.float32))
    else:
        assert np.all(np.abs(rows) <= 0.25)  # uniform +-0.05 or normal stddev 0.05, truncated
        # by chance beyond 5 sigma only


# ------------------------------------- sok.assign / export / read_and_evict

@fuzz(200)
@given(st.data())
def test_assign_export_and_read_and_evict(data):
    draw = data.draw
    dim = draw(st.integers(1, 3))
    count("assign_export")
    if draw(st.booleans()):  # a static table
        rows = draw(st.integers(1, 8))
        value = np.zeros((rows, dim), np.float32)
        var = sok.Variable(value)
        idx = draw(st.lists(st.integers(0, rows - 1), unique=True, max_size=rows))
        new = np.array(draw(rows_strategy(len(idx), dim)), np.float32).reshape(-1, dim)
        fault = draw(st.sampled_from([None, None, "range", "float", "shape", "not_sok"]))
        if fault == "range":
            bad = idx + [draw(st.sampled_from([-1, rows, 2 ** 40]))]
            expect_error(lambda: sok.assign(var, tf.constant(bad, tf.int64),
                                            tf.zeros([len(bad), dim])),
                         ["indices for sok.assign must be in"])
        elif fault == "float":
            expect_error(lambda: sok.assign(var, tf.constant(idx, tf.float32), new),
                         ["indices must be integers"])
        elif fault == "shape":
            expect_error(lambda: sok.assign(var, tf.constant(idx, tf.int64),
                                            tf.zeros([len(idx), dim + 1])), ["shape"])
        elif fault == "not_sok":
            expect_error(lambda: sok.assign(tf.Variable(value), [0], value[:1]),
                         ["sok.assign takes a sok.Variable"])
            expect_error(lambda: sok.export(tf.Variable(value)), ["sok.export takes"])
        else:
            sok.assign(var, tf.constant(idx, tf.int64), new)
            value[idx] = new
        got_idx, got_rows = sok.export(var)
        np.testing.assert_array_equal(got_idx.numpy(), np.arange(rows))
        close(got_rows.numpy(), value)
        return
    var = sok.DynamicVariable(dim, var_type="hybrid", init_capacity=16, max_capacity=16,
                              initializer="zeros")
    model = {}
    pool = draw(st.lists(st.one_of(st.integers(-4, 12), st.sampled_from([I64.min, I64.max])),
                         min_size=1, max_size=10, unique=True))
    keys = draw(st.lists(st.sampled_from(pool), max_size=10))
    rows = np.array(draw(rows_strategy(len(keys), dim)), np.float32).reshape(-1, dim)
    sok.assign(var, tf.constant(keys, tf.int64), rows)
    for x, r in zip(keys, rows):  # repeated keys: the last row wins
        model[x] = r
    k, r = sok.export(var)
    got = dict(zip(k.numpy().tolist(), r.numpy()))
    assert set(got) == set(model)
    for x in model:
        close(got[x], model[x])
    take = draw(st.lists(st.sampled_from(pool), max_size=6))
    out, evicted_keys, evicted_rows = sok.sparse_read_and_evict(var, tf.constant(take, tf.int64))
    close(out.numpy(), np.array([model.get(x, np.zeros(dim)) for x in take]).reshape(-1, dim))
    # The pool fits the table: nothing is evicted, missing keys are inserted.
    assert evicted_keys.shape == [0] and evicted_rows.shape == [0, dim]
    for x in take:
        model.setdefault(x, np.zeros(dim))
    assert set(sok.export(var)[0].numpy().tolist()) == set(model)
    expect_error(lambda: sok.sparse_read_and_evict(sok.DynamicVariable(dim), tf.constant(
        [1], tf.int64)), ["needs a bounded table"])
    expect_error(lambda: sok.assign(var, tf.constant([1.0], tf.float32), tf.zeros([1, dim])),
                 ["keys for DynamicVariable"])
    # int32 keys of an int64 table are widened, as sparse_read widens them.
    sok.assign(var, tf.constant([1], tf.int32), tf.ones([1, dim]))
    model[1] = np.ones(dim)
    got = dict(zip(*(t.numpy().tolist() for t in sok.export(var))))
    assert set(got) == set(model)
    close(np.array(got[1]), model[1])


# ------------------------------------------------------------------ dump/load

NAME_CHARS = st.sampled_from(list("ab_/.-") + [" ", "é"])
NAME_TEXT = st.text(NAME_CHARS, min_size=1, max_size=4)
if tf.__version__.startswith("1."):
    # TF 1.x's variables (tf.Variable and sok.Variable alike) take valid op
    # names only: [A-Za-z0-9.][A-Za-z0-9_.\-/]*.
    NAME_TEXT = st.text(st.sampled_from(list("ab_/.-")), min_size=1, max_size=4).filter(
        lambda name: name[0] in "ab.")


@fuzz(150)
@given(st.data())
def test_dump_load_round_trip_and_argument_errors(data):
    """Random sets of tables with awkward names round-trip exactly; bad
    arguments give TypeError / ValueError / CheckpointError."""
    draw = data.draw
    names = draw(st.lists(NAME_TEXT, min_size=1, max_size=4))
    variables, clones, too_wide = [], [], []
    for name in names:
        dim = draw(st.integers(1, 3))
        if draw(st.booleans()):
            rows = draw(st.integers(1, 5))
            value = np.array(draw(rows_strategy(rows, dim)), np.float32).reshape(rows, dim)
            variables.append(sok.Variable(value, name=name.replace(" ", "_")))
            clones.append(sok.Variable(np.zeros_like(value), name=name.replace(" ", "_")))
        else:
            # Key types mixed: a dump of either loads into a table of either,
            # unless a key does not fit the loading table's (an error).
            key_type, clone_key_type = (draw(st.sampled_from([tf.int64, tf.int32]))
                                        for _ in range(2))
            bound = 2 ** 62 if key_type == tf.int64 else 2 ** 31 - 1
            v = sok.DynamicVariable(dim, initializer="zeros", name=name, key_type=key_type)
            keys = draw(st.lists(st.one_of(st.integers(-bound, bound), st.sampled_from(
                [-(2 ** 31), 2 ** 31 - 1])), max_size=6, unique=True))
            if key_type == tf.int64 and draw(st.booleans()):
                # A key just outside int32's range, or far outside it.
                wide = draw(st.sampled_from([2 ** 31, -(2 ** 31) - 1, 2 ** 40]))
                keys = keys if wide in keys else keys + [wide]
            if keys:
                sok.assign(v, tf.constant(keys, key_type), np.array(
                    draw(rows_strategy(len(keys), dim)), np.float32).reshape(-1, dim))
            variables.append(v)
            clones.append(sok.DynamicVariable(dim, name=name, key_type=clone_key_type))
            if clone_key_type == tf.int32 and any(not -(2 ** 31) <= k < 2 ** 31 for k in keys):
                too_wide.append(name)
    count("dump_load")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ckpt")
        fault = draw(st.sampled_from([None, None, "not_sok", "twice", "dim", "missing",
                                      "nowhere"]))
        if fault == "not_sok":
            expect_error(lambda: sok.dump(path, variables + [tf.Variable([[1.0]])]),
                         ["dump_vars must hold sok.Variable"])
            return
        if fault == "twice":
            expect_error(lambda: sok.dump(path, variables + variables[:1]), ["twice"])
            return
        if fault == "nowhere":
            with pytest.raises(CheckpointError, match="no sok_graph dump"):
                sok.load(path, clones)
            return
        sok.dump(path, variables)
        if fault == "dim":
            k = draw(st.integers(0, len(variables) - 1))
            v = variables[k]
            dim = v.dimension if isinstance(v, sok.DynamicVariable) else int(v.shape[1])
            # The name as given: TensorFlow rewrites some (a trailing "/"),
            # so the variable's own .name would not name it again.
            other = (sok.DynamicVariable(dim + 1, name=names[k])
                     if isinstance(v, sok.DynamicVariable)
                     else sok.Variable(np.zeros((int(v.shape[0]), dim + 1), np.float32),
                                       name=names[k].replace(" ", "_")))
            bad = list(clones)
            bad[k] = other
            with pytest.raises(CheckpointError, match="dimension"):
                sok.load(path, bad)
            return
        if fault == "missing":
            with pytest.raises(CheckpointError, match="has no variable"):
                sok.load(path, [sok.DynamicVariable(1, name="not there")])
            return
        if too_wide:
            count("dump_load_key_type_refused")
            with pytest.raises(CheckpointError, match="does not fit in int32"):
                sok.load(path, clones)
            # Refused before any table changed: the fresh tables are empty.
            assert all(export_dict(c) == {} for c in clones
                       if isinstance(c, sok.DynamicVariable))
            return
        sok.load(path, clones)
    for v, c in zip(variables, clones):
        if isinstance(v, sok.DynamicVariable):
            a, b = export_dict(v), export_dict(c)
            assert set(a) == set(b)
            for x in a:
                np.testing.assert_array_equal(a[x], b[x])
        else:
            np.testing.assert_array_equal(v.numpy(), c.numpy())


# ------------------------------------------------ optimizers' apply_gradients

V1_TRAIN = tf.compat.v1.train
# name -> (factory, algorithm, flavor); learning rates and epsilons explicit,
# so that the numpy reference below uses the same ones.
OPTIMIZERS = {
    "sok_sgd": (lambda: sok.SGD(0.25), "sgd", None),
    "keras_sgd": (lambda: tf.keras.optimizers.SGD(0.25), "sgd", None),
    "tf1_sgd": (lambda: V1_TRAIN.GradientDescentOptimizer(0.25), "sgd", None),
    "keras_adagrad": (lambda: tf.keras.optimizers.Adagrad(0.3, epsilon=1e-7), "adagrad",
                      "keras"),
    "tf1_adagrad": (lambda: V1_TRAIN.AdagradOptimizer(0.3, initial_accumulator_value=0.1),
                    "adagrad", "tf1"),
    "keras_adam": (lambda: tf.keras.optimizers.Adam(0.05, epsilon=1e-7), "adam", "keras"),
    "tf1_adam": (lambda: V1_TRAIN.AdamOptimizer(0.05, epsilon=1e-8), "adam", "tf1"),
}
GRAD_FAULTS = ("out_of_range", "f64_values", "int_values", "wide_rows", "narrow_rows",
               "float_indices", "indices_rank2", "rows_count", "dense_dynamic",
               "dense_shape", "not_a_pair", "tensor_variable", "key_dtype")


class RefOptimizer:
    """numpy model of OptimizerWrapper's sparse update of one table: repeated
    indices summed first, then the algorithm on the touched rows only (lazy;
    the step counts apply_gradients calls), in float64 (the test compares with
    a tolerance). Rows and slots live in dicts, so one model serves static
    (row numbers) and dynamic (keys) tables."""

    def __init__(self, algorithm, flavor, dim):
        self.algorithm, self.flavor, self.dim = algorithm, flavor, dim
        self.step = 0
        self.slots = collections.defaultdict(dict)

    def apply(self, rows, indices, values):
        """rows: dict key -> row (missing keys read as zeros, as the wrapper
        reads a key a DynamicVariable lacks)."""
        self.step += 1
        summed = collections.OrderedDict()
        with np.errstate(all="ignore"):
            for k, v in zip(indices, values.astype(np.float64)):
                summed[k] = summed[k] + v if k in summed else v.copy()
            for k, g in summed.items():
                w = rows.get(k, np.zeros(self.dim)).astype(np.float64)
                rows[k] = self._update(k, w, g)

    def _update(self, k, w, g):
        a, s = self.algorithm, self.slots[k]
        if a == "sgd":
            return w - 0.25 * g
        if a == "adagrad":
            acc = s.get("acc", np.full(self.dim, 0.1)) + g * g
            s["acc"] = acc
            return w - 0.3 * g / (np.sqrt(acc) if self.flavor == "tf1" else np.sqrt(acc + 1e-7))
        eps = 1e-8 if self.flavor == "tf1" else 1e-7
        m = 0.9 * s.get("m", np.zeros(self.dim)) + 0.1 * g
        v = 0.999 * s.get("v", np.zeros(self.dim)) + 0.001 * g * g
        s["m"], s["v"] = m, v
        alpha = 0.05 * np.sqrt(1 - 0.999 ** self.step) / (1 - 0.9 ** self.step)
        return w - alpha * m / (np.sqrt(v) + eps)


def grad_values_strategy(n, dim):
    return st.lists(st.one_of(finite(-10, 10, 32), finite(-10, 10, 32),
                              st.sampled_from(SPECIAL_FLOATS)), min_size=n * dim,
                    max_size=n * dim)


def table_dict(var, static_rows=None):
    if static_rows is not None:
        return dict(enumerate(var.numpy()))
    return export_dict(var)


KERAS_OPTIONS = ("weight_decay", "clipnorm", "clipvalue", "global_clipnorm",
                 "gradient_accumulation_steps", "use_ema")


@fuzz(40)
@given(st.data())
def test_keras_options_the_row_updates_ignore_are_refused(data):
    """A Keras optimizer given an option that sparse row updates do not
    apply (weight decay, clipping, accumulation, EMA; whichever this Keras
    has) is refused by OptimizerWrapper with the option's name; the same
    optimizer without it wraps and trains."""
    draw = data.draw
    name = draw(st.sampled_from(["SGD", "Adam", "Adagrad"]))
    option = draw(st.sampled_from(KERAS_OPTIONS))
    setting = {"gradient_accumulation_steps": draw(st.integers(2, 4)), "use_ema": True}.get(
        option, draw(st.sampled_from([1e-3, 0.5, 4.0])))
    cls = getattr(tf.keras.optimizers, name)
    try:
        opt = cls(learning_rate=0.1, **{option: setting})
    except (TypeError, ValueError):
        return  # this Keras has no such option
    if getattr(opt, option, None) in (None, False):
        return  # accepted and dropped by this Keras: nothing to refuse
    count("keras_options")
    expect_error(lambda: sok.OptimizerWrapper(opt), [option])
    var = sok.Variable(np.ones((3, 2), np.float32))
    wrapped = sok.OptimizerWrapper(cls(learning_rate=0.1))
    wrapped.apply_gradients([(tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1], tf.int64),
                                               tf.constant([3, 2], tf.int64)), var)])
    assert not np.array_equal(var.numpy()[1], np.ones(2, np.float32))
    np.testing.assert_array_equal(var.numpy()[[0, 2]], np.ones((2, 2), np.float32))


@fuzz(120)
@given(st.data())
def test_optimizer_apply_gradients(data):
    """1-4 apply_gradients calls of sok.SGD or OptimizerWrapper(Keras / TF1
    SGD, Adagrad, Adam) on a static or dynamic table: IndexedSlices with
    repeated, extreme (dynamic) or no indices and NaN/Inf rows, dense
    gradients of static tables, a plain tf.Variable beside; or one malformed
    call, which must raise a clear error and change nothing (rows, slots,
    step)."""
    draw = data.draw
    opt_name = draw(st.sampled_from(sorted(OPTIMIZERS)))
    make, algorithm, flavor = OPTIMIZERS[opt_name]
    dim = draw(st.integers(1, 3))
    dynamic = draw(st.booleans())
    if dynamic:
        var = sok.DynamicVariable(dim, initializer="zeros")
        pool = draw(st.lists(st.one_of(st.integers(-3, 9), st.sampled_from(
            [I64.min, I64.max, 2 ** 40])), min_size=1, max_size=6, unique=True))
        start = draw(st.lists(st.sampled_from(pool), unique=True))
        if start:
            sok.assign(var, tf.constant(start, tf.int64), np.array(draw(grad_values_strategy(
                len(start), dim)), np.float32).reshape(-1, dim))
        rows_model = export_dict(var)
        n_rows = None
    else:
        n_rows = draw(st.integers(1, 6))
        value = np.array(draw(st.lists(finite(-4, 4, 32), min_size=n_rows * dim,
                                       max_size=n_rows * dim)), np.float32).reshape(n_rows, dim)
        var = sok.Variable(value)
        pool = list(range(n_rows))
        rows_model = dict(enumerate(value))
    opt = sok.SGD(0.25) if opt_name == "sok_sgd" else sok.OptimizerWrapper(make())
    ref = RefOptimizer(algorithm, flavor, dim)
    # A plain variable beside, updated by the wrapped optimizer (sok.SGD: by
    # w -= lr * g); its reference is the same native optimizer on a copy.
    plain = plain_ref = plain_opt = None
    if draw(st.booleans()):
        start_plain = np.array(draw(st.lists(finite(-4, 4, 32), min_size=2, max_size=2)),
                               np.float32)
        plain, plain_ref = tf.Variable(start_plain), tf.Variable(start_plain)
        plain_opt = None if opt_name == "sok_sgd" else make()
    for _ in range(draw(st.integers(1, 4))):
        count("optimizer_apply_gradients")
        fault = draw(st.sampled_from((None,) * 8 + GRAD_FAULTS))
        n = draw(st.integers(0, 6))
        indices = [draw(st.sampled_from(pool)) for _ in range(n)]
        values = np.array(draw(grad_values_strategy(n, dim)), np.float32).reshape(n, dim)
        dense = not dynamic and draw(st.integers(0, 4)) == 0
        if dense:
            indices = list(range(n_rows))
            values = np.array(draw(grad_values_strategy(n_rows, dim)),
                              np.float32).reshape(n_rows, dim)
        grad = tf.constant(values) if dense else tf.IndexedSlices(
            tf.constant(values), tf.constant(indices, tf.int64))
        pairs = [(grad, var)]
        words = None
        if fault == "out_of_range" and not dynamic:
            bad = list(indices) + [draw(st.sampled_from([-1, n_rows, 2 ** 40, I64.min]))]
            pairs = [(tf.IndexedSlices(tf.zeros([len(bad), dim]), tf.constant(bad, tf.int64)),
                      var)]
            words = ["must be in [0,"]
        elif fault in ("f64_values", "int_values"):
            dt = tf.float64 if fault == "f64_values" else tf.int32
            bad_values = tf.cast(tf.constant(values), dt)
            pairs = [(bad_values if dense else tf.IndexedSlices(
                bad_values, tf.constant(indices, tf.int64)), var)]
            words = ["must be float32"]
        elif fault in ("wide_rows", "narrow_rows") and (fault == "wide_rows" or dim > 1):
            width = dim + 1 if fault == "wide_rows" else 1
            pairs = [(tf.IndexedSlices(tf.zeros([n, width]), tf.constant(indices, tf.int64)),
                      var)]
            words = ["rows of shape"]
        elif fault == "float_indices":
            pairs = [(tf.IndexedSlices(tf.constant(values), tf.constant(indices, tf.float32)),
                      var)]
            words = ["must be integers"]
        elif fault == "indices_rank2":
            pairs = [(tf.IndexedSlices(tf.constant(values), tf.constant(
                np.array(indices, np.int64).reshape(-1, 1))), var)]
            words = ["vector of indices"]
        elif fault == "rows_count":
            pairs = [(tf.IndexedSlices(tf.zeros([n + draw(st.sampled_from([1, 2])), dim]),
                                       tf.constant(indices, tf.int64)), var)]
            words = ["rows of shape"]
        elif fault == "dense_dynamic" and dynamic:
            pairs = [(tf.zeros([3, dim]), var)]
            words = ["must be tf.IndexedSlices"]
        elif fault == "dense_shape" and not dynamic:
            shape = draw(st.sampled_from([[n_rows + 1, dim], [n_rows, dim + 1], [n_rows * dim]]
                                         + ([[n_rows - 1, dim]] if n_rows > 1 else [])))
            pairs = [(tf.zeros(shape), var)]
            words = ["the variable's shape"]
        elif fault == "not_a_pair":
            pairs = [draw(st.sampled_from([(grad,), (grad, var, var), var]))]
            words = ["(gradient, variable) pairs"]
        elif fault == "tensor_variable":
            pairs = [(grad, var), (tf.ones([2]), tf.ones([2]))]
            words = ["not a variable"]
        elif fault == "key_dtype" and dynamic:
            pairs = [(tf.IndexedSlices(tf.constant(values), tf.constant(
                np.array(indices, np.int64).astype(np.int32))), var)]
            words = ["keys for DynamicVariable"]
        plain_grad = None
        if plain is not None and words is None or plain is not None and draw(st.booleans()):
            plain_grad = tf.constant(np.array(draw(st.lists(finite(-4, 4, 32), min_size=2,
                                                             max_size=2)), np.float32))
            pairs = [(plain_grad, plain)] + pairs if draw(st.booleans()) else \
                pairs + [(plain_grad, plain)]
        before_plain = None if plain is None else plain.numpy().copy()
        if words is not None:
            step = int(opt.iterations)
            expect_error(lambda: opt.apply_gradients(pairs), words)
            # Nothing changed: rows, the plain variable, the step count.
            got = table_dict(var, n_rows)
            assert set(got) == set(rows_model)
            for k in got:
                close(got[k], rows_model[k])
            if plain is not None:
                np.testing.assert_array_equal(plain.numpy(), before_plain)
            assert int(opt.iterations) == step
            continue
        opt.apply_gradients(pairs)
        ref.apply(rows_model, indices, values)
        if plain_grad is not None:
            if plain_opt is None:
                plain_ref.assign_sub(0.25 * plain_grad)
            else:
                plain_opt.apply_gradients([(plain_grad, plain_ref)])
            close(plain.numpy(), plain_ref.numpy())
        got = table_dict(var, n_rows)
        assert set(got) == set(rows_model), f"keys {sorted(got)} != {sorted(rows_model)}"
        for k in got:
            close(got[k], rows_model[k], rtol=1e-4, atol=1e-5)
        rows_model = {k: r.astype(np.float32) for k, r in got.items()}  # no drift
    assert int(opt.iterations) == ref.step


# ------------------------------------------------------- incremental_model_dump

def utc_micros_now():
    return time.time_ns() // 1000


def as_threshold(draw, micros):
    """The same instant in one of the documented forms."""
    form = draw(st.sampled_from(["int", "np", "float", "naive", "aware"]))
    if form == "int":
        return micros
    if form == "float":  # time.time() * 1e6: a float, taken down to the microsecond
        return float(micros) + 0.25
    if form == "np":
        return np.int64(micros)
    utc = datetime.datetime(1970, 1, 1) + datetime.timedelta(microseconds=micros)
    if form == "naive":
        return utc  # naive datetimes are taken as UTC
    tz = datetime.timezone(datetime.timedelta(minutes=draw(st.sampled_from(
        [-600, -90, 0, 330, 840]))))
    return utc.replace(tzinfo=datetime.timezone.utc).astimezone(tz)


@fuzz(50)
@given(st.data())
def test_incremental_model_dump(data):
    """Random lookups, finds, assigns and removals on 1-2 tables, with marks
    (wall-clock thresholds, 1 ms away from any op) between them: for every
    mark, incremental_model_dump returns exactly the keys looked up or
    assigned after it (and not removed since), with their current rows;
    malformed thresholds or variables give TypeError / ValueError."""
    draw = data.draw
    tables = [sok.DynamicVariable(draw(st.integers(1, 3)), initializer="zeros",
                                  key_type=draw(st.sampled_from([tf.int64, tf.int32])))
              for _ in range(draw(st.integers(1, 2)))]
    models = [{} for _ in tables]      # key -> row
    touched = [{} for _ in tables]     # key -> index of the op that last touched it
    marks = []                         # (threshold micros, ops done before it)
    pool = draw(st.lists(st.one_of(st.integers(-5, 20), st.sampled_from(["min", "max"])),
                         min_size=1, max_size=8, unique=True))
    n_ops = 0
    for item in draw(st.lists(st.sampled_from(["lookup", "find", "assign", "remove", "mark"]),
                              min_size=1, max_size=8)) + ["mark"]:
        count("incremental_model_dump")
        if item == "mark":
            time.sleep(0.001)
            marks.append((utc_micros_now(), n_ops))
            time.sleep(0.001)
            continue
        t = draw(st.integers(0, len(tables) - 1))
        var, model = tables[t], models[t]
        info = np.iinfo(var.key_type.as_numpy_dtype)
        keys = [int(info.min) if x == "min" else int(info.max) if x == "max" else x
                for x in draw(st.lists(st.sampled_from(pool), max_size=5))]
        k = tf.constant(keys, var.key_type)
        n_ops += 1
        if item == "lookup":
            var.sparse_read(k)
            for x in keys:
                model.setdefault(x, np.zeros(var.dimension, np.float32))
                touched[t][x] = n_ops
        elif item == "find":
            var.find(k)  # reads, inserts and touches nothing
        elif item == "assign":
            rows = np.array(draw(rows_strategy(len(keys), var.dimension)),
                            np.float32).reshape(-1, var.dimension)
            sok.assign(var, k, rows)
            for x, r in zip(keys, rows):
                model[x] = r
                touched[t][x] = n_ops
        else:
            var.remove(k)
            for x in keys:
                model.pop(x, None)
                touched[t].pop(x, None)
    for micros, done in marks:
        threshold = as_threshold(draw, micros)
        got_keys, got_rows = sok.incremental_model_dump(tables, threshold)
        assert len(got_keys) == len(got_rows) == len(tables)
        for t, var in enumerate(tables):
            want = {x for x, op in touched[t].items() if op > done}
            got = got_keys[t].tolist()
            assert len(got) == len(set(got)), f"a key listed twice: {got}"
            assert set(got) == want, f"threshold after {done} ops: keys {got}, expected {want}"
            for x, r in zip(got, got_rows[t]):
                close(r, models[t][x])
    # Before every op (also before the epoch): every row.
    got_keys, _ = sok.incremental_model_dump(tables, draw(st.sampled_from(
        [-1, I64.min, 0, datetime.datetime(1900, 1, 1)])))
    for t in range(len(tables)):
        assert set(got_keys[t].tolist()) == set(models[t])
    # After every op: none.
    got_keys, _ = sok.incremental_model_dump(tables, draw(st.sampled_from(
        [I64.max, datetime.datetime(9999, 1, 1), 9.2e18])))
    assert all(len(k) == 0 for k in got_keys)
    bad = draw(st.sampled_from(["str", "float", "none", "bool", "too_big", "too_small",
                                "np_float", "datetime64", "one_var", "static", "tf_var"]))
    # Finite floats are times too (time.time() * 1e6, as docs/serving.md
    # writes it); NaN and infinities are not.
    args = {"str": (tables, "2024-01-01"), "float": (tables, float("nan")),
            "none": (tables, None), "bool": (tables, True), "too_big": (tables, 2 ** 63),
            "too_small": (tables, -(2 ** 63) - 1), "np_float": (tables, np.float64("inf")),
            "datetime64": (tables, np.datetime64("2020-01-01")), "one_var": (tables[0], 0),
            "static": ([sok.Variable(np.zeros((2, 1), np.float32))], 0),
            "tf_var": ([tf.Variable([[1.0]])], 0)}[bad]
    expect_error(lambda: sok.incremental_model_dump(*args),
                 ["time_threshold", "sok_vars", "sok.DynamicVariable"])


# ------------------------------------------------ the 1.x embedding layers

V1_CTOR_FAULTS = ("vocab_zero", "vocab_negative", "vocab_bool", "vocab_str", "vocab_float",
                  "dim_zero", "dim_bool", "slots_zero", "slots_str", "nnz_zero",
                  "nnz_negative", "combiner", "feature_num", "use_hashtable", "key_dtype",
                  "init_shape", "init_array_hashtable", "init_name")
V1_CALL_FAULTS = ("rank", "dims", "float_ids", "uint_ids", "out_of_range", "too_many_keys",
                  "sparse_rank3", "sparse_rank1", "sparse_rows", "max_nnz", "ragged_nnz",
                  "ragged_rows", "dense_input")


@fuzz(150)
@given(st.data())
def test_v1_embedding_layers(data):
    """sok.All2AllDenseEmbedding / sok.DistributedEmbedding after sok.Init:
    valid constructions and calls (empty batches, any key for a hashtable,
    SparseTensor or RaggedTensor, every combiner) equal
    tf.nn.embedding_lookup / the numpy form of embedding_lookup_sparse on the
    same rows; bad constructor arguments and malformed inputs raise clear
    errors."""
    draw = data.draw
    sok.Init(global_batch_size=4)
    kind = draw(st.sampled_from(["a2a", "dist"]))
    vocab, dim = draw(st.integers(1, 12)), draw(st.integers(1, 3))
    slots, nnz = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    hashtable = draw(st.booleans())
    combiner = draw(st.sampled_from(COMBINERS + ("SUM", "Mean")))
    key_dtype = draw(st.sampled_from([None, tf.int32, tf.int64]))
    table = np.array(draw(st.lists(finite(-4, 4, 32), min_size=vocab * dim,
                                   max_size=vocab * dim)), np.float32).reshape(vocab, dim)
    init = 0.5 if hashtable else draw(st.sampled_from(["constant", "array"]))
    init = tf.keras.initializers.Constant(table) if init == "constant" else \
        table if init == "array" else init
    args = dict(max_vocabulary_size_per_gpu=vocab, embedding_vec_size=dim, slot_num=slots,
                use_hashtable=hashtable, key_dtype=key_dtype, embedding_initializer=init)
    args["max_nnz" if kind == "dist" else "nnz_per_slot"] = nnz
    if kind == "dist":
        args.update(combiner=combiner)
    fault = draw(st.sampled_from((None,) * 6 + V1_CTOR_FAULTS))
    words = None
    nnz_arg = "max_nnz" if kind == "dist" else "nnz_per_slot"
    bad_args = {
        "vocab_zero": ("max_vocabulary_size_per_gpu", 0),
        "vocab_negative": ("max_vocabulary_size_per_gpu", -3),
        "vocab_bool": ("max_vocabulary_size_per_gpu", True),
        "vocab_str": ("max_vocabulary_size_per_gpu", "8"),
        "vocab_float": ("max_vocabulary_size_per_gpu", 8.0),
        "dim_zero": ("embedding_vec_size", 0), "dim_bool": ("embedding_vec_size", False),
        "slots_zero": ("slot_num", 0), "slots_str": ("slot_num", "2"),
        "nnz_zero": (nnz_arg, 0), "nnz_negative": (nnz_arg, -1),
        "use_hashtable": ("use_hashtable", draw(st.sampled_from(["yes", 1, None]))),
        "key_dtype": ("key_dtype", draw(st.sampled_from([tf.float32, "string", tf.uint8]))),
    }
    if fault in bad_args:
        key, value = bad_args[fault]
        args[key] = value
        words = [key]
    elif fault == "combiner" and kind == "dist":
        args["combiner"] = draw(st.sampled_from(["max", "", None, 1, "sum "]))
        words = ["combiner"]
    elif fault == "feature_num" and kind == "dist":
        args["max_feature_num"] = draw(st.sampled_from([0, -2, 1.0]))
        words = ["max_feature_num"]
    elif fault == "init_shape" and not hashtable:
        args["embedding_initializer"] = np.zeros((vocab + 1, dim), np.float32)
        words = ["embedding_initializer"]
    elif fault == "init_array_hashtable" and hashtable:
        args["embedding_initializer"] = table
        words = ["embedding_initializer"]
    elif fault == "init_name":
        args["embedding_initializer"] = "no_such_initializer"
        words = ["initializer", "no_such_initializer"]
    cls = sok.DistributedEmbedding if kind == "dist" else sok.All2AllDenseEmbedding
    count("v1_layer_constructor")
    if words is not None:
        expect_error(lambda: cls(**args), words)
        return
    layer = cls(**args)
    assert layer.embedding_variable in layer.trainable_variables
    np_key = (key_dtype or tf.int64).as_numpy_dtype
    if hashtable:
        # Some keys given rows first; the others start at the initializer's 0.5.
        info = np.iinfo(np_key)
        pool = draw(st.lists(st.one_of(st.integers(-5, 40), st.sampled_from(
            [int(info.min), int(info.max)])), min_size=1, max_size=vocab, unique=True))
        model = {x: np.full(dim, 0.5, np.float32) for x in pool}
        assigned = draw(st.lists(st.sampled_from(pool), unique=True))
        if assigned:
            rows = table[:len(assigned)]
            sok.assign(layer.embedding_variable, tf.constant(assigned, np_key), rows)
            model.update(zip(assigned, rows))
    else:
        pool = list(range(vocab))
    batch = draw(st.integers(0, 3))
    call_fault = draw(st.sampled_from((None,) * 6 + V1_CALL_FAULTS))
    count("v1_layer_call")
    if kind == "a2a":
        ids = np.array([draw(st.sampled_from(pool)) for _ in range(batch * slots * nnz)],
                       np_key).reshape(batch, slots, nnz)
        inputs, words = tf.constant(ids), None
        if call_fault == "rank":
            inputs = tf.constant(ids.reshape(draw(st.sampled_from(
                [[-1], [batch, slots * nnz], [batch, slots, nnz, 1]]))))
            words = ["inputs must have shape"]
        elif call_fault == "dims":
            inputs = tf.zeros([batch, slots + 1, nnz], np_key)
            words = ["inputs must have shape"]
        elif call_fault in ("float_ids", "uint_ids"):
            inputs = tf.constant(ids.astype(np.float32 if call_fault == "float_ids"
                                            else np.uint8))
            words = ["int32 or int64 keys"]
        elif call_fault == "out_of_range" and not hashtable:
            bad = ids.copy() if batch else np.zeros((1, slots, nnz), np_key)
            bad.reshape(-1)[draw(st.integers(0, bad.size - 1))] = draw(
                st.sampled_from([-1, vocab, int(np.iinfo(np_key).max)]))
            inputs = tf.constant(bad)
            words = ["must be in [0,"]
        elif call_fault == "too_many_keys" and hashtable:
            inputs = tf.reshape(tf.range(vocab + 1, vocab + 1 + slots * nnz * (vocab + 1),
                                         dtype=np_key), [vocab + 1, slots, nnz])
            words = ["distinct keys"]
        if words is not None:
            expect_error(lambda: layer(inputs), words)
            return
        out = layer(inputs).numpy()
        assert out.shape == (batch, slots, nnz, dim)
        if hashtable:
            close(out, np.array([model[x] for x in ids.reshape(-1).tolist()]).reshape(out.shape))
        else:
            close(out, tf.nn.embedding_lookup(tf.constant(table), ids).numpy())
        return
    # DistributedEmbedding: [batch * slot_num, max_nnz] rows of 0..max_nnz keys.
    lengths = [draw(st.integers(0, nnz)) for _ in range(batch * slots)]
    ids = np.array([draw(st.sampled_from(pool)) for _ in range(sum(lengths))], np_key)
    splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ragged = tf.RaggedTensor.from_row_splits(tf.constant(ids), splits)
    as_sparse = draw(st.booleans())

    def sparse(values, indices, shape):
        return tf.SparseTensor(tf.constant(np.array(indices, np.int64).reshape(-1, len(shape))),
                               tf.constant(values), shape)

    inputs = ragged.to_sparse() if as_sparse else ragged
    if as_sparse:  # the layer's documented dense shape, not the tightest one
        inputs = tf.SparseTensor(inputs.indices, inputs.values, [batch * slots, nnz])
    words = None
    if call_fault == "sparse_rank3":
        inputs = sparse(np.zeros([0], np_key), np.zeros((0, 3)), [batch * slots, nnz, 1])
        words = ["2-D SparseTensor"]
    elif call_fault == "sparse_rank1":
        inputs = sparse(np.zeros([1], np_key), [[0]], [1])
        words = ["2-D SparseTensor"]
    elif call_fault == "sparse_rows":
        inputs = sparse(np.zeros([0], np_key), np.zeros((0, 2)), [slots * 2 + 1, nnz]) \
            if slots > 1 else sparse(np.zeros([0], np_key), np.zeros((0, 3)), [1, nnz, 1])
        words = ["batch * slot_num rows", "2-D SparseTensor"]
    elif call_fault == "max_nnz":
        inputs = sparse(np.zeros([0], np_key), np.zeros((0, 2)), [batch * slots, nnz + 1])
        words = ["exceeds max_nnz"]
    elif call_fault == "ragged_nnz":
        inputs = tf.RaggedTensor.from_row_lengths(tf.zeros([nnz + 1], np_key),
                                                  [nnz + 1] + [0] * (slots - 1))
        words = ["more than max_nnz"]
    elif call_fault == "ragged_rows" and slots > 1:
        inputs = tf.RaggedTensor.from_row_lengths(tf.zeros([0], np_key), [0] * (slots + 1))
        words = ["batch * slot_num rows"]
    elif call_fault == "dense_input":
        inputs = tf.zeros([batch * slots, nnz], np_key)
        words = ["must be a tf.SparseTensor"]
    elif call_fault in ("float_ids", "uint_ids"):
        inputs = ragged.with_flat_values(tf.cast(ragged.flat_values, tf.float32 if
                                                 call_fault == "float_ids" else tf.uint8))
        words = ["int32 or int64 keys"]
    elif call_fault == "out_of_range" and not hashtable:
        inputs = tf.ragged.constant([[draw(st.sampled_from([-1, vocab, 2 ** 31 - 1]))]] +
                                    [[]] * (slots - 1), np_key)
        words = ["must be in [0,"]
    if words is not None:
        expect_error(lambda: layer(inputs), words)
        return
    out = layer(inputs).numpy()
    assert out.shape == (batch, slots, dim)
    if hashtable:
        keys = sorted(set(ids.tolist()))
        dense = np.array([model[x] for x in keys], np.float32).reshape(-1, dim)
        local = np.searchsorted(keys, ids) if keys else ids.astype(np.int64)
    else:
        dense, local = table, ids.astype(np.int64)
    want = ref_lookup(dense, local, splits, None, combiner.lower(), None)
    close(out.reshape(-1, dim), want)
    if not hashtable and batch and min(lengths) > 0:
        tf_out = tf.nn.embedding_lookup_sparse(tf.constant(table), ragged.to_sparse(), None,
                                               combiner=combiner.lower())
        close(out.reshape(-1, dim), tf_out.numpy())


# ------------------------------------------------------------------- summary

def test_zz_enough_cases_ran(request):
    """Runs last (pytest keeps file order): the fuzz tests above ran at least
    the promised number of cases. Prints the count per entry point."""
    total = sum(CASES.values())
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    line = (f"fuzz cases run: {total} ({dict(sorted(CASES.items()))}); "
            f"{AFTER_ERROR_CHECKS['checks']} rejected inputs each followed by a working op")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # shown even when output is captured
            reporter.write_line(line)
    else:
        print(line)
    if len(CASES) >= 11:  # the whole file ran, not a -k selection
        assert total >= MIN_CI_CASES * min(SCALE, 1)
