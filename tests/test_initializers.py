"""One meaning per initializer form for static and dynamic tables
(sok_graph/initializers.py): the rows a sok.Variable and a
sok.DynamicVariable get from the same name or number follow the same law,
checked against the law itself (bounds, mean, spread, exact constants)."""

import numpy as np
import pytest
import tensorflow as tf

import sok_graph as sok
from conftest import run_in_graph
from sok_graph.initializers import DEFAULT, initializer_spec, static_initializer

ROWS, DIM = 4000, 8


def _static_rows(initializer):
    sok.init()
    v = sok.Variable(None, shape=[ROWS, DIM], initializer=initializer)
    return v.numpy().astype(np.float64)


def _dynamic_rows(initializer):
    sok.init()
    v = sok.DynamicVariable(DIM, initializer=initializer)
    return v.sparse_read(tf.range(ROWS, dtype=tf.int64)).numpy().astype(np.float64)


FORMS = [
    (None, ("uniform", -0.05, 0.05)), ("random", ("uniform", -0.05, 0.05)),
    ("uniform", ("uniform", -0.05, 0.05)), ("normal", ("normal", 0.0, 0.05)),
    ("truncated_normal", ("truncated", 0.0, 0.05)), ("zeros", ("constant", 0.0)),
    ("ones", ("constant", 1.0)), ("13", ("constant", 13.0)), (2.5, ("constant", 2.5))]
# A static table has no default initializer (it needs initial_value or one).
CASES = [pytest.param(rows_of, form, law, id=f"{rows_of.__name__[1:-5]}-{form}")
         for rows_of in (_static_rows, _dynamic_rows) for form, law in FORMS
         if not (rows_of is _static_rows and form is None)]


@pytest.mark.parametrize("rows_of,initializer,law", CASES)
def test_a_form_means_the_same_rows_for_static_and_dynamic_tables(rows_of, initializer, law):
    rows = rows_of(initializer)
    kind = law[0]
    if kind == "constant":
        np.testing.assert_array_equal(rows, law[1])
    elif kind == "uniform":
        lo, hi = law[1], law[2]
        assert rows.min() >= lo and rows.max() <= hi
        assert abs(rows.mean() - (lo + hi) / 2) < 0.002
        assert abs(rows.std() - (hi - lo) / np.sqrt(12)) < 0.002
    else:
        mean, std = law[1], law[2]
        # A normal truncated at 2 standard deviations keeps 0.88 of its spread.
        want_std = std * (0.8796 if kind == "truncated" else 1.0)
        assert abs(rows.mean() - mean) < 0.003
        assert abs(rows.std() - want_std) < 0.003
        if kind == "truncated":
            assert np.abs(rows - mean).max() <= 2 * std + 1e-6


def test_every_spec_is_complete_and_names_outside_the_spec_are_keras():
    for form in (None, "random", "normal", "13", 2.5, "zeros", "truncated_normal",
                 tf.keras.initializers.RandomNormal(0.0, 0.3, seed=4)):
        assert set(initializer_spec(form)) == set(DEFAULT)
    assert initializer_spec(tf.keras.initializers.RandomNormal(0.0, 0.3))["initializer"] == "normal"
    keras_glorot = tf.keras.initializers.get("glorot_uniform")
    assert type(static_initializer("glorot_uniform")) is type(keras_glorot)
    assert static_initializer(keras_glorot) is keras_glorot
    with pytest.raises(ValueError, match="finite float32"):
        static_initializer(float("nan"))
    with pytest.raises(TypeError, match="initializer must be a name, a number"):
        static_initializer([1.0, 2.0])


KEYS = np.arange(256, dtype=np.int64)


