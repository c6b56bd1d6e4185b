"""Optimizer state of sok variables that a native optimizer trained itself.

A legacy Keras optimizer (OptimizerV2) or a tf.compat.v1.train optimizer can
update a static `sok.Variable` with its own apply_gradients; its state for
that variable then lives in the optimizer (`optimizer.get_slot(var, name)`),
not in the OptimizerWrapper that sok.OptimizerScope routes updates to.
`SlotRouter` is what sok.dump / sok.load talk to for a native optimizer: it
has OptimizerWrapper's slot API (algorithm, slot_specs, has_slots,
slot, create_slots, iterations, set_step) and answers, per variable,
from one of the two places:

1. the wrapper, where it holds slots for the variable (OptimizerScope);
2. the native optimizer, where it holds them (the variable was trained
   natively);
3. for a static variable and an optimizer that keeps per-variable slots, new
   native slots (a load into a freshly built optimizer, before any step);
4. the wrapper otherwise (DynamicVariables always).

Slots are named as in the algorithm table (algorithms.py) on both paths, so
a dump made through either one loads through the other. The step that goes
with native slots is the optimizer's own: Keras' `iterations`, and for
tf.compat.v1's Adam the step its beta powers stand for; the other
tf.compat.v1 optimizers count no steps (the dump records the wrapper's step
where the wrapper's slots were used too, else 0).

The native slots themselves are read and written by NativeSlots
(native_state.py), which OptimizerWrapper also uses.
"""

import tensorflow as tf

from sok_graph import compat
from sok_graph.tables import is_dynamic, replica_shards
from sok_graph.optimization.native_state import NativeSlots
from sok_graph.optimization.wrapper import (OptimizerWrapper, _NativeWrapper, wrapper_for,
                                            wrappers_with_slots)


def slot_state_for(optimizer):
    """What sok.dump / sok.load read and write `optimizer`'s state through: an
    OptimizerWrapper as it is; for a native optimizer, a SlotRouter over it
    and the wrapper that sok.OptimizerScope routes its sok updates to."""
    if isinstance(optimizer, OptimizerWrapper):
        return optimizer
    if not compat.is_optimizer(optimizer):
        # wrapper_for's weak dictionary failed first, with "cannot create
        # weak reference to 'str' object", naming neither the argument nor
        # what it takes.
        raise TypeError(f"optimizer must be None, a sok optimizer (sok.OptimizerWrapper, "
                        f"sok.SGD, sok.optimizers.Adam, ...), a Keras optimizer or a "
                        f"tf.compat.v1.train optimizer; got {type(optimizer).__name__} "
                        f"{optimizer!r}")
    return SlotRouter(optimizer, wrapper_for(optimizer))


def refuse_slots_held_elsewhere(state, variables, action):
    """ValueError when a table of `variables` ({name: table}) has no slots
    in `state` (slot_state_for's answer for the optimizer given to `action`,
    "sok.dump" or "sok.load") while another optimizer in use holds them:
    the optimizer that wraps the one given (sok.OptimizerWrapper(opt)
    trained the table, opt was passed) or, for a dump, any other (two
    tables trained by two optimizers, dumped with one). A dump wrote fresh
    slots and step 0 for such a table, and a load with the wrapped
    optimizer put the dumped ones where training never reads them, both
    without an error. A load into another optimizer is allowed (training
    may go on with a new one); a table no optimizer has slots for yet
    (never trained) takes fresh ones, as before."""
    own = state._wrapper if isinstance(state, SlotRouter) else state
    for name, table in variables.items():
        parts = replica_shards.shards_of(table)
        if any(state.has_slots(part) for part in parts):
            continue
        holders = [w for w in wrappers_with_slots(table) if w is not own]
        if not holders:
            continue
        native_given = isinstance(own, _NativeWrapper)
        given = own._optimizer if native_given else own
        wraps_given = any(not isinstance(w, _NativeWrapper) and w._optimizer is given
                          for w in holders)
        dumping = action == "sok.dump"
        if not dumping and not wraps_given:
            continue
        harm = ("write fresh slots and step 0 for it" if dumping else
                "put its slots and step where its training does not read them")
        raise ValueError(
            f"{action}: the optimizer state of table '{name}' is held by "
            f"{' and '.join(_described(w) for w in holders)}, not by the optimizer given "
            f"({type(given).__name__ if native_given else _described(own)}): {action} would "
            f"{harm}. Pass the optimizer that trains the table"
            + ("; for a table trained through sok.OptimizerWrapper(opt), the wrapper, not opt"
               if wraps_given else
               "; tables trained by different optimizers are dumped and loaded separately, "
               "each with its own"))


