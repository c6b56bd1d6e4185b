"""Sparse optimizer updates for sok variables.

`OptimizerWrapper(optimizer)` takes a ``tf.compat.v1.train`` or Keras
optimizer (Keras 2 or 3) and applies its algorithm to sok variables (static
`sok.Variable` and `sok.DynamicVariable`) row by row: only the rows a
gradient touches change, and their optimizer state ("slots") changes with
them. Other variables are passed to the wrapped optimizer unchanged.

Algorithms, with the wrapped optimizer's own hyperparameters (the table and
the formulas are in algorithms.py): SGD, Momentum (Keras SGD with momentum;
nesterov too), Adagrad, Ftrl (l1, l2, l2 shrinkage, beta), RMSprop
(momentum, centered), Adadelta, Adam and Adamax (both lazy: untouched rows
keep their moments, as LazyAdam does; the bias correction uses this
wrapper's step count: one step per apply_gradients call, also a call whose
tables got no gradient).
RMSprop is lazy too, as TF's sparse kernels are: Keras 2's RMSprop
without momentum decays every row's mean square each step, sok only the
rows a gradient touches.

Refused, naming the optimizer and the hyperparameter (when the wrapper is
made; for a native optimizer under sok.OptimizerScope, when it would update
sok rows), before anything changes: a Keras option the row updates ignore
(weight_decay, clipnorm, ...); a hyperparameter given as a number that is
NaN, infinite or outside what its algorithm takes (a learning rate < 0,
Adam's beta_1 outside [0, 1), rho outside [0, 1], ...:
algorithms._RANGES; a Keras 3 learning rate is read from its variable); a
learning rate (a tensor, a variable, what a callable or schedule gives)
that is not a scalar of a real dtype.

A learning rate known only when a graph runs (a placeholder, a variable, a
schedule's result, in a Session's graph or a tf.function) is checked then:
NaN, an infinity or a negative number fails the update with an
InvalidArgumentError naming the optimizer and learning_rate, before any
row, slot or the step changes (checked_rate). Eagerly, the value of a
tensor or variable is checked at each apply_gradients (a ValueError).
Python numbers add no op.

The slot API (`algorithm`, `slot_specs`, `slot_names`, `create_slots`,
`has_slots`, `slot`, `variables`, `set_step`) is what dump/load and the
savers use to write and restore optimizer state.

Slots of a static variable are tf.Variables of its shape; slots of a dynamic
variable are dynamic tables with its keys (new keys start from the slot's
initial value) that drop every key the variable evicts. A table sharded over
the replicas of a MirroredStrategy in one process (ReplicaShards) has slots
per shard, on the shard's device, and each replica updates its own shard
inside strategy.run, with a step counter of its own (all count alike): the
exchange's backward already brought every replica's gradient rows to the
shard that owns them, so nothing is aggregated across replicas.

`update_all_rows=True` (used by the 1.x API's `sok.optimizers.Adam`) applies
the algorithm to every row of the table each step, with a zero gradient for
rows the batch did not touch: that is what TensorFlow's own Adam does with a
sparse gradient (all moments decay, every row with a moment moves).
"""

import weakref

import numpy as np
import tensorflow as tf

from sok_graph import compat, context
from sok_graph.tables import dimension_of, is_dynamic, replica_shards
from sok_graph.tables.keras_weights import held_by
from sok_graph.tables.static import is_sok_variable
from sok_graph.ops import dynamic as dynamic_ops
from sok_graph.ops import util as util_ops
from sok_graph.optimization import fused_apply, native_state
from sok_graph.optimization.algorithms import (Hyperparameters, known_number,
                                               refuse_an_own_apply_gradients, value)

def _replicas():
    """The replicas that keep step counters: a MirroredStrategy's whose
    replicas are the workers, else one."""
    comm = context.active()
    return comm.world_size if getattr(comm, "in_process", False) else 1


def one_replica_in_this_process():
    """Whether this process runs one replica of the training step: no
    strategy, or one replica per worker process (MultiWorkerMirroredStrategy
    over sok's worker processes). Replicas of one process (MirroredStrategy)
    keep a step counter each, and may read a Keras count another replica's
    update has already moved."""
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    if replicas == 1:
        return True
    comm = context.active()
    return comm is not None and not getattr(comm, "in_process", False) and \
        comm.world_size == replicas


def _make_keras2_hyperparameters(optimizer):
    """Keras 2's OptimizerV2 makes its hyperparameters and step variables
    when they are first read; its own apply_gradients makes them in
    tf.init_scope. Read first by the wrapper (made, under OptimizerScope,
    inside a tf.function's step), they were made in that function's graph:
    under a MirroredStrategy, Keras' fit then failed at its first step with
    "You must feed a value for placeholder tensor 'cond/else/_1/cond/
    Placeholder'" (TensorFlow could not lift their initializers out of the
    function). Made here as Keras makes them."""
    # A legacy LossScaleOptimizer has _create_hypers but never ran
    # OptimizerV2.__init__ (no _hypers_created): Hyperparameters refuses it
    # next, naming it.
    if compat.is_tf1_optimizer(optimizer) or not hasattr(optimizer, "_hypers_created"):
        return
    with tf.init_scope():
        optimizer._create_hypers()
        _ = optimizer.iterations