def _unseeded_tables():
    """Rows of KEYS from four tables made without a seed: by default, by
    name, by a Keras initializer without a seed, and one with seed=0."""
    tables = [sok.DynamicVariable(DIM), sok.DynamicVariable(DIM, initializer="normal"),
              sok.DynamicVariable(DIM, initializer=tf.keras.initializers.RandomUniform(-1, 1)),
              sok.DynamicVariable(DIM, seed=0)]
    return [t.sparse_read(tf.constant(KEYS)) for t in tables]


def test_tables_given_no_seed_start_apart_and_alike_from_run_to_run():
    """Every table without a seed used seed 0, so two tables gave a key the
    same initial row (a user and an item table keyed 0..n started equal).
    Each now has its own seed, numbered by its place among the graph's
    tables as TensorFlow numbers op seeds: a graph built again gets the
    same rows, and the first table keeps the old default's rows."""
    sok.init()
    first = run_in_graph(_unseeded_tables)
    again = run_in_graph(_unseeded_tables)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    default, _, keras_uniform, seeded = first
    # The first unseeded table draws what seed 0 draws; the others differ
    # from it and from each other row by row.
    np.testing.assert_array_equal(default, seeded)
    assert keras_uniform.min() < -0.5 and keras_uniform.max() > 0.5  # its own range
    scaled = keras_uniform * 0.05  # the same law as the default's
    assert not np.any(np.all(np.isclose(scaled, default, atol=1e-7), axis=1))
    b = sok.DynamicVariable(DIM)
    c = sok.DynamicVariable(DIM)
    rows_b, rows_c = (t.sparse_read(tf.constant(KEYS)).numpy() for t in (b, c))
    assert not np.any(np.all(rows_b == rows_c, axis=1))


def test_a_seed_given_wins_over_the_tables_own():
    """seed= is taken for an initializer object without a seed of its own
    (it was ignored: RandomUniform()'s config holds seed None, which then
    became seed 0), and an object's own seed is taken over none given."""
    def rows(**kwargs):
        return sok.DynamicVariable(DIM, **kwargs).sparse_read(tf.constant(KEYS)).numpy()

    sok.init()
    uniform = tf.keras.initializers.RandomUniform(-0.05, 0.05)
    np.testing.assert_array_equal(rows(initializer=uniform, seed=5), rows(seed=5))
    assert not np.array_equal(rows(seed=5), rows(seed=6))
    own = tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=9)
    np.testing.assert_array_equal(rows(initializer=own), rows(seed=9))
    np.testing.assert_array_equal(rows(initializer=own, seed=3), rows(seed=9))
    spec = initializer_spec(None)
    assert spec["seed"] == 0  # a spec outside a table: the op's seed 0


def test_init_numbers_unseeded_tables_from_the_first_again():
    """Eagerly, a model built again after sok.init starts from the same rows
    (the tables' numbers restart, as TensorFlow's op seeds do after
    tf.random.set_seed), and a table refused for its arguments takes no
    number from the tables made after it."""
    def rows(table):
        return table.sparse_read(tf.constant(KEYS)).numpy()

    sok.init()
    first = [rows(sok.DynamicVariable(DIM)), rows(sok.DynamicVariable(DIM))]
    sok.init()
    with pytest.raises(ValueError, match="max_capacity"):
        sok.DynamicVariable(DIM, var_type="hybrid", max_capacity=1000)
    again = [rows(sok.DynamicVariable(DIM)), rows(sok.DynamicVariable(DIM))]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert not np.any(np.all(first[0] == first[1], axis=1))


