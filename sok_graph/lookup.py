"""`lookup_sparse`: combined embeddings of many tables in one fused op.

Same results as ``tf.nn.embedding_lookup_sparse`` applied to each table, with
the tables' work done by one op and each table's gradient an IndexedSlices
with unique indices.
"""

import json
import math
import weakref

import numpy as np
import tensorflow as tf

from sok_graph import compat, context, exchange
from sok_graph.communication import agreement
from sok_graph.tables import admission, is_dynamic, made_order, replica_shards
from sok_graph.tables.static import is_sok_variable
from sok_graph.ops import lookup as lookup_ops
from sok_graph.ops import util as util_ops
from sok_graph.serving import mode as serving_mode

_FLOAT_DTYPES = (tf.float32, tf.float16, tf.bfloat16)


def _is_list(value):
    """Whether `value` is a list of per-table entries. A SparseTensorValue
    is a tuple (indices, values, dense_shape) but one table's ids: taken
    as a list, a lookup of one table said sp_ids had 3 entries."""
    return isinstance(value, (list, tuple)) \
        and not isinstance(value, tf.compat.v1.SparseTensorValue)


def _as_list(value, name, n):
    if value is None:
        return [None] * n
    items = list(value) if _is_list(value) else [value]
    if len(items) != n:
        raise ValueError(
            f"{name} must have one entry per table ({n}); got {len(items)}"
        )
    return items


def _ragged_parts(ids, index, what="sp_ids"):
    """(values [nnz], row_splits [batch + 1] int64) of a 2-D SparseTensor or RaggedTensor."""
    if isinstance(ids, tf.compat.v1.SparseTensorValue):
        ids = tf.SparseTensor.from_value(ids)
    if isinstance(ids, tf.SparseTensor):
        rank = compat.sparse_static_shape(ids).rank
        if rank is not None and rank != 2:
            raise ValueError(
                f"{what}[{index}] must be a 2-D SparseTensor [batch, max_nnz]; got rank "
                f"{rank}"
            )
        return _sparse_parts(ids, f"{what}[{index}]")
    if isinstance(ids, tf.RaggedTensor):
        if ids.ragged_rank != 1 or ids.flat_values.shape.rank != 1:
            raise ValueError(
                f"{what}[{index}] must be a 2-D RaggedTensor [batch, (nnz)]; got ragged "
                f"rank {ids.ragged_rank} with values of rank {ids.flat_values.shape.rank}"
            )
        return ids.values, tf.cast(ids.row_splits, tf.int64)
    raise TypeError(
        f"{what}[{index}] must be a tf.SparseTensor or tf.RaggedTensor; got "
        f"{type(ids).__name__}"
    )


def _id_parts(ids, index):
    """_ragged_parts of sp_ids[index], whose values must be int32 or int64 ids."""
    values, splits = _ragged_parts(ids, index)
    if values.dtype not in (tf.int32, tf.int64):
        raise TypeError(f"sp_ids[{index}] must hold int32 or int64 ids; got "
                        f"{values.dtype.name}")
    return values, splits


def _weight_parts(weights, index):
    """_ragged_parts of sp_weights[index], whose values must be floats."""
    values, splits = _ragged_parts(weights, index, "sp_weights")
    if not values.dtype.is_floating:
        raise TypeError(f"sp_weights[{index}] must hold floats; got {values.dtype.name}")
    return values, splits


def _sparse_parts(sp, label):
    """(values, row_splits) of a 2-D SparseTensor whose indices may come in
    any order: reordered first, as tf.nn.safe_embedding_lookup_sparse does
    (its column numbers only order a row's ids). A repeated index or one
    outside dense_shape is an error naming the argument `label`."""
    # On the host: TensorFlow's SparseReorder has no GPU kernel, and a
    # SparseTensor's indices come from the input pipeline there.
    with tf.device("/device:CPU:0"):
        return _sparse_parts_on_host(sp, label)


def _sparse_parts_on_host(sp, label):
    shape = tf.cast(sp.dense_shape, tf.int64)
    rank = tf.debugging.assert_equal(
        tf.size(shape), 2,
        message=f"{label} must be a 2-D SparseTensor [batch, max_nnz]; its dense_shape is")
    with tf.control_dependencies([rank]):
        # The batch becomes the output's rows, counted in 32 bits by the
        # ragged conversion below: 2^32 + 3 gave 3 rows.
        sizes = tf.debugging.Assert(
            tf.reduce_all(tf.stack([shape[0] >= 0, shape[0] < 2**31, shape[1] >= 0])),
            [f"{label}: the dense_shape [batch, max_nnz] of a SparseTensor must be >= 0, "
             f"with a batch below 2^31; got", shape], summarize=2)
    with tf.control_dependencies([sizes]):
        sp = tf.sparse.reorder(tf.SparseTensor(sp.indices, sp.values, tf.identity(shape)))
    indices = sp.indices
    outside = tf.reduce_any(tf.logical_or(indices < 0, indices >= shape[None, :]), axis=1)
    first = _first_true(outside)
    inside = tf.debugging.Assert(
        tf.logical_not(tf.reduce_any(outside)),
        [f"{label}: every index of a SparseTensor must be inside its dense_shape", shape,
         "; got the index", tf.gather(tf.concat([indices, [[0, 0]]], 0), first)], summarize=4)
    # Sorted, a repeated index sits next to its twin.
    repeated = tf.reduce_all(tf.equal(indices[1:], indices[:-1]), axis=1)
    once = tf.debugging.Assert(
        tf.logical_not(tf.reduce_any(repeated)),
        [f"{label}: a SparseTensor must not repeat an index; this one appears more than "
         f"once:", tf.gather(tf.concat([indices, [[0, 0]]], 0), _first_true(repeated))],
        summarize=4)
    # The ids wait for the checks too, not only their rows: a dynamic table
    # inserts the keys it reads, before the lookup's own checks run. (Both
    # on the host, where the SparseTensor is: no wait for a device.)
    with tf.control_dependencies([inside, once]):
        rows = tf.identity(indices[:, 0])
        values = tf.identity(sp.values)
    ragged = tf.RaggedTensor.from_value_rowids(values, rows, nrows=shape[0], validate=False)
    return ragged.values, tf.cast(ragged.row_splits, tf.int64)


def _positive_finite(value):
    """Whether the number `value` is positive and finite as a float. A
    Python int beyond int64 (2**70) is a number like any other: np.isfinite
    failed on it with numpy's "ufunc 'isfinite' not supported for the input
    types", naming no argument; one beyond a float's range (10**400) is not
    finite."""
    try:
        value = float(value)
    except OverflowError:
        return False
    return math.isfinite(value) and value > 0


