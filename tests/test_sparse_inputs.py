"""SparseTensor ids and weights as users hand them over: indices in any order
(the result is the reordered tensor's, as tf.nn.safe_embedding_lookup_sparse
gives), rows with gaps between their column numbers, no static shape; and
clear errors for repeated indices, indices outside dense_shape and weights
that do not pair with the ids. The reference is TensorFlow's own
embedding_lookup_sparse on the reordered SparseTensor, and numpy."""

import numpy as np
import pytest
import tensorflow as tf
from conftest import run_in_graph

import sok_graph as sok

TABLE = np.arange(40, dtype=np.float32).reshape(10, 4)


def _unsorted():
    # Row 1's id first, then row 0's two: the order a user may build it in.
    return tf.SparseTensor([[1, 0], [0, 0], [0, 1]], tf.constant([1, 2, 3], tf.int64), [2, 2])


EXPECTED = [TABLE[2] + TABLE[3], TABLE[1]]


def test_unsorted_ids_eagerly_and_in_a_function():
    v = sok.Variable(TABLE)
    out = sok.lookup_sparse([v], [_unsorted()], combiners=["sum"])[0]
    np.testing.assert_array_equal(out.numpy(), EXPECTED)
    fn = tf.function(lambda: sok.lookup_sparse([v], [_unsorted()], combiners=["sum"])[0])
    np.testing.assert_array_equal(fn().numpy(), EXPECTED)
    ref = tf.nn.embedding_lookup_sparse(TABLE, tf.sparse.reorder(_unsorted()), None,
                                        combiner="sum")
    np.testing.assert_array_equal(out.numpy(), ref.numpy())


def test_unsorted_ids_in_a_session_with_a_placeholder_of_no_shape():
    """TF1: sparse_placeholder(tf.int64) without a shape, fed unsorted."""
    def build():
        v = sok.Variable(TABLE)
        sp = tf.compat.v1.sparse_placeholder(tf.int64)
        out = sok.lookup_sparse([v], [sp], combiners=["sum"])[0]
        return sp, out

    graph = tf.Graph()
    with graph.as_default():
        sp, out = build()
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            got = sess.run(out, {sp: tf.compat.v1.SparseTensorValue(
                [[1, 0], [0, 0], [0, 1]], [1, 2, 3], [2, 2])})
    np.testing.assert_array_equal(got, EXPECTED)


def test_unsorted_value_in_a_session():
    def build():
        v = sok.Variable(TABLE)
        sp = tf.compat.v1.SparseTensorValue([[1, 0], [0, 0], [0, 1]], [1, 2, 3], [2, 2])
        return sok.lookup_sparse([v], [sp], combiners=["sum"])[0]

    np.testing.assert_array_equal(run_in_graph(build), EXPECTED)


def test_a_sparse_tensor_value_given_alone_is_one_tables_ids():
    """A SparseTensorValue is a tuple (indices, values, dense_shape): given
    alone for a single table, lookup_sparse took it as a list of three
    entries and refused it ("sp_ids must have one entry per table (1); got
    3"), while [value] worked; as weights it was refused the same way. It
    is one table's ids (or weights), in eager mode and in a Session, as
    TensorFlow's lookup of the same SparseTensor gives."""
    ids = tf.compat.v1.SparseTensorValue([[1, 0], [0, 0], [0, 1]], np.array([1, 2, 3]), [2, 2])
    weights = tf.compat.v1.SparseTensorValue([[1, 0], [0, 0], [0, 1]],
                                             np.array([0.5, 2.0, -1.0], np.float32), [2, 2])
    ordered = tf.sparse.reorder(tf.SparseTensor.from_value(ids))
    want = tf.nn.embedding_lookup_sparse(
        tf.constant(TABLE), ordered,
        tf.sparse.reorder(tf.SparseTensor.from_value(weights)), combiner="sum").numpy()
    v = sok.Variable(TABLE)
    np.testing.assert_array_equal(sok.lookup_sparse(v, ids, combiners="sum").numpy(), EXPECTED)
    np.testing.assert_array_equal(
        sok.lookup_sparse(v, ids, weights, combiners="sum").numpy(), want)

    def build():
        table = sok.Variable(TABLE)
        return sok.lookup_sparse(table, ids, weights, combiners="sum")

    np.testing.assert_array_equal(run_in_graph(build), want)
    with pytest.raises(ValueError, match=r"^sp_ids must have one entry per table \(2\); got 1$"):
        sok.lookup_sparse([v, v], ids)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_random_orders_gaps_and_weights_match_tensorflow(combiner):
    rng = np.random.default_rng(42)
    v = sok.Variable(TABLE)
    for _ in range(20):
        batch, width = int(rng.integers(1, 6)), int(rng.integers(1, 7))
        cells = [(r, c) for r in range(batch) for c in range(width) if rng.random() < 0.5]
        if not cells:
            continue
        order = rng.permutation(len(cells))
        indices = np.array([cells[i] for i in order], np.int64)
        ids = rng.integers(0, 10, size=len(cells)).astype(np.int64)
        weights = rng.uniform(0.5, 2.0, size=len(cells)).astype(np.float32)
        sp_ids = tf.SparseTensor(indices, ids, [batch, width])
        sp_w = tf.SparseTensor(indices, weights, [batch, width])
        got = sok.lookup_sparse([v], [sp_ids], [sp_w], combiners=[combiner])[0]
        ref = tf.nn.embedding_lookup_sparse(TABLE, tf.sparse.reorder(sp_ids),
                                            tf.sparse.reorder(sp_w), combiner=combiner)
        # Rows without ids: TensorFlow's result has only up to the last
        # non-empty row (and TF 1.15's mean gives NaN for an empty one
        # before it); sok's has every row of the batch, empty ones zero.
        want = np.zeros((batch, 4), np.float32)
        want[:ref.shape[0]] = ref.numpy()
        want[[r for r in range(batch) if r not in {c[0] for c in cells}]] = 0
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


