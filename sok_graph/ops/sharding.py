"""The sharding ops (tf_ops/sharding): ids grouped by owning worker, local
rows, the sender's routing of keys that name their table, and an owner's
read of several tables for such keys.

Distributed tables: global row i lives on worker i % world_size as local row
i // world_size. Localized tables: all rows on one worker (``fixed_owner``).
"""

import collections
import contextlib

import numpy as np
import tensorflow as tf

from sok_graph.compat import IndexedSlices, register_gradient
from sok_graph.ops import library
from sok_graph.ops import util as util_ops
from sok_graph.ops.lookup import table_dtype, table_input, table_shape

def count_argument(value, what, least):
    """`value` as an int, or a ValueError naming `what` where it is no
    integer >= least: int() cut 2.5 workers to 2 and took True as 1,
    without an error (an owner computed for another world size)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < least:
        raise ValueError(f"{what} must be an int >= {least}; got {value!r}")
    return int(value)


Buckets = collections.namedtuple(
    "Buckets", ["ids", "sizes", "permutation", "inverse_permutation"]
)


def bucketize_by_owner(ids, world_size, fixed_owner=-1, name=None, non_negative=False):
    """Groups ids [n] by owning worker, stable within a group.

    Returns Buckets(ids=ids[permutation], sizes=[world_size] int64,
    permutation, inverse_permutation); ``tf.gather(rows, inverse_permutation)``
    puts rows fetched in bucket order back in input order. A negative id is
    an error, unless non_negative=True says the ids cannot be negative (the
    GPU kernel then does not read its check back: no wait for the device).
    """
    out = library.load().sok_bucketize_by_owner(
        ids, world_size=count_argument(world_size, "world_size", 1),
        fixed_owner=count_argument(fixed_owner, "fixed_owner", -1),
        check_negative=not non_negative, name=name
    )
    return Buckets(*out)


def local_rows(ids, world_size, name=None):
    """id // world_size: the row an id occupies in its owner's shard."""
    return library.load().sok_local_rows(
        ids, world_size=count_argument(world_size, "world_size", 1), name=name)


Route = collections.namedtuple("Route", ["keys", "sizes", "slots"])


def route_grouped_keys(ids, tables, num_tables, world_size, fixed_owner=-1, name=None):
    """The sender's side of a grouped exchange in one op, for row ids [n]
    (int64) of the tables `tables` [n] names among num_tables: the distinct
    keys id * num_tables + table, grouped by owning worker and written as
    their owners read them. Returns Route(keys [n]: the d distinct keys
    first, -1 after them; sizes [world_size]: how many go to each worker,
    adding up to d; slots [n]: where each id's key is among `keys`). On a GPU
    the op does not wait for the device. See SokRouteGroupedKeys."""
    out = library.load().sok_route_grouped_keys(
        ids, tables, num_tables=count_argument(num_tables, "num_tables", 1),
        world_size=count_argument(world_size, "world_size", 1),
        fixed_owner=count_argument(fixed_owner, "fixed_owner", -1), name=name)
    return Route(*out)


def grouped_gather(tables, keys, table_sizes, table_names=None, distinct=False, padded=False,
                   name=None):
    """Rows [n, dim] of T tables for keys [n] (int64, >= 0) that name their
    table: key k reads row k // T of tables[k % T]. One op for all tables.

    tables:      T tables of one dtype and dimension: resource variables (read
                 in place) or tensors
    table_sizes: int64 [T], how many keys name each table: the gradient
                 sizes its outputs from it (in host memory: a copy queued as
                 soon as it is computed, long before the gradient runs; the
                 GPU forward does not read it)
    distinct:    the keys are known to be distinct (the exchange's are): each
                 table's gradient indices are then marked so
                 (util.mark_distinct), and a sparse optimizer skips its own
                 dedup of them
    padded:      the keys end in padding not counted by table_sizes (the -1s of
                 util.unique_padded): a key that names no row reads a zero
                 row, with no error, and gets no gradient
    The gradient of table t is an IndexedSlices of its keys' rows (k // T) in
    their order among keys.
    """
    handles = [table_input(t) for t in tables]
    dtypes = {table_dtype(t, h) for t, h in zip(tables, handles)}
    if len(dtypes) != 1:
        raise TypeError(f"tables must have one dtype; got {sorted(d.name for d in dtypes)}")
    return library.load().sok_grouped_gather(
        params=handles, keys=keys, table_sizes=table_sizes, num_tables=len(handles),
        T=dtypes.pop(), table_names=list(table_names) if table_names else [],
        distinct_keys=bool(distinct), padded_keys=bool(padded), name=name)


@register_gradient("SokGroupedGather")
def _grouped_gather_grad(op, grad):
    count = op.get_attr("num_tables")
    params, keys, sizes = op.inputs[:count], op.inputs[count], op.inputs[count + 1]
    # Variables are read in place when the forward runs: the gradient, and
    # so the tables' update, waits for that read (util_ops.after_read).
    in_place = any(p.dtype == tf.resource for p in params)
    with util_ops.after_read(op) if in_place else contextlib.nullcontext():
        padded = op.get_attr("padded_keys")
        if padded:
            # Padding (a negative key) groups after the last table, where
            # the gradient op, told how many keys each table has, stops.
            table_of = tf.where(keys < 0, tf.fill(tf.shape(keys), tf.constant(count, tf.int64)),
                                tf.math.floormod(keys, count))
            by_table = bucketize_by_owner(table_of, count + 1, non_negative=True)
        else:
            # Keys passed the senders' range checks: never negative.
            by_table = bucketize_by_owner(keys, count, non_negative=True)
        indices, values = library.load().sok_grouped_gather_grad(
            keys=keys, grads=tf.convert_to_tensor(grad), permutation=by_table.permutation,
            table_sizes=sizes, num_tables=count, padded_keys=padded)
    if op.get_attr("distinct_keys"):
        indices = [util_ops.mark_distinct(i) for i in indices]
    grads = [IndexedSlices(values[t], indices[t], table_shape(params[t])) for t in range(count)]
    return grads + [None, None]
