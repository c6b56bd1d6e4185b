"""The SOK 1.x optimizer API: `sok.optimizers.Adam`, `sok.optimizers.LazyAdam`
(`LazyAdamOptimizer`), `sok.OptimizerScope` and
`sok.split_embedding_variable_from_others`, all on the engine in
sok_graph/optimization/ (OptimizerWrapper: per-row updates and slots of sok
variables).

Adam vs LazyAdam: `Adam` computes what TensorFlow's Adam computes for a
sparse gradient — every row's moments decay each step and every row with a
moment moves — after summing the gradient rows of repeated keys. `LazyAdam`
touches only the rows in the batch (moments of other rows stay as they are),
which is what large embedding tables usually want.

OptimizerScope: inside ``with sok.OptimizerScope(embedding_variables):`` a
native optimizer's ``apply_gradients`` (tf.compat.v1.train, Keras 2 or Keras
3) hands the pairs whose variable is a sok variable to an OptimizerWrapper
kept for that optimizer (its slots, its step count, the native optimizer's
hyperparameters) and only the rest to the native code. Sok variables are
updated lazily: only the rows in the gradient change. Outside the scope, and
for every other variable, the native optimizer behaves exactly as without
sok_graph; nothing is rebound after the scope exits.
"""

import functools
import inspect
import math
import threading

import numpy as np
import tensorflow as tf

from sok_graph import compat
from sok_graph.tables import is_dynamic, on_register
from sok_graph.tables.dynamic import NoDenseValueError
from sok_graph.tables.static import is_sok_variable
from sok_graph.variables import split_variables
from sok_graph.optimization.wrapper import (OptimizerWrapper, OwnRule, check_learning_rate,
                                            one_replica_in_this_process,
                                            refuse_gradients_lost_in_loops,
                                            update_op, wrapper_for)


def _float(optimizer, name, value):
    """A hyperparameter given as a number (or an eager scalar tensor) as a
    float, or a TypeError naming it: float() of a str or None raised
    "could not convert string to float", naming nothing."""
    if not isinstance(value, (bool, np.bool_)):
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
    raise TypeError(f"{optimizer}: {name} must be a number; got {value!r}")


class _AdamRule(OwnRule):
    """Adam's hyperparameters, as Keras names them."""

    sok_algorithm = "adam"

    def __init__(self, learning_rate, beta_1, beta_2, epsilon):
        self.learning_rate = learning_rate
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.amsgrad = False


class Adam(OptimizerWrapper):
    """``Adam(learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7)``:
    TensorFlow's Adam for sok variables (gradient rows of repeated keys are
    summed first; all rows' moments decay every step)."""

    _lazy = False

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7, **kwargs):
        # Keras spells the learning rate `lr` in old scripts.
        if "lr" in kwargs:
            learning_rate = kwargs.pop("lr")
        kwargs.pop("name", None)
        if kwargs:
            raise TypeError(f"{type(self).__name__} got unexpected arguments {sorted(kwargs)}")
        check_learning_rate(type(self).__name__, learning_rate)
        for name, value in (("beta_1", beta_1), ("beta_2", beta_2)):
            if not 0.0 <= _float(type(self).__name__, name, value) < 1.0:
                raise ValueError(f"{name} must be in [0, 1); got {value!r}")
        # A NaN epsilon passed `<= 0` and made every updated row NaN.
        eps = _float(type(self).__name__, "epsilon", epsilon)
        if not (math.isfinite(eps) and eps > 0.0):
            raise ValueError(f"epsilon must be a finite number > 0; got {epsilon!r}")
        super().__init__(_AdamRule(learning_rate, beta_1, beta_2, epsilon),
                         update_all_rows=not self._lazy)

    def apply_gradients(self, grads_and_vars, name=None, global_step=None, **kwargs):
        # experimental_aggregate_gradients (and similar Keras arguments) have
        # nothing to do for sok variables; global_step (tf.compat.v1.train's)
        # is counted once the rows are updated.
        return super().apply_gradients(grads_and_vars, name=name, global_step=global_step)

    def minimize(self, loss, var_list, grad_loss=None, name=None, tape=None):
        """Keras' minimize: the gradients of `loss` (a callable, or a tensor
        with the `tape` that recorded it; in a graph, a tensor alone) for
        `var_list` (a list, or a callable giving it), then apply_gradients.
        SOK's optimizers are Keras optimizers and have it; it was missing."""
        return self.apply_gradients(
            _gradients_of(type(self).__name__, loss, var_list, grad_loss, tape), name=name)