def test_repeated_index_is_an_error_naming_the_argument():
    v = sok.Variable(TABLE)
    sp = tf.SparseTensor([[0, 0], [1, 0], [0, 0]], tf.constant([1, 2, 3], tf.int64), [2, 2])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"sp_ids\[0\]: a SparseTensor must not repeat an index"):
        sok.lookup_sparse([v], [sp], combiners=["sum"])


def test_index_outside_dense_shape_is_an_error_naming_the_argument():
    v = sok.Variable(TABLE)
    sp = tf.SparseTensor([[0, 0], [2, 0]], tf.constant([1, 2], tf.int64), [2, 2])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"sp_ids\[0\]: every index of a SparseTensor must be inside"):
        sok.lookup_sparse([v], [sp], combiners=["sum"])


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("indices", [[[0, 0], [0, 0], [1, 0]], [[0, 0], [5, 0], [1, 1]]],
                         ids=["repeated", "outside"])
def test_a_rejected_sparse_input_inserts_no_key(mode, indices):
    """A dynamic table inserts the keys it reads: a SparseTensor the lookup
    rejects (a repeated index, one outside dense_shape) must not get its
    keys into the table first (in a tf.function they used to be)."""
    v = sok.DynamicVariable(dimension=2, initializer="zeros")
    sp = tf.SparseTensor(indices, tf.constant([21, 22, 23], tf.int64), [2, 3])

    def lookup(sp):
        return sok.lookup_sparse(v, sp, combiners="sum")

    if mode == "function":
        lookup = tf.function(lookup)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"sp_ids\[0\]"):
        lookup(sp)
    assert sok.export(v)[0].numpy().tolist() == []


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("case", ["weights", "static_id", "admission", "dynamic_splits",
                                  "variable_splits"])
def test_a_call_that_fails_another_check_inserts_no_key(mode, case):
    """The dynamic table's keys also wait for the call's other checks: weights
    that do not pair with the ids, an id outside a static table of the same
    call, the row_splits of another table's ragged ids (made with
    validate=False), of a dynamic or a plain table. A failed call used to
    leave its keys in the table (and, with a counting admission filter,
    counted as seen: two failed calls admitted them)."""
    kwargs = {"min_count": 2} if case == "admission" else {}
    v = sok.DynamicVariable(dimension=2, initializer="zeros", **kwargs)
    static = sok.Variable(TABLE)
    keys = tf.ragged.constant([[11, 12]], tf.int64)
    bad_weights = tf.ragged.constant([[1.0]], tf.float32)
    # Splits that end past the ids: the fused op refuses them, after inserts.
    bad_splits = tf.RaggedTensor.from_row_splits(tf.constant([1, 2], tf.int64),
                                                 tf.constant([0, 3], tf.int64), validate=False)
    other = sok.DynamicVariable(dimension=2, initializer="zeros")
    plain = tf.Variable(TABLE)

    def lookup():
        if case == "static_id":
            return sok.lookup_sparse([static, v], [tf.ragged.constant([[9, 10]], tf.int64), keys],
                                     combiners="sum")
        if case == "dynamic_splits":
            return sok.lookup_sparse([v, other], [keys, bad_splits], combiners="sum")
        if case == "variable_splits":
            return sok.lookup_sparse([plain, v], [bad_splits, keys], combiners="sum")
        return sok.lookup_sparse(v, keys, bad_weights, combiners="sum")

    if mode == "function":
        lookup = tf.function(lookup)
    message = {"static_id": r"sp_ids\[0\]\) must be in \[0, 10\)",
               "dynamic_splits": r"row_splits of .*sp_ids\[1\]",
               "variable_splits": r"row_splits of .*sp_ids\[0\]"}.get(case, r"sp_weights\[0\]")
    for _ in range(2):
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            lookup()
    assert sok.export(v)[0].numpy().tolist() == []
    assert sok.export(other)[0].numpy().tolist() == []
    if case == "admission":  # the failed calls were not counted: one good call admits nothing
        sok.lookup_sparse(v, keys, combiners="sum")
        assert sok.export(v)[0].numpy().tolist() == []


