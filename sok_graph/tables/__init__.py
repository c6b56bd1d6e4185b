"""The table kinds, one module each, and what every table answers whatever
its kind (this module: the one place the rest of the package asks it).

- static.py: sok.Variable, rows by row number (sharded or localized);
- dynamic.py: sok.DynamicVariable, a hash table by key, with its admission
  filters in admission.py;
- replica_shards.py: the holder of every replica's shard when one process's
  replicas are the workers.

This module imports none of them, so each may import it. A table kind
answers itself:

- `table_kind`: STATIC or DYNAMIC;
- `dimension`: the width of its rows;
- `make_slot(name, initial_value, start=None)`: an optimizer slot that
  follows the table (same rows or keys, placement, memory split; a dynamic
  table's slots drop the keys it evicts);
- `row_count()` and `export_chunk(offset, limit, updated_after=None)`: the
  rows this shard holds, read in chunks as (keys, rows, next offset): keys
  are a dynamic table's keys or a static table's global row numbers;
  updated_after (a dynamic table's write times) keeps only rows written
  since. sok.export, serving exports and deltas read tables this way.

What dump, load and the Saver ask besides (dump_load.py, v1/saver.py);
keys are always those export_chunk gives:

- `key_dtype`: the dtype of its keys (int64, a static table's row numbers;
  key_type for a dynamic table);
- `key_metadata`: the names of what it keeps per key besides the row, as
  read_all gives them and replace_rows takes them: ("timestamps",
  "frequencies") for a dynamic table (last write in UTC microseconds, use
  count), () for a static one;
- `fixed_rows`: the rows of the whole table where they are fixed (static:
  every row number below it exists, on its owner); None where keys come and
  go (dynamic);
- `row_limit()`: the most rows this shard can hold, an int64 scalar (a
  dynamic table's max_capacity, or the most any table holds; a static
  shard's own rows);
- `admission`: the filter that decides which new keys get rows
  (admission.py), or None;
- `read_all()`: (keys, rows, {name: per-key tensor, for each of
  key_metadata}) of every row this shard holds, in one read;
- `read_slot(slot, keys, initial_value)`: the rows of `keys` in an
  optimizer slot that make_slot made; initial_value where the slot has none;
- `replace_rows(keys, rows, **metadata)`: the shard holds exactly these
  afterwards (a static shard, which can neither drop nor add rows, takes
  every one of its row numbers, in the order export_chunk gives them);
  `replace_slot(slot, keys, rows)` does the same to one of its slots;
- `replace_can_fail`: whether replace_rows can still fail once the rows
  are known to fit (a dynamic table builds a new table, which may not fit
  in memory; a static one assigns in place): a load replaces those first
  and puts them back when a later one fails;
- `import_rows(keys, rows)`: `rows` written for `keys`, every other row
  kept (keys distinct, and for a static shard rows it holds; rows
  [len(keys), dimension] of floats: anything else is an exception naming
  the argument, and nothing is written);
- `key_map(ids)` (SOK's name) and `global_ids(ids)`: from keys to the
  shard's own numbering and back (a static shard numbers its rows 0..n-1;
  a dynamic table's keys stay keys), in which the Saver writes a shard.

Lookups and optimizers also take plain tf.Variables, which answer here as
static tables of their own shape (kind_of, dimension_of and
key_metadata_of answer for them); dump, load and the Saver take sok
tables only. A ReplicaShards (one process's replicas, each holding a
shard) is a holder, not a table: callers resolve it to its shard first
(replica_shards.resolve / shards_of), and it answers no kind.

Serving tables (serving/tables.py: StaticTable, DynamicTable, the plain
variables of a servable model) answer the read part only: `dimension`,
`dtype`, `key_dtype`, `row_count()` and `export_chunk` as above (keys: a
StaticTable's row numbers, int64; a DynamicTable's keys, ascending). They
keep no write times, so they refuse updated_after, as a static table does.
They say no `table_kind`, on purpose: the kind picks the training code
path, and every reader of it expects the whole protocol or more. With
DYNAMIC, is_dynamic would send a serving DynamicTable to code that needs
a hash-table handle (sok.assign, the optimizer's fused update, the lookup's
find-or-insert); with STATIC, a StaticTable (a tf.Module, not a variable)
would go where a resource variable is read or updated in place (the fused
lookup and sparse-apply ops). So is_dynamic is False for both, and they
name their kind as `kind` (the word a served model's manifest records).
kind_of would call either one static; no caller asks it about one: dump,
load, the Saver and the serving exports take sok tables only
(is_sok_variable), and a lookup in serving mode turns to the serving path
before any kind is asked.

Modules ask these rather than naming the class, and `is_dynamic(var)`
where only the kind matters, so a new kind of dynamic table (tiered,
filtered) that answers them is served by the same code paths.
"""

