"""sok_graph: model-parallel, fused and dynamic embeddings for TensorFlow.

    import sok_graph as sok          # or: import sparse_operation_kit as sok
    sok.init()
    table = sok.Variable(tf.random.normal([100000, 16]))
    emb = sok.lookup_sparse([table], [ragged_ids], combiners=["mean"])
"""

__version__ = "0.1.0"

from sok_graph import compat  # noqa: F401  (the TF-version layer)
from sok_graph.context import init, set_comm_tool
from sok_graph.tables.static import DistributedVariable, LocalizedVariable, Variable
from sok_graph.tables.dynamic import DynamicVariable
# SOK's module names for the modules of its two table classes, so that
# sparse_operation_kit.distributed_variable / .dynamic_variable import.
from sok_graph.tables import static as distributed_variable  # noqa: F401
from sok_graph.tables import dynamic as dynamic_variable  # noqa: F401
from sok_graph.dump_load import dump, incremental_model_dump, load
from sok_graph.lookup import all2all_dense_embedding, lookup_sparse
from sok_graph.optimization import SGD, OptimizerWrapper
from sok_graph.serving.delta import apply_serving_delta, export_serving_delta
from sok_graph.serving.export import export_for_serving
from sok_graph.variables import assign, export, filter_variables, sparse_read_and_evict

# The SOK 1.x API (sok_graph/v1/), on the same engine.
from sok_graph.v1 import optimizers  # noqa: E402  (sok.optimizers.Adam / LazyAdam)
from sok_graph.v1.embedding_layers import (All2AllDenseEmbedding, DistributedEmbedding,
                                           GraphKeys, get_embedding)
from sok_graph.v1.optimizers import OptimizerScope, split_embedding_variable_from_others
from sok_graph.v1.saver import Saver
from sok_graph.v1.session import (Init, InitHook, global_variables_initializer,
                                  initialize_session)
from sok_graph.collective_strategy import CollectiveStrategy  # DeepRec's front end

# SOK's module attributes: TensorFlow's version as a list of ints, and
# `raw_ops`, the op library (sok_graph's own, with sok_graph's op names).
tf_version = compat.TF_VERSION_LIST

# The package's functions run as written inside tf.function (compat says why).
compat.leave_package_to_autograph_unconverted(__name__)
# Keras 3 layers list the sok tables they hold among their weights, as
# Keras 2 layers do (compat.keras says why).
compat.keras.list_tables_among_keras3_layer_weights(distributed_variable.is_sok_variable)


def _register_ops():
    """Loads the op library at import, as SOK does: a SavedModel or meta
    graph holding sok ops (tf.saved_model.save of a model that reads sok
    tables, an Estimator's export) loads only where TensorFlow knows them,
    and `import sok_graph` is what a program does before loading one (it
    failed with "Op type not registered 'SokFusedLookup'" until some sok
    call had loaded the library). A library that is missing, built for
    another TensorFlow or broken does not make the package unimportable:
    the first op that needs it raises why (ops/library.py)."""
    from sok_graph.ops import library

    try:
        library.load()
    except Exception:  # noqa: BLE001 (raised again, with its reason, at the first op)
        pass


_register_ops()


def __getattr__(name):
    if name == "raw_ops":
        from sok_graph.ops import library

        return library.load()
    raise AttributeError(f"module 'sok_graph' has no attribute {name!r}")

# raw_ops is public too; it stays out of __all__ (it is the op library, not
# an API of this package's own).
__all__ = ["init", "set_comm_tool", "tf_version", "Variable",
           "DistributedVariable", "LocalizedVariable", "DynamicVariable", "lookup_sparse", "all2all_dense_embedding",
           "OptimizerWrapper", "SGD", "assign", "export", "filter_variables",
           "sparse_read_and_evict", "dump", "load", "incremental_model_dump", "__version__",
           "Init", "All2AllDenseEmbedding", "DistributedEmbedding", "OptimizerScope",
           "split_embedding_variable_from_others", "optimizers", "Saver", "get_embedding",
           "GraphKeys", "InitHook", "initialize_session", "global_variables_initializer",
           "CollectiveStrategy", "export_for_serving", "export_serving_delta",
           "apply_serving_delta"]