def _table_name(param, index):
    name = getattr(param, "name", None)
    if not name:
        return f"table_{index}"
    return name[:-2] if name.endswith(":0") else name


# Whether ids are deduplicated per table before they are sent to their owners
# (DESIGN.md); only the communication benchmark turns it off, to measure what
# deduplication saves.
dedup_before_exchange = True


def _exchange_order(params, names):
    """The order in which a lookup_sparse call reads its tables, which is
    the order of its exchanges with the other workers: where a table is
    sharded, by name (then place in the call), so that workers listing the
    same tables in other orders (a list built from a set, or a dict of
    features, whose order hash randomisation changes from process to
    process) still pair each exchange with the same table's: the exchanges
    were paired by place, so a worker's `user` ids were answered with its
    peer's `item` rows, and a dynamic table inserted the other's keys,
    without an error. Tables of one name (unnamed ones: every eager
    tf.Variable is "Variable", every DynamicVariable "DynamicVariable") go
    in the order they were made, which every worker shares (their first
    call agrees on it, _agree_across_workers), not their place in the
    call. The order of the outputs is the call's."""
    if not any(_is_sharded(p) for p in params):
        return list(range(len(params)))
    return sorted(range(len(params)), key=lambda t: (names[t], made_order(params[t]), t))


# The call layouts each job's workers have agreed on (_agree_across_workers),
# per communicator: a layout is agreed once, at the call's first build.
_AGREED = weakref.WeakKeyDictionary()


def _described(param):
    """What every worker must hold alike of a sharded table that a call
    reads: its kind, name, shape, dtypes, placement and (dynamic) the
    settings that decide what its owners keep."""
    name = _table_name(param, 0)
    owner = param.placement[2]
    if is_dynamic(param):
        config = getattr(param, "_config", {})
        given = getattr(param, "_table_config", {})
        return ["dynamic", name, int(param.dimension), tf.as_dtype(param.dtype).name,
                param.key_type.name, owner, getattr(param, "var_type", None),
                config.get("max_capacity"), config.get("eviction"),
                [[k, repr(given[k])] for k in admission.SETTINGS if k in given]]
    rows, dim = (int(d) for d in param.global_shape)
    return ["static", name, rows, dim, tf.as_dtype(param.dtype).base_dtype.name, owner]


def _said(entry):
    """A table's description (_described) as an error message says it."""
    if entry is None:
        return "no table"
    kind, name = entry[0], entry[1]
    if kind == "static":
        rows, dim, dtype, owner = entry[2:6]
        shape = f"{rows} x {dim} {dtype}"
    else:
        dim, dtype, key_type, owner = entry[2:6]
        shape = (f"dynamic, dimension {dim}, {dtype} rows, {key_type} keys, var_type "
                 f"{entry[6]}, max_capacity {entry[7]}, eviction {entry[8]}"
                 + "".join(f", {k}={v}" for k, v in entry[9]))
    where = "distributed" if owner == -1 else f"localized:{owner}"
    return f"'{name}' ({shape}, {where})"


def _agree_across_workers(comm, params, tensors, order, combiners, max_norm, weights):
    """Every worker process builds the same exchanges for this call, or
    each raises a ValueError saying how theirs differ. The exchanges pair
    across workers by their order alone: workers that made a table with
    other rows, dimension, dtype or placement, or that read other tables
    or group them otherwise (another combiner, max_norm or weighting) in a
    call, read each other's rows as their own, without an error (a row a
    worker lacks read as zeros; a dimension or dtype mismatch failed later
    in TensorFlow's collectives, naming neither). The layout compared is
    each sharded table's description and exchange (_planned_exchanges),
    worked out only where several processes take part: a lookup of one
    process pays nothing for it, call after call.
    Agreed once per layout and job: an all-gather outside the step, when
    the call is first built (traced, in graph mode, or run eagerly); a
    later build of the same layout (a retrace for another batch size on
    one worker) gathers nothing. A call of no sharded table exchanges
    nothing and gathers nothing (it may run on one worker alone), nor does
    a function traced to be saved (a SavedModel written on rank 0 alone).

    Tables of one name and description (unnamed ones) go in the order they
    were made (_exchange_order). Where a worker made them in another order
    than it lists them, and the workers differ in how (tables made
    iterating a set, whose order changes from process to process), neither
    that order nor the call's tells which table is which: each entry also
    holds its table's place among those of its name in the call, so that
    such workers are refused and asked to name the tables."""
    if not agreement.spans_processes(comm) or compat.saving_a_saved_model():
        return
    exchanges = _planned_exchanges(params, tensors, order, combiners, max_norm, weights)
    if not exchanges:
        return
    described = {t: _described(params[t]) for t in exchanges}
    layout = []
    for t in order:
        if t not in exchanges:
            continue
        twins = sorted(u for u in exchanges if described[u] == described[t])
        layout.append([described[t], exchanges[t], twins.index(t) if len(twins) > 1 else None])
    text = json.dumps(layout)
    agreed = _AGREED.setdefault(comm, set())
    if text in agreed:
        return
    with tf.init_scope():  # outside a function being traced
        told = [json.loads(t) for t in
                agreement.texts(comm, tf.executing_eagerly(), text)]
    if all(t == layout for t in told):
        agreed.add(text)
        return
    rank = next(r for r, t in enumerate(told) if t != told[0])
    ours, theirs = told[0], told[rank]
    at = next(i for i in range(max(len(ours), len(theirs)))
              if i >= len(ours) or i >= len(theirs) or ours[i] != theirs[i])
    mine = ours[at] if at < len(ours) else None
    other = theirs[at] if at < len(theirs) else None
    if mine is not None and other is not None and mine[:2] == other[:2]:
        raise ValueError(
            f"sok.lookup_sparse: the workers' calls differ: the call reads several tables "
            f"like {_said(mine[0])}, which rank 0 and rank {rank} made and listed in other "
            f"orders (made iterating a set or dict of features?), so the workers cannot tell "
            f"which is which: give each table its own name (name=...), the same on every worker")
    if mine is not None and other is not None and mine[0] == other[0]:
        detail = (f"rank 0 reads {_said(mine[0])} in exchange {mine[1]!r} and rank {rank} in "
                  f"exchange {other[1]!r}: the call groups its tables otherwise there")
    else:
        detail = (f"sharded table {at} of the call (in name order) is "
                  f"{_said(None if mine is None else mine[0])} on rank 0 and "
                  f"{_said(None if other is None else other[0])} on rank {rank}")
    raise ValueError(
        f"sok.lookup_sparse: the workers' calls differ: {detail}. A sharded table's rows and "
        f"gradients pair across workers by the order of the call's exchanges, so every worker "
        f"must make the same tables (name, rows, dimension, dtype, placement, dynamic "
        f"settings), in the same order, and look them up in calls of the same tables with the "
        f"same combiners, max_norm and weighting (a worker whose batch lacks a feature still "
        f"passes it, with no ids)")


