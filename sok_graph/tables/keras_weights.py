"""sok tables in Keras 3's weights files.

Keras 3 saves a model's weights (model.save_weights, model.save's .keras
file, ModelCheckpoint) by walking its layers' attributes and saving each
object of its `KerasSaveable` kind through `save_own_variables(store)`; a
tf.Variable is none, so a table a model held as an attribute was left out
of the file, and load_weights restored the dense layers only, without a
word. Every table kind takes this class as a base (on Keras 2 and TF 1.x
it is a plain class: their files save tf.Variables themselves), and saves
what a dump holds of it: sorted keys (a static table's row numbers), rows,
the per-key metadata and admission counts, no optimizer slots (a weights
file holds no optimizer state; sok.dump with optimizer= keeps them). A
load checks the entry and restores the table exactly as sok.load does
(dump_load.restore): the table holds the file's keys afterwards, no others.
"""

import json
import weakref

import numpy as np

from sok_graph import context
from sok_graph.compat import keras as keras_compat


# Entries of a table's group in the file that are no arrays of its rows:
# the admission filter's settings (JSON text as bytes) and its call count.
_FILTER_JSON = "filter_json"


class KerasWeights(keras_compat.keras_saveable_class()):
    """What a table does in a Keras 3 weights file (see the module
    docstring). A table whose holder saves it itself (a 1.x layer, a table
    sharded over replicas) is marked `hold_for_keras` and saves nothing of
    its own."""

    # Keras only walks objects of a kind it knows, each with its list of
    # attributes to skip; "Loss" is known by every Keras 3 release that has
    # KerasSaveable, and skips least. The attributes it walks are a
    # table's own: none is a layer, and its linked slot tables are kept out
    # (dynamic.py's _TableRefs).
    def _obj_type(self):
        return "Loss"

    # KerasSaveable pickles (and copy.copy copies) an object by saving it as
    # a Keras model: a table copies and pickles as it did without that base.
    __reduce__ = object.__reduce__

    def save_own_variables(self, store):
        if held_by(self, "_keras_weights_holder"):
            return
        from sok_graph import dump_load

        self._refuse_worker_processes("save_weights")
        arrays = dump_load.table_arrays(self)
        for part, value in arrays.items():
            if part == dump_load.FILTER_KIND:
                store[_FILTER_JSON] = np.frombuffer(json.dumps(value).encode("utf-8"), np.uint8)
            else:
                store[part] = np.asarray(value)

    def load_own_variables(self, store):
        if held_by(self, "_keras_weights_holder"):
            return
        from sok_graph import dump_load
        from sok_graph.tables import dimension_of, replica_shards

        self._refuse_worker_processes("load_weights")
        name = dump_load.var_name(self)
        source = f"the Keras weights file's entry for sok table '{name}'"
        parts = sorted(store.keys())
        if "keys" not in parts or "values" not in parts:
            raise dump_load.CheckpointError(
                f"load_weights: {source} holds {parts}, not the table's keys and values (a "
                f"file saved by a model without this table, or before sok tables were saved "
                f"in Keras weights files, holds none): load the table with sok.load, and the rest "
                f"with load_weights(..., skip_mismatch=True)")
        arrays = {part: np.asarray(store[part]) for part in parts}
        if _FILTER_JSON in arrays:
            arrays[dump_load.FILTER_KIND] = json.loads(
                arrays.pop(_FILTER_JSON).tobytes().decode("utf-8"))
        if dump_load.FILTER_CALLS in arrays:
            arrays[dump_load.FILTER_CALLS] = int(arrays[dump_load.FILTER_CALLS])
        shard = replica_shards.shards_of(self)[0]
        keys, values = arrays["keys"], arrays["values"]
        dim = dimension_of(shard)
        if keys.ndim != 1 or values.ndim != 2 or values.shape[0] != keys.shape[0]:
            raise dump_load.CheckpointError(
                f"load_weights: {source} holds keys of shape {list(keys.shape)} and values of "
                f"shape {list(values.shape)}; expected [n] keys and [n, {dim}] values")
        if values.shape[1] != dim:
            raise dump_load.CheckpointError(
                f"load_weights: {source} holds rows of dimension {values.shape[1]}; the table "
                f"has dimension {dim}")
        arrays["keys"] = keys.astype(np.int64)
        if shard.fixed_rows is not None:
            dump_load.in_row_order(arrays, name, shard.fixed_rows, f"load_weights: {source}",
                                   holder="the file")
        dump_load.restore({name: self}, {name: arrays}, source)

    def _refuse_worker_processes(self, what):
        """A weights file holds one process's view: a table sharded over
        worker processes is refused (a rank-0-only save would also wait
        forever for the others in the allgather that reads every shard)."""
        from sok_graph.tables import replica_shards

        world = replica_shards.shards_of(self)[0].placement[0]
        comm = context.active()
        if world > 1 and comm is not None and not comm.in_process:
            raise ValueError(
                f"{what}: sok table '{self.name}' is sharded over {world} worker processes, "
                f"which a Keras weights file cannot hold; save and restore it with sok.dump / "
                f"sok.load (every worker calls them)")


def held_by(table, attribute):
    """Whether `table` is marked (hold_for_keras, or a ReplicaShards'
    `_replica_holder`) as saved by a holder that is still alive."""
    ref = getattr(table, attribute, None)
    return ref is not None and ref() is not None


def hold_for_keras(table, holder):
    """Marks `table` as saved in Keras weights files by `holder` (a 1.x
    layer or the replica shards that hold it), which saves it whole: the
    table's own entry would hold it twice."""
    table._keras_weights_holder = weakref.ref(holder)