class OptimizerWrapper(compat.trackable_base_class()):
    """``OptimizerWrapper(optimizer)``: ``apply_gradients`` works on sok variables.

    optimizer: a tf.compat.v1.train optimizer or a Keras optimizer.

    tf.train.Checkpoint saves and restores the wrapper's state as it does a
    Keras or tf.compat.v1 optimizer's: its step counters are its children,
    and its slots are checkpointed as slot variables of the table (or
    replica shard) they belong to, which the checkpoint must hold too. A
    checkpoint restored before the first step creates the slots it holds
    (_create_or_restore_slot_variable). A native optimizer's own wrapper
    (sok.OptimizerScope) is a child of that optimizer
    (NATIVE_STATE_DEPENDENCY), so ``tf.train.Checkpoint(optimizer=opt)``
    holds it; an explicit wrapper holds the optimizer it wraps as its child
    "optimizer".
    """

    # Whether an option the row updates would ignore is refused when the
    # wrapper is made (else when it first updates sok rows; _NativeWrapper).
    refuses_when_made = True

    def __init__(self, optimizer, update_all_rows=False):
        if not compat.is_optimizer(optimizer) and not isinstance(optimizer, OwnRule):
            raise TypeError(
                f"optimizer must be a tf.compat.v1.train or Keras optimizer; got "
                f"{type(optimizer).__name__}")
        self._optimizer = optimizer
        if not isinstance(self, _NativeWrapper) and not isinstance(optimizer, OwnRule):
            refuse_an_own_apply_gradients(optimizer)
        _make_keras2_hyperparameters(optimizer)
        self._hp = Hyperparameters(optimizer, tf1_formulas=getattr(optimizer, "tf1_formulas",
                                                                   None))
        if self._hp.refusal and self.refuses_when_made:
            raise ValueError(self._hp.refusal)
        # id(var) -> (a weak reference to var, {slot name: tf.Variable or
        # DynamicVariable}): a new object reusing the id of a table since
        # freed has none of its slots (get_slot, which TensorFlow's
        # checkpoint code asks for every object it saves).
        self._slots = {}
        self._slot_vars = []
        # id(table) -> (a weak reference to a table sharded over replicas,
        # {slot name: its ShardedSlot}).
        self._sharded = {}
        # replica -> step counter: one (0) but with a MirroredStrategy's
        # replicas as workers (each replica counts its own applies).
        self._steps = {}
        self._update_all_rows = bool(update_all_rows)
        if not isinstance(self, _NativeWrapper) and hasattr(optimizer, "_track_trackable"):
            self._track_trackable(optimizer, name="optimizer")
        _every_wrapper.add(self)

    @property
    def optimizer(self):
        return self._optimizer

    @property
    def iterations(self):
        """Number of apply_gradients calls (a call whose tables got no gradient
        counts too): the step of the tables' updates."""
        return self._step_variable()

    @property
    def lr(self):
        """The wrapped optimizer's learning rate (its variable, number or
        schedule), which every update reads. Read-only, as SOK's: set the
        rate on the optimizer itself."""
        return self._hp.lr

    @lr.setter
    def lr(self, value):
        self._refuse_rate("lr")

    @property
    def learning_rate(self):
        """As `lr`."""
        return self._hp.lr

    @learning_rate.setter
    def learning_rate(self, value):
        self._refuse_rate("learning_rate")

    def _refuse_rate(self, name):
        # An attribute of that name used to be made on the wrapper, which no
        # update reads: a rate set to 0 still trained.
        raise AttributeError(
            f"OptimizerWrapper.{name} is read-only: set the learning rate on the wrapped "
            f"optimizer (wrapper.optimizer.learning_rate = ..., or assign to its variable), "
            f"which every update reads")

    def _step_variable(self, replica=None):
        """The step counter of `replica` (default: the replica being built
        inside strategy.run with replicas as workers, else the only one)."""
        if replica is None:
            replica = context.active().rank if replica_shards.in_replica() else 0
        self._forget_another_graphs_steps()
        if replica not in self._steps:
            self._make_steps(max(replica + 1, _replicas()))
        return self._steps[replica]

    def _forget_another_graphs_steps(self):
        """Drops step counters made in another tf.compat.v1 graph than the
        one variables are now made in: one optimizer object used to build a
        second graph (a graph rebuilt in the same process, an evaluation or
        export graph, as a tf.compat.v1.train optimizer allows, keeping its
        non-slot variables per graph) failed with "... must be from the same
        graph as Tensor("AssignAdd_1:0" ...)". The first graph's ops keep the
        counter they were built with."""
        if not self._steps:
            return
        with tf.init_scope():
            if tf.executing_eagerly():
                return
            graph = tf.compat.v1.get_default_graph()
        try:
            made_in = next(iter(self._steps.values())).graph
        except (AttributeError, RuntimeError):
            return
        if made_in is not graph:
            self._steps = {}

    def _make_steps(self, replicas):
        """The step counters, one per replica, each on its replica's device
        (each replica counts its own applies, all the same count). A
        checkpoint holds them as one "step" (a plain process's counter,
        or a ReplicaCounters), so it restores into any number of replicas:
        each counter was filed on its own before, and a replica the
        checkpoint had no counter for started again from step 0 (Adam's
        bias correction of a fresh start on its shard only)."""
        with tf.init_scope():
            for replica in range(replicas):
                if replica not in self._steps:
                    with replica_shards.shard_scope(replica):
                        self._steps[replica] = replica_shards.new_variable(
                            0, dtype=tf.int64, trainable=False, name="sok_optimizer_step")
        counters = [self._steps[r] for r in sorted(self._steps)]
        saved = counters[0] if len(counters) == 1 else replica_shards.ReplicaCounters(counters)
        # A checkpoint restored before the counters existed sets them now.
        self._track_trackable(saved, name="step", overwrite=True)

    def set_step(self, step):
        """Assignments of `step` to every step counter (one per replica)."""
        return [self._step_variable(r).assign(step) for r in range(_replicas())]

    def _learning_rate(self, step):
        """The learning rate of the step `step` (after its increment), or,
        with step None, of any step where it does not depend on the step
        (else None); either checked by check_scalar_rate."""
        lr = self._hp.lr
        if compat.is_learning_rate_schedule(lr):
            if step is None:
                return None
            lr = lr(step - 1)
        else:
            lr = value(lr)
        owner = self._optimizer if not isinstance(self._optimizer, OwnRule) else self
        check_scalar_rate(type(owner).__name__, lr)
        return checked_rate(type(owner).__name__, lr)

    @property
    def algorithm(self):
        """The algorithm's name in the table ("sgd", "adam", ...)."""
        return self._hp.algorithm.name

    @property
    def slot_formulas(self):
        """"tf1" or "keras": whose formulas the slots follow. A momentum slot
        means a different thing in each (tf.compat.v1.train's accumulator of
        gradients, Keras' velocity, already scaled by the learning rate)."""
        return "tf1" if self._hp.tf1 else "keras"

    def slot_specs(self):
        """(name, initial value) of each slot kept per row."""
        return list(self._hp.slots())

    def slot_names(self):
        return [name for name, _ in self.slot_specs()]

    def has_slots(self, var):
        """Whether the slots of sok variable (or shard) `var` exist yet."""
        return self._slots_of(var) is not None

    def _slots_of(self, var):
        """{slot name: slot} of sok variable (or shard) `var`, or None."""
        owner, slots = self._slots.get(id(var), (None, None))
        return slots if owner is not None and owner() is var else None

    def get_slot(self, var, name):
        """Slot `name` of sok variable `var`; KeyError for a variable without
        slots here (what TensorFlow's checkpoint code, which asks every
        object it saves, expects). A table sharded over replicas: inside
        strategy.run its replica's shard's slot, outside it the whole slot
        (a ShardedSlot, its shards' slots in `.shards`), which is what a
        checkpoint files under the table; so a shard of such a table has no
        slot of its own outside strategy.run (it would be saved twice)."""
        if not replica_shards.in_replica():
            if isinstance(var, replica_shards.ReplicaShards):
                return self._sharded_slot(var, name)
            if held_by(var, "_replica_holder"):
                raise KeyError(f"{var.name!r} is a replica's shard of a table: its slots are "
                               f"those of get_slot(table, {name!r}).shards")
        return self.slot(replica_shards.resolve(var, "get_slot"), name)

    def slot(self, var, name):
        """Slot `name` of sok variable or replica shard `var` (of a whole
        table sharded over replicas, only inside strategy.run); KeyError
        where it has none. What dump and load read and write."""
        if isinstance(var, replica_shards.ReplicaShards):
            var = replica_shards.resolve(var, "the optimizer's slot")
        if not self.has_slots(var):
            raise KeyError(f"no slots for {getattr(var, 'name', type(var).__name__)!r}")
        return self._slots_of(var)[name]

    def _sharded_slot(self, table, name):
        """get_slot's whole slot `name` of a table sharded over replicas:
        one object per table and name, so that every checkpoint save finds
        the same one."""
        slots = [self.slot(shard, name) for shard in table.shards]
        owner, made = self._sharded.get(id(table), (None, {}))
        if owner is None or owner() is not table:
            made = {}
            self._sharded[id(table)] = (weakref.ref(table), made)
        if name not in made or made[name].shards != slots:
            made[name] = replica_shards.ShardedSlot(table, name, slots)
        return made[name]

    # tf.train.Checkpoint's protocol for an optimizer's slots (see the class
    # docstring): the names, get_slot above, and the restore.
    def get_slot_names(self):
        # None for a SavedModel: its loader rebuilds this object as a plain
        # one, which cannot take slots (loading failed with "'_UserObject'
        # object has no attribute 'add_slot'"); a SavedModel serves, it does
        # not resume training.
        return [] if self._gathered_for_saved_model else self.slot_names()

    # Whether the last save that gathered this object was a SavedModel's:
    # TensorFlow asks every object for its children (with the save's kind)
    # before it asks optimizers for their slots, and a SavedModel writes its
    # variables' checkpoint after leaving its save context.
    _gathered_for_saved_model = False

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        self._gathered_for_saved_model = str(getattr(save_type, "value", save_type)) == (
            "savedmodel")
        return super()._trackable_children(save_type, **kwargs)

    def _create_or_restore_slot_variable(self, slot_variable_position, slot_name, variable):
        """Restores slot `slot_name` of `variable` from a checkpoint,
        creating the variable's slots first where no step made them yet."""
        if not is_sok_variable(variable) or slot_name not in self.slot_names():
            return
        self.create_slots(variable)
        if isinstance(variable, replica_shards.ReplicaShards):
            # Every shard's slot from the whole slot (get_slot's ShardedSlot).
            slot_variable_position.restore(self._sharded_slot(variable, slot_name))
        else:
            # A table of one process, or (a checkpoint of an earlier
            # version, which filed slots per shard) a replica's shard.
            slot_variable_position.restore(self.slot(variable, slot_name))

    def variables(self):
        """Every slot (tf.Variable or DynamicVariable) and the step counter(s)."""
        self._step_variable()
        return list(self._steps.values()) + list(self._slot_vars)

    def _forget_slots_of(self, key):
        """The callback of the weak reference to the table whose slots are
        filed under `key` (its id): once the table is gone, its slots go too.
        An optimizer that outlived its tables kept every dropped table's
        slots (Adam: two tables of the table's size each) for good."""
        optimizer = weakref.ref(self)

        def forget(_):
            self_ = optimizer()
            if self_ is None:
                return
            entry = self_._slots.get(key)
            if entry is None or entry[0]() is not None:
                return  # a newer table of that id has its own slots there
            del self_._slots[key]
            gone = {id(slot) for slot in entry[1].values()}
            self_._slot_vars = [s for s in self_._slot_vars if id(s) not in gone]

        return forget

    def create_slots(self, var):
        """The slots of sok variable `var` ({name: tf.Variable or
        DynamicVariable}), created on first use; every shard's for a table
        sharded over replicas."""
        if isinstance(var, replica_shards.ReplicaShards):
            for shard in var.shards:
                self.create_slots(shard)
            return None
        if self.has_slots(var):
            return self._slots_of(var)
        slots = {}
        pending = getattr(var, PENDING_OPTIMIZER_STATE, None)
        # A replica's shard keeps its slots on its device, as its own.
        with tf.init_scope(), replica_shards.shard_scope(var.placement[1]):
            native = self._native_rows(var)
            for name, init in self._hp.slots():
                slot = var.make_slot(name, init, start=native[name] if native else None)
                slots[name] = slot
                self._slot_vars.append(slot)
        self._slots[id(var)] = (weakref.ref(var, self._forget_slots_of(id(var))), slots)
        if pending is not None:
            # A Keras 3 weights file loaded before this optimizer first
            # updated the table: its slots and step (dump_load.keras_load).
            setattr(var, PENDING_OPTIMIZER_STATE, None)
            with tf.init_scope():
                pending(self)
        return slots

    def _native_rows(self, var):
        """The slots the wrapped native optimizer keeps for static `var`
        ({name: value}), or None: a native optimizer that sok.load restored
        (or that trained `var` itself) goes on from that state when its sok
        updates come here (sok.OptimizerScope)."""
        if isinstance(self._optimizer, OwnRule):
            return None
        return native_state.native_rows(self._optimizer, self.algorithm, var, self.slot_names())

    def apply_gradients(self, grads_and_vars, name=None, steps_before=None, **kwargs):
        """Applies gradients; sok variables get sparse updates, others go to
        the wrapped optimizer. Returns an op in graph mode.

        steps_before: the wrapped Keras optimizer's `iterations` before this
        step (sok.OptimizerScope passes it): the step counter then goes on
        from the larger of it and its own count. Keras 2's
        LossScaleOptimizer counts a step it skips (non-finite gradients) in
        `iterations` without calling this, so Adam's bias correction of the
        tables' rows lagged that of the other weights by the skipped steps."""
        given = _pairs(grads_and_vars)
        refuse_gradients_lost_in_loops(given)
        pairs = [(g, v) for g, v in given if g is not None]
        if given and not pairs:
            # TensorFlow's and Keras' optimizers refuse this too: nothing
            # the loss depends on was given (it trained nothing, without an
            # error, and under sok.OptimizerScope Keras counted a step).
            raise ValueError(_NO_GRADIENTS.format(
                [getattr(v, "name", type(v).__name__) for _, v in given]))
        # A table sharded over replicas: the shard of the replica being built.
        sok_pairs = [(g, replica_shards.resolve(v, "apply_gradients"))
                     for g, v in pairs if is_sok_variable(v)]
        others = [(g, v) for g, v in pairs if not is_sok_variable(v)]
        # Every sok gradient is checked before anything (the wrapped
        # optimizer's variables, the step, slots) changes: a bad one
        # raises and leaves all variables as they were.
        for g, v in sok_pairs:
            _check_gradient(g, v)
        if sok_pairs and self._hp.refusal:
            raise ValueError(self._hp.refusal)
        global_step = kwargs.get("global_step")
        if global_step is not None and not hasattr(global_step, "assign_add"):
            raise TypeError(f"global_step must be a variable (tf.compat.v1.train."
                            f"get_or_create_global_step()) or None; got {global_step!r}")
        # A learning rate that is no real scalar is refused before anything
        # changes too (a schedule's, which the step gives, once it counts).
        lr = self._learning_rate(None) if sok_pairs else None
        ops = []
        # sok_graph's own rules (sok.SGD) update the other variables after
        # the tables, at the rate the tables' step gives (a schedule's too:
        # they have no step count of their own to call it with).
        own_rule = isinstance(self._optimizer, OwnRule)
        if others and not own_rule:
            ops.append(update_op(self._optimizer.apply_gradients(others, **kwargs)))
        if sok_pairs:
            for _, v in sok_pairs:
                self.create_slots(v)
            # In a graph the step counts only once the learning rate passed
            # its check (checked_rate), as the rows wait for it.
            counter = self._step_variable()
            counted = counter.read_value() if tf.executing_eagerly() else None
            with tf.control_dependencies(after_rate_check(lr)):
                if steps_before is None:
                    step = counter.assign_add(1)
                else:
                    step = counter.assign(tf.maximum(
                        counter.read_value(), tf.cast(steps_before, counter.dtype)) + 1)
            # In a graph the returned op runs the count itself: an update
            # whose formula takes no step (Adagrad, momentum) does not read
            # it, and the step stayed 0 (dumped as 0) on TF 1.15.
            ops.append(step)
            if lr is None:
                try:
                    lr = self._learning_rate(step)
                except (TypeError, ValueError):
                    if tf.executing_eagerly():
                        counter.assign(counted)
                    raise
            fusable = [self._fusable(v) for _, v in sok_pairs]
            fused = [pair for pair, f in zip(sok_pairs, fusable)
                     if f and not is_dynamic(pair[1])]
            for group in _by_device(fused):
                ops.append(self._apply_fused(group, step, lr))
            for (g, v), f in zip(sok_pairs, fusable):
                if f and is_dynamic(v):
                    ops.append(self._apply_dynamic_fused(g, v, step, lr))
                elif not f:
                    ops.append(self._apply_sparse(g, v, step, lr))
            if not others:
                # The wrapped optimizer's apply_gradients, which counts
                # global_step, did not run: a loop stopped by the step
                # (StopAtStepHook) never ended, and decays by it never came.
                ops.append(_count_global_step(global_step, ops))
        if others and own_rule:
            if not sok_pairs:  # the rate of the step the tables would take next
                lr = self._learning_rate(self._step_variable().read_value() + 1)
            with tf.control_dependencies(after_rate_check(lr)):
                ops.append(update_op(self._optimizer.apply_gradients(others, learning_rate=lr)))
            # (It counts no global_step of its own.)
            ops.append(_count_global_step(global_step, ops))
        if others and not sok_pairs and steps_before is None:
            # Every call is a step, as every apply_gradients is one to the
            # optimizer it wraps: a call whose tables got no gradient (a
            # step that trained only the dense layers) counted none, and
            # the tables' Adam bias correction and schedule lagged the
            # dense weights' by a step for good.
            with tf.control_dependencies([op for op in ops if op is not None]):
                ops.append(update_op(self._step_variable().assign_add(1)))
        if tf.executing_eagerly():
            return None
        return tf.group(*[op for op in ops if op is not None], name=name or "sok_apply")

    def _fusable(self, var):
        """Whether `var`'s update runs in a fused sparse-apply op: an
        algorithm the ops have (fused_apply.fused_algorithms()), sparse
        updates, and a float32 dynamic table, or a static float32 table (and
        slots) held as plain resource variables."""
        if self._update_all_rows or self._hp.kernel not in fused_apply.fused_algorithms():
            return False
        if tf.as_dtype(var.dtype).base_dtype != tf.float32:
            return False
        if is_dynamic(var):
            return True
        return compat.is_plain_resource_variable(var) and all(
            compat.is_plain_resource_variable(s) for s in self._slots_of(var).values())

    def _apply_fused(self, pairs, step, lr):
        """One SokSparseApply op for the tables of `pairs` (one device)."""
        # Plain loops: TF 1.x's AutoGraph, which converts this code inside a
        # tf.function, swaps the two loops of a nested list comprehension.
        tables = [var for _, var in pairs]
        indices, values, slots = [], [], []
        for grad, table in pairs:
            distinct, rows = _distinct_rows(grad)
            indices.append(distinct)
            values.append(rows)
            for name in self.slot_names():
                slots.append(self._slots_of(table)[name])
        op = fused_apply.sparse_apply(tables, slots, indices, values, self._hp, lr, step)
        return None if tf.executing_eagerly() else op

    def _apply_dynamic_fused(self, grad, var, step, lr):
        """One SokDynamicSparseApply op for dynamic table `var`."""
        keys, values = _distinct_rows(grad)
        slots = [self._slots_of(var)[name] for name in self.slot_names()]
        op = fused_apply.dynamic_sparse_apply(var, slots, keys, values, self._hp, lr, step)
        return None if tf.executing_eagerly() else op

    def _apply_sparse(self, grad, var, step, lr):
        unique, values = _distinct_rows(grad)
        if self._update_all_rows:
            unique, values = self._every_row(var, unique, values)
        slots = self._slots_of(var)
        dtype = values.dtype
        # Every write waits for the learning rate's check (checked_rate):
        # a slot's new rows (Adam's moments) do not depend on the rate.
        checked = after_rate_check(lr)
        lr = tf.cast(lr, dtype)
        if is_dynamic(var):
            # As the fused update: a row evicted since the lookup reads as 0
            # and is put back before the slots are read, so the keys that
            # evicts have left them (the table's shadows) first.
            rows, _ = var.find(unique)
            with tf.control_dependencies(checked):
                put_back = dynamic_ops.scatter(var.handle, unique, rows, "update")
            with tf.control_dependencies([put_back]):
                slot_rows = {n: dynamic_ops.find_or_insert(s.handle, unique, var.dimension)[0]
                             for n, s in slots.items()}
            new_rows, new_slots = self._hp.update(rows, values, slot_rows, lr, step)
            with tf.control_dependencies(checked):
                writes = [dynamic_ops.scatter(var.handle, unique, new_rows, "update")]
                writes += [dynamic_ops.scatter(slots[n].handle, unique, r, "update")
                           for n, r in new_slots.items()]
        else:
            rows = tf.gather(var, unique)
            slot_rows = {n: tf.gather(s, unique) for n, s in slots.items()}
            new_rows, new_slots = self._hp.update(rows, values, slot_rows, lr, step)
            with tf.control_dependencies(checked):
                writes = [var.scatter_update(tf.IndexedSlices(new_rows, unique))]
                writes += [slots[n].scatter_update(tf.IndexedSlices(r, unique))
                           for n, r in new_slots.items()]
        if tf.executing_eagerly():
            return None
        return tf.group(*writes)


    @staticmethod
    def _every_row(var, unique, values):
        """(all row ids, gradient rows) with zero rows for ids not in `unique`."""
        if is_dynamic(var):
            # The batch's keys are in the table already (the lookup inserted
            # them); the others get a zero gradient.
            keys = dynamic_ops.export(var.handle, var.key_type, var.dimension, offset=0,
                                      limit=(1 << 62))[0]
            keys = tf.cast(keys, unique.dtype)
            others = tf.raw_ops.ListDiff(x=keys, y=unique, out_idx=tf.int32)[0]
            zeros = tf.zeros(tf.stack([tf.size(others), tf.shape(values)[1]]), values.dtype)
            return tf.concat([unique, others], 0), tf.concat([values, zeros], 0)
        rows = tf.shape(var, out_type=tf.int64)[0]
        dense = tf.scatter_nd(tf.expand_dims(unique, 1), values,
                              tf.stack([rows, tf.shape(values, out_type=tf.int64)[1]]))
        return tf.range(rows), dense


