"""DeepRec's `CollectiveStrategy` front end: synchronous training with
model-parallel embedding tables, on sok_graph.

    strategy = sok.CollectiveStrategy()
    with strategy.scope(), tf.Graph().as_default():
        with strategy.embedding_scope():
            var = tf.compat.v1.get_variable(
                "var_1", shape=(1000, 3), initializer=tf.ones_initializer(),
                partitioner=tf.compat.v1.fixed_size_partitioner(strategy.world_size()))
        emb = tf.nn.embedding_lookup(var, ids)          # rows from their owners
        ...
        opt.minimize(loss)                              # gradients averaged over workers
        with tf.compat.v1.train.MonitoredTrainingSession() as sess:  # dense variables
            ...                                         # broadcast from rank 0

Engine (environment variable COLLECTIVE_STRATEGY):
  "sok"   (the default) Horovod: hvd.init() if needed, then sok.init("horovod").
          Start N workers with `python -m sok_graph.launch -np N script.py`
          (or horovodrun); a plain `python script.py` is one worker.
  "none"  one process, no communication.
DeepRec's "hb" (HybridBackend) is not available in sok_graph.

What the scopes do (each patch is installed when the outermost scope opens
and removed when it closes; nesting is allowed):

scope()
  - tf.compat.v1.train.Optimizer.compute_gradients (so minimize too): the
    gradient of an ordinary (data-parallel) variable is all-reduced and divided
    by the number of workers; the gradient of a sok variable is divided by it
    (the all-to-all backward already summed every worker's contribution).
    With each worker's loss a mean over its local batch this trains as one
    process would on the global batch (as Horovod's DistributedOptimizer).
  - MonitoredTrainingSession gets a hook that, after the session is created
    (or restored), broadcasts every variable that is not part of a sok table
    (the tables' shards and their optimizer slots stay on their workers) from
    rank 0. Workers other than rank 0 write checkpoints and summaries under
    <checkpoint_dir>/worker<rank>: each worker's checkpoint holds its own
    shard of every sok table, so a restart restores all of them.
  - tf.nn.embedding_lookup / embedding_lookup_sparse /
    safe_embedding_lookup_sparse (tf.nn and tf.compat.v1.nn) on a sok variable
    go to sok.all2all_dense_embedding / sok.lookup_sparse; anything else goes
    to TensorFlow's own function.

embedding_scope()
  - tf.compat.v1.get_variable (and a variable_scope's partitioner) with a
    partitioner and a [rows, dim] shape creates ONE sok.Variable holding the
    whole table's shape, sharded over the workers (row i on worker i % N),
    from the initializer evaluated for the full shape, under the name
    get_variable would give; not a PartitionedVariable. Feature columns
    (tf.compat.v1.feature_column.input_layer with embedding_column) use it,
    and their lookups are routed as above.

Limits: only tf.compat.v1 optimizers are patched (Keras optimizers are not);
wrapping an optimizer in hvd.DistributedOptimizer as well would average
twice; a variable_scope custom_getter is not applied to the sok tables.
"""

import contextlib
import inspect
import os
import tempfile
import threading
import weakref

import numpy as np
import tensorflow as tf

from sok_graph import communication, compat, context
from sok_graph.distributed_variable import Variable as _SokVariable
from sok_graph.distributed_variable import is_sok_variable
from sok_graph.lookup import all2all_dense_embedding, lookup_sparse

ENGINES = ("sok", "none")
_ENV = "COLLECTIVE_STRATEGY"


class _CallableInt(int):
    """An int that also answers a call with itself: DeepRec's examples use
    both `strategy.world_size()` and `strategy.world_size` (handed straight to
    tf.fixed_size_partitioner)."""

    def __call__(self):
        return int(self)


# --------------------------------------------------------------------------
# Engine selection


def _engine_from_env():
    value = os.environ.get(_ENV, "sok")
    engine = value.strip().lower() or "sok"
    if engine not in ENGINES:
        raise ValueError(
            f"{_ENV}={value!r} is not supported by sok_graph; choose one of {ENGINES} "
            "('sok': Horovod with model-parallel sok tables, the default; 'none': one "
            "process). DeepRec's 'hb' (HybridBackend) is not available.")
    return engine


def _launched_world_size():
    """Workers the launcher (or horovodrun) started, from its environment."""
    for key in ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        text = os.environ.get(key)
        if text:
            try:
                return int(text)
            except ValueError:
                pass
    return 1