class LazyAdam(Adam):
    """``LazyAdam(learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7)``:
    Adam that updates only the rows (and moments) of the keys in the batch."""

    _lazy = True


class LazyAdamOptimizer(LazyAdam):
    """LazyAdam with the tf.compat.v1.train argument names and defaults:
    ``LazyAdamOptimizer(learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8)``."""

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 use_locking=False, name="LazyAdam"):
        super().__init__(learning_rate, beta1, beta2, epsilon)

    def minimize(self, loss, global_step=None, var_list=None, gate_gradients=1,
                 aggregation_method=None, colocate_gradients_with_ops=False, name=None,
                 grad_loss=None):
        """tf.compat.v1.train.Optimizer's minimize: the gradients of `loss`
        (a tensor in a graph, a callable eagerly) for `var_list` (default:
        the trainable variables), then apply_gradients, which counts
        `global_step`."""
        return self.apply_gradients(
            _gradients_of(type(self).__name__, loss, var_list, grad_loss, None),
            name=name, global_step=global_step)


def _gradients_of(who, loss, var_list, grad_loss, tape):
    """(gradient, variable) pairs of `loss` for `var_list`, as Keras'
    minimize computes them (a tensor loss in a graph: tf.gradients).
    var_list None (tf.compat.v1's default): the graph's trainable
    variables; eagerly, those the callable loss read, in the same run of it
    (a second run would read, and a counting filter count, its keys
    again)."""
    if var_list is None and not tf.executing_eagerly():
        var_list = (tf.compat.v1.trainable_variables() + tf.compat.v1.get_collection(
            tf.compat.v1.GraphKeys.TRAINABLE_RESOURCE_VARIABLES))
    if callable(loss):
        tape = tape if tape is not None else tf.GradientTape()
        with tape:
            if var_list is not None and not callable(var_list):
                tape.watch(var_list)
            loss = loss()
        if var_list is None:
            var_list = tape.watched_variables()
    elif var_list is None:
        raise ValueError(f"{who}.minimize: eagerly, loss must be a callable (a tensor has no "
                         f"record of the variables it was computed from)")
    if callable(var_list):
        var_list = var_list()
    var_list = list(var_list)
    if tape is not None:
        grads = tape.gradient(loss, var_list, grad_loss)
    elif not tf.executing_eagerly():
        grads = tf.gradients(loss, var_list, grad_ys=grad_loss)
    else:
        raise ValueError(f"{who}.minimize: a tensor loss needs the `tape` that recorded it "
                         f"(or give loss as a callable)")
    return list(zip(grads, var_list))


def split_embedding_variable_from_others(variables):
    """(embedding_variables, other_variables): the sok variables among
    `variables` and the rest, as tuples, in their order, each once."""
    if not isinstance(variables, (list, tuple)):
        raise TypeError(f"variables must be a list or tuple of variables; got "
                        f"{type(variables).__name__}")
    embedding, others = split_variables(variables, "sok.split_embedding_variable_from_others",
                                        "variables")
    return tuple(embedding), tuple(others)


# ------------------------------------------------------------ OptimizerScope

_state = threading.local()      # .depth: OptimizerScopes open in this thread
_patch_lock = threading.Lock()
_patched = {}                   # (class, method name) -> its own method
_open_scopes = 0                # over all threads


def _scope_active():
    """Whether an OptimizerScope covers this thread's optimizer calls: one
    opened in this thread, or, in a MirroredStrategy replica's thread, one
    open in any thread. MirroredStrategy runs each replica of
    `strategy.run` (and so of Keras' `Model.fit`) in a thread of its own
    while the calling thread, which opened the scope, waits for them; a
    replica thread does not name the thread that started it, so any open
    scope counts there."""
    if getattr(_state, "depth", 0) > 0:
        return True
    return _open_scopes > 0 and _in_mirrored_replica_thread()


def _in_mirrored_replica_thread():
    # The class moved from mirrored_strategy (TF 1.15) to mirrored_run (TF 2.2+).
    # The name is compared, not imported, so that a TensorFlow without either
    # module simply has no replica threads.
    cls = type(threading.current_thread())
    return cls.__name__ == "_MirroredReplicaThread" and cls.__module__.startswith(
        ("tensorflow.python.distribute.", "tensorflow_core.python.distribute."))


