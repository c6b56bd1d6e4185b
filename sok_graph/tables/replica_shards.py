"""Sok tables sharded over the replicas of one process's MirroredStrategy.

Under `MirroredReplicas` (sok_graph/communication/replicas.py) every replica
is a worker, so a table needs one shard per replica, each on its replica's
device. `sok.Variable(...)` and `sok.DynamicVariable(...)` then return a
`ReplicaShards`: one object holding shard r for replica r, built as shard r
would be built by worker r of N separate processes (same rows, same
placement), so everything downstream — the exchange, the optimizer, dump and
load — works on shards exactly as it does across processes.

Inside `strategy.run` a ReplicaShards acts as the shard of the replica being
built (`resolve`): lookups read it, the tape differentiates it (its `handle`
is that shard's), the optimizer updates it. Outside a replica context only
what concerns the whole table works (dump, load, export, checkpoints); what
needs one shard says so.
"""

import contextlib
import weakref

import tensorflow as tf

from sok_graph import compat, context
from sok_graph.placement import owned_rows, owner_of
from sok_graph.tables import dimension_of, is_dynamic, register
from sok_graph.communication.replicas import building_rank
from sok_graph.tables.keras_weights import KerasWeights, hold_for_keras


def replicates(communicator):
    """Whether sok tables made now are split into one shard per replica of
    this process (`communicator` decides; see Communicator.replicates)."""
    return communicator is not None and communicator.replicates()


def shard_scope(rank):
    """What belongs with worker `rank`'s shard (its optimizer state) is built
    as that shard is (see Communicator.shard_scope)."""
    comm = context.active()
    return comm.shard_scope(rank) if comm is not None else contextlib.nullcontext()


def new_variable(initial_value, **kwargs):
    """A tf.Variable; while a replica's shard is being built, a plain
    resource variable (the strategy's variable creator would make it a
    MirroredVariable, one value for every replica)."""
    if building_rank() is None:
        return tf.Variable(initial_value, **kwargs)
    return compat.resource_variable_class()(initial_value, **kwargs)


def replicate(cls, args, kwargs, communicator):
    """A ReplicaShards of `cls(*args, **kwargs)` built once per replica, when
    `communicator` splits tables over the replicas of this process; else
    None (build the object itself)."""
    if not replicates(communicator):
        return None
    shards = []
    for rank in range(len(communicator.devices)):
        with communicator.building_shard(rank):
            shards.append(cls(*args, **kwargs))
    return ReplicaShards(shards)


def in_replica():
    """Whether a replica of a MirroredStrategy whose replicas are the workers
    is being built (inside its strategy.run)."""
    comm = context.active()
    return comm is not None and comm.in_replica()


compat.accept_resource_like_gradient_sources()


