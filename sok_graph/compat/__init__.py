"""The TensorFlow-version layer (``sok_graph.compat``).

sok_graph supports TensorFlow 2.15 (Keras 2, ``tf.estimator``) and the newest
TensorFlow (Keras 3), and keeps graph-mode code on ``tf.compat.v1`` so that it
stays valid on TF 1.15. Every place that would otherwise test a version asks
this module instead; nothing else in the package compares version numbers.
"""

import importlib
import os
import re
import sys

import tensorflow as tf

from sok_graph.compat.keras import (  # noqa: F401  (re-exported)
    in_keras3_symbolic_build,
    KERAS_MAJOR_VERSION,
    is_keras_optimizer,
    is_keras_optimizer_v2,
    is_learning_rate_schedule,
    is_optimizer,
    is_optimizer_base_class,
    is_package_keras_optimizer,
    is_tf1_optimizer,
    keras2_loss_scale_classes,
    keras_optimizer_classes,
    loss_scale_classes_building_every_variable,
    package_keras_optimizer_classes,
    legacy_optimizers_module,
)


def _parse_version(text):
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts)


TF_VERSION_STRING = tf.__version__
TF_VERSION = _parse_version(TF_VERSION_STRING)
IS_TF1 = TF_VERSION[0] < 2

# The name TensorFlow saves a variable's value under in a checkpoint
# (trackable.VARIABLE_VALUE_KEY, the same in every version).
VARIABLE_VALUE_KEY = "VARIABLE_VALUE"

# SOK's `sok.tf_version`: TensorFlow's version as a list of ints. SOK splits
# the string at dots and fails on suffixes ("2.16.0rc0"); this keeps the
# digits of each of the three parts.
TF_VERSION_LIST = list(TF_VERSION)

# IndexedSlices moved from tensorflow.python.framework.ops (1.x) to
# tensorflow.python.framework.indexed_slices (2.5+); the public name is stable.
IndexedSlices = tf.IndexedSlices


def executing_eagerly():
    """True in TF2 eager code, False in graph mode and inside tf.function."""
    return tf.executing_eagerly()


def in_graph_mode():
    """True while building a graph: TF1-style sessions and tf.function tracing."""
    return not tf.executing_eagerly()


def inside_tf_function():
    """True while tracing a tf.function (a graph that is not a TF1 session graph)."""
    if tf.executing_eagerly():
        return False
    graph = tf.compat.v1.get_default_graph()
    return getattr(graph, "building_function", False)


def v1_graph_mode():
    """True in TF1-style graph mode (``disable_eager_execution`` or TF 1.x)."""
    return not tf.executing_eagerly() and not inside_tf_function()


def has_estimator():
    """Whether this TensorFlow ships ``tf.estimator`` (removed after 2.15)."""
    return estimator_module() is not None


def estimator_module():
    """``tf.estimator`` where it exists, else None."""
    try:
        return tf.estimator  # attribute access triggers the lazy import
    except (AttributeError, ImportError):
        return None


def v2_module():
    """``tf.compat.v2`` where this TensorFlow has it (1.15 does; older 1.x
    releases do not), else None."""
    return getattr(tf.compat, "v2", None)


def registered_op_def(name):
    """The OpDef registered for op type `name` (None if none is): TF 2.x
    looks one up by name, TF 1.15 lists them all."""
    from tensorflow.python.framework import op_def_registry

    by_name = getattr(op_def_registry, "get", None)  # TF 2.x
    if by_name is not None:
        return by_name(name)
    return op_def_registry.get_registered_ops().get(name)


def leave_out_of_meta_graphs(collection):
    """Exported meta graphs (a Saver's .meta, a TF1 SavedModel) hold graph
    collection `collection` empty. A collection of Python objects that are
    no graph node (the 1.x embedding layers and their tables) was written
    as a list of their names, and importing the file failed: "The name 'de'
    refers to an Operation not in the graph". A proto function that gives
    no proto for any entry leaves it empty, which an import skips."""
    from tensorflow.core.framework import variable_pb2
    from tensorflow.python.framework import ops

    ops.register_proto_function(collection, proto_type=variable_pb2.VariableDef,
                                to_proto=lambda value, export_scope=None: None,
                                from_proto=lambda proto, import_scope=None: None)