def _optimizer_methods():
    """(class, method name) of the methods that apply gradients, as the
    classes defining them for every native optimizer have them:
    apply_gradients, and Keras 3's apply(grads, trainable_variables), what
    its custom training loops call (it used to go past the scope: Keras
    made slots of its own for a static table and updated every row of it,
    and a dynamic table was refused as if outside the scope); and the build
    of Keras 2's LossScaleOptimizerV3 (_routing_build)."""
    owners = []
    for base in (tf.compat.v1.train.Optimizer,) + compat.keras_optimizer_classes():
        names = ("apply_gradients",)
        if compat.KERAS_MAJOR_VERSION >= 3 and base is not tf.compat.v1.train.Optimizer:
            names += ("apply",)
        for name in names:
            for cls in base.__mro__:
                if name in cls.__dict__:
                    if (cls, name) not in owners:
                        owners.append((cls, name))
                    break
    owners += [(cls, "build") for cls in compat.loss_scale_classes_building_every_variable()]
    # Keras builds an optimizer for model.trainable_variables itself where a
    # file's state is to be loaded into it (Keras 3's load_model and
    # BackupAndRestore, tf_keras' BackupAndRestore, Keras 2's HDF5
    # load_model), and those list sok tables: slots were made for them (or
    # a dynamic table failed with "Cannot convert a partially known
    # TensorShape"), the file's state no longer matched and Keras skipped it
    # with a warning. Each optimizer class of Keras 3 and of Keras 2's new
    # optimizers makes its slots in its own build: every class that has one
    # (Keras 2's OptimizerV2 has none).
    for cls in _keras_optimizer_classes():
        if "build" in cls.__dict__ and (cls, "build") not in owners:
            owners.append((cls, "build"))
    return owners


def _keras_optimizer_classes():
    """Every Keras optimizer class defined so far (tf.keras', and tf_keras'
    where a script imported it): the base classes (and the optimizer
    classes they derive from) and all their subclasses, a user's included."""
    found = []
    for base in compat.keras_optimizer_classes():
        todo = [base] + [c for c in base.__mro__[1:] if compat.is_optimizer_base_class(c)]
        while todo:
            cls = todo.pop()
            if cls not in found:
                found.append(cls)
                todo.extend(cls.__subclasses__())
    return found


def _global_step_of(params, args, kwargs):
    """The global_step of a call apply_gradients(self, grads_and_vars, *args,
    **kwargs) to a method with parameters `params` (tf.compat.v1.train's
    takes it second, by position or name; Keras' has none)."""
    if "global_step" in kwargs:
        return kwargs["global_step"]
    names = [n for n in params if n not in ("self", "grads_and_vars")]
    if args and names and names[0] == "global_step":
        return args[0]
    return None


def _op_name_of(optimizer, params, args, kwargs):
    """The name the op of a graph-mode apply_gradients call must have: the
    `name` given (by keyword, or by position to tf.compat.v1.train's
    apply_gradients(grads_and_vars, global_step, name)), else a
    tf.compat.v1.train optimizer's own name, as it names its op; None
    where neither names one (Keras)."""
    names = [n for n in params if n not in ("self", "grads_and_vars")]
    given = dict(zip(names, args))
    given.update(kwargs)
    if given.get("name"):
        return given["name"]
    return optimizer.get_name() if compat.is_tf1_optimizer(optimizer) else None


def _named_update(optimizer, result, name, native=None):
    """`result`, the whole update of a graph-mode apply_gradients (the sok
    tables', grouped with the `native` one of the other variables), as the
    op of `name` (see _op_name_of), and for a tf.compat.v1.train optimizer
    the graph's TRAIN_OP in place of the native one. The op of that name
    was the native update of the other variables alone, and the only one
    in TRAIN_OP: a train op run by name (sess.run("train"), a meta graph
    imported elsewhere, a tool reading TRAIN_OP) left the tables untrained
    without an error."""
    if name is None:
        return result
    result = tf.group(result, name=name)
    if compat.is_tf1_optimizer(optimizer):
        train_ops = tf.compat.v1.get_collection_ref(tf.compat.v1.GraphKeys.TRAIN_OP)
        if native is not None:
            train_ops[:] = [op for op in train_ops if op is not native]
        train_ops.append(result)
    return result


def _without_name(params, args, kwargs):
    """(args, kwargs) of an apply_gradients call without its `name`, by
    keyword or position."""
    names = [n for n in params if n not in ("self", "grads_and_vars")]
    if "name" in names and len(args) > names.index("name"):
        args = args[:names.index("name")] + args[names.index("name") + 1:]
    return args, {k: v for k, v in kwargs.items() if k != "name"}


