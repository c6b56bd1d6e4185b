"""Checks and timings of the GPU hash table (sok_gpu_table_* launchers).

The reference is the CPU table itself (tf_ops/dynamic/core, built into
libcpu_table_ref.so from tests/gpu/cpu_table_ref.cc): every random call is
made on both tables, with the same keys and clock, and their outputs and
whole contents (keys, rows, timestamps, use counts) are compared after it.
"""

import ctypes

import cupy as cp
import numpy as np

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
EXTREME_KEYS = np.array([I64_MIN, I64_MIN + 1, I64_MAX, -1, 0, 1], np.int64)
TOO_MANY_KEYS = -1
INIT_KINDS = {"normal": 0, "truncated_normal": 1, "uniform": 2, "zeros": 3, "constant": 4}


class Config(ctypes.Structure):
    _fields_ = [("dim", ctypes.c_int64), ("init_capacity", ctypes.c_int64),
                ("max_rows", ctypes.c_int64), ("eviction", ctypes.c_int32),
                ("init_kind", ctypes.c_int32), ("mean", ctypes.c_float),
                ("stddev", ctypes.c_float), ("minval", ctypes.c_float),
                ("maxval", ctypes.c_float), ("value", ctypes.c_float),
                ("reserved", ctypes.c_int32), ("seed", ctypes.c_uint64),
                ("hbm_bytes", ctypes.c_int64)]


class Result(ctypes.Structure):
    _fields_ = [("num_evicted", ctypes.c_int64), ("distinct_keys", ctypes.c_int64)]


assert ctypes.sizeof(Config) == 72, "SokGpuTableConfig layout changed"

P, I64, I32, F, U64 = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float,
                       ctypes.c_uint64)


def bind(lib, ref):
    sig = {
        "sok_gpu_table_create": [P, P, P, P],  # config, allocator (NULL: cudaMalloc), stream, out
        "sok_gpu_table_destroy": [P, P],
        "sok_gpu_table_clear": [P, P],
        "sok_gpu_table_size": [P, P, P, P],
        "sok_gpu_table_find": [P, P, I64, P, P, P, P],
        "sok_gpu_table_find_or_insert": [P, P, I64, I64, P, P, P, P, P],
        "sok_gpu_table_scatter": [P, P, I64, P, I32, I64, P, P],
        "sok_gpu_table_scatter_present": [P, P, I64, P, I32, I32, I64, P],
        "sok_gpu_table_remove": [P, P, I64, P, P],
        "sok_gpu_table_import": [P, P, I64, P, P, P, I64, P, P, P],
        "sok_gpu_table_export": [P, I64, I64, P, P, P, P, I64, P, P],
        "sok_gpu_table_rebalance": [P, P],
        "sok_gpu_table_apply_present": [P, P, I32, P, I64, P, I32, I32, I32, P, P, I64, P],
        "sok_gpu_table_row_tiers": [P, P, I64, P, P],
    }
    for name, args in sig.items():
        getattr(lib, name).argtypes = args
        getattr(lib, name).restype = ctypes.c_int
    lib.sok_gpu_table_memory_bytes.argtypes = [P]
    lib.sok_gpu_table_memory_bytes.restype = ctypes.c_int64
    lib.sok_gpu_table_removals.argtypes = [P]
    lib.sok_gpu_table_removals.restype = ctypes.c_int64
    if ref is not None:
        ref.ref_create.argtypes = [I64, I64, I64, I32, I32, F, F, F, F, F, U64]
        ref.ref_create.restype = P
        ref.ref_destroy.argtypes = [P]
        ref.ref_size.argtypes = [P]
        ref.ref_size.restype = I64
        ref.ref_find_or_insert.argtypes = [P, P, I64, I64, P, P]
        ref.ref_find_or_insert.restype = I64
        ref.ref_find.argtypes = [P, P, I64, P, P, P]
        ref.ref_scatter.argtypes = [P, P, I64, P, I32, I64]
        ref.ref_scatter.restype = I64
        ref.ref_remove.argtypes = [P, P, I64]
        ref.ref_remove.restype = I64
        ref.ref_import.argtypes = [P, P, I64, P, P, P, I64]
        ref.ref_import.restype = I64
        ref.ref_export.argtypes = [P, I64, P, P, P, P, I64]
        ref.ref_export.restype = I64


def stream():
    return cp.cuda.get_current_stream().ptr


def ptr(a):
    return None if a is None else a.data.ptr


def np_ptr(a):
    return None if a is None else a.ctypes.data


