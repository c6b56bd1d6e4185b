"""The fused sparse optimizer ops: SokSparseApply (tf_ops/optimizer) updates
every static table of an apply_gradients call, and its slots, in place, in
one op, instead of a gather, the formula's element-wise ops and a scatter per
table and slot; SokDynamicSparseApply (tf_ops/dynamic) does the same for one
dynamic table and its slot tables, instead of a find, a find-or-insert per
slot table, the formula's ops and a scatter per table. Their kernels (CPU
and GPU) compute every algorithm of algorithms.py on float32 tables (the
formulas are tf_ops/optimizer/core/sparse_apply.h); algorithms.py's own
formulas update tables of other dtypes.
"""

import collections
import threading

import tensorflow as tf

from sok_graph import compat
from sok_graph.ops import dynamic as dynamic_ops
from sok_graph.ops import library
from sok_graph.optimization.algorithms import kernel_slot_names, value

# The hyperparameters the ops can be given, beside "lr": attributes of the
# optimizer's Hyperparameters of the same names as in the ops' `hyper_names`
# (their order is read from the registered op).
_HP_ATTRIBUTES = frozenset(
    ["momentum", "epsilon", "beta_1", "beta_2", "lr_power", "l1", "l2", "l2_shrinkage", "beta",
     "rho"])


def _hyperparameter(hp, lr, name):
    return lr if name == "lr" else getattr(hp, name)


# What the ops compute, as tf_ops/optimizer/core/sparse_apply.h (the one list)
# spells it in the registered op: algorithms (the kernel names of
# algorithms.ALGORITHMS' entries) with their slots in the ops' order, and the
# hyperparameters in the order of the `hyper` input.
Spec = collections.namedtuple("Spec", ["algorithms", "slots", "hyper_names"])
_spec = None
_spec_lock = threading.Lock()


def spec():
    """The ops' Spec, read from the loaded library once and checked against
    algorithms.py (slot names) and _HP_ATTRIBUTES; a mismatch raises."""
    global _spec
    with _spec_lock:
        if _spec is None:
            library.load()  # registers the ops
            _spec = _read_spec({name: compat.registered_op_def(name) for name in OPS})
        return _spec


# The fused updates, which must spell out the same spec.
OPS = ("SokSparseApply", "SokDynamicSparseApply")


def _read_spec(op_defs):
    """The Spec of `op_defs` ({op name: OpDef} for OPS), checked."""
    found = {}
    for name in OPS:
        attrs = {a.name: a for a in op_defs[name].attr}
        if "slot_names" not in attrs or "hyper_names" not in attrs:
            raise RuntimeError(f"the op library's {name} has no slot_names / hyper_names: it "
                               f"is older than this sok_graph; build it again")
        algorithms = tuple(s.decode() for s in attrs["algorithm"].allowed_values.list.s)
        slots = {}
        for entry in attrs["slot_names"].default_value.list.s:
            algorithm, _, names = entry.decode().partition(":")
            slots[algorithm] = tuple(n for n in names.split(",") if n)
        hyper_names = tuple(s.decode() for s in attrs["hyper_names"].default_value.list.s)
        found[name] = Spec(algorithms, slots, hyper_names)
    if found["SokSparseApply"] != found["SokDynamicSparseApply"]:
        raise RuntimeError(f"the fused updates disagree: {found}")
    got = found["SokSparseApply"]
    ours = kernel_slot_names()
    for algorithm in sorted(set(got.algorithms) | set(ours)):
        if ours.get(algorithm) != got.slots.get(algorithm):
            raise RuntimeError(f"the fused update keeps the slots {got.slots.get(algorithm)} for "
                               f"'{algorithm}'; optimization/algorithms.py keeps "
                               f"{ours.get(algorithm)}")
    unknown = [n for n in got.hyper_names if n != "lr" and n not in _HP_ATTRIBUTES]
    if unknown:
        raise RuntimeError(f"the fused update takes hyperparameters {unknown} that "
                           f"optimization/fused_apply.py does not know")
    return got


def fused_algorithms():
    """The algorithms the ops compute (kernel names of algorithms.ALGORITHMS'
    entries: Hyperparameters.kernel)."""
    return spec().algorithms


def _hyper(hp, lr):
    """The op's `hyper` vector in the op's order (spec().hyper_names) as
    float32 (tensors, variables, callables and floats alike)."""
    return tf.stack([tf.cast(value(_hyperparameter(hp, lr, n)), tf.float32)
                     for n in spec().hyper_names])


def sparse_apply(variables, slots, indices, values, hp, lr, step):
    """One step of hp's algorithm on rows `indices[t]` (distinct, in range)
    of each `variables[t]` from `values[t]`; `slots` lists each table's slots
    in the algorithm's order, table after table. Returns the op."""
    if len({i.dtype for i in indices}) > 1:
        indices = [tf.cast(i, tf.int64) for i in indices]
    return library.load().sok_sparse_apply(
        vars=[v.handle for v in variables], slots=[s.handle for s in slots],
        indices=list(indices), grads=list(values), hyper=_hyper(hp, lr),
        step=tf.cast(step, tf.int64), algorithm=hp.kernel, tf1=bool(hp.tf1),
        keras_optimizer_v2=bool(hp.keras_v2), nesterov=bool(hp.nesterov))


def dynamic_sparse_apply(table, slots, keys, values, hp, lr, step):
    """One step of hp's algorithm for distinct `keys` of DynamicVariable
    `table` from `values`; `slots`: its slot tables in the algorithm's order.
    Returns the op."""
    return dynamic_ops.sparse_apply(
        table.handle, [s.handle for s in slots], keys, values, _hyper(hp, lr),
        tf.cast(step, tf.int64), hp.kernel, tf1=hp.tf1, keras_optimizer_v2=hp.keras_v2,
        nesterov=hp.nesterov)
