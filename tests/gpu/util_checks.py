"""Checks and timings of the unique-with-counts, unsorted segment sum,
bucketing-by-owner and key-routing launchers against numpy references on
random inputs."""

import ctypes
import os
import sys

import cupy as cp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from routing_reference import routed  # noqa: E402  (tests/, shared with the op's tests)

P, I64 = ctypes.c_void_p, ctypes.c_int64
SIZE_P = ctypes.POINTER(ctypes.c_size_t)
I64_MIN, I64_MAX = -(2**63), 2**63 - 1


def bind(lib):
    for k in ("i64", "i32"):
        for i in ("i32", "i64"):
            f = getattr(lib, f"sok_unique_with_counts_{k}_{i}")
            f.argtypes = [P, I64, P, P, P, P, P, SIZE_P, P]
            f.restype = ctypes.c_int
            f = getattr(lib, f"sok_unique_in_set_{k}_{i}")
            f.argtypes = [P, I64, I64, P, P, P, P, P, SIZE_P, P]
            f.restype = ctypes.c_int
        f = getattr(lib, f"sok_unsorted_segment_sum_f32_{k}")
        f.argtypes = [P, P, I64, I64, I64, P, P, P, SIZE_P, P]
        f.restype = ctypes.c_int
        f = getattr(lib, f"sok_bucketize_by_owner_{k}")
        f.argtypes = [P, I64, I64, I64, P, P, P, P, P, P, SIZE_P, P]
        f.restype = ctypes.c_int
    lib.sok_route_grouped_keys.argtypes = [P, P, I64, I64, I64, I64, P, P, P, P, SIZE_P, P]
    lib.sok_route_grouped_keys.restype = ctypes.c_int
    for name in ("sok_gpu_copy_to_host", "sok_gpu_copy_to_device", "sok_gpu_copy_on_device"):
        getattr(lib, name).argtypes = [P, P, ctypes.c_size_t, P]
        getattr(lib, name).restype = ctypes.c_int
    lib.sok_gpu_fill_i64.argtypes = [P, I64, I64, P]
    lib.sok_gpu_fill_i64.restype = ctypes.c_int


def stream():
    return cp.cuda.get_current_stream().ptr


def call_with_temp(fn, *args):
    """The launchers' two-call protocol: size query, then the real call."""
    size = ctypes.c_size_t(0)
    rc = fn(*args, None, ctypes.byref(size), stream())
    if rc != 0:
        raise RuntimeError(f"{fn.__name__} (size query) returned {rc}")
    temp = cp.empty(max(size.value, 1), cp.uint8)
    rc = fn(*args, temp.data.ptr, ctypes.byref(size), stream())
    if rc != 0:
        raise RuntimeError(f"{fn.__name__} returned {rc}")
    return temp


class Unique:
    """The launcher with counts, or without (counts=False: count is NULL, as
    the SokUnique op calls it); with set_slots, the launcher that takes the
    hash set's size (as the op calls it after its first batch)."""

    def __init__(self, lib, key_dtype, idx_dtype, n, counts=True, set_slots=None):
        k = "i64" if key_dtype == np.int64 else "i32"
        i = "i64" if idx_dtype == np.int64 else "i32"
        if set_slots is None:
            self.fn = getattr(lib, f"sok_unique_with_counts_{k}_{i}")
            self.set_args = ()
        else:
            self.fn = getattr(lib, f"sok_unique_in_set_{k}_{i}")
            self.set_args = (set_slots,)
        self.n, self.kd, self.id = n, key_dtype, idx_dtype
        self.y = cp.full(max(n, 1), -7, key_dtype)
        self.idx = cp.full(max(n, 1), -7, idx_dtype)
        self.count = cp.full(max(n, 1), -7, idx_dtype) if counts else None
        self.num = cp.full(1, -7, cp.int64)
        size = ctypes.c_size_t(0)
        assert self.fn(None, n, *self.set_args, None, None, None, None, None,
                       ctypes.byref(size), None) == 0
        self.size = size
        self.temp = cp.empty(max(size.value, 1), cp.uint8)

    def __call__(self, x):
        rc = self.fn(x.data.ptr, self.n, *self.set_args, self.y.data.ptr, self.idx.data.ptr,
                     None if self.count is None else self.count.data.ptr, self.num.data.ptr,
                     self.temp.data.ptr,
                     ctypes.byref(self.size), stream())
        if rc != 0:
            raise RuntimeError(f"unique returned {rc}")

    def result(self):
        u = int(self.num[0])
        return (cp.asnumpy(self.y[:u]), cp.asnumpy(self.idx[:self.n]),
                None if self.count is None else cp.asnumpy(self.count[:u]))


