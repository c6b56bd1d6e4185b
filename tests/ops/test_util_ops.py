"""unique, unique_with_counts, unique_padded and unsorted_segment_sum against
TensorFlow's own ops."""

import numpy as np
import pytest
import tensorflow as tf
from conftest import run_in_graph

from sok_graph.ops import util

INT64 = np.iinfo(np.int64)


# sok's unique ops and TensorFlow's: unique without counts, and with them.
UNIQUE_PAIRS = [(util.unique, tf.unique), (util.unique_with_counts, tf.unique_with_counts)]


@pytest.mark.parametrize("ops", UNIQUE_PAIRS, ids=["unique", "unique_with_counts"])
@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("out_idx", [tf.int32, tf.int64])
@pytest.mark.parametrize("case", ["random", "empty", "single", "all_equal", "extremes"])
def test_unique_matches_tf(rng, ops, dtype, out_idx, case):
    info = np.iinfo(dtype.as_numpy_dtype)
    x = {
        "random": rng.integers(-20, 50, size=3000),
        "empty": np.zeros([0]),
        "single": np.array([7]),
        "all_equal": np.full(300, 3),
        "extremes": np.array([info.max, 0, info.min, info.max, -1, 0, info.min]),
    }[case].astype(dtype.as_numpy_dtype)
    sok_op, tf_op = ops
    got = sok_op(tf.constant(x, dtype), out_idx=out_idx)
    ref = tf_op(tf.constant(x, dtype), out_idx=out_idx)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype
        np.testing.assert_array_equal(g.numpy(), r.numpy())


@pytest.mark.parametrize("ops", UNIQUE_PAIRS, ids=["unique", "unique_with_counts"])
def test_unique_batches_alike_and_unlike_through_one_op(rng, ops):
    """One op instance (a tf.function's) over batches whose distinct counts
    jump: the GPU kernel sizes its hash set by the last batch, so a batch
    with many more distinct keys overflows it and runs again in the full
    set, and a large batch of few keys is ranked by the set's slots. Every
    batch as tf's op gives it."""
    sok_op, tf_op = ops
    # One signature: one graph, one kernel, whose hint carries over.
    step = tf.function(lambda x: sok_op(x, out_idx=tf.int64),
                       input_signature=[tf.TensorSpec([None], tf.int64)])
    # Hints (GPU): 64 slots after the first batch (the second overflows them),
    # then 8192, then 512 (ranked by slots; the 5000-key batch overflows
    # them), and so on.
    for n, high in [(2000, 10), (2000, 1500), (20000, 100), (20000, 100), (20000, 5000),
                    (20000, 100), (20000, 100), (3000, 2900), (50000, 4000), (40, 3)]:
        x = tf.constant(rng.integers(0, high, size=n), tf.int64)
        for g, r in zip(step(x), tf_op(x, out_idx=tf.int64)):
            np.testing.assert_array_equal(g.numpy(), r.numpy())


def _group_sizes(y, groups):
    """numpy's count of the values of y per group (v mod groups, floor modulo)."""
    return np.bincount(np.mod(y.astype(np.int64), groups), minlength=groups)


def test_unique_over_batches_that_overflow_the_set(rng):
    """One op instance over batches whose distinct counts jump (the GPU's
    set, sized by the last batch, overflows and the batch runs again): the
    values and positions are those of the final pass, never a partial one."""
    step = tf.function(lambda x: util.unique(x, out_idx=tf.int64),
                       input_signature=[tf.TensorSpec([None], tf.int64)])
    for n, high in [(2000, 10), (2000, 1500), (20000, 100), (20000, 5000), (40, 3)]:
        x = rng.integers(0, high, size=n)
        y, idx = step(tf.constant(x, tf.int64))
        ref_y, ref_idx = tf.unique(tf.constant(x, tf.int64), out_idx=tf.int64)
        np.testing.assert_array_equal(y.numpy(), ref_y.numpy())
        np.testing.assert_array_equal(idx.numpy(), ref_idx.numpy())


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("groups", [0, 1, 26])
@pytest.mark.parametrize("case", ["random", "empty", "single", "negative", "extremes"])
def test_unique_padded_is_unique_then_minus_ones(rng, dtype, groups, case):
    """The first `count` values as tf.unique gives them, -1 after them, the
    inverse into those first values, the group sizes as numpy counts them."""
    info = np.iinfo(dtype.as_numpy_dtype)
    x = {
        "random": rng.integers(0, 400, size=3000),
        "empty": np.zeros([0]),
        "single": np.array([7]),
        "negative": rng.integers(-60, 60, size=500),
        "extremes": np.array([info.max, 0, info.min, info.max, -1, 0, info.min]),
    }[case].astype(dtype.as_numpy_dtype)
    y, idx, count, sizes = util.unique_padded(tf.constant(x, dtype), groups)
    ref_y, ref_idx = tf.unique(tf.constant(x, dtype), out_idx=tf.int64)
    u = len(ref_y.numpy())
    assert count.dtype == tf.int64 and count.shape == [] and int(count) == u
    assert y.dtype == dtype and y.shape == [len(x)] and idx.dtype == tf.int64
    np.testing.assert_array_equal(y.numpy()[:u], ref_y.numpy())
    np.testing.assert_array_equal(y.numpy()[u:], np.full(len(x) - u, -1))
    np.testing.assert_array_equal(idx.numpy(), ref_idx.numpy())
    assert sizes.dtype == tf.int64 and sizes.shape == [groups]
    if groups:
        np.testing.assert_array_equal(sizes.numpy(), _group_sizes(np.unique(x), groups))