class ReplicaShards(compat.trackable_base_class(), KerasWeights):
    """A sok table whose shard r lives on replica r of this process (see the
    module docstring). `shards` lists them in replica order."""

    # The tape and tf.Module treat objects with this attribute as resource
    # variables: a gradient w.r.t. this table is one w.r.t. `handle`, the
    # shard of the replica being built.
    _should_act_as_resource_variable = True

    def __init__(self, shards):
        self._shards = list(shards)
        for rank, shard in enumerate(self._shards):
            # A checkpoint holds each shard as an object (where an admission
            # filter's counts are filed, and an earlier version's optimizer
            # slots, which restore with the same number of replicas), but
            # not its rows: this object saves the whole table
            # (_serialize_to_tensors below), and the optimizer files its
            # slots under it (ShardedSlot).
            self._track_trackable(shard, name=f"replica_{rank}")
            shard._replica_holder = weakref.ref(self)
            # A Keras weights file holds this table whole, not each shard.
            hold_for_keras(shard, self)
        states = [getattr(shard, "_admission_state", None) for shard in self._shards]
        if all(state is not None for state in states):
            # The filter's counts, whole, where one table keeps them.
            self._track_trackable(ReplicaAdmission(self._shards, states), name="admission")
        register(self)

    # tf.train.Checkpoint: the whole table, under the names one table of its
    # kind saves in a process of its own (whole_tensors below). Each shard
    # saved its own rows before, restored into the shard of its index: with
    # another number of replicas, or into the table of a process without a
    # MirroredStrategy, rows were lost without an error. Now any of those
    # restores gives each shard the rows it owns; the optimizer's slots go
    # the same way (ShardedSlot).
    def _serialize_to_tensors(self):
        return whole_tensors(self._shards, self._shards)

    def _restore_from_tensors(self, restored_tensors):
        return restore_whole(f"table '{self.name}'", self._shards, self._shards,
                             restored_tensors)

    def _export_to_saved_model_graph(self, *args, **kwargs):
        raise ValueError(
            f"sok table '{self.name}' is sharded over the replicas of a MirroredStrategy, "
            f"which a SavedModel cannot hold; save training state with tf.train.Checkpoint "
            f"or sok.dump, and export a model to serve with sok.export_for_serving")

    # Its name before TF 2.9 (asked the same way).
    _map_resources = _export_to_saved_model_graph

    @property
    def shards(self):
        return list(self._shards)

    def shard(self, what="this"):
        """The shard of the replica being built; a clear error outside
        strategy.run."""
        comm = context.communicator(what)
        count = len(self._shards)
        if not hasattr(comm, "replica_id") or comm.world_size != count:
            # sok.init ran again since, with another engine or strategy: the
            # replica id was looked up on a communicator that has none
            # (AttributeError) or indexed shards that do not exist.
            raise RuntimeError(
                f"{what} on {self.name!r}: the table is sharded over the {count} replicas of "
                f"the MirroredStrategy it was made under, but sok.init has since set up "
                f"{getattr(comm, 'name', type(comm).__name__)!r} with {comm.world_size} "
                f"worker(s); use it under that strategy (call sok.init in its scope again)")
        return self._shards[comm.replica_id(f"{what} on {self.name!r}")]

    # What every shard shares.
    @property
    def name(self):
        return self._shards[0].name

    @property
    def dtype(self):
        return self._shards[0].dtype

    @property
    def trainable(self):
        return self._shards[0].trainable

    @property
    def is_sok_variable(self):
        return True

    @property
    def mode(self):
        return self._shards[0].mode

    @property
    def global_shape(self):
        return self._shards[0].global_shape

    @property
    def target_gpu(self):
        return self._shards[0].target_gpu

    @property
    def dimension(self):
        return self._shards[0].dimension

    @property
    def key_type(self):
        return self._shards[0].key_type

    @property
    def initializer(self):
        """Every shard's initializer (graph mode)."""
        return tf.group(*[s.initializer for s in self._shards])

    @property
    def _shared_name(self):
        # What a checkpoint records beside the tensors this object saves,
        # as for a variable (TensorFlow asks it of resource-variable-like
        # objects).
        return self._shards[0]._shared_name

    @property
    def _unique_id(self):
        return "replicas:" + ",".join(str(s._unique_id) for s in self._shards)

    def ref(self):
        return compat.reference(self)

    # What belongs to the replica being built.
    @property
    def handle(self):
        return self.shard("reading the table").handle

    @property
    def shape(self):
        """The shape of the replica's shard inside strategy.run; [None, dim]
        outside (shards differ in rows)."""
        if not in_replica():
            return tf.TensorShape([None, self._shards[0].shape[1]])
        return self.shard("shape").shape

    @property
    def placement(self):
        return self.shard("placement").placement

    @property
    def device(self):
        return self.shard("device").device

    def __repr__(self):
        return (f"<sok table {self.name!r} sharded over {len(self._shards)} MirroredStrategy "
                f"replicas>")


def whole_tensors(shards, storages):
    """What a checkpoint holds of a table sharded over replicas (storages =
    shards), or of one optimizer slot of it (storages[r] = shard r's slot):
    the tensors one table (or slot) of that kind saves in a process of its
    own. Dynamic: "-keys", "-values", "-timestamps", "-frequencies"; static:
    VARIABLE_VALUE, the rows in global row order."""
    if is_dynamic(shards[0]):
        parts = [storage._table_tensors() for storage in storages]
        return {name: tf.concat([p[name] for p in parts], 0) for name in parts[0]}
    keys, rows = [], []
    for shard, storage in zip(shards, storages):
        k, r, _ = shard.export_chunk(0, 1 << 62)
        keys.append(tf.cast(k, tf.int32))
        rows.append(r if storage is shard else tf.convert_to_tensor(storage))
    return {compat.VARIABLE_VALUE_KEY: tf.dynamic_stitch(keys, rows)}


