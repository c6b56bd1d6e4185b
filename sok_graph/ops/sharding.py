"""The sharding ops (tf_ops/sharding): ids grouped by owning worker, and local rows.

Distributed tables: global row i lives on worker i % world_size as local row
i // world_size. Localized tables: all rows on one worker (``fixed_owner``).
"""

import collections

from sok_graph.ops import library

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
        ids, world_size=int(world_size), fixed_owner=int(fixed_owner),
        check_negative=not non_negative, name=name
    )
    return Buckets(*out)


def local_rows(ids, world_size, name=None):
    """id // world_size: the row an id occupies in its owner's shard."""
    return library.load().sok_local_rows(ids, world_size=int(world_size), name=name)
