"""One meaning per initializer form for static and dynamic tables
(sok_graph/initializers.py): the rows a sok.Variable and a
sok.DynamicVariable get from the same name or number follow the same law,
checked against the law itself (bounds, mean, spread, exact constants)."""

import numpy as np
import pytest
import tensorflow as tf

import sok_graph as sok
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
