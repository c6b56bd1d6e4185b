"""`sok.Variable`: a static embedding table that behaves like a ``tf.Variable``.

mode="distributed": global row i lives on worker i % N as local row i // N
  (2 workers, 15 rows: worker 0 holds 8 rows, worker 1 holds 7).
mode="localized:<rank>": the whole table lives on worker <rank>.

The Python object holds this worker's shard; `global_shape` is the shape of
the whole table. With one worker the shard is the whole table. Under a
MirroredStrategy whose replicas are the workers (one process), the
constructor returns a ReplicaShards holding every replica's shard
(sok_graph/tables/replica_shards.py).
"""

import re

import numpy as np
import tensorflow as tf

from sok_graph import compat, context, placement
from sok_graph.tables import (checkpoint_tag, register, repeated_key_checks, replica_shards,
                               note_save_type, rows_of_dtype, STATIC, untagged)
from sok_graph.initializers import static_initializer
from sok_graph.tables.dynamic import scope_name
from sok_graph.tables.keras_weights import KerasWeights, held_by

_ResourceVariable = compat.resource_variable_class()


def _is_localized(mode):
    return isinstance(mode, str) and mode.startswith(placement.LOCALIZED_PREFIX)


def _whole_value(initial_value, kwargs):
    """The whole table's value from initial_value, or (as SOK allows) from
    shape= and initializer= (a Keras / tf initializer called with the shape
    and dtype) when initial_value is None.

    A vector is refused: SOK means it as one row [1, dim], but its
    distributed path fails on it (a misspelt attribute) and its localized
    path makes a 1-D variable whose global_shape says [1, dim]; here a table
    is always [rows, dim]."""
    shape = kwargs.pop("shape", None)
    initializer = kwargs.pop("initializer", None)
    value = initial_value() if callable(initial_value) else initial_value
    made = "initial_value"
    if value is None and initializer is not None:
        if shape is None:
            raise ValueError("sok.Variable(initializer=...) needs shape=[rows, dim]")
        dtype = kwargs.get("dtype") or tf.float32
        initializer = static_initializer(initializer)
        value = initializer(shape=tf.TensorShape(shape).as_list(), dtype=tf.as_dtype(dtype))
        made = "the initializer's value"
    if value is None:
        raise ValueError("initial_value must be given (a [rows, dim] array or tensor), or "
                         "shape= and initializer=")
    if isinstance(value, list):
        value = np.asarray(value)
    return _within_shape(value, shape, made)


def _within_shape(value, shape, made, asked=None):
    """value, refused by name unless its shape is one `shape` allows (as
    tf.Variable refuses an initial_value its shape= does not allow): the
    table would otherwise take the value's size, and a lookup past it fail
    later with a range error that names neither."""
    if shape is None:
        return value
    got = tf.TensorShape(value.shape if hasattr(value, "shape") else np.shape(value))
    if not tf.TensorShape(shape).is_compatible_with(got):
        asked = asked or f"shape is {tf.TensorShape(shape).as_list()}"
        raise ValueError(f"{asked}; {made} has shape {got.as_list()}")
    return value


def _shard_from_initializer(kwargs, where):
    """(the whole table's shape, this worker's rows made by the initializer)
    for shape= and initializer= on several workers: a table larger than one
    device's memory never exists whole. A deterministic initializer (zeros,
    a constant) gives the table it gives on one worker; a random one gives
    rows of the same distribution, drawn per shard (as SOK's shards draw
    theirs)."""
    shape = kwargs.pop("shape", None)
    initializer = kwargs.pop("initializer")
    if shape is None:
        raise ValueError("sok.Variable(initializer=...) needs shape=[rows, dim]")
    shape = tuple(tf.TensorShape(shape).as_list())
    if len(shape) != 2 or None in shape:
        raise ValueError(f"shape must be a known [rows, dim]; got {list(shape)}")
    dtype = tf.as_dtype(kwargs.get("dtype") or tf.float32)
    initializer = static_initializer(initializer)
    local = placement.shard_rows(shape[0], *where)
    whole = _whole_constant(initializer, shape)
    if whole is not None:  # the table's own rows, given whole: this worker's of them
        return shape, lambda: tf.cast(placement.shard_of(whole, *where), dtype)
    if where[0] > 1:
        initializer = _for_a_shard(initializer, shape, local, where[1])

    def rows():
        made = initializer(shape=[local, shape[1]], dtype=dtype)
        return _within_shape(made, [local, shape[1]], "the initializer's value",
                             f"shape is {list(shape)}, of which this worker holds {local} "
                             f"rows: the initializer was asked for {[local, shape[1]]}")

    return shape, rows