def _is_sharded(param):
    """A sok.Variable split over several workers (rows come from their owners)."""
    placement = getattr(param, "placement", None)
    return is_sok_variable(param) and placement is not None and placement[0] > 1


def _checked_ids(ids, rows, index, name):
    """ids, after a check that each is in [0, rows): the table (or, when it is
    sharded, its owner) must not be asked for a row that does not exist —
    TensorFlow's gather would fail on the CPU without naming the table and
    give zeros on a GPU."""
    with tf.control_dependencies([_range_check(ids, rows, index, name)]):
        return tf.identity(ids)


def _range_check(ids, rows, index, name):
    """A check (a tensor to wait for) that each id is in [0, rows)."""
    bad = tf.logical_or(ids < 0, ids >= rows)
    return _fails_if_any(bad, lambda first: [
        f"ids of {name} (sp_ids[{index}]) must be in [0, {rows}) (the table's rows); got",
        _padded_gather(ids, first)])


def _ids_range_check(ids, rows, index, name):
    """_range_check on the host: what a call's dynamic tables wait for before
    they insert keys."""
    with tf.device("/device:CPU:0"):
        return _range_check(tf.cast(ids, tf.int64), rows, index, name)


def _static_rows(param, tensor):
    """A static table's rows (its global rows when it is sharded), an int
    when the shape says, else a tensor."""
    if _is_sharded(param):
        return param.global_shape[0]
    table = param if tensor is None else tensor
    rows = tf.compat.dimension_value(table.shape[0])
    return rows if rows is not None else tf.shape(table, out_type=tf.int64)[0]


def _fails_if_any(bad, details, more=()):
    """A check (a tensor to wait for) that fails with the message
    details(first), first the position of the first True of the bool vector
    `bad`, when any is True. The details are computed only then: finding the
    first takes a scan over the whole vector, which on a GPU took 0.26 ms of
    every step of a 26-table batch of 8192, on the stream that the step's
    other kernels wait behind (bench/RESULTS.md). `more`: further (bad,
    details) pairs, checked by the same read of one flag on the host."""
    checks = [(bad, details)] + list(more)
    any_bad = tf.reduce_any(tf.concat([b for b, _ in checks], 0) if more else bad)

    def fail():
        reports = [tf.debugging.Assert(tf.logical_not(tf.reduce_any(b)), d(_first_true(b)))
                   for b, d in checks]
        with tf.control_dependencies(reports):
            return tf.identity(any_bad)

    return tf.cond(any_bad, fail, lambda: tf.identity(any_bad))


def _splits_check(ids, splits, index, name):
    """A check (a tensor to wait for) that the row_splits of sp_ids[index]
    are what the fused op checks (they start at 0, never decrease and end at
    the number of ids). A dynamic table inserts the keys it reads before that
    op runs, and a RaggedTensor made with validate=False carries any splits,
    so a call with a dynamic table waits for this check of every ragged
    input. With several workers, a worker whose splits are bad fails before
    the exchange (its peers then fail or time out in it, as for a bad id of
    a static table)."""
    # The number of ids is read from the shape where the ids are (no copy);
    # the rest runs on the host, where a RaggedTensor's splits usually come
    # from: the table's find-or-insert then waits for the host, not for the
    # device.
    n = tf.size(ids, out_type=tf.int64)
    with tf.device("/device:CPU:0"):
        ok = tf.reduce_all(tf.stack([
            tf.size(splits) > 0,
            tf.reduce_all(tf.equal(splits[:1], 0)),
            tf.reduce_all(tf.equal(splits[-1:], n)),
            tf.reduce_all(splits[1:] >= splits[:-1])]))
        return _fails_if_any(tf.reshape(tf.logical_not(ok), [1]), lambda first: [
            f"row_splits of {name} (sp_ids[{index}]) must start at 0, never decrease and end "
            f"at its number of ids{_known_count(ids)}; got", splits])


def _aligned_weights(weights, weight_splits, ids, index):
    """(weights after a check that they pair one to one with the ids, that
    check): same row lengths (sp_weights[index] against sp_ids[index])."""
    count, id_splits = ids
    # The weights' count from their shape where they are; the comparison
    # on the host (the splits' usual place): a dynamic table's insert waits
    # for this check, and on a GPU it would otherwise wait for a copy back.
    size = tf.size(weights, out_type=tf.int64)
    with tf.device("/device:CPU:0"):
        same = tf.logical_and(
            tf.equal(size, count),
            tf.logical_and(tf.equal(tf.size(weight_splits), tf.size(id_splits)),
                           tf.reduce_all(tf.equal(
                               tf.pad(weight_splits, [[0, tf.maximum(tf.size(id_splits) -
                                                                     tf.size(weight_splits), 0)]]),
                               tf.pad(id_splits, [[0, tf.maximum(tf.size(weight_splits) -
                                                                 tf.size(id_splits), 0)]])))))
        check = tf.debugging.Assert(same, [
            f"sp_weights[{index}] must have one weight per id of sp_ids[{index}], row by row; "
            f"the row_splits of the weights and of the ids are", weight_splits, id_splits],
            summarize=8)
    with tf.control_dependencies([check]):
        return tf.identity(weights), check


def _first_true(flags):
    """The position of the first True of a bool vector (its length when none
    is). A max-reduction: TensorFlow's GPU ArgMax (an Eigen reduction) took
    6 ms over a 26-table batch of 8192 on an H100. Built from the vector's
    run-time length only: in TF 1.15 a tf.function's SparseTensor argument
    can carry a static length from an earlier call, which tf.size would
    fold into a constant."""
    ones = tf.cast(tf.logical_or(flags, tf.logical_not(flags)), tf.int64)
    n = tf.reduce_sum(ones)
    score = tf.cast(flags, tf.int64) * (n - tf.cumsum(ones, exclusive=True))
    return n - tf.reduce_max(tf.concat([score, tf.zeros([1], tf.int64)], 0))


def _padded_gather(values, position):
    """values[position], or 0 where position is past the end (nothing bad)."""
    return tf.gather(tf.concat([values, tf.zeros([1], values.dtype)], 0), position[None])


def _check_table(table, label):
    """`table` (named `label` in errors: "params[t]", or all2all_dense_embedding's
    "param") is a float matrix."""
    dtype = tf.as_dtype(table.dtype).base_dtype
    if dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{label} must be float32, float16 or bfloat16; got {dtype.name}")
    if table.shape.rank is not None and table.shape.rank != 2:
        raise ValueError(f"{label} must be a [rows, dim] matrix; got shape {table.shape}")