def _native_kwargs(params, takes_any, kwargs):
    """`kwargs` of an apply_gradients call that the native method with
    parameters `params` takes (Keras 3 has no
    experimental_aggregate_gradients)."""
    return kwargs if takes_any else {k: v for k, v in kwargs.items() if k in params}


def _routing(original):
    """apply_gradients that sends sok variables to the optimizer's wrapper
    while an OptimizerScope is open in this thread."""
    params = inspect.signature(original).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())

    @functools.wraps(original)
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        if not _scope_active():
            return original(self, grads_and_vars, *args, **kwargs)
        pairs = list(grads_and_vars)
        sok_pairs = [(g, v) for g, v in pairs if is_sok_variable(v)]
        if not sok_pairs:
            return original(self, pairs, *args, **kwargs)
        refuse_gradients_lost_in_loops(sok_pairs)
        others = [(g, v) for g, v in pairs if not is_sok_variable(v)]
        if all(g is None for g, _ in sok_pairs) and any(g is not None for g, _ in others):
            # No sok table has a gradient: the native code updates the
            # others and passes the tables over, as it passes over any
            # variable without one (all gradients None: the wrapper refuses
            # it, as the native code would).
            return original(self, others, *args, **_native_kwargs(params, takes_any, kwargs))
        # With sok variables only, the native code (which counts a
        # tf.compat.v1 optimizer's global_step) does not run: the wrapper
        # counts it (minimize(loss, global_step=gs) left gs at 0, and a loop
        # stopped by the step never ended).
        counted = {} if others else {"global_step": _global_step_of(params, args, kwargs)}
        try:
            wrapper = wrapper_for(self)
        except (TypeError, ValueError) as e:
            # The wrapper's refusal named the optimizer, not what the scope
            # routed to it.
            tables = [getattr(v, "name", type(v).__name__) for _, v in sok_pairs]
            raise type(e)(f"sok.OptimizerScope routes the gradients of sok tables {tables} to "
                          f"{type(self).__name__}, which cannot update them: {e}") from None
        count = getattr(self, "iterations", None) if compat.is_keras_optimizer(self) else None
        if hasattr(count, "assign_add") and one_replica_in_this_process():
            # The tables' step goes on from the Keras count (see the
            # wrapper's steps_before), read before this step's native update
            # adds to it. Not with several replicas in this process: each
            # keeps a step counter of its own, and another replica's update
            # of the shared count may come before this one's read (on GPUs
            # the replicas' steps went 4, 5, 6 after two steps). Worker
            # processes (one replica each) read it: their tables' step lagged
            # the count after a step that trained the dense weights only.
            counted["steps_before"] = steps_before = tf.identity(count)
        result = wrapper.apply_gradients(sok_pairs, **counted)
        graph = not tf.executing_eagerly()
        name = _op_name_of(self, params, args, kwargs) if graph else None
        if not others and hasattr(count, "assign_add"):
            # A Keras optimizer counts its steps in `iterations` (what
            # callbacks, schedules and checkpoints read); it stayed 0.
            if tf.executing_eagerly():
                count.assign_add(1)
            else:
                with tf.control_dependencies([result]):
                    result = tf.group(result, count.assign_add(1))
        native = None
        if others:
            kwargs = _native_kwargs(params, takes_any, kwargs)
            if name is not None and "name" in params:
                # Its own name: `name` is the whole update's (_named_update).
                args, kwargs = _without_name(params, args, kwargs)
                kwargs["name"] = f"{name}_of_tf_variables"
            reads = [steps_before] if "steps_before" in counted and graph else []
            with tf.control_dependencies(reads):
                native = update_op(original(self, others, *args, **kwargs))
            if graph and native is not None:
                result = tf.group(result, native)
        return _named_update(self, result, name, native) if graph else result

    apply_gradients._sok_graph_routing = True
    return apply_gradients


def _routing_build(original):
    """build(var_list) of Keras 2's LossScaleOptimizerV3, and of every Keras 3
    or Keras 2 (new) optimizer, that leaves sok variables out while an
    OptimizerScope is open
    in this thread: it built the inner optimizer for them, full-size Adam
    slots for a static table (never used: the scope routes the table's
    update to the wrapper) and a ValueError ("Cannot convert a partially
    known TensorShape") for a dynamic one."""

    @functools.wraps(original)
    def build(self, var_list, *args, **kwargs):
        if _scope_active():
            var_list = [v for v in var_list if not is_sok_variable(v)]
        return original(self, var_list, *args, **kwargs)

    build._sok_graph_routing = True
    return build


