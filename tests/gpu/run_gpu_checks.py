"""Checks and times sok_graph's CUDA kernels through their C launchers, on a
GPU machine with CUDA, CuPy and (optionally) PyTorch but no TensorFlow.

    python tests/gpu/run_gpu_checks.py path/to/libsok_cuda_kernels.so \
        --cpu-ref path/to/libcpu_table_ref.so [--quick] [--checks-only]

(tests/gpu/run_all.sh builds both libraries from source and runs this.)

Every check draws fresh random inputs, poisons outputs with NaN first, and
compares with a float64 numpy reference. Timings use CUDA events (median of
repeats, after warm-up) and print ratios against baselines measured in the
same run: device-to-device copy bandwidth and torch embedding_bag.
"""

import argparse
import ctypes
import os
import sys

import cupy as cp
import numpy as np
import table_checks
import util_checks


class Table(ctypes.Structure):
    _fields_ = [("params", ctypes.c_void_p), ("ids", ctypes.c_void_p),
                ("row_splits", ctypes.c_void_p), ("weights", ctypes.c_void_p),
                ("clip", ctypes.c_void_p), ("out", ctypes.c_void_p), ("batch", ctypes.c_int64),
                ("rows", ctypes.c_int64), ("nnz", ctypes.c_int64), ("dim", ctypes.c_int32),
                ("combiner", ctypes.c_int32),
                ("id_bytes", ctypes.c_int32), ("max_norm", ctypes.c_float)]


assert ctypes.sizeof(Table) == 88, "SokLookupTable layout changed"


class GradTable(ctypes.Structure):
    _fields_ = [("grads", ctypes.c_void_p), ("unique_ids", ctypes.c_void_p),
                ("grad_rows", ctypes.c_void_p), ("dense", ctypes.c_int32),
                ("path", ctypes.c_int32)]


assert ctypes.sizeof(GradTable) == 32, "SokLookupGradTable layout changed"
COMBINERS = {"sum": 0, "mean": 1, "sqrtn": 2}
I64_MAX = 2**63 - 1


def load(path):
    lib = ctypes.CDLL(path)
    P = ctypes.c_void_p
    lib.sok_lookup_forward_f32.argtypes = [P, P, ctypes.c_int, ctypes.c_int64, ctypes.c_int,
                                           ctypes.c_int, ctypes.c_int, P, P]
    lib.sok_lookup_forward_f32.restype = ctypes.c_int
    lib.sok_lookup_clip_factors.argtypes = [P, ctypes.c_int64, P, P, P]
    lib.sok_lookup_clip_factors.restype = ctypes.c_int
    lib.sok_lookup_backward_plan.argtypes = [P, P, ctypes.c_int, P, P, P,
                                             ctypes.POINTER(ctypes.c_size_t), P]
    lib.sok_lookup_backward_plan.restype = ctypes.c_int
    lib.sok_lookup_backward_rows.argtypes = [P, P, ctypes.c_int, P, P, P, P]
    lib.sok_lookup_backward_rows.restype = ctypes.c_int
    lib.sok_lookup_backward_dense_unordered.argtypes = [P, P, ctypes.c_int, P, P, P]
    lib.sok_lookup_backward_dense_unordered.restype = ctypes.c_int
    lib.sok_lookup_backward_dense_atomics.argtypes = [P, P, ctypes.c_int, P, P, P]
    lib.sok_lookup_backward_dense_atomics.restype = ctypes.c_int
    lib.sok_lookup_backward_dense_slice_width.argtypes = [P, ctypes.POINTER(ctypes.c_int)]
    lib.sok_lookup_backward_dense_slice_width.restype = ctypes.c_int
    lib.sok_lookup_backward_dense_slices_built.argtypes = []
    lib.sok_lookup_backward_dense_slices_built.restype = ctypes.c_int
    lib.sok_lookup_check_splits.argtypes = [P, ctypes.c_int, ctypes.c_int64, P, P]
    lib.sok_lookup_check_splits.restype = ctypes.c_int
    lib.sok_unique_segment_sum_f32.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p]
    lib.sok_unique_segment_sum_f32.restype = ctypes.c_int
    return lib


class UniqueSum:
    """sok_unique_segment_sum_f32 with its outputs and scratch allocated once."""

    def __init__(self, lib, n, dim, key_bits=64):
        self.lib, self.n, self.dim, self.key_bits = lib, n, dim, key_bits
        size = ctypes.c_size_t(0)
        rc = lib.sok_unique_segment_sum_f32(None, None, n, dim, key_bits, None, None, None,
                                            None, ctypes.byref(size), None)
        assert rc == 0, rc
        self.temp_bytes = size
        self.temp = cp.empty(size.value, cp.uint8)
        self.unique = cp.full(max(n, 1), -7, cp.int64)
        self.summed = cp.full((max(n, 1), dim), cp.nan, cp.float32)
        self.count = cp.zeros(1, cp.int64)

    def __call__(self, ids, grads):
        rc = self.lib.sok_unique_segment_sum_f32(
            ids.data.ptr, grads.data.ptr, self.n, self.dim, self.key_bits, self.unique.data.ptr,
            self.summed.data.ptr, self.count.data.ptr, self.temp.data.ptr,
            ctypes.byref(self.temp_bytes), cp.cuda.get_current_stream().ptr)
        if rc != 0:
            raise RuntimeError(f"sok_unique_segment_sum_f32 returned cudaError {rc}")

    def result(self):
        u = int(self.count[0])
        return cp.asnumpy(self.unique[:u]), cp.asnumpy(self.summed[:u])


