"""The fused sparse optimizer ops: SokSparseApply (tf_ops/optimizer) updates
every static table of an apply_gradients call, and its slots, in place, in
one op, instead of a gather, the formula's element-wise ops and a scatter per
table and slot; SokDynamicSparseApply (tf_ops/dynamic) does the same for one
dynamic table and its slot tables, instead of a find, a find-or-insert per
slot table, the formula's ops and a scatter per table. Their kernels (CPU
and GPU) compute the formulas of algorithms.py, which remain the path for
the other algorithms and for tables that are not float32.
"""

import tensorflow as tf

from sok_graph.ops import dynamic as dynamic_ops
from sok_graph.ops import library
from sok_graph.optimization.algorithms import value

# The algorithms (entries of algorithms.ALGORITHMS) the op computes.
FUSED_ALGORITHMS = ("sgd", "momentum", "adagrad", "adam", "ftrl")


def _hyper(hp, lr):
    """The op's `hyper` vector: [lr, momentum, epsilon, beta_1, beta_2,
    lr_power, l1, l2, l2_shrinkage, beta] as float32 (tensors, variables,
    callables and floats alike)."""
    def f(x):
        return tf.cast(value(x), tf.float32)

    return tf.stack([f(lr), f(hp.momentum), f(hp.epsilon), f(hp.beta_1), f(hp.beta_2),
                     f(hp.lr_power), f(hp.l1), f(hp.l2), f(hp.l2_shrinkage), f(hp.beta)])


def sparse_apply(variables, slots, indices, values, hp, lr, step):
    """One step of hp's algorithm on rows `indices[t]` (distinct, in range)
    of each `variables[t]` from `values[t]`; `slots` lists each table's slots
    in the algorithm's order, table after table. Returns the op."""
    if len({i.dtype for i in indices}) > 1:
        indices = [tf.cast(i, tf.int64) for i in indices]
    return library.load().sok_sparse_apply(
        vars=[v.handle for v in variables], slots=[s.handle for s in slots],
        indices=list(indices), grads=list(values), hyper=_hyper(hp, lr),
        step=tf.cast(step, tf.int64), algorithm=hp.algorithm.name, tf1=bool(hp.tf1),
        nesterov=bool(hp.nesterov))


def dynamic_sparse_apply(table, slots, keys, values, hp, lr, step):
    """One step of hp's algorithm for distinct `keys` of DynamicVariable
    `table` from `values`; `slots`: its slot tables in the algorithm's order.
    Returns the op."""
    return dynamic_ops.sparse_apply(
        table.handle, [s.handle for s in slots], keys, values, _hyper(hp, lr),
        tf.cast(step, tf.int64), hp.algorithm.name, tf1=hp.tf1, nesterov=hp.nesterov)