def _routing_apply(original):
    """Keras 3's apply(grads, trainable_variables) that, while an
    OptimizerScope is open in this thread and sok variables are among the
    variables, goes through the scope's apply_gradients (which sends them
    to the optimizer's wrapper and the others to Keras)."""

    @functools.wraps(original)
    def apply(self, grads, trainable_variables=None):
        if not _scope_active() or trainable_variables is None:
            return original(self, grads, trainable_variables)
        variables = list(trainable_variables)
        if not any(is_sok_variable(v) for v in variables):
            return original(self, grads, variables)
        grads = list(grads)
        if len(grads) != len(variables):
            raise ValueError(f"{type(self).__name__}.apply got {len(grads)} gradients for "
                             f"{len(variables)} trainable_variables; they must pair up")
        self.apply_gradients(zip(grads, variables))
        return None

    apply._sok_graph_routing = True
    return apply


# ------------------------------------- dynamic tables given to Keras itself

def _refuse_dynamic_tables(optimizer, method, variables, way_out):
    for v in variables:
        if is_dynamic(v):
            raise NoDenseValueError(
                f"DynamicVariable {getattr(v, '_name', v.name)!r}: "
                f"{type(optimizer).__name__}.{method} cannot update a dynamic table itself (its "
                f"gradient holds rows by key, with no dense shape, which this optimizer needs): "
                f"{way_out}")


_OUTSIDE_SCOPE = ("call it inside `with sok.OptimizerScope(tables):`, or apply the tables' "
                  "gradients with sok.OptimizerWrapper(optimizer)")


def _refusing_outside_scope(original):
    """Keras 2's apply_gradients that, outside any OptimizerScope, refuses
    a DynamicVariable by name. Keras 2's optimizers with slots refused it
    when making them (NoDenseValueError); its SGD without momentum has none
    and failed deeper, naming neither the table nor the scope: OptimizerV2
    with "Trying to access a handle's resource using the wrong type ...
    TableResource", the newer optimizer with "Cannot convert a partially
    known TensorShape (None, 2) to a Tensor". Inside a scope the routing
    above takes the tables out before this runs."""

    @functools.wraps(original)
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        if _scope_active():
            return original(self, grads_and_vars, *args, **kwargs)
        pairs = list(grads_and_vars)
        _refuse_dynamic_tables(self, "apply_gradients", [v for _, v in pairs], _OUTSIDE_SCOPE)
        return original(self, pairs, *args, **kwargs)

    return apply_gradients


def _refusing_in_loss_scale(original):
    """Keras 3's LossScaleOptimizer.apply (what fit calls under a
    mixed_float16 policy) that refuses a DynamicVariable by name: its
    finite check needs a dense shape of every gradient, and failed with
    "Tried to convert 'dims' to a tensor and failed. Error: None values not
    supported". Inside a scope, sok refuses a loss-scale optimizer too
    (optimization/algorithms.py says what to do instead)."""

    @functools.wraps(original)
    def apply(self, grads, trainable_variables=None):
        if trainable_variables is not None:
            trainable_variables = list(trainable_variables)
            _refuse_dynamic_tables(
                self, "apply", trainable_variables,
                "keep the tables' gradients out of it, divide them by its loss scale, and "
                "apply them with sok.OptimizerWrapper(optimizer.inner_optimizer) where they are "
                "all finite")
        return original(self, grads, trainable_variables)

    return apply


def _refusing_replicas_in_loss_scale(original):
    """Keras 2's LossScaleOptimizer.apply_gradients, refusing sok tables'
    gradients where the step has several replicas (a MirroredStrategy's, or
    a MultiWorkerMirroredStrategy's worker processes): it all-reduces every
    gradient before its inner optimizer (which the scope routes) sees them,
    a table's rows too, whose row numbers are each worker's own shard's.
    Each worker then updated its shard with the other's rows, without an
    error (in one process's replicas it failed in the all-reduce, asking
    for strategy.run inside strategy.run)."""

    @functools.wraps(original)
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        pairs = list(grads_and_vars)
        tables = [getattr(v, "name", repr(v)) for g, v in pairs
                  if g is not None and is_sok_variable(v)]
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        if tables and replicas > 1:
            raise TypeError(
                f"{type(self).__name__} over {replicas} replicas all-reduces every gradient "
                f"before sok.OptimizerScope sees them, the gradients of sok tables {tables[:5]} "
                f"too, whose rows are each worker's own shard's: keep the tables' gradients out "
                f"of it, divide them by its loss scale, and apply them with "
                f"sok.OptimizerWrapper(optimizer.inner_optimizer) where they are all finite")
        return original(self, pairs, *args, **kwargs)

    return apply_gradients