def _distinct_rows(grad):
    """(distinct row indices, their gradient rows) of a table's gradient:
    repeated indices would be applied as separate updates of one row, so
    their rows are summed first. Indices distinct by construction (the fused
    lookup's gradient, also through a dynamic table's keys: see
    util_ops.distinct_by_construction) are taken as they are; a dense
    gradient of a static table covers every row."""
    if not isinstance(grad, tf.IndexedSlices):
        values = tf.convert_to_tensor(grad)
        return tf.range(tf.shape(values, out_type=tf.int64)[0]), values
    if util_ops.distinct_by_construction(grad.indices):
        return grad.indices, grad.values
    unique, position = util_ops.unique(grad.indices, out_idx=tf.int64)
    return unique, util_ops.sum_by_position(grad.values, position,
                                            tf.size(unique, out_type=tf.int64))


def update_op(result):
    """What a wrapped optimizer's apply_gradients returned, if tf.group can
    group it with other updates (an op, a tensor, a tf.Variable such as
    Keras 2's incremented step), else None: Keras 3 returns its step
    counter, a Keras variable, which tf.group refuses; it runs eagerly or in
    a tf.function, where its updates run in program order all the same."""
    return result if isinstance(result, (tf.Operation, tf.Tensor, tf.Variable)) else None