def _whole_constant(initializer, shape):
    """The value of a constant initializer that holds the whole table's rows
    (tf.keras.initializers.Constant(array), tf.constant_initializer(array))
    as an array, or None (a scalar constant, any other initializer). Asked
    for a shard's rows, such an initializer failed with TensorFlow's "has 6
    elements, but got shape (1, 3)" on several workers."""
    value = getattr(initializer, "value", None)
    if value is None or np.ndim(value) == 0 or callable(value):
        return None
    value = np.asarray(value)
    if value.shape != tuple(shape):
        raise ValueError(f"the constant initializer holds an array of shape {list(value.shape)}; "
                         f"shape is {list(shape)} (give it the whole table, or a number)")
    return value


def _for_a_shard(initializer, shape, local, rank):
    """`initializer`, for worker `rank`'s `local` rows of a table of `shape`,
    drawing from the whole table's distribution, and apart from the other
    workers' rows. A seeded initializer (or an unseeded one under
    tf.random.set_seed, which every worker's program runs alike) drew the
    same rows on every worker: rows r and r + N of the table started equal.
    Each worker draws from a seed of its own (_shard_seed). A variance-scaling
    initializer (glorot_*, he_*, lecun_*, VarianceScaling) takes its scale
    from the fans of the shape it is asked for: a shard's rows came out
    with the variance of a table of `local` rows (glorot_uniform on 4
    workers: limit 0.077 where one worker's is 0.039), without an error.
    Its scale is adjusted so that the shard's fans give the table's
    variance. Orthogonal and identity rows are properties of the whole
    matrix, which a shard does not see: refused (give initial_value)."""
    name = type(initializer).__name__.lower()
    if "orthogonal" in name or "identity" in name:
        raise ValueError(
            f"initializer {type(initializer).__name__} makes rows that depend on the whole "
            f"table, which no worker holds on several workers: give initial_value= the whole "
            f"[rows, dim] value, or a per-row distribution (uniform, normal, glorot_uniform...)")
    seed = _shard_seed(initializer, rank)
    base = next((k for k in type(initializer).__mro__ if k.__name__ == "VarianceScaling"), None)
    if base is None or local == 0:
        if seed is None:
            return initializer
        config = initializer.get_config()
        config["seed"] = seed
        return type(initializer).from_config(config)

    def fan(rows):
        fan_in, fan_out = max(1.0, float(rows)), max(1.0, float(shape[1]))
        mode = getattr(initializer, "mode", "fan_in")
        return {"fan_in": fan_in, "fan_out": fan_out}.get(mode, (fan_in + fan_out) / 2.0)

    scale = float(initializer.scale) * fan(local) / fan(shape[0])
    return base(scale=scale, mode=initializer.mode, distribution=initializer.distribution,
                seed=seed if seed is not None else getattr(initializer, "seed", None))


def _shard_seed(initializer, rank):
    """A seed of worker `rank`'s own for a random initializer (one with a
    seed attribute) whose draws would be every worker's: its own integer
    seed, or the op seed TensorFlow derives under a global seed
    (tf.random.set_seed). None where each worker draws apart already (no
    seed anywhere), or for initializers that hold no integer seed."""
    if not hasattr(initializer, "seed") or not hasattr(initializer, "get_config"):
        return None
    seed = initializer.seed
    if seed is None:
        global_seed, op_seed = tf.compat.v1.get_seed(None)
        if global_seed is None:
            return None
        seed = op_seed
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        return None  # a Keras 3 SeedGenerator: its own state
    return (int(seed) * 1000003 + rank + 1) % (2 ** 31 - 1)


