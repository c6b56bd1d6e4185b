"""Where a sharded table's rows live: the placement rule, stated once.

A table is placed over N workers in one of two ways (SOK's modes):
  distributed     global row (or key) i lives on worker i mod N, as local
                  row i div N of that worker's shard (keys of a dynamic
                  table stay keys);
  localized:<r>   every row lives on worker r, at its global row number.

A sok table describes its placement as the triple `var.placement` =
(world_size, rank, fixed_owner): fixed_owner is -1 for a distributed table
and r for a localized one. Everything that needs the rule asks this module:
the lookup's exchange (TensorFlow form), load and the savers (numpy form),
the initial values of shards and the assembly of whole tables. The C++
bucketing op (tf_ops/sharding) applies the same rule inside the graph; its
tests compare it with this module.
"""

import numpy as np
import tensorflow as tf

DISTRIBUTED = "distributed"
LOCALIZED_PREFIX = "localized:"


def parse_mode(mode, world_size):
    """("distributed", None) or ("localized", rank) from a mode string; None
    is SOK's default, "distributed" (sok.Variable(..., mode=None) was a
    TypeError, a DynamicVariable's mode=None was taken)."""
    if mode is None:
        return DISTRIBUTED, None
    if not isinstance(mode, str):
        raise TypeError(f"mode must be a string; got {mode!r}")
    if mode == DISTRIBUTED:
        return DISTRIBUTED, None
    if mode.startswith(LOCALIZED_PREFIX):
        text = mode[len(LOCALIZED_PREFIX):]
        try:
            rank = int(text)
        except ValueError:
            rank = None
        if rank is None or not 0 <= rank < world_size:
            raise ValueError(
                f"mode={mode!r}: the rank after 'localized:' must be an integer in "
                f"[0, {world_size}) (the number of workers)"
            )
        return "localized", rank
    raise ValueError(
        f"mode must be 'distributed' or 'localized:<rank>'; got {mode!r}"
    )


def shard_of(value, world_size, rank, fixed_owner):
    """The rows of a whole table's value (array or tensor, [rows, dim]) that
    worker `rank` holds, in local row order."""
    if fixed_owner < 0:
        return value[rank::world_size]
    if rank == fixed_owner:
        return value
    return value[:0]  # a localized table lives on one worker; the others hold no rows


def shard_rows(rows, world_size, rank, fixed_owner):
    """How many of a whole table's `rows` worker `rank` holds (shard_of's
    length)."""
    if fixed_owner < 0:
        return len(range(rank, rows, world_size))
    return rows if rank == fixed_owner else 0


def owner_of(var, ids):
    """The worker holding each of the global ids or keys `ids` (int64 tensor)."""
    world_size, _, fixed_owner = var.placement
    ids = tf.cast(ids, tf.int64)
    if fixed_owner >= 0:
        return tf.fill(tf.shape(ids), tf.constant(fixed_owner, tf.int64))
    return tf.math.floormod(ids, world_size)


def local_rows(var, ids):
    """The row numbers in their owner's shard of global row ids `ids` of a
    static table."""
    world_size, _, fixed_owner = var.placement
    return ids if fixed_owner >= 0 else tf.math.floordiv(ids, world_size)


def global_rows(var, local):
    """The global row numbers of this worker's local rows `local` of a static
    table (the inverse of local_rows)."""
    world_size, rank, fixed_owner = var.placement
    return local if fixed_owner >= 0 else local * world_size + rank


def owned_rows(var, ids, rows):
    """The entries of (global ids or keys, rows) that this worker holds, ids
    unchanged (the table's import takes them so). With one worker, all."""
    world_size, rank, _ = var.placement
    if world_size == 1:
        return ids, rows
    ids = tf.convert_to_tensor(ids)
    keep = tf.equal(owner_of(var, ids), rank)
    return tf.boolean_mask(ids, keep), tf.boolean_mask(rows, keep)


