"""The slots a native optimizer keeps itself for the sok variables it
trained: a legacy Keras optimizer (OptimizerV2) or a tf.compat.v1.train
optimizer updating a static `sok.Variable` with its own apply_gradients
keeps that variable's state in the optimizer (`optimizer.get_slot(var,
name)`). `NativeSlots` reads, creates and writes those slots under the
algorithm table's slot names (algorithms.py), and the step that goes with
them: Keras' `iterations`, and for tf.compat.v1's Adam the step its beta
powers stand for.

`native_rows` lets OptimizerWrapper start its slots of a static variable
from the native ones: a native optimizer restored by sok.load before its
first step, then used inside sok.OptimizerScope, keeps the state it was
given. optimization/native_slots.py routes dump/load between the two.
"""

import numpy as np
import tensorflow as tf

from sok_graph import compat
from sok_graph.tables import is_dynamic
from sok_graph.optimization.algorithms import value

# Where a family's native slot name differs from the table's (checked
# against the installed optimizers' add_slot / _zeros_slot calls).
_KERAS_NAMES = {"adadelta": {"accum": "accum_grad", "accum_update": "accum_var"}}
_TF1_NAMES = {"ftrl": {"accumulator": "accum"}}


class NativeSlots:
    """The per-variable slots of one native optimizer, under the table's names."""

    def __init__(self, optimizer, algorithm):
        self._opt = optimizer
        self._algorithm = algorithm
        self._tf1 = compat.is_tf1_optimizer(optimizer)
        self._renames = (_TF1_NAMES if self._tf1 else _KERAS_NAMES).get(algorithm, {})

    @property
    def optimizer(self):
        return self._opt

    @property
    def keeps_slots(self):
        """Whether the optimizer keeps slots per variable (Keras OptimizerV2 and
        tf.compat.v1.train do; Keras' newer optimizers and sok_graph's own
        rules do not)."""
        return all(callable(getattr(self._opt, attr, None))
                   for attr in ("get_slot", "_create_slots"))

    def trained_without_slots(self, var):
        """Whether the optimizer updated `var` with its own apply_gradients
        while keeping no slots per variable that NativeSlots can read
        (Keras 3's optimizers, and Keras 2's newer ones, which index their
        state by variable): its state for `var` is out of sok's reach."""
        if self.keeps_slots:
            return False
        index = getattr(self._opt, "_trainable_variables_indices", None)
        if not isinstance(index, dict):
            index = getattr(self._opt, "_index_dict", None)
        key_of = getattr(self._opt, "_var_key", None)
        if not isinstance(index, dict) or not callable(key_of):
            return False
        try:
            indexed = key_of(var) in index
        except (AttributeError, TypeError, ValueError):
            return False
        # build() indexes every variable it is given (Keras 3's fit builds the
        # optimizer over all trainable variables before the first step, and a
        # restore often builds it first): only an optimizer that has taken a
        # step can have updated `var` itself.
        return indexed and self._has_stepped()

    def _has_stepped(self):
        """Whether the optimizer's step count is above 0; True where it cannot
        be read now (a graph not yet run), so a doubt refuses."""
        count = getattr(self._opt, "iterations", None)
        if count is None or not tf.executing_eagerly():
            return True
        try:
            return int(np.asarray(count.numpy() if hasattr(count, "numpy") else count)) > 0
        except (TypeError, ValueError, AttributeError):
            return True

    def _lookup(self, var, name):
        try:
            # tf.compat.v1.train answers None for a missing slot, Keras raises.
            return self._opt.get_slot(var, self._renames.get(name, name))
        except KeyError:
            return None

    def has(self, var, names):
        """Whether the optimizer holds every slot in `names` for `var`."""
        return self.keeps_slots and all(self._lookup(var, n) is not None for n in names)

    def get(self, var, name):
        slot = self._lookup(var, name)
        if slot is None:
            raise KeyError(f"{type(self._opt).__name__} holds no '{name}' slot for "
                           f"{getattr(var, 'name', var)}")
        return slot

    def create(self, var):
        """Makes the optimizer's slots (and step, hyperparameters) for `var`
        as its first apply_gradients would."""
        with tf.init_scope():
            if self._tf1:
                self._opt._create_slots([var])
            elif hasattr(self._opt, "_create_all_weights"):
                self._opt._create_all_weights([var])
            else:  # OptimizerV2 before TF 2.3 (TF 1.15)
                _ = self._opt.iterations
                self._opt._create_hypers()
                self._opt._create_slots([var])

    def _adam_powers(self):
        """tf.compat.v1 Adam's (beta1_power, beta2_power) variables and betas."""
        powers = self._opt._get_beta_accumulators()
        if any(p is None for p in powers):
            return None
        betas = tuple(_number(getattr(self._opt, a), a) for a in ("_beta1", "_beta2"))
        return powers, betas

    def step(self):
        """A tensor of the optimizer's step, or None where it keeps none."""
        if not self._tf1:
            return self._opt.iterations if hasattr(self._opt, "iterations") else None
        if self._algorithm != "adam":
            return None
        found = self._adam_powers()
        if found is None:
            return None
        powers, betas = found

        def count(p1, p2):
            return np.int64(_adam_step_of(betas, np.array([p1, p2], np.float32)))

        # TF 1.15 has numpy_function too; it replaces the deprecated py_func.
        return tf.numpy_function(count, list(powers), tf.int64)

    def set_step(self, step):
        """Assignments that make the optimizer's step `step`."""
        if not self._tf1:
            return [self._opt.iterations.assign(step)] if hasattr(self._opt, "iterations") else []
        if self._algorithm != "adam":
            return []
        found = self._adam_powers()
        if found is None:
            return []
        powers, betas = found
        values = _adam_powers_at(betas, int(step))
        return [p.assign(tf.constant(v, p.dtype.base_dtype)) for p, v in zip(powers, values)]