import itertools
import weakref

import numpy as np
import tensorflow as tf

from sok_graph import context

STATIC = "static"
DYNAMIC = "dynamic"

# Every sok table the process holds (each kind registers itself when made),
# by id, weakly: export_serving_delta asks which live tables share a name.
# (A dict of weak references: tf.Variable subclasses are unhashable.)
_LIVE = {}
# Called with each table registered: what must see the classes a script
# imported after sok_graph (v1/optimizers.py: tf_keras' optimizers).
_ON_REGISTER = []


def on_register(callback):
    """callback(table) runs for every table registered from now on."""
    _ON_REGISTER.append(callback)


# How many tables the process has made (made_order).
_MADE = itertools.count()


def register(table):
    """Counts `table` among the live tables until it is collected."""
    for callback in _ON_REGISTER:
        callback(table)
    table._sok_made_order = next(_MADE)
    key = id(table)

    def forget(ref):
        if _LIVE.get(key) is ref:
            del _LIVE[key]

    _LIVE[key] = weakref.ref(table, forget)


def made_order(table):
    """The number of tables the process made before `table` (-1 for what
    is no sok table): workers that make the same tables in the same order
    give each the same number, whatever its name."""
    return getattr(table, "_sok_made_order", -1)


def live_tables():
    """The sok tables of the process not yet collected (a ReplicaShards and
    each of its shards alike)."""
    return [t for t in (r() for r in list(_LIVE.values())) if t is not None]


def checkpoint_tag(var):
    """What a worker process's shard of a table sharded over worker
    processes adds to the names of its tensors in a tf.train.Checkpoint
    (TensorFlow 2.11's _serialize_to_tensors; a name-based
    tf.compat.v1.train.Saver keeps the plain names, one file per worker as
    sok.CollectiveStrategy writes them): "-shard<rank>of<world>" ("" for a
    table this process holds whole, and for the shards of a MirroredStrategy's
    replicas, whose ReplicaShards saves the whole table). Each
    worker saves only its shard: named alike, a checkpoint read on another
    worker (the chief's, which MultiWorkerMirroredStrategy's pattern has
    every worker restore) or by another number of workers gave each worker
    another's rows, or half the keys, without an error; named apart,
    TensorFlow says the shard's tensors are not in that checkpoint. Whole
    tables go through sok.dump / sok.load (or sok.Saver) instead."""
    world, rank, _ = var.placement
    comm = context.active()
    if world <= 1 or comm is None or comm.in_process or getattr(var, _SAVED_MODEL, False):
        return ""
    return f"-shard{rank}of{world}"


# Whether the last save that gathered a table was a SavedModel's: its
# loader makes plain variables, which read the plain names (a served
# model of a worker's shard failed to load with "VARIABLE_VALUE not found
# in checkpoint"). TensorFlow asks every object it saves for its children,
# with the save's kind, before it serializes it.
_SAVED_MODEL = "_sok_gathered_for_saved_model"


def note_save_type(var, save_type):
    """Called from a table's _trackable_children: remembers whether this
    save is a SavedModel's (checkpoint_tag)."""
    setattr(var, _SAVED_MODEL, str(getattr(save_type, "value", save_type)) == "savedmodel")


def untagged(tensors, var):
    """A checkpoint's tensors of `var` by their names without
    checkpoint_tag (a ReplicaShards hands its shards untagged ones)."""
    tag = checkpoint_tag(var)
    if not tag:
        return dict(tensors)
    return {name.replace(tag, "", 1) if tag in name else name: t
            for name, t in tensors.items()}


def kind_of(var):
    """"dynamic" or "static" (a plain tf.Variable is static); None for what
    is no table (a ReplicaShards holder)."""
    kind = getattr(var, "table_kind", None)
    if kind is not None:
        return kind
    return None if getattr(var, "shards", None) is not None else STATIC


def is_dynamic(var):
    """Whether `var` is itself a dynamic table (keys hashed to rows)."""
    return getattr(var, "table_kind", None) == DYNAMIC


def dimension_of(var):
    """The width of the table's rows (its last dimension for a plain
    tf.Variable; None where that is not known)."""
    dim = getattr(var, "dimension", None)
    if dim is None:
        dim = var.shape[-1]
        dim = getattr(dim, "value", dim)  # TF 1.x's Dimension
    return None if dim is None else int(dim)


def key_metadata_of(var):
    """What `var` keeps per key besides its row (key_metadata): () for a
    plain tf.Variable, or for anything else that is no sok table."""
    return tuple(getattr(var, "key_metadata", ()))


