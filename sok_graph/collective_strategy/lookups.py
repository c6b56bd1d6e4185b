"""The patched embedding lookups (tf.nn and tf.compat.v1.nn, dense, sparse and
safe sparse): on a sok variable they run sok's lookups, else TensorFlow's own.
"""

import tensorflow as tf

from sok_graph import compat
from sok_graph.tables.static import is_sok_variable
from sok_graph.lookup import all2all_dense_embedding, lookup_sparse

from .patching import _bound, _originals, _tf_modules


def _is_sok_table(value):
    """A sok variable, or the serving table one becomes while export_saved_model
    rebuilds the model (serving mode): sok's lookups read both, TensorFlow's
    own cannot convert a serving table ("Failed to convert ... DynamicTable")."""
    if is_sok_variable(value):
        return True
    from sok_graph.serving import tables as serving_tables

    return isinstance(value, (serving_tables.StaticTable, serving_tables.DynamicTable))


def _single_sok_table(params):
    """The sok variable (or its serving table) `params` stands for (itself,
    or the only entry of a list), else None."""
    if isinstance(params, (list, tuple)):
        if len(params) == 1 and _is_sok_table(params[0]):
            return params[0]
        if any(_is_sok_table(p) for p in params):
            raise ValueError(
                "params lists a sok variable together with other tables; a sok "
                "variable holds the whole table, pass it alone")
        return None
    return params if _is_sok_table(params) else None


def partitioned_rows(params, ids, partition_strategy):
    """The table rows plain TensorFlow reads for `ids` of a table that was made
    from a partitioned get_variable. With partition_strategy='div' (TF 2's only
    strategy, TF 1's feature columns) id i is row i; with 'mod' (TF 1's default
    for tf.nn.embedding_lookup*) id i is row i // n of part i % n, that is row
    offset[i % n] + i // n of the whole table. Ids outside [0, rows) are left
    as they are, so the lookup rejects them as it would unpartitioned."""
    if not _translates(params, partition_strategy):
        return ids
    parts = params._sok_partition_rows
    ids = tf.convert_to_tensor(ids)
    n = len(parts)
    offsets = tf.constant([sum(parts[:i]) for i in range(n)], dtype=ids.dtype)
    rows = tf.gather(offsets, tf.math.floormod(ids, n)) + tf.math.floordiv(ids, n)
    valid = tf.logical_and(ids >= 0, ids < sum(parts))
    return tf.where(valid, rows, ids)


def _translates(params, partition_strategy):
    """Whether ids of `params` are not simply rows (partitioned_rows)."""
    return partition_strategy == "mod" and bool(getattr(params, "_sok_partition_rows", None))


def _sparse_rows(params, sp_ids, partition_strategy):
    if sp_ids is None or not _translates(params, partition_strategy):
        return sp_ids
    if isinstance(sp_ids, tf.compat.v1.SparseTensorValue):
        sp_ids = tf.SparseTensor.from_value(sp_ids)
    return tf.SparseTensor(sp_ids.indices,
                           partitioned_rows(params, sp_ids.values, partition_strategy),
                           sp_ids.dense_shape)


def _tensorflow_lookup(orig, args, kwargs, a, params_arg, ids_arg, to_rows):
    """TensorFlow's own lookup `orig` (bound arguments `a`) for params that
    are not a sok variable; on a table's serving copy, after to_rows turned
    its ids (argument `ids_arg`) into rows."""
    exported = _exported_table(a[params_arg])
    if exported is None:
        return orig(*args, **kwargs)
    strategy = a.get("partition_strategy")
    a[ids_arg] = to_rows(exported, a[ids_arg], strategy)
    if strategy is not None:  # ids are rows now; TF's inner lookups keep them
        a["partition_strategy"] = "div"
    return orig(**a)


def _exported_table(params):
    """The ordinary variable a table becomes in a serving graph (export mode),
    else None. Its lookups run in TensorFlow with the ids turned into rows
    first; they then call TensorFlow with partition_strategy='div', since
    TF 1's sparse lookups call the (patched) dense one with theirs."""
    if isinstance(params, (list, tuple)):
        params = params[0] if len(params) == 1 else None
    return params if getattr(params, "_sok_partition_rows", None) else None


