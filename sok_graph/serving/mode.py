"""Serving mode: while a servable model is built, sok_graph's lookups read
serving tables (plain TensorFlow variables, sok_graph/serving/tables.py)
instead of sok tables, so the traced model holds no sok_graph op.

The state is per thread: an active `Resolver` turns each sok table a lookup
names into its serving table. This module imports nothing of sok_graph, so
the lookups can ask it cheaply.
"""

import contextlib
import threading

_state = threading.local()


def resolver():
    """The active resolver, or None outside serving mode."""
    return getattr(_state, "resolver", None)


def active():
    """Whether sok_graph builds lookups for serving right now."""
    return resolver() is not None


@contextlib.contextmanager
def serving(active_resolver):
    """Serving mode for the `with` block: lookups go through `active_resolver`."""
    previous = resolver()
    _state.resolver = active_resolver
    try:
        yield active_resolver
    finally:
        _state.resolver = previous


def table_for(param):
    """The serving table standing for sok table `param` (created on first use)."""
    active_resolver = resolver()
    _refuse_a_models_own_function(active_resolver)
    return active_resolver.table_for(param)


def _refuse_a_models_own_function(active_resolver):
    """ValueError where a lookup is traced inside a tf.function of the
    model's own (below the export's trace; tf.cond and tf.while_loop branches
    are graphs of other kinds). TensorFlow keeps that trace in the function's
    cache, keyed by its inputs only: the model's training calls after the
    export would read the served tables' snapshot instead of the trained
    tables, without an error."""
    root = getattr(active_resolver, "trace_graph", None)
    if root is None:
        return
    import tensorflow as tf
    from tensorflow.python.framework import func_graph

    graph = tf.compat.v1.get_default_graph()
    while graph is not None and graph is not root:
        if type(graph) is func_graph.FuncGraph:  # pylint: disable=unidiomatic-typecheck
            raise ValueError(
                f"export_for_serving: the model reads sok tables inside a tf.function of its "
                f"own ({graph.name}); TensorFlow would keep that function's serving trace and "
                f"run it for the model's later training calls, reading the served tables' "
                f"snapshot. Export a model whose sok lookups are not inside tf.functions "
                f"below its __call__ (a tf.function given as the model, or as its __call__, "
                f"is traced through its Python function: that is fine)")
        graph = getattr(graph, "outer_graph", None)