def _count_global_step(global_step, updates):
    """global_step (tf.compat.v1.train's argument: a variable counted once
    per apply_gradients, after the variables' updates) incremented after
    `updates`; None where there is none to count."""
    if global_step is None:
        return None
    if tf.executing_eagerly():
        global_step.assign_add(1)
        return None
    with tf.control_dependencies([u for u in updates if u is not None]):
        return update_op(global_step.assign_add(1))


# The refusal of an apply_gradients whose every gradient is None, as
# TensorFlow's and Keras' optimizers refuse it.
_NO_GRADIENTS = (
    "No gradients provided for any variable: {}. The loss does not depend on them (a "
    "lookup made outside the GradientTape, or cut off by tf.stop_gradient?); nothing was "
    "updated")


def refuse_gradients_lost_in_loops(grads_and_vars):
    """Raises for a dynamic table whose gradient lacks what a tf.while_loop
    that read it contributed (DynamicVariable.refuse_a_gradient_lost_in_a_loop):
    None, passed over as a variable the loss does not depend on, it never
    trained; the gradient of its reads outside the loop, it trained on
    those alone."""
    for g, v in grads_and_vars:
        if isinstance(v, replica_shards.ReplicaShards):
            v = v.shard("apply_gradients")  # the shard this replica reads
        if is_dynamic(v):
            v.refuse_a_gradient_lost_in_a_loop(partly=g is not None)