def register_gradient(op_type):
    """Decorator registering a gradient function for a custom op type."""
    return tf.RegisterGradient(op_type)


def legacy_keras_requested():
    """TF_USE_LEGACY_KERAS=1 selects Keras 2 (tf-keras) on TF >= 2.16."""
    return os.environ.get("TF_USE_LEGACY_KERAS", "0").lower() in ("1", "true", "yes")


def resource_variable_class():
    """The class behind TF2 ``tf.Variable`` objects, for subclassing."""
    from tensorflow.python.ops import resource_variable_ops

    return resource_variable_ops.ResourceVariable


def is_resource_variable(value):
    """True for resource variables (tf.Variable in TF2, use_resource=True in
    TF1, and tf.distribute's variables that act as one); false for TF1 ref
    variables and tensors."""
    from tensorflow.python.ops import resource_variable_ops

    return resource_variable_ops.is_resource_variable(value)


def is_plain_resource_variable(value):
    """True for a resource variable that owns its handle (tf.Variable,
    sok.Variable), whose handle kernels may read directly; false for
    wrappers that act as one (tf.distribute's and mixed precision's
    variables, which choose a component or cast on read)."""
    from tensorflow.python.ops import resource_variable_ops

    base = getattr(resource_variable_ops, "BaseResourceVariable",
                   resource_variable_ops.ResourceVariable)
    return isinstance(value, base)


def reference(obj):
    """A hashable reference to `obj` by identity, what tf.Variable.ref()
    returns."""
    from tensorflow.python.util import object_identity

    return object_identity.Reference(obj)


def record_variable_access(variable):
    """Records that `variable` was read, as reading a tf.Variable does: the
    active GradientTapes watch it, and a tf.function being traced lists it
    among the variables its graph reads. A tape that a traced function is
    called under later watches those (without that, a tf.function traced
    without a tape, as a warm-up or an evaluation call, or inside another
    tf.function, gave a None gradient for the table when called under a
    tape, and an optimizer passed the table over without an error)."""
    from tensorflow.python.eager import tape

    graph = tf.compat.v1.get_default_graph()
    if hasattr(graph, "watch_variable"):
        graph.watch_variable(variable)
    tape.variable_accessed(variable)


def in_v1_while_loop(op):
    """Whether graph op `op` sits inside a TF1 (control flow v1)
    tf.while_loop: a WhileContext, itself or around its cond context."""
    return _inside_v1_context(op, lambda flow: flow.IsWhileContext())


def in_v1_cond(op):
    """Whether graph op `op` sits inside a branch of a TF1 (control flow v1)
    tf.cond: a CondContext around it."""
    return _inside_v1_context(op, lambda flow: flow.IsCondContext())


def _inside_v1_context(op, is_kind):
    """Whether one of the TF1 control flow contexts around graph op `op`
    (its own, then each outer one) is of the kind `is_kind` tells."""
    if tf.executing_eagerly() or not hasattr(op, "graph"):
        return False  # a GradientTape's record of an op, whose context it refuses
    flow = op._get_control_flow_context()
    while flow is not None:
        if is_kind(flow):
            return True
        flow = flow.outer_context
    return False


def _v2_control_flow_class(module, name):
    """A class of TensorFlow's v2 control flow (private names, looked up
    where they exist: None elsewhere)."""
    try:
        return getattr(importlib.import_module("tensorflow.python.ops." + module), name, None)
    except ImportError:
        return None


def graphs_around_a_loop_body(graph):
    """The graphs that enclose the innermost tf.while_loop (v2: a
    tf.function's `for` over a tensor, tf.map_fn, tf.scan) whose body
    `graph` is or sits in, outermost last; [] outside any loop body. A
    gradient taken in one of them (a GradientTape around the loop) passes
    through the loop's own gradient, which gives a dynamic table none."""
    body_class = _v2_control_flow_class("control_flow_util_v2", "WhileBodyFuncGraph")
    around, in_body = [], False
    while graph is not None and body_class is not None:
        if in_body:
            around.append(graph)
        in_body = in_body or isinstance(graph, body_class)
        graph = getattr(graph, "outer_graph", None)
    return around