def _dense_lookup(table, ids, max_norm, name):
    if max_norm is None:
        return all2all_dense_embedding(table, ids, name=name)
    with tf.name_scope(name or "embedding_lookup"):
        ids = tf.convert_to_tensor(ids)
        flat = tf.reshape(ids, [-1])
        one_each = tf.RaggedTensor.from_row_lengths(
            flat, tf.ones_like(flat, dtype=tf.int64), validate=False)
        rows = lookup_sparse(table, one_each, combiners="sum", max_norm=max_norm)
        out = tf.reshape(rows, tf.concat([tf.shape(ids), tf.shape(rows)[1:]], 0))
        out.set_shape(ids.shape.concatenate(rows.shape[1:]))
        return out


def _make_dense_lookup(key):
    def embedding_lookup(*args, **kwargs):
        orig = _originals()[key]
        a = _bound(orig, args, kwargs)
        table = _single_sok_table(a["params"])
        strategy = a.get("partition_strategy")
        if table is None:
            return _tensorflow_lookup(orig, args, kwargs, a, "params", "ids", partitioned_rows)
        ids = partitioned_rows(table, a["ids"], strategy)
        return _dense_lookup(table, ids, a.get("max_norm"), a.get("name"))

    embedding_lookup.__doc__ = _originals()[key].__doc__
    return embedding_lookup


def _sparse(ids):
    """A SparseTensor of sparse or ragged ids (or weights), as TensorFlow's
    sparse lookups take both (TF 2.x): ragged ids on a sok table failed with
    "'RaggedTensor' object has no attribute 'dense_shape'"."""
    if isinstance(ids, tf.compat.v1.SparseTensorValue):
        return tf.SparseTensor.from_value(ids)
    if isinstance(ids, tf.RaggedTensor):
        return ids.to_sparse()
    return ids


def _as_2d(sp, what):
    """`sp` with a static rank of 2 (a sparse_placeholder's rank is unknown
    until it is fed; a fed rank other than 2 then fails in ensure_shape)."""
    if sp is None:
        return None
    if isinstance(sp, tf.compat.v1.SparseTensorValue):
        sp = tf.SparseTensor.from_value(sp)
    rank = compat.sparse_static_shape(sp).rank
    if rank is not None and rank != 2:
        raise ValueError(f"{what} must be a 2-D SparseTensor [batch, ids] for a sok variable; "
                         f"got rank {rank}")
    if rank is None:
        sp = tf.SparseTensor(sp.indices, sp.values, tf.ensure_shape(sp.dense_shape, [2]))
    return sp


def _sparse_lookup_2d(table, sp_ids, sp_weights, combiner, max_norm, name):
    combiner = combiner or "mean"
    return lookup_sparse(table, _as_2d(sp_ids, "sp_ids"), _as_2d(sp_weights, "sp_weights"),
                         combiners=combiner, max_norm=max_norm, name=name)


def _make_sparse_lookup(key):
    def embedding_lookup_sparse(*args, **kwargs):
        orig = _originals()[key]
        a = _bound(orig, args, kwargs)
        table = _single_sok_table(a["params"])
        strategy = a.get("partition_strategy")
        if table is None:
            return _tensorflow_lookup(orig, args, kwargs, a, "params", "sp_ids", _sparse_rows)
        sp_ids = _sparse_rows(table, _sparse(a["sp_ids"]), strategy)
        return _sparse_lookup_2d(table, sp_ids, _sparse(a["sp_weights"]), a["combiner"],
                                 a["max_norm"], a["name"])

    embedding_lookup_sparse.__doc__ = _originals()[key].__doc__
    return embedding_lookup_sparse


