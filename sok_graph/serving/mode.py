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
    return resolver().table_for(param)
