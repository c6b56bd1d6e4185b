"""The dynamic-table ops against a Python dict model of the table."""

import threading

import numpy as np
import pytest
import tensorflow as tf

from sok_graph.initializers import DEFAULT
from sok_graph.ops import dynamic as dyn

I64 = np.iinfo(np.int64)


def _init_apart(kwargs):
    """(the initializer spec's keys of kwargs, the create op's other
    arguments)."""
    init = {k: v for k, v in kwargs.items() if k in DEFAULT}
    return init, {k: v for k, v in kwargs.items() if k not in DEFAULT}


def make_table(dim=3, key_dtype=tf.int64, **kwargs):
    handle = dyn.handle(f"t{np.random.randint(1 << 40)}")
    kwargs.setdefault("initializer", "constant")
    kwargs.setdefault("value", 0.5)
    init, other = _init_apart(kwargs)
    dyn.create(handle, key_dtype, dim, init, **other)
    return handle


class DictTable:
    """The reference: rows, last-use time (call number) and use counts."""

    def __init__(self, dim, init_value=0.5, max_rows=0, eviction="lru"):
        self.dim, self.init, self.max_rows, self.eviction = dim, init_value, max_rows, eviction
        self.rows, self.time, self.freq = {}, {}, {}
        self.clock = 0
        self.evicted = 0

    def _order(self, k):
        if self.eviction == "lfu":
            return (self.freq[k], self.time[k], k)
        return (self.time[k], k)

    def _ensure(self, keys, accessed):
        self.clock += 1
        now = self.clock
        new = []
        for k in keys:
            if k in self.rows:
                self.time[k] = now
                if accessed:
                    self.freq[k] += 1
            elif k not in new:
                new.append(k)
            elif accessed:
                pass  # counted below
        if self.max_rows and len(self.rows) + len(new) > self.max_rows:
            excess = len(self.rows) + len(new) - self.max_rows
            candidates = sorted((k for k in self.rows if self.time[k] != now), key=self._order)
            assert len(candidates) >= excess
            for k in candidates[:excess]:
                del self.rows[k], self.time[k], self.freq[k]
            self.evicted += excess
        for k in new:
            self.rows[k] = np.full(self.dim, self.init, np.float32)
            self.time[k] = now
            self.freq[k] = 0
        if accessed:
            for k in keys:
                if k in new:
                    self.freq[k] += 1
        return now

    def find_or_insert(self, keys):
        self._ensure(keys, True)
        return np.stack([self.rows[k] for k in keys]) if keys else np.zeros((0, self.dim))

    def scatter(self, keys, rows, mode):
        self._ensure(keys, False)
        for k, r in zip(keys, rows):
            if mode == "add":
                self.rows[k] = self.rows[k] + r
            elif mode == "sub":
                self.rows[k] = self.rows[k] - r
            else:
                self.rows[k] = r.copy()

    def remove(self, keys):
        n = 0
        for k in keys:
            if k in self.rows:
                del self.rows[k], self.time[k], self.freq[k]
                n += 1
        return n


def export_dict(handle, dim, key_dtype=tf.int64, limit=7):
    out, offset = {}, 0
    size = int(dyn.stats(handle)[0])
    while True:
        k, r, t, f, nxt = dyn.export(handle, key_dtype, dim, offset=offset, limit=limit)
        for key, row, ts, fr in zip(k.numpy(), r.numpy(), t.numpy(), f.numpy()):
            assert int(key) not in out, "export returned a key twice"
            out[int(key)] = (row, int(ts), int(fr))
        offset = int(nxt)
        if offset >= size:
            return out


SPECIAL = [0, 1, -1, int(I64.min), int(I64.max), 1 << 40, -(1 << 40)]