def building_a_cond_gradient():
    """Whether the graph being built is the gradient of a tf.cond branch (v2
    control flow: a tf.function's `if` on a tensor), which TensorFlow builds
    when a GradientTape around the cond takes a gradient through it."""
    if tf.executing_eagerly():
        return False
    grad_class = _v2_control_flow_class("cond_v2", "_CondGradFuncGraph")
    return grad_class is not None and isinstance(tf.compat.v1.get_default_graph(), grad_class)


def static_handle_shape(handle):
    """The fully known shape (a list of ints) that a graph's resource handle
    records for its variable, or None (eager handles, unknown shapes):
    lets a gradient give a table's dense_shape without a VariableShape op."""
    if not hasattr(handle, "graph") or tf.executing_eagerly():
        return None
    from tensorflow.python.ops.resource_variable_ops import get_resource_handle_data
    try:
        data = get_resource_handle_data(handle)
    except Exception:  # noqa: BLE001  (a handle without recorded data)
        return None
    if not data.is_set or not data.shape_and_type:
        return None
    shape = tf.TensorShape(data.shape_and_type[0].shape)
    return shape.as_list() if shape.is_fully_defined() else None


def eager_resource_deleter(handle):
    """An object that destroys the eager resource `handle` when collected (the
    mechanism tf.Variable uses)."""
    from tensorflow.python.ops import resource_variable_ops

    return resource_variable_ops.EagerResourceDeleter(handle, handle.device)


def saving_a_saved_model():
    """Whether tf.saved_model.save (or Keras' SavedModel save) is tracing
    the functions it writes: graphs that are saved, not run here. TF 1.x
    has no such context (False)."""
    if IS_TF1:
        return False
    from tensorflow.python.saved_model import save_context

    return save_context.in_save_context()


def anonymous_name():
    """A name unique in this process, for eager resources."""
    from tensorflow.python.eager import context

    if IS_TF1:
        # TF 1.x has no anonymous_name(); its eager shared_name() returns the
        # same reserved name, for which the runtime makes a unique resource.
        return context.shared_name()
    if not hasattr(context, "anonymous_name"):  # TF 2.x before 2.7, as 1.x
        return context.shared_name()
    return context.anonymous_name()


def graph_state(graph, name):
    """A dict that lives as long as `graph` and no longer: kept on the graph
    itself. Per-graph state held in a WeakKeyDictionary keyed by the graph
    kept the graph forever when the state held the graph's own ops or
    tensors (a value's strong references reach back to its key): every
    graph sok.Init or an exchange was built in stayed in memory."""
    attr = "_sok_graph_state_" + name
    state = getattr(graph, attr, None)
    if state is None:
        state = {}
        setattr(graph, attr, state)
    return state


def trackable_base_class():
    """The base of objects tf.train.Checkpoint and Saver can save
    (through _serialize_to_tensors / _restore_from_tensors): TensorFlow's
    Trackable where it has that API (2.11 on), else TensorFlow's older
    Trackable with the API on top (_tf1_trackable_class)."""
    if IS_TF1:
        return _tf1_trackable_class()
    trackable = _tf2_trackable_base().Trackable
    if hasattr(trackable, "_serialize_to_tensors"):
        return _tf211_trackable_class(trackable)
    return _tf1_trackable_class()


_TF211_TRACKABLE = []


def _tf211_trackable_class(trackable):
    """TensorFlow's Trackable (2.11 on) reading the checkpoints of the
    TensorFlows before it too (legacy_saveable_name_on_restore)."""
    if not _TF211_TRACKABLE:
        class Trackable(trackable):
            _LEGACY_SAVEABLE_NAME = legacy_saveable_name_on_restore()

        _TF211_TRACKABLE.append(Trackable)
    return _TF211_TRACKABLE[0]