def _install_dynamic_table_refusals():
    """Once, at import: the Keras methods above, on the classes defining
    them. An OptimizerScope's routing wraps these while it is open, and
    puts them back after."""
    targets = []
    # tf_keras' optimizers (Keras 2 as a package) where a script imported it,
    # under Keras 3 too: their apply_gradients is Keras 2's.
    keras2_bases = list(compat.package_keras_optimizer_classes())
    if compat.KERAS_MAJOR_VERSION < 3:
        keras2_bases = list(compat.keras_optimizer_classes()) + keras2_bases
    if keras2_bases:
        for base in keras2_bases:
            owner = next((c for c in base.__mro__ if "apply_gradients" in c.__dict__), None)
            if owner is not None and (owner, "apply_gradients", _refusing_outside_scope) \
                    not in targets:
                targets.append((owner, "apply_gradients", _refusing_outside_scope))
        # Keras 2's LossScaleOptimizerV3 builds its inner optimizer for every
        # variable before that one's apply_gradients can refuse a table (it
        # failed with "Cannot convert a partially known TensorShape").
        for cls in compat.loss_scale_classes_building_every_variable():
            if "apply_gradients" in cls.__dict__:
                targets.append((cls, "apply_gradients", _refusing_outside_scope))
    if compat.KERAS_MAJOR_VERSION >= 3:
        try:
            from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer
        except ImportError:  # pragma: no cover - a Keras 3 without it
            LossScaleOptimizer = None
        if LossScaleOptimizer is not None and "apply" in LossScaleOptimizer.__dict__:
            targets.append((LossScaleOptimizer, "apply", _refusing_in_loss_scale))
    for cls, name, guard in targets:
        method = cls.__dict__[name]
        if not getattr(method, "_sok_graph_refusal", False):
            guarded = guard(method)
            guarded._sok_graph_refusal = True
            setattr(cls, name, guarded)


def _install_for_a_new_table(table):
    """The refusals again for each table made: a script may import tf_keras
    after sok_graph. Not while a scope has the methods routed (it puts back
    the methods it found when it closes); a class first seen then gets its
    refusal with the next table made outside a scope."""
    del table
    with _patch_lock:
        if _open_scopes == 0:
            _install_dynamic_table_refusals()


_install_dynamic_table_refusals()
on_register(_install_for_a_new_table)


class OptimizerScope:
    """``with OptimizerScope(embedding_variables): opt.apply_gradients(...)``:
    native optimizers update sok variables row by row, with slots of their own
    (see the module docstring)."""

    def __init__(self, embedding_variables):
        if isinstance(embedding_variables, (list, tuple)):
            variables = list(embedding_variables)
        else:
            variables = [embedding_variables]
        for i, v in enumerate(variables):
            if not is_sok_variable(v):
                raise TypeError(
                    f"OptimizerScope takes sok embedding variables; embedding_variables[{i}] is "
                    f"{getattr(v, 'name', type(v).__name__)!r} (use "
                    "sok.split_embedding_variable_from_others to pick them)")
        self._variables = variables

    def __enter__(self):
        global _open_scopes
        with _patch_lock:
            if _open_scopes == 0:
                for cls, name in _optimizer_methods():
                    original = cls.__dict__[name]
                    _patched[(cls, name)] = original
                    route = {"apply_gradients": _routing, "apply": _routing_apply,
                             "build": _routing_build}[name]
                    setattr(cls, name, route(original))
                for cls in compat.keras2_loss_scale_classes():
                    if (cls, "apply_gradients") not in _patched:
                        original = cls.__dict__["apply_gradients"]
                        _patched[(cls, "apply_gradients")] = original
                        setattr(cls, "apply_gradients", _refusing_replicas_in_loss_scale(original))
            _open_scopes += 1
        _state.depth = getattr(_state, "depth", 0) + 1
        return self

    def __exit__(self, *exc):
        global _open_scopes
        _state.depth -= 1
        with _patch_lock:
            _open_scopes -= 1
            if _open_scopes == 0:
                for (cls, name), original in _patched.items():
                    setattr(cls, name, original)
                _patched.clear()
        return False
