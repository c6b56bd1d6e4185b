"""scope()'s patches: gradients averaged over the workers, dense variables
broadcast from rank 0 (BroadcastHook), per-worker MonitoredTrainingSession dirs
(restored alike on every worker), and the gradients' norms and finite checks
taken over every worker's rows of the sok tables.
"""

import os
import weakref

import tensorflow as tf

from sok_graph import context
from sok_graph.communication import agreement
from sok_graph.tables.static import is_sok_variable

from .patching import _bound, _norm_modules, _originals, _tf_modules

_sok_slot_optimizers = weakref.WeakSet()  # optimizers that saw a sok variable
# graph -> ids of the variables whose gradients compute_gradients averaged.
_averaged_variables = weakref.WeakKeyDictionary()
# graph -> names of the tensors that hold a worker's part of a sok table's
# gradient (_average_gradients' outputs): the rows this worker owns only.
_table_gradients = weakref.WeakKeyDictionary()


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
                _note_table_gradient(g)
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


def _outermost(graph):
    """The graph a tf.cond or tf.function branch (a FuncGraph, TF 2's
    control flow) is built inside of, else `graph`: what is noted here
    belongs to the training graph, and the v1 loss scale optimizer applies
    the gradients inside a tf.cond."""
    while getattr(graph, "outer_graph", None) is not None:
        graph = graph.outer_graph
    return graph


def _note_table_gradient(grad):
    values = grad.values if isinstance(grad, tf.IndexedSlices) else grad
    _table_gradients.setdefault(_outermost(values.graph), set()).add(values.name)


def _table_part(t):
    """The values of `t` where it is a worker's part of a sok table's
    gradient (_average_gradients made it), else None."""
    values = t.values if isinstance(t, tf.IndexedSlices) else t
    if values is None or tf.executing_eagerly() or not hasattr(values, "graph"):
        return None
    return values if values.name in _table_gradients.get(_outermost(values.graph), ()) else None


def _workers_comm():
    """The job's communicator where several workers take part, else None."""
    comm = context.active()
    return comm if comm is not None and comm.world_size > 1 else None


def _global_norm(t_list, name=None):
    """TensorFlow's global_norm, with the parts of sok tables' gradients
    summed over the workers: each worker holds the gradient of its own rows
    only, so tf.clip_by_global_norm (which calls this) gave every worker
    another norm, and the workers' dense weights, clipped by it, drifted
    apart without an error. The dense gradients are the same on every
    worker (averaged) and count once."""
    orig = _originals()["global_norm"]
    comm = _workers_comm()
    t_list = list(t_list) if isinstance(t_list, (list, tuple)) else t_list
    if comm is None or not isinstance(t_list, list):
        return orig(t_list, name)
    parts = [_table_part(t) for t in t_list]
    if not any(p is not None for p in parts):
        return orig(t_list, name)
    rest = [t for t, p in zip(t_list, parts) if p is None and t is not None]
    with tf.name_scope(name or "global_norm"):
        dtype = next(p for p in parts if p is not None).dtype
        local = tf.add_n([tf.reduce_sum(tf.square(tf.cast(p, dtype)))
                          for p in parts if p is not None])
        squares = comm.allreduce(local)
        if rest:
            squares += tf.square(tf.cast(orig(rest), dtype))
        return tf.sqrt(squares, name="global_norm")


def _clip_by_norm(t, clip_norm, axes=None, name=None):
    """TensorFlow's clip_by_norm, with the norm of a sok table's whole
    gradient (every worker's rows) where `t` is a worker's part of one and
    the norm is over all of it (axes None): each worker scaled its rows by
    the norm of its own part."""
    orig = _originals()["clip_by_norm"]
    comm = _workers_comm()
    part = _table_part(t) if comm is not None and axes is None else None
    if part is None:
        return orig(t, clip_norm, axes, name)
    with tf.name_scope(name or "clip_by_norm"):
        squares = comm.allreduce(tf.reduce_sum(tf.square(part)))
        norm = tf.sqrt(squares)
        clip_norm = tf.cast(clip_norm, part.dtype)
        # As TensorFlow's: a zero gradient stays zero.
        scale = tf.where(squares > 0, clip_norm / tf.maximum(norm, clip_norm),
                         tf.ones_like(norm))
        clipped = part * scale
        # Still a worker's part of the table's gradient: a global norm
        # taken after this clip sums it over the workers too.
        _note_table_gradient(clipped)
        if isinstance(t, tf.IndexedSlices):
            return tf.IndexedSlices(clipped, t.indices, t.dense_shape)
        return clipped


