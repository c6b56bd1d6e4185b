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

Lookups and optimizers also take plain tf.Variables, which answer here as
static tables of their own shape. A ReplicaShards (one process's replicas, each holding a
shard) is a holder, not a table: callers resolve it to its shard first
(replica_shards.resolve / shards_of), and it answers no kind.

Modules ask `is_dynamic(var)` rather than naming the class, so a new kind of
dynamic table (tiered, filtered) that says table_kind "dynamic" is served
by the same code paths.
"""

STATIC = "static"
DYNAMIC = "dynamic"


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