def _start_horovod():
    """The Horovod communicator (hvd.init() first if it has not run); one
    process when Horovod is absent and no multi-worker launch asked for it."""
    try:
        import horovod.tensorflow as hvd
    except ImportError as e:
        if _launched_world_size() > 1:
            raise ImportError(
                f"{_ENV}=sok with {_launched_world_size()} workers needs Horovod "
                "(horovod.tensorflow could not be imported: scripts/install_horovod.sh "
                f"builds it), or set {_ENV}=none for one process") from e
        return context.init(comm_tool="none")
    try:
        hvd.size()
    except ValueError:  # Horovod has not been initialized
        hvd.init()
    return context.init(comm_tool="horovod")


# --------------------------------------------------------------------------
# Patching: every patch is (owner, attribute, replacement); the original is
# put back when the last scope using it closes.


class _Patches:
    def __init__(self):
        self._lock = threading.RLock()
        self._depth = {}     # group -> open scopes
        self._saved = {}     # group -> [(owner, attr, original)]

    def enter(self, group, patches):
        with self._lock:
            depth = self._depth.get(group, 0)
            if depth == 0:
                saved = []
                for owner, attr, new in patches:
                    saved.append((owner, attr, getattr(owner, attr)))
                    setattr(owner, attr, new)
                self._saved[group] = saved
            self._depth[group] = depth + 1

    def exit(self, group):
        with self._lock:
            depth = self._depth.get(group, 0) - 1
            self._depth[group] = max(depth, 0)
            if depth == 0:
                for owner, attr, old in reversed(self._saved.pop(group, [])):
                    setattr(owner, attr, old)

    def active(self, group):
        return self._depth.get(group, 0) > 0


_PATCHES = _Patches()


def _tf_modules():
    from tensorflow.python.ops import embedding_ops, variable_scope
    from tensorflow.python.training import monitored_session, optimizer, training

    return embedding_ops, variable_scope, monitored_session, optimizer, training


def _originals():
    """TensorFlow's own functions (captured once, before any patch)."""
    global _ORIG
    if _ORIG is None:
        embedding_ops, variable_scope, monitored_session, optimizer, _ = _tf_modules()
        _ORIG = {
            "embedding_lookup": embedding_ops.embedding_lookup,
            "embedding_lookup_v2": embedding_ops.embedding_lookup_v2,
            "embedding_lookup_sparse": embedding_ops.embedding_lookup_sparse,
            "embedding_lookup_sparse_v2": embedding_ops.embedding_lookup_sparse_v2,
            "safe_embedding_lookup_sparse": embedding_ops.safe_embedding_lookup_sparse,
            "safe_embedding_lookup_sparse_v2": embedding_ops.safe_embedding_lookup_sparse_v2,
            "store_get_variable": variable_scope._VariableStore.get_variable,
            "compute_gradients": optimizer.Optimizer.compute_gradients,
            "MonitoredTrainingSession": monitored_session.MonitoredTrainingSession,
        }
    return _ORIG


_ORIG = None


# --------------------------------------------------------------------------
# Lookups on sok variables


def _single_sok_table(params):
    """The sok variable `params` stands for (itself, or the only entry of a
    list), else None."""
    if isinstance(params, (list, tuple)):
        if len(params) == 1 and is_sok_variable(params[0]):
            return params[0]
        if any(is_sok_variable(p) for p in params):
            raise ValueError(
                "params lists a sok variable together with other tables; a sok "
                "variable holds the whole table, pass it alone")
        return None
    return params if is_sok_variable(params) else None


def _bound(fn, args, kwargs):
    sig = inspect.signature(fn)
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def _dense_lookup(table, ids, max_norm, name):
    if max_norm is None:
        return all2all_dense_embedding(table, ids, name=name)
    with tf.name_scope(name or "embedding_lookup"):
        ids = tf.convert_to_tensor(ids)
        flat = tf.reshape(ids, [-1])
        one_each = tf.RaggedTensor.from_row_lengths(
            flat, tf.ones_like(flat, dtype=tf.int64), validate=False)
        rows = lookup_sparse(table, one_each, combiners="sum", max_norm=max_norm)
        out = tf.reshape(rows, tf.concat([tf.shape(ids), tf.shape(rows)[1:]], 0))
        out.set_shape(ids.shape.concatenate(rows.shape[1:]))
        return out


