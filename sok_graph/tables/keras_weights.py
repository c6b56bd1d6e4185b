"""sok tables in Keras 3's weights files.

Keras 3 saves a model's weights (model.save_weights, model.save's .keras
file, ModelCheckpoint) by walking its layers' attributes and saving each
object of its `KerasSaveable` kind through `save_own_variables(store)`; a
tf.Variable is none, so a table a model held as an attribute was left out
of the file, and load_weights restored the dense layers only, without a
word. Every table kind takes this class as a base (on Keras 2 and TF 1.x
it is a plain class: their files save tf.Variables themselves), and saves
what a dump holds of it: sorted keys (a static table's row numbers), rows,
the per-key metadata and admission counts, and the slots and step of the
optimizer holding slots for it (Keras 3 keeps the compiled optimizer's own
variables in the same file). A load checks the entry and restores the
table exactly as sok.load does (dump_load.restore): the table holds the
file's keys afterwards, no others; its slots go to the optimizer that
makes them next.
The entry's reading and writing are dump_load's (keras_save, keras_load).
"""

import weakref

from sok_graph.compat import keras as keras_compat


class KerasWeights(keras_compat.keras_saveable_class()):
    """What a table does in a Keras 3 weights file (see the module
    docstring). A table whose holder saves it itself (a 1.x layer, a table
    sharded over replicas) is marked `hold_for_keras` and saves nothing of
    its own."""

    # Keras 3 layers read each weight's regularizer (Layer.losses, every
    # step of Model.fit): a table has none. A layer lists the tables it
    # holds among its weights (a 1.x layer its table, any layer a table
    # sharded over replicas), and their fit failed with "no attribute
    # 'regularizer'".
    regularizer = None

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
        if not held_by(self, "_keras_weights_holder"):
            _codec("save")(self, store)

    def load_own_variables(self, store):
        if not held_by(self, "_keras_weights_holder"):
            _codec("load")(self, store)


# What writes a table into a Keras weights entry and reads it back:
# sok_graph.dump_load's keras_save / keras_load (what a dump holds of a
# table, restored as sok.load restores it), registered when that module is
# imported (with sok_graph). It sits above the tables and imports them, so
# the tables cannot import it.
_CODECS = {}


def register_codec(save, load):
    _CODECS.update(save=save, load=load)


def _codec(what):
    if what not in _CODECS:  # pragma: no cover - sok_graph imports dump_load
        raise RuntimeError("sok table weights need sok_graph.dump_load: import sok_graph")
    return _CODECS[what]


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
