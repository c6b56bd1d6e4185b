"""The fused sparse optimizer op (tf_ops/optimizer, SokSparseApply): one op
updates every static table of an apply_gradients call, and its slots, in
place, instead of a gather, the formula's element-wise ops and a scatter per
table and slot. Its kernels (CPU and GPU) compute the formulas of
algorithms.py, which remain the path for the other algorithms, dynamic
tables and non-float32 tables.
"""

import tensorflow as tf

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