def restore_whole(what, shards, storages, restored_tensors):
    """Restores whole_tensors' tensors (written with any number of replicas,
    or by one table of a process without them): each shard's storage takes
    the rows its shard owns. The rows are checked against the table before
    any shard changes (a restore that failed in its second shard left the
    first one restored). `what` names the table or slot in errors."""
    first = shards[0]
    dim = dimension_of(first)
    if is_dynamic(first):
        keys = tf.reshape(restored_tensors["-keys"], [-1])
        values = restored_tensors["-values"]
    else:
        values = restored_tensors[compat.VARIABLE_VALUE_KEY]
        keys = tf.range(tf.shape(values, out_type=tf.int64)[0])
    # In a graph, the restored tensors' shapes are known when it runs.
    want = [None, dim] if is_dynamic(first) else list(first.global_shape)
    message = (f"the checkpoint's rows of {what} have shape {{}}; the table's are "
               f"{['any' if w is None else w for w in want]}")
    if values.shape.rank is not None and values.shape.is_fully_defined():
        got = values.shape.as_list()
        if len(got) != 2 or any(w is not None and g != w for g, w in zip(got, want)):
            raise ValueError(message.format(got))
        checks = []
    else:
        shape = tf.shape(values)
        fits = tf.logical_and(tf.equal(tf.size(shape), 2), tf.equal(shape[-1], dim))
        if want[0] is not None:
            fits = tf.logical_and(fits, tf.equal(shape[0], want[0]))
        checks = [tf.debugging.Assert(fits, [message.format("(below)"), shape])]
    with tf.control_dependencies(checks):
        values = tf.reshape(values, [-1, dim])
    ops = []
    for shard, storage in zip(shards, storages):
        if is_dynamic(first):
            mine = tf.equal(owner_of(shard, keys), shard.placement[1])
            # The storage's own restore: in a graph it also makes the table,
            # its slot links and filter state, and checks its capacity
            # (replace_rows needs a made table).
            part = {"-keys": tf.boolean_mask(keys, mine),
                    "-values": tf.boolean_mask(values, mine)}
            for m in first.key_metadata:
                if "-" + m in restored_tensors:
                    part["-" + m] = tf.boolean_mask(
                        tf.reshape(restored_tensors["-" + m], [-1]), mine)
            ops.append(storage._restore_from_tensors(part))
        elif storage is shard:
            ops.append(shard.replace_rows(*owned_rows(shard, keys, values)))
        else:
            ops.append(shard.replace_slot(storage, *owned_rows(shard, keys, values)))
    return tf.group(ops)


class ShardedSlot(compat.trackable_base_class()):
    """Optimizer slot `slot_name` of a table sharded over replicas, whole:
    `shards[r]` is the slot of the table's shard r. What the optimizer's
    `get_slot(table, name)` gives outside strategy.run, and what a
    tf.train.Checkpoint files as the table's slot variable, saved as the
    slot of one table of a process of its own saves it (whole_tensors): it
    restores into any number of replicas, or into a process without a
    MirroredStrategy, and back. Each shard's slot was filed under the
    shard before: a checkpoint restored with another number of replicas
    left the optimizer's state fresh, without an error."""

    def __init__(self, table, slot_name, slots):
        self._table = table
        self._slot_name = slot_name
        self._slots = list(slots)

    @property
    def shards(self):
        """The slot of each shard of the table, in replica order."""
        return list(self._slots)

    @property
    def name(self):
        return f"{self._table.name}/{self._slot_name}"

    def _serialize_to_tensors(self):
        return whole_tensors(self._table.shards, self._slots)

    def _restore_from_tensors(self, restored_tensors):
        return restore_whole(f"optimizer slot '{self._slot_name}' of table "
                             f"'{self._table.name}'", self._table.shards, self._slots,
                             restored_tensors)

    def __repr__(self):
        return (f"<optimizer slot {self._slot_name!r} of sok table {self._table.name!r}, "
                f"sharded over {len(self._slots)} MirroredStrategy replicas>")


class ReplicaCounters(compat.trackable_base_class()):
    """An optimizer's step counters, one per replica (all counting the
    same steps), saved as one counter of a process of its own saves it, and
    restored into every one: a checkpoint of any number of replicas, or of
    none, restores into any other."""

    def __init__(self, counters):
        self._counters = list(counters)

    def _serialize_to_tensors(self):
        return {compat.VARIABLE_VALUE_KEY: tf.convert_to_tensor(self._counters[0])}

    def _restore_from_tensors(self, restored_tensors):
        step = restored_tensors[compat.VARIABLE_VALUE_KEY]
        return tf.group([counter.assign(tf.cast(step, counter.dtype))
                         for counter in self._counters])


