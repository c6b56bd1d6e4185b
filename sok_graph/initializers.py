"""The initializers of sok tables: SOK's accepted forms (names, numbers,
Keras / tf initializer objects) as one complete spec, which is the
attributes of SokDynamicTableCreate for a dynamic table
(sok_graph/ops/dynamic.py `create`) and a Keras initializer for a static one
(`static_initializer`), so a name means the same rows for both.

The default, for `DynamicVariable(initializer=None)` and SOK's "random", is
uniform in [-0.05, 0.05), as a Keras Embedding starts (the 1.x layers'
default `embedding_initializer` is the same). The op's own attribute
defaults (normal, stddev 1.0) are never used by sok_graph, which passes every
attribute; they stay as registered, since a graph saved without its default
attributes reads them back from the registration.
"""

import math

import numpy as np

# Every key of a spec, with the default's values. Keys that the spec's
# `initializer` does not read keep these values.
DEFAULT = dict(initializer="uniform", mean=0.0, stddev=0.05, minval=-0.05, maxval=0.05,
               value=0.0, seed=0)


def _number(text):
    """The float a string holds ("13", "-0.5", "1e-3"), else None."""
    try:
        return float(text.strip())
    except ValueError:
        return None


def _finite_constant(value, given):
    """A constant initializer's value: a finite float32 (NaN, infinities and
    numbers past float32's range would fill every new row with them)."""
    if not math.isfinite(value) or abs(value) > float(np.finfo(np.float32).max):
        raise ValueError(f"initializer={given!r}: a constant initializer must be a finite "
                         f"float32 number")
    return value


def initializer_spec(initializer, seed=None):
    """The table's complete initializer spec (every key of DEFAULT) from
    SOK's accepted forms: None, "random" (SOK's default name) or "uniform"
    (uniform in [-0.05, 0.05), as a Keras Embedding starts), a string holding
    a number ("13": constant), "normal" / "truncated_normal" (mean 0, stddev
    0.05, as Keras' defaults), "zeros", "ones", a number (constant), or a
    Keras / tf initializer object (RandomNormal, TruncatedNormal,
    RandomUniform, Zeros, Ones, Constant)."""
    spec = dict(DEFAULT, seed=seed or 0)
    if isinstance(initializer, (np.ndarray, list, tuple)):
        raise TypeError(f"initializer must be a name, a number or a Keras/TF initializer (a "
                        f"dynamic table has no fixed rows to take an array's values); got "
                        f"{type(initializer).__name__} {np.shape(initializer)}")
    if initializer is None or initializer in ("", "random"):
        initializer = "uniform"  # SOK's default, "random", a small uniform range
    if initializer in ("normal", "random_normal"):
        return dict(spec, initializer="normal")
    if isinstance(initializer, str) and _number(initializer) is not None:
        # SOK: a string holding a number is a constant initializer ("13").
        return dict(spec, initializer="constant",
                    value=_finite_constant(_number(initializer), initializer))
    if isinstance(initializer, str):
        names = {"uniform": dict(initializer="uniform", minval=-0.05, maxval=0.05),
                 "random_uniform": dict(initializer="uniform", minval=-0.05, maxval=0.05),
                 "truncated_normal": dict(initializer="truncated_normal"),
                 "zeros": dict(initializer="zeros"),
                 "ones": dict(initializer="constant", value=1.0)}
        if initializer not in names:
            raise ValueError(
                f"initializer must be one of 'normal', 'truncated_normal', 'uniform', 'zeros', "
                f"'ones', a number or a Keras/TF initializer; got {initializer!r}")
        spec.update(names[initializer])
        return spec
    if isinstance(initializer, (int, float, np.number)) and not isinstance(initializer, bool):
        return dict(spec, initializer="constant",
                    value=_finite_constant(float(initializer), initializer))
    config = initializer.get_config() if hasattr(initializer, "get_config") else None
    kind = type(initializer).__name__
    if config is None:
        raise TypeError(f"initializer {initializer!r} is not a supported initializer")
    seed = config.get("seed", seed) or 0
    if kind in ("RandomNormal", "random_normal_initializer"):
        return dict(spec, initializer="normal", mean=config.get("mean", 0.0),
                    stddev=config.get("stddev", 1.0),
                    seed=seed)
    if kind in ("TruncatedNormal", "truncated_normal_initializer"):
        return dict(spec, initializer="truncated_normal", mean=config.get("mean", 0.0),
                    stddev=config.get("stddev", 1.0), seed=seed)
    if kind in ("RandomUniform", "random_uniform_initializer"):
        return dict(spec, initializer="uniform", minval=config.get("minval", -0.05),
                    maxval=config.get("maxval", 0.05), seed=seed)
    if kind in ("Zeros", "zeros_initializer"):
        return dict(spec, initializer="zeros")
    if kind in ("Ones", "ones_initializer"):
        return dict(spec, initializer="constant", value=1.0)
    if kind in ("Constant", "constant_initializer"):
        value = config.get("value", 0.0)
        if np.ndim(value) != 0:
            raise ValueError("a Constant initializer for a DynamicVariable must hold one number")
        return dict(spec, initializer="constant", value=float(value))
    raise TypeError(
        f"initializer {kind} is not supported by DynamicVariable; use RandomNormal, "
        f"TruncatedNormal, RandomUniform, Zeros, Ones, Constant or one of their names")


def static_initializer(initializer):
    """A callable(shape=, dtype=) giving a static table's rows for
    `initializer`: the names and numbers initializer_spec knows, with the
    same meaning (as Keras initializers); another name Keras knows
    ("glorot_uniform", ...) as Keras gives it; a callable (a Keras / tf
    initializer) unchanged."""
    import tensorflow as tf

    if callable(initializer):
        return initializer
    is_number = isinstance(initializer, (int, float, np.number)) and \
        not isinstance(initializer, bool)
    if not (isinstance(initializer, str) or is_number):
        raise TypeError(f"initializer must be a name, a number or a Keras/TF initializer; got "
                        f"{type(initializer).__name__}")
    try:
        spec = initializer_spec(initializer)
    except ValueError:
        if is_number:
            raise
        return tf.keras.initializers.get(initializer)
    kind = spec["initializer"]
    if kind == "uniform":
        return tf.keras.initializers.RandomUniform(spec["minval"], spec["maxval"])
    if kind == "normal":
        return tf.keras.initializers.RandomNormal(spec["mean"], spec["stddev"])
    if kind == "truncated_normal":
        return tf.keras.initializers.TruncatedNormal(spec["mean"], spec["stddev"])
    if kind == "zeros":
        return tf.keras.initializers.Zeros()
    return tf.keras.initializers.Constant(spec["value"])
