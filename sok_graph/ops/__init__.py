"""Python wrappers of the op families in tf_ops/ (one module per family):
argument conversion and gradient registration around the raw ops."""

from sok_graph.ops import collective, dynamic, library, lookup, sharding, util  # noqa: F401
