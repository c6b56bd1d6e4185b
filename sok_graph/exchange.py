"""Model-parallel row exchange: the rows of a sharded table for a list of ids.

Forward, for one table and this worker's (already deduplicated) ids:
  bucket the ids by owner → all-to-all of ids → the owner reads its rows
  (gather from its shard, or find-or-insert in its hash table) → all-to-all of
  rows back → un-permute into the caller's order.
Backward is the mirror image, which TensorFlow derives from the forward: the
rows' gradient goes back through the reverse all-to-all, and on the owner the
two-step read (unique of the received ids, read each once, expand) turns the
gradient into one summed row per unique id — an IndexedSlices with no
repeated indices, however many workers asked for the same row.

Several static tables of one lookup (same dtype, dimension and placement)
share one exchange (grouped_static_rows): their ids travel tagged with their
table in one all-to-all, and their rows in one, instead of two all-to-alls
per table. A model with 26 tables then waits on 2 exchanges a step instead
of 52.

Placement (sok_graph/placement.py): a distributed static table holds global
row i on worker i % N as local row i // N; a dynamic table holds key k on
worker k mod N; a localized table holds everything on one worker.
"""

import tensorflow as tf

from sok_graph import placement
from sok_graph.placement import local_rows, owner_of
from sok_graph.ops import sharding as sharding_ops
from sok_graph.ops import util as util_ops


def _read_each_once(ids, read, counted=False, groups=0):
    """read(ids) computed as read(unique ids) expanded, so the gradient that
    reaches the table has one summed row per distinct id. counted: read
    takes each unique id's number of occurrences too; groups > 0: read
    takes the distinct ids padded to the length of `ids` with -1s, and how
    many fall in each of `groups` groups (id mod groups) — a unique that
    does not wait for the device to learn its count."""
    if counted:
        unique, position, occurrences = util_ops.unique_with_counts(ids, out_idx=tf.int64)
        return tf.gather(read(unique, occurrences), position)
    if groups:
        unique, position, _, sizes = util_ops.unique_padded(ids, groups, out_idx=tf.int64)
        rows = read(unique, sizes)
        if rows.dtype != tf.float32:
            # sok's segment sum runs on a GPU for float32 only.
            return tf.gather(rows, position)
        # Its gradient is sok's segment sum by position, one op on the way
        # back to the tables; TensorFlow's gradient of a gather is an
        # IndexedSlices, which the grouped read's gradient made dense again
        # with ~10 ops (shapes, and an atomic segment sum).
        return util_ops.gather_by_position(rows, position)
    unique, position = util_ops.unique(ids, out_idx=tf.int64)
    return tf.gather(read(unique), position)


def _exchange(comm, ids, owner_of, read, name, counted=False):
    """Rows for `ids` [n] whose owners are `owner_of` [n] (values in [0, N)),
    in the order of `ids`: the ids travel to their owners, which answer with
    read(received ids) (counted: read(distinct received ids, their
    occurrences))."""
    with tf.name_scope(name):
        # Owners come from floormod (or a fixed owner): never negative.
        buckets = sharding_ops.bucketize_by_owner(owner_of, comm.world_size, non_negative=True)
        # The bucketing op's sizes add up to the ids it sorted.
        back = _sent_and_answered(comm, tf.gather(ids, buckets.permutation), buckets.sizes, read,
                                  counted=counted)
        return _unpermuted(back, buckets.permutation, buckets.inverse_permutation)


def _sent_and_answered(comm, send, sizes, read, counted=False, groups=0, padded=False):
    """The rows for keys `send` grouped by owner (sizes[w] of them for worker
    w, adding up to the keys sent): the keys travel to their owners, which
    answer with read(received keys) (counted, groups: as _read_each_once
    says); the rows come back in the order sent. padded: `send` goes on
    past the sizes' sum with padding, which stays here."""
    # The sizes add up to the keys (or the keys before the padding), and the
    # reply has a row for each key received: no check of the splits.
    received, received_splits = comm.alltoall(send, sizes, check_splits=False, padded=padded)
    rows = _read_each_once(received, read, counted, groups)
    back, _ = comm.alltoall(rows, received_splits, check_splits=False)
    return back