class ReplicaAdmission(compat.trackable_base_class()):
    """The admission filter's state of a dynamic table sharded over replicas,
    saved where and as one table of a process of its own saves it (its
    "admission" child): the counts of every shard (per key: each key's, held
    by its owner; a sketch's counters: each the largest of the shards', as
    sok.dump merges them) and the most calls of the shards' draws. Restored
    into any number of replicas or none: per key, each shard takes the keys
    it owns; a sketch, the merged counters (as sok.load gives them). Each shard's
    counts were filed under the shard, and came back with the same number
    of replicas only."""

    def __init__(self, shards, states):
        self._shards, self._states = list(shards), list(states)

    def _serialize_to_tensors(self):
        parts = [state.state_tensors() for state in self._states]
        entries = tf.concat([p["entries"] for p in parts], 0)
        counts = tf.concat([p["counts"] for p in parts], 0)
        if self._shards[0].admission.kind == "sketch":
            entries, at = tf.unique(entries)
            # Each counter the largest of the shards' (dump_load._merged_counts).
            counts = tf.math.unsorted_segment_max(counts, at, tf.size(entries))
        calls = tf.concat([tf.reshape(p["calls"], [-1]) for p in parts], 0)
        calls = tf.cond(tf.size(calls) > 0, lambda: tf.reduce_max(calls, keepdims=True),
                        lambda: tf.zeros([0], tf.int64))
        return {"kind": parts[0]["kind"], "entries": entries, "counts": counts,
                "calls": calls}

    def _restore_from_tensors(self, restored_tensors):
        entries = tf.reshape(restored_tensors["entries"], [-1])
        counts = tf.reshape(restored_tensors["counts"], [-1])
        ops = []
        for shard, state in zip(self._shards, self._states):
            part = dict(restored_tensors)
            if shard.admission.kind == "keys":
                mine = tf.equal(owner_of(shard, entries), shard.placement[1])
                part["entries"] = tf.boolean_mask(entries, mine)
                part["counts"] = tf.boolean_mask(counts, mine)
            ops.append(state.restore_state(part))
        return tf.group(ops)


# tf.Module (a model's trainable_variables) and Keras 2's layers find
# variables by isinstance(obj, tf.Variable). A table sharded over replicas
# was left out of them, so SOK's split_embedding_variable_from_others(
# model.trainable_variables) gave no table and the step never trained it,
# without an error (one process's tables are tf.Variables and were listed).
# A virtual subclass: isinstance holds, nothing of tf.Variable is inherited;
# TF 1.x's variable class is no abc (no MirroredStrategy replicas there).
if hasattr(tf.Variable, "register"):
    tf.Variable.register(ReplicaShards)


def resolve(var, what="this"):
    """The variable to work on: the replica's shard of a ReplicaShards
    (inside strategy.run), else `var` itself. A sok table that is not
    sharded over the replicas being built (made before sok.init set up
    the replicas, or under another engine) is a ValueError naming it: every
    replica read and updated that one table, an optimizer applied each
    replica's update in turn (Adam's moments and step once per replica), and
    training differed from one process's without an error."""
    if isinstance(var, ReplicaShards):
        return var.shard(what)
    _refuse_unsharded_in_replica(var, what)
    return var


def _refuse_unsharded_in_replica(var, what):
    """The check of resolve for what is not a ReplicaShards."""
    comm = context.active()
    if comm is None or not comm.in_process or not comm.in_replica():
        return
    try:
        placement = var.placement
    except AttributeError:  # not a sok table: TensorFlow's variables and tensors
        return
    if not (isinstance(placement, tuple) and len(placement) == 3):
        return
    world_size = placement[0]
    if world_size == comm.world_size:
        return  # a replica's own shard
    name = getattr(var, "name", type(var).__name__)
    raise ValueError(
        f"{what} on table {name!r} inside strategy.run: the table is a table of "
        f"{world_size} worker(s), not sharded over the {comm.world_size} replicas that "
        f"sok.init set up (it was made before that sok.init, or under another engine), so "
        f"every replica would read and update this one table apart from the others. Make "
        f"the table after sok.init(comm_tool=\"tf\") under the strategy's scope")


def shards_of(var):
    """Every shard of `var` this process holds: all of a ReplicaShards', else
    [var]."""
    return var.shards if isinstance(var, ReplicaShards) else [var]