def _by_device(pairs):
    """`pairs` grouped by their variable's device, in first-seen order."""
    groups = {}
    for g, v in pairs:
        groups.setdefault(v.device, []).append((g, v))
    return list(groups.values())


def _pairs(grads_and_vars):
    """grads_and_vars as a list of (gradient, variable), or a TypeError
    naming the first item that is not such a pair."""
    pairs = []
    for i, pair in enumerate(grads_and_vars):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"grads_and_vars must hold (gradient, variable) pairs; item {i} is "
                            f"{type(pair).__name__}" + (f" of length {len(pair)}" if isinstance(
                                pair, (tuple, list)) else ""))
        g, v = pair
        if not is_sok_variable(v) and not hasattr(v, "assign_sub"):
            raise TypeError(f"grads_and_vars[{i}] pairs a gradient with a "
                            f"{type(v).__name__}, which is not a variable")
        pairs.append((g, v))
    return pairs


def _check_gradient(grad, var):
    """Raises TypeError / ValueError unless `grad` can update sok variable
    `var`: IndexedSlices of rows [n, dim] of the variable's dtype with n
    integer indices (keys of the table's key type for a DynamicVariable), or
    for a static table a dense gradient of its shape. TensorFlow would
    otherwise broadcast a row of the wrong width into the update, or fail
    inside the update with a message naming no argument."""
    name = getattr(var, "name", type(var).__name__)
    dynamic = is_dynamic(var)
    dim = dimension_of(var)  # an int or None, on TF 1.x too
    if isinstance(grad, tf.IndexedSlices):
        values, indices = grad.values, grad.indices
        if not indices.dtype.is_integer:
            raise TypeError(f"the gradient of {name} has indices of dtype {indices.dtype.name}; "
                            f"they must be integers")
        if dynamic:
            var._check_keys(indices)  # TypeError naming the table's key type
            # A static table's gradient carries its dense_shape and row
            # numbers; as keys they would insert rows 0, 1, ... silently.
            if grad.dense_shape is not None:
                raise ValueError(
                    f"the gradient of DynamicVariable {name} is addressed by key (an "
                    f"IndexedSlices without dense_shape, as the table's lookups give); this "
                    f"one has dense_shape {grad.dense_shape}, as a static table's gradient of "
                    f"row numbers has: pair each gradient with the table it came from")
        if indices.shape.rank not in (None, 1):
            raise ValueError(f"the gradient of {name} must have a vector of indices; got shape "
                             f"{indices.shape}")
    else:
        if dynamic:
            raise TypeError(f"the gradient of DynamicVariable {name} must be tf.IndexedSlices "
                            f"(keys and rows); got {type(grad).__name__}")
        values, indices = tf.convert_to_tensor(grad), None
    if values.dtype != var.dtype:
        raise TypeError(f"the gradient of {name} must be {var.dtype.name}; got "
                        f"{values.dtype.name}")
    if indices is None:
        if not values.shape.is_compatible_with(var.shape):
            raise ValueError(f"the dense gradient of {name} must have the variable's shape "
                             f"{var.shape}; got {values.shape}")
        return
    n = indices.shape.as_list()[0] if indices.shape.rank == 1 else None
    shape = values.shape.as_list() if values.shape.rank is not None else None
    if shape is not None and (
            len(shape) != 2 or shape[1] not in (None, dim)
            or None not in (n, shape[0]) and shape[0] != n):
        raise ValueError(f"the gradient of {name} must have rows of shape [len(indices), {dim}] "
                         f"(indices has shape {indices.shape}); got {values.shape}")
    if not dynamic and tf.executing_eagerly() and n:
        rows = tf.compat.dimension_value(var.shape[0])
        bad = tf.logical_or(indices < 0, indices >= rows).numpy()
        if bad.any():
            first = int(bad.argmax())
            raise ValueError(f"the gradient indices of {name} must be in [0, {rows}) (the "
                             f"variable's rows); got {int(indices[first])} at position {first}")