def test_unique_padded_through_one_op_over_batches(rng):
    """One op instance (a tf.function of unknown length) over batches of
    few and many distinct values, as the exchange's dedups see them."""
    step = tf.function(lambda x: util.unique_padded(x, 7),
                       input_signature=[tf.TensorSpec([None], tf.int64)])
    for n, high in [(2000, 10), (2000, 1500), (20000, 100), (20000, 20000), (40, 3)]:
        x = rng.integers(0, high, size=n)
        y, idx, count, sizes = step(tf.constant(x, tf.int64))
        distinct = np.unique(x)
        assert int(count) == len(distinct)
        np.testing.assert_array_equal(np.sort(y.numpy()[:len(distinct)]), distinct)
        assert (y.numpy()[len(distinct):] == -1).all()
        np.testing.assert_array_equal(y.numpy()[idx.numpy()], x)
        np.testing.assert_array_equal(sizes.numpy(), _group_sizes(distinct, 7))


def test_unique_padded_refuses_more_groups_than_workers():
    """groups=2^40 failed allocating group_sizes (a ResourceExhaustedError
    naming no argument), and 2^31 took 16 GiB: the process was killed for
    memory. More groups than the most workers (2^20) is a ValueError naming
    groups; 2^20 groups count as numpy does."""
    x = tf.constant([5, -3, 5, 2**20 + 7], tf.int64)
    for groups in (2**20 + 1, 2**40):
        with pytest.raises(ValueError) as refused:
            util.unique_padded(x, groups)
        assert str(refused.value) == (
            f"groups must be <= 1048576 (the most workers a table is sharded over; "
            f"group_sizes holds one count per group); got {groups}")
    sizes = util.unique_padded(x, 2**20)[3].numpy()
    np.testing.assert_array_equal(sizes, _group_sizes(np.array([5, -3, 2**20 + 7]), 2**20))


@pytest.mark.parametrize("groups", [-3, 2.5, True, None])
def test_unique_padded_rejects_bad_groups(groups):
    with pytest.raises(ValueError, match=r"groups must be an int >= 0.*got"):
        util.unique_padded(tf.constant([1, 2], tf.int64), groups)


@pytest.mark.parametrize("unique", [util.unique, util.unique_with_counts, util.unique_padded])
def test_unique_rejects_matrix(unique):
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="vector|rank"):
        unique(tf.zeros([2, 2], tf.int64))


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
@pytest.mark.parametrize("inner", [[], [3], [2, 5]])
def test_segment_sum_matches_tf(rng, dtype, inner):
    n, segments = 400, 37
    data = rng.standard_normal([n] + inner).astype(dtype.as_numpy_dtype)
    ids = rng.integers(-3, segments, size=n)  # negatives are dropped, as in TF
    ids[:5] = segments - 1
    got = util.unsorted_segment_sum(tf.constant(data), tf.constant(ids), segments)
    ref = tf.math.unsorted_segment_sum(tf.constant(data), tf.constant(ids), segments)
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)


def test_segment_sum_empty_input_gives_zeros():
    got = util.unsorted_segment_sum(tf.zeros([0, 4]), tf.zeros([0], tf.int32), 3)
    np.testing.assert_array_equal(got.numpy(), np.zeros((3, 4), np.float32))


def test_segment_sum_is_deterministic(rng):
    data = tf.constant(rng.standard_normal((20000, 8)).astype(np.float32) * 1e3)
    ids = tf.constant(rng.integers(0, 5, size=20000))
    first = util.unsorted_segment_sum(data, ids, 5).numpy()
    for _ in range(5):
        np.testing.assert_array_equal(util.unsorted_segment_sum(data, ids, 5).numpy(), first)