class _LegacyNameOnRestore(object):
    """The `_LEGACY_SAVEABLE_NAME` of a class whose objects save through
    _serialize_to_tensors (TF 2.11 on), so that a tf.train.Checkpoint that
    TF 1.15 (or 2.6-2.10) wrote restores into them. Those TensorFlows file
    an object's tensors under one attribute, "VARIABLE_VALUE", as
    ".ATTRIBUTES/VARIABLE_VALUE-keys"; 2.11 on writes and reads one
    attribute per tensor, ".ATTRIBUTES/-keys", and such a restore failed
    whole ("Key .../-keys not found in checkpoint"). TensorFlow's restore
    reads the prefix of the tensors' names from this attribute
    (saveable_compat.get_saveable_name, meant for a class migrated from
    SaveableObjects, which then saves under the old names too). Here it
    answers "VARIABLE_VALUE" only to that restore, and only for an object
    the checkpoint files under that one attribute as a prefix of its
    tensors' names; everywhere else (saving, SavedModel tracing) None, so
    what is written stays 2.11's."""

    def __get__(self, obj, owner=None):
        position = _tensorflow_caller_local("_create_serialize_to_tensor_saveable",
                                            "restore.py", "self", within=3)
        attributes = getattr(getattr(position, "object_proto", None), "attributes", ())
        tensors = getattr(getattr(position, "_checkpoint", None), "dtype_map", None)
        legacy = _saveable_modules()[1].VARIABLE_VALUE_KEY
        # One attribute named so, whose key is no tensor of the file but the
        # prefix of its tensors' names: 2.11 on name an attribute so only
        # for a tensor of that name (a static table's whole rows,
        # ReplicaShards).
        if (len(attributes) == 1 and attributes[0].name == legacy and tensors is not None
                and attributes[0].checkpoint_key not in tensors):
            return legacy
        return None


def _tensorflow_caller_local(function, file_suffix, local, within):
    """Local `local` of the nearest of the `within` callers above the
    caller of this that is TensorFlow's `function` (in a file ending with
    `file_suffix`), or None. For hooks TensorFlow calls without the state
    they must judge by; where TensorFlow's code differs, nothing is
    found and the hook does what it did before."""
    frame = sys._getframe(2)
    try:
        for _ in range(within):
            if frame is None:
                return None
            code = frame.f_code
            if code.co_name == function and code.co_filename.endswith(file_suffix):
                return frame.f_locals.get(local)
            frame = frame.f_back
        return None
    finally:
        del frame


def legacy_saveable_name_on_restore():
    """What a class saved through _serialize_to_tensors sets its
    `_LEGACY_SAVEABLE_NAME` to (_LegacyNameOnRestore); TensorFlow before
    2.11 never asks for it."""
    return _LegacyNameOnRestore()


def _tf2_trackable_base():
    """TF 2.x's trackable base module: tensorflow.python.trackable (2.10 on),
    else tensorflow.python.training.tracking (2.6 to 2.9)."""
    try:
        from tensorflow.python.trackable import base as tf2_base  # tf2-only: called on 2.x only
    except ImportError:
        from tensorflow.python.training.tracking import base as tf2_base
    return tf2_base  # tf2-only: called on 2.x only (see the import above)


def native_object_class():
    """The marker base that lets TensorFlow's ops take an object as it is
    instead of converting it to a tensor (tf.nn.embedding_lookup passes such
    params to their sparse_read); `object` where TensorFlow has none. TF
    1.x's embedding_lookup keeps params that are `_TensorLike` as they are."""
    if IS_TF1:
        from tensorflow.python.framework import indexed_slices

        return getattr(indexed_slices, "_TensorLike", object)
    from tensorflow.python.types import internal

    return getattr(internal, "NativeObject", object)