def _is_all_finite(grads):
    """The v1 loss scales' check (MixedPrecisionLossScaleOptimizer), true
    only where every worker's gradients are finite when sok tables'
    gradients are among them: each worker held only its own rows, so a
    non-finite row skipped the step on its owner and was applied on the
    others, and the workers' dense weights and loss scales parted."""
    orig = _originals()["is_all_finite"]
    local = orig(grads)
    comm = _workers_comm()
    # The loss scale optimizer unscales the gradients into new tensors
    # first: any graph with sok tables' gradients checks across workers
    # (every worker builds the same graph, so all take this collective).
    if comm is None or tf.executing_eagerly() or \
            not _table_gradients.get(_outermost(tf.compat.v1.get_default_graph())):
        return local
    bad = comm.allreduce(tf.cast(tf.logical_not(local), tf.float32))
    return tf.equal(bad, 0.0)


def _compute_gradients(self, *args, **kwargs):
    grads_and_vars = _originals()["compute_gradients"](self, *args, **kwargs)
    comm = context.communicator("Optimizer.compute_gradients under CollectiveStrategy")
    if any(is_sok_variable(v) for _, v in grads_and_vars):
        _sok_slot_optimizers.add(self)
    if comm.world_size == 1:
        return grads_and_vars
    averaged = _averaged_variables.setdefault(_outermost(tf.compat.v1.get_default_graph()),
                                              set())
    averaged.update(id(v) for _, v in grads_and_vars)
    return _average_gradients(grads_and_vars, comm)


def _checking_apply_gradients(previous):
    """`previous` (the apply_gradients installed when the scope opened: an
    open sok.OptimizerScope's routing, or TensorFlow's own), after a check
    that with several workers every sok table's gradient came through
    compute_gradients (or minimize), where scope() averages them:
    tf.gradients, or a GradientTape, gives each worker its own unaveraged
    gradients, which trained the workers' copies of the dense weights apart
    (and the tables N times too fast) without an error."""

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        comm = context.active()
        if comm is not None and comm.world_size > 1 and not tf.executing_eagerly():
            averaged = _averaged_variables.get(_outermost(tf.compat.v1.get_default_graph()),
                                               set())
            missed = [getattr(v, "name", repr(v)) for g, v in grads_and_vars
                      if g is not None and is_sok_variable(v) and id(v) not in averaged]
            if missed:
                raise ValueError(
                    f"{type(self).__name__}.apply_gradients under CollectiveStrategy with "
                    f"{comm.world_size} workers: the gradients of sok tables {missed[:5]} did "
                    f"not come from this graph's Optimizer.compute_gradients (or minimize), "
                    f"which averages every gradient over the workers; tf.gradients and "
                    f"GradientTape do not. Take the gradients with "
                    f"optimizer.compute_gradients(loss)")
        return previous(self, grads_and_vars, *args, **kwargs)

    return apply_gradients


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
    _refuse_workers_restoring_unlike(comm, a["checkpoint_dir"] if a["is_chief"] else None)
    return orig(**a)


def _shards_unlike_the_checkpoints(shards, checkpoint, comm):
    """A ValueError where `checkpoint` holds a table's shard of another shape
    than this worker's (it was written by another number of workers: a
    one-process checkpoint holds whole tables), else None. TensorFlow's
    restore assigned it as it was: a 2-worker job's checkpoint restored in
    one process made the table rank 0's 10 of its 20 rows, without an
    error."""
    try:
        saved = dict(tf.train.list_variables(checkpoint))
    except (tf.errors.OpError, ValueError):
        return None  # unreadable: the restore itself says so
    world = 1 if comm is None else comm.world_size
    for shard in shards:
        name = shard.op.name
        held = saved.get(name)
        mine = shard.shape.as_list()
        if held is not None and list(held) != mine:
            return ValueError(
                f"MonitoredTrainingSession under CollectiveStrategy: checkpoint {checkpoint} "
                f"holds sok table {name!r} as {list(held)} rows x dim; this worker's shard of "
                f"it is {mine} with {world} worker(s): the checkpoint was written by another "
                f"number of workers (each worker's checkpoint holds its own shard). Restore "
                f"with that number of workers, or move tables between worker counts with "
                f"sok.dump / sok.load")
    return None