@pytest.mark.parametrize("name,limit", [
    ("glorot_uniform", lambda rows, dim: np.sqrt(6.0 / (rows + dim))),
    ("he_uniform", lambda rows, dim: np.sqrt(6.0 / rows)),
    ("lecun_uniform", lambda rows, dim: np.sqrt(3.0 / rows)),
])
def test_a_variance_scaling_initializer_gives_each_shard_the_whole_tables_scale(name, limit):
    """sok.Variable(shape=[rows, dim], initializer="glorot_uniform") on 4
    workers: each worker's rows were drawn with the fans of its own shard
    (1000 of 4000 rows), so their limit was twice one worker's, without an
    error. Every shard now draws from the whole table's distribution: the
    rows of all four stay within the limit of [4000, 4] (numpy's formula)
    and reach near it."""
    from sok_graph.tables.static import _shard_from_initializer

    rows, dim, workers = 4000, 4, 4
    want = limit(rows, dim)
    assert want < 0.9 * limit(rows // workers, dim)  # the check tells the two apart
    shards = []
    for rank in range(workers):
        kwargs = {"shape": [rows, dim], "initializer": name}
        shape, make = _shard_from_initializer(kwargs, (workers, rank, -1))
        assert shape == (rows, dim)
        shards.append(np.asarray(make()))
    values = np.concatenate(shards)
    assert values.shape == (rows, dim)
    assert np.abs(values).max() <= want * (1 + 1e-6)
    assert np.abs(values).max() > 0.95 * want


def test_a_constant_initializer_holding_the_whole_table_gives_each_shard_its_rows():
    """shape= with tf.constant_initializer(whole [rows, dim] array) on
    several workers failed with TensorFlow's "has 6 elements, but got shape
    (1, 3)"; each worker now holds its rows of that array (row r on worker
    r mod N), as initial_value=array gives. Orthogonal rows (a property of
    the whole matrix) are refused by name there."""
    from sok_graph.tables.static import _shard_from_initializer

    whole = np.arange(15, dtype=np.float32).reshape(5, 3)
    for make_initializer in (tf.constant_initializer, tf.keras.initializers.Constant):
        for rank in range(2):
            kwargs = {"shape": [5, 3], "initializer": make_initializer(whole)}
            _, make = _shard_from_initializer(kwargs, (2, rank, -1))
            np.testing.assert_array_equal(np.asarray(make()), whole[rank::2])
    with pytest.raises(ValueError, match=r"shape \[4, 3\].*shape is \[5, 3\]"):
        _shard_from_initializer({"shape": [5, 3], "initializer": tf.constant_initializer(
            np.zeros([4, 3]))}, (2, 0, -1))
    with pytest.raises(ValueError, match=r"Orthogonal makes rows that depend on the whole table"):
        _shard_from_initializer({"shape": [6, 3],
                                 "initializer": tf.keras.initializers.Orthogonal()}, (2, 0, -1))


@pytest.mark.parametrize("seeded", [True, False], ids=["seed=3", "tf.random.set_seed"])
def test_each_workers_shard_draws_rows_of_its_own(seeded):
    """A seeded random initializer (RandomNormal(seed=3), GlorotUniform(seed=3)),
    or an unseeded one under tf.random.set_seed (which every worker's
    program runs alike), drew the same rows on every worker: rows r and
    r + N of the table started equal. Each worker's rows are now its own,
    and together they follow the initializer's law (numpy's moments)."""
    from sok_graph.tables.static import _shard_from_initializer

    rows, dim, workers = 4000, 4, 2
    glorot = getattr(tf.keras.initializers, "GlorotUniform", None) or \
        tf.keras.initializers.glorot_uniform  # TF 1.15's name
    for make_initializer, std in ((tf.keras.initializers.RandomNormal, 0.05),
                                  (glorot,
                                   np.sqrt(6.0 / (rows + dim)) / np.sqrt(3.0))):
        shards = []
        for rank in range(workers):
            tf.compat.v1.set_random_seed(7)  # as each worker process would
            initializer = make_initializer(seed=3 if seeded else None)
            _, make = _shard_from_initializer({"shape": [rows, dim], "initializer": initializer},
                                              (workers, rank, -1))
            shards.append(np.asarray(make()))
        same = np.all(shards[0] == shards[1], axis=1)
        assert not same.any(), f"{same.sum()} rows equal on both workers"
        values = np.concatenate(shards)
        assert abs(values.mean()) < 0.05 * std
        assert abs(values.std() - std) < 0.05 * std