def _table_tensor(param, label):
    """A static table as the fused op takes it: a variable as it is (the op
    reads a resource variable's rows in place, see ops/lookup.py), anything
    else as a tensor; checked (`label` names it in errors)."""
    try:
        tensor = param if isinstance(param, tf.Variable) else tf.convert_to_tensor(param)
    except (TypeError, ValueError):
        # tf.convert_to_tensor's "Attempt to convert a value (None)
        # with an unsupported type" named no argument.
        raise TypeError(
            f"{label} must be a table: a sok.Variable, sok.DynamicVariable, "
            f"tf.Variable or [rows, dim] tensor; got {type(param).__name__}") from None
    _check_table(tensor, label)
    return tensor


def _checked_table(param, label):
    """`param` checked as a table (named `label` in errors): None where its
    rows come from the table itself (a dynamic table, one sharded over
    workers, a variable whose rows are gathered), else what the fused op
    takes (_table_tensor)."""
    if is_dynamic(param) or _is_sharded(param) or _reads_rows(param):
        _check_table(param, label)
        return None
    return _table_tensor(param, label)


def _reads_rows(param):
    """Whether a static table's rows are gathered before the fused op rather
    than read by it: for variables that act as resource variables without
    owning one handle (tf.distribute's, mixed precision's), which pick a
    component or cast on every read, and for float16 / bfloat16 variables,
    whose rows the op's GPU kernel widens to float32 (only the batch's
    distinct rows then, not the table). Plain float32 resource variables go
    to the op, which reads their rows in place."""
    if not compat.is_resource_variable(param):
        return False
    return not compat.is_plain_resource_variable(param) or \
        tf.as_dtype(param.dtype).base_dtype != tf.float32


def _room_checks(params, dynamic, parts, low_frequency_filter):
    """Each bounded dynamic table's check that its reads fit (its
    room_check), for a call of more than one dynamic read: a read refused
    for room refused the call only after the reads before it had inserted
    (and counted) their keys. A table read twice in the call (two features
    sharing it) checks the keys of all its reads at once: the distinct keys
    of the call must fit its bound, as they must for one read. Checked read
    by read, the second read evicted keys the first had just read (their
    rows already in the call's output) and the call went through; the
    update then failed with the table changed. Except where the reads draw
    filter_ratio's lots (use_low_frequency_filter): each read draws with
    its own call number, which one check cannot follow, so those check
    inside their reads. Tables sharded over worker processes check on their
    owners, inside the exchange."""
    if len(dynamic) < 2:
        return []
    checks, seen = [], []
    for t in dynamic:
        param = params[t]
        if any(param is p for p in seen):
            continue
        seen.append(param)
        placement = getattr(param, "placement", None)
        if placement is not None and placement[0] > 1:
            continue
        reads = [r for r in dynamic if params[r] is param]
        ids = [parts[r][0] for r in reads]
        if any(i.dtype != param.key_type and (i.dtype, param.key_type) != (tf.int32, tf.int64)
               for i in ids):
            continue  # the read refuses them, naming sp_ids[t] and the key type
        if len(reads) > 1:
            admission_state = getattr(param, "admission", None)
            if low_frequency_filter and admission_state is not None and \
                    admission_state.ratio < 1.0:
                continue
            ids = tf.concat([tf.cast(i, param.key_type) for i in ids], 0)
        else:
            ids = ids[0]
        check = param.room_check(ids, bool(low_frequency_filter))
        if check is not None:
            checks.append(check)
    return checks


def _gathered_rows(param, ids, index, name, low_frequency_filter=False):
    """(rows, positions): the rows of `param` for the distinct ids, and each
    id's position in them. low_frequency_filter: a dynamic table's
    filter_ratio applies (sok_graph/tables/admission.py)."""
    if is_dynamic(param) and ids.dtype == tf.int32 \
            and param.key_type == tf.int64:
        ids = tf.cast(ids, tf.int64)  # widening, as SOK does
    if is_dynamic(param) and ids.dtype != param.key_type:
        raise TypeError(
            f"sp_ids[{index}] must hold {param.key_type.name} keys (the key_type of "
            f"DynamicVariable '{param.name}'); got {ids.dtype.name}")
    placement = getattr(param, "placement", None)
    world_size = 1 if placement is None else placement[0]
    if is_dynamic(param) and world_size == 1:
        # unique and the table's find-or-insert as one op
        _, rows, positions = param.unique_read(ids, low_frequency_filter=low_frequency_filter)
        return rows, positions
    # A counting admission filter counts every occurrence: its owner must
    # see them all.
    counts = is_dynamic(param) and param.admission is not None \
        and param.admission.counting
    if world_size > 1 and (counts or not dedup_before_exchange):
        keys, positions = ids, tf.range(tf.size(ids, out_type=tf.int64))
    else:
        keys, positions = util_ops.unique(ids, out_idx=tf.int64)
    if is_dynamic(param):
        comm = context.communicator("a lookup in a sharded table")
        return exchange.dynamic_rows(comm, param, keys,
                                     low_frequency_filter=low_frequency_filter), positions
    if world_size == 1:
        rows = tf.compat.dimension_value(param.shape[0])
        if rows is None:
            rows = tf.shape(param, out_type=keys.dtype)[0]
        # tf.gather: sparse_read where the variable has one, else a read of
        # the replica's component (tf.distribute's variables)
        return tf.gather(param, _checked_ids(keys, rows, index, name)), positions
    comm = context.communicator("a lookup in a sharded table")
    keys = _checked_ids(tf.cast(keys, tf.int64), param.global_shape[0], index, name)
    return exchange.static_rows(comm, param, keys), positions


def _planned_exchanges(params, tensors, order, combiners, max_norm, weights):
    """{table index: exchange id} of a call's sharded tables, as lookup_sparse
    reads them: sharded static tables grouped (_sharded_groups), each other
    sharded table an exchange of its own."""
    pending = [t for t in order if tensors[t] is None and _is_sharded(params[t])
               and dedup_before_exchange and not is_dynamic(params[t])]
    planned = {t: "own" for t in order
               if tensors[t] is None and _is_sharded(params[t]) and t not in pending}
    for g, members in enumerate(_sharded_groups(params, pending, combiners, max_norm, weights)):
        planned.update({t: f"group {g}" for t in members})
    return planned