class GpuTable:
    def __init__(self, lib, dim, init_capacity=0, max_rows=0, eviction=0, init="normal",
                 mean=0.0, stddev=1.0, minval=0.0, maxval=1.0, value=0.0, seed=0, hbm_bytes=-1):
        self.lib, self.dim = lib, dim
        cfg = Config(dim, init_capacity, max_rows, eviction, INIT_KINDS[init], mean, stddev,
                     minval, maxval, value, 0, seed, hbm_bytes)
        handle = ctypes.c_void_p()
        rc = lib.sok_gpu_table_create(ctypes.byref(cfg), None, stream(), ctypes.byref(handle))
        if rc != 0:
            raise RuntimeError(f"sok_gpu_table_create returned {rc}")
        self.h = handle

    def close(self):
        if self.h:
            self.lib.sok_gpu_table_destroy(self.h, stream())
            self.h = None

    def _check(self, name, rc):
        if rc != 0:
            raise RuntimeError(f"{name} returned {rc}")

    def size(self):
        size, slots = ctypes.c_int64(), ctypes.c_int64()
        self._check("size", self.lib.sok_gpu_table_size(self.h, ctypes.byref(size),
                                                        ctypes.byref(slots), stream()))
        return size.value, slots.value

    def memory_bytes(self):
        """What the table holds in both tiers (index, rows, scratch)."""
        return int(self.lib.sok_gpu_table_memory_bytes(self.h))

    def rebalance(self):
        self._check("rebalance", self.lib.sok_gpu_table_rebalance(self.h, stream()))

    def row_tiers(self, keys):
        """Per key: 0 missing, 1 row in device memory, 2 in host memory."""
        d = cp.asarray(keys)
        out = cp.full(keys.size, 255, cp.uint8)
        self._check("row_tiers", self.lib.sok_gpu_table_row_tiers(self.h, ptr(d), keys.size,
                                                                  ptr(out), stream()))
        return cp.asnumpy(out)

    def find_d(self, keys, out, found=None, default_row=None):
        self._check("find", self.lib.sok_gpu_table_find(self.h, ptr(keys), keys.size,
                                                        ptr(default_row), ptr(out), ptr(found),
                                                        stream()))

    def find_or_insert_d(self, keys, now, out, evicted=None, result=None, evicted_rows=None):
        return self.lib.sok_gpu_table_find_or_insert(
            self.h, ptr(keys), keys.size, now, ptr(out), ptr(evicted), ptr(evicted_rows),
            ctypes.byref(result) if result is not None else None, stream())

    # Host-array wrappers used by the checks (outputs poisoned first).
    def find(self, keys, default_row):
        k = cp.asarray(keys)
        out = cp.full((len(keys), self.dim), cp.nan, cp.float32)
        found = cp.full(len(keys), 7, cp.uint8)
        d = cp.asarray(default_row)
        self.find_d(k, out, found, d)
        cp.cuda.get_current_stream().synchronize()
        return cp.asnumpy(out), cp.asnumpy(found).astype(bool), cp.asnumpy(found)

    def find_or_insert(self, keys, now):
        k = cp.asarray(keys)
        out = cp.full((len(keys), self.dim), cp.nan, cp.float32)
        evicted = cp.full(max(len(keys), 1), -7, cp.int64)
        res = Result()
        rc = self.find_or_insert_d(k, now, out, evicted, res)
        if rc not in (0, TOO_MANY_KEYS):
            raise RuntimeError(f"find_or_insert returned {rc}")
        if rc == TOO_MANY_KEYS:
            return -1, None, None
        return res.num_evicted, cp.asnumpy(out), cp.asnumpy(evicted[:res.num_evicted])

    # Device copies are held in locals until the call has finished: a
    # temporary's memory could be handed to the next allocation first.
    def scatter(self, keys, rows, mode, now):
        res = Result()
        k, r = cp.asarray(keys), cp.asarray(rows)
        rc = self.lib.sok_gpu_table_scatter(self.h, ptr(k), len(keys), ptr(r), mode, now,
                                            ctypes.byref(res), stream())
        cp.cuda.get_current_stream().synchronize()
        if rc not in (0, TOO_MANY_KEYS):
            raise RuntimeError(f"scatter returned {rc}")
        return -1 if rc == TOO_MANY_KEYS else res.num_evicted

    def scatter_present(self, keys, rows, mode, now, distinct=False):
        k, r = cp.asarray(keys), cp.asarray(rows)
        self._check("scatter_present", self.lib.sok_gpu_table_scatter_present(
            self.h, ptr(k), len(keys), ptr(r), mode, int(distinct), now, stream()))
        cp.cuda.get_current_stream().synchronize()

    def removals(self):
        return self.lib.sok_gpu_table_removals(self.h)

    def remove(self, keys):
        removed = cp.full(1, -7, cp.int64)
        k = cp.asarray(keys)
        self._check("remove", self.lib.sok_gpu_table_remove(self.h, ptr(k), len(keys),
                                                            ptr(removed), stream()))
        return int(removed[0])

    def import_(self, keys, rows, ts, freq, now):
        res = Result()
        k, r = cp.asarray(keys), cp.asarray(rows)
        t = None if ts is None else cp.asarray(ts)
        f = None if freq is None else cp.asarray(freq)
        rc = self.lib.sok_gpu_table_import(self.h, ptr(k), len(keys), ptr(r), ptr(t), ptr(f), now,
                                           None, ctypes.byref(res), stream())
        cp.cuda.get_current_stream().synchronize()
        if rc not in (0, TOO_MANY_KEYS):
            raise RuntimeError(f"import returned {rc}")
        return -1 if rc == TOO_MANY_KEYS else res.num_evicted

    def export(self, updated_after=I64_MIN):
        size, _ = self.size()
        cap = max(size, 1)
        keys = cp.full(cap, -7, cp.int64)
        rows = cp.full((cap, self.dim), cp.nan, cp.float32)
        ts = cp.full(cap, -7, cp.int64)
        freq = cp.full(cap, -7, cp.int64)
        count = cp.full(2, -7, cp.int64)
        self._check("export", self.lib.sok_gpu_table_export(
            self.h, 0, updated_after, ptr(keys), ptr(rows), ptr(ts), ptr(freq), cap, ptr(count),
            stream()))
        c = int(count[0])
        return sort_export(cp.asnumpy(keys[:c]), cp.asnumpy(rows[:c]), cp.asnumpy(ts[:c]),
                           cp.asnumpy(freq[:c]))