def _make_safe_sparse_lookup(key):
    def safe_embedding_lookup_sparse(*args, **kwargs):
        orig = _originals()[key]
        a = _bound(orig, args, kwargs)
        table = _single_sok_table(a["embedding_weights"])
        strategy = a.get("partition_strategy")
        if table is None:
            return _tensorflow_lookup(orig, args, kwargs, a, "embedding_weights", "sparse_ids", _sparse_rows)
        if a["default_id"] is not None:
            raise NotImplementedError(
                "safe_embedding_lookup_sparse on a sok variable: default_id="
                f"{a['default_id']!r} is not supported (samples without ids get zero rows); "
                "pass default_id=None")
        sp_ids, sp_weights = a["sparse_ids"], a["sparse_weights"]
        with tf.name_scope(a["name"] or "embedding_lookup"):
            # As TensorFlow's safe lookup: ids of any rank >= 2 are looked up
            # per row of their last dimension; negative ids are dropped, and
            # non-positive weights unless the combiner is "sum" (TensorFlow
            # keeps them there: a weight of -1 subtracts its row).
            sp_ids, sp_weights = _sparse(sp_ids), _sparse(sp_weights)
            shape = sp_ids.dense_shape
            rank = sp_ids.shape.rank
            if rank is None or rank != 2:
                batch = tf.reduce_prod(shape[:-1])
                sp_ids = tf.sparse.reshape(sp_ids, tf.stack([batch, shape[-1]]))
                if sp_weights is not None:
                    sp_weights = tf.sparse.reshape(sp_weights, tf.stack([batch, shape[-1]]))
            combiner = a["combiner"] or "mean"
            keep = sp_ids.values >= 0
            if sp_weights is not None:
                if combiner != "sum":
                    keep = tf.logical_and(keep, sp_weights.values > 0)
                sp_weights = tf.sparse.retain(sp_weights, keep)
            sp_ids = _sparse_rows(table, tf.sparse.retain(sp_ids, keep), strategy)
            out = lookup_sparse(table, _as_2d(sp_ids, "sparse_ids"),
                                _as_2d(sp_weights, "sparse_weights"),
                                combiners=combiner, max_norm=a["max_norm"])
            if rank is None or rank != 2:
                out = tf.reshape(out, tf.concat(
                    [shape[:-1], tf.shape(out, out_type=tf.int64)[1:]], 0))
            return out

    safe_embedding_lookup_sparse.__doc__ = _originals()[key].__doc__
    return safe_embedding_lookup_sparse


def _lookup_patches():
    embedding_ops = _tf_modules()[0]
    dense_v1, dense_v2 = _make_dense_lookup("embedding_lookup"), \
        _make_dense_lookup("embedding_lookup_v2")
    sparse_v1, sparse_v2 = _make_sparse_lookup("embedding_lookup_sparse"), \
        _make_sparse_lookup("embedding_lookup_sparse_v2")
    safe_v1, safe_v2 = _make_safe_sparse_lookup("safe_embedding_lookup_sparse"), \
        _make_safe_sparse_lookup("safe_embedding_lookup_sparse_v2")
    # tf.nn's names are TensorFlow 1's functions on 1.x ('mod' by default),
    # the _v2 ones on 2.x: each is replaced by the patch of what it is.
    def public(name, v1, v2):
        return v1 if compat.IS_TF1 else v2

    patches = [
        # Feature columns call these through the module at call time.
        (embedding_ops, "embedding_lookup", dense_v1),
        (embedding_ops, "embedding_lookup_v2", dense_v2),
        (embedding_ops, "embedding_lookup_sparse", sparse_v1),
        (embedding_ops, "embedding_lookup_sparse_v2", sparse_v2),
        (embedding_ops, "safe_embedding_lookup_sparse", safe_v1),
        (embedding_ops, "safe_embedding_lookup_sparse_v2", safe_v2),
        # The public names are separate references to the same functions.
        (tf.nn, "embedding_lookup", public("embedding_lookup", dense_v1, dense_v2)),
        (tf.nn, "embedding_lookup_sparse",
         public("embedding_lookup_sparse", sparse_v1, sparse_v2)),
        (tf.nn, "safe_embedding_lookup_sparse",
         public("safe_embedding_lookup_sparse", safe_v1, safe_v2)),
        (tf.compat.v1.nn, "embedding_lookup", dense_v1),
        (tf.compat.v1.nn, "embedding_lookup_sparse", sparse_v1),
        (tf.compat.v1.nn, "safe_embedding_lookup_sparse", safe_v1),
    ]
    v2 = compat.v2_module()
    if v2 is not None:
        patches += [(v2.nn, "embedding_lookup", dense_v2),
                    (v2.nn, "embedding_lookup_sparse", sparse_v2),
                    (v2.nn, "safe_embedding_lookup_sparse", safe_v2)]
    return patches