@pytest.mark.parametrize("max_rows,eviction", [(0, "lru"), (24, "lru"), (24, "lfu")])
def test_random_workload_matches_dict(rng, max_rows, eviction):
    dim = 3
    handle = make_table(dim, max_capacity=max_rows, eviction=eviction)
    ref = DictTable(dim, max_rows=max_rows, eviction=eviction)
    pool = SPECIAL + [int(x) for x in rng.integers(-50, 50, size=40)]
    for step in range(150):
        op = rng.choice(["foi", "foi", "ufoi", "find", "add", "sub", "update", "remove",
                         "empty"])
        n = int(rng.integers(1, 9))
        keys = [pool[i] for i in rng.integers(0, len(pool), size=n)]
        if op == "empty":
            got, evicted = dyn.find_or_insert(handle, tf.zeros([0], tf.int64), dim)
            assert got.shape == (0, dim) and int(evicted) == 0
            continue
        t_keys = tf.constant(keys, tf.int64)
        if op == "foi":
            want = ref.find_or_insert(keys)
            got, _ = dyn.find_or_insert(handle, t_keys, dim)
            np.testing.assert_array_equal(got.numpy(), want)
        elif op == "ufoi":
            # tf.unique of the batch, then its distinct keys through the table
            distinct = list(dict.fromkeys(keys))
            want = ref.find_or_insert(distinct)
            u, positions, got, num_evicted, evicted = dyn.unique_find_or_insert(
                handle, t_keys, dim)
            assert u.numpy().tolist() == distinct
            assert positions.dtype == tf.int64
            assert positions.numpy().tolist() == [distinct.index(k) for k in keys]
            np.testing.assert_array_equal(got.numpy(), want)
            assert int(num_evicted) == evicted.shape[0]
            assert not set(evicted.numpy().tolist()) & set(distinct)
        elif op == "find":
            got, found = dyn.find(handle, t_keys, dim, default_value=-7.0)
            for k, row, f in zip(keys, got.numpy(), found.numpy()):
                assert f == (k in ref.rows)
                np.testing.assert_array_equal(row, ref.rows[k] if f else np.full(dim, -7.0))
        elif op in ("add", "sub", "update"):
            rows = rng.standard_normal((n, dim)).astype(np.float32)
            ref.scatter(keys, rows, op)
            dyn.scatter(handle, t_keys, tf.constant(rows), op)
        else:
            assert int(dyn.remove(handle, t_keys)) == ref.remove(keys)
        size, limit, evicted, _ = [int(x) for x in dyn.stats(handle)]
        assert size == len(ref.rows), f"step {step} ({op})"
        assert evicted == ref.evicted
        if max_rows:
            assert size <= max_rows and limit == max_rows
    table = export_dict(handle, dim)
    assert set(table) == set(ref.rows)
    for k, (row, _, freq) in table.items():
        np.testing.assert_allclose(row, ref.rows[k], rtol=1e-6, atol=1e-6)
        assert freq == ref.freq[k]


@pytest.mark.parametrize("eviction", ["lru", "lfu"])
def test_eviction_order(eviction):
    handle = make_table(2, max_capacity=4, eviction=eviction)
    use = lambda keys: dyn.find_or_insert(handle, tf.constant(keys, tf.int64), 2)  # noqa: E731
    use([1, 2, 3, 4])   # t1: all used once
    use([1, 1, 1])      # t2: 1 used 4 times
    use([2, 2])         # t3: 2 used 3 times
    use([3])            # t4: 3 used twice, most recent
    _, evicted = use([5, 6])  # t5: two must go
    assert int(evicted) == 2
    keys = set(export_dict(handle, 2))
    # LRU: 4 (t1) and 1 (t2) are oldest. LFU: 4 (1 use) and 3 (2 uses).
    assert keys == ({2, 3, 5, 6} if eviction == "lru" else {1, 2, 5, 6})
    _, evicted = use([7])
    keys = set(export_dict(handle, 2))
    # LRU: 2 (t3) is oldest. LFU: 5 and 6 have 1 use at t5; the smaller key goes.
    assert keys == ({3, 5, 6, 7} if eviction == "lru" else {1, 2, 6, 7})