def sort_export(keys, rows, ts, freq):
    o = np.argsort(keys, kind="stable")
    return keys[o], rows[o], ts[o], freq[o]


class CpuTable:
    def __init__(self, ref, dim, init_capacity=0, max_rows=0, eviction=0, init="normal",
                 mean=0.0, stddev=1.0, minval=0.0, maxval=1.0, value=0.0, seed=0, hbm_bytes=-1):
        # hbm_bytes: where a GPU table keeps its rows; the CPU reference has
        # one tier.
        self.ref, self.dim = ref, dim
        self.h = ref.ref_create(dim, init_capacity, max_rows, eviction, INIT_KINDS[init], mean,
                                stddev, minval, maxval, value, seed)

    def close(self):
        self.ref.ref_destroy(self.h)

    def find(self, keys, default_row):
        out = np.empty((len(keys), self.dim), np.float32)
        found = np.empty(len(keys), np.uint8)
        self.ref.ref_find(self.h, np_ptr(keys), len(keys), np_ptr(default_row), np_ptr(out),
                          np_ptr(found))
        return out, found.astype(bool), found

    def find_or_insert(self, keys, now):
        out = np.empty((len(keys), self.dim), np.float32)
        evicted = np.empty(max(len(keys), 1), np.int64)
        rc = self.ref.ref_find_or_insert(self.h, np_ptr(keys), len(keys), now, np_ptr(out),
                                         np_ptr(evicted))
        if rc < 0:
            return -1, None, None
        return rc, out, evicted[:rc]

    def scatter(self, keys, rows, mode, now):
        return self.ref.ref_scatter(self.h, np_ptr(keys), len(keys), np_ptr(rows), mode, now)

    def remove(self, keys):
        return self.ref.ref_remove(self.h, np_ptr(keys), len(keys))

    def import_(self, keys, rows, ts, freq, now):
        return self.ref.ref_import(self.h, np_ptr(keys), len(keys), np_ptr(rows), np_ptr(ts),
                                   np_ptr(freq), now)

    def export(self, updated_after=I64_MIN):
        n = self.ref.ref_size(self.h)
        cap = max(n, 1)
        keys = np.empty(cap, np.int64)
        rows = np.empty((cap, self.dim), np.float32)
        ts = np.empty(cap, np.int64)
        freq = np.empty(cap, np.int64)
        c = self.ref.ref_export(self.h, updated_after, np_ptr(keys), np_ptr(rows), np_ptr(ts),
                                np_ptr(freq), cap)
        return sort_export(keys[:c], rows[:c], ts[:c], freq[:c])