def _sharded_groups(params, pending, combiners, max_norm, weights):
    """The sharded static tables `pending` (indices into params) in groups
    that share one exchange and one entry of the fused op: same dtype,
    dimension, placement, combiner, max_norm and weighting."""
    groups = {}
    for t in pending:
        p = params[t]
        # int(): TF 1.15's TensorShape gives an unhashable Dimension.
        key = (tf.as_dtype(p.dtype).base_dtype, int(p.global_shape[1]), p.placement[2],
               combiners[t], max_norm[t], weights[t] is not None)
        groups.setdefault(key, []).append(t)
    return list(groups.values())


def _group_rows(params, members, values, names, edges):
    """(rows [u, dim], positions [sum of nnz]) for the ids `values[t]` of the
    sharded static tables `members`: one range check, one unique and one
    exchange for all of them: each id travels with its table's index k
    (exchange.grouped_static_rows), one key space in which the distinct keys
    of every table are found at once. `edges`: (bad [M], first and last
    [M, 2]) of the members' row_splits, from _merged_splits, checked with
    the ids."""
    ids = [tf.cast(values[t], tf.int64) for t in members]
    limits = [int(params[t].global_shape[0]) for t in members]
    raw = tf.concat(ids, 0)
    table = _table_of_each_id(ids)
    # An id past every table's rows could wrap the key it makes into another
    # table's; such an id fails this check, which the rows wait for,
    # whatever row that key read.
    bad = tf.logical_or(raw < 0, raw >= tf.gather(tf.constant(limits, tf.int64), table))
    messages = tf.constant([
        f"ids of {names[t]} (sp_ids[{t}]) must be in [0, {rows}) (the table's rows); got"
        for t, rows in zip(members, limits)])

    def details(first):
        # Only the first bad id and its table go to the host, where Assert runs.
        culprit = _padded_gather(table, first)
        with tf.device("/device:CPU:0"):
            message = tf.gather(messages, culprit[0])
        return [message, _padded_gather(raw, first)]

    # A member whose row_splits do not start at 0 and end at its number of
    # ids (a RaggedTensor made with validate=False) would move ids into the
    # next member's samples once the splits are merged: the fused op then
    # sees valid merged splits and gives wrong sums, without an error.
    splits_bad, splits_edges = edges
    if list(members) != sorted(members):
        # Members come in name order (_exchange_order); the first bad
        # table named is the first in the call, as the fused op names it.
        in_call = [members.index(t) for t in sorted(members)]
        splits_bad = tf.gather(splits_bad, in_call)
        splits_edges = tf.gather(splits_edges, in_call)
    splits_messages = tf.constant([
        f"row_splits of {names[t]} (sp_ids[{t}]) must start at 0 and end at its number of "
        f"ids{_known_count(values[t])}; got first and last" for t in sorted(members)]
        + [""])  # where no member's are bad (the other check failed)

    def splits_details(first):
        with tf.device("/device:CPU:0"):
            message = tf.gather(splits_messages, first)
        return [message, tf.gather(tf.concat([splits_edges, tf.zeros([1, 2], tf.int64)], 0),
                                   first)]

    comm = context.communicator("a lookup in a sharded table")
    rows, positions = exchange.grouped_static_rows(comm, [params[t] for t in members], raw,
                                                   table, names=[names[t] for t in members])
    # The rows wait for the check, not the exchange: the host reads its
    # result while the GPU goes on, and the step waits for the device once,
    # in the exchange (see exchange.grouped_static_rows). Built after the
    # exchange: the check is a stateful op (an Assert in a cond), and a
    # tf.function runs stateful ops in the order they were built
    # (compat.order_side_effects_per_replica), so one built first would
    # make the all-to-alls wait for it after all.
    check = _fails_if_any(bad, details, more=[(splits_bad, splits_details)])
    with tf.control_dependencies([check]):
        return tf.identity(rows), positions


def _known_count(ids):
    """ " (n)" where the number of ids is known when the graph is built, else ""."""
    n = ids.shape.num_elements()
    return "" if n is None else f" ({n})"


def _table_of_each_id(ids):
    """[sum of sizes] int64: k at the positions of ids[k] in concat(ids).

    Where the sizes are known when the graph is built, this is two ops for
    any number of tables (one batch size for all) or one constant, instead of
    a fill per table: each op of a sharded lookup's step is host time in a
    step that the host bounds on a multi-GPU machine (bench/RESULTS.md)."""
    sizes = [i.shape.num_elements() for i in ids]
    if None in sizes:
        return tf.concat([tf.fill(tf.shape(i, out_type=tf.int64), tf.constant(k, tf.int64))
                          for k, i in enumerate(ids)], 0)
    total = sum(sizes)
    if total and len(set(sizes)) == 1:
        # The range's bounds live on the host, where the op reads them.
        with tf.device("/device:CPU:0"):
            bounds = (tf.constant(0, tf.int64), tf.constant(total, tf.int64),
                      tf.constant(1, tf.int64))
        return tf.math.floordiv(tf.range(*bounds), sizes[0])
    return tf.constant(np.repeat(np.arange(len(ids), dtype=np.int64), sizes))


def _batch_size(row_splits):
    """Rows of a ragged batch: a Python int where the shape is known, else a
    scalar tensor (from the shape: nothing waits for the device)."""
    known = tf.compat.dimension_value(row_splits.shape[0])
    return known - 1 if known is not None else tf.shape(row_splits, out_type=tf.int64)[0] - 1


