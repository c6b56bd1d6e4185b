"""Python wrappers of the op families in tf_ops/ (one module per family):
argument conversion and gradient registration around the raw ops."""

from sok_graph.ops import dist, lookup, util  # noqa: F401
