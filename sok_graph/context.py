"""Process-wide sok_graph state: which communicator is in use.

`init` is pure Python and creates no graph op (SOK 2.x semantics). Like
SOK's, with use_legacy_optimizer=True (the default) it makes
``tf.keras.optimizers`` and ``tf.optimizers`` the legacy (OptimizerV2)
optimizers where TensorFlow has them (see `use_legacy_keras_optimizers`);
that is the only state it changes outside this module.
"""

import contextlib
import threading
import types

import tensorflow as tf

from sok_graph import communication, compat, initializers

_lock = threading.Lock()
_communicator = None
# What sok.Init (the 1.x API) was given: global_batch_size, seed.
_v1_config = {}


def init(comm_tool="horovod", use_legacy_optimizer=True):
    """Initializes sok_graph for this process.

    comm_tool: "horovod" (SOK's default), "tf" (tf.distribute), or "none" /
      "single" (one process, no communication; "single" is what SOK's own
      single-process scripts pass). With Horovod absent or not initialized,
      "horovod" means a single process too. Any other value is a ValueError
      (SOK prints a message and runs without a communication tool; a typo
      such as "horvod" would then silently train one process's shard only).
    use_legacy_optimizer: True (SOK's default) makes ``tf.keras.optimizers``
      and ``tf.optimizers`` the legacy optimizers, as SOK does, where
      TensorFlow has them (TF 2.11 to 2.15, Keras 2): one legacy optimizer
      object then updates any variable it is given, at any time, while
      Keras 2's new optimizers only update the variables of their first
      call. On Keras 3 (TF >= 2.16) nothing changes, as in SOK: tf.keras
      has no legacy optimizers there (SOK scripts use
      ``tf_keras.optimizers.legacy`` explicitly, which sok_graph accepts),
      and rebinding tf.keras to tf_keras's would break Keras 3 models.
      False leaves tf.keras alone. sok.OptimizerWrapper takes either kind.

    Calling init again replaces the communicator (SOK allows one call), and
    tables made after it without a seed are numbered from the first again,
    as after tf.random.set_seed (sok_graph/initializers.py own_seed).
    Returns the communicator (SOK returns None).
    """
    if not isinstance(use_legacy_optimizer, bool):
        raise TypeError(
            f"use_legacy_optimizer must be a bool; got {use_legacy_optimizer!r}"
        )
    # The communicator first: an init refused (an unknown comm_tool, no
    # engine joining several workers) leaves tf.keras as it was.
    comm = set_comm_tool(comm_tool)
    if use_legacy_optimizer:
        use_legacy_keras_optimizers()
    # Tables made from now on without a seed are numbered from the first
    # again: a model built again after init starts from the same rows.
    initializers.restart_own_seeds()
    return comm


def set_comm_tool(tool):
    """Selects the communicator by name ("horovod", "tf", "none" or "single"), as
    sok.init does. SOK refuses a second call; here a later call replaces the
    communicator, so scripts and notebooks can initialize again."""
    global _communicator
    with _lock:
        _communicator = communication.create(tool)
    return _communicator


# (module, attribute, original value) of every rebinding init made, so that
# restore_keras_optimizers can undo them.
_rebound = []


def _with_legacy_optimizers(current, legacy):
    """A module like `current` (tf.keras.optimizers) whose optimizer names are
    `legacy`'s: everything else it holds (schedules, serialize, get, the
    `legacy` module itself, ...) stays reachable, which SOK's plain
    rebinding to the legacy module loses."""
    merged = types.ModuleType(current.__name__, getattr(current, "__doc__", None))
    for name in dir(current):
        if not name.startswith("__"):
            setattr(merged, name, getattr(current, name))
    for name in dir(legacy):
        if not name.startswith("_"):
            setattr(merged, name, getattr(legacy, name))
    merged.legacy = legacy
    return merged


def use_legacy_keras_optimizers():
    """Makes tf.keras.optimizers and tf.optimizers hold the legacy optimizers
    where TensorFlow has OptimizerV2 ones; True when it did."""
    legacy = compat.legacy_optimizers_module()
    if legacy is None:
        return False
    with _lock:
        for module, attr in ((tf.keras, "optimizers"), (tf, "optimizers")):
            current = getattr(module, attr, None)
            if current is None or getattr(current, "_sok_graph_legacy", False):
                continue
            target = getattr(current, "legacy", None)
            if target is None:
                continue
            merged = _with_legacy_optimizers(current, target)
            merged._sok_graph_legacy = True
            _rebound.append((module, attr, current))
            setattr(module, attr, merged)
    return True


def restore_keras_optimizers():
    """Undoes use_legacy_keras_optimizers (tests use it to isolate)."""
    with _lock:
        while _rebound:
            module, attr, original = _rebound.pop()
            setattr(module, attr, original)


def communicator(caller="this call"):
    """The active communicator; a clear error when init() has not run."""
    if _communicator is None:
        raise RuntimeError(
            f"sok_graph is not initialized: call sok.init() before {caller}"
        )
    return _communicator


def active():
    """The active communicator, or None before init()."""
    return _communicator


def table_scope():
    """Where this worker's shard of a sok table is made (the active engine's
    Communicator.table_scope; TensorFlow's placement before init())."""
    comm = _communicator
    return contextlib.nullcontext() if comm is None else comm.table_scope()


def world(caller="creating a sok.DynamicVariable"):
    """(world_size, rank) of the active communicator; one worker before init()
    in a process of its own. Before init() in a process that is one of
    several workers (python -m sok_graph.launch, horovodrun, mpirun), a
    RuntimeError naming `caller`: a table made then was one process's whole
    table on every worker (a table that no exchange reaches, trained apart
    on each worker's own data, each worker's copy drifting from the
    others'), without an error; sok.Variable refused already."""
    comm = _communicator
    if comm is None:
        _refuse_uninitialized_worker(caller)
        return (1, 0)
    return (comm.world_size, comm.rank)


def _refuse_uninitialized_worker(caller):
    """RuntimeError where the environment says this process is one of several
    workers and sok.init has not run."""
    from sok_graph.launch.environment import worker_info

    try:
        rank, _, world_size = worker_info()
    except ValueError:  # malformed variables: the engines' business, not this check's
        return
    if world_size > 1:
        raise RuntimeError(
            f"sok_graph is not initialized: call sok.init() before {caller}. This process is "
            f"worker {rank} of {world_size} (its launcher's environment says so): a table made "
            f"before sok.init would be a whole table of this worker alone, trained apart from "
            f"the others' (call hvd.init() then sok.init(), or sok.init(comm_tool=\"tf\") in a "
            f"MultiWorkerMirroredStrategy's scope; sok.init(comm_tool=\"none\") for "
            f"independent processes)")


def set_v1_config(**config):
    with _lock:
        _v1_config.clear()
        _v1_config.update(config)


def v1_config(key, default=None):
    """A setting given to sok.Init (global_batch_size, seed), or `default`."""
    value = _v1_config.get(key)
    return default if value is None else value


def reset():
    """Forgets the communicator and sok.Init's settings (tests use this to
    check the uninitialized path)."""
    global _communicator
    with _lock:
        _communicator = None
        _v1_config.clear()