def _merged_splits(members, splits, values):
    """(row_splits, (bad [M] bool, edges [M, 2] int64)): the row_splits of
    the members' ragged ids one after another, one ragged batch of
    sum(batch_t) rows; and each member's first and last split with whether
    they are not 0 and its number of ids (_group_rows checks them: the
    merged splits stay valid where a member's are not).

    Where every member's number of ids and of rows is known when the graph is
    built, the merge is a gather of the members' splits (without each one's
    leading 0 but the first's) at constant positions plus constant offsets:
    a few ops for any number of tables, where a slice and an add per table
    were 50 of the ~650 ops that each replica's host ran in a 26-table DLRM
    step (bench/RESULTS.md). Tables that share one splits tensor (one batch
    layout) read it once."""
    sizes = [values[t].shape.num_elements() for t in members]
    lengths = [tf.compat.dimension_value(splits[t].shape[0]) for t in members]
    for k, t in enumerate(members):
        if lengths[k] == 0:
            raise ValueError(f"sp_ids[{t}] has empty row_splits; a ragged batch's row_splits "
                             f"hold at least one value (0 for a batch of no samples)")
    if None in sizes or None in lengths:
        firsts = tf.stack([splits[t][0] for t in members])
        lasts = tf.stack([splits[t][-1] for t in members])
        counts = tf.stack([tf.size(values[t], out_type=tf.int64) for t in members])
        out, offset = [splits[members[0]]], lasts[0]
        for k, t in enumerate(members[1:], 1):
            out.append(splits[t][1:] + offset)
            offset = offset + lasts[k]
        edges = tf.stack([firsts, lasts], 1)
        # tf.not_equal, not !=: TF 1.15's Tensor compares by identity.
        bad = tf.logical_or(tf.not_equal(firsts, 0), tf.not_equal(lasts, counts))
        return tf.concat(out, 0), (bad, edges)
    sources, start, length = [], {}, 0  # distinct splits tensors; where each begins
    for k, t in enumerate(members):
        if id(splits[t]) not in start:
            start[id(splits[t])], length = length, length + lengths[k]
            sources.append(t)
    positions, offsets, before, ends = [], [], 0, []
    for k, t in enumerate(members):
        first = 0 if k == 0 else 1
        at = start[id(splits[t])]
        positions.append(at + np.arange(first, lengths[k], dtype=np.int64))
        offsets.append(np.full(lengths[k] - first, before, np.int64))
        ends.extend([at, at + lengths[k] - 1])
        before += sizes[k]
    table = splits[sources[0]] if len(sources) == 1 else \
        tf.concat([splits[t] for t in sources], 0)
    merged = tf.gather(table, np.concatenate(positions)) + np.concatenate(offsets)
    edges = tf.reshape(tf.gather(table, np.asarray(ends, np.int64)), [len(members), 2])
    expected = np.asarray([[0, n] for n in sizes], np.int64)
    return merged, (tf.reduce_any(tf.not_equal(edges, expected), axis=1), edges)


def lookup_sparse(params, sp_ids, sp_weights=None, combiners=None,
                  use_low_frequency_filter=False, max_norm=None, name=None):
    """Embeddings of ragged ids, one fused op for all tables.

    params:     a sok.Variable / tf.Variable / tensor [rows, dim] / sok.DynamicVariable,
                or a list of them (static and dynamic tables may be mixed)
    sp_ids:     per table, a SparseTensor [batch, max_nnz] or RaggedTensor
                [batch, (nnz)] of int32/int64 row ids in [0, rows) (static tables) or
                keys of the table's key_type (dynamic tables; new keys are inserted)
    sp_weights: None, or per table None or a SparseTensor/RaggedTensor of
                weights aligned with sp_ids (weights are not differentiated)
    combiners:  per table "sum", "mean" (the default, as in SOK) or "sqrtn";
                a single string applies to every table
    max_norm:   None, a float, or per table None/float: rows whose L2 norm is
                larger are scaled down to it before combining
    use_low_frequency_filter: dynamic tables with a filter_ratio admit each
                new key with that probability (SOK's filter; keys not
                admitted read the table's default row and are not trained;
                sok_graph/tables/admission.py). Counting filters (min_count) apply
                to every lookup.
    returns:    per table a [batch, dim] tensor (a single tensor when params
                is a single table). Samples with no ids give zero rows.

    On a GPU, when every table's rows are gathered before the fused op
    (dynamic and sharded tables, tf.distribute's and mixed precision's
    variables) and none clips, the gradient is summed with float atomics
    unless op determinism is on (docs/gpu.md).

    The tables of one call share one op: a table whose output reaches no
    loss gets zero rows as its gradient (GradientTape and tf.gradients fill
    an unused float output's gradient with zeros, and the op cannot tell
    those from a real gradient), and a momentum optimizer (Adam) then moves
    the rows it looked up, where a lookup of its own would give it no
    gradient. Look such a table up in a call of its own.
    """
    serving = serving_mode.active()
    comm = None if serving else context.communicator("sok.lookup_sparse")
    single = not isinstance(params, (list, tuple))
    params = [params] if single else list(params)
    # Errors name a table as it was given: in a graph, replica r's shard of a
    # table sharded over replicas is named "<name>_<r>" (the graph makes
    # each name unique), a name the user never gave.
    given_names = [_table_name(p, t) for t, p in enumerate(params)]
    shapes_only = not serving and _shapes_only(params)
    if not serving and not shapes_only:
        # A table sharded over replicas: the shard of the replica being built.
        params = [replica_shards.resolve(p, "sok.lookup_sparse") for p in params]
    n = len(params)
    if n == 0:
        raise ValueError("params must name at least one table; got an empty list")
    if single and not _is_list(sp_ids):
        sp_ids = [sp_ids]
    sp_ids = _as_list(sp_ids, "sp_ids", n)
    if sp_weights is not None and single and not _is_list(sp_weights):
        sp_weights = [sp_weights]
    sp_weights = _as_list(sp_weights, "sp_weights", n)
    # Only None means the default: "" is a name, refused below (it was
    # taken as "mean").
    if combiners is None:
        combiners = ["mean"] * n
    elif isinstance(combiners, str):
        combiners = [combiners] * n
    combiners = _as_list(combiners, "combiners", n)
    names = lookup_ops.combiner_names()
    for t, c in enumerate(combiners):
        if c not in names:
            raise ValueError(f"combiners[{t}] must be one of {names}; got {c!r}")
    # A numpy scalar (np.float32(0.5)) is one number for every table, as a
    # Python float is: it was taken as a list of one entry ("max_norm must
    # have one entry per table (2); got 1").
    if max_norm is None or isinstance(max_norm, (int, float, np.number)):
        max_norm = [max_norm] * n
    max_norm = _as_list(max_norm, "max_norm", n)
    for t, m in enumerate(max_norm):
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float, np.number))
                              or not _positive_finite(m)):
            raise ValueError(f"max_norm[{t}] must be None or a positive finite number (the L2 "
                             f"norm rows are clipped to); got {m!r}")
        if m is not None:
            lookup_ops.refuse_subnormal_max_norm(float(m), f"max_norm[{t}]")

    if use_low_frequency_filter is not None:
        use_low_frequency_filter = admission.checked_flag(use_low_frequency_filter,
                                                          "use_low_frequency_filter")

    if serving:
        return _serving_lookup(params, sp_ids, sp_weights, combiners, max_norm, single, name)
    if shapes_only:
        out = [_rows_of_zeros(p, _ragged_parts(ids, t)[1]) for t, (p, ids) in
               enumerate(zip(params, sp_ids))]
        return out[0] if single else out

    with tf.name_scope(name or "sok_lookup_sparse"):
        tensors, names = [], []
        for t, p in enumerate(params):
            # None: rows come from the table (and other workers), below.
            tensors.append(_checked_table(p, f"params[{t}]"))
            names.append(given_names[t])
        dtypes = [p.dtype if x is None else x.dtype for x, p in zip(tensors, params)]
        dtypes = [tf.as_dtype(d).base_dtype for d in dtypes]
        dtype = dtypes[0]
        for t, d in enumerate(dtypes):
            if d != dtype:
                raise TypeError(
                    f"all tables must share one dtype; params[0] is {dtype.name}, params[{t}] "
                    f"is {d.name}"
                )

        parts = [_id_parts(ids, t) for t, ids in enumerate(sp_ids)]
        member_ids = [(tf.size(v, out_type=tf.int64), s) for v, s in parts]
        weights, input_checks = [], []
        for t, w in enumerate(sp_weights):
            if w is None:
                weights.append(None)
                continue
            wv, ws = _weight_parts(w, t)
            aligned, check = _aligned_weights(tf.cast(wv, dtype), ws, member_ids[t], t)
            weights.append(aligned)
            input_checks.append(check)
        # A dynamic table inserts the keys it reads before the fused op
        # checks the call's other inputs: its keys wait for the weights'
        # checks and for the other tables' id ranges, so that a call that
        # fails leaves every table (and admission filter counts) as it was.
        dynamic = [t for t, p in enumerate(params) if is_dynamic(p)]
        if dynamic:
            input_checks += [_ids_range_check(parts[t][0], _static_rows(p, tensors[t]), t,
                                              names[t])
                             for t, p in enumerate(params) if not is_dynamic(p)]
            # Every table's ragged row_splits, a dynamic table's own and the
            # others' (which only the fused op, after the inserts, checked).
            input_checks += [_splits_check(parts[t][0], parts[t][1], t, names[t])
                             for t, ids in enumerate(sp_ids) if isinstance(ids, tf.RaggedTensor)]
            input_checks += _room_checks(params, dynamic, parts, use_low_frequency_filter)

        values, splits, dense_grads = [None] * n, [None] * n, [False] * n
        pending = []
        order = _exchange_order(params, given_names)
        _agree_across_workers(comm, params, tensors, order, combiners, max_norm, weights)
        # A table read twice (two features sharing it) is read in this order
        # when the graph runs: admission filters draw as eagerly.
        with admission.reads_in_order():
            for t in order:
                v, s = parts[t]
                if tensors[t] is None and _is_sharded(params[t]) and dedup_before_exchange \
                        and not is_dynamic(params[t]):
                    pending.append(t)  # fetched with the other sharded tables, below
                elif tensors[t] is None:
                    if is_dynamic(params[t]) and input_checks:
                        with tf.control_dependencies(input_checks):
                            v = tf.identity(v)
                    # A variable: each distinct id is fetched once (read,
                    # looked up or inserted; from its owner when the table is
                    # sharded), and the fused op combines rows of that small
                    # gathered table. Its gradient reaches the table as
                    # (unique ids, summed rows).
                    # Every row of that table is used, so its gradient is
                    # dense: on a GPU the fused gradient then need not count
                    # distinct ids, and waits for nothing.
                    tensors[t], v = _gathered_rows(params[t], v, t, names[t],
                                                   bool(use_low_frequency_filter))
                    dense_grads[t] = True
                values[t], splits[t] = v, s

        # Sharded static tables: one entry of the fused op per group, whose
        # table is the rows of the group's distinct ids (every row used: a
        # dense gradient) and whose batch is the members' batches in turn.
        entries = [[t] for t in range(n) if t not in pending]
        member_splits, member_values = list(splits), list(values)
        for members in _sharded_groups(params, pending, combiners, max_norm, weights):
            t = members[0]
            splits[t], edges = _merged_splits(members, member_splits, member_values)
            tensors[t], values[t] = _group_rows(params, members, values, names, edges)
            if weights[t] is not None:
                weights[t] = tf.concat([weights[m] for m in members], 0)
            names[t] = "+".join(names[m] for m in members)
            dense_grads[t] = True
            entries.append(members)
        # The fused op's entries (and so its gradient's exchanges) in the
        # read order too.
        rank = {t: i for i, t in enumerate(order)}
        entries.sort(key=lambda members: rank[members[0]])
        heads = [e[0] for e in entries]
        ids = [values[t] for t in heads]
        if len({v.dtype for v in ids}) > 1:
            ids = [tf.cast(v, tf.int64) for v in ids]
        out = lookup_ops.fused_lookup(
            [tensors[t] for t in heads], ids, [splits[t] for t in heads],
            weights=[weights[t] for t in heads], combiners=[combiners[t] for t in heads],
            max_norms=[max_norm[t] for t in heads], table_names=[names[t] for t in heads],
            dense_grads=[dense_grads[t] for t in heads],
        )
        results = [None] * n
        for members, embedded in zip(entries, out):
            if len(members) == 1:
                results[members[0]] = embedded
                continue
            batches = [_batch_size(member_splits[m]) for m in members]
            if not all(isinstance(b, int) for b in batches):
                batches = tf.stack([tf.cast(b, tf.int64) for b in batches])
            for m, part in zip(members, tf.split(embedded, batches, num=len(members))):
                results[m] = part
    return results[0] if single else results