def _described(wrapper):
    """How a refusal names an OptimizerWrapper: itself, or the native
    optimizer whose state it keeps under sok.OptimizerScope."""
    if isinstance(wrapper, _NativeWrapper):
        return f"{type(wrapper._optimizer).__name__} (the optimizer itself, under sok.OptimizerScope)"
    return f"sok.OptimizerWrapper({type(wrapper._optimizer).__name__})" if type(
        wrapper) is OptimizerWrapper else type(wrapper).__name__


class SlotRouter:
    """OptimizerWrapper's slot API for a native optimizer: each variable's
    slots from the wrapper or from the optimizer (see the module docstring)."""

    def __init__(self, optimizer, wrapper):
        self._wrapper = wrapper
        self._native = NativeSlots(optimizer, wrapper.algorithm)
        # id() of the variables answered from native slots, and from the
        # wrapper's: they say whose step goes with the slots.
        self._native_ids, self._wrapper_ids = set(), set()

    @property
    def algorithm(self):
        return self._wrapper.algorithm

    @property
    def slot_formulas(self):
        return self._wrapper.slot_formulas

    def slot_specs(self):
        return self._wrapper.slot_specs()

    def slot_names(self):
        return self._wrapper.slot_names()

    def _native_for(self, var, create=False):
        """Whether `var`'s slots are the native optimizer's (creating them
        first where `create` and the rule says so)."""
        if self._wrapper.has_slots(var):
            self._wrapper_ids.add(id(var))
            return False
        if is_dynamic(var) or isinstance(var, replica_shards.ReplicaShards):
            return False
        names = self._wrapper.slot_names()
        if names and self._native.trained_without_slots(var):
            # The wrapper's (empty) slots would be dumped as the state, and
            # loaded ones never read by the native updates that follow.
            raise ValueError(
                f"optimizer {type(self._native.optimizer).__name__} updated sok variable "
                f"'{getattr(var, 'name', var)}' with its own apply_gradients, and keeps its "
                f"{', '.join(names)} state where sok.dump / sok.load cannot read or write it "
                f"(Keras 3's optimizers, Keras 2's newer ones): train sok variables inside "
                f"sok.OptimizerScope(...) or with sok.OptimizerWrapper(optimizer)")
        if not self._native.has(var, names):
            if not (create and self._native.keeps_slots):
                return False
            self._native.create(var)
            if not self._native.has(var, names):
                return False
        self._native_ids.add(id(var))
        return True

    def has_slots(self, var):
        return self._native_for(var) or self._wrapper.has_slots(var)

    def slot(self, var, name):
        if self._native_for(var):
            return self._native.get(var, name)
        return self._wrapper.slot(var, name)

    def create_slots(self, var):
        if not self._native_for(var, create=True):
            self._wrapper.create_slots(var)
            self._wrapper_ids.add(id(var))

    @property
    def iterations(self):
        """The native optimizer's step where native slots were used and it
        keeps one; else the wrapper's where its slots were used; else 0 (a
        tf.compat.v1 optimizer other than Adam counts no steps, and the
        wrapper's counter, never used, may not even be initialized in a
        Session)."""
        step = self._native.step() if self._native_ids else None
        if step is not None:
            return step
        if self._native_ids and not self._wrapper_ids:
            return tf.constant(0, tf.int64)
        return self._wrapper.iterations

    def set_step(self, step):
        """Assignments of `step` to the wrapper's step counter (as for any
        optimizer: a native one restored before its first step may go on
        inside sok.OptimizerScope) and, where native slots were used, to the
        native optimizer's."""
        ops = list(self._wrapper.set_step(step))
        if self._native_ids:
            ops.extend(self._native.set_step(step))
        return ops
