"""The fused multi-table lookup op (tf_ops/lookup) and its gradient.

Each table's gradient comes back as a ``tf.IndexedSlices`` whose indices are
unique, so ``tf.GradientTape``, ``tf.gradients`` and optimizers treat it like
the gradient of ``tf.gather`` but never see the same row twice — or, for a
table marked in dense_grads (rows gathered for the batch, see
sok_graph.lookup_sparse), as one dense tensor.
"""

import contextlib

import numpy as np
import tensorflow as tf

from sok_graph.ops import library
from sok_graph.ops import util as util_ops
from sok_graph import compat
from sok_graph.compat import IndexedSlices, register_gradient

_combiner_names = None


def combiner_names():
    """The combiners the lookup ops have, in their order: the allowed values
    of SokFusedLookup's `combiners` attribute, which
    tf_ops/lookup/core/combiner.h spells out (the one list). Read once: an
    eager lookup asks on every call."""
    global _combiner_names
    if _combiner_names is None:
        library.load()  # registers the ops
        for attr in compat.registered_op_def("SokFusedLookup").attr:
            if attr.name == "combiners" and attr.allowed_values.list.s:
                _combiner_names = tuple(s.decode() for s in attr.allowed_values.list.s)
    if _combiner_names is not None:
        return _combiner_names
    raise RuntimeError("the op library's SokFusedLookup lists no combiners: it is older than "
                       "this sok_graph; build it again")


# float32's smallest normal number. The op takes max_norm as a float32 and
# reads a subnormal one as 0 (TensorFlow's threads flush subnormals to
# zero), which means no clipping: max_norm=1e-40 left the rows as they were,
# where tf.nn.embedding_lookup_sparse scales them down to (almost) zero.
FLOAT32_TINY = float(np.finfo(np.float32).tiny)


def refuse_subnormal_max_norm(value, what):
    """ValueError naming `what` where `value`, a positive max_norm, is below
    float32's smallest normal number (or rounds to 0 in float32)."""
    if 0 < value < FLOAT32_TINY:
        raise ValueError(
            f"{what} must be at least {FLOAT32_TINY!r} (float32's smallest normal number: "
            f"the lookup clips in float32, where a smaller max_norm reads as 0, no "
            f"clipping); got {value!r}")


def fused_lookup(params, ids, row_splits, weights=None, combiners=None, max_norms=None,
                 table_names=None, dense_grads=None, name=None):
    """Combined embeddings of N tables in one op.

    params:      N tables [rows_t, dim_t] (float32, float16 or bfloat16; all alike):
                 tensors, or resource variables, which are read in place
    ids:         N tensors [nnz_t] int32/int64, each in [0, rows_t)
    row_splits:  N tensors [batch_t + 1] int64 (ragged row partition of ids)
    weights:     None, or N entries each None or a [nnz_t] tensor of params' dtype
    combiners:   N names of combiner_names() ("sum", "mean", "sqrtn")
    max_norms:   None, or N entries each None or a float (clip rows to that L2 norm)
    dense_grads: None, or N bools: the gradient of a table marked True is a dense
                 [rows, dim] tensor, not an IndexedSlices — for a small table of rows
                 gathered for the batch (every row used), whose GPU gradient then needs
                 no count of distinct ids, so no wait for the device
    returns:     N tensors [batch_t, dim_t]
    """
    n = len(params)
    tables = [table_input(p) for p in params]
    dtypes = [table_dtype(p, t) for p, t in zip(params, tables)]
    params = tables
    dtype = dtypes[0]
    if any(d != dtype for d in dtypes) or dtype not in (tf.float32, tf.float16, tf.bfloat16):
        raise TypeError(f"params of all tables must have one dtype, float32, float16 or "
                        f"bfloat16; got {[d.name for d in dtypes]}")
    weights = list(weights) if weights is not None else [None] * n
    max_norms = list(max_norms) if max_norms is not None else [None] * n
    for what, items in (("ids", ids), ("row_splits", row_splits), ("weights", weights),
                        ("max_norms", max_norms)):
        if len(items) != n:
            raise ValueError(f"{what} must have one entry per table ({n}); got {len(items)}")
    for t, m in enumerate(max_norms):
        if m is not None:
            refuse_subnormal_max_norm(float(m), f"max_norms[{t}]")
    if combiners is None or isinstance(combiners, (str, bytes)):
        # None failed with "'NoneType' object is not iterable", and a str
        # was taken letter by letter ("Value for attr 'combiners' of "s"").
        raise TypeError(f"combiners must be a list of one combiner name per table ({n}), each "
                        f"one of {combiner_names()}; got {combiners!r}")
    combiners = list(combiners)
    for t, c in enumerate(combiners):
        if c not in combiner_names():
            raise ValueError(f"combiners[{t}] must be one of {combiner_names()}; got {c!r}")
    ids = [tf.convert_to_tensor(i) for i in ids]
    if len({i.dtype for i in ids}) > 1:
        # TensorFlow's own error would only give an input number.
        raise TypeError(f"ids of all tables must have one dtype (int32 or int64); got "
                        f"{[i.dtype.name for i in ids]}")
    weighted = [w is not None for w in weights]
    weight_tensors = [
        tf.zeros([0], dtype=dtype) if w is None else tf.cast(w, dtype) for w in weights
    ]
    names = list(table_names) if table_names is not None else []
    dense = [bool(d) for d in dense_grads] if dense_grads is not None else []
    if dense and len(dense) != n:
        raise ValueError(f"dense_grads must have one entry per table ({n}); got {len(dense)}")
    outputs = library.load().sok_fused_lookup(
        params=list(params),
        ids=list(ids),
        row_splits=list(row_splits),
        weights=weight_tensors,
        combiners=list(combiners),
        weighted=weighted,
        max_norms=[float(m) if m is not None else 0.0 for m in max_norms],
        table_names=names,
        dense_grads=dense if any(dense) else [],
        name=name,
    )
    embeddings, checks = list(outputs[0]), outputs[1]
    return _checked(embeddings, checks, names)