def _make_dense_lookup(key):
    def embedding_lookup(*args, **kwargs):
        orig = _originals()[key]
        a = _bound(orig, args, kwargs)
        table = _single_sok_table(a["params"])
        if table is None:
            return orig(*args, **kwargs)
        return _dense_lookup(table, a["ids"], a.get("max_norm"), a.get("name"))

    embedding_lookup.__doc__ = _originals()[key].__doc__
    return embedding_lookup


def _as_2d(sp, what):
    """`sp` with a static rank of 2 (a sparse_placeholder's rank is unknown
    until it is fed; a fed rank other than 2 then fails in ensure_shape)."""
    if sp is None:
        return None
    if isinstance(sp, tf.compat.v1.SparseTensorValue):
        sp = tf.SparseTensor.from_value(sp)
    rank = compat.sparse_static_shape(sp).rank
    if rank is not None and rank != 2:
        raise ValueError(f"{what} must be a 2-D SparseTensor [batch, ids] for a sok variable; "
                         f"got rank {rank}")
    if rank is None:
        sp = tf.SparseTensor(sp.indices, sp.values, tf.ensure_shape(sp.dense_shape, [2]))
    return sp


def _sparse_lookup_2d(table, sp_ids, sp_weights, combiner, max_norm, name):
    combiner = combiner or "mean"
    return lookup_sparse(table, _as_2d(sp_ids, "sp_ids"), _as_2d(sp_weights, "sp_weights"),
                         combiners=combiner, max_norm=max_norm, name=name)


def _make_sparse_lookup(key):
    def embedding_lookup_sparse(*args, **kwargs):
        orig = _originals()[key]
        a = _bound(orig, args, kwargs)
        table = _single_sok_table(a["params"])
        if table is None:
            return orig(*args, **kwargs)
        return _sparse_lookup_2d(table, a["sp_ids"], a["sp_weights"], a["combiner"],
                                 a["max_norm"], a["name"])

    embedding_lookup_sparse.__doc__ = _originals()[key].__doc__
    return embedding_lookup_sparse


def _make_safe_sparse_lookup(key):
    def safe_embedding_lookup_sparse(*args, **kwargs):
        orig = _originals()[key]
        a = _bound(orig, args, kwargs)
        table = _single_sok_table(a["embedding_weights"])
        if table is None:
            return orig(*args, **kwargs)
        if a["default_id"] is not None:
            raise NotImplementedError(
                "safe_embedding_lookup_sparse on a sok variable: default_id="
                f"{a['default_id']!r} is not supported (samples without ids get zero rows); "
                "pass default_id=None")
        sp_ids, sp_weights = a["sparse_ids"], a["sparse_weights"]
        with tf.name_scope(a["name"] or "embedding_lookup"):
            # As TensorFlow's safe lookup: ids of any rank >= 2 are looked up
            # per row of their last dimension; negative ids and non-positive
            # weights are dropped.
            if isinstance(sp_ids, tf.compat.v1.SparseTensorValue):
                sp_ids = tf.SparseTensor.from_value(sp_ids)
            if isinstance(sp_weights, tf.compat.v1.SparseTensorValue):
                sp_weights = tf.SparseTensor.from_value(sp_weights)
            shape = sp_ids.dense_shape
            rank = sp_ids.shape.rank
            if rank is None or rank != 2:
                batch = tf.reduce_prod(shape[:-1])
                sp_ids = tf.sparse.reshape(sp_ids, tf.stack([batch, shape[-1]]))
                if sp_weights is not None:
                    sp_weights = tf.sparse.reshape(sp_weights, tf.stack([batch, shape[-1]]))
            keep = sp_ids.values >= 0
            if sp_weights is not None:
                keep = tf.logical_and(keep, sp_weights.values > 0)
                sp_weights = tf.sparse.retain(sp_weights, keep)
            sp_ids = tf.sparse.retain(sp_ids, keep)
            out = lookup_sparse(table, _as_2d(sp_ids, "sparse_ids"),
                                _as_2d(sp_weights, "sparse_weights"),
                                combiners=a["combiner"] or "mean", max_norm=a["max_norm"])
            if rank is None or rank != 2:
                out = tf.reshape(out, tf.concat(
                    [shape[:-1], tf.shape(out, out_type=tf.int64)[1:]], 0))
            return out

    safe_embedding_lookup_sparse.__doc__ = _originals()[key].__doc__
    return safe_embedding_lookup_sparse