@pytest.mark.parametrize("mode,dense_shape", [
    ("eager", [2**32 + 3, 1]), ("eager", [2**31, 1]), ("function", [2**32 + 3, 1]),
    ("function", [2**31, 1]), ("function", [-1, 1]), ("function", [3, -2])])
def test_a_dense_shape_the_output_cannot_have_is_an_error(mode, dense_shape):
    """The batch of dense_shape is the output's rows: 2^32 + 3 gave 3 rows
    in a tf.function (the count went through 32 bits), other sizes gave
    messages naming no argument. (Eagerly, tf.SparseTensor itself refuses
    negative sizes.)"""
    v = sok.Variable(TABLE)

    def lookup(indices, values, shape):
        return sok.lookup_sparse(v, tf.SparseTensor(indices, values, shape), combiners="sum")

    if mode == "function":
        lookup = tf.function(lookup, input_signature=[
            tf.TensorSpec([None, 2], tf.int64), tf.TensorSpec([None], tf.int64),
            tf.TensorSpec([2], tf.int64)])
    indices = tf.constant([[0, 0], [1, 0], [2, 0]], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"sp_ids\[0\]: the dense_shape \[batch, max_nnz\] of a SparseTensor"):
        lookup(indices, tf.ones([3], tf.int64), tf.constant(dense_shape, tf.int64))


def test_a_nan_weight_under_sqrtn_gives_nan_gradients_as_tensorflow():
    """sqrtn's factor 1 / sqrt(sum w^2) is NaN for a NaN weight, as in
    tf.nn.embedding_lookup_sparse: the sample's other rows got a zero
    gradient instead of NaN, hiding the NaN from the training loop."""
    v = sok.Variable(TABLE)
    plain = tf.Variable(TABLE)
    ids = tf.ragged.constant([[1, 2]], tf.int64)
    weights = tf.ragged.constant([[np.nan, 1.0]], tf.float32)
    with tf.GradientTape(persistent=True) as tape:
        got = sok.lookup_sparse(v, ids, weights, combiners="sqrtn")
        want = tf.nn.embedding_lookup_sparse(plain, ids.to_sparse(), weights.to_sparse(),
                                             combiner="sqrtn")
    np.testing.assert_array_equal(np.isnan(got.numpy()), np.isnan(want.numpy()))
    g = tf.convert_to_tensor(tape.gradient(got, v)).numpy()
    w = tf.convert_to_tensor(tape.gradient(want, plain)).numpy()
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
    assert np.isnan(g[2]).all()


def test_weights_must_pair_with_the_ids_row_by_row():
    v = sok.Variable(TABLE)
    ids = tf.ragged.constant([[1, 2], [3]], tf.int64)
    weights = tf.ragged.constant([[1.0], [2.0, 3.0]], tf.float32)  # same count, other rows
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"sp_weights\[0\] must have one weight per id of sp_ids\[0\]"):
        sok.lookup_sparse([v], [ids], [weights], combiners=["sum"])
    fewer = tf.ragged.constant([[1.0], [2.0]], tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"sp_weights\[0\]"):
        sok.lookup_sparse([v], [ids], [fewer], combiners=["sum"])


def test_unsorted_ids_through_distributed_embedding():
    """SOK 1.x's DistributedEmbedding hands its SparseTensor to the same
    lookup: unsorted keys give the reordered tensor's result."""
    sok.Init(global_batch_size=2)
    layer = sok.DistributedEmbedding("sum", 10, 4, slot_num=1, max_nnz=2,
                                     embedding_initializer="uniform")
    rows = [layer(tf.SparseTensor([[0, 0]], tf.constant([k], tf.int64), [1, 2])).numpy()[0, 0]
            for k in range(4)]
    out = layer(_unsorted()).numpy()
    np.testing.assert_array_equal(out[:, 0, :], [rows[2] + rows[3], rows[1]])
    np.testing.assert_array_equal(out, layer(tf.sparse.reorder(_unsorted())).numpy())