def owned_mask(var, ids):
    """numpy: which of the global ids or keys `ids` this worker holds."""
    world_size, rank, fixed_owner = var.placement
    ids = np.asarray(ids)
    if world_size == 1:
        return np.ones(ids.shape, bool)
    if fixed_owner >= 0:
        return np.full(ids.shape, fixed_owner == rank)
    return np.mod(ids.astype(np.int64), world_size) == rank


def checked_owned(var, keys, what, advice):
    """`keys` (an integer tensor) once a check that this worker owns each has
    passed: eagerly a ValueError now, in a graph an assertion when it runs.
    `what` names the call ("sok.assign", "DynamicVariable.sparse_read"),
    `advice` what to do instead. A key another worker owns went into this
    worker's shard, where no lookup reads it, and a dump then held two rows
    of the key (one its load refused, on one worker only). One worker: no
    check."""
    world_size, rank, _ = var.placement
    if world_size == 1 or not keys.dtype.is_integer:
        return keys
    owners = owner_of(var, keys)
    words = (f"{what} works on the shard of table '{var.name}' this worker holds (worker "
             f"{rank} of {world_size}, which owns the keys k with k mod {world_size} == {rank}"
             f", or every key of a table localized on it); {advice}. Got a key of worker")
    if tf.executing_eagerly():
        flat = tf.reshape(keys, [-1])
        foreign = np.flatnonzero(tf.reshape(owners, [-1]).numpy() != rank)
        if foreign.size:
            first = int(foreign[0])
            raise ValueError(f"{words} {int(tf.reshape(owners, [-1])[first])}: "
                             f"{int(flat[first])} at position {first}")
        return keys
    foreign = tf.not_equal(owners, rank)
    check = tf.debugging.Assert(tf.logical_not(tf.reduce_any(foreign)),
                                [words, tf.boolean_mask(owners, foreign)[:1], "key",
                                 tf.boolean_mask(keys, foreign)[:1]])
    with tf.control_dependencies([check]):
        return tf.identity(keys)


def owned_count(var, n):
    """How many of the global ids or keys 0..n-1 this worker holds (as
    owned_mask counts them, without making the n ids)."""
    world_size, rank, fixed_owner = var.placement
    if world_size == 1:
        return n
    if fixed_owner >= 0:
        return n if fixed_owner == rank else 0
    return max(0, (n - rank + world_size - 1) // world_size)


def assemble(shard_rows, placement, global_shape):
    """numpy: the whole static table from every worker's shard concatenated in
    rank order (`shard_rows`, as an all-gather returns them)."""
    world_size, _, fixed_owner = placement
    if world_size == 1 or fixed_owner >= 0:
        return shard_rows  # one worker, or a localized table: only its owner sent rows
    whole = np.zeros(global_shape, shard_rows.dtype)
    start = 0
    for r in range(world_size):
        count = len(range(r, global_shape[0], world_size))
        whole[r::world_size] = shard_rows[start:start + count]
        start += count
    return whole


def check_world(comm, table, name, what=None):
    """A ValueError where `table` is sharded over another number of workers
    than `comm` (the active communicator; None before sok.init: one worker)
    joins: sok.init ran again since the table was made, with another engine
    (comm_tool="none" in a worker of a launched job, say). Its exchanges
    then ran over the new engine's workers while the table's owners are the
    old ones' (a lookup of a dynamic table inserted keys other workers own
    into this worker's shard), and a dump or load took this worker's shard
    for the whole table (two workers wrote one path), without an error.
    what: the call, named first in the message."""
    world = 1 if comm is None else comm.world_size
    sharded_over, rank, _ = table.placement
    if sharded_over == world:
        return
    joined = "" if comm is None else f" ({comm.describe()})"
    raise ValueError(
        f"{what + ': ' if what else ''}table {name!r} is sharded over {sharded_over} workers "
        f"(this process holds worker {rank}'s shard), but the communicator sok.init set up "
        f"since joins {world}{joined}: the table's other shards are out of its reach. Use the "
        f"table under the engine it was made under (call sok.init with that engine again), "
        f"or make the tables again after sok.init")