def _lookup_patches():
    embedding_ops = _tf_modules()[0]
    dense_v1, dense_v2 = _make_dense_lookup("embedding_lookup"), \
        _make_dense_lookup("embedding_lookup_v2")
    sparse_v1, sparse_v2 = _make_sparse_lookup("embedding_lookup_sparse"), \
        _make_sparse_lookup("embedding_lookup_sparse_v2")
    safe_v1, safe_v2 = _make_safe_sparse_lookup("safe_embedding_lookup_sparse"), \
        _make_safe_sparse_lookup("safe_embedding_lookup_sparse_v2")
    patches = [
        # Feature columns call these through the module at call time.
        (embedding_ops, "embedding_lookup", dense_v1),
        (embedding_ops, "embedding_lookup_v2", dense_v2),
        (embedding_ops, "embedding_lookup_sparse", sparse_v1),
        (embedding_ops, "embedding_lookup_sparse_v2", sparse_v2),
        (embedding_ops, "safe_embedding_lookup_sparse", safe_v1),
        (embedding_ops, "safe_embedding_lookup_sparse_v2", safe_v2),
        # The public names are separate references to the same functions.
        (tf.nn, "embedding_lookup", dense_v2),
        (tf.nn, "embedding_lookup_sparse", sparse_v2),
        (tf.nn, "safe_embedding_lookup_sparse", safe_v2),
        (tf.compat.v1.nn, "embedding_lookup", dense_v1),
        (tf.compat.v1.nn, "embedding_lookup_sparse", sparse_v1),
        (tf.compat.v1.nn, "safe_embedding_lookup_sparse", safe_v1),
    ]
    if hasattr(tf.compat, "v2"):
        patches += [(tf.compat.v2.nn, "embedding_lookup", dense_v2),
                    (tf.compat.v2.nn, "embedding_lookup_sparse", sparse_v2),
                    (tf.compat.v2.nn, "safe_embedding_lookup_sparse", safe_v2)]
    return patches


# --------------------------------------------------------------------------
# Gradients and the broadcast of dense variables

_sok_slot_optimizers = weakref.WeakSet()  # optimizers that saw a sok variable


def _average_gradients(grads_and_vars, comm):
    n = comm.world_size
    out = []
    with tf.name_scope("collective_strategy_average"):
        for g, v in grads_and_vars:
            if g is None:
                out.append((g, v))
            elif is_sok_variable(v):
                # The all-to-all backward already summed every worker's
                # gradient into the owner's rows.
                if isinstance(g, tf.IndexedSlices):
                    g = tf.IndexedSlices(g.values / n, g.indices, g.dense_shape)
                else:
                    g = g / n
                out.append((g, v))
            elif isinstance(g, tf.IndexedSlices):
                # Rows of an ordinary table: every worker's rows, concatenated
                # (optimizers sum repeated indices).
                values = comm.allgather(g.values)
                indices = comm.allgather(g.indices)
                out.append((tf.IndexedSlices(values / n, indices, g.dense_shape), v))
            else:
                out.append((comm.allreduce(g) / n, v))
    return out


def _compute_gradients(self, *args, **kwargs):
    grads_and_vars = _originals()["compute_gradients"](self, *args, **kwargs)
    comm = context.communicator("Optimizer.compute_gradients under CollectiveStrategy")
    if any(is_sok_variable(v) for _, v in grads_and_vars):
        _sok_slot_optimizers.add(self)
    if comm.world_size == 1:
        return grads_and_vars
    return _average_gradients(grads_and_vars, comm)


def _model_parallel_variables(graph):
    """Variables of `graph` that belong to a sok table: the tables (their
    shards) and the optimizer slots of the tables."""
    tables = [v for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
              if is_sok_variable(v)]
    skip = {id(v) for v in tables}
    for opt in list(_sok_slot_optimizers):
        for slot in opt.get_slot_names():
            for t in tables:
                s = opt.get_slot(t, slot)
                if s is not None:
                    skip.add(id(s))
    # Slots of optimizers this module did not see: named <table>/<slot>.
    prefixes = tuple(t.op.name + "/" for t in tables)
    return skip, prefixes