class Variable(_ResourceVariable, KerasWeights):
    """A sok embedding table: ``Variable(initial_value, mode="distributed", **tf.Variable kwargs)``.

    initial_value: [rows, dim] of the whole table (or a callable giving it).
      Without it, shape=[rows, dim]
      and initializer= (a Keras / tf initializer or its name) make it.
    mode: "distributed" or "localized:<rank>". The object is a
      DistributedVariable or a LocalizedVariable, as SOK's sok.Variable
      returns; both are sok.Variable subclasses.
    name: any str (a TypeError otherwise), in a graph as eagerly: where a
      graph's ops cannot take it ("表", "a b", "_x"), the variable keeps it
      and only its ops' names have those characters as '_' (_keep_name),
      as a DynamicVariable's do.
    """

    @property
    def path(self):
        """Keras 3 variables have a path (their name in Keras' files); a sok
        table has none. Keras' optimizers and its warning about a missing
        gradient take the name where a variable has none (this
        AttributeError); its legacy .h5 files save weights by path and failed
        with "'DistributedVariable' object has no attribute 'path'"."""
        raise AttributeError(
            f"sok.Variable '{self.name}' has no Keras path: Keras' legacy .h5 files (model.save"
            f"('m.h5'), save_weights('m.h5')) cannot hold a sok table; save with model.save"
            f"('m.keras') or model.save_weights('m.weights.h5'), which keep the table, or "
            f"sok.dump")

    def __new__(cls, initial_value=None, mode="distributed", *args, **kwargs):
        if cls is Variable:
            cls = LocalizedVariable if _is_localized(mode) else DistributedVariable
        comm = context.active()
        if replica_shards.replicates(comm) and callable(initial_value):
            # one whole table for every replica's shard
            kwargs = dict(kwargs)
            initial_value = _whole_value(initial_value, kwargs)
        shards = replica_shards.replicate(cls, (initial_value, mode) + args, kwargs, comm)
        return shards if shards is not None else super().__new__(cls)

    def __init__(self, initial_value=None, mode="distributed", *args, **kwargs):
        comm = context.communicator("creating a sok.Variable")
        self._sok_mode, self._sok_target_rank = placement.parse_mode(mode, comm.world_size)
        self._sok_world_size, self._sok_rank = comm.world_size, comm.rank
        # An initializer (or a callable initial_value) runs where TensorFlow
        # makes a variable's initial value: outside a tf.function or Keras
        # build being traced (a table made in a layer's build() under
        # model.fit). Its rows made in the traced graph could not be lifted
        # out of it ("initial_value ... could not be lifted out of a
        # tf.function"), where tf.Variable and Keras' add_weight work.
        with tf.init_scope():
            if initial_value is None and kwargs.get("initializer") is not None and \
                    comm.world_size > 1:
                # shape= and initializer=: each worker makes only its own rows.
                shape, value = _shard_from_initializer(kwargs, self.placement)
            else:
                value = _whole_value(initial_value, kwargs)
                shape = tuple(tf.TensorShape(np.shape(value) if not isinstance(value, tf.Tensor)
                                             else value.shape).as_list())
                if comm.world_size > 1 and len(shape) == 2:
                    value = placement.shard_of(value, *self.placement)
        if len(shape) != 2:
            raise ValueError(
                f"initial_value must be a [rows, dim] matrix; got shape {list(shape)}"
            )
        self._sok_global_shape = tf.TensorShape(shape)
        name = kwargs.get("name")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str or None; got {type(name).__name__} {name!r}")
        with tf.init_scope():  # where TensorFlow makes the variable's ops
            in_graph = not tf.executing_eagerly()
        scope = None
        if in_graph and name is not None and scope_name(name) != name:
            kwargs = dict(kwargs, name=scope_name(name))
            scope = kwargs["name"]
        with comm.table_scope():
            super().__init__(initial_value=value, *args, **kwargs)
        self._sok_op_name = None
        if scope is not None:
            self._keep_name(name, scope)
        register(self)

    def _keep_name(self, name, scope):
        """Gives the variable the name it was asked for, `name`, where a
        graph's ops took it as `scope` (scope_name's): TensorFlow refuses
        an op name of other characters than letters, digits and "_.-/", or
        starting with "_", so sok.Variable(..., name="表") failed in a
        Session's graph (with "not a valid root scope name", naming no
        argument) although it worked eagerly, as a DynamicVariable's does.
        The name keeps the graph's name scope, and a variable of the graph
        named so already gives it the suffix TensorFlow would ("outer/表_1");
        the ops keep `scope`'s form, which _shared_name gives (for slot
        variables' names, and tf.compat.v1.train.Saver saves the variable
        under its op's name)."""
        op_name = self._handle_name[:-len(":0")]
        found = re.match(r"\A(.*/)?" + re.escape(scope) + r"(_\d+)?\Z", op_name)
        if found is None:
            return
        graph = self.handle.graph
        taken = {v.name for key in (tf.compat.v1.GraphKeys.GLOBAL_VARIABLES,
                                    tf.compat.v1.GraphKeys.LOCAL_VARIABLES)
                 for v in graph.get_collection(key) if v is not self}
        base = (found.group(1) or "") + name
        kept, k = base, 0
        while f"{kept}:0" in taken:
            k += 1
            kept = f"{base}_{k}"
        self._sok_op_name = op_name
        self._handle_name = f"{kept}:0"

    @property
    def _shared_name(self):
        """The name of the variable's ops (without ":0"): its name, but for
        a name kept in a graph whose ops could not take it (_keep_name)."""
        if getattr(self, "_sok_op_name", None) is not None:
            return self._sok_op_name
        return super()._shared_name

    @property
    def mode(self):
        return self._sok_mode if self._sok_target_rank is None else (
            f"localized:{self._sok_target_rank}")

    @property
    def target_gpu(self):
        """The worker holding a localized table; -1 for distributed ones (SOK's name)."""
        return -1 if self._sok_target_rank is None else self._sok_target_rank

    @property
    def global_shape(self):
        """Shape of the whole table across workers."""
        return self._sok_global_shape

    @property
    def num_gpus(self):
        """The number of workers the table is placed over (SOK's name)."""
        return self._sok_world_size

    @property
    def global_gpu_id(self):
        """This worker's rank (SOK's name)."""
        return self._sok_rank

    def key_map(self, indices):
        """The local row numbers, in their owner's shard, of global row ids
        `indices` (SOK's name): id // workers for a distributed table, the
        ids themselves for a localized one."""
        return placement.local_rows(self, indices)

    @property
    def is_sok_variable(self):
        return True

    table_kind = STATIC  # what sok_graph/tables/__init__.py asks

    @property
    def dimension(self):
        """The width of the table's rows."""
        return int(self._sok_global_shape[1])

    def row_count(self):
        """The number of rows this shard holds (an int64 scalar; the table
        protocol, sok_graph/tables/__init__.py)."""
        return tf.shape(self, out_type=tf.int64)[0]

    def export_chunk(self, offset, limit, updated_after=None):
        """(global row numbers, rows, next_offset) of this shard's local rows
        [offset, offset + limit) (the table protocol). A static table keeps
        no write times: updated_after must be None."""
        if updated_after is not None:
            raise ValueError("a sok.Variable keeps no write times: updated_after applies to "
                             f"sok.DynamicVariable only; got updated_after={updated_after!r}")
        offset = tf.cast(offset, tf.int64)
        end = tf.minimum(offset + tf.cast(limit, tf.int64), self.row_count())
        local = tf.range(offset, tf.maximum(end, offset), dtype=tf.int64)
        return placement.global_rows(self, local), tf.gather(self, local), end

    # What dump, load and the Saver ask (sok_graph/tables/__init__.py).
    key_dtype = tf.int64  # keys are global row numbers
    key_metadata = ()  # no write times or use counts are kept
    admission = None  # every row exists from the start: none is admitted
    replace_can_fail = False  # replace_rows assigns in place

    @property
    def fixed_rows(self):
        """The rows of the whole table (each row number below it exists on
        its owner)."""
        return int(self._sok_global_shape[0])

    def row_limit(self):
        """This shard's own rows, which it holds and never more (an int64
        scalar: a constant, not a read, so that a load, whose assignments
        need no initialized variable, can check it on one not initialized)."""
        return tf.constant(self._local_rows(), tf.int64)

    def _local_rows(self):
        return placement.shard_rows(self.fixed_rows, *self.placement)

    def read_all(self):
        """(global row numbers, rows, {}) of every row this shard holds: a
        static table keeps no per-key metadata."""
        keys, rows, _ = self.export_chunk(0, 1 << 62)
        return keys, rows, {}

    def read_slot(self, slot, keys, initial_value):
        """The rows of optimizer slot `slot` (make_slot's: one row per row of
        this shard) for global row numbers `keys`; every row has its slot
        row, so initial_value is never needed."""
        del initial_value
        keys = self._integer_keys(keys, "read_slot")
        with tf.control_dependencies(self._own_keys(keys, "read_slot", distinct=False)):
            return tf.gather(slot, placement.local_rows(self, keys))

    def replace_rows(self, keys, rows):
        """This shard holds `rows` afterwards. A static shard can neither
        drop nor add rows, so `keys` are every one of its global row numbers
        in local order, as export_chunk gives them; ValueError (or, for keys
        known only when the graph runs, a failing assertion) otherwise. An
        assignment in place: it needs no initialized variable."""
        return self._replace(self, keys, rows, "replace_rows")

    def replace_slot(self, slot, keys, rows):
        """replace_rows for optimizer slot `slot` (make_slot's)."""
        return self._replace(slot, keys, rows, "replace_slot")

    def _replace(self, target, keys, rows, method):
        # The keys first: a wrong key list is the likelier cause of rows of
        # the wrong count.
        keys = self._integer_keys(keys, method)
        checks = self._every_row(keys, method)
        rows = self._checked_rows(rows, self._local_rows(), method)
        with tf.control_dependencies(checks):
            return target.assign(rows)

    # A replica's shard saves no rows of its own in a checkpoint: its
    # ReplicaShards saves the whole table (replica_shards.py).
    def _serialize_to_tensors(self):
        if held_by(self, "_replica_holder"):
            return {}
        # "VARIABLE_VALUE-shard<r>of<w>" for a worker process's shard
        # (checkpoint_tag); tf.compat.v1.train.Saver names variables
        # itself (_gather_saveables_for_checkpoint: each worker its own
        # checkpoint, as sok.CollectiveStrategy writes them).
        tag = checkpoint_tag(self)
        return {name + tag: t for name, t in super()._serialize_to_tensors().items()}

    def _restore_from_tensors(self, restored_tensors):
        return super()._restore_from_tensors(untagged(restored_tensors, self))

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        note_save_type(self, save_type)
        return super()._trackable_children(save_type, **kwargs)

    def _gather_saveables_for_checkpoint(self):
        if held_by(self, "_replica_holder"):
            return {}
        return super()._gather_saveables_for_checkpoint()

    @property
    def _label(self):
        """How errors name this table."""
        return f"sok.Variable {self.name}"

    def _integer_keys(self, keys, method):
        """keys as an int64 vector of global row numbers; TypeError (or
        ValueError for another rank) naming the method and what it got,
        instead of TensorFlow's message about an op's attribute (or, in
        replace_rows, float keys compared as numbers and taken)."""
        keys = tf.convert_to_tensor(keys)
        if keys.dtype not in (tf.int32, tf.int64):
            raise TypeError(f"sok.Variable {self.name}: {method} takes keys of int32 or int64 "
                            f"global row numbers; got keys of dtype {keys.dtype.name}")
        if keys.shape.rank is not None and keys.shape.rank != 1:
            raise ValueError(f"sok.Variable {self.name}: {method} takes keys as a vector of "
                             f"global row numbers; got keys of shape {keys.shape}")
        return tf.cast(keys, tf.int64)

    def _checked_rows(self, rows, count, method):
        """rows as a [count, dim] tensor of the table's dtype (count: an int,
        or a scalar tensor where the keys are known only when the graph
        runs). A ValueError or TypeError names the method, the argument and
        what it got: on the CPU TensorFlow's scatter writes rows [n, dim + 1]
        into the table without a word (each row spilling into the next), and
        integer rows were cast to floats."""
        dtype = tf.as_dtype(self.dtype).base_dtype
        rows = rows_of_dtype(rows, dtype, self._label, method, f"the table's dtype {dtype.name}")
        dim = self.dimension
        shape = rows.shape
        if shape.rank is not None and (
                shape.rank != 2 or tf.compat.dimension_value(shape[1]) not in (None, dim) or
                (isinstance(count, int) and tf.compat.dimension_value(shape[0]) not in
                 (None, count))):
            want = f"[{count}, {dim}]" if isinstance(count, int) else f"[len(keys), {dim}]"
            raise ValueError(f"sok.Variable {self.name}: {method} takes rows of shape {want} "
                             f"(one row of the table's dimension {dim} per key); got rows of "
                             f"shape {shape}")
        if isinstance(count, int) and shape.is_fully_defined():
            return rows
        check = tf.debugging.assert_equal(
            tf.shape(rows, out_type=tf.int64), tf.stack([tf.cast(count, tf.int64),
                                                         tf.constant(dim, tf.int64)]),
            message=f"sok.Variable {self.name}: {method} takes rows [len(keys), {dim}] (one "
                    f"row of the table's dimension per key); the shape of rows and the "
                    f"expected one are")
        with tf.control_dependencies([check]):
            return tf.identity(rows)

    def _own_keys(self, keys, method, distinct=True):
        """[] where the int64 `keys` are global row numbers this shard holds
        (and, with distinct, none twice), checked now where they are known;
        else the assertion that checks them when the graph runs. A key of
        another shard would otherwise name some row of this one (its local
        row number is id // workers), a key past the table's rows fail in
        TensorFlow's scatter or gather without naming the table, and a
        repeated key leave one of its rows, which one unsaid."""
        rows = self.fixed_rows
        world_size, rank, _ = self.placement
        known = tf.get_static_value(keys)
        if known is not None:
            known = np.asarray(known, np.int64).reshape([-1])
            outside = known[(known < 0) | (known >= rows)]
            if outside.size:
                raise ValueError(f"sok.Variable {self.name}: {method} takes keys in [0, {rows}) "
                                 f"(the table's global row numbers); got key {int(outside[0])}")
            foreign = known[~placement.owned_mask(self, known)]
            if foreign.size:
                raise ValueError(
                    f"sok.Variable {self.name}: {method} takes keys of rows this shard holds "
                    f"(worker {rank} of {world_size}); got key {int(foreign[0])}, which worker "
                    f"{int(placement.owner_of(self, foreign[:1])[0])} holds")
            return repeated_key_checks(keys, self._label, method) if distinct else []
        bad = tf.logical_or(keys < 0, keys >= rows)
        if world_size > 1:
            bad = tf.logical_or(bad, tf.not_equal(placement.owner_of(self, keys), rank))
        checks = [tf.debugging.Assert(
            tf.logical_not(tf.reduce_any(bad)),
            [f"sok.Variable {self.name}: {method} takes keys in [0, {rows}) that this shard "
             f"(worker {rank} of {world_size}) holds; got", tf.boolean_mask(keys, bad)])]
        if distinct:
            checks += repeated_key_checks(keys, self._label, method)
        return checks

    def _every_row(self, keys, method):
        """[] where `keys` are this shard's global row numbers in local order
        (checked now where they are known); else, for keys known only when
        the graph runs, the assertion that checks them then."""
        count = self._local_rows()
        known = tf.get_static_value(keys) if tf.is_tensor(keys) else np.asarray(keys)
        if known is None:
            want = placement.global_rows(self, tf.range(count, dtype=tf.int64))
            return [tf.debugging.assert_equal(
                tf.cast(keys, tf.int64), want,
                message=f"sok.Variable {self.name}: {method} takes every global row number of "
                        f"this shard in local order")]
        want = placement.global_rows(self, np.arange(count, dtype=np.int64))
        if np.shape(known) != (count,) or not np.array_equal(known, want):
            raise ValueError(
                f"sok.Variable {self.name}: {method} takes every one of this shard's {count} "
                f"global row numbers in local order (as export_chunk gives them; a static "
                f"table can neither drop nor add rows); got {np.size(known)} keys that are "
                f"not those")
        return []

    def import_rows(self, keys, rows):
        """Writes `rows` for global row numbers `keys` of this shard; every
        other row stays. Keys must be distinct global row numbers of rows
        this shard holds, and rows [len(keys), dim] of the table's dtype:
        ValueError or TypeError now, or a failing assertion when the keys
        are known only when the graph runs, and nothing is written."""
        keys = self._integer_keys(keys, "import_rows")
        checks = self._own_keys(keys, "import_rows")
        count = tf.compat.dimension_value(keys.shape[0])
        rows = self._checked_rows(rows, count if count is not None else tf.size(keys),
                                  "import_rows")
        with tf.control_dependencies(checks):
            local = tf.identity(placement.local_rows(self, keys))
        return self.scatter_update(tf.IndexedSlices(rows, local))

    def global_ids(self, ids):
        """The global row numbers of this shard's local row numbers `ids`
        (key_map's inverse)."""
        ids = tf.convert_to_tensor(ids)
        if ids.dtype not in (tf.int32, tf.int64):
            raise TypeError(f"sok.Variable {self.name}: global_ids takes int32 or int64 local "
                            f"row numbers; got ids of dtype {ids.dtype.name}")
        return placement.global_rows(self, ids)

    def make_slot(self, name, initial_value, start=None):
        """An optimizer slot of this shard (sok_graph/tables/__init__.py): a variable of
        its shape, from `start` (rows a native optimizer kept) or filled with
        `initial_value`; a plain resource variable while a replica's shard is
        built."""
        if start is None:
            start = tf.fill(tf.shape(self), tf.cast(initial_value, self.dtype))
        if tf.distribute.has_strategy() and replica_shards.building_rank() is None:
            # A worker process's shard under a multi-worker strategy: the
            # strategy's variable creator made the slot a mirrored variable,
            # its value broadcast from worker 0 (a shard of another shape
            # failed in CollectiveBcastSend, naming neither table nor slot).
            return compat.resource_variable_class()(start, trainable=False,
                                                    name=f"{self._shared_name}/{name}")
        return replica_shards.new_variable(start, trainable=False,
                                           name=f"{self._shared_name}/{name}")

    @property
    def placement(self):
        """Where rows live: (world_size, rank, fixed_owner), the triple
        sok_graph/placement.py reads (fixed_owner -1: distributed)."""
        owner = -1 if self._sok_target_rank is None else self._sok_target_rank
        return self._sok_world_size, self._sok_rank, owner


class DistributedVariable(Variable):
    """A sok.Variable with mode="distributed" (what SOK's sok.Variable
    returns for that mode): global row i on worker i % N."""

    def __init__(self, initial_value=None, mode="distributed", *args, **kwargs):
        if _is_localized(mode):
            raise ValueError(f"a DistributedVariable has mode='distributed'; got {mode!r} "
                             f"(use sok.Variable or sok.LocalizedVariable)")
        super().__init__(initial_value, mode, *args, **kwargs)


class LocalizedVariable(Variable):
    """A sok.Variable with mode="localized:<rank>" (what SOK's sok.Variable
    returns for that mode): every row on worker <rank>. Made directly,
    ``LocalizedVariable(value, mode="localized:0")``."""

    def __init__(self, initial_value=None, mode="distributed", *args, **kwargs):
        if not _is_localized(mode):
            raise ValueError(f"a LocalizedVariable needs mode='localized:<rank>'; got {mode!r}")
        super().__init__(initial_value, mode, *args, **kwargs)


def is_sok_variable(value):
    """True for sok.Variable and sok.DynamicVariable (both say so)."""
    return getattr(value, "is_sok_variable", False) is True