# Every live OptimizerWrapper (explicit ones and native optimizers' own):
# a Keras 3 weights file saves a table's slots from the one that holds them.
_every_wrapper = weakref.WeakSet()


def wrappers_with_slots(table):
    """The OptimizerWrappers (explicit, or a native optimizer's under
    sok.OptimizerScope) still in use that hold slots for `table`, or for a
    shard of it (a table sharded over replicas has its slots per shard).
    An optimizer dropped by its user goes with its wrapper (_NativeWrapper
    holds it weakly), so it counts no longer."""
    parts = [table] + [s for s in replica_shards.shards_of(table) if s is not table]
    return [w for w in list(_every_wrapper) if any(w.has_slots(part) for part in parts)]


# The attribute of a table that holds the optimizer state a Keras 3
# weights file gave it before any optimizer had slots for it: a callable
# that create_slots hands the first wrapper making them.
PENDING_OPTIMIZER_STATE = "_sok_pending_optimizer_state"


# The attribute of a native optimizer that holds the OptimizerWrapper
# keeping its slots for sok variables (sok.OptimizerScope). On the
# optimizer, so that the two go together: a module-level weak dictionary
# of them, whose values hold their keys, kept every optimizer ever used
# under the scope alive, with its slot tables.
_NATIVE_WRAPPER = "_sok_native_wrapper"