_BROADCAST_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.int64,
                     tf.uint8, tf.int8, tf.bool)


class BroadcastHook(tf.compat.v1.train.SessionRunHook):
    """After a session is created (or restored), sets every variable that is
    not part of a sok table to rank 0's value."""

    def __init__(self, root_rank=0):
        self._root = root_rank
        self._op = None

    def begin(self):
        comm = context.communicator("CollectiveStrategy's broadcast hook")
        if comm.world_size == 1:
            return
        graph = tf.compat.v1.get_default_graph()
        skip, prefixes = _model_parallel_variables(graph)
        assigns = []
        with tf.name_scope("collective_strategy_broadcast"):
            for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
                if id(v) in skip or v.op.name.startswith(prefixes):
                    continue
                if v.dtype.base_dtype not in _BROADCAST_DTYPES:
                    continue
                value = comm.broadcast(tf.convert_to_tensor(v), self._root)
                assigns.append(tf.compat.v1.assign(v, value).op)
        self._op = tf.group(*assigns) if assigns else None

    def after_create_session(self, session, coord):
        if self._op is not None:
            session.run(self._op)


def _worker_dir(path, rank):
    """Where worker `rank` keeps its checkpoints under `path` (rank 0: path)."""
    if path is None or rank == 0:
        return path
    suffix = f"worker{rank}"
    if os.path.basename(os.path.normpath(str(path))) == suffix:
        return path
    return os.path.join(str(path), suffix)


def _monitored_training_session(*args, **kwargs):
    orig = _originals()["MonitoredTrainingSession"]
    a = _bound(orig, args, kwargs)
    comm = context.communicator("MonitoredTrainingSession under CollectiveStrategy")
    hooks = list(a["hooks"] or [])
    if comm.world_size > 1 and not any(isinstance(h, BroadcastHook) for h in hooks):
        hooks.append(BroadcastHook(0))
    a["hooks"] = hooks
    if comm.rank > 0:
        a["checkpoint_dir"] = _worker_dir(a["checkpoint_dir"], comm.rank)
        a["summary_dir"] = _worker_dir(a["summary_dir"], comm.rank)
    return orig(**a)


def _scope_patches():
    _, _, monitored_session, optimizer, training = _tf_modules()
    return [
        (optimizer.Optimizer, "compute_gradients", _compute_gradients),
        (monitored_session, "MonitoredTrainingSession", _monitored_training_session),
        (training, "MonitoredTrainingSession", _monitored_training_session),
        (tf.compat.v1.train, "MonitoredTrainingSession", _monitored_training_session),
    ]


# --------------------------------------------------------------------------
# get_variable with a partitioner -> one sharded sok.Variable

_export_mode = threading.local()


def _exporting():
    return getattr(_export_mode, "on", False)


def _store_get_variable(store, *args, **kwargs):
    orig = _originals()["store_get_variable"]
    a = _bound(orig, (store,) + args, kwargs)
    shape = a["shape"]
    partitioner = a["partitioner"]
    if partitioner is None or shape is None or len(tf.TensorShape(shape)) != 2:
        return orig(store, *args, **kwargs)
    if _exporting():
        # The serving graph holds the whole table as one ordinary variable.
        a["partitioner"] = None
        a.pop("self")
        return orig(store, **a)
    from tensorflow.python.ops import variable_scope

    name, dtype = a["name"], tf.as_dtype(a["dtype"])
    reuse = a["reuse"]
    existing = store._vars.get(name)
    if existing is not None:
        if reuse is True or reuse == variable_scope.AUTO_REUSE:
            if not is_sok_variable(existing):
                raise ValueError(f"variable {name!r} exists and is not a sok variable; it "
                                 "cannot be reused as a model-parallel table")
            return existing
        raise ValueError(f"Variable {name} already exists, disallowed. Did you mean to set "
                         "reuse=True or reuse=tf.compat.v1.AUTO_REUSE in VarScope?")
    if reuse is True:
        raise ValueError(f"Variable {name} does not exist, or was not created with "
                         "tf.compat.v1.get_variable(). Did you mean to set "
                         "reuse=tf.compat.v1.AUTO_REUSE in VarScope?")
    full_shape = tf.TensorShape(shape).as_list()
    if None in full_shape:
        raise ValueError(f"variable {name!r}: a model-parallel table needs a fully defined "
                         f"[rows, dim] shape; got {full_shape}")
    initializer = a["initializer"]
    with tf.compat.v1.name_scope(None), tf.compat.v1.name_scope(name + "/Initializer/"):
        if initializer is None:
            initializer = tf.compat.v1.glorot_uniform_initializer()
        if isinstance(initializer, type):
            initializer = initializer(dtype=dtype)
        if callable(initializer):
            value = initializer(full_shape, dtype=dtype)
        else:
            value = tf.convert_to_tensor(initializer, dtype=dtype)
            if value.shape.as_list() != full_shape:
                raise ValueError(f"variable {name!r}: the initializer's value has shape "
                                 f"{value.shape.as_list()}, the variable {full_shape}")
        value = tf.convert_to_tensor(value, dtype=dtype)
    trainable = a["trainable"]
    if trainable is None:
        trainable = a["synchronization"] != tf.VariableSynchronization.ON_READ
    with tf.compat.v1.name_scope(None):
        var = _SokVariable(initial_value=value, mode="distributed", name=name, dtype=dtype,
                           trainable=trainable, collections=a["collections"],
                           caching_device=a["caching_device"], constraint=a["constraint"])
    store._vars[name] = var
    if a["regularizer"] is not None:
        with tf.compat.v1.name_scope(None), tf.compat.v1.name_scope(name + "/Regularizer/"):
            loss = a["regularizer"](var)
        if loss is not None:
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES, loss)
    return var