def check_unique_sum(lib, rng):
    failures = cases = 0
    for n, dim, case, bits in [(1000, 16, "random", 64), (5000, 3, "random", 11),
                               (777, 128, "all_equal", 64), (1, 8, "random", 1),
                               (4096, 33, "extremes", 64), (0, 4, "random", 64),
                               (20000, 16, "random", 13)]:
        if case == "all_equal":
            ids = np.full(n, 123456789, np.int64)
        elif case == "extremes":
            ids = rng.choice(np.array([0, 2**63 - 1, -2**63, -1, 5], np.int64), size=n)
        else:
            ids = rng.integers(0, max(2, n // 3), size=n).astype(np.int64)
        grads = rng.standard_normal((n, dim)).astype(np.float32)
        if bits < 64:
            ids = ids % (1 << bits)
        op = UniqueSum(lib, n, dim, bits)
        op(cp.asarray(ids), cp.asarray(grads) if n else cp.zeros((1, dim), cp.float32))
        cp.cuda.get_current_stream().synchronize()
        got_ids, got = op.result()
        want_ids, inverse = np.unique(ids, return_inverse=True)
        want = np.zeros((len(want_ids), dim))
        np.add.at(want, inverse, grads.astype(np.float64))
        cases += 1
        ok = np.array_equal(got_ids, want_ids) and not np.isnan(got).any() and (
            got.size == 0 or np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30) < 1e-5)
        if not ok:
            failures += 1
            print(f"FAIL unique+sum n={n} dim={dim} {case} key_bits={bits}")
    print(f"unique + segment-sum checks: {cases - failures} passed, {failures} failed")
    return failures


def bench_unique_sum(lib, n, dim, id_range, key_bits):
    ids = cp.random.randint(0, id_range, size=n, dtype=cp.int64)
    grads = cp.random.standard_normal((n, dim), dtype=cp.float32)
    op = UniqueSum(lib, n, dim, key_bits)
    ms = time_ms(lambda: op(ids, grads))
    try:
        import torch

        t_ids = torch.as_tensor(ids, device="cuda")
        t_grads = torch.as_tensor(grads, device="cuda")

        def torch_backward():
            u, inv = torch.unique(t_ids, return_inverse=True)
            torch.zeros((u.shape[0], dim), device="cuda").index_add_(0, inv, t_grads)

        torch_ms = time_ms(torch_backward)
    except ImportError:
        torch_ms = float("nan")
    return ms, torch_ms


def describe(t, out=None, clip=None):
    """A SokLookupTable for a dict of cupy arrays (params, ids, splits,
    weights|None, combiner, max_norm; no_splits: given as one id per sample,
    row_splits NULL, as the gradient op passes an empty row_splits)."""
    no_splits = t.get("no_splits", False)
    batch = int(t["ids"].shape[0]) if no_splits else int(t["splits"].shape[0]) - 1
    w = t.get("weights")
    return Table(t["params"].data.ptr, t["ids"].data.ptr,
                 None if no_splits else t["splits"].data.ptr,
                 w.data.ptr if w is not None else None,
                 clip.data.ptr if clip is not None else None,
                 out.data.ptr if out is not None else None, batch, int(t["params"].shape[0]),
                 int(t["ids"].shape[0]), int(t["params"].shape[1]), COMBINERS[t["combiner"]], t["ids"].dtype.itemsize,
                 float(t.get("max_norm", 0.0)))


def forward(lib, tables, vectorized=None, with_bad=False, lanes=32):
    """tables: list of dicts of cupy arrays (see describe). Returns the
    outputs (cupy) and, with with_bad, each table's first bad id position.
    lanes: lanes per sample (32: a warp; 4, 8, 16: teams, float4 layouts)."""
    descs = (Table * len(tables))()
    outs, keep = [], []
    stream = cp.cuda.get_current_stream().ptr
    first_bad = cp.full(len(tables), I64_MAX, cp.int64)
    for i, t in enumerate(tables):
        batch = int(t["splits"].shape[0]) - 1
        dim = int(t["params"].shape[1])
        out = cp.full((batch, dim), cp.nan, cp.float32)  # poisoned
        outs.append(out)
        clip = None
        if t.get("max_norm", 0.0) > 0:
            nnz = int(t["ids"].shape[0])
            clip = cp.full(max(nnz, 1), cp.nan, cp.float32)
            keep.append(clip)
            desc = describe(t, out, None)
            rc = lib.sok_lookup_clip_factors(ctypes.byref(desc), nnz, clip.data.ptr,
                                             first_bad[i:].data.ptr, stream)
            if rc != 0:
                raise RuntimeError(f"sok_lookup_clip_factors returned cudaError {rc}")
        descs[i] = describe(t, out, clip)
    if vectorized is None:
        vectorized = all(t["params"].shape[1] % 4 == 0 for t in tables)
    d_descs = cp.asarray(np.frombuffer(bytes(descs), np.uint8))
    offsets = cp.asarray(np.concatenate([[0], np.cumsum([o.shape[0] for o in outs])]).astype(
        np.int64))
    keep += [d_descs, offsets]
    rc = lib.sok_lookup_forward_f32(d_descs.data.ptr, offsets.data.ptr, len(tables),
                                    int(offsets[-1]), int(vectorized),
                                    tables[0]["ids"].dtype.itemsize, lanes, first_bad.data.ptr,
                                    stream)
    if rc != 0:
        raise RuntimeError(f"sok_lookup_forward_f32 returned cudaError {rc}")
    cp.cuda.get_current_stream().synchronize()
    if with_bad:
        return outs, cp.asnumpy(first_bad)
    assert (cp.asnumpy(first_bad) == I64_MAX).all(), "valid ids reported as bad"
    return outs


def clip_rows(params, max_norm):
    """tf.clip_by_norm of every row (float64)."""
    params = params.astype(np.float64)
    if max_norm <= 0:
        return params
    norm = np.sqrt((params * params).sum(1, keepdims=True))
    return params * np.where(norm > max_norm, max_norm / np.maximum(norm, 1e-300), 1.0)


def reference(params, ids, splits, weights, combiner, max_norm=0.0):
    params = clip_rows(params, max_norm)
    out = np.zeros((len(splits) - 1, params.shape[1]))
    for b in range(len(splits) - 1):
        j0, j1 = splits[b], splits[b + 1]
        if j1 == j0:
            continue
        w = np.ones(j1 - j0) if weights is None else weights[j0:j1].astype(np.float64)
        s = (w[:, None] * params[ids[j0:j1]]).sum(0)
        if combiner == "mean":
            s = s / w.sum() if w.sum() != 0 else s * 0
        elif combiner == "sqrtn":
            s = s / np.sqrt((w * w).sum())
        out[b] = s
    return out


def backward(lib, t, grads):
    """The gradient of one table (dict of cupy arrays): unique ids, gradient
    rows, first bad position."""
    return backward_tables(lib, [t], [grads])[0]


def backward_plan(lib, tables, num, first_bad):
    """sok_lookup_backward_plan on every table (sized, then run): num and
    first_bad (cupy int64, one per table, or a [7, n] check whose row 0 it
    fills) are its outputs; num None for dense gradients alone, as the op
    calls it then. Returns the host and device descriptors, the plan's
    scratch and the stream, for the rows call."""
    n = len(tables)
    host = (Table * n)(*[describe(t) for t in tables])
    dev = cp.asarray(np.frombuffer(bytes(host), np.uint8))
    stream = cp.cuda.get_current_stream().ptr
    size = ctypes.c_size_t(0)
    num_ptr = None if num is None else num.data.ptr
    rc = lib.sok_lookup_backward_plan(host, dev.data.ptr, n, num_ptr, first_bad.data.ptr,
                                      None, ctypes.byref(size), stream)
    assert rc == 0, rc
    temp = cp.empty(max(size.value, 1), cp.uint8)
    rc = lib.sok_lookup_backward_plan(host, dev.data.ptr, n, num_ptr, first_bad.data.ptr,
                                      temp.data.ptr, ctypes.byref(size), stream)
    assert rc == 0, rc
    return host, dev, temp, stream


def backward_tables(lib, tables, grads, dense=False):
    """sok_lookup_backward_plan + _rows on every table at once (dicts of
    cupy arrays; grads: one cupy [batch, dim] per table): per table its
    unique ids, gradient rows and first bad position. dense: every table's
    gradient as the op's dense_grads lays it out, [rows, dim] (unique ids
    then empty), without reading the counts, and with the bad-id check
    passed to the rows call as the op passes it."""
    if dense:
        return backward_dense(lib, tables, grads)
    n = len(tables)
    num = cp.full(n, -7, cp.int64)
    bad = cp.full(n, I64_MAX, cp.int64)
    host, dev, temp, stream = backward_plan(lib, tables, num, bad)
    counts = cp.asnumpy(num)  # the host synchronisation the op needs for its output sizes
    firsts = cp.asnumpy(bad)
    # Poisoned outputs, one spare row each: a write past a table's count shows.
    uniq = [cp.full(int(u) + 1, -7, t["ids"].dtype) for t, u in zip(tables, counts)]
    rows = [cp.full((int(u) + 1, int(t["params"].shape[1])), cp.nan, cp.float32)
            for t, u in zip(tables, counts)]
    if (firsts == I64_MAX).all():
        outs = (GradTable * n)(*[GradTable(g.data.ptr, u.data.ptr, r.data.ptr, 0, 0)
                                 for g, u, r in zip(grads, uniq, rows)])
        d_outs = cp.asarray(np.frombuffer(bytes(outs), np.uint8))
        rc = lib.sok_lookup_backward_rows(host, dev.data.ptr, n, d_outs.data.ptr, None,
                                          temp.data.ptr, stream)
        assert rc == 0, rc
    cp.cuda.get_current_stream().synchronize()
    result = []
    for u, ids, r, first in zip(counts, uniq, rows, firsts):
        u = int(u)
        spare_clean = int(ids[u]) == -7 and bool(cp.isnan(r[u]).all())
        assert spare_clean or first != I64_MAX, "the gradient wrote past a table's rows"
        result.append((cp.asnumpy(ids[:u]), cp.asnumpy(r[:u]), int(first)))
    return result


def dense_outputs(tables, grads):
    """Dense gradient outputs as the op gives them, zeroed [rows, dim], plus
    a NaN spare row each (a write past a table's rows shows), and their
    SokLookupGradTable descriptors on the device."""
    rows = []
    for t in tables:
        r = cp.zeros((int(t["params"].shape[0]) + 1, int(t["params"].shape[1])), cp.float32)
        r[-1] = cp.nan
        rows.append(r)
    outs = (GradTable * len(tables))(*[GradTable(g.data.ptr, None, r.data.ptr, 1, 0)
                                       for g, r in zip(grads, rows)])
    return rows, cp.asarray(np.frombuffer(bytes(outs), np.uint8))


def backward_dense(lib, tables, grads):
    """backward_tables(..., dense=True): plan and rows with no read-back in
    between; outputs zeroed as the op zeroes them, plus a poisoned spare row."""
    n = len(tables)
    # The op's check [7, n]: row 0 (first bad position) is the plan's first_bad.
    checks = cp.full((7, n), I64_MAX, cp.int64)
    host, dev, temp, stream = backward_plan(lib, tables, None, checks)
    rows, d_outs = dense_outputs(tables, grads)
    rc = lib.sok_lookup_backward_rows(host, dev.data.ptr, n, d_outs.data.ptr, checks.data.ptr,
                                      temp.data.ptr, stream)
    assert rc == 0, rc
    cp.cuda.get_current_stream().synchronize()
    result = []
    for r, first in zip(rows, cp.asnumpy(checks[0])):
        assert bool(cp.isnan(r[-1]).all()), "the dense gradient wrote past a table's rows"
        result.append((np.zeros(0), cp.asnumpy(r[:-1]), int(first)))
    return result


def grad_paths(d_outs, n):
    """The path field of each of n SokLookupGradTables in device memory (the
    unordered gradient writes 1 where a one-id table's ids repeat often
    enough for the kernel that sums a warp's repeated ids first)."""
    return [int(p) for p in cp.asnumpy(d_outs).view(np.int32).reshape(n, 8)[:, 7]]


def backward_unordered(lib, tables, grads, atomics_only=False, paths=None):
    """sok_lookup_backward_dense_unordered on every table as the op calls it
    (atomics_only: sok_lookup_backward_dense_atomics, no shared-memory
    slices): row 3 of the check filled by sok_lookup_check_splits first,
    outputs zeroed, plus a poisoned spare row. Per table: its [rows, dim]
    gradient, its first bad id position and its row_splits finding (row 3).
    paths (a list): receives each table's grad_paths."""
    n = len(tables)
    host = (Table * n)(*[describe(t) for t in tables])
    dev = cp.asarray(np.frombuffer(bytes(host), np.uint8))
    stream = cp.cuda.get_current_stream().ptr
    checks = cp.full((7, n), I64_MAX, cp.int64)
    rc = lib.sok_lookup_check_splits(dev.data.ptr, n, max(t.batch for t in host),
                                     checks.data.ptr, stream)
    assert rc == 0, rc
    rows, d_outs = dense_outputs(tables, grads)
    fn = (lib.sok_lookup_backward_dense_atomics if atomics_only
          else lib.sok_lookup_backward_dense_unordered)
    rc = fn(host, dev.data.ptr, n, d_outs.data.ptr, checks.data.ptr, stream)
    assert rc == 0, rc
    cp.cuda.get_current_stream().synchronize()
    if paths is not None:
        paths.extend(grad_paths(d_outs, n))
    result = []
    for r, first, splits_bad in zip(rows, cp.asnumpy(checks[0]), cp.asnumpy(checks[3])):
        assert bool(cp.isnan(r[-1]).all()), "the unordered gradient wrote past a table's rows"
        result.append((cp.asnumpy(r[:-1]), int(first), int(splits_bad)))
    return result


def dense_reference(h, grads):
    """A table's dense gradient [rows, dim] in float64 (no clip): each
    position's factor (weight x its sample's combiner scale, weights summed
    per sample), then np.add.at, so big batches take no loop over samples.
    h["splits"] None: one unweighted id per sample."""
    ids = h["ids"].astype(np.int64)
    g = grads.astype(np.float64)
    want = np.zeros(h["params"].shape)
    if h["splits"] is None:
        np.add.at(want, ids, g)
        return want
    splits = h["splits"]
    lengths = np.diff(splits)
    sample = np.repeat(np.arange(len(lengths)), lengths)
    w = (np.ones(len(ids)) if h["weights"] is None else h["weights"].astype(np.float64))
    wsum = np.bincount(sample, weights=w, minlength=len(lengths))
    wsq = np.bincount(sample, weights=w * w, minlength=len(lengths))
    scale = np.ones(len(lengths))
    if h["combiner"] == "mean":
        scale = np.divide(1.0, wsum, out=np.zeros_like(wsum), where=wsum != 0)
    elif h["combiner"] == "sqrtn":
        scale = np.divide(1.0, np.sqrt(wsq), out=np.zeros_like(wsq), where=wsq > 0)
    np.add.at(want, ids, (w * scale[sample])[:, None] * g[sample])
    return want


def close_to_reference(got, h, g):
    """got is h's dense gradient for upstream g, to float32 rounding: within
    1e-5 of the sum of the terms' magnitudes (an all-equal table's thousand
    terms may cancel to a small sum; one term lost is about a thousandth of
    that sum)."""
    want = dense_reference(h, g)
    scale = dense_reference(dict(h, weights=None if h["weights"] is None
                                 else np.abs(h["weights"])), np.abs(g))
    return (not np.isnan(got).any() and
            bool((np.abs(got - want) <= 1e-5 * scale + 1e-6).all()))


class Tally:
    """Counts a group of checks; expect() prints each failure."""

    def __init__(self, what):
        self.what, self.cases, self.failures = what, 0, 0

    def expect(self, ok, case):
        self.cases += 1
        if not ok:
            self.failures += 1
            print(f"FAIL {self.what}: {case}")

    def report(self, title):
        print(f"{title}: {self.cases - self.failures} passed, {self.failures} failed")
        return self.failures


def check_unordered(lib, rng):
    """The dense gradient summed with atomics (no fixed order) against
    float64 numpy: every layout and combiner, weights, hot ids, one id per
    sample without row_splits, bad ids and malformed row_splits (the table
    keeps its zero gradient, the others get theirs), and the refusals."""
    tally = Tally("unordered dense gradient")
    expect = tally.expect

    for dims, combiner, weighted, case, host in table_groups(
            rng, ([1, 3, 33], [4, 16, 128], [5, 128, 7], [8, 32, 64])):
        for h in host:
            h["ids"] = h["ids"].astype(np.int32 if rng.random() < 0.5 else np.int64)
        grads = [rng.standard_normal((len(h["splits"]) - 1, h["params"].shape[1]))
                 .astype(np.float32) for h in host]
        got = backward_unordered(lib, [to_device(h) for h in host],
                                 [cp.asarray(g) for g in grads])
        for h, g, (rows, first, splits_bad) in zip(host, grads, got):
            expect(first == I64_MAX and splits_bad == I64_MAX
                   and close_to_reference(rows, h, g),
                   f"dims {dims} {combiner} weighted={weighted} {case} dim {g.shape[1]}")
    # One id per sample, given without row_splits (the DemoModel's), beside
    # a table with them; and a gradient that starts off 16-byte alignment.
    for no_splits in (False, True):
        host = []
        for d in (16, 4, 3):
            batch = int(rng.integers(1, 5000))
            host.append(dict(params=rng.standard_normal((300, d)).astype(np.float32),
                             ids=rng.integers(0, 300, batch).astype(np.int64),
                             splits=np.arange(batch + 1, dtype=np.int64), weights=None,
                             combiner="mean"))
        host.append(random_table(rng, 200, 8, 100, 4, "sqrtn", True))
        dev = [dict(to_device(h), no_splits=no_splits and k < 3) for k, h in enumerate(host)]
        grads = [rng.standard_normal((len(h["splits"]) - 1, h["params"].shape[1]))
                 .astype(np.float32) for h in host]
        shifted = cp.asarray(np.concatenate([[0.0], grads[0].ravel()]).astype(np.float32))
        d_grads = [cp.asarray(g) for g in grads]
        d_grads[0] = shifted[1:].reshape(grads[0].shape)  # 4 bytes past an allocation's start
        got = backward_unordered(lib, dev, d_grads)
        for k, (h, g, (rows, first, _)) in enumerate(zip(host, grads, got)):
            expect(first == I64_MAX and close_to_reference(rows, h, g),
                   f"one id per sample, no_splits={no_splits}, table {k}")
    # Hot ids: every position of a big batch on a handful of rows.
    # Small integers, so every order of the float additions gives the exact
    # sum: a lost or doubled addition shows.
    h = dict(params=rng.standard_normal((5, 16)).astype(np.float32),
             ids=rng.integers(0, 5, 200000).astype(np.int64),
             splits=np.arange(200001, dtype=np.int64), weights=None, combiner="sum")
    g = rng.integers(-3, 4, (200000, 16)).astype(np.float32)
    rows, first, _ = backward_unordered(lib, [to_device(h)], [cp.asarray(g)])[0]
    expect(first == I64_MAX and np.array_equal(rows, dense_reference(h, g)),
           "200000 positions on 5 rows (exact sums)")
    # Half the ids on one padding id, samples of 0-4 ids, the block's row
    # cache at several widths (dim 9000: no cache), exact sums again.
    for dim in (1, 7, 100, 9000):
        batch = 100000 // dim + 10
        h = random_table(rng, 700, dim, batch, 4, "sum", False)
        h["ids"][rng.random(len(h["ids"])) < 0.5] = 3
        g = rng.integers(-3, 4, (batch, dim)).astype(np.float32)
        rows, first, _ = backward_unordered(lib, [to_device(h)], [cp.asarray(g)])[0]
        expect(first == I64_MAX and np.array_equal(rows, dense_reference(h, g)),
               f"half the ids on one id, dim {dim} (exact sums)")
    # One id per sample without row_splits, on rows too many for the
    # shared-memory slices. From 2^20 items on, a probe of the ids decides:
    # a hot id or every id the same must take the kernel that sums a warp's
    # repeated ids first (path 1), uniform ids global atomics per item
    # (path 0), a tenth on one id either; smaller tables are not probed
    # (path 0). Windows cut short by the batch's end, both id types; exact
    # sums.
    for dim, batch, hot in ((1, 1100003, 0.5), (16, 70001, 0.5), (16, 70001, 0.0),
                            (33, 40001, 1.0), (100, 11000, 0.1), (7, 31, 1.0),
                            (300, 4000, 0.0), (16, 40000, 0.5)):
        for dtype in (np.int32, np.int64):
            h = dict(params=np.zeros((100000, dim), np.float32),
                     ids=rng.integers(0, 100000, batch).astype(dtype),
                     splits=np.arange(batch + 1, dtype=np.int64), weights=None,
                     combiner="sum")
            h["ids"][rng.random(batch) < hot] = 7
            g = rng.integers(-3, 4, (batch, dim)).astype(np.float32)
            t = dict(to_device(h), no_splits=True)
            paths = []
            rows, first, _ = backward_unordered(lib, [t], [cp.asarray(g)], paths=paths)[0]
            probed = batch * dim >= 1 << 20
            want_path = ([0] if hot == 0.0 or not probed else [1] if hot >= 0.5 else [0, 1])
            expect(slice_width(lib, t) == 0 and first == I64_MAX and paths[0] in want_path
                   and np.array_equal(rows, dense_reference(h, g)),
                   f"one id per sample, no row_splits, {hot:.0%} on one id, dim {dim}, "
                   f"batch {batch}, {np.dtype(dtype).name}, path {paths[0]} (exact sums)")
    # A bad id: reported at its first position; its table keeps its zeros.
    # Malformed row_splits (not ascending): that table keeps its zeros.
    good = [random_table(rng, 300, 8, 40, 4, "sum", False) for _ in range(3)]
    good[1]["ids"][[3, 7]] = [300, -5]
    good[2]["splits"][5] = good[2]["splits"][4] - 1
    grads = [rng.standard_normal((len(h["splits"]) - 1, 8)).astype(np.float32) for h in good]
    got = backward_unordered(lib, [to_device(h) for h in good], [cp.asarray(g) for g in grads])
    expect(got[0][1] == I64_MAX and close_to_reference(got[0][0], good[0], grads[0]),
           "a good table beside bad ones")
    expect(got[1][1] == 3 and not got[1][0].any(), f"bad id: first {got[1][1]}, want 3")
    expect(got[2][2] != I64_MAX and not got[2][0].any(),
           f"malformed row_splits: check row 3 {got[2][2]}")
    # Bad ids in one-id tables without row_splits: the smallest bad
    # position is reported and the table keeps its zeros, beside a good
    # table summed in the same call. 2^32 + 5 lies in [0, rows) once cut
    # to 32 bits, as the kernel for repeated ids holds the ids of tables
    # under 2^32 rows. Each path a one-id table can take: uniform ids
    # (global atomics), half or all on one id (repeats, probed from 2^20
    # items), and a table of no columns (nothing to add).
    for what, dim, batch, hot in (("uniform ids", 16, 70001, 0.0),
                                  ("half on one id", 16, 70001, 0.5),
                                  ("every id the same", 33, 40001, 1.0),
                                  ("dim 0", 0, 5000, 0.0)):
        for dtype, bad_ids in ((np.int64, [2 ** 32 + 5, 100000, -1]), (np.int32, [100000, -7])):
            tables, grads = [], []
            for _ in range(2):
                h = dict(params=np.zeros((100000, dim), np.float32),
                         ids=rng.integers(0, 100000, batch).astype(dtype),
                         splits=np.arange(batch + 1, dtype=np.int64), weights=None,
                         combiner="sum")
                h["ids"][rng.random(batch) < hot] = 7
                tables.append(h)
                grads.append(rng.integers(-3, 4, (batch, dim)).astype(np.float32))
            where = np.sort(rng.choice(batch, len(bad_ids), replace=False))
            tables[0]["ids"][where] = np.array(bad_ids, dtype=np.int64).astype(dtype)
            dev = [dict(to_device(h), no_splits=True) for h in tables]
            paths = []
            got = backward_unordered(lib, dev, [cp.asarray(g) for g in grads], paths=paths)
            expect(got[0][1] == where[0] and not got[0][0].any()
                   and got[1][1] == I64_MAX
                   and np.array_equal(got[1][0], dense_reference(tables[1], grads[1])),
                   f"bad ids {bad_ids} at {list(where)} in a one-id table, {what}, "
                   f"{np.dtype(dtype).name}: first {got[0][1]}, paths {paths}")
    # Refused: a table that clips (max_norm needs each distinct id once),
    # no check to write to, a weighted table without row_splits.
    t = to_device(random_table(rng, 50, 4, 10, 3, "sum", True))
    # Sized for every descriptor below (batch 10, or nnz without row_splits),
    # and kept alive: a launch that is wrongly accepted writes into them.
    g = cp.zeros((int(t["ids"].shape[0]) + 10, 4), cp.float32)
    out = cp.zeros((50, 4), cp.float32)
    for what, desc, checks in (
            ("max_norm", dict(t, max_norm=1.0), cp.full((7, 1), I64_MAX, cp.int64)),
            ("checks NULL", t, None),
            ("weighted without row_splits", dict(t, no_splits=True),
             cp.full((7, 1), I64_MAX, cp.int64))):
        host = (Table * 1)(describe(desc))
        dev = cp.asarray(np.frombuffer(bytes(host), np.uint8))
        outs = (GradTable * 1)(GradTable(g.data.ptr, None, out.data.ptr, 1, 0))
        d_outs = cp.asarray(np.frombuffer(bytes(outs), np.uint8))
        rc = lib.sok_lookup_backward_dense_unordered(
            host, dev.data.ptr, 1, d_outs.data.ptr,
            None if checks is None else checks.data.ptr, cp.cuda.get_current_stream().ptr)
        expect(rc != 0, f"{what} was not refused")
    return tally.report("lookup backward checks (dense, unordered)")


def slice_width(lib, t):
    """The columns per shared-memory slice the unordered gradient gives
    table t (a dict of cupy arrays) on this device; 0: global atomics."""
    width = ctypes.c_int(-1)
    assert lib.sok_lookup_backward_dense_slice_width(ctypes.byref(describe(t)),
                                                     ctypes.byref(width)) == 0
    return width.value


def check_slices(lib, rng):
    """The unordered gradient's shared-memory path (few rows, many one-id
    samples: each block sums a slice of columns per SM): the tables below
    that should take it do (slice_width > 0, one in several slices), and
    every table sums to numpy's float64 gradient — exactly, with
    small-integer gradients — beside tables that take global atomics, and
    the same through global atomics alone; a bad id leaves a sliced table
    zero; the DemoModel's shape takes the path. In a build without the
    slices (clang's: sok_lookup_backward_dense_slices_built() == 0) every
    table must take global atomics instead, with the same sums."""
    tally = Tally("shared-slice dense gradient")
    expect = tally.expect
    built = lib.sok_lookup_backward_dense_slices_built() == 1
    print(f"shared-memory slices in this build: {'yes' if built else 'no'}")

    def table(rows, dim, batch, ids_dtype, hot=0.0, bag=0, combiner="sum", weighted=False):
        """bag 0: one id per sample, no row_splits; else 0..bag ids each."""
        if bag:
            lengths = rng.integers(0, bag + 1, size=batch)
            splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        else:
            splits = None
        nnz = batch if splits is None else int(splits[-1])
        ids = rng.integers(0, rows, size=nnz)
        ids[rng.random(nnz) < hot] = rows // 2
        ids[:2] = [0, rows - 1]
        weights = rng.uniform(0.5, 1.5, nnz).astype(np.float32) if weighted else None
        return dict(params=np.zeros((rows, dim), np.float32), ids=ids.astype(ids_dtype),
                    splits=splits, weights=weights, combiner=combiner)

    def device(h):
        d = to_device(dict(h, splits=np.zeros(1, np.int64) if h["splits"] is None
                           else h["splits"]))
        d["no_splits"] = h["splits"] is None
        return d

    def integers(h):
        batch = len(h["ids"]) if h["splits"] is None else len(h["splits"]) - 1
        return rng.integers(-3, 4, (batch, h["params"].shape[1])).astype(np.float32)

    # (what, host table, exact sums): small-integer gradients of unweighted
    # sums add exactly in any order; the others are within float32 rounding.
    # The first five take the slices; tables with row_splits (bags) and
    # one of too many rows take global atomics in the same call.
    # Five or more slices over an SM count they do not divide: the blocks
    # left over (k >= blocks) must add nothing.
    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    spare = next(h for h in (table(r, 40, 2000000, np.int32) for r in (6500, 5000, 7500, 4000))
                 if sms % -(-40 // max(1, slice_width(lib, device(h)))) != 0)
    group = [("one id per sample, 1 slice", table(50, 16, 80000, np.int64), True),
             ("one id per sample, half on one id", table(64, 16, 200000, np.int32, hot=0.5), True),
             ("several slices (uneven), dim 33", table(2000, 33, 1500000, np.int64, hot=0.3),
              True),
             ("dim 2048 on 10 rows: slices of at most 1024 columns (a thread each)",
              table(10, 2048, 12000, np.int64), True),
             (f"slices that do not divide the {sms} SMs", spare, True),
             ("bags, weighted, mean", table(40, 7, 20000, np.int32, bag=6, combiner="mean",
                                            weighted=True), False),
             ("bags, sqrtn, int64", table(30, 12, 30000, np.int64, bag=5, combiner="sqrtn"),
              False),
             ("one id per sample, 100000 rows", table(100000, 8, 3000, np.int64), True)]
    dev = [device(h) for _, h, _ in group]
    widths = [slice_width(lib, d) for d in dev]
    if built:
        expect(all(w > 0 for w in widths[:5]) and not any(widths[5:]),
               f"slice widths {widths}: the first five tables should take the slices")
        expect(0 < widths[2] < 33, f"dim 33 over 2000 rows in one slice of {widths[2]}")
        expect(widths[3] == 1024, f"dim 2048 over 10 rows in slices of {widths[3]}, not 1024")
    else:
        expect(not any(widths), f"slice widths {widths} in a build without slices")
    grads = [integers(h) if exact else rng.standard_normal(integers(h).shape).astype(np.float32)
             for _, h, exact in group]
    for atomics_only in (False, True):
        got = backward_unordered(lib, dev, [cp.asarray(g) for g in grads], atomics_only)
        for (what, h, exact), g, (rows, first, splits_bad) in zip(group, grads, got):
            ok = (np.array_equal(rows, dense_reference(h, g)) if exact
                  else close_to_reference(rows, h, g))
            expect(first == I64_MAX and splits_bad == I64_MAX and ok,
                   f"{what}{' (atomics only)' if atomics_only else ''}")
    # A gradient 4 bytes off 16-byte alignment, exact.
    h = table(50, 16, 80000, np.int64, hot=0.2)
    g = integers(h)
    shifted = cp.asarray(np.concatenate([[0.0], g.ravel()]).astype(np.float32))[1:]
    rows, first, _ = backward_unordered(lib, [device(h)], [shifted.reshape(g.shape)])[0]
    expect(first == I64_MAX and np.array_equal(rows, dense_reference(h, g)),
           "a gradient off 16-byte alignment")
    # A bad id in a sliced table, malformed row_splits in a table beside
    # it: both stay zero; a second sliced table gets its gradient.
    bad = [table(50, 16, 80000, np.int64), table(40, 8, 20000, np.int64, bag=6),
           table(50, 16, 80000, np.int32)]
    bad[0]["ids"][[5, 9]] = [50, -1]
    bad[1]["splits"][7] = bad[1]["splits"][6] - 1
    dev = [device(h) for h in bad]
    expect([slice_width(lib, d) > 0 for d in dev] == [built, False, built],
           "the bad id's table and the good one take the slices (where built)")
    grads = [integers(h) for h in bad]
    got = backward_unordered(lib, dev, [cp.asarray(g) for g in grads])
    expect(got[0][1] == 5 and not got[0][0].any(), f"bad id: first {got[0][1]}, want 5")
    expect(got[1][2] != I64_MAX and not got[1][0].any(), "malformed row_splits left rows")
    expect(got[2][1] == I64_MAX and np.array_equal(got[2][0], dense_reference(bad[2], grads[2])),
           "a good sliced table beside bad ones")
    # The DemoModel's shape (8192 x 1000 one-id samples over 8192 rows)
    # takes the slices on this device, where the build has them.
    demo = dict(params=cp.zeros((8192, 16), cp.float32), ids=cp.zeros(8192000, cp.int64),
                splits=cp.zeros(1, cp.int64), weights=None, combiner="sum", no_splits=True)
    expect((slice_width(lib, demo) > 0) == built,
           f"the DemoModel's shape takes slices of {slice_width(lib, demo)} columns")
    return tally.report("lookup backward checks (dense, shared-memory slices)")


def check_past_32_bits(lib):
    """A one-id table of 2^32 + 4096 gradient items (batch x dim): both
    kernels of the unordered gradient must take their 64-bit index loops
    (a 32-bit one would wrap), on 16 rows (shared-memory slices) and on
    200,000 rows (global atomics). Ids are the sample mod rows, gradients
    (k mod 7) - 3 at item k: every partial sum of a row's 2^24 terms stays
    below 2^24, so the sums are exact in any order, and the reference is
    cupy's float64 sum over the samples of each row (17 GB of gradient on
    the device)."""
    batch, dim = (1 << 28) + 256, 16
    built = lib.sok_lookup_backward_dense_slices_built() == 1
    grads = cp.empty((batch, dim), cp.float32)
    chunk = 1 << 22
    for b0 in range(0, batch, chunk):
        b1 = min(batch, b0 + chunk)
        k = cp.arange(b0 * dim, b1 * dim, dtype=cp.int64)
        grads[b0:b1] = ((k % 7) - 3).astype(cp.float32).reshape(b1 - b0, dim)
    failures = 0
    for rows in (16, 200000):
        t = dict(params=cp.zeros((rows, dim), cp.float32),
                 ids=(cp.arange(batch, dtype=cp.int32) % rows), splits=cp.zeros(1, cp.int64),
                 weights=None, combiner="sum", no_splits=True)
        width = slice_width(lib, t)
        got, first, _ = backward_unordered(lib, [t], [grads])[0]
        want = cp.zeros((rows, dim), cp.float64)
        whole = batch - batch % rows
        want += grads[:whole].reshape(-1, rows, dim).sum(axis=0, dtype=cp.float64)
        want[:batch - whole] += grads[whole:].astype(cp.float64)
        ok = (first == I64_MAX and (width > 0) == (rows == 16 and built)
              and np.array_equal(got, cp.asnumpy(want)))
        print(f"lookup backward check (dense, unordered), {batch} x {dim} items past 2^32 on "
              f"{rows} rows (slice width {width}): {'passed' if ok else 'FAILED'}")
        failures += not ok
        del t
    del grads
    cp.get_default_memory_pool().free_all_blocks()
    return failures


def backward_reference(params, ids, splits, weights, combiner, max_norm, grads):
    """The CPU kernel's gradient: unique ids in order of first appearance."""
    values, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    inv = rank[inverse.reshape(-1)]
    out = np.zeros((len(values), params.shape[1]))
    for b in range(len(splits) - 1):
        j0, j1 = splits[b], splits[b + 1]
        w = np.ones(j1 - j0) if weights is None else weights[j0:j1].astype(np.float64)
        scale = 1.0
        if combiner == "mean":
            scale = 1.0 / w.sum() if w.sum() != 0 else 0.0
        elif combiner == "sqrtn":
            scale = 1.0 / np.sqrt((w * w).sum()) if j1 > j0 else 0.0
        for k, j in enumerate(range(j0, j1)):
            out[inv[j]] += w[k] * scale * grads[b].astype(np.float64)
    if max_norm > 0:
        x = params[values[order]].astype(np.float64)
        norm = np.sqrt((x * x).sum(1))
        dot = (x * out).sum(1)
        big = norm > max_norm
        out[big] = (max_norm / norm[big])[:, None] * (
            out[big] - x[big] * (dot[big] / norm[big] ** 2)[:, None])
    return values[order], out


def table_groups(rng, dims_list):
    """Groups of random tables, one per dim of each entry of dims_list, for
    every combiner, with and without weights, with random and all-equal
    ids: yields (dims, combiner, weighted, case, host tables)."""
    for dims in dims_list:
        for combiner in COMBINERS:
            for weighted in (False, True):
                for case in ("random", "all_equal"):
                    yield dims, combiner, weighted, case, [
                        random_table(rng, int(rng.integers(1, 500)), d, int(rng.integers(0, 300)),
                                     6, combiner, weighted, case) for d in dims]


def random_table(rng, rows, dim, batch, max_hot, combiner, weighted, case="random"):
    lengths = rng.integers(0, max_hot + 1, size=batch)  # includes empty samples
    splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    nnz = int(splits[-1])
    if case == "all_equal":
        ids = np.full(nnz, rng.integers(0, rows), np.int64)
    else:
        ids = rng.integers(0, rows, size=nnz).astype(np.int64)
        if nnz > 2:
            ids[:2] = [0, rows - 1]  # boundary rows
    params = rng.standard_normal((rows, dim)).astype(np.float32)
    weights = rng.uniform(0.5, 1.5, nnz).astype(np.float32) if weighted else None
    return dict(params=params, ids=ids, splits=splits, weights=weights, combiner=combiner)


def to_device(h):
    return dict(params=cp.asarray(h["params"]), ids=cp.asarray(h["ids"]),
                splits=cp.asarray(h["splits"]),
                weights=None if h["weights"] is None else cp.asarray(h["weights"]),
                combiner=h["combiner"], max_norm=h.get("max_norm", 0.0))


def rel_err(got, want):
    return np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30) if got.size else 0.0


def check(lib, rng):
    """Forward (int32 and int64 ids, max_norm), bad-id reporting, and the
    whole backward (plan + rows) against float64 numpy references."""
    failures = 0
    cases = 0
    bwd_cases = bwd_failures = 0
    for dims, combiner, weighted, case, host in table_groups(
            rng, ([1, 3, 33], [4, 16, 128], [5, 128, 7], [8, 32, 64], [20, 12, 256])):
        id_type = np.int32 if rng.random() < 0.5 else np.int64
        for h in host:
            h["ids"] = h["ids"].astype(id_type)
            # rows are N(0, 1): about half of them get clipped
            h["max_norm"] = (float(np.sqrt(h["params"].shape[1]))
                             if rng.random() < 0.35 else 0.0)
        dev = [to_device(h) for h in host]
        outs = forward(lib, dev)
        # Teams of lanes per sample (float4 layouts only).
        # Kernel 2 (samples of several ids take its fallback here).
        team_outs = ([(lanes, forward(lib, dev, vectorized=kind, lanes=lanes))
                      for lanes in (4, 8, 16) for kind in (1, 2)]
                     if all(d % 4 == 0 for d in dims) else [])
        for k, (h, d, o) in enumerate(zip(host, dev, outs)):
            want = reference(h["params"], h["ids"], h["splits"], h["weights"],
                             combiner, h["max_norm"])
            for lanes, got in [(32, o)] + [(ln, to[k]) for ln, to in team_outs]:
                got = cp.asnumpy(got)
                cases += 1
                err = rel_err(got, want)
                if np.isnan(got).any() or err > 1e-5:
                    failures += 1
                    print(f"FAIL dims={dims} lanes={lanes} {combiner} "
                          f"weighted={weighted} {case} {id_type.__name__} "
                          f"max_norm={h['max_norm']:.2f}: rel err {err:.2e}, "
                          f"NaN {np.isnan(got).sum()}")
        # The gradient of the tables together (one launch
        # sequence) and of each alone: both against the
        # reference, and bit-identical to each other.
        grads = [rng.standard_normal(o.shape).astype(np.float32) for o in outs]
        together = backward_tables(lib, dev, [cp.asarray(g) for g in grads])
        dense_together = backward_tables(lib, dev, [cp.asarray(g) for g in grads],
                                         dense=True)
        dense_checked = []
        for h, d, g, (u, rows, bad) in zip(host, dev, grads, together):
            alone = backward(lib, d, cp.asarray(g))
            wu, wrows = backward_reference(h["params"], h["ids"], h["splits"],
                                           h["weights"], combiner, h["max_norm"], g)
            bwd_cases += 1
            dim = g.shape[1]
            # Relative to at least 1: at dim 1 a clipped row's
            # gradient is exactly 0, leaving only rounding.
            err = (np.linalg.norm(rows - wrows) / max(np.linalg.norm(wrows), 1.0)
                   if rows.shape == wrows.shape else np.inf)
            same = (np.array_equal(alone[0], u) and alone[2] == bad
                    and alone[1].tobytes() == rows.tobytes())
            # The dense layout: the same rows, bit for bit, at
            # their ids, and zeros at the ids that never occur.
            want_dense = np.zeros(h["params"].shape, np.float32)
            want_dense[u.astype(np.int64)] = rows
            dense_rows = dense_together[len(dense_checked)][1]
            dense_checked.append(1)
            same = same and dense_rows.tobytes() == want_dense.tobytes()
            if (bad != I64_MAX or not np.array_equal(u, wu) or u.dtype != id_type
                    or np.isnan(rows).any() or err > 1e-5 or not same):
                bwd_failures += 1
                print(f"FAIL backward dims={dims} dim={dim} {combiner} "
                      f"weighted={weighted} {case} {id_type.__name__} "
                      f"max_norm={h['max_norm']:.2f}: ids equal "
                      f"{np.array_equal(u, wu)}, rel err {err:.2e}, "
                      f"together == alone == dense {same}")
    # Bad ids: reported at their first position, never read through.
    for id_type in (np.int32, np.int64):
        h = random_table(rng, 100, 16, 50, 6, "sum", False)
        h["ids"] = h["ids"].astype(id_type)
        nnz = len(h["ids"])
        spots = sorted(rng.choice(nnz, size=3, replace=False))
        h["ids"][spots] = [100, -1, np.iinfo(id_type).max]
        for max_norm in (0.0, 2.0):
            h["max_norm"] = max_norm
            d = to_device(h)
            for lanes in (32, 4, 8, 16):
                outs, bad = forward(lib, [d], with_bad=True, lanes=lanes)
                cases += 1
                if bad[0] != spots[0] or np.isnan(cp.asnumpy(outs[0])).any():
                    failures += 1
                    print(f"FAIL bad ids ({id_type.__name__}, max_norm {max_norm}, lanes "
                          f"{lanes}): reported {bad[0]}, want {spots[0]}")
        bwd_cases += 1
        if backward(lib, d, cp.zeros((50, 16), cp.float32))[2] != spots[0]:
            bwd_failures += 1
            print(f"FAIL backward did not report the bad id at {spots[0]}")
    # Tables together: a bad id is reported for its table only, and an
    # empty table (no ids, or no samples) among others has no rows.
    good = [random_table(rng, 300, 8, 40, 4, "sum", False) for _ in range(3)]
    good[1]["ids"][[3, 7]] = [300, -5]
    empty = [random_table(rng, 50, 4, 6, 0, "mean", False),  # samples without ids
             random_table(rng, 50, 4, 0, 3, "mean", False)]  # no samples
    for tables, want_bad in ((good, [I64_MAX, 3, I64_MAX]),
                             ([good[0], empty[0], good[2], empty[1]], [I64_MAX] * 4)):
        dev = [to_device(h) for h in tables]
        grads = [cp.asarray(rng.standard_normal((len(h["splits"]) - 1,
                                                 h["params"].shape[1])).astype(np.float32))
                 for h in tables]
        got = backward_tables(lib, dev, grads)
        bwd_cases += 1
        firsts = [g[2] for g in got]
        ok = firsts == want_bad
        if ok and want_bad[1] == I64_MAX:
            for h, g, (u, rows, _) in zip(tables, grads, got):
                wu, wrows = backward_reference(h["params"], h["ids"], h["splits"], None,
                                               h["combiner"], 0.0, cp.asnumpy(g))
                ok = ok and np.array_equal(u, wu) and rows.shape == wrows.shape and (
                    rows.size == 0 or np.abs(rows - wrows).max() < 1e-5)
        if not ok:
            bwd_failures += 1
            print(f"FAIL backward of tables together: first bad {firsts}, want {want_bad}")
        # Dense: a table whose check records a bad id keeps its zero
        # gradient (the op does not wait for the check then); the others
        # get theirs.
        dense = backward_tables(lib, dev, grads, dense=True)
        bwd_cases += 1
        ok = [g[2] for g in dense] == want_bad
        for t, (h, g, (_, rows, first)) in enumerate(zip(tables, grads, dense)):
            if first != I64_MAX:
                ok = ok and not rows.any()
                continue
            wu, wrows = backward_reference(h["params"], h["ids"], h["splits"], None,
                                           h["combiner"], 0.0, cp.asnumpy(g))
            want = np.zeros(h["params"].shape)
            want[wu.astype(np.int64)] = wrows
            ok = ok and np.abs(rows - want).max(initial=0.0) < 1e-5
        if not ok:
            bwd_failures += 1
            print(f"FAIL dense backward of tables together (first bad {want_bad})")
    # Samples of at most one id (the DemoModel's shape): the team kernel
    # takes them several at a time. Against the reference, and bit for bit
    # against the scalar kernel (a separate code path, the same operations);
    # tables of several dims together (128: rows wider than a small team),
    # weights, max_norm, empty samples, bad ids, batches not a multiple of
    # the samples a team takes per turn.
    for trial in range(12):
        combiner = list(COMBINERS)[trial % len(COMBINERS)]
        weighted = trial % 2 == 1
        host = [random_table(rng, int(rng.integers(1, 300)), d, int(rng.integers(1, 3000)),
                             1, combiner, weighted) for d in (16, 4, 8, 128)]
        if trial >= 6:  # every sample has its id
            for h in host:
                h["splits"] = np.arange(len(h["splits"]), dtype=np.int64)
                nnz = len(h["splits"]) - 1
                h["ids"] = rng.integers(0, h["params"].shape[0], nnz).astype(np.int64)
                h["weights"] = (rng.uniform(0.5, 1.5, nnz).astype(np.float32)
                                if weighted else None)
        for h in host:
            h["max_norm"] = 2.0 if trial % 3 == 2 else 0.0
        with_bad = trial % 4 == 3
        want_bad = []
        for h in host:
            nnz = len(h["ids"])
            spot = int(rng.integers(0, nnz)) if with_bad and nnz else None
            if spot is not None:
                h["ids"][spot] = h["params"].shape[0]
            want_bad.append(I64_MAX if spot is None else spot)
        dev = [to_device(h) for h in host]
        scalar, scalar_bad = forward(lib, dev, vectorized=False, with_bad=True)
        # 2: the kernel for samples of at most one id on average; 1: the
        # plain team kernel.
        for lanes, kind in [(lanes, kind) for lanes in (4, 8, 16, 32) for kind in (1, 2)]:
            outs, bad = forward(lib, dev, vectorized=kind, lanes=lanes, with_bad=True)
            for k, (h, o) in enumerate(zip(host, outs)):
                cases += 1
                got = cp.asnumpy(o)
                same = got.tobytes() == cp.asnumpy(scalar[k]).tobytes()
                ok = same and bad[k] == want_bad[k] == scalar_bad[k]
                if not with_bad:
                    want = reference(h["params"], h["ids"], h["splits"], h["weights"],
                                     combiner, h["max_norm"])
                    ok = ok and rel_err(got, want) <= 1e-5
                if not ok:
                    failures += 1
                    print(f"FAIL one-id samples: trial {trial} table {k} lanes {lanes} "
                          f"kernel {kind} "
                          f"{combiner} weighted={weighted}: bit-identical to the scalar "
                          f"kernel {same}, first bad {bad[k]} (want {want_bad[k]})")
    # The gradient of one-id samples (each sample's id at its own position,
    # no weights: the rows step takes the sample and factor without reading
    # them), tables of it beside tables of other samples: against the
    # reference, and the tables together bit-identical to each alone and to
    # the dense layout. Tables with weights or an empty sample take the
    # general path.
    for trial in range(6):
        combiner = list(COMBINERS)[trial % len(COMBINERS)]
        host = []
        kinds = ("one_id", "one_id", "weighted", "empty", "random")
        for d, kind in zip((16, 4, 8, 16, 32), kinds):
            rows = int(rng.integers(1, 400))
            batch = int(rng.integers(1, 3000))
            if kind == "random":
                host.append(random_table(rng, rows, d, batch, 4, combiner, False))
                continue
            splits = np.arange(batch + 1, dtype=np.int64)
            if kind == "empty":  # one sample without an id: not one-id
                splits[batch // 2 + 1:] -= 1
            nnz = int(splits[-1])
            host.append(dict(params=rng.standard_normal((rows, d)).astype(np.float32),
                             ids=rng.integers(0, rows, nnz).astype(np.int64), splits=splits,
                             weights=(rng.uniform(0.5, 1.5, nnz).astype(np.float32)
                                      if kind == "weighted" else None),
                             combiner=combiner, max_norm=2.0 if trial % 2 else 0.0))
        dev = [to_device(h) for h in host]
        grads = [rng.standard_normal((len(h["splits"]) - 1, h["params"].shape[1]))
                 .astype(np.float32) for h in host]
        together = backward_tables(lib, dev, [cp.asarray(g) for g in grads])
        dense = backward_tables(lib, dev, [cp.asarray(g) for g in grads], dense=True)
        # The one-id tables again without row_splits (the gradient op's empty
        # row_splits), among the others: the same bits, sparse and dense.
        bare = [dict(d, no_splits=True) if kind == "one_id" else d
                for d, kind in zip(dev, kinds)]
        bare_sparse = backward_tables(lib, bare, [cp.asarray(g) for g in grads])
        bare_dense = backward_tables(lib, bare, [cp.asarray(g) for g in grads], dense=True)
        for k in range(len(host)):
            bwd_cases += 1
            if not (np.array_equal(bare_sparse[k][0], together[k][0])
                    and bare_sparse[k][1].tobytes() == together[k][1].tobytes()
                    and bare_sparse[k][2] == together[k][2]
                    and bare_dense[k][1].tobytes() == dense[k][1].tobytes()):
                bwd_failures += 1
                print(f"FAIL backward of one-id samples without row_splits: trial {trial} "
                      f"table {k} ({kinds[k]}) differs from the same table with them")
        # Without row_splits a table must be one unweighted id per sample:
        # the weighted one is refused (at the size query, before any launch).
        refused = (Table * 1)(describe(dict(dev[kinds.index("weighted")], no_splits=True)))
        size = ctypes.c_size_t(0)
        bwd_cases += 1
        if lib.sok_lookup_backward_plan(refused, None, 1, None, None, None, ctypes.byref(size),
                                        None) == 0:
            bwd_failures += 1
            print(f"FAIL a weighted table without row_splits was not refused (trial {trial})")
        for k, (h, d, g, (u, rows, bad)) in enumerate(zip(host, dev, grads, together)):
            bwd_cases += 1
            alone = backward(lib, d, cp.asarray(g))
            wu, wrows = backward_reference(h["params"], h["ids"], h["splits"], h["weights"],
                                           combiner, h.get("max_norm", 0.0), g)
            err = (np.linalg.norm(rows - wrows) / max(np.linalg.norm(wrows), 1.0)
                   if rows.shape == wrows.shape else np.inf)
            want_dense = np.zeros(h["params"].shape, np.float32)
            want_dense[u.astype(np.int64)] = rows
            same = (np.array_equal(alone[0], u) and alone[1].tobytes() == rows.tobytes()
                    and dense[k][1].tobytes() == want_dense.tobytes())
            if bad != I64_MAX or not np.array_equal(u, wu) or err > 1e-5 or not same:
                bwd_failures += 1
                print(f"FAIL backward of one-id samples: trial {trial} table {k} {combiner}: "
                      f"ids equal {np.array_equal(u, wu)}, rel err {err:.2e}, together == "
                      f"alone == dense {same}")
    # A product that underflows to -0 (tiny weights, tiny negative rows),
    # rows narrower than the team: the short-samples kernel stores what the
    # plain team kernel stores (whose shuffle tree adds +0), bit for bit.
    h = dict(params=np.full((50, 8), -1e-20, np.float32), ids=np.arange(40, dtype=np.int64) % 50,
             splits=np.arange(41, dtype=np.int64), weights=np.full(40, 1e-30, np.float32),
             combiner="sum")
    dev = [to_device(h)]
    for lanes in (4, 8, 16):
        cases += 1
        plain = cp.asnumpy(forward(lib, dev, vectorized=1, lanes=lanes)[0])
        short = cp.asnumpy(forward(lib, dev, vectorized=2, lanes=lanes)[0])
        if plain.tobytes() != short.tobytes():
            failures += 1
            print(f"FAIL: an underflowing product at {lanes} lanes: the short-samples kernel "
                  f"stores {short.view(np.uint32)[0, 0]:#x}, the team kernel "
                  f"{plain.view(np.uint32)[0, 0]:#x}")
    # Hot ids: runs of more than 64 pieces (2048 positions) are summed by a
    # block (RowsSumLong). Small integers and "sum": exact in any order;
    # weighted "mean": against float64. Sparse and dense, bit for bit the
    # same rows, and the same bits on a second call.
    for dim, combiner, weighted in ((1, "sum", False), (16, "sum", False), (300, "sum", False),
                                    (16, "mean", True), (5, "sqrtn", True)):
        h = random_table(rng, 700, dim, 60000 // dim + 3000, 4, combiner, weighted)
        h["ids"][rng.random(len(h["ids"])) < 0.5] = 3
        g = (rng.integers(-3, 4, (len(h["splits"]) - 1, dim)) if combiner == "sum"
             else rng.standard_normal((len(h["splits"]) - 1, dim))).astype(np.float32)
        d = to_device(h)
        (u, rows, bad), = backward_tables(lib, [d], [cp.asarray(g)])
        (_, again, _), = backward_tables(lib, [d], [cp.asarray(g)])
        (_, dense_rows, _), = backward_tables(lib, [d], [cp.asarray(g)], dense=True)
        wu, wrows = backward_reference(h["params"], h["ids"], h["splits"], h["weights"],
                                       combiner, 0.0, g)
        want_dense = np.zeros(h["params"].shape, np.float32)
        want_dense[u.astype(np.int64)] = rows
        exact = combiner == "sum"
        ok = (bad == I64_MAX and np.array_equal(u, wu) and rows.tobytes() == again.tobytes()
              and dense_rows.tobytes() == want_dense.tobytes()
              and (np.array_equal(rows, wrows) if exact else rel_err(rows, wrows) <= 1e-5))
        bwd_cases += 1
        if not ok:
            bwd_failures += 1
            print(f"FAIL backward with a hot id: dim {dim} {combiner} weighted={weighted}")
    # determinism: identical bits on repeat
    h = random_table(rng, 1000, 64, 4096, 20, "mean", True)
    dev = [to_device(h)]
    for lanes in (32, 4, 8, 16):
        a = cp.asnumpy(forward(lib, dev, lanes=lanes)[0])
        b = cp.asnumpy(forward(lib, dev, lanes=lanes)[0])
        cases += 1
        if a.tobytes() != b.tobytes():
            failures += 1
            print(f"FAIL: forward with {lanes} lanes per sample is not deterministic")
    grads = cp.asarray(rng.standard_normal((4096, 64)).astype(np.float32))
    bwd_cases += 1
    if backward(lib, dev[0], grads)[1].tobytes() != backward(lib, dev[0], grads)[1].tobytes():
        bwd_failures += 1
        print("FAIL: backward is not deterministic")
    print(f"lookup forward checks: {cases - failures} passed, {failures} failed")
    print(f"lookup backward checks (whole gradient, first-appearance order): "
          f"{bwd_cases - bwd_failures} passed, {bwd_failures} failed")
    return failures + bwd_failures


def time_ms(fn, warmup=3, repeat=20):
    for _ in range(warmup):
        fn()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(repeat):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return float(np.median(times))


def bench(lib, rng, rows, dim, batch, hot, lanes=32, kind=1):
    params = cp.random.standard_normal((rows, dim), dtype=cp.float32)
    nnz = batch * hot
    ids = cp.random.randint(0, rows, size=nnz, dtype=cp.int64)
    splits = cp.arange(0, nnz + 1, hot, dtype=cp.int64)
    table = dict(params=params, ids=ids, splits=splits, weights=None, combiner="sum")
    out = cp.empty((batch, dim), cp.float32)
    d_desc = cp.asarray(np.frombuffer(bytes(describe(table, out)), np.uint8))
    offsets = cp.asarray(np.array([0, batch], np.int64))
    first_bad = cp.full(1, I64_MAX, cp.int64)
    stream = cp.cuda.get_current_stream().ptr
    # The kernel alone; the op adds one 8-byte read-back of first_bad.
    ms = time_ms(lambda: lib.sok_lookup_forward_f32(d_desc.data.ptr, offsets.data.ptr, 1, batch,
                                                    kind, 8, lanes, first_bad.data.ptr, stream))
    assert int(first_bad[0]) == I64_MAX
    moved = nnz * 8 + nnz * dim * 4 + batch * dim * 4
    result = {"sok ms": ms, "sok GB/s": moved / ms / 1e6}
    src = cp.empty(1 << 30, cp.uint8)
    dst = cp.empty_like(src)
    copy_ms = time_ms(lambda: dst.__setitem__(slice(None), src))
    result["copy GB/s"] = 2 * src.nbytes / copy_ms / 1e6
    try:
        import torch
        import torch.nn.functional as F

        t_params = torch.as_tensor(params, device="cuda")
        t_ids = torch.as_tensor(ids, device="cuda")
        t_offsets = torch.as_tensor(splits[:-1], device="cuda")

        def bag():
            F.embedding_bag(t_ids, t_params, t_offsets, mode="sum")

        result["torch ms"] = time_ms(bag)
    except ImportError:
        result["torch ms"] = float("nan")
    return result


def bench_backward(lib, rows, dim, batch, hot):
    """The whole gradient of one table (plan, read back the unique count,
    rows) against torch unique + index_add_ of the per-id gradient rows."""
    nnz = batch * hot
    table = dict(params=cp.random.standard_normal((rows, dim), dtype=cp.float32),
                 ids=cp.random.randint(0, rows, size=nnz, dtype=cp.int64),
                 splits=cp.arange(0, nnz + 1, hot, dtype=cp.int64), weights=None,
                 combiner="mean")
    grads = cp.random.standard_normal((batch, dim), dtype=cp.float32)
    ms = time_ms(BackwardRun(lib, [table], [grads]))
    torch_ms = float("nan")
    try:
        import torch

        t_ids = torch.as_tensor(table["ids"], device="cuda")
        t_grads = torch.as_tensor(grads, device="cuda")

        def torch_backward():
            u, inv = torch.unique(t_ids, return_inverse=True)
            rows_per_id = t_grads.repeat_interleave(hot, 0) / hot
            torch.zeros((u.shape[0], dim), device="cuda").index_add_(0, inv, rows_per_id)

        torch_ms = time_ms(torch_backward)
    except ImportError:
        pass
    print(f"whole backward (mean), {batch}x{hot} ids over {rows} rows, dim {dim}: sok "
          f"{ms:.3f} ms (incl. one read-back), torch unique + expand + index_add_ "
          f"{torch_ms:.3f} ms, {torch_ms / ms:.2f}x")


class BackwardRun:
    """One whole gradient of `tables` as the op runs it: plan, one read-back
    of the counts, rows; buffers allocated once."""

    def __init__(self, lib, tables, grads):
        self.lib, self.n = lib, len(tables)
        self.host = (Table * self.n)(*[describe(t) for t in tables])
        self.dev = cp.asarray(np.frombuffer(bytes(self.host), np.uint8))
        self.size = ctypes.c_size_t(0)
        self.num = cp.zeros(self.n, cp.int64)
        self.bad = cp.full(self.n, I64_MAX, cp.int64)
        lib.sok_lookup_backward_plan(self.host, self.dev.data.ptr, self.n, None, None, None,
                                     ctypes.byref(self.size), None)
        self.temp = cp.empty(self.size.value, cp.uint8)
        self.keep = [(cp.empty(int(t["ids"].shape[0]), t["ids"].dtype),
                      cp.empty((int(t["ids"].shape[0]), int(t["params"].shape[1])), cp.float32))
                     for t in tables]
        outs = (GradTable * self.n)(*[GradTable(g.data.ptr, u.data.ptr, r.data.ptr, 0, 0)
                                      for g, (u, r) in zip(grads, self.keep)])
        self.outs = cp.asarray(np.frombuffer(bytes(outs), np.uint8))

    def plan(self):
        rc = self.lib.sok_lookup_backward_plan(
            self.host, self.dev.data.ptr, self.n, self.num.data.ptr, self.bad.data.ptr,
            self.temp.data.ptr, ctypes.byref(self.size), cp.cuda.get_current_stream().ptr)
        assert rc == 0, rc

    def rows(self):
        rc = self.lib.sok_lookup_backward_rows(self.host, self.dev.data.ptr, self.n,
                                               self.outs.data.ptr, None, self.temp.data.ptr,
                                               cp.cuda.get_current_stream().ptr)
        assert rc == 0, rc

    def __call__(self):
        self.plan()
        cp.asnumpy(self.num)  # the op's one host synchronisation (output sizes)
        self.rows()


def bench_backward_dense(lib, rng):
    """Dense gradients, ordered (plan + rows, as the op runs them when
    determinism is asked for) against unordered (float atomics, in shared
    memory slices where a table has few rows for its ids) and against
    global atomics alone: the DemoModel's (8192 x 1000 one-id positions, no
    row_splits, 8192 rows) and DLRM's 26 tables (Zipf hot ids)."""
    demo = dict(params=cp.random.standard_normal((8192, 16), dtype=cp.float32),
                ids=cp.random.randint(0, 8192, size=8192 * 1000, dtype=cp.int64),
                splits=None, weights=None, combiner="sum", no_splits=True)
    padded = dict(demo, ids=cp.where(cp.random.random(8192 * 1000) < 0.5, 0, demo["ids"]))
    bags = dict(params=demo["params"], ids=cp.random.randint(0, 8192, size=64 * 4096,
                                                              dtype=cp.int64),
                splits=cp.arange(0, 64 * 4096 + 1, 4096, dtype=cp.int64), weights=None,
                combiner="mean")
    def few_rows(rows, dim, batch, hot):
        splits = None if hot == 1 else cp.arange(0, batch * hot + 1, hot, dtype=cp.int64)
        return dict(params=cp.zeros((rows, dim), cp.float32),
                    ids=cp.random.randint(0, rows, size=batch * hot, dtype=cp.int32),
                    splits=splits, weights=None, combiner="sum", no_splits=splits is None)

    def one_ids(rows, ids):
        return dict(params=cp.zeros((rows, 16), cp.float32), ids=ids, splits=None,
                    weights=None, combiner="sum", no_splits=True)

    def hot_rows(rows, batch, hot):
        ids = cp.random.randint(0, rows, size=batch, dtype=cp.int64)
        return one_ids(rows, cp.where(cp.random.random(batch) < hot, 0, ids))

    def zipf_rows(rows, batch):
        ids = np.minimum(rng.zipf(1.2, size=batch) - 1, rows - 1).astype(np.int64)
        return one_ids(rows, cp.asarray(ids))

    for name, tables in (("DemoModel (8.2M one-id positions, 8192 rows)", [demo]),
                         ("DemoModel's shape, half the positions on id 0", [padded]),
                         ("64 samples of 4096 ids, 8192 rows", [bags]),
                         ("1M one-id samples, 400 rows x 128", [few_rows(400, 128, 1 << 20, 1)]),
                         ("2M one-id samples, 2000 rows x 64", [few_rows(2000, 64, 2 << 20, 1)]),
                         ("500k samples of 4 ids, 1000 rows x 16",
                          [few_rows(1000, 16, 500000, 4)]),
                         ("DLRM (26 tables, Zipf ids)", dlrm_tables(rng)),
                         ("8.2M one-id positions, Zipf(1.2) ids in 1M rows",
                          [zipf_rows(1 << 20, 8192 * 1000)]),
                         ("8.2M one-id positions, uniform ids in 1M rows",
                          [hot_rows(1 << 20, 8192 * 1000, 0.0)]),
                         ("8.2M one-id positions in 200,000 rows, 10% on one id",
                          [hot_rows(200000, 8192 * 1000, 0.1)]),
                         ("the same, half on one id", [hot_rows(200000, 8192 * 1000, 0.5)]),
                         ("8192 one-id samples in 100,000 rows",
                          [hot_rows(100000, 8192, 0.0)])):
        n = len(tables)
        host = (Table * n)(*[describe(t) for t in tables])
        dev = cp.asarray(np.frombuffer(bytes(host), np.uint8))
        grads = [cp.random.standard_normal((d.batch, d.dim), dtype=cp.float32) for d in host]
        rows = [cp.zeros((d.rows, d.dim), cp.float32) for d in host]
        outs = (GradTable * n)(*[GradTable(g.data.ptr, None, r.data.ptr, 1, 0)
                                 for g, r in zip(grads, rows)])
        d_outs = cp.asarray(np.frombuffer(bytes(outs), np.uint8))
        checks = cp.full((7, n), I64_MAX, cp.int64)
        size = ctypes.c_size_t(0)
        lib.sok_lookup_backward_plan(host, dev.data.ptr, n, None, None, None,
                                     ctypes.byref(size), None)
        temp = cp.empty(size.value, cp.uint8)
        stream = cp.cuda.get_current_stream().ptr

        def zero():
            for r in rows:
                r.fill(0)

        def ordered():
            zero()
            assert lib.sok_lookup_backward_plan(host, dev.data.ptr, n, None, checks.data.ptr,
                                                temp.data.ptr, ctypes.byref(size), stream) == 0
            assert lib.sok_lookup_backward_rows(host, dev.data.ptr, n, d_outs.data.ptr,
                                                checks.data.ptr, temp.data.ptr, stream) == 0

        def unordered(fn=lib.sok_lookup_backward_dense_unordered):
            zero()
            assert fn(host, dev.data.ptr, n, d_outs.data.ptr, checks.data.ptr, stream) == 0

        def atomics():
            unordered(lib.sok_lookup_backward_dense_atomics)

        zero_ms, a, b = time_ms(zero), time_ms(ordered), time_ms(unordered)
        paths = sorted(set(grad_paths(d_outs, n)))
        c = time_ms(atomics)
        widths = sorted({slice_width(lib, t) for t in tables})
        print(f"dense backward, {name}: ordered {a:.3f} ms, unordered {b:.3f} ms "
              f"(slice widths {widths}, paths {paths}), global atomics only {c:.3f} ms; "
              f"ordered/unordered "
              f"{a / b:.2f}x, atomics/unordered {c / b:.2f}x (all include zeroing the rows, "
              f"{zero_ms:.3f} ms)")


def dlrm_tables(rng):
    """DLRM's lookup (26 tables x 100k x 16, batch 8192, hotness 1-5, Zipf
    ids, mean), on the device."""
    tables = []
    for _ in range(26):
        lengths = rng.integers(1, 6, size=8192)
        splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        ids = np.minimum(rng.zipf(1.2, size=int(splits[-1])) - 1, 99999).astype(np.int64)
        tables.append(dict(params=cp.random.standard_normal((100000, 16), dtype=cp.float32),
                           ids=cp.asarray(ids), splits=cp.asarray(splits), weights=None,
                           combiner="mean"))
    return tables


def bench_backward_tables(lib, rng):
    """DLRM's shape (dlrm_tables): the gradient of the 26 tables in one call
    against 26 calls of one table each (the launch sequence per table the op
    ran before)."""
    tables = dlrm_tables(rng)
    grads = [cp.random.standard_normal((8192, 16), dtype=cp.float32) for _ in tables]
    # The forward of the 26 tables (teams of 4 lanes, as the op launches
    # them for this shape), the kernel alone.
    outs = [cp.empty((8192, 16), cp.float32) for _ in tables]
    descs = (Table * 26)(*[describe(t, o) for t, o in zip(tables, outs)])
    d_descs = cp.asarray(np.frombuffer(bytes(descs), np.uint8))
    offsets = cp.asarray(np.arange(27, dtype=np.int64) * 8192)
    first_bad = cp.full(26, I64_MAX, cp.int64)
    stream = cp.cuda.get_current_stream().ptr
    fwd = time_ms(lambda: lib.sok_lookup_forward_f32(d_descs.data.ptr, offsets.data.ptr, 26,
                                                     26 * 8192, 1, 8, 4, first_bad.data.ptr,
                                                     stream))
    print(f"forward, DLRM shape (26 tables x 8192 x 1-5 Zipf ids, dim 16, 4 lanes): "
          f"{fwd:.3f} ms")
    together = time_ms(BackwardRun(lib, tables, grads))
    singles = [BackwardRun(lib, [t], [g]) for t, g in zip(tables, grads)]

    def one_by_one():  # plans, the one read-back, rows: as the op ran them
        for run in singles:
            run.plan()
        cp.asnumpy(singles[-1].num)
        for run in singles:
            run.rows()

    alone = time_ms(one_by_one)
    print(f"whole backward, DLRM shape (26 tables x 8192 x 1-5 Zipf ids, dim 16): 26 tables "
          f"in one call {together:.3f} ms, one call per table {alone:.3f} ms, "
          f"{alone / together:.2f}x")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("library")
    p.add_argument("--cpu-ref", help="libcpu_table_ref.so (the CPU table, for the table checks)")
    p.add_argument("--quick", action="store_true", help="smaller sizes and fewer steps")
    p.add_argument("--checks-only", action="store_true", help="no timings")
    args = p.parse_args()
    if os.environ.get("SOK_GPU_NO_POOL"):
        cp.cuda.set_allocator(None)  # every array its own cudaMalloc (for memcheck)
    lib = load(args.library)
    props = cp.cuda.runtime.getDeviceProperties(0)
    print(f"device: {props['name'].decode()}, {props['multiProcessorCount']} SMs, "
          f"CUDA runtime {cp.cuda.runtime.runtimeGetVersion()}")
    rng = np.random.default_rng(0)
    failures = (check(lib, rng) + check_unordered(lib, rng) + check_slices(lib, rng)
                + check_unique_sum(lib, rng)
                + util_checks.check_util(lib, rng))
    if not args.quick:
        failures += check_past_32_bits(lib)
    if args.cpu_ref:
        failures += table_checks.check_table(lib, ctypes.CDLL(args.cpu_ref), rng, args.quick)
    else:
        print("GPU hash table checks SKIPPED: no --cpu-ref library given")
        failures += 1
    if args.checks_only:
        print(f"\ntotal failures: {failures}")
        sys.exit(1 if failures else 0)
    rows = 1 << 20 if args.quick else 8 << 20
    batch = 1 << 14 if args.quick else 1 << 18
    print(f"\n{'case':<28}{'sok ms':>9}{'GB/s':>9}{'copy GB/s':>11}{'of copy':>9}"
          f"{'torch ms':>10}{'vs torch':>10}")
    for dim in (128, 64, 16):
        r = bench(lib, rng, rows, dim, batch, 104)
        print(f"{f'fwd {rows}x{dim}, {batch}x104':<28}{r['sok ms']:>9.3f}{r['sok GB/s']:>9.0f}"
              f"{r['copy GB/s']:>11.0f}{r['sok GB/s'] / r['copy GB/s']:>8.0%}"
              f"{r['torch ms']:>10.3f}{r['torch ms'] / r['sok ms']:>9.2f}x")
    # Short samples (one id, DemoModel's shape): a warp per sample against
    # teams of 4 lanes, 8 samples per warp.
    short = batch * 32
    for lanes in (32, 4):
        r = bench(lib, rng, rows, 16, short, 1, lanes)
        print(f"{f'fwd {rows}x16, {short}x1, {lanes} lanes':<28}{r['sok ms']:>9.3f}"
              f"{r['sok GB/s']:>9.0f}{r['copy GB/s']:>11.0f}"
              f"{r['sok GB/s'] / r['copy GB/s']:>8.0%}{r['torch ms']:>10.3f}"
              f"{r['torch ms'] / r['sok ms']:>9.2f}x")
    # The DemoModel's: 8192 x 100 x 10 one-id samples of its 8192 distinct keys.
    demo = 8192 * 1000 if not args.quick else 1 << 20
    r = bench(lib, rng, 8192, 16, demo, 1, 4, kind=2)
    print(f"{f'fwd 8192x16, {demo}x1, 4 lanes':<28}{r['sok ms']:>9.3f}"
          f"{r['sok GB/s']:>9.0f}{r['copy GB/s']:>11.0f}"
          f"{r['sok GB/s'] / r['copy GB/s']:>8.0%}{r['torch ms']:>10.3f}"
          f"{r['torch ms'] / r['sok ms']:>9.2f}x")
    n = 1 << 20 if args.quick else 1 << 23
    for bits, what in ((23, "static table of 8M rows: 23-bit sort"),
                       (64, "any int64 keys: 64-bit sort")):
        ms, torch_ms = bench_unique_sum(lib, n, 16, 8 << 20, bits)
        print(f"backward, unique + segment sum of {n} ids in [0, 8M), dim 16 ({what}): "
              f"sok {ms:.3f} ms, torch unique+index_add_ {torch_ms:.3f} ms, "
              f"{torch_ms / ms:.2f}x")
    bench_backward(lib, rows, 16, batch, 32)
    bench_backward(lib, 8192, 16, demo, 1)  # the DemoModel's
    bench_backward_tables(lib, rng)
    bench_backward_dense(lib, rng)
    util_checks.bench_util(lib, time_ms)
    table_checks.bench_table(lib, time_ms, batch=1 << 18 if args.quick else 1 << 20)
    print(f"\ntotal failures: {failures}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