def _unpermuted(rows, permutation, inverse):
    """tf.gather(rows, inverse) for a permutation `inverse` of the rows, whose
    gradient is a gather of dy by `permutation` (its inverse). TensorFlow's
    own gradient of a gather sums dy into zeros by index, as for any indices:
    on a GPU a fill and an atomic segment sum over every row (0.13 ms of the
    step of a 26-table batch of 8192)."""
    @tf.custom_gradient
    def gather(rows, permutation, inverse):
        def grad(dy):
            return tf.gather(tf.convert_to_tensor(dy), permutation), None, None

        return tf.gather(rows, inverse), grad

    return gather(rows, permutation, inverse)


def _check_world(comm, tables, names=None):
    """placement.check_world of each table, before anything is built."""
    for k, table in enumerate(tables):
        placement.check_world(comm, table, names[k] if names else
                              getattr(table, "name", type(table).__name__))


def static_rows(comm, var, ids, name="sok_exchange"):
    """Rows [n, dim] of global row ids `ids` (int64, each in [0, global rows))
    of a sharded sok.Variable."""
    _check_world(comm, [var])
    return _exchange(comm, local_rows(var, ids), owner_of(var, ids),
                     lambda rows: tf.gather(var, rows), name)


def dynamic_rows(comm, table, keys, name="sok_exchange", low_frequency_filter=False):
    """Rows [n, dim] of `keys` of a sharded sok.DynamicVariable; each owner
    inserts the keys it has not seen (those its admission filter admits; a
    counting filter counts every occurrence, so the caller sends them all)."""
    def read(received, occurrences=None):
        if occurrences is not None:
            return table.read_counted(received, occurrences, low_frequency_filter)
        return table.read_routed(received, low_frequency_filter=low_frequency_filter)

    _check_world(comm, [table])
    counted = table.admission is not None and table.admission.counting
    return _exchange(comm, keys, owner_of(table, keys), read, name, counted)


def grouped_static_rows(comm, tables, ids, table, name="sok_exchange", names=None):
    """(rows [u, dim], positions [n]) for the row ids `ids` (int64 [n]) of
    the tables `table` [n] names among T sharded sok.Variables `tables` of
    one dtype, dimension and placement: the rows of the u distinct (id,
    table) keys (grouped by owner), and where each of the n ids finds its
    row among them. One all-to-all of keys and one of rows serve all T
    tables. The key keeps its table through the exchange; the owner reads
    every table's rows for what it received in one op.

    The ids are checked against their tables by the caller, whose check
    the rows (not the exchange) wait for: until it fails, a bad id travels
    as any other key and reads a zero row (or another row of the group),
    which nothing uses.

    The step waits for the device once here: the all-to-all reads how many
    keys go to each worker. Neither dedup waits: the sender's is part of
    sharding.route_grouped_keys, the owner's (of what it received) is
    util.unique_padded; the outputs of both have the length of their input,
    and their counts stay on the device."""
    count = len(tables)
    _check_world(comm, tables, names)
    world_size, _, fixed_owner = tables[0].placement
    with tf.name_scope(name):
        # One op (SokRouteGroupedKeys) dedups the keys, finds their owners,
        # groups them by owner and writes them as the owners read them,
        # local row * T + t: the ~20 ops of arithmetic, masks and gathers it
        # replaced were a chain on every step's way to its first all-to-all,
        # each a turn of the executor's (the multi-GPU step is bound by the
        # host: bench/RESULTS.md). The padding past the distinct keys goes
        # to nobody.
        route = sharding_ops.route_grouped_keys(ids, table, count, world_size, fixed_owner)

        def read(received, per_table):
            # One op reads every table's rows (SokGroupedGather), in the
            # order received; per_table, the distinct keys of each table
            # counted by the unique that made them (host memory on a GPU),
            # lets its gradient size each table's rows without a wait. A
            # gather per table and a sort by table instead cost ~200 ops of
            # every replica's step with 26 tables.
            return sharding_ops.grouped_gather(tables, received, per_table, names,
                                               distinct=True, padded=True)

        with tf.name_scope("rows"):
            # The rows stay in the order they came back in (by owner); each
            # id finds its row through its slot, a gather of ids instead of a
            # gather of the rows into key order (and another of their
            # gradient back).
            rows = _sent_and_answered(comm, route.keys, route.sizes, read, groups=count,
                                      padded=True)
        return rows, route.slots