@pytest.mark.parametrize("key_dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("max_rows", [0, 6])
def test_unique_find_or_insert_is_unique_then_find_or_insert(rng, key_dtype, max_rows):
    """The fused op against tf.unique and find_or_insert of the distinct
    keys on a second table of the same configuration: the same outputs,
    evictions and table state, batch after batch."""
    dim = 4
    cfg = dict(max_capacity=max_rows, initializer="uniform", minval=-1.0, maxval=1.0, seed=3)
    fused, plain = make_table(dim, key_dtype, **cfg), make_table(dim, key_dtype, **cfg)
    for step in range(12):
        keys = tf.constant(rng.integers(-6, 6, size=int(rng.integers(0, 12))), key_dtype)
        want_u, want_positions = tf.unique(keys, out_idx=tf.int64)
        if max_rows and want_u.shape[0] > max_rows:  # refused, as find_or_insert refuses
            with pytest.raises(tf.errors.InvalidArgumentError, match="distinct keys"):
                dyn.unique_find_or_insert(fused, keys, dim)
            continue
        u, positions, rows, num_evicted, evicted = dyn.unique_find_or_insert(fused, keys, dim)
        want_rows, want_evicted, want_keys, _ = dyn.find_or_insert_evicting(plain, want_u, dim)
        assert u.dtype == key_dtype and evicted.dtype == key_dtype
        np.testing.assert_array_equal(u.numpy(), want_u.numpy())
        np.testing.assert_array_equal(positions.numpy(), want_positions.numpy())
        np.testing.assert_array_equal(rows.numpy(), want_rows.numpy())
        assert int(num_evicted) == int(want_evicted)
        np.testing.assert_array_equal(np.sort(evicted.numpy()), np.sort(want_keys.numpy()))
        got_state, want_state = export_dict(fused, dim, key_dtype), export_dict(plain, dim,
                                                                                key_dtype)
        assert got_state.keys() == want_state.keys(), f"step {step}"
        for k, (row, _, freq) in got_state.items():
            np.testing.assert_array_equal(row, want_state[k][0])
            assert freq == want_state[k][2]


def test_unique_find_or_insert_over_batches_whose_distinct_counts_jump(rng):
    """The fused op (one instance, in a tf.function) over batches of few,
    then many, then few distinct keys: its GPU kernel sizes unique's hash set
    by the last batch (an overflow runs again in the full set; a large batch
    of few keys is ranked by the set's slots). The same outputs as tf.unique
    and find_or_insert of the distinct keys on a twin table."""
    dim = 2
    cfg = dict(max_capacity=0, initializer="uniform", minval=-1.0, maxval=1.0, seed=5)
    fused, plain = make_table(dim, tf.int64, **cfg), make_table(dim, tf.int64, **cfg)
    # One signature: one graph, one kernel, whose hint carries over (GPU:
    # 64 slots, overflowed; 8192; 512, ranked by slots, then overflowed).
    step = tf.function(lambda keys: dyn.unique_find_or_insert(fused, keys, dim)[:3],
                       input_signature=[tf.TensorSpec([None], tf.int64)])
    for n, high in [(2000, 10), (2000, 1500), (20000, 100), (20000, 100), (20000, 5000),
                    (20000, 100), (3000, 2900), (40, 3)]:
        keys = tf.constant(rng.integers(0, high, size=n), tf.int64)
        u, positions, rows = step(keys)
        want_u, want_positions = tf.unique(keys, out_idx=tf.int64)
        want_rows = dyn.find_or_insert_evicting(plain, want_u, dim)[0]
        np.testing.assert_array_equal(u.numpy(), want_u.numpy())
        np.testing.assert_array_equal(positions.numpy(), want_positions.numpy())
        np.testing.assert_array_equal(rows.numpy(), want_rows.numpy())


def test_unique_find_or_insert_refuses_too_many_keys_and_bad_keys():
    handle = make_table(2, max_capacity=4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="5 distinct keys.*at most 4 rows"):
        dyn.unique_find_or_insert(handle, tf.constant([1, 2, 1, 3, 4, 5], tf.int64), 2)
    assert int(dyn.stats(handle)[0]) == 0
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="rank 1|vector|1-D"):
        dyn.unique_find_or_insert(handle, tf.constant([[1, 2]], tf.int64), 2)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="dim"):
        dyn.unique_find_or_insert(handle, tf.constant([1], tf.int64), 3)