def check_sparse_gradients_finite_as_tf2():
    """TF 1.x's mixed-precision loss scale (tf.compat.v1's
    MixedPrecisionLossScaleOptimizer, Keras' LossScaleOptimizer) checks
    that every gradient is finite by converting it to a dense tensor: a
    DynamicVariable's gradient (IndexedSlices of keys, which have no dense
    shape) failed with "Tensor conversion requested for IndexedSlices
    without dense_shape", naming no table. TF 2.x checks the IndexedSlices'
    values, which is the same answer for any gradient (the rows a dense
    tensor would add are zeros); TF 1.x is given that check."""
    if not tf.__version__.startswith("1."):
        return
    try:
        from tensorflow.python.training.experimental import loss_scale
    except ImportError:
        return
    if not callable(getattr(loss_scale, "_is_all_finite", None)):
        return

    def _is_all_finite(grads):
        values = [g.values if isinstance(g, tf.IndexedSlices) else g
                  for g in grads if g is not None]
        return tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in values])

    loss_scale._is_all_finite = _is_all_finite


def accept_resource_like_gradient_sources():
    """Lets GradientTape.gradient take, as a source, an object that acts as
    a resource variable (`_should_act_as_resource_variable`, e.g. a sok
    table sharded over a MirroredStrategy's replicas) and is not a tensor.
    TensorFlow 2.6 checks such a source's dtype by passing the object itself
    to tf.as_dtype, which fails; later releases accept it. Decided by
    trying that check once, not by version; a no-op where it passes."""
    if IS_TF1:
        return
    try:
        from tensorflow.python.eager import backprop_util
    except ImportError:
        return

    class _Probe:
        _should_act_as_resource_variable = True
        dtype = tf.float32

    check = backprop_util.IsTrainable
    try:
        check(_Probe())
        return
    except TypeError:
        pass

    def is_trainable(tensor_or_dtype):
        if getattr(tensor_or_dtype, "_should_act_as_resource_variable", False) and \
                isinstance(getattr(tensor_or_dtype, "dtype", None), tf.DType):
            return check(tensor_or_dtype.dtype)
        return check(tensor_or_dtype)

    backprop_util.IsTrainable = is_trainable


def leave_package_to_autograph_unconverted(package):
    """Makes AutoGraph call the functions and methods of `package` (a
    top-level package name) as written inside a tf.function, as it calls
    TensorFlow's and Keras' own: by a rule on the module name in its list of
    conversion rules, ahead of the others.

    sok_graph's Python is TensorFlow-op code that also runs in tf.compat.v1
    graphs, where nothing is converted; converting it again in every trace
    changed nothing but the time a first step took (AutoGraph parsed and
    rewrote about a hundred of the package's functions: 11.7 s against 1.0 s
    for a tf.function of one lookup and one optimizer step on CPU). Where
    TensorFlow moves the list, functions are converted as before: slower to
    trace, the same results."""
    try:
        from tensorflow.python.autograph.core import config as autograph_config
    except ImportError:
        return
    rules = getattr(autograph_config, "CONVERSION_RULES", None)
    rule_class = getattr(autograph_config, "DoNotConvert", None)
    if rules is None or rule_class is None:
        return
    if any(isinstance(r, rule_class) and r.matches(package) for r in rules):
        return
    autograph_config.CONVERSION_RULES = (rule_class(package),) + tuple(rules)


_PER_DEVICE_ORDER = {"registered": None, "graphs": None}
_REPLICA_SCOPE = re.compile(r"(?:^|/)(replica_\d+)/")


