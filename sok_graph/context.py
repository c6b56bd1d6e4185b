"""Process-wide sok_graph state: which communicator is in use.

`init` is pure Python and creates no graph op (SOK 2.x semantics); it never
touches anything global outside this module — in particular it does not
rebind ``tf.keras.optimizers``.
"""

import threading

from sok_graph import communication

_lock = threading.Lock()
_communicator = None
# What sok.Init (the 1.x API) was given: global_batch_size, seed.
_v1_config = {}


def init(comm_tool="horovod", use_legacy_optimizer=True):
    """Initializes sok_graph for this process.

    comm_tool: "horovod" (SOK's default), "tf" (tf.distribute) or "none". With
      Horovod absent or not initialized, "horovod" means a single process.
    use_legacy_optimizer: accepted for SOK compatibility; sok_graph works
      with both legacy and new Keras optimizers and changes no global state.
    """
    global _communicator
    if not isinstance(use_legacy_optimizer, bool):
        raise TypeError(
            f"use_legacy_optimizer must be a bool; got {use_legacy_optimizer!r}"
        )
    with _lock:
        _communicator = communication.create(comm_tool)
    return _communicator


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


def world():
    """(world_size, rank) of the active communicator; one worker before init()."""
    comm = _communicator
    return (1, 0) if comm is None else (comm.world_size, comm.rank)


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