def test_lfu_keeps_frequent_old_keys():
    handle = make_table(1, max_capacity=2, eviction="lfu")
    dyn.find_or_insert(handle, tf.constant([10, 10, 10, 11], tf.int64), 1)
    dyn.find_or_insert(handle, tf.constant([12], tf.int64), 1)  # evicts 11 (1 use)
    assert set(export_dict(handle, 1)) == {10, 12}


def test_batch_larger_than_capacity_is_an_error_and_changes_nothing():
    handle = make_table(2, max_capacity=4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="5 distinct keys.*at most 4 rows"):
        dyn.find_or_insert(handle, tf.constant([1, 2, 3, 4, 5], tf.int64), 2)
    assert int(dyn.stats(handle)[0]) == 0
    dyn.find_or_insert(handle, tf.constant([1, 2], tf.int64), 2)
    before = export_dict(handle, 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="5 distinct keys"):
        dyn.find_or_insert(handle, tf.constant([1, 2, 7, 8, 9], tf.int64), 2)
    after = export_dict(handle, 2)
    assert set(after) == {1, 2}
    for k in before:  # metadata untouched by the failed batch
        assert after[k][1:] == before[k][1:]


def test_byte_budget_bounds_rows():
    handle = make_table(4, max_bytes=10 * 16)  # ten rows of 4 floats
    dyn.find_or_insert(handle, tf.range(8, dtype=tf.int64), 4)
    _, evicted = dyn.find_or_insert(handle, tf.range(8, 14, dtype=tf.int64), 4)
    size, limit, _, _ = [int(x) for x in dyn.stats(handle)]
    assert (size, limit, int(evicted)) == (10, 10, 4)


def test_int32_keys_and_dtype_mismatch():
    handle = make_table(2, key_dtype=tf.int32)
    rows, _ = dyn.find_or_insert(handle, tf.constant([3, -4, 2**31 - 1], tf.int32), 2)
    assert rows.shape == (3, 2)
    k, _, _, _, _ = dyn.export(handle, tf.int32, 2)
    assert sorted(k.numpy().tolist()) == [-4, 3, 2**31 - 1]
    with pytest.raises(tf.errors.InvalidArgumentError, match="keys must be int32.*got int64"):
        dyn.find_or_insert(handle, tf.constant([1], tf.int64), 2)


def test_initializers_are_deterministic_per_key_and_seed():
    def rows(seed, keys, kind="normal", **kw):
        h = make_table(8, initializer=kind, seed=seed, **kw)
        return dyn.find_or_insert(h, tf.constant(keys, tf.int64), 8)[0].numpy()

    a = rows(1, [5, 6, 7])
    b = rows(1, [7, 5])
    np.testing.assert_array_equal(a[0], b[1])  # key 5, any order or batch
    np.testing.assert_array_equal(a[2], b[0])
    assert not np.array_equal(rows(2, [5])[0], a[0])
    big = rows(3, list(range(4000)), stddev=2.0, mean=1.0)
    assert abs(big.mean() - 1.0) < 0.05 and abs(big.std() - 2.0) < 0.05
    tn = rows(3, list(range(4000)), "truncated_normal", stddev=1.0)
    assert np.abs(tn).max() <= 2.0 + 1e-6 and tn.std() > 0.8
    un = rows(4, list(range(4000)), "uniform", minval=-1.0, maxval=3.0)
    assert un.min() >= -1.0 and un.max() < 3.0 and abs(un.mean() - 1.0) < 0.05
    np.testing.assert_array_equal(rows(0, [9], "zeros"), np.zeros((1, 8)))


def test_export_import_round_trip_is_bit_exact(rng):
    dim = 5
    src = make_table(dim, initializer="normal", seed=3)
    keys = tf.constant(rng.choice(1 << 50, size=300, replace=False), tf.int64)
    dyn.find_or_insert(src, keys, dim)
    dyn.find_or_insert(src, keys[:50], dim)
    dyn.scatter(src, keys[::3], tf.constant(rng.standard_normal((100, dim)), tf.float32), "add")
    before = export_dict(src, dim, limit=64)
    k, r, t, f, _ = dyn.export(src, tf.int64, dim, limit=1 << 20)
    dst = make_table(dim)
    dyn.import_rows(dst, k, r, t, f)
    after = export_dict(dst, dim, limit=1000)
    assert set(after) == set(before)
    for key, (row, ts, freq) in before.items():
        assert after[key][0].tobytes() == row.tobytes()
        assert after[key][1:] == (ts, freq)


