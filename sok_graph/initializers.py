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
import threading
import weakref

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


def _is_tensor(value):
    """Whether `value` is a tf.Tensor or tf.Variable (TensorFlow is imported
    only once this module's callers have done so)."""
    import tensorflow as tf

    return isinstance(value, (tf.Tensor, tf.Variable))


def _checked_seed(seed, what):
    """seed as an int of int64's range (the op's attribute), None for None,
    or a ValueError naming `what`: a float was cut to an int, a str or a
    larger int failed with int()'s or the attribute's message, naming
    nothing."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or \
            not -(1 << 63) <= int(seed) < (1 << 63):
        raise ValueError(f"{what} must be None or an integer in [-2^63, 2^63); got {seed!r}")
    return int(seed)


def _finite_parameters(kind, spec):
    """spec, after a check that the parameters its `initializer` reads are
    finite float32 numbers (stddev > 0 is not asked: TensorFlow's own
    initializers take any): a Keras / tf initializer object holding NaN or
    an infinity (Constant(nan), RandomNormal(stddev=inf)) filled every new
    row of the table with NaN or infinities, where the same constant given
    as a number is refused."""
    used = {"constant": ("value",), "normal": ("mean", "stddev"),
            "truncated_normal": ("mean", "stddev"),
            "uniform": ("minval", "maxval")}.get(spec["initializer"], ())
    limit = float(np.finfo(np.float32).max)
    for key in used:
        value = spec[key]
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = float("nan")
        if not math.isfinite(number) or abs(number) > limit:
            raise ValueError(f"initializer {kind}: its {key} must be a finite float32 number "
                             f"(every new row would be filled from it); got {value!r}")
    return spec


def initializer_spec(initializer, seed=None):
    """The table's complete initializer spec (every key of DEFAULT) from
    SOK's accepted forms: None, "random" (SOK's default name) or "uniform"
    (uniform in [-0.05, 0.05), as a Keras Embedding starts), a string holding
    a number ("13": constant), "normal" / "truncated_normal" (mean 0, stddev
    0.05, as Keras' defaults), "zeros", "ones", a number (constant), or a
    Keras / tf initializer object (RandomNormal, TruncatedNormal,
    RandomUniform, Zeros, Ones, Constant). The seed: the initializer
    object's own, else `seed`, else 0 (table_spec gives a new table one of
    its own instead)."""
    spec = _spec(initializer, seed)
    return spec if spec["seed"] is not None else dict(spec, seed=0)


# The kinds of initializer that draw a table's rows (a seed matters).
DRAWN = ("uniform", "normal", "truncated_normal")


def table_spec(initializer, seed=None):
    """initializer_spec for a new table, with seed None where the table must
    draw one of its own (own_seed, once every argument has passed its
    checks): its rows are drawn and it was given no seed, neither `seed` nor
    one in its initializer object. With one seed for all, two tables gave
    every key the same initial row in both, so a user table and an item
    table keyed alike started equal, where Keras and TensorFlow draw each
    variable apart."""
    spec = _spec(initializer, seed)
    if spec["seed"] is not None or spec["initializer"] in DRAWN:
        return spec
    return dict(spec, seed=0)


class SharedSeed:
    """The one seed of a table split into replica shards (each built as a
    table of its own): drawn by the first shard once its arguments passed
    their checks, then taken by the others, so the shards draw a key's row
    as the whole table does in a job of one process per worker."""

    def __init__(self):
        self._value = None

    def get(self):
        if self._value is None:
            self._value = own_seed()
        return self._value


# Seeds handed out by own_seed: per graph (graph mode) or for the eager
# context, how many were drawn from each base.
_own_seeds = weakref.WeakKeyDictionary()
_eager_own_seeds = {}
_own_seeds_lock = threading.Lock()
_MASK64 = (1 << 64) - 1


def own_seed(base=0):
    """The seed of a table given none: `base` for the first such table of
    this graph (eagerly: since sok.init / sok.Init, see restart_own_seeds),
    then one derived from `base` and the table's number, as TensorFlow
    derives each op's seed from its graph's. Every worker of a job, like the
    one process it is compared with, makes its tables in the same order, so
    a table gets the same seed on each (a dynamic table's initial row of a
    key depends on it, not on the worker that holds the key)."""
    graph = _tables_graph()
    with _own_seeds_lock:
        counts = _eager_own_seeds if graph is None else _own_seeds.setdefault(graph, {})
        number = counts.get(base, 0)
        counts[base] = number + 1
    if number == 0:
        return base
    # splitmix64 of (base, number), into int64's non-negative half
    x = (base + number * 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) >> 1


def restart_own_seeds():
    """Numbers the next tables without a seed from the first again (eagerly,
    and in the current graph): sok.init and sok.Init call it, as
    tf.random.set_seed restarts TensorFlow's op seeds, so a model built
    again in the same process after them starts from the same rows."""
    graph = _tables_graph()
    with _own_seeds_lock:
        _eager_own_seeds.clear()
        if graph is not None:
            _own_seeds.pop(graph, None)


def _tables_graph():
    """The graph a table made now lives in (where tf.init_scope lifts its
    creation), or None eagerly."""
    import tensorflow as tf

    with tf.init_scope():
        return None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()


def _spec(initializer, seed):
    """initializer_spec, with seed None where none was given."""
    spec = dict(DEFAULT, seed=_checked_seed(seed, "seed"))
    if isinstance(initializer, type):
        # Its get_config, called on the class, failed with "missing 1
        # required positional argument: 'self'".
        raise TypeError(f"initializer must be a name, a number or a Keras/TF initializer "
                        f"object; got the class {initializer.__name__} (give an instance: "
                        f"{initializer.__name__}())")
    if _is_tensor(initializer):
        # Its comparison with a name below failed with "Cannot convert '' to
        # EagerTensor".
        raise TypeError(f"initializer must be a name, a number or a Keras/TF initializer; got "
                        f"a {type(initializer).__name__} (give a number: "
                        f"initializer=float(value))")
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
    own = _checked_seed(config.get("seed"), f"the seed of initializer {kind}")
    spec = _object_spec(kind, config, spec, spec["seed"] if own is None else own)
    return _finite_parameters(kind, spec)


def _object_spec(kind, config, spec, seed):
    """The spec of a Keras / tf initializer object of class `kind` whose
    get_config() is `config`."""
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