def wrapper_for(optimizer):
    """The OptimizerWrapper that applies `optimizer` to sok variables: the
    object itself when it is one, else one kept per native optimizer."""
    if isinstance(optimizer, OptimizerWrapper):
        return optimizer
    wrapper = getattr(optimizer, _NATIVE_WRAPPER, None)
    if wrapper is None:
        wrapper = _NativeWrapper(optimizer)
        # Past the optimizer's own __setattr__: Keras and TensorFlow would
        # track it as a checkpoint dependency under this name as well.
        object.__setattr__(optimizer, _NATIVE_WRAPPER, wrapper)
        _list_sok_state_in_variables(optimizer, wrapper)
        if hasattr(optimizer, "_track_trackable"):
            # tf.train.Checkpoint(optimizer=optimizer) holds the sok state;
            # one restored before this wrapper existed restores it now.
            with tf.init_scope():
                optimizer._track_trackable(wrapper, name=NATIVE_STATE_DEPENDENCY)
    return wrapper


def _list_sok_state_in_variables(optimizer, wrapper):
    """Makes `optimizer.variables()` (a method of tf.compat.v1.train's and
    Keras 2's OptimizerV2 optimizers) list, after the optimizer's own
    variables, the slots and step counter it keeps for sok tables through
    `wrapper` (sok.OptimizerScope), those of the default graph, in graph
    mode only, as it lists the slots of a plain variable. TF1 scripts initialize
    an optimizer with tf.compat.v1.variables_initializer(opt.variables())
    (after restoring only the model's variables, say): the sok tables'
    slots were left out, and the next step failed with "Attempting to use
    uninitialized value <table>/accumulator". Only this optimizer object
    changes (an attribute of its own), and it holds no reference to itself
    through it. Eagerly (TF2, where no initializer runs) the list stays the
    optimizer's own: scripts broadcast it to every worker
    (hvd.broadcast_variables(opt.variables())), and each worker's table
    slots hold rows of its own. Where `variables` is a property (Keras 3,
    Keras 2's newer optimizers: TF2 only) nothing changes."""
    method = getattr(type(optimizer), "variables", None)
    if not callable(method) or isinstance(method, property) or \
            "variables" in getattr(optimizer, "__dict__", {}):
        return
    optimizer_ref, wrapper_ref = weakref.ref(optimizer), weakref.ref(wrapper)

    def variables():
        own = list(method(optimizer_ref()))
        state = wrapper_ref()
        if state is None or tf.executing_eagerly():
            return own
        graph = tf.compat.v1.get_default_graph()
        extra = [v for v in list(state._steps.values()) + list(state._slot_vars)
                 if getattr(v, "graph", None) is graph]
        return own + [v for v in extra if not any(v is o for o in own)]

    variables.__doc__ = getattr(method, "__doc__", None)
    object.__setattr__(optimizer, "variables", variables)


# The name of a native optimizer's wrapper among its checkpoint children.
NATIVE_STATE_DEPENDENCY = "sok_optimizer_state"


class _NativeWrapper(OptimizerWrapper):
    """A native optimizer's own wrapper (wrapper_for): its slots for dump and
    load, its updates of sok rows under OptimizerScope. An option the row
    updates would ignore is refused only when it updates sok rows: the
    native optimizer may train sok variables itself, every option applied."""

    refuses_when_made = False

    # The optimizer holds this wrapper (wrapper_for): held back by a weak
    # reference, the two go as soon as the user drops the optimizer (a
    # cycle waited for a full garbage collection, and a dropped optimizer's
    # wrapper still counted as the one holding a table's slots, which a
    # Keras weights file keeps).
    @property
    def _optimizer(self):
        return self._optimizer_ref()

    @_optimizer.setter
    def _optimizer(self, optimizer):
        self._optimizer_ref = weakref.ref(optimizer)


class OwnRule:
    """Base of the hyperparameter holders behind sok_graph's own optimizers
    (sok.SGD, sok.optimizers.Adam, ...): what OptimizerWrapper reads where it
    would read a native optimizer's attributes. `tf1_formulas` selects the
    tf.compat.v1.train variant of the algorithm's formulas."""

    tf1_formulas = False
    # The entry of optimization/algorithms.py's table this rule selects.
    sok_algorithm = None

    def apply_gradients(self, grads_and_vars, **kwargs):
        names = [getattr(v, "name", repr(v)) for _, v in grads_and_vars]
        raise TypeError(f"{type(self).__name__[1:]} updates sok embedding variables only; "
                        f"use a Keras or tf.compat.v1.train optimizer for {names}")


