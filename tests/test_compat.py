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


def _autograph_calls_as_written(function):
    """AutoGraph's own decision: True where a tf.function calls `function`
    unconverted (its name for the check differs in TF 1.15)."""
    from tensorflow.python.autograph.impl import conversion

    check = getattr(conversion, "is_allowlisted", None) or conversion.is_whitelisted_for_graph
    return check(function)


def test_autograph_calls_the_package_as_written_and_still_converts_user_code():
    """sok_graph's functions and methods run as written inside a
    tf.function, as TensorFlow's and Keras' own do (converting them again in
    every trace only made first steps slow); the caller's own functions are
    converted as before, and the rule is added once however often it is
    asked for."""
    import sok_graph as sok
    from tensorflow.python.autograph.core import config as autograph_config

    def users_step(x):
        return x

    table = sok.Variable(tf.ones([4, 2]))
    wrapper = sok.OptimizerWrapper(tf.keras.optimizers.SGD(0.1)) if not compat.IS_TF1 \
        else sok.OptimizerWrapper(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    for function in (sok.lookup_sparse, sok.export, wrapper.apply_gradients, table.assign,
                     sok.DynamicVariable.__init__, sok.DistributedEmbedding.call):
        assert _autograph_calls_as_written(function), function
    assert not _autograph_calls_as_written(users_step)
    before = len(autograph_config.CONVERSION_RULES)
    compat.leave_package_to_autograph_unconverted("sok_graph")
    assert len(autograph_config.CONVERSION_RULES) == before


def test_saving_a_saved_model_is_true_while_tf_saved_model_save_traces(tmp_path):
    """The lookup's cross-worker agreement gathers nothing in a function
    traced to be saved (a model saved on rank 0 alone): the flag it reads
    is set while tf.saved_model.save traces, and only then."""
    if compat.IS_TF1:
        assert compat.saving_a_saved_model() is False
        return
    seen = []

    class Module(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def double(self, x):
            seen.append(compat.saving_a_saved_model())
            return x * 2

    module = Module()
    module.double(tf.constant([1.0]))
    tf.saved_model.save(module, str(tmp_path / "saved"))
    assert seen[0] is False and seen[-1] is True, seen
    assert compat.saving_a_saved_model() is False