def _embedding_patches():
    variable_scope = _tf_modules()[1]
    return [(variable_scope._VariableStore, "get_variable", _store_get_variable)]


# --------------------------------------------------------------------------


class CollectiveStrategy:
    """DeepRec's synchronous-training interface on sok_graph (see the module
    docstring)."""

    def __init__(self):
        self._engine = _engine_from_env()
        _originals()  # TensorFlow's functions, before any scope patches them
        if self._engine == "none":
            self._comm = context.init(comm_tool="none")
        else:
            self._comm = _start_horovod()

    @property
    def engine(self):
        return self._engine

    @property
    def communicator(self):
        return self._comm

    @property
    def world_size(self):
        """Number of workers: `strategy.world_size()` or `strategy.world_size`."""
        return _CallableInt(self._comm.world_size)

    @property
    def rank(self):
        """This worker's rank: `strategy.rank()` or `strategy.rank`."""
        return _CallableInt(self._comm.rank)

    def _make_current(self):
        # sok variables and lookups use the process-wide communicator; make it
        # this strategy's again if something re-initialized sok_graph since.
        if context._communicator is not self._comm:
            context._communicator = self._comm

    @contextlib.contextmanager
    def scope(self, *args, **kwargs):
        """Data-parallel scope (see the module docstring). Arguments are
        accepted for DeepRec compatibility and ignored."""
        del args, kwargs
        self._make_current()
        _PATCHES.enter("scope", _scope_patches())
        _PATCHES.enter("lookup", _lookup_patches())
        try:
            yield self
        finally:
            _PATCHES.exit("lookup")
            _PATCHES.exit("scope")

    @contextlib.contextmanager
    def embedding_scope(self, **kwargs):
        """Model-parallel scope: partitioned get_variable -> one sharded
        sok.Variable (see the module docstring)."""
        del kwargs
        self._make_current()
        _PATCHES.enter("embedding", _embedding_patches())
        _PATCHES.enter("lookup", _lookup_patches())
        try:
            yield self
        finally:
            _PATCHES.exit("lookup")
            _PATCHES.exit("embedding")

    # ---------------------------------------------------------- estimator
    def estimator(self, model_fn, model_dir=None, config=None, params=None,
                  warm_start_from=None):
        """A tf.estimator.Estimator training `model_fn` under this strategy.

        model_fn runs inside scope(); its training hooks get the broadcast of
        dense variables. The launcher's TF_CONFIG (workers only, which
        RunConfig rejects) is hidden while the RunConfig is built: each worker
        is a local estimator and Horovod does the communication. Rank 0 uses
        `model_dir`; rank r > 0 uses <model_dir>/worker<r> (its checkpoints hold
        its shard of the sok tables) and writes no summaries.

        The estimator's own export_saved_model serves one process's tables:
        with several workers use strategy.export_saved_model (every worker
        calls it), which gathers the tables whole.
        """
        estimator_lib = getattr(tf, "estimator", None)
        if estimator_lib is None or not hasattr(estimator_lib, "Estimator"):
            raise NotImplementedError(
                f"CollectiveStrategy.estimator needs tf.estimator, which TensorFlow "
                f"{tf.__version__} does not have (it was removed in 2.16); use "
                "MonitoredTrainingSession under strategy.scope() instead")
        rank = self._comm.rank
        saved = os.environ.pop("TF_CONFIG", None)
        try:
            if config is None:
                config = estimator_lib.RunConfig()
            if model_dir is None:
                model_dir = config.model_dir
            if model_dir is None and self._comm.world_size > 1:
                model_dir = tempfile.mkdtemp(prefix=f"collective_strategy_rank{rank}_")
            model_dir = _worker_dir(model_dir, rank)
            replace = {"model_dir": model_dir}
            if rank > 0:
                replace.update(save_summary_steps=None, log_step_count_steps=None)
            config = config.replace(**replace)
            strategy = self

            def wrapped_model_fn(features, labels, mode, params, config):
                kwargs = {}
                names = inspect.signature(model_fn).parameters
                if "params" in names:
                    kwargs["params"] = params
                if "config" in names:
                    kwargs["config"] = config
                if "mode" in names:
                    kwargs["mode"] = mode
                if "labels" in names:
                    kwargs["labels"] = labels
                with strategy.scope():
                    spec = model_fn(features, **kwargs)
                    if mode == estimator_lib.ModeKeys.TRAIN and strategy.world_size > 1:
                        hooks = list(spec.training_hooks or [])
                        if not any(isinstance(h, BroadcastHook) for h in hooks):
                            hooks.append(BroadcastHook(0))
                        spec = spec._replace(training_hooks=hooks)
                return spec

            return estimator_lib.Estimator(model_fn=wrapped_model_fn, config=config,
                                           params=params, warm_start_from=warm_start_from)
        finally:
            if saved is not None:
                os.environ["TF_CONFIG"] = saved

    # ---------------------------------------------------------- export
    def export_saved_model(self, savedmodel_dir, checkpoint_dir=None, signature_def_fn=None,
                           assets_extra=None, as_text=False, clear_devices=True,
                           strip_default_attrs=True, session=None):
        """Writes a SavedModel (tag "serve") that one process can serve, with
        every sok table whole. Every worker must call it (the tables' shards
        are gathered); rank 0 writes it and returns its directory, the others
        return None.

        signature_def_fn: called with no arguments in a new graph; rebuilds
          the model (the same variable names as in training) and returns a
          {key: SignatureDef} map, or (map, main_op). While it runs,
          partitioned get_variable under embedding_scope() makes ordinary
          variables of the whole table's shape and lookups are TensorFlow's
          own, so the SavedModel needs no sok_graph op.
        session: a session (tf.compat.v1.Session or MonitoredSession) of the
          training graph, whose variable values are exported; or
        checkpoint_dir: the training checkpoint directory (rank r > 0 reads
          its shard from <checkpoint_dir>/worker<r>), when no session is given.
        savedmodel_dir: the export directory (must not exist), as
          tf.compat.v1.saved_model.Builder takes it.
        """
        if signature_def_fn is None or not callable(signature_def_fn):
            raise ValueError("signature_def_fn must be a function building the serving graph "
                             f"and returning its SignatureDef map; got {signature_def_fn!r}")
        if session is None and checkpoint_dir is None:
            raise ValueError("export_saved_model needs session=<a session of the training "
                             "graph> or checkpoint_dir=<its checkpoint directory>")
        values, tables = (self._session_values(session) if session is not None
                          else self._checkpoint_values(checkpoint_dir))
        full = self._gather_tables(tables)
        values.update(full)
        if self._comm.rank != 0:
            return None
        return _write_saved_model(savedmodel_dir, values, signature_def_fn, assets_extra,
                                  as_text, clear_devices, strip_default_attrs, self._comm)

    def _session_values(self, session):
        raw = session._tf_sess() if hasattr(session, "_tf_sess") else session
        graph = raw.graph
        variables = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
        got = raw.run(list(variables)) if variables else []
        values, tables = {}, []
        skip, prefixes = _model_parallel_variables(graph)
        for v, x in zip(variables, got):
            name = v.op.name
            if is_sok_variable(v):
                tables.append((name, x, v.placement, tuple(v.global_shape.as_list())))
            elif id(v) in skip or name.startswith(prefixes):
                continue  # optimizer slots of sharded tables are not served
            else:
                values[name] = x
        return values, tables

    def _checkpoint_values(self, checkpoint_dir):
        own = _worker_dir(checkpoint_dir, self._comm.rank)
        path = tf.train.latest_checkpoint(own)
        if path is None:
            raise ValueError(f"checkpoint_dir={checkpoint_dir!r}: no checkpoint in {own!r} for "
                             f"rank {self._comm.rank}")
        reader = tf.train.load_checkpoint(path)
        shapes = reader.get_variable_to_shape_map()
        values, tables = {}, []
        table_names = self._known_tables()
        for name in sorted(shapes):
            if name in table_names:
                placement, global_shape = table_names[name]
                tables.append((name, reader.get_tensor(name), placement, global_shape))
            elif not name.startswith(tuple(t + "/" for t in table_names)):
                values[name] = reader.get_tensor(name)
        return values, tables

    def _known_tables(self):
        graph = tf.compat.v1.get_default_graph()
        return {v.op.name: (v.placement, tuple(v.global_shape.as_list()))
                for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
                if is_sok_variable(v)}

    def _gather_tables(self, tables):
        """{name: whole table} on rank 0 from every worker's shards."""
        out = {}
        if self._comm.world_size == 1:
            return {name: shard for name, shard, _, _ in tables}
        # A graph of its own, built the same way on every worker, so Horovod
        # matches the gathers whatever the training graph's state.
        with tf.Graph().as_default() as g:
            feeds, gathered = [], []
            for i, (name, shard, _, _) in enumerate(tables):
                ph = tf.compat.v1.placeholder(tf.as_dtype(shard.dtype), [None, shard.shape[1]])
                feeds.append(ph)
                gathered.append(self._comm.allgather(ph, name=f"collective_export_gather_{i}"))
            if not tables:
                return out
            with tf.compat.v1.Session(graph=g) as sess:
                results = sess.run(gathered, {ph: t[1] for ph, t in zip(feeds, tables)})
        n = self._comm.world_size
        for (name, shard, placement, global_shape), rows in zip(tables, results):
            fixed_owner = placement[2]
            if fixed_owner >= 0:
                out[name] = rows  # a localized table: only its owner sent rows
                continue
            whole = np.zeros(global_shape, rows.dtype)
            start = 0
            for r in range(n):
                count = len(range(r, global_shape[0], n))
                whole[r::n] = rows[start:start + count]
                start += count
            out[name] = whole
        return out