def order_side_effects_per_replica(graph):
    """In `graph` (a tf.function's graph), order the stateful ops that touch
    no resource per replica instead of all together; returns False where
    this TensorFlow cannot (no resource resolvers in its automatic control
    dependencies, e.g. TF 1.x, whose Session graphs have none anyway).

    Inside a tf.function TensorFlow chains every stateful op without a
    resource input (asserts, prints, sok's NCCL all-to-all) in the order it
    was built. A MirroredStrategy builds replica 0's ops, then replica 1's;
    where replica 0's all-to-all (or an assert after it) comes before
    replica 1's, replica 1's would wait for replica 0's, which waits for
    replica 1 in NCCL: the step never ends. Registering each such op as the
    writer of a token of its replica (its device, or the "replica_N" name
    scope the strategy gives replica N > 0) through a resource resolver of
    auto_control_deps keeps each replica's own order and drops the order
    between replicas. Only graphs passed here are affected."""
    state = _PER_DEVICE_ORDER
    if state["registered"] is None:
        state["registered"] = False
        try:
            from tensorflow.python.framework import auto_control_deps as acd
        except ImportError:
            return False
        if IS_TF1 or not hasattr(acd, "register_acd_resource_resolver") or \
                not hasattr(acd, "op_is_stateful"):
            return False
        def _sok_graph_per_replica_order(op, resource_reads, resource_writes):
            # A graph's {replica ("replica_N", or the device for replica 0):
            # its token}, on the graph (graph_state).
            tokens = getattr(op.graph, "_sok_graph_state_replica_tokens", None)
            if tokens is None or not acd.op_is_stateful(op):
                return False
            # A MirroredStrategy names replica N's ops "replica_N/..." (N > 0);
            # ops a replica pins elsewhere (a host callback on the CPU) stay
            # that replica's.
            replica = _REPLICA_SCOPE.search(op.name)
            key = replica.group(1) if replica else op.device
            token = tokens.get(key)
            if token is not None and token in resource_writes:
                return False  # already added (resolvers run until nothing changes)
            if resource_reads or resource_writes:
                return False  # ordered by its resources
            if token is None:
                # Any tensor of the graph serves: the resolver only needs an
                # identity to order by; it is never an input of the op.
                with op.graph.as_default(), tf.compat.v1.name_scope(None):
                    token = tf.constant(0, name="sok_per_replica_order")
                tokens[key] = token
            resource_writes.add(token)
            return True

        try:
            acd.register_acd_resource_resolver(_sok_graph_per_replica_order)
        except KeyError:  # registered by an earlier import of this module
            pass
        state["registered"] = True
    if state["registered"]:
        graph_state(graph, "replica_tokens")
    return state["registered"]


_TF1_TRACKABLE = []


def _saveable_modules():
    """(saveable_object module, the trackable base module)."""
    from tensorflow.python.training.saving import saveable_object

    if IS_TF1:
        from tensorflow.python.training.tracking import base
    else:
        base = _tf2_trackable_base()
    return saveable_object, base


_SAVEABLE_CLASSES = []


def _saveable_classes():
    """(TensorsSaveable, OneTensorSaveable): SaveableObject classes made once.
    A class made per call (with the object in its closure) was never freed:
    TensorFlow's tf.nest keeps every class it has seen in a cache, so a
    tf.compat.v1.train.Saver kept each dynamic table it saved, and its
    memory, for the life of the process."""
    if _SAVEABLE_CLASSES:
        return _SAVEABLE_CLASSES[0]
    saveable_object, _ = _saveable_modules()

    class TensorsSaveable(saveable_object.SaveableObject):
        """All of obj's tensors (`given`: {suffix: tensor}), saved under
        name + suffix and restored through obj._restore_from_tensors."""

        def __init__(self, obj, given, name):
            self._suffixes = sorted(given)
            specs = [saveable_object.SaveSpec(given[s], "", name + s) for s in self._suffixes]
            super().__init__(obj, specs, name)

        def restore(self, restored_tensors, restored_shapes):
            return self.op._restore_from_tensors(dict(zip(self._suffixes, restored_tensors)))

    class OneTensorSaveable(saveable_object.SaveableObject):
        """One tensor of an object, only restored (_ReadsTf211Attributes):
        `arrive(local, tensor)` gets it."""

        def __init__(self, obj, local, dtype, checkpoint_key, arrive):
            self._local, self._arrive = local, arrive
            spec = saveable_object.SaveSpec(_never_saved, "", checkpoint_key, dtype=dtype,
                                            device="/cpu:0")
            # Its own `op`: TensorFlow refuses two saveables of one op
            # ("The same saveable will be restored with two names").
            super().__init__(_TensorOf(obj, local), [spec], checkpoint_key)

        def restore(self, restored_tensors, restored_shapes):
            return self._arrive(self._local, restored_tensors[0])

    _SAVEABLE_CLASSES.append((TensorsSaveable, OneTensorSaveable))
    return _SAVEABLE_CLASSES[0]