class Tally:
    """Counts checks; rows must be bit-identical (the initializer draws with
    correctly rounded float operations only, the same code on both sides:
    tf_ops/dynamic/core/random_draws.h)."""

    def __init__(self):
        self.cases = self.failures = self.inexact = self.values = 0

    def rows(self, what, got, want):
        self.values += want.size
        if got.shape != want.shape or np.isnan(got).any():
            return self.fail(f"{what}: shape {got.shape} vs {want.shape} or NaN")
        differ = got.view(np.uint32) != want.view(np.uint32)
        self.inexact += int(np.sum(differ))
        if differ.any():
            return self.fail(f"{what}: {int(np.sum(differ))} values not bit-identical, max abs "
                             f"diff {np.max(np.abs(got - want)):.3g}")
        return True

    def equal(self, what, got, want):
        got, want = np.atleast_1d(got), np.atleast_1d(want)
        if not np.array_equal(got, want):
            return self.fail(f"{what}: got {got[:8]} want {want[:8]}")
        return True

    def fail(self, msg):
        self.failures += 1
        print("FAIL", msg)
        return False


def compare_state(t, tag, gpu, cpu, updated_after=I64_MIN):
    gk, gr, gts, gf = gpu.export(updated_after)
    ck, cr, cts, cf = cpu.export(updated_after)
    t.cases += 1
    ok = t.equal(f"{tag} export keys", gk, ck)
    if ok:
        ok = t.equal(f"{tag} export timestamps", gts, cts) and t.equal(
            f"{tag} export counts", gf, cf) and t.rows(f"{tag} export rows", gr, cr)
    return ok


def random_keys(rng, pool, n):
    return rng.choice(pool, size=n).astype(np.int64)