def _checked(embeddings, checks, names):
    """The embeddings, with the lookup's input check (bad ids, malformed
    row_splits) reported by SokLookupCheck. On a GPU the forward leaves its
    finding in `checks` instead of waiting for it. Eagerly, the check runs at
    once; in a tf.function it runs as a stateful op of the function, beside
    the ops that use the embeddings, which never wait for it (a bad input
    fails the call); in a TF1 graph nothing runs that is not fetched, so the
    embeddings wait for the check there."""
    check = library.load().sok_lookup_check(checks, num_tables=len(embeddings),
                                            table_names=names)
    if tf.executing_eagerly() or _in_function():
        return embeddings
    with tf.control_dependencies([check]):
        return [tf.identity(e) for e in embeddings]


def _in_function():
    """Whether a tf.function (a FuncGraph, TF 1.15's too) is being built."""
    from tensorflow.python.framework import func_graph

    return isinstance(tf.compat.v1.get_default_graph(), func_graph.FuncGraph)


def table_input(param):
    """What the op takes for a table: a resource variable's handle (the op
    reads the rows it needs in place; a whole-table read would copy the table
    once sparse updates have touched it), else the table as a tensor."""
    if compat.is_plain_resource_variable(param):
        compat.record_variable_access(param)  # so GradientTapes watch it
        return param.handle
    return tf.convert_to_tensor(param)


def table_dtype(param, table):
    """The dtype of the rows of `param`, given as `table` (table_input's
    result): the variable's for a resource handle, else the tensor's."""
    return tf.as_dtype(param.dtype).base_dtype if table.dtype == tf.resource else table.dtype


def table_shape(table):
    """[rows, dim] of a table input, as an int32 tensor (what tf.gather's
    gradient gives as dense_shape): a constant where the graph knows it."""
    if table.dtype == tf.resource:
        known = compat.static_handle_shape(table)
        if known is not None:
            return tf.constant(known, tf.int32)
        return tf.raw_ops.VariableShape(input=table, out_type=tf.int32)
    if table.shape.is_fully_defined():
        return tf.constant(table.shape.as_list(), tf.int32)
    return tf.shape(table)


def _attrs(op):
    return dict(
        combiners=[c.decode() if isinstance(c, bytes) else c for c in op.get_attr("combiners")],
        weighted=list(op.get_attr("weighted")),
        max_norms=list(op.get_attr("max_norms")),
        table_names=[c.decode() if isinstance(c, bytes) else c for c in op.get_attr("table_names")],
        dense_grads=_dense_grads(op),
    )


def _dense_grads(op):
    """The op's dense_grads (empty on graphs built before the attribute)."""
    try:
        return list(op.get_attr("dense_grads"))
    except ValueError:
        return []


def one_id_sum_grad(rows, positions, dy, table_name):
    """The dense gradient [u, dim] of `rows` [u, dim] gathered to one-id
    samples `positions` and summed, from the samples' gradient dy: what the
    fused gradient gives such a lookup. Its empty row_splits says one id per
    sample, so no splits are made nor checked."""
    _, grads = library.load().sok_fused_lookup_grad(
        params=[rows], ids=[positions], row_splits=[tf.zeros([0], tf.int64)],
        weights=[tf.zeros([0], rows.dtype)], grads=[dy], combiners=["sum"], weighted=[False],
        max_norms=[0.0], table_names=[table_name], dense_grads=[True])
    return grads[0]


@register_gradient("SokFusedLookupGrad")
def _fused_lookup_grad_grad(op, *grads):
    # A gradient of the lookup's gradient (a gradient penalty on a table's
    # rows) failed in TensorFlow's registry ("gradient registry has no entry
    # for: SokFusedLookupGrad"), naming neither sok_graph nor the way out.
    raise NotImplementedError(
        "sok.lookup_sparse has no second-order gradient (a gradient of a table's gradient, as "
        "a gradient penalty on its rows takes); tf.nn.embedding_lookup_sparse on a "
        "tf.Variable has one")


@register_gradient("SokFusedLookup")
def _fused_lookup_grad(op, *grads):
    n = op.get_attr("num_tables")
    params = op.inputs[:n]
    grads = [  # the last output, the input check, has no gradient
        tf.zeros_like(op.outputs[t]) if g is None else g for t, g in enumerate(grads[:n])
    ]
    # A table given as a resource variable is read in place by the forward
    # op when it runs: the gradient, and so the table's update, waits for
    # that read (util_ops.after_read).
    in_place = any(p.dtype == tf.resource for p in params)
    with util_ops.after_read(op) if in_place else contextlib.nullcontext():
        unique_ids, grad_rows = library.load().sok_fused_lookup_grad(
            params=list(params),
            ids=list(op.inputs[n:2 * n]),
            row_splits=list(op.inputs[2 * n:3 * n]),
            weights=list(op.inputs[3 * n:4 * n]),
            grads=grads,
            **_attrs(op),
        )
    dense = _dense_grads(op) or [False] * n
    param_grads = [
        grad_rows[t] if dense[t] else
        IndexedSlices(grad_rows[t], unique_ids[t], table_shape(params[t]))
        for t in range(n)
    ]
    # ids, row_splits: integer inputs. weights: not differentiated (documented
    # in sok_graph.lookup_sparse).
    return param_grads + [None] * (3 * n)