def _never_saved():
    raise AssertionError("a tensor read from a TF 2.11 checkpoint is only restored, never "
                         "saved")


def _tf_checkpoints_serialize_tensors():
    """Whether TensorFlow's tf.train.Checkpoint asks an object for
    _serialize_to_tensors itself (2.11 on)."""
    if IS_TF1:
        return False
    return hasattr(_tf2_trackable_base().Trackable, "_serialize_to_tensors")


def tensors_saveable_factories(obj, default_name, tensors=None, tensor_dtypes=None):
    """What `obj._gather_saveables_for_checkpoint()` returns for an object
    saved through _serialize_to_tensors / _restore_from_tensors (TF 2.11's
    checkpoint API): one SaveableObject holding a tensor per "-suffix", saved
    under name + suffix as TF 2.x's own conversion names them, restored
    through _restore_from_tensors. tf.compat.v1.train.Saver calls the factory
    without a name, and then `default_name` (a callable, asked at save-graph
    build time) names the tensors; object-based checkpoints pass their own.
    TF 1.x's Saver and tf.train.Checkpoint know only this method; TF 2.x's
    Saver asks it before _serialize_to_tensors. tensors: what gives the
    tensors instead of obj._serialize_to_tensors (a table's plain names).
    Before TF 2.11 the factories also read a tf.train.Checkpoint that TF
    2.11 on wrote (_ReadsTf211Attributes); tensor_dtypes: what gives
    {name: dtype} of obj._serialize_to_tensors without making its tensors
    (default: it makes them, once, when such a checkpoint is read)."""
    _, base = _saveable_modules()
    saveable_class = _saveable_classes()[0]

    def factory(name=None):
        if name is None:
            name = default_name()
            _refuse_a_name_the_saver_holds(obj, name)
        given = (tensors or obj._serialize_to_tensors)()
        return saveable_class(obj, given, name)

    # VARIABLE_VALUE_KEY: a Saver keeps the object's own name.
    factories = {base.VARIABLE_VALUE_KEY: factory}
    if _tf_checkpoints_serialize_tensors():
        return factories  # asked only by Savers, which name tensors as before
    if tensor_dtypes is None:
        def tensor_dtypes():
            return {name: t.dtype for name, t in obj._serialize_to_tensors().items()}
    return _ReadsTf211Attributes(factories, obj, tensor_dtypes)


def _refuse_a_name_the_saver_holds(obj, name):
    """ValueError when the tf.compat.v1.train.Saver asking for obj's
    saveable (a list of objects: it asks without a name) already holds
    another object under `name`. TensorFlow refuses two variables named
    alike in such a list, but merges the saveables of other objects into its
    {name: saveable} dict without a check, so one of two tables named alike
    (or a table and a variable) was left out of the file without an error.
    The dict is a local of TensorFlow's op_list_to_dict, the caller of the
    factory two or three frames up: where it is not found (another caller,
    another TensorFlow), nothing is checked."""
    held = _tensorflow_caller_local("op_list_to_dict", "saveable_object_util.py",
                                    "names_to_saveables", within=6)
    other = held.get(name) if isinstance(held, dict) else None
    if other is None or getattr(other, "op", None) is obj:
        return
    raise ValueError(
        "Two objects saved under one name, %r, were passed to a "
        "tf.compat.v1.train.Saver: %s and %s. The Saver would keep one and drop the "
        "other's tensors. Give them different names (the name= they are made with)."
        % (name, _described(obj), _described(getattr(other, "op", other))))


def _described(obj):
    kind = type(obj).__name__
    name = getattr(obj, "name", None)
    return "a %s named %r" % (kind, name) if name else "a %s" % kind


class _TensorOf(object):
    """One tensor of an object's checkpoint, as the `op` of its saveable."""

    def __init__(self, obj, local):
        self.obj, self.local = obj, local
        self.name = "%s%s" % (getattr(obj, "name", "") or "", local)