class _PlainSGD(OwnRule):
    """The optimizer behind sok.SGD: w -= lr * g, for any variable."""

    sok_algorithm = "sgd"

    def __init__(self, learning_rate):
        self.learning_rate = learning_rate

    def apply_gradients(self, grads_and_vars, learning_rate=None, **kwargs):
        """learning_rate: the checked rate of this step (OptimizerWrapper
        gives it; its own, a schedule's included, is read with the step)."""
        ops = []
        rate = (checked_rate("SGD", value(self.learning_rate)) if learning_rate is None
                else learning_rate)
        for g, v in grads_and_vars:
            lr = tf.cast(rate, v.dtype)
            if isinstance(g, tf.IndexedSlices):
                ops.append(v.scatter_sub(tf.IndexedSlices(lr * g.values, g.indices)))
            else:
                ops.append(v.assign_sub(lr * g))
        return None if tf.executing_eagerly() else tf.group(*ops)


def check_learning_rate(optimizer, lr):
    """A sok optimizer's learning_rate: a finite number >= 0, a tensor, a
    variable, a callable or a schedule (NaN and infinities made every
    updated row NaN or infinite; a str failed at the first update, in a
    Cast). A tensor or variable must be a scalar of a real dtype, and an
    eager tensor's value a finite number >= 0 as well (check_scalar_rate).
    A value known only later (a variable's, a placeholder's) is checked at
    each update (checked_rate). `optimizer` names it in the error."""
    if isinstance(lr, (bool, np.bool_)) or not (
            isinstance(lr, (int, float, np.number)) or callable(lr)
            or isinstance(lr, (tf.Tensor, tf.Variable))):
        raise TypeError(f"{optimizer}: learning_rate must be a number, a tensor, a variable or "
                        f"a schedule; got {lr!r}")
    if isinstance(lr, (int, float, np.number)) and not (np.isfinite(lr) and lr >= 0):
        raise ValueError(f"{optimizer}: learning_rate must be a finite number >= 0; got {lr!r}")
    if isinstance(lr, (tf.Tensor, tf.Variable)):
        check_scalar_rate(optimizer, lr)
        # An eager tensor's value is fixed (a variable's may change later).
        if isinstance(lr, tf.Tensor) and hasattr(lr, "numpy"):
            number = float(lr.numpy())
            if not (np.isfinite(number) and number >= 0):
                raise ValueError(f"{optimizer}: learning_rate must be a finite number >= 0; "
                                 f"got a tensor holding {number!r}")


def check_scalar_rate(optimizer, lr):
    """TypeError / ValueError naming `optimizer` unless the learning rate
    `lr` (a number, or a tensor or variable, as the optimizer, its callable
    or its schedule gives it) is a scalar of a real dtype: a vector was
    broadcast over the rows' columns (each column its own rate) or failed
    inside the fused update, stacking the hyperparameters; a str failed in
    a Cast. Only what is known when the update is built is checked."""
    if isinstance(lr, (int, float, np.number)) and not isinstance(lr, (bool, np.bool_)):
        return
    dtype, shape = getattr(lr, "dtype", None), getattr(lr, "shape", None)
    try:
        dtype, shape = tf.as_dtype(dtype).base_dtype, tf.TensorShape(shape)
    except (TypeError, ValueError):
        raise TypeError(f"{optimizer}: learning_rate must be a number, a tensor or a variable "
                        f"(or a callable or schedule giving one); got {lr!r}") from None
    if dtype.is_bool or not (dtype.is_floating or dtype.is_integer):
        raise TypeError(f"{optimizer}: learning_rate must be a real number; got a "
                        f"{dtype.name} {type(lr).__name__}")
    if shape.rank not in (None, 0):
        raise ValueError(f"{optimizer}: learning_rate must be a scalar; got a "
                         f"{type(lr).__name__} of shape {shape.as_list()}")


def checked_rate(optimizer, lr):
    """The learning rate `lr` (check_scalar_rate's) that an update uses,
    refused where it is NaN, infinite or negative: such a rate made every
    updated row NaN or moved rows up the gradient. A number passes as it
    is (the optimizers refuse bad ones when they are made). A value known
    now (eagerly: a tensor's or a variable's, Keras 3's variable included;
    in a graph: a constant) is checked now, a ValueError naming `optimizer`
    and learning_rate. A graph's tensor or variable (a placeholder, a
    variable assigned later, a schedule's result) is known only when the
    graph runs: `lr` then comes back read after an assertion, so whatever
    uses it waits for the check, which fails with an InvalidArgumentError
    naming `optimizer` and learning_rate."""
    if isinstance(lr, (int, float, np.number)):
        return lr
    number = known_number(lr)
    if number is None and isinstance(lr, tf.Tensor):
        constant = tf.get_static_value(lr)
        number = None if constant is None else float(constant)
    if number is not None:
        if not (np.isfinite(number) and number >= 0):
            raise ValueError(f"{optimizer}: learning_rate must be a finite number >= 0; got "
                             f"{number!r}")
        return lr
    if tf.executing_eagerly():
        return lr  # what known_number cannot read (check_scalar_rate took it)
    rate = tf.convert_to_tensor(lr)
    wide = tf.cast(rate, tf.float64)
    check = tf.debugging.Assert(
        tf.logical_and(tf.math.is_finite(wide), wide >= 0),
        [f"{optimizer}: learning_rate must be a finite number >= 0; when the update ran it "
         f"was", rate], name="learning_rate_check")
    with tf.control_dependencies([check]):
        return tf.identity(rate)


def after_rate_check(lr):
    """The control dependencies that make a write wait for the learning
    rate's run-time check: [lr] where checked_rate gave a graph tensor
    (read after its Assert), else none (a number, or eagerly)."""
    return [lr] if isinstance(lr, tf.Tensor) and not tf.executing_eagerly() else []


class SGD(OptimizerWrapper):
    """``SGD(lr)``: plain sparse SGD for sok variables (and any other variable)."""

    def __init__(self, lr=0.01, learning_rate=None):
        lr = learning_rate if learning_rate is not None else lr
        check_learning_rate("sok.SGD", lr)
        super().__init__(_PlainSGD(lr))


# What mixed precision loss scales do to a dynamic table's gradient (compat).
compat.check_sparse_gradients_finite_as_tf2()