def piecewise_sums(data, ids, segments, piece=1024):
    """numpy's float32 sums in the association the op documents: a
    segment's rows in position order, in pieces of `piece` rows each summed
    from zero (np.cumsum adds one row at a time), the pieces' sums added in
    order."""
    out = np.zeros((segments,) + data.shape[1:], np.float32)
    for s in range(segments):
        rows = data[ids == s]
        total = np.zeros(data.shape[1:], np.float32)
        for p in range(0, len(rows), piece):
            total = total + np.cumsum(rows[p:p + piece], axis=0, dtype=np.float32)[-1]
        out[s] = total
    return out


@pytest.mark.parametrize("check_ids", [True, False])
def test_segment_sum_of_long_segments_has_the_documented_bits(rng, check_ids):
    """A hot id repeated over several pieces (a Zipf stream's) next to short
    ones: the same bits as numpy adding in the documented association, on
    whichever device the test runs (a GPU sums a long segment's pieces in
    parallel, and adds a segment's piece sums 32 loads at a time: id 7's 71
    pieces are two such batches and a tail), checked or not."""
    ids = np.concatenate([np.full(4 * 1024 + 300, 2), np.full(1024, 0), np.full(1025, 5),
                          np.full(70 * 1024 + 33, 7), rng.integers(-1, 9, 700)])
    rng.shuffle(ids)
    data = (rng.standard_normal((len(ids), 4)) * 100).astype(np.float32)
    got = util.unsorted_segment_sum(tf.constant(data), tf.constant(ids), 9, check_ids=check_ids)
    np.testing.assert_array_equal(got.numpy(), piecewise_sums(data, ids, 9))


def test_segment_sum_half_types(rng):
    data = rng.standard_normal((100, 4)).astype(np.float32)
    ids = rng.integers(0, 10, size=100)
    ref = tf.math.unsorted_segment_sum(data, ids, 10).numpy()
    for dtype in (tf.float16, tf.bfloat16):
        got = util.unsorted_segment_sum(tf.cast(data, dtype), tf.constant(ids), 10)
        np.testing.assert_allclose(tf.cast(got, tf.float32).numpy(), ref, rtol=0.05, atol=0.1)


def test_segment_sum_gradient_matches_tf(rng):
    data = tf.Variable(rng.standard_normal((50, 3)).astype(np.float32))
    ids = tf.constant(rng.integers(-1, 6, size=50))
    up = tf.constant(rng.standard_normal((6, 3)).astype(np.float32))
    with tf.GradientTape(persistent=True) as tape:
        a = tf.reduce_sum(util.unsorted_segment_sum(data, ids, 6) * up)
        b = tf.reduce_sum(tf.math.unsorted_segment_sum(data, ids, 6) * up)
    np.testing.assert_allclose(tape.gradient(a, data).numpy(), tape.gradient(b, data).numpy(),
                               rtol=1e-6)


def test_segment_sum_in_graph_mode(rng):
    data = rng.standard_normal((30, 2)).astype(np.float32)
    ids = rng.integers(0, 4, size=30)
    got = run_in_graph(lambda: util.unsorted_segment_sum(tf.constant(data), tf.constant(ids), 4))
    np.testing.assert_allclose(got, tf.math.unsorted_segment_sum(data, ids, 4).numpy(),
                               rtol=1e-6)


def test_segment_id_too_large_names_position():
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"segment_ids must be < num_segments \(3\); got 3 at position 1"):
        util.unsorted_segment_sum(tf.ones([2, 2]), tf.constant([0, 3]), 3)


def test_segment_ids_length_mismatch():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        util.unsorted_segment_sum(tf.ones([3, 2]), tf.constant([0, 1]), 3)


def test_segment_sum_rows_whose_size_overflows_are_an_error():
    # No elements, but each row's size (2^40 * 2^40) does not fit an int64.
    # tf.reshape with an int64 shape: TF 1.x's tf.zeros takes the shape as
    # int32, which wraps 2^40 to 0.
    data = tf.reshape(tf.zeros([0]), tf.constant([0, 2 ** 40, 2 ** 40], tf.int64))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="overflow"):
        util.unsorted_segment_sum(data, tf.zeros([0], tf.int64), 0)


def test_negative_num_segments():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="num_segments"):
        util.unsorted_segment_sum(tf.ones([2, 2]), tf.constant([0, 1]), -1)