def _number(x, what):
    """The float value of hyperparameter `x` (a number, a callable giving one,
    or a constant tensor)."""
    given = value(x)
    found = given
    if isinstance(given, tf.Variable):
        found = None
    elif isinstance(given, tf.Tensor):
        found = tf.get_static_value(given)
    if found is None:
        raise TypeError(f"AdamOptimizer's {what.lstrip('_')} must be a number (or a constant) "
                        f"for sok.dump / sok.load to count its step from its beta powers; got "
                        f"{given!r}")
    return float(found)


_TINY = np.finfo(np.float32).tiny
_CHUNK = 1 << 16


def _flush(x):
    """TensorFlow's CPU kernels flush denormals to zero; 1 - p is 1 in float32
    for any p that small, so a flushed power updates alike."""
    x = np.array(x, np.float32)
    x[np.abs(x) < _TINY] = 0
    return x


def _power_chunks(betas):
    """(first step, [n, 2] float32 beta powers of steps first..first+n-1,
    last) in chunks: Adam's beta powers, beta^(t+1) after t steps, multiplied
    in float32 one step at a time as its _finish does. `last`: the powers stop
    changing after this chunk (they reached zero, or a beta is 1)."""
    betas = np.array(betas, np.float32)
    first, current = 0, _flush(betas)
    while True:
        rows = np.empty((_CHUNK, 2), np.float32)
        rows[0] = current
        rows[1:] = betas
        # Sequential float32 products, each rounded: the values TensorFlow's
        # repeated multiplication gives.
        seq = _flush(np.multiply.accumulate(rows, axis=0, dtype=np.float32))
        following = _flush(seq[-1] * betas)
        last = bool(np.array_equal(following, seq[-1]))
        yield first, seq, last
        if last:
            return
        first, current = first + _CHUNK, following


def _adam_step_of(betas, powers):
    """The fewest steps after which Adam's beta powers are `powers`."""
    want = _flush(powers)
    for first, seq, _ in _power_chunks(betas):
        hit = np.nonzero((seq == want).all(axis=1))[0]
        if hit.size:
            return first + int(hit[0])
    raise ValueError(f"AdamOptimizer's beta powers {powers.tolist()} are no step's powers of "
                     f"beta1={betas[0]}, beta2={betas[1]}: the optimizer's betas changed "
                     f"since it trained, or its powers were assigned")


def _adam_powers_at(betas, step):
    """Adam's float32 (beta1_power, beta2_power) after `step` steps."""
    for first, seq, last in _power_chunks(betas):
        if step < first + len(seq):
            return seq[step - first]
        if last:
            return seq[-1]


def native_rows(optimizer, algorithm, var, names):
    """{slot name: current value} of the slots in `names` that `optimizer`
    keeps natively for static sok variable `var`, or None where it keeps
    none (or not all of them). Eager only: a graph's slots hold no value
    until its Session runs."""
    if not names or is_dynamic(var) or not tf.executing_eagerly():
        return None
    native = NativeSlots(optimizer, algorithm)
    if not native.has(var, names):
        return None
    return {name: tf.identity(native.get(var, name)) for name in names}
