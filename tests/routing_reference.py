"""numpy's model of the sender's side of a grouped exchange
(SokRouteGroupedKeys), for the op's tests (tests/ops/test_sharding_ops.py)
and the launcher's GPU checks (tests/gpu/util_checks.py)."""

import numpy as np


def routed(ids, tables, count, world_size, fixed_owner=-1):
    """numpy's model of the sender's side of a grouped exchange: the distinct
    keys id * count + table in order of first appearance, stably grouped by
    owner, each as its owner reads it; -1 after them; and each id's slot."""
    with np.errstate(over="ignore"):
        keys = ids.astype(np.int64) * np.int64(count) + tables.astype(np.int64)
    _, first = np.unique(keys, return_index=True)
    distinct = keys[np.sort(first)]
    if fixed_owner >= 0:
        owners = np.full(distinct.shape, fixed_owner, np.int64)
        on_owner = distinct
    else:
        owners = (distinct // count) % world_size  # numpy's // and % round down
        on_owner = (distinct // count // world_size) * count + distinct % count
    order = np.argsort(owners, kind="stable")
    sent = np.full(keys.shape, -1, np.int64)
    sent[:len(distinct)] = on_owner[order]
    place = {int(k): i for i, k in enumerate(distinct[order])}
    slots = np.array([place[int(k)] for k in keys], np.int64)
    return sent, np.bincount(owners, minlength=world_size), slots
