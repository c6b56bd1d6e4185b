"""`sok.Init` (the SOK 1.x initializer) and the graph-mode session helpers.

In TF2 (eager, tf.function, a tf.distribute strategy's scope) `Init` sets
sok_graph up at once. In TF1-style graph mode it also returns an op, which
SOK requires to be the first thing a Session runs, before the variable
initializer. sok_graph makes that order automatic where it can and the wrong
order impossible to miss:

- the tables the 1.x layers create are initialized *after* Init's op (their
  initializers depend on it), so running the variable initializer first runs
  Init's op first, and running Init's op again later is harmless;
- a 1.x layer's lookup checks that Init's op ran in the session and otherwise
  fails with an error saying to run it — never a lookup into a table that
  was never set up;
- `InitHook` runs Init's op in a ``MonitoredTrainingSession``,
  `initialize_session(sess)` runs Init's op and then the variable
  initializers, and `global_variables_initializer()` is one op doing both.
"""


import numpy as np
import tensorflow as tf

from sok_graph import compat, context
from sok_graph.serving import mode as serving_mode

_INIT_ARGS = ("global_batch_size", "seed")


class _GraphInit:
    """Init's op in one graph, and the flag it sets (a resource variable kept
    out of every collection, so only Init's op initializes it)."""

    def __init__(self):
        with tf.name_scope("sok_init"):
            self.flag = tf.compat.v1.Variable(True, trainable=False, collections=[],
                                              use_resource=True, name="initialized")
            self.op = tf.group(self.flag.initializer, name="init")


def _graph_init(graph, make=False):
    """Init's _GraphInit in `graph` (made when `make`), kept on the graph
    (compat.graph_state): a WeakKeyDictionary of graphs kept every graph
    sok.Init was called in, since a _GraphInit holds the graph's ops."""
    state = compat.graph_state(graph, "init")
    if make and "init" not in state:
        state["init"] = _GraphInit()
    return state.get("init")


def _is_int(value):
    """A Python or numpy integer (np.int64(4), a numpy computation's result,
    was refused as "not a positive integer"); not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _positive_int(name, value):
    if not _is_int(value) or value <= 0:
        raise ValueError(f"{name} must be a positive integer; got {value!r}")
    return int(value)


def Init(**kwargs):  # noqa: N802 (SOK's name)
    """``Init(global_batch_size=..., seed=None)``: sets up sok_graph for the
    1.x API. Returns, in graph mode, the op to run first in every Session;
    in TF2, None (the set-up is done)."""
    unknown = sorted(set(kwargs) - set(_INIT_ARGS))
    if unknown:
        raise TypeError(f"sok.Init got unexpected arguments {unknown}; it takes "
                        f"{list(_INIT_ARGS)}")
    if "global_batch_size" not in kwargs:
        raise TypeError("sok.Init needs global_batch_size=<the batch size summed over all "
                        "workers>")
    batch = _positive_int("global_batch_size", kwargs["global_batch_size"])
    seed = kwargs.get("seed")
    if seed is not None and (not _is_int(seed) or seed < 0 or int(seed) >= (1 << 63)):
        # The tables' seed is an int64.
        raise ValueError(f"seed must be None or a non-negative integer below 2^63; got {seed!r}")
    seed = None if seed is None else int(seed)
    # Under a tf.distribute strategy the strategy is the communication engine.
    comm_tool = "tf" if tf.distribute.has_strategy() else "horovod"
    # SOK 1.x's Init predates Keras' legacy optimizers and leaves
    # tf.keras.optimizers as it is (only SOK 2.x's init rebinds it).
    context.init(comm_tool=comm_tool, use_legacy_optimizer=False)
    comm = context.communicator()
    if batch % comm.world_size:
        raise ValueError(f"global_batch_size ({batch}) must be a multiple of the number of "
                         f"workers ({comm.world_size})")
    context.set_v1_config(global_batch_size=batch, seed=seed)
    if not compat.v1_graph_mode():
        return None
    graph = tf.compat.v1.get_default_graph()
    return _graph_init(graph, make=True).op


def init_op(graph=None):
    """Init's op in `graph` (default: the default graph), or None if sok.Init
    was not called while building it."""
    state = _graph_init(graph or tf.compat.v1.get_default_graph())
    return None if state is None else state.op


def creation_dependencies():
    """What a 1.x layer's variables must be initialized after: Init's op in
    graph mode, nothing in TF2."""
    if not compat.v1_graph_mode():
        return []
    op = init_op()
    return [] if op is None else [op]


_NOT_RUN = ("the op returned by sok.Init has not run in this session. Run it first, before "
            "the variable initializer: sess.run(sok_init_op) (or "
            "sok.initialize_session(sess), or sok.InitHook() for MonitoredTrainingSession)")


def check_initialized():
    """Ops that fail with a clear message when Init's op has not run in the
    session that runs them (graph mode); nothing in TF2."""
    if not compat.v1_graph_mode() or serving_mode.active():
        return []
    state = _graph_init(tf.compat.v1.get_default_graph())
    if state is None:
        return []
    return [tf.debugging.Assert(state.flag.is_initialized(), [_NOT_RUN], name="sok_init_check")]


def _require_init_op(graph, what):
    op = init_op(graph)
    if op is None:
        raise RuntimeError(f"{what}: sok.Init(global_batch_size=...) was not called while "
                           "building this graph; call it before creating sok layers")
    return op


def global_variables_initializer():
    """One op that runs Init's op, then the global and local variable
    initializers (graph mode)."""
    op = _require_init_op(tf.compat.v1.get_default_graph(), "sok.global_variables_initializer")
    with tf.control_dependencies([op]):
        return tf.group(tf.compat.v1.global_variables_initializer(),
                        tf.compat.v1.local_variables_initializer(), name="sok_initializer")


def initialize_session(sess):
    """Runs Init's op, then the global and local variable initializers, in
    `sess` (a tf.compat.v1.Session)."""
    op = _require_init_op(sess.graph, "sok.initialize_session")
    sess.run(op)
    with sess.graph.as_default():
        sess.run(tf.group(tf.compat.v1.global_variables_initializer(),
                          tf.compat.v1.local_variables_initializer()))


class InitHook(tf.compat.v1.train.SessionRunHook):
    """Runs sok.Init's op in every session a MonitoredTrainingSession
    creates (also after a restore from a checkpoint, where no variable
    initializer runs)."""

    def __init__(self):
        self._op = None

    def begin(self):
        self._op = _require_init_op(tf.compat.v1.get_default_graph(), "sok.InitHook")

    def after_create_session(self, session, coord):
        session.run(self._op)
