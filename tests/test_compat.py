"""The TF-version layer reports what this TensorFlow actually has."""

import tensorflow as tf

from sok_graph import compat


def test_version_tuple():
    assert compat.TF_VERSION[:2] == tuple(int(x) for x in tf.__version__.split(".")[:2])
    assert compat.IS_TF1 is tf.__version__.startswith("1.")


def test_keras_major_version_matches_optimizer_module():
    if tf.__version__.startswith("1."):
        # TF 1.x's Keras is tf.keras alone (no keras package): Keras 2.
        assert compat.KERAS_MAJOR_VERSION == 2
        return
    import keras

    expected = 3 if keras.__version__.startswith("3") and not compat.legacy_keras_requested() \
        else 2
    if tf.__version__.startswith("2.15"):
        expected = 2
    assert compat.KERAS_MAJOR_VERSION == expected


def test_optimizer_kinds():
    keras_opt = tf.keras.optimizers.SGD(0.1)
    v1_opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    assert compat.is_keras_optimizer(keras_opt) and not compat.is_tf1_optimizer(keras_opt)
    assert compat.is_tf1_optimizer(v1_opt) and not compat.is_keras_optimizer(v1_opt)
    assert compat.is_optimizer(keras_opt) and compat.is_optimizer(v1_opt)
    assert not compat.is_optimizer(object())


def test_estimator_presence_matches_tensorflow():
    has = hasattr(tf, "estimator")
    try:
        tf.estimator  # noqa: B018
    except Exception:
        has = False
    assert compat.has_estimator() == has
    assert compat.has_estimator() == (compat.TF_VERSION < (2, 16, 0))


def test_graph_and_eager_detection():
    assert compat.executing_eagerly() and not compat.in_graph_mode()
    assert not compat.v1_graph_mode() and not compat.inside_tf_function()
    seen = {}

    @tf.function
    def f():
        seen["fn"] = (compat.in_graph_mode(), compat.inside_tf_function(), compat.v1_graph_mode())
        return tf.constant(0)

    f()
    assert seen["fn"] == (True, True, False)
    with tf.Graph().as_default():
        assert compat.in_graph_mode() and compat.v1_graph_mode()
        assert not compat.inside_tf_function()


def test_indexed_slices_is_tf_class():
    assert compat.IndexedSlices is tf.IndexedSlices