def unique_reference(x):
    """tf.unique_with_counts: distinct values in order of first appearance."""
    values, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True,
                                               return_counts=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return values[order], rank[inverse.reshape(-1)], counts[order]


def segment_sum(lib, data, ids, num_segments, shift=0):
    """The launcher's sum; shift > 0 places data `shift` floats past a
    16-byte boundary (the one-float-a-thread path)."""
    n, width = data.shape
    k = "i64" if ids.dtype == np.int64 else "i32"
    fn = getattr(lib, f"sok_unsorted_segment_sum_f32_{k}")
    out = cp.full((num_segments, width), cp.nan, cp.float32)
    bad = cp.full(1, I64_MAX, cp.int64)
    d_data, d_ids = cp.asarray(data), cp.asarray(ids)
    if shift:
        buf = cp.empty(data.size + shift, cp.float32)
        buf[shift:] = d_data.reshape(-1)
        d_data = buf[shift:].reshape(data.shape)
    call_with_temp(fn, d_data.data.ptr if n else None, d_ids.data.ptr if n else None, n, width,
                   num_segments, out.data.ptr if out.size else None, bad.data.ptr)
    cp.cuda.get_current_stream().synchronize()
    return cp.asnumpy(out), int(bad[0])


def bucketize(lib, ids, world, fixed):
    n = len(ids)
    k = "i64" if ids.dtype == np.int64 else "i32"
    fn = getattr(lib, f"sok_bucketize_by_owner_{k}")
    d_ids = cp.asarray(ids)
    bucketed = cp.full(max(n, 1), -7, ids.dtype)
    sizes = cp.full(world, -7, cp.int64)
    perm = cp.full(max(n, 1), -7, cp.int64)
    inv = cp.full(max(n, 1), -7, cp.int64)
    neg = cp.full(1, I64_MAX, cp.int64)
    call_with_temp(fn, d_ids.data.ptr if n else None, n, world, fixed, bucketed.data.ptr,
                   sizes.data.ptr, perm.data.ptr, inv.data.ptr, neg.data.ptr)
    cp.cuda.get_current_stream().synchronize()
    return (cp.asnumpy(bucketed[:n]), cp.asnumpy(sizes), cp.asnumpy(perm[:n]),
            cp.asnumpy(inv[:n]), int(neg[0]))


def route(lib, ids, tables, count, world, fixed):
    n = len(ids)
    d_ids, d_tables = cp.asarray(ids), cp.asarray(tables)
    sent = cp.full(max(n, 1), -7, cp.int64)
    sizes = cp.full(world, -7, cp.int64)
    slots = cp.full(max(n, 1), -7, cp.int64)
    call_with_temp(lib.sok_route_grouped_keys, d_ids.data.ptr if n else None,
                   d_tables.data.ptr if n else None, n, count, world, fixed, sent.data.ptr,
                   sizes.data.ptr, slots.data.ptr)
    cp.cuda.get_current_stream().synchronize()
    return cp.asnumpy(sent[:n]), cp.asnumpy(sizes), cp.asnumpy(slots[:n])


SEGMENT_PIECE = 1024  # tf_ops/util/core/segment_sum.h kSegmentPiece


