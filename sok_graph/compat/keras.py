"""Which Keras this TensorFlow runs, and how to recognise optimizers of each
kind: Keras 2 (``tf.keras.optimizers`` up to TF 2.15, plus its ``legacy``
optimizers), Keras 3 (TF 2.16+), and ``tf.compat.v1.train`` optimizers."""

import tensorflow as tf


def _keras_version():
    try:
        keras = tf.keras
        version = getattr(keras, "__version__", None)
        if version is None:
            import keras as keras_pkg  # Keras 3 hides the version on tf.keras

            version = keras_pkg.__version__
        return int(str(version).split(".")[0])
    except Exception:  # pragma: no cover - TF 1.x has its own tf.keras
        return 2


KERAS_MAJOR_VERSION = _keras_version()


def keras_optimizer_classes():
    """Base classes of every Keras optimizer this TensorFlow can create."""
    classes = []
    try:
        classes.append(tf.keras.optimizers.Optimizer)
    except AttributeError:  # pragma: no cover
        pass
    legacy = getattr(tf.keras.optimizers, "legacy", None)
    # Keras 3 keeps a `legacy` module whose names only warn; only a real
    # optimizer class counts.
    base = getattr(legacy, "Optimizer", None)
    if isinstance(base, type) and hasattr(base, "apply_gradients"):
        classes.append(base)
    return tuple(classes)


def is_tf1_optimizer(opt):
    """A ``tf.compat.v1.train.Optimizer`` (GradientDescentOptimizer, ...)."""
    return isinstance(opt, tf.compat.v1.train.Optimizer)


def is_keras_optimizer(opt):
    return isinstance(opt, keras_optimizer_classes())


def is_optimizer(opt):
    return is_tf1_optimizer(opt) or is_keras_optimizer(opt)