class _ReadsTf211Attributes(dict):
    """An object's saveable factories (tensors_saveable_factories) before TF
    2.11, also answering the attribute names of a tf.train.Checkpoint that
    TF 2.11 on wrote. Before 2.11 a checkpoint holds one attribute per
    object, "VARIABLE_VALUE", whose tensors are named ".../VARIABLE_VALUE"
    + suffix; from 2.11 it holds an attribute per tensor, named by the
    suffix itself (".../-keys"). Restoring, TensorFlow asks the factories
    for each attribute of the file by name (dict.get): those names were not
    here, so a 2.11 checkpoint restored under TF 1.15 left the object as it
    was, without an error. Asked for one of them, get answers a saveable of
    that one tensor; the object is restored once every one of its tensors
    has come (TensorFlow hands them to the saveables one by one, in one
    restore). Saving, TensorFlow lists the factories (items()): only
    VARIABLE_VALUE, so what is written is unchanged."""

    def __init__(self, factories, obj, tensor_dtypes):
        super().__init__(factories)
        self._obj = obj
        self._tensor_dtypes = tensor_dtypes
        self._dtypes = None
        self._arrived = {}

    def get(self, name, default=None):
        if name in self:
            return dict.get(self, name)
        if self._dtypes is None:
            self._dtypes = dict(self._tensor_dtypes())
        if name not in self._dtypes:
            return default
        return lambda name=None, _local=name: self._one_tensor(_local, name)

    def _one_tensor(self, local, checkpoint_key):
        return _saveable_classes()[1](self._obj, local, self._dtypes[local], checkpoint_key,
                                      self._arrive)

    def _arrive(self, local, tensor):
        """Keeps `tensor`; the object's restore once all have come, else a
        no-op."""
        self._arrived[local] = tensor
        if set(self._arrived) != set(self._dtypes):
            return tf.no_op() if not tf.executing_eagerly() else None
        tensors, self._arrived = self._arrived, {}
        return self._obj._restore_from_tensors(tensors)


def _tf1_trackable_class():
    """The Trackable of TensorFlow before 2.11 (1.x, 2.6 to 2.10) with TF
    2.11's checkpoint API on top (tensors_saveable_factories)."""
    if _TF1_TRACKABLE:
        return _TF1_TRACKABLE[0]
    _, base = _saveable_modules()

    class Trackable(base.Trackable):
        def _gather_saveables_for_checkpoint(self):
            if not hasattr(self, "_serialize_to_tensors"):
                return super()._gather_saveables_for_checkpoint()
            return tensors_saveable_factories(self, lambda: self.name)

    _TF1_TRACKABLE.append(Trackable)
    return Trackable


def dataset_from_generator(generator, signature):
    """tf.data.Dataset.from_generator for a structure of tf.TensorSpec.
    `output_signature` is new in TF 2.4; TF 1.x takes the same structure as
    output_types and output_shapes, which TF 2.x deprecates."""
    if IS_TF1:
        return tf.data.Dataset.from_generator(
            generator,
            output_types=tf.nest.map_structure(lambda spec: spec.dtype, signature),
            output_shapes=tf.nest.map_structure(lambda spec: spec.shape, signature),
        )
    return tf.data.Dataset.from_generator(generator, output_signature=signature)


def constant_value(tensor):
    """tf.get_static_value(tensor), leaving `tensor` feedable. TF 1.x's marks
    each graph tensor whose value it finds as unfeedable, and TF 1.x's
    sparse_placeholder with a fully defined shape has a constant dense_shape,
    which feeding a SparseTensorValue feeds ("may not be fed")."""
    op = getattr(tensor, "op", None) if not tf.executing_eagerly() else None
    if op is not None and op.type == "Const":
        return tf.make_ndarray(op.get_attr("value"))
    return tf.get_static_value(tensor)


def sparse_static_shape(sp):
    """The static shape of the SparseTensor `sp`, leaving its dense_shape
    feedable (TF 1.x's SparseTensor.shape makes a constant one unfeedable;
    see constant_value)."""
    value = constant_value(sp.dense_shape)
    if value is not None:
        return tf.TensorShape([int(d) for d in value])
    return sp.shape