def test_import_dimension_mismatch():
    handle = make_table(4)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"rows must be \[2, 4\]"):
        dyn.import_rows(handle, tf.constant([1, 2], tf.int64), tf.zeros([2, 3]))


def test_export_updated_after_threshold():
    handle = make_table(2)
    dyn.find_or_insert(handle, tf.constant([1, 2, 3], tf.int64), 2)
    stamp = int(dyn.export(handle, tf.int64, 2)[2].numpy().max())
    dyn.scatter(handle, tf.constant([2, 9], tf.int64), tf.ones([2, 2]), "add")
    k, r, t, _, _ = dyn.export(handle, tf.int64, 2, updated_after=stamp)
    assert sorted(k.numpy().tolist()) == [2, 9]
    assert (t.numpy() > stamp).all()


def table_with_stamps(rng, n=57, dim=3):
    """A table of n keys whose last-update times are 10, 20, ..., 50 (set by
    import, so a filter's threshold picks known rows)."""
    handle = make_table(dim)
    keys = rng.choice(1 << 40, size=n, replace=False).astype(np.int64)
    stamps = (1 + np.arange(n) % 5) * 10
    dyn.import_rows(handle, tf.constant(keys), tf.constant(rng.standard_normal((n, dim)),
                                                           tf.float32),
                    tf.constant(stamps, tf.int64), tf.constant(np.arange(n) % 7, tf.int64))
    return handle


def expected_chunk(order, stamps, offset, limit, updated_after):
    """The export contract on a table whose rows, in export order, are `order`
    with last-update times `stamps`: the first `limit` rows at positions >=
    offset updated after `updated_after`; next_offset is the position after
    the last of them when the chunk is full, else max(offset, size)."""
    taken = [p for p in range(offset, len(order)) if stamps[p] > updated_after][:limit]
    nxt = taken[-1] + 1 if len(taken) == limit else max(offset, len(order))
    return [order[p] for p in taken], nxt


@pytest.mark.parametrize("updated_after", [int(I64.min), 5, 20, 40, 50])
@pytest.mark.parametrize("limit", [1, 4, 11, 1000])
def test_export_offsets_count_every_row_with_or_without_a_filter(rng, updated_after, limit):
    handle = table_with_stamps(rng)
    k, _, t, _, nxt = dyn.export(handle, tf.int64, 3, limit=1 << 20)
    order, stamps = k.numpy().tolist(), t.numpy().tolist()
    assert int(nxt) == len(order) == 57
    seen = []
    for offset in [0, 1, 13, 56, 57, 80] + list(range(0, 57, 9)):
        k, _, _, _, nxt = dyn.export(handle, tf.int64, 3, offset=offset, limit=limit,
                                     updated_after=updated_after)
        assert (k.numpy().tolist(), int(nxt)) == expected_chunk(order, stamps, offset, limit,
                                                                updated_after), offset
    # Walking next_offset covers every row that passes the filter once.
    offset = 0
    while offset < len(order):
        k, _, _, _, nxt = dyn.export(handle, tf.int64, 3, offset=offset, limit=limit,
                                     updated_after=updated_after)
        seen += k.numpy().tolist()
        assert int(nxt) > offset
        offset = int(nxt)
    assert sorted(seen) == sorted(o for o, s in zip(order, stamps) if s > updated_after)


def test_find_does_not_insert_or_touch():
    handle = make_table(2)
    dyn.find_or_insert(handle, tf.constant([1], tf.int64), 2)
    before = export_dict(handle, 2)
    rows, found = dyn.find(handle, tf.constant([1, 5], tf.int64), 2, default_value=[9.0, 8.0])
    assert found.numpy().tolist() == [True, False]
    np.testing.assert_array_equal(rows.numpy()[1], [9.0, 8.0])
    after = export_dict(handle, 2)
    assert set(after) == {1} and after[1][1:] == before[1][1:]