def rows_of_dtype(rows, dtype, label, method, dtype_words):
    """`rows` handed to a table's import or replace as a tensor of the
    table's `dtype`: a tensor or variable of exactly that dtype, or an array
    of floats (converted). A TypeError otherwise, "<label>: <method> takes
    rows of <dtype_words>; got ...": integer rows would be cast without a
    word. Each kind checks the shape itself (its own words)."""
    if tf.is_tensor(rows) or isinstance(rows, tf.Variable):
        if tf.as_dtype(rows.dtype).base_dtype != dtype:
            raise TypeError(f"{label}: {method} takes rows of {dtype_words}; got rows of dtype "
                            f"{rows.dtype.name}")
        return tf.convert_to_tensor(rows)
    array = np.asarray(rows)
    if not is_float_dtype(array.dtype):
        raise TypeError(f"{label}: {method} takes rows of floats ({dtype_words}); got rows of "
                        f"dtype {array.dtype}")
    beyond = _beyond_dtype(array, dtype)
    if beyond:
        raise ValueError(f"{label}: {method} takes rows of {dtype_words}; got {beyond}")
    return tf.convert_to_tensor(array, dtype)


def is_float_dtype(dtype):
    """Whether numpy dtype `dtype` holds rows: a numpy float, or bfloat16
    (which numpy files under kind "V", not as a float)."""
    return dtype.kind == "f" or dtype == np.dtype(tf.bfloat16.as_numpy_dtype)


def overflow_at(array, target):
    """(index of the first finite value of numpy `array` that numpy dtype
    `target` makes infinite, or None; `array` as `target`). Rounding is
    fine; inf where the source held a number is not (numpy's cast only
    warns). Integers too: 70000 is beyond float16's largest finite value."""
    target = np.dtype(target)
    if np.can_cast(array.dtype, target, "safe"):
        return None, array.astype(target, copy=False)  # nothing can overflow
    with np.errstate(over="ignore", invalid="ignore"):
        converted = array.astype(target)
        overflow = np.isfinite(array.astype(np.float64)) & \
            ~np.isfinite(converted.astype(np.float64))
    if not overflow.any():
        return None, converted
    return tuple(int(i) for i in np.argwhere(overflow)[0]), converted


def _beyond_dtype(array, dtype):
    """Where `array` has a finite value that the conversion to tf.DType
    `dtype` would make infinite ("1e+39 at [0, 1], beyond float32's largest
    finite value ...: it would become inf"), else ""."""
    at, _ = overflow_at(array, dtype.as_numpy_dtype)
    if at is None:
        return ""
    return (f"{float(array[at])!r} at {list(at)}, beyond {dtype.name}'s largest finite value "
            f"{float(dtype.max)!r}: it would become inf")


def rows_from_user(rows, dtype, what):
    """Rows a user hands to a table (sok.assign's values, the Saver's
    load_embedding_values) as a tensor of the table's `dtype`. Numbers
    (numpy, lists) are converted, and a finite value that the conversion
    would make infinite is a ValueError naming `what`, as a load refuses it
    (float64 1e39 into a float32 table became inf, without an error); a
    tensor of another dtype is a TypeError naming `what` (TensorFlow's
    "Tensor conversion requested dtype" named no argument)."""
    if isinstance(rows, (tf.Tensor, tf.Variable)):
        if rows.dtype.base_dtype != dtype:
            raise TypeError(f"{what} must be {dtype.name} (the table's dtype); got a "
                            f"{rows.dtype.base_dtype.name} tensor: cast it first")
        return tf.convert_to_tensor(rows)
    array = np.asarray(rows)
    if array.dtype.kind not in "iu" and not is_float_dtype(array.dtype):
        # np.asarray made an object or string array of it: float()'s message
        # ("not 'dict'", "could not convert string") named no argument.
        raise TypeError(f"{what} must be a [rows, dim] array or tensor of numbers; got "
                        f"{type(rows).__name__} (a numpy array of {array.dtype})")
    beyond = _beyond_dtype(array, dtype)
    if beyond:
        raise ValueError(f"{what} holds {beyond} ({dtype.name} is the table's dtype)")
    return tf.convert_to_tensor(array, dtype)


def repeated_key_checks(keys, label, method):
    """[] where no key of `keys` comes twice, checked now where the keys are
    known (a ValueError "<label>: <method> takes each key at most once"
    otherwise); for keys known only when the graph runs, the assertion that
    checks it then. A repeated key would leave one of its rows, which one
    unsaid."""
    known = tf.get_static_value(keys)
    if known is not None:
        values, counts = np.unique(np.asarray(known).reshape([-1]), return_counts=True)
        if (counts > 1).any():
            raise ValueError(f"{label}: {method} takes each key at most once; got key "
                             f"{int(values[counts > 1][0])} {int(counts[counts > 1][0])} times")
        return []
    return [tf.debugging.assert_equal(
        tf.size(tf.unique(keys)[0]), tf.size(keys),
        message=f"{label}: {method} takes each key at most once; the number of distinct keys "
                f"and of keys are")]