def _refuse_workers_restoring_unlike(comm, checkpoint_dir):
    """ValueError on every worker where some workers would restore a
    checkpoint and others none while the graph holds sok tables, or where a
    checkpoint holds a table's shard of another shape: each worker's
    checkpoint holds its own shard of every table, so a worker without its
    directory (another host, only the chief's directory copied,
    checkpoint_dir=None on the other ranks) started its shard from the
    initializer while rank 0 restored its own and the global step, without
    an error. Checkpoints of different steps on every worker (time-based
    saves, a crash between them) are restored as they are, with a
    warning."""
    graph = tf.compat.v1.get_default_graph()
    shards = [v for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
              if is_sok_variable(v)]
    if not shards:
        return  # data parallel only: rank 0's restore reaches every worker (BroadcastHook)
    tables = [v.op.name for v in shards]
    latest = tf.train.latest_checkpoint(checkpoint_dir) if checkpoint_dir else None
    error = None
    if latest:
        error = _shards_unlike_the_checkpoints(shards, latest, comm)
    if not agreement.spans_processes(comm):
        if error is not None:
            raise error
        return
    _, failures = agreement.agree(comm, False, error=error)
    agreement.raise_shared(comm, error, failures, "MonitoredTrainingSession's restore",
                           (ValueError,), outcome="; no worker restored anything")
    mine = os.path.basename(latest) if latest else ""
    every = agreement.texts(comm, False, mine)
    told = ", ".join(f"rank {r}: {t or 'none'}" for r, t in enumerate(every))
    if all(every) and len(set(every)) > 1:
        # Time-based saves (the default) run on each worker's own clock: a
        # job restarted after a crash finds checkpoints a step or two apart.
        tf.compat.v1.logging.warning(
            "MonitoredTrainingSession under CollectiveStrategy: the workers restore "
            "checkpoints of different steps (%s); each restores its own latest", told)
        return
    if not any(every) or len(set(every)) == 1:
        return
    raise ValueError(
        f"MonitoredTrainingSession under CollectiveStrategy: some workers would restore a "
        f"checkpoint and others none ({told}; this worker's checkpoint_dir is "
        f"{checkpoint_dir!r}). Each worker's checkpoint holds its own shard of the sok tables "
        f"{tables[:5]}, so every worker must restore its own (rank r > 0 keeps it under "
        f"<checkpoint_dir>/worker<r>; give every worker the checkpoint_dir), or none of them")


def _scope_patches():
    _, _, monitored_session, optimizer, training = _tf_modules()
    clip_ops, loss_scale = _norm_modules()
    patches = [
        (optimizer.Optimizer, "compute_gradients", _compute_gradients),
        (optimizer.Optimizer, "apply_gradients",
         _checking_apply_gradients(optimizer.Optimizer.__dict__["apply_gradients"])),
        (monitored_session, "MonitoredTrainingSession", _monitored_training_session),
        (training, "MonitoredTrainingSession", _monitored_training_session),
        (tf.compat.v1.train, "MonitoredTrainingSession", _monitored_training_session),
        # clip_by_global_norm calls clip_ops' global_norm; the public names
        # are the API modules' own references.
        (clip_ops, "global_norm", _global_norm),
        (clip_ops, "clip_by_norm", _clip_by_norm),
    ]
    for module, attr, new in ((tf.compat.v1, "global_norm", _global_norm),
                              (tf.compat.v1.linalg, "global_norm", _global_norm),
                              (tf.linalg, "global_norm", _global_norm),
                              (tf.compat.v1, "clip_by_norm", _clip_by_norm),
                              (tf, "clip_by_norm", _clip_by_norm)):
        if getattr(module, attr, None) is _originals()[attr]:
            patches.append((module, attr, new))
    if loss_scale is not None:
        patches.append((loss_scale, "_is_all_finite", _is_all_finite))
    return patches
