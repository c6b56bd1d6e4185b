"""Sparse optimizers for sok tables: the algorithm table (algorithms.py)
and `OptimizerWrapper`, which applies a native optimizer's algorithm to sok
variables row by row and keeps their slots (wrapper.py)."""

from sok_graph.optimization.wrapper import SGD, OptimizerWrapper, OwnRule, wrapper_for  # noqa: F401