def _serving_lookup(params, sp_ids, sp_weights, combiners, max_norm, single, name):
    """lookup_sparse in serving mode (sok_graph/serving): stock ops on the
    tables' serving copies, the same results as the fused op."""
    from sok_graph.serving import tables as serving_tables

    out = []
    with tf.name_scope(name or "sok_lookup_sparse"):
        dtype = None
        for t, p in enumerate(params):
            if is_sok_variable(p) or isinstance(p, (serving_tables.StaticTable,
                                                    serving_tables.DynamicTable)):
                table = serving_mode.table_for(p)
                table_dtype = table.dtype
            else:  # a plain tensor or tf.Variable serves as it is
                table = serving_tables.StaticTable(_table_name(p, t), variable=p) \
                    if isinstance(p, tf.Variable) else _TensorTable(tf.convert_to_tensor(p))
                table_dtype = tf.as_dtype(p.dtype).base_dtype
            dtype = dtype or table_dtype
            if table_dtype != dtype:
                raise TypeError(f"all tables must share one dtype; params[0] is {dtype.name}, "
                                f"params[{t}] is {table_dtype.name}")
            # The ids' and weights' dtypes are checked as in training: the
            # served lookup cast float ids to int64 (id 1.7 read row 1) and
            # took int weights, where training refuses both.
            values, splits = _id_parts(sp_ids[t], t)
            weights = None
            if sp_weights[t] is not None:
                # Paired with the ids row by row, as in training (the served
                # sums took misaligned weights without an error).
                weights, weight_splits = _weight_parts(sp_weights[t], t)
                weights, _ = _aligned_weights(
                    weights, weight_splits, (tf.size(values, out_type=tf.int64), splits), t)
            out.append(serving_tables.combine(table, values, splits, weights, combiners[t],
                                              max_norm[t], dtype))
    return out[0] if single else out