def run_sequence(lib, ref, rng, t, steps, **cfg):
    """Random calls on a GPU and a CPU table with the same configuration."""
    dim = cfg["dim"]
    gpu, cpu = GpuTable(lib, **cfg), CpuTable(ref, **cfg)
    limit = cfg.get("max_rows", 0)
    span = max(4, 3 * (limit or 200))
    pool = np.concatenate([rng.integers(-span, span, size=span).astype(np.int64), EXTREME_KEYS,
                           rng.integers(I64_MIN, I64_MAX, size=16, dtype=np.int64)])
    now = 1000
    tag = f"dim={dim} " + " ".join(f"{k}={v}" for k, v in cfg.items() if k != "dim")
    if limit:
        # One more distinct key than the bound: both refuse, neither changes.
        keys = np.unique(pool)[: limit + 1]
        gpu.find_or_insert(keys[:limit // 2], now)
        cpu.find_or_insert(keys[:limit // 2], now)
        now += 1
        t.cases += 1
        t.equal(f"{tag} batch over the bound", [gpu.find_or_insert(keys, now)[0],
                                                cpu.find_or_insert(keys, now)[0]], [-1, -1])
        compare_state(t, f"{tag} after a refused batch", gpu, cpu)
    for step in range(steps):
        now += int(rng.integers(1, 5))
        op = rng.choice(["insert", "insert", "find", "scatter", "remove", "import", "present"])
        n = int(rng.integers(0, max(2, (limit or 150) * 1.3)))
        if rng.random() < 0.1 and limit:
            n = limit + int(rng.integers(1, 20))  # may exceed the bound: both must refuse
        keys = random_keys(rng, pool, n)
        if rng.random() < 0.1:
            keys[:] = keys[0] if n else 0  # all keys equal
        where = f"{tag} step {step} {op} n={n}"
        t.cases += 1
        if op == "insert":
            ge, gout, gev = gpu.find_or_insert(keys, now)
            ce, cout, cev = cpu.find_or_insert(keys, now)
            if t.equal(f"{where} evicted count", ge, ce) and ce >= 0:
                t.equal(f"{where} evicted keys", np.sort(gev), np.sort(cev))
                t.rows(f"{where} rows", gout, cout)
        elif op == "find":
            default = rng.standard_normal(dim).astype(np.float32)
            gout, gfound, graw = gpu.find(keys, default)
            cout, cfound, _ = cpu.find(keys, default)
            t.equal(f"{where} found", gfound, cfound)
            t.equal(f"{where} found is 0/1", np.isin(graw, [0, 1]).all(), True)
            t.rows(f"{where} rows", gout, cout)
        elif op == "scatter":
            mode = int(rng.integers(0, 3))
            rows = rng.standard_normal((n, dim)).astype(np.float32)
            t.equal(f"{where} mode {mode} evicted", gpu.scatter(keys, rows, mode, now),
                    cpu.scatter(keys, rows, mode, now))
        elif op == "present":
            # A find-or-insert, then a scatter of the same keys without
            # inserts (as an optimizer's write-back after the step's lookup):
            # the GPU table may skip the insert only while nothing was
            # removed; the CPU table scatters as usual.
            if rng.random() < 0.5:  # distinct keys, as a unique op gives them
                keys = rng.permutation(np.unique(keys))
                n = len(keys)
            before = gpu.removals()
            ge, _, _ = gpu.find_or_insert(keys, now)
            ce, _, _ = cpu.find_or_insert(keys, now)
            t.equal(f"{where} evicted count", ge, ce)
            t.equal(f"{where} removal count moves only with evictions",
                    gpu.removals() - before, 1 if ge > 0 else 0)
            if ce >= 0:
                now += 1
                mode = int(rng.integers(0, 3))
                rows = rng.standard_normal((n, dim)).astype(np.float32)
                after = gpu.removals()
                # distinct keys may skip the ordering of repeated ones
                distinct = len(np.unique(keys)) == n and bool(rng.random() < 0.7)
                gpu.scatter_present(keys, rows, mode, now, distinct)
                cpu.scatter(keys, rows, mode, now)
                t.equal(f"{where} mode {mode} removal count after", gpu.removals(), after)
                t.equal(f"{where} size after (no missing key)", gpu.size()[0] >= 0, True)
        elif op == "remove":
            before = gpu.removals()
            t.equal(f"{where} removed", gpu.remove(keys), cpu.remove(keys))
            t.equal(f"{where} removal count", gpu.removals() - before, 1 if n else 0)
        else:
            rows = rng.standard_normal((n, dim)).astype(np.float32)
            meta = rng.random() < 0.5
            ts = rng.integers(0, now, size=n).astype(np.int64) if meta else None
            freq = rng.integers(0, 50, size=n).astype(np.int64) if meta else None
            t.equal(f"{where} evicted", gpu.import_(keys, rows, ts, freq, now),
                    cpu.import_(keys, rows, ts, freq, now))
        if cfg.get("hbm_bytes", -1) > 0 and rng.random() < 0.5:
            # Rows moved between device and host memory keep their values.
            gpu.rebalance()
        if not compare_state(t, where, gpu, cpu):
            break
    # export of recently updated rows only
    compare_state(t, f"{tag} export after", gpu, cpu, updated_after=now - 6)
    gpu.close()
    cpu.close()


def check_tiers(lib, ref, rng, t):
    """A table with a third of its rows in device memory, fed a skewed
    stream: after enough lookups (a pass every 16) the most used keys' rows
    are in device memory, and every row and count equals the CPU table's
    (which has one tier) through the moves."""
    dim, rows, hot = 8, 3000, 200
    cfg = dict(dim=dim, max_rows=rows, eviction=1, init="uniform", seed=12,
               hbm_bytes=dim * 4 * 1400)
    gpu, cpu = GpuTable(lib, **cfg), CpuTable(ref, **cfg)
    keys = rng.permutation(rows).astype(np.int64) * 7919 - 10**6
    now = 100
    # Every key once (rows placed by hash), then the hot keys many times.
    for batch in (keys, *([keys[:hot]] * 40), keys[hot:2 * hot]):
        now += 1
        t.cases += 1
        ge, gout, _ = gpu.find_or_insert(batch, now)
        ce, cout, _ = cpu.find_or_insert(batch, now)
        t.equal(f"tiers step {now} evicted", ge, ce)
        t.rows(f"tiers step {now} rows", gout, cout)
    compare_state(t, "tiers after the hot stream", gpu, cpu)
    tiers = gpu.row_tiers(keys)
    t.cases += 1
    t.equal("tiers: every hot key's row in device memory", (tiers[:hot] == 1).all(), True)
    t.equal("tiers: rows in device memory within the budget",
            int((tiers == 1).sum()) <= 1400 + 2, True)
    t.equal("tiers: every key present", (tiers > 0).all(), True)
    t.equal("tiers: a missing key", gpu.row_tiers(np.array([10**12], np.int64))[0], 0)
    gpu.close()
    cpu.close()
    check_pool_memory(lib, t)


def check_pool_memory(lib, t):
    """A bounded table with a device-memory budget allocates rows for
    max_rows keys (its pool), not one per slot of its index (4096 slots hold
    3000 keys at most 3/4 full): what lets its rows exceed the GPU's memory
    by no more than they must."""
    dim, rows, slots = 1024, 3000, 4096
    for hbm_rows in (1000, 0, 5000):
        table = GpuTable(lib, dim, max_rows=rows, init="zeros", hbm_bytes=dim * 4 * hbm_rows)
        got = table.memory_bytes()
        t.cases += 1
        t.equal(f"pooled table (budget {hbm_rows} rows): at least max_rows rows",
                got >= rows * 4 * dim, True)
        t.equal(f"pooled table (budget {hbm_rows} rows): fewer rows than slots "
                f"({got} bytes)", got < slots * 4 * dim, True)
        table.close()


def check_bounded_growth(lib, ref, rng, t):
    """A bounded table starts with room for its init_capacity, not for its
    bound, and grows half full up to its bound's slots (at most 3/4 full
    there: 4/3 to 8/3 slots a key), where it evicts instead of growing;
    against the CPU table throughout. The bound's slots are computed here
    from that rule, not read from the table."""
    def bound_slots(rows):
        s = 64
        while s // 2 + s // 4 < rows:
            s *= 2
        return s

    # SOK's default hybrid bound of 2^26 keys, dim 16: its index alone
    # was 2^27 slots (3 GiB) and its rows 8 GiB before the first key.
    big = GpuTable(lib, 16, init_capacity=1 << 10, max_rows=1 << 26, init="zeros")
    t.cases += 1
    t.equal("bounded table of 2^26 rows made with init_capacity 1024: its slots",
            big.size()[1], 2048)
    t.equal("bounded table of 2^26 rows made: memory under 8 MiB",
            big.memory_bytes() < 8 << 20, True)
    keys = (np.arange(100000, dtype=np.int64) * 7919) - 50000
    ev, _, _ = big.find_or_insert(keys, 3)
    t.equal("bounded table of 2^26 rows: 100000 keys, none evicted", ev, 0)
    size, slots = big.size()
    t.equal("bounded table of 2^26 rows: its size after 100000 keys", size, 100000)
    t.equal("bounded table of 2^26 rows: grown half full (262144 slots)", slots, 262144)
    big.close()
    for rows, init_capacity, eviction in ((1000, 0, 0), (3000, 100, 1), (6000, 6000, 0)):
        cfg = dict(dim=8, init_capacity=init_capacity, max_rows=rows, eviction=eviction,
                   init="uniform", seed=3)
        gpu, cpu = GpuTable(lib, **cfg), CpuTable(ref, **cfg)
        most = 0
        for step in range(8):
            keys = rng.integers(0, 3 * rows, size=rows // 2).astype(np.int64)
            t.cases += 1
            ge, gout, gev = gpu.find_or_insert(keys, 20 + step)
            ce, cout, cev = cpu.find_or_insert(keys, 20 + step)
            where = f"bounded growth {cfg} step {step}"
            if t.equal(f"{where} evicted", ge, ce) and ce >= 0:
                t.equal(f"{where} evicted keys", np.sort(gev), np.sort(cev))
                t.rows(f"{where} rows", gout, cout)
            most = max(most, gpu.size()[1])
            compare_state(t, where, gpu, cpu)
        t.equal(f"bounded growth {cfg}: at most its bound's slots", most, bound_slots(rows))
        t.equal(f"bounded growth {cfg}: full", gpu.size()[0], rows)
        gpu.close()
        cpu.close()


def check_apply_present(lib, rng, t):
    """The optimizer's update in place (sok_gpu_table_apply_present) of
    distinct keys a find-or-insert made present: SGD on a table alone, and
    tf.compat.v1 Momentum with its accumulator in a slot table (zeros
    initially, so after one step acc = g and w = w0 - lr * g), on a table
    with rows in both tiers after a pass moved some; against numpy."""
    lr, momentum = 0.125, 0.9
    hyper = np.zeros(11, np.float32)  # core::kNumHyper
    hyper[0], hyper[1] = lr, momentum  # kLr, kMomentumCoef
    hyper_d, step_d = cp.asarray(hyper), cp.asarray(np.array([1], np.int64))
    for algorithm, slot_count, cfg in ((0, 0, dict(dim=8, init="uniform", seed=3)),
                                       (1, 1, dict(dim=12, max_rows=4000, init="normal", seed=4,
                                                   hbm_bytes=12 * 4 * 1000))):
        dim = cfg["dim"]
        table = GpuTable(lib, **cfg)
        slots = [GpuTable(lib, **dict(cfg, init="zeros")) for _ in range(slot_count)]
        keys = rng.permutation(np.arange(3000, dtype=np.int64) * 31 - 777)
        _, before, _ = table.find_or_insert(keys, 10)
        table.rebalance()
        for slot in slots:
            slot.find_or_insert(keys, 10)
        grads = rng.standard_normal((keys.size, dim)).astype(np.float32)
        keys_d, grads_d = cp.asarray(keys), cp.asarray(grads)
        handles = (ctypes.c_void_p * max(1, slot_count))(*[s.h.value for s in slots])
        rc = lib.sok_gpu_table_apply_present(table.h, ctypes.cast(handles, ctypes.c_void_p),
                                             slot_count, ptr(keys_d),
                                             keys.size, ptr(grads_d), algorithm, 1, 0,
                                             ptr(hyper_d), ptr(step_d), 11, stream())
        t.cases += 1
        t.equal(f"apply_present algorithm {algorithm} rc", rc, 0)
        after, found, _ = table.find(keys, np.zeros(dim, np.float32))
        want = before - np.float32(lr) * grads
        # a multiply-add may be fused on the GPU: one rounding, not two
        close = np.abs(after - want) <= 2 * np.spacing(np.abs(want))
        t.equal(f"apply_present algorithm {algorithm} rows", bool(close.all() and found.all()),
                True)
        for slot in slots:
            acc, _, _ = slot.find(keys, np.zeros(dim, np.float32))
            t.rows(f"apply_present algorithm {algorithm} accumulator", acc, grads)
            slot.close()
        table.close()


def check_table(lib, ref, rng, quick=False):
    bind(lib, ref)
    t = Tally()
    configs = [
        dict(dim=8, init="normal", seed=3),
        dict(dim=5, max_rows=120, eviction=0, init="uniform", minval=-0.5, maxval=0.25, seed=9),
        dict(dim=64, max_rows=300, eviction=1, init="truncated_normal", stddev=0.1, seed=1),
        dict(dim=3, max_rows=40, eviction=1, init="constant", value=0.5),
        dict(dim=16, max_rows=64, eviction=0, init="zeros"),
        dict(dim=130, init_capacity=1000, init="normal", mean=1.0, stddev=2.0, seed=77),
        dict(dim=1, max_rows=17, eviction=0, init="uniform"),
        # Rows split between device and mapped host memory: a few rows, half
        # of them, none in device memory (an unbounded table keeps the budget
        # as it grows).
        dict(dim=8, max_rows=120, eviction=0, init="normal", seed=4, hbm_bytes=8 * 4 * 3),
        dict(dim=6, max_rows=90, eviction=1, init="uniform", hbm_bytes=6 * 4 * 100),
        dict(dim=5, init="normal", seed=8, hbm_bytes=0),
        dict(dim=12, init_capacity=10, init="normal", seed=2, hbm_bytes=12 * 4 * 70),
        # Bounded tables with a budget keep their rows in a pool of max_rows
        # (+ 3) rows: rows taken and given back through inserts, evictions,
        # removals, rehashes and passes of the tiers, both eviction orders.
        dict(dim=8, max_rows=120, eviction=1, init="normal", seed=5, hbm_bytes=8 * 4 * 50),
        dict(dim=4, max_rows=64, eviction=0, init="uniform", seed=6, hbm_bytes=4 * 4 * 20),
    ]
    for cfg in configs:
        run_sequence(lib, ref, rng, t, 12 if quick else 40, **cfg)
    # Concurrency at scale: many warps inserting the same new keys at once,
    # growth from a tiny index, eviction of thousands of keys per call.
    for cfg, n, steps in ((dict(dim=32, init_capacity=0, seed=5), 60000, 4),
                          (dict(dim=64, max_rows=50000, eviction=1, seed=6), 40000, 5),
                          (dict(dim=12, max_rows=30000, eviction=0, init="uniform"), 25000, 5),
                          (dict(dim=64, max_rows=50000, eviction=0, seed=7,
                                hbm_bytes=64 * 4 * 30000), 40000, 5),
                          (dict(dim=32, init_capacity=0, seed=9, hbm_bytes=32 * 4 * 20000),
                           60000, 4)):
        gpu, cpu = GpuTable(lib, **cfg), CpuTable(ref, **cfg)
        now = 10
        for step in range(steps):
            now += 1
            keys = rng.integers(-n, n, size=n).astype(np.int64)
            t.cases += 1
            ge, gout, gev = gpu.find_or_insert(keys, now)
            ce, cout, cev = cpu.find_or_insert(keys, now)
            where = f"large {cfg} step {step}"
            if t.equal(f"{where} evicted", ge, ce) and ce >= 0:
                t.equal(f"{where} evicted keys", np.sort(gev), np.sort(cev))
                t.rows(f"{where} rows", gout, cout)
            drop = keys[: n // 5]
            t.equal(f"{where} removed", gpu.remove(drop), cpu.remove(drop))
            if cfg.get("hbm_bytes", -1) > 0:
                gpu.rebalance()  # rows moved between tiers keep their values
            compare_state(t, where, gpu, cpu)
        gpu.close()
        cpu.close()
    check_tiers(lib, ref, rng, t)
    check_bounded_growth(lib, ref, rng, t)
    check_apply_present(lib, rng, t)
    # A key missing from a scatter that promised present keys is skipped and
    # reported by the next call that waits, until a clear.
    table = GpuTable(lib, 4, init="zeros")
    table.find_or_insert(np.array([1, 2], np.int64), 5)
    table.scatter_present(np.array([1, 3], np.int64), np.ones((2, 4), np.float32), 2, 6)
    t.cases += 1
    size, slots = ctypes.c_int64(), ctypes.c_int64()
    rc = lib.sok_gpu_table_size(table.h, ctypes.byref(size), ctypes.byref(slots), stream())
    t.equal("a missing key in scatter_present is reported", rc, -3)
    before = table.removals()
    lib.sok_gpu_table_clear(table.h, stream())
    t.equal("a clear counts as a removal", table.removals() - before, 1)
    t.equal("reported until a clear", table.size()[0], 0)
    table.close()
    print(f"GPU hash table vs CPU table: {t.cases - t.failures} checks passed, {t.failures} "
          f"failed; {t.values} row values compared, {t.inexact} not bit-identical")
    return t.failures


def distinct_keys(n, offset):
    """n distinct int64 keys spread over the whole range (odd multiplier: a bijection)."""
    i = cp.arange(offset, offset + n, dtype=cp.uint64)
    return (i * cp.uint64(0x9E3779B97F4A7C15)).view(cp.int64)


def bench_table(lib, time_ms, dim=64, batch=1 << 20):
    """Find and insert throughput at dim 64, 1M keys per call, in a table of
    4M slots (2M keys = load factor 0.5)."""
    bind(lib, None)
    table = GpuTable(lib, dim, init_capacity=2 * batch, init="normal", seed=1)
    _, slots = table.size()
    out = cp.empty((batch, dim), cp.float32)
    found = cp.empty(batch, cp.uint8)
    res = Result()
    rows = []

    def insert(keys, now):
        rc = table.find_or_insert_d(keys, now, out, None, res)
        assert rc == 0, rc

    def timed_insert(load_before, tag):
        times = []
        start, end = cp.cuda.Event(), cp.cuda.Event()
        for rep in range(6):
            table.lib.sok_gpu_table_clear(table.h, stream())
            for b in range(load_before):
                insert(distinct_keys(batch, b * batch), 1)
            fresh = distinct_keys(batch, (10 + rep) * batch)
            cp.cuda.get_current_stream().synchronize()
            start.record()
            insert(fresh, 2)
            end.record()
            end.synchronize()
            if rep:
                times.append(cp.cuda.get_elapsed_time(start, end))
        size, _ = table.size()
        assert size == (load_before + 1) * batch, size
        ms = float(np.median(times))
        rows.append((tag, ms, batch / ms / 1e6))

    timed_insert(1, f"insert 1M new keys, load {batch / slots:.2f} -> {2 * batch / slots:.2f}")
    timed_insert(2, f"insert 1M new keys, load {2 * batch / slots:.2f} -> {3 * batch / slots:.2f}")
    # Table at load 0.5 for the finds.
    table.lib.sok_gpu_table_clear(table.h, stream())
    insert(distinct_keys(batch, 0), 1)
    insert(distinct_keys(batch, batch), 1)
    hits = distinct_keys(2 * batch, 0)[cp.random.permutation(2 * batch)[:batch]]
    half = cp.concatenate([hits[: batch // 2], distinct_keys(batch // 2, 50 * batch)])
    ms = time_ms(lambda: table.find_d(hits, out, found))
    rows.append(("find 1M keys, all present, load 0.50", ms, batch / ms / 1e6))
    assert bool(found.all()), "find missed keys that are present"
    ms = time_ms(lambda: table.find_d(half, out, found))
    rows.append(("find 1M keys, half present, load 0.50", ms, batch / ms / 1e6))
    ms = time_ms(lambda: insert(hits, 3))
    rows.append(("find_or_insert 1M present keys (touch)", ms, batch / ms / 1e6))
    table.close()
    zeros = GpuTable(lib, dim, init_capacity=2 * batch, init="zeros")
    table = zeros
    timed_insert(1, "insert 1M new keys, zeros initializer, 0.25 -> 0.50")
    zeros.close()
    moved = batch * (dim * 4 * 2 + 8)
    print(f"\nGPU hash table, dim {dim}, {slots} slots, batches of {batch} keys "
          f"(rows moved per find: {moved / 1e9:.2f} GB)")
    print(f"{'case':<52}{'ms':>8}{'G keys/s':>10}")
    for tag, ms, rate in rows:
        print(f"{tag:<52}{ms:>8.3f}{rate:>10.2f}")
    return rows