def _write_saved_model(export_dir, values, signature_def_fn, assets_extra, as_text,
                       clear_devices, strip_default_attrs, comm):
    saved_comm = context._communicator
    _export_mode.on = True
    # While the serving graph is built, sok_graph acts as one process: any
    # sok.Variable created there holds its whole table.
    context._communicator = communication.SingleProcess()
    try:
        with tf.Graph().as_default() as g:
            result = signature_def_fn()
            main_op = None
            if isinstance(result, (tuple, list)):
                result, main_op = result[0], (result[1] if len(result) > 1 else None)
            variables = g.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
            missing = [v.op.name for v in variables if v.op.name not in values]
            if missing:
                tf.compat.v1.logging.warning(
                    "export_saved_model: no trained value for %s; they keep their "
                    "initializers' values", missing)
            with tf.compat.v1.Session(graph=g) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                for v in variables:
                    if v.op.name in values:
                        v.load(values[v.op.name], sess)
                builder = tf.compat.v1.saved_model.Builder(export_dir)
                builder.add_meta_graph_and_variables(
                    sess, [tf.saved_model.SERVING], signature_def_map=result,
                    assets_collection=g.get_collection(
                        tf.compat.v1.GraphKeys.ASSET_FILEPATHS),
                    main_op=main_op, strip_default_attrs=strip_default_attrs,
                    clear_devices=clear_devices)
                builder.save(as_text=as_text)
        if assets_extra:
            extra = os.path.join(export_dir, "assets.extra")
            for dst, src in assets_extra.items():
                target = os.path.join(extra, dst)
                tf.io.gfile.makedirs(os.path.dirname(target))
                tf.io.gfile.copy(src, target, overwrite=True)
        return export_dir
    finally:
        _export_mode.on = False
        context._communicator = saved_comm