class _TensorTable:
    """A table given as a tensor, in serving mode."""

    def __init__(self, tensor):
        self.tensor = tensor

    def lookup(self, ids):
        return tf.gather(self.tensor, tf.cast(ids, tf.int64))


def all2all_dense_embedding(param, indices, name=None):
    """Rows of `param` for `indices` of any shape, as ``tf.nn.embedding_lookup``:
    returns indices.shape + [dim]. param: a sok.Variable, tf.Variable, tensor or
    sok.DynamicVariable (indices are then keys).

    On a GPU the gradient of a dynamic table's gathered rows is summed with
    float atomics, as TensorFlow sums its own embedding gradients, so it may
    differ in the last bits from run to run; with
    ``tf.config.experimental.enable_op_determinism()`` it is summed in a
    fixed order (docs/gpu.md)."""
    if isinstance(param, (list, tuple)):
        # lookup_sparse took the list and gave a list of rows, which failed
        # in a reshape naming neither argument.
        raise TypeError(f"param must be one table (a sok.Variable, tf.Variable, tensor or "
                        f"sok.DynamicVariable); got a {type(param).__name__} of {len(param)}: "
                        f"call all2all_dense_embedding once per table")
    if isinstance(indices, (tf.SparseTensor, tf.compat.v1.SparseTensorValue, tf.RaggedTensor)):
        # tf.convert_to_tensor's messages ("object of type 'RaggedTensor'
        # has no len()") named no argument.
        raise TypeError(f"indices must be a dense tensor of ids (any shape); got a "
                        f"{type(indices).__name__}: sok.lookup_sparse takes sparse and ragged "
                        f"ids")
    with tf.name_scope(name or "all2all_dense_embedding"):
        indices = tf.convert_to_tensor(indices)
        if _shapes_only([param]):
            out = tf.zeros(tf.concat([tf.shape(indices), [param.dimension]], 0), param.dtype)
            out.set_shape(indices.shape.concatenate([param.dimension]))
            return out
        # Named here: the lookup below would name its own argument, sp_ids[0].
        if indices.dtype not in (tf.int32, tf.int64):
            raise TypeError(f"indices must hold int32 or int64 ids; got {indices.dtype.name}")
        flat = tf.reshape(indices, [-1])
        table = _single_worker_dynamic(param)
        if table is not None and indices.dtype == tf.int64 and table.key_type == tf.int32:
            raise TypeError(f"indices must hold int32 keys (the key_type of DynamicVariable "
                            f"'{table.name}'); got int64")
        if table is not None:
            rows = _rows_by_position(table, flat, _table_name(table, 0))
        else:
            # Checked here, by its own name: the lookup below names its
            # argument, params[0], which the caller never passed.
            # (Not in serving mode: a servable model's lookup reads the
            # tables' serving copies.)
            if not serving_mode.active():
                checked = _checked_table(param, "param")
                param = param if checked is None else checked
            ids = tf.RaggedTensor.from_row_splits(flat, _one_id_splits(flat), validate=False)
            rows = lookup_sparse(param, ids, combiners="sum")
        out = tf.reshape(rows, tf.concat([tf.shape(indices), tf.shape(rows)[1:]], 0))
        out.set_shape(indices.shape.concatenate(rows.shape[1:]))
        return out


def _shapes_only(params):
    """Whether this call only needs its outputs' shapes: Keras 3 traces a
    model's call into a scratch graph before fit / evaluate /
    train_on_batch (its symbolic build), outside strategy.run, where tables
    sharded over a MirroredStrategy's replicas have no shard to read. The
    lookup then gives zero rows of the right shape, as a Keras layer's call
    gives symbolic outputs there: that graph never runs. Anywhere else such
    a table outside strategy.run stays an error naming it."""
    return (any(isinstance(p, replica_shards.ReplicaShards) for p in params)
            and not replica_shards.in_replica() and compat.in_keras3_symbolic_build())


def _rows_of_zeros(table, splits):
    """[samples, dimension] zeros in `table`'s dtype, a sample per row_splits entry."""
    rows = tf.zeros(tf.stack([tf.size(splits, out_type=tf.int64) - 1,
                              tf.constant(table.dimension, tf.int64)]), table.dtype)
    rows.set_shape([splits.shape[0] - 1 if splits.shape[0] is not None else None,
                    table.dimension])
    return rows


def _single_worker_dynamic(param):
    """The DynamicVariable (a replica's shard, where param is one sharded
    over replicas) that `param` names when one worker holds all of it,
    outside serving mode; else None."""
    if serving_mode.active():
        return None
    context.communicator("sok.all2all_dense_embedding")
    table = replica_shards.resolve(param, "sok.all2all_dense_embedding")
    if not is_dynamic(table) or _is_sharded(table):
        return None
    return table


def _one_id_splits(ids):
    """row_splits 0, 1, ..., n of n one-id samples, as one int64 range.

    On an H100 the cumulative sum of ones this replaces cost the DemoModel's
    graph-mode step about 10 ms, and an int32 range is made in host memory
    and copied over (bench/RESULTS.md). The range's bounds are made on the
    host, where the range op reads them: made on a GPU they were three
    device-to-host copies a step, each a wait for the device."""
    size = ids.shape.num_elements()
    if size is None:  # the shape op, beside the ids, gives it in host memory
        size = tf.shape(ids, out_type=tf.int64)
    with tf.device("/device:CPU:0"):
        limit = (size + 1 if isinstance(size, int) else size[0] + 1)
        bounds = (tf.constant(0, tf.int64), tf.convert_to_tensor(limit, tf.int64),
                  tf.constant(1, tf.int64))
    return tf.range(*bounds)


def _rows_by_position(table, ids, table_name):
    """Rows of a single worker's dynamic table for one id per sample: each
    distinct key is found (or inserted) once, by unique_read, and its row is
    gathered to every position with tf.gather — the lookup of one-id
    samples by sum is a gather, and TensorFlow's is the fastest there is.
    The gradient sums each distinct key's rows with the fused lookup's
    gradient kernel (one-id samples, a dense gradient: no wait), the
    gradient that lookup_sparse gives (bit for bit with op determinism on;
    on a GPU without it the sums are added with atomics)."""
    rows, positions = _gathered_rows(table, ids, 0, table_name)

    @tf.custom_gradient
    def gather(rows, positions):
        def grad(dy):
            return lookup_ops.one_id_sum_grad(rows, positions, tf.convert_to_tensor(dy),
                                              table_name), None

        return tf.gather(rows, positions), grad

    return gather(rows, positions)