def test_clear_and_remove():
    handle = make_table(2)
    dyn.find_or_insert(handle, tf.constant([1, 2, 3], tf.int64), 2)
    assert int(dyn.remove(handle, tf.constant([2, 2, 7], tf.int64))) == 1
    assert set(export_dict(handle, 2)) == {1, 3}
    dyn.clear(handle)
    assert int(dyn.stats(handle)[0]) == 0


@pytest.mark.parametrize("kwargs,pattern", [
    (dict(initializer="xavier"), "initializer must be one of"),
    (dict(eviction="fifo"), "eviction must be 'lru' or 'lfu'"),
    (dict(max_capacity=-1), "max_capacity must be >= 0"),
    (dict(init_capacity=-5), "init_capacity must be >= 0"),
    (dict(max_bytes=3), "holds no row"),
    (dict(hbm_bytes=-2), r"hbm_bytes must be >= 0 \(-1: every row in device memory\)"),
])
def test_bad_create_arguments(kwargs, pattern):
    handle = dyn.handle(f"bad{np.random.randint(1 << 40)}")
    with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
        init, other = _init_apart(kwargs)
        dyn.create(handle, tf.int64, 4, init, **other)


def test_an_init_spec_key_no_initializer_has_is_refused():
    handle = dyn.handle(f"badinit{np.random.randint(1 << 40)}")
    with pytest.raises(ValueError, match=r"init has keys \['stdev'\] that no initializer spec has"):
        dyn.create(handle, tf.int64, 4, dict(initializer="normal", stdev=0.1))


def test_dim_attr_mismatch():
    handle = make_table(4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="dim=3 does not match.*4"):
        dyn.find_or_insert(handle, tf.constant([1], tf.int64), 3)


def test_ops_on_uncreated_table_say_run_initializer():
    handle = dyn.handle(f"missing{np.random.randint(1 << 40)}")
    assert not bool(dyn.is_initialized(handle))
    with pytest.raises(tf.errors.FailedPreconditionError, match="its initializer has not run"):
        dyn.find_or_insert(handle, tf.constant([1], tf.int64), 2)


def test_concurrent_updates_are_serializable():
    """Threads add 1 to every component of some rows while others read: reads
    never see a half-applied add (all components of a row equal) and the
    final rows count every add."""
    dim, keys_per = 16, 64
    handle = make_table(dim, initializer="zeros")
    keys = tf.range(keys_per * 4, dtype=tf.int64)
    dyn.find_or_insert(handle, keys, dim)
    errors = []
    adds_per_thread, writers = 40, 4

    def writer(w):
        try:
            ks = keys[w * keys_per:(w + 2) * keys_per] if w < 3 else keys[:keys_per]
            for _ in range(adds_per_thread):
                dyn.scatter(handle, ks, tf.ones([ks.shape[0], dim]), "add")
                dyn.find_or_insert(handle, ks + 1000 + w, dim)  # inserts race with adds
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    def reader():
        try:
            for _ in range(60):
                rows, found = dyn.find(handle, keys, dim)
                r = rows.numpy()
                if not (r == r[:, :1]).all():
                    errors.append(AssertionError("torn row read"))
        except Exception as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    threads += [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, [f"{type(e).__name__}: {e}" for e in errors]
    final = dyn.find(handle, keys, dim)[0].numpy()[:, 0]
    expected = np.zeros(keys_per * 4)
    for w in range(writers):
        sl = slice(w * keys_per, (w + 2) * keys_per) if w < 3 else slice(0, keys_per)
        expected[sl] += adds_per_thread
    np.testing.assert_array_equal(final, expected)


def test_concurrent_ops_inside_one_graph():
    """Inter-op parallel ops of one Session step on one table."""
    graph = tf.Graph()
    with graph.as_default():
        handle = dyn.handle("shared_in_graph")
        init = dyn.create(handle, tf.int64, 4, dict(initializer="zeros"))
        adds = [dyn.scatter(handle, tf.constant([1, 2, 3], tf.int64), tf.ones([3, 4]), "add")
                for _ in range(16)]
        read = dyn.find(handle, tf.constant([1, 2, 3], tf.int64), 4)[0]
        config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4)
        with tf.compat.v1.Session(graph=graph, config=config) as sess:
            sess.run(init)
            sess.run(adds)
            np.testing.assert_array_equal(sess.run(read), np.full((3, 4), 16.0))


