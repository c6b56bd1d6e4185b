"""scope()'s patches: gradients averaged over the workers, dense variables
broadcast from rank 0 (BroadcastHook), per-worker MonitoredTrainingSession dirs.
"""

import os
import weakref

import tensorflow as tf

from sok_graph import context
from sok_graph.tables.static import is_sok_variable

from .patching import _bound, _originals, _tf_modules

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