def ordered_segment_sum(data, ids, num_segments):
    """float32 sums in position order as the CPU kernel associates them: a
    segment's rows in pieces of SEGMENT_PIECE, each piece added from zero,
    then the pieces' sums in order (np.add.at adds one row at a time)."""
    out = np.zeros((num_segments, data.shape[1]), np.float32)
    for s in range(num_segments):
        rows = data[np.nonzero(ids == s)[0]]
        if len(rows) <= SEGMENT_PIECE:
            np.add.at(out, np.full(len(rows), s), rows)
            continue
        pieces = np.zeros(((len(rows) + SEGMENT_PIECE - 1) // SEGMENT_PIECE, data.shape[1]),
                          np.float32)
        np.add.at(pieces, np.arange(len(rows)) // SEGMENT_PIECE, rows)
        np.add.at(out, np.full(len(pieces), s), pieces)
    return out


def check_util(lib, rng):
    bind(lib)
    failures = cases = 0

    def fail(msg):
        nonlocal failures
        failures += 1
        print("FAIL", msg)

    # unique with counts
    for n, case in [(1000, "random"), (1, "random"), (0, "random"), (5000, "all_equal"),
                    (4096, "extremes"), (100000, "random"), (3, "random"),
                    (300000, "few"), (70000, "all_equal"), (400000, "vocab")]:
        for kd in (np.int64, np.int32):
            for idd in (np.int32, np.int64):
                if case == "all_equal":
                    x = np.full(n, -42, kd)
                elif case == "few":  # hot keys: many lanes of a warp share one
                    x = rng.integers(-50, 50, size=n).astype(kd)
                elif case == "vocab":  # a DemoModel-like batch: its fitting set is
                    # ranked by sorting the set's slots (several sort blocks)
                    x = rng.integers(0, 8192, size=n).astype(kd)
                elif case == "extremes":
                    info = np.iinfo(kd)
                    x = rng.choice(np.array([info.min, info.max, -1, 0, 7], kd), size=n)
                else:
                    x = rng.integers(-n, n + 1, size=n).astype(kd)
                op = Unique(lib, kd, idd, n)
                op(cp.asarray(x) if n else cp.zeros(1, kd))
                cp.cuda.get_current_stream().synchronize()
                y, idx, count = op.result()
                wy, widx, wcount = unique_reference(x)
                cases += 1
                if not (np.array_equal(y, wy) and np.array_equal(idx, widx)
                        and np.array_equal(count, wcount) and y.dtype == kd):
                    fail(f"unique n={n} {case} keys {kd.__name__} idx {idd.__name__}")
                # Without counts: the same values and positions.
                op = Unique(lib, kd, idd, n, counts=False)
                op(cp.asarray(x) if n else cp.zeros(1, kd))
                cp.cuda.get_current_stream().synchronize()
                y, idx, _ = op.result()
                cases += 1
                if not (np.array_equal(y, wy) and np.array_equal(idx, widx) and y.dtype == kd):
                    fail(f"unique without counts n={n} {case} keys {kd.__name__} "
                         f"idx {idd.__name__}")
                # A set sized for the distinct values (as the op sizes it from
                # its last batch), with and without counts: the same outputs.
                # A set too small for them overflows: num_unique -1, and
                # nothing else written.
                fit = 64
                while fit < 4 * len(wy):
                    fit *= 2
                small = 64 if len(wy) > 32 else None
                for counts in (True, False):
                    op = Unique(lib, kd, idd, n, counts=counts, set_slots=fit)
                    op(cp.asarray(x) if n else cp.zeros(1, kd))
                    cp.cuda.get_current_stream().synchronize()
                    y, idx, count = op.result()
                    cases += 1
                    if not (np.array_equal(y, wy) and np.array_equal(idx, widx)
                            and (count is None or np.array_equal(count, wcount))):
                        fail(f"unique in a set of {fit} n={n} {case} keys {kd.__name__} "
                             f"idx {idd.__name__} counts={counts}")
                    if small is None:
                        continue
                    op = Unique(lib, kd, idd, n, counts=counts, set_slots=small)
                    op(cp.asarray(x))
                    cp.cuda.get_current_stream().synchronize()
                    cases += 1
                    untouched = (bool((op.y == -7).all()) and bool((op.idx == -7).all())
                                 and (op.count is None or bool((op.count == -7).all())))
                    if int(op.num[0]) != -1 or not untouched:
                        fail(f"unique of {len(wy)} distinct values in a set of 64 did not "
                             f"report the overflow cleanly (num_unique {int(op.num[0])}, "
                             f"outputs untouched: {untouched}) n={n} {case}")
    # The bounded set's limit is half its slots, counted over the whole
    # grid (claims are added per block at the end of the insert): 32
    # distinct keys spread over 600,000 positions (thousands of blocks) fit
    # a set of 64, and 33 overflow it, for a key claimed in any block.
    for distinct in (32, 33):
        x = rng.permutation(np.resize(np.arange(distinct, dtype=np.int64) * 7919 - 99,
                                      600000))
        wy, widx, wcount = unique_reference(x)
        for counts in (True, False):
            op = Unique(lib, np.int64, np.int32, x.size, counts=counts, set_slots=64)
            op(cp.asarray(x))
            cp.cuda.get_current_stream().synchronize()
            cases += 1
            if distinct == 32:
                y, idx, count = op.result()
                if not (np.array_equal(y, wy) and np.array_equal(idx, widx)
                        and (count is None or np.array_equal(count, wcount))):
                    fail(f"unique of 32 distinct keys in a set of 64 (its limit) differs "
                         f"from numpy (counts={counts})")
            elif int(op.num[0]) != -1:
                fail(f"unique of 33 distinct keys in a set of 64 did not overflow "
                     f"(num_unique {int(op.num[0])}, counts={counts})")
    # A set size that is not a power of two >= 64 is refused.
    for bad in (32, 100, -64):
        size = ctypes.c_size_t(0)
        cases += 1
        if lib.sok_unique_in_set_i64_i64(None, 10, bad, None, None, None, None, None,
                                         ctypes.byref(size), None) == 0:
            fail(f"unique with set_slots={bad} was not refused")
    # past the hash set's 32-bit slot numbers: refused at the size query
    size = ctypes.c_size_t(0)
    cases += 1
    if lib.sok_unique_with_counts_i64_i64(None, 1 << 30, None, None, None, None, None,
                                          ctypes.byref(size), None) == 0:
        fail("unique of 2^30 keys was not refused")
    # unsorted segment sum: bit-identical to float32 sums in position order
    # (widths of 4k floats take four columns a thread where aligned; shift
    # misaligns the data by one float, which takes one column a thread; 5000
    # and 3100 rows of few segments are summed in pieces)
    for n, width, segs, case, shift in [
            (1000, 16, 50, "random", 0), (777, 3, 1000, "random", 0),
            (5000, 130, 7, "random", 0), (0, 4, 5, "random", 0), (300, 1, 1, "all_equal", 0),
            (20000, 32, 3000, "random", 0), (100, 8, 0, "random", 0), (64, 5, 10, "bad", 0),
            (5000, 16, 1, "all_equal", 0), (5000, 16, 1, "all_equal", 1),
            (3100, 12, 3, "random", 0), (3100, 12, 3, "random", 1), (1000, 16, 50, "random", 2)]:
        for idt in (np.int32, np.int64):
            data = rng.standard_normal((n, width)).astype(np.float32)
            ids = rng.integers(-3, max(segs, 1), size=n).astype(idt)  # negatives are dropped
            if case == "all_equal":
                ids[:] = 0
            if case == "bad":
                ids[[17, 40]] = [segs, segs + 5]
            got, bad = segment_sum(lib, data, ids, segs, shift)
            want_bad = int(np.nonzero(ids >= segs)[0][0]) if (ids >= segs).any() else I64_MAX
            keep = (ids >= 0) & (ids < segs)
            want = ordered_segment_sum(data, ids, segs)
            ref64 = np.zeros((segs, width))
            np.add.at(ref64, ids[keep].astype(np.int64), data[keep].astype(np.float64))
            cases += 1
            if bad != want_bad:
                fail(f"segment sum n={n} {case}: first bad {bad}, want {want_bad}")
            elif case != "bad" and not (got.tobytes() == want.tobytes() and np.allclose(
                    got, ref64, rtol=1e-4, atol=1e-4)):
                fail(f"segment sum n={n} width={width} segments={segs} {case} shift {shift} "
                     f"{idt.__name__}: "
                     f"max diff {np.max(np.abs(got - want)) if got.size else 0:.3g}")
    # bucketize by owner
    for n, world, fixed in [(1000, 4, -1), (1, 1, -1), (0, 3, -1), (5000, 8, 2), (70000, 7, -1),
                            (333, 1000, -1)]:
        for kd in (np.int64, np.int32):
            ids = rng.integers(0, np.iinfo(kd).max, size=n, dtype=kd)
            if n > 2:
                ids[:3] = [0, np.iinfo(kd).max, world]
            bucketed, sizes, perm, inv, neg = bucketize(lib, ids, world, fixed)
            owner = np.full(n, fixed) if fixed >= 0 else ids.astype(np.int64) % world
            want_perm = np.argsort(owner, kind="stable")
            want_inv = np.empty(n, np.int64)
            want_inv[want_perm] = np.arange(n)
            cases += 1
            if not (np.array_equal(perm, want_perm) and np.array_equal(inv, want_inv)
                    and np.array_equal(bucketed, ids[want_perm])
                    and np.array_equal(sizes, np.bincount(owner, minlength=world))
                    and neg == I64_MAX):
                fail(f"bucketize n={n} world={world} fixed={fixed} {kd.__name__}")
    ids = rng.integers(0, 100, size=50).astype(np.int64)
    ids[[9, 30]] = [-5, -1]
    cases += 1
    if bucketize(lib, ids, 4, -1)[4] != 9:
        fail("bucketize did not report the first negative id at position 9")
    # the sender's routing of grouped keys (SokRouteGroupedKeys)
    for n, count, world, fixed in [(1000, 26, 2, -1), (1, 1, 1, -1), (0, 3, 2, -1),
                                   (70000, 3, 8, -1), (5000, 26, 4, 1), (200000, 26, 2, -1)]:
        ids = rng.integers(0, max(n // 4, 1), size=n).astype(np.int64)
        if n > 4:
            ids[:4] = [-1, -9, I64_MAX, I64_MIN + 3]  # unchecked ids: negative, wrapping
        tables = rng.integers(0, count, size=n).astype(np.int64)
        got = route(lib, ids, tables, count, world, fixed)
        cases += 1
        if not all(np.array_equal(g, w) for g, w in zip(got, routed(ids, tables, count, world,
                                                                    fixed))):
            fail(f"route n={n} tables={count} world={world} fixed={fixed}")
    # determinism of the segment sum on many duplicates
    data = rng.standard_normal((100000, 16)).astype(np.float32)
    ids = rng.integers(0, 10, size=100000).astype(np.int64)
    cases += 1
    if segment_sum(lib, data, ids, 10)[0].tobytes() != segment_sum(lib, data, ids, 10)[0].tobytes():
        fail("segment sum is not deterministic")
    # The OpKernels' memory helpers (fill, copies both ways and on the device).
    for n in (1, 3, 100003):
        a = cp.full(n + 2, -5, cp.int64)
        host = rng.integers(-(2**62), 2**62, size=n).astype(np.int64)
        back = np.zeros(n, np.int64)
        cases += 1
        ok = lib.sok_gpu_fill_i64(a[1:].data.ptr, I64_MIN, n, stream()) == 0
        ok = ok and (cp.asnumpy(a) == np.r_[-5, np.full(n, I64_MIN), -5]).all()
        ok = ok and lib.sok_gpu_copy_to_device(a[1:].data.ptr, host.ctypes.data, 8 * n,
                                               stream()) == 0
        b = cp.full(n, 7, cp.int64)
        ok = ok and lib.sok_gpu_copy_on_device(b.data.ptr, a[1:].data.ptr, 8 * n, stream()) == 0
        ok = ok and lib.sok_gpu_copy_to_host(back.ctypes.data, b.data.ptr, 8 * n, stream()) == 0
        if not (ok and np.array_equal(back, host) and int(a[-1]) == -5):
            fail(f"gpu memory helpers, n={n}")
    print(f"unique / segment-sum / bucketize / routing / memory-helper checks: {cases - failures} passed, "
          f"{failures} failed")
    return failures


def bench_util(lib, time_ms):
    bind(lib)
    try:
        import torch
    except ImportError:
        torch = None
    rows = []
    n = 1 << 23
    x = cp.random.randint(0, 8 << 20, size=n, dtype=cp.int64)
    op = Unique(lib, np.int64, np.int32, n)
    ms = time_ms(lambda: op(x))
    t_ms = float("nan")
    if torch is not None:
        tx = torch.as_tensor(x, device="cuda")
        # torch returns sorted values, not first-appearance order: a cheaper task.
        t_ms = time_ms(lambda: torch.unique(tx, return_inverse=True, return_counts=True))
    rows.append((f"unique_with_counts, {n} ids in [0, 8M)", ms,
                 "torch.unique(inverse, counts), sorted order", t_ms))
    # The DemoModel's batch: 8192 x 100 x 10 keys of an 8192-key vocabulary.
    x = cp.random.randint(0, 8192, size=8192 * 1000, dtype=cp.int64)
    op = Unique(lib, np.int64, np.int64, x.size)
    ms = time_ms(lambda: op(x))
    if torch is not None:
        tx = torch.as_tensor(x, device="cuda")
        t_ms = time_ms(lambda: torch.unique(tx, return_inverse=True, return_counts=True))
    rows.append((f"unique_with_counts, {x.size} ids in [0, 8192) (DemoModel)", ms,
                 "torch.unique(inverse, counts), sorted order", t_ms))
    op = Unique(lib, np.int64, np.int64, x.size, counts=False)
    ms = time_ms(lambda: op(x))
    if torch is not None:
        t_ms = time_ms(lambda: torch.unique(tx, return_inverse=True))
    rows.append((f"unique (no counts), {x.size} ids in [0, 8192) (DemoModel)", ms,
                 "torch.unique(inverse), sorted order", t_ms))
    # As the op calls it after its first batch: a set of 4 slots per value.
    op = Unique(lib, np.int64, np.int64, x.size, counts=False, set_slots=4 * 8192)
    ms = time_ms(lambda: op(x))
    rows.append((f"unique (no counts), {x.size} ids in [0, 8192), set of 32768 slots", ms,
                 "torch.unique(inverse), sorted order", t_ms))
    width, segs = 16, 1 << 20
    data = cp.random.standard_normal((n, width), dtype=cp.float32)
    out = cp.empty((segs, width), cp.float32)
    bad = cp.full(1, I64_MAX, cp.int64)
    fn = lib.sok_unsorted_segment_sum_f32_i64
    size = ctypes.c_size_t(0)
    fn(None, None, n, width, segs, None, None, None, ctypes.byref(size), None)
    temp = cp.empty(size.value, cp.uint8)
    # Uniform segments, and a gradient's repeats on a Zipf(1.05) stream (the
    # hashed DemoModel's: a hot key's segment is ~5% of the rows).
    weights = 1.0 / np.arange(1, segs + 1) ** 1.05
    zipf = np.random.default_rng(0).permutation(segs)[np.random.default_rng(1).choice(
        segs, size=n, p=weights / weights.sum())]
    for what, ids in (("uniform", cp.random.randint(0, segs, size=n, dtype=cp.int64)),
                      ("Zipf(1.05)", cp.asarray(zipf.astype(np.int64)))):
        ms = time_ms(lambda: fn(data.data.ptr, ids.data.ptr, n, width, segs, out.data.ptr,
                                bad.data.ptr, temp.data.ptr, ctypes.byref(size), stream()))
        if torch is not None:
            td, ti = torch.as_tensor(data, device="cuda"), torch.as_tensor(ids, device="cuda")
            t_ms = time_ms(lambda: torch.zeros((segs, width), device="cuda").index_add_(0, ti,
                                                                                         td))
        rows.append((f"unsorted segment sum, {n}x{width} into {segs} segments, {what}", ms,
                     "torch index_add_ (atomics, not deterministic)", t_ms))
    world = 8
    ids = cp.random.randint(0, 1 << 40, size=n, dtype=cp.int64)
    outs = [cp.empty(n, cp.int64) for _ in range(3)]
    sizes = cp.empty(world, cp.int64)
    neg = cp.full(1, I64_MAX, cp.int64)
    fn = lib.sok_bucketize_by_owner_i64
    fn(None, n, world, -1, None, None, None, None, None, None, ctypes.byref(size), None)
    temp = cp.empty(size.value, cp.uint8)
    ms = time_ms(lambda: fn(ids.data.ptr, n, world, -1, outs[0].data.ptr, sizes.data.ptr,
                            outs[1].data.ptr, outs[2].data.ptr, neg.data.ptr, temp.data.ptr,
                            ctypes.byref(size), stream()))
    if torch is not None:
        tids = torch.as_tensor(ids, device="cuda")

        def torch_bucketize():
            _, perm = torch.sort(tids % world, stable=True)
            inv = torch.empty_like(perm)
            inv[perm] = torch.arange(n, device="cuda")
            return tids[perm], torch.bincount(tids % world, minlength=world)

        t_ms = time_ms(torch_bucketize)
    rows.append((f"bucketize by owner, {n} ids, world 8", ms,
                 "torch stable sort + gathers + bincount", t_ms))
    print(f"\n{'case':<58}{'sok ms':>9}{'baseline ms':>13}{'speed-up':>10}  baseline")
    for tag, ms, base, t_ms in rows:
        print(f"{tag:<58}{ms:>9.3f}{t_ms:>13.3f}{t_ms / ms:>9.2f}x  {base}")
    return rows