def test_sessions_have_separate_tables_and_rerun_init_keeps_rows():
    graph = tf.Graph()
    with graph.as_default():
        handle = dyn.handle("per_session")
        init = dyn.create(handle, tf.int64, 2, dict(initializer="zeros"))
        add = dyn.scatter(handle, tf.constant([1], tf.int64), tf.ones([1, 2]), "add")
        read = dyn.find(handle, tf.constant([1], tf.int64), 2)[0]
        ok = dyn.is_initialized(handle)
    with tf.compat.v1.Session(graph=graph) as s1, tf.compat.v1.Session(graph=graph) as s2:
        s1.run(init)
        s1.run(add)
        assert not s2.run(ok)
        with pytest.raises(tf.errors.FailedPreconditionError, match="its initializer has not run"):
            s2.run(read)
        s2.run(init)
        s1.run(init)  # re-running the initializer keeps the table
        np.testing.assert_array_equal(s1.run(read), [[1.0, 1.0]])
        np.testing.assert_array_equal(s2.run(read), [[0.0, 0.0]])


def _keys_of(handle, key_dtype=tf.int64):
    return set(export_dict(handle, 2, key_dtype))


_EVICTING_WRITES = {
    "find_or_insert": lambda t, k: dyn.find_or_insert(t, k, 2),
    "unique_find_or_insert": lambda t, k: dyn.unique_find_or_insert(t, k, 2),
    "scatter": lambda t, k: dyn.scatter(t, k, tf.ones([1, 2]), "add"),
    "import": lambda t, k: dyn.import_rows(t, k, tf.ones([1, 2])),
}


@pytest.mark.parametrize("key_dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("write", sorted(_EVICTING_WRITES))
def test_a_shadow_drops_what_its_table_evicts_or_removes(write, key_dtype):
    """SokDynamicTableAddShadow: every write that makes room in a full
    table (bound 4) takes the key it evicts (1, used first) out of the
    shadows in the same op; a write that evicts nothing takes nothing out;
    remove takes its keys out of them too; a replacing import leaves them
    as they are. Two shadows, one added twice."""
    table = make_table(2, key_dtype, max_capacity=4)
    shadows = [make_table(2, key_dtype, max_capacity=4) for _ in range(2)]
    keys = lambda ks: tf.constant(ks, key_dtype)  # noqa: E731
    for k in (1, 2, 3, 4):
        for t in [table] + shadows:
            dyn.find_or_insert(t, keys([k]), 2)
    for s in shadows + shadows[:1]:
        dyn.add_shadow(table, s)
    _EVICTING_WRITES[write](table, keys([3]))  # held: evicts nothing
    assert all(_keys_of(s, key_dtype) == {1, 2, 3, 4} for s in shadows)
    _EVICTING_WRITES[write](table, keys([9]))
    assert _keys_of(table, key_dtype) == {2, 3, 4, 9}
    assert all(_keys_of(s, key_dtype) == {2, 3, 4} for s in shadows)
    assert int(dyn.remove(table, keys([2, 5]))) == 1
    assert all(_keys_of(s, key_dtype) == {3, 4} for s in shadows)
    dyn.import_rows(table, keys([7]), tf.ones([1, 2]), replace=True)
    assert _keys_of(table, key_dtype) == {7}
    assert all(_keys_of(s, key_dtype) == {3, 4} for s in shadows)


def test_a_shadow_is_refused_unless_it_is_another_table_of_the_same_keys():
    table = make_table(2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="cannot shadow itself"):
        dyn.add_shadow(table, table)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="the table's key type: the table's keys are int64, the shadow's "
                             "int32"):
        dyn.add_shadow(table, make_table(2, tf.int32))
    missing = dyn.handle("a_shadow_never_created")
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match="shadow table .a_shadow_never_created. was not found where "
                             "the table"):
        dyn.add_shadow(table, missing)
