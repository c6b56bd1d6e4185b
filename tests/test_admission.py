"""Admission filters of dynamic tables (sok_graph/tables/admission.py) against a
numpy model of the filter: which keys get rows, what the others read, what
training does to them, and that counts survive sok.dump / sok.load."""

import os

import numpy as np
import pytest
import tensorflow as tf

import sok_graph as sok
from sok_graph.dump_load import CheckpointError

DIM = 3


def zipf_batches(rng, steps, batch, hotness, vocab=4000, alpha=1.05):
    """Ragged batches of hashed Zipf ids (keys spread over 62 bits)."""
    salt = rng.integers(1, 1 << 40)
    out = []
    for _ in range(steps):
        ids = (rng.zipf(alpha, size=batch * hotness) - 1) % vocab
        mixed = (ids.astype(np.uint64) + np.uint64(salt)) * np.uint64(0x9E3779B97F4A7C15)
        out.append((mixed >> np.uint64(2)).astype(np.int64).reshape(batch, hotness))
    return out


class CountingModel:
    """The counter filter in numpy: a key enters in the call that brings its
    occurrences to min_count; entered keys stay (no eviction)."""

    def __init__(self, min_count):
        self.min_count, self.count, self.entered = min_count, {}, set()

    def call(self, keys):
        """The set of keys that hold a row after this call."""
        uniq, occ = np.unique(keys, return_counts=True)
        for k, c in zip(uniq.tolist(), occ.tolist()):
            if k in self.entered:
                continue
            self.count[k] = self.count.get(k, 0) + c
            if self.count[k] >= self.min_count:
                self.entered.add(k)
        return set(self.entered)


def held_keys(var):
    return set(var.export()[0].numpy().tolist())


def test_min_count_admits_exactly_the_keys_seen_that_often(rng):
    """Table size and membership equal the numpy model's on a Zipf stream;
    keys not admitted read filter_default and admitted ones their rows."""
    var = sok.DynamicVariable(DIM, min_count=3, initializer="ones", filter_default=0.25)
    model = CountingModel(3)
    for batch in zipf_batches(rng, 12, 64, 4):
        out = sok.lookup_sparse(var, tf.ragged.constant(batch.tolist(), tf.int64),
                                combiners="sum")
        held = model.call(batch)
        assert held_keys(var) == held
        want = np.where(np.isin(batch, list(held)), 1.0, 0.25).sum(axis=1)
        np.testing.assert_allclose(out.numpy(), np.repeat(want[:, None], DIM, 1), rtol=1e-6)
    assert int(var.size[0]) == len(model.entered) > 0


def test_keys_not_admitted_are_not_trained(rng):
    """SGD on sum-pooled rows: admitted keys move by lr * occurrences each
    step, keys not admitted get no row and no update."""
    var = sok.DynamicVariable(DIM, min_count=2, initializer="zeros")
    opt = sok.OptimizerWrapper(tf.keras.optimizers.SGD(learning_rate=0.5))
    model, rows = CountingModel(2), {}
    for batch in zipf_batches(rng, 8, 32, 3, vocab=300):
        with tf.GradientTape() as tape:
            out = sok.lookup_sparse(var, tf.ragged.constant(batch.tolist(), tf.int64),
                                    combiners="sum")
            loss = tf.reduce_sum(out)
        grads = tape.gradient(loss, [var])
        opt.apply_gradients(zip(grads, [var]))
        held = model.call(batch)
        uniq, occ = np.unique(batch, return_counts=True)
        for k, c in zip(uniq.tolist(), occ.tolist()):
            if k in held:
                rows[k] = rows.get(k, 0.0) - 0.5 * c
    keys, values = var.export()
    got = dict(zip(keys.numpy().tolist(), values.numpy()[:, 0].tolist()))
    assert set(got) == set(rows) == model.entered
    for k, v in rows.items():
        assert got[k] == pytest.approx(v), k


def test_sketch_admits_never_later_than_exact_counts(rng):
    """A count-min sketch overestimates: every key the exact model admits is
    admitted, and with enough counters few more (within 5%)."""
    exact = sok.DynamicVariable(DIM, min_count=3, initializer="ones")
    sketch = sok.DynamicVariable(DIM, min_count=3, min_count_counters=1 << 15,
                                 initializer="ones")
    for batch in zipf_batches(rng, 10, 128, 4, vocab=20000):
        ragged = tf.ragged.constant(batch.tolist(), tf.int64)
        for var in (exact, sketch):
            sok.lookup_sparse(var, ragged, combiners="sum")
        assert held_keys(exact) <= held_keys(sketch)
    n_exact, n_sketch = int(exact.size[0]), int(sketch.size[0])
    assert n_exact > 100 and n_sketch <= 1.05 * n_exact, (n_exact, n_sketch)


def test_filter_ratio_applies_only_when_asked_and_repeats(rng):
    keys = tf.constant(rng.choice(1 << 60, size=4000, replace=False), tf.int64)
    plain = sok.DynamicVariable(DIM, filter_ratio=0.3, initializer="ones")
    sok.lookup_sparse(plain, tf.RaggedTensor.from_row_lengths(keys, [4000]), combiners="sum")
    assert int(plain.size[0]) == 4000  # no use_low_frequency_filter: every key enters
    runs = []
    for _ in range(2):
        var = sok.DynamicVariable(DIM, filter_ratio=0.3, initializer="ones")
        before = set()
        for _ in range(3):
            sok.lookup_sparse(var, tf.RaggedTensor.from_row_lengths(keys, [4000]),
                              combiners="sum", use_low_frequency_filter=True)
            held = held_keys(var)
            assert before <= held  # an admitted key keeps its row
            before = held
        runs.append(before)
    assert runs[0] == runs[1]  # decided by a hash of (key, call): the run repeats
    # Each call admits each waiting key with probability 0.3, independently
    # of earlier calls: 1 - 0.7^3 = 0.657 after three (binomial sd 0.0075).
    assert abs(len(runs[0]) / 4000 - 0.657) < 0.04, len(runs[0])


def test_use_low_frequency_filter_must_be_a_bool(rng):
    """use_low_frequency_filter="False" (a flag read from a config or a
    command line) is truthy: the filter was applied, and a table of
    filter_ratio 0.3 turned away about 70% of the new keys, which read its
    default row. A TypeError naming the argument, before any key is
    inserted; False, 0 and None leave every key in, True and 1 filter."""
    keys = tf.constant(rng.choice(1 << 60, size=400, replace=False), tf.int64)
    ids = tf.RaggedTensor.from_row_lengths(keys, [400])
    var = sok.DynamicVariable(DIM, filter_ratio=0.3, initializer="ones")
    for flag in ("False", "no", b"", 0.0, 2, tf.constant(False)):
        with pytest.raises(TypeError) as refused:
            sok.lookup_sparse(var, ids, combiners="sum", use_low_frequency_filter=flag)
        assert str(refused.value) == (f"use_low_frequency_filter must be a bool; got "
                                      f"{type(flag).__name__} {flag!r}")
        assert int(var.size[0]) == 0
    for flag in (False, 0, None, np.False_):
        sok.lookup_sparse(var, ids, combiners="sum", use_low_frequency_filter=flag)
        assert int(var.size[0]) == 400
        var.remove(keys)
    for flag in (True, 1):
        filtered = sok.DynamicVariable(DIM, filter_ratio=0.3, initializer="ones")
        sok.lookup_sparse(filtered, ids, combiners="sum", use_low_frequency_filter=flag)
        assert 40 < int(filtered.size[0]) < 200


@pytest.mark.parametrize("counters", [0, 4096])
def test_counts_survive_dump_and_load(rng, tmp_path, counters):
    """Dump after some steps, load into new tables, go on: the loaded table
    admits the same keys as the one that never stopped."""
    settings = dict(min_count=3, initializer="ones")
    if counters:
        settings["min_count_counters"] = counters
    batches = zipf_batches(rng, 8, 64, 4, vocab=3000)
    ref = sok.DynamicVariable(DIM, name="filtered", **settings)
    for batch in batches[:4]:
        ref.sparse_read(tf.constant(batch.ravel()))
    path = os.path.join(str(tmp_path), "dump")
    sok.dump(path, [ref])
    loaded = sok.DynamicVariable(DIM, name="filtered", **settings)
    sok.load(path, [loaded])
    assert held_keys(loaded) == held_keys(ref)
    for batch in batches[4:]:
        for var in (ref, loaded):
            var.sparse_read(tf.constant(batch.ravel()))
        assert held_keys(loaded) == held_keys(ref)
    # Counts kept one way do not load into a filter that keeps them another.
    other = sok.DynamicVariable(DIM, name="filtered", min_count=3, initializer="ones",
                                min_count_counters=(0 if counters else 512))
    with pytest.raises(CheckpointError, match="admission filter"):
        sok.load(path, [other])


def test_counting_filter_in_a_session_graph(rng):
    """tf.compat.v1 graph mode: the filter's state is made by the table's
    initializer, and the counts carry over between Session runs."""
    batches = zipf_batches(rng, 4, 16, 4, vocab=200)
    graph = tf.Graph()
    with graph.as_default():
        var = sok.DynamicVariable(DIM, min_count=2, initializer="ones")
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        rows = var.sparse_read(ids)
        size = var.size
        init = tf.compat.v1.global_variables_initializer()
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(init)
            sizes = []
            for batch in batches:
                sess.run(rows, {ids: batch.ravel()})
                sizes.append(int(sess.run(size)[0]))
    model = CountingModel(2)
    assert sizes == [len(model.call(b)) for b in batches]


@pytest.mark.parametrize("kwargs,pattern", [
    (dict(min_count=0), "min_count must be >= 1"),
    (dict(min_count=2.5), "min_count must be an integer"),
    (dict(filter_ratio=0.0), r"filter_ratio must be in \(0, 1\]"),
    (dict(filter_ratio=1.5), r"filter_ratio must be in \(0, 1\]"),
    (dict(filter_ratio=float("nan")), "filter_ratio must be a finite number"),
    (dict(min_count=3, min_count_counters=-1), r"min_count_counters must be in \[0, 2\^30\]"),
    (dict(min_count_counters=64), "give min_count >= 2 with it"),
    (dict(min_count=3, min_count_counters=64, min_count_hashes=9),
     r"min_count_hashes must be in \[1, 8\]"),
    (dict(filter_default="zero"), "filter_default must be a finite number"),
    (dict(min_count=2, filter_default=1e39), "filter_default must be 0 or a float32 number"),
    # A subnormal row read as 0 (the ops' threads flush subnormals to zero).
    (dict(min_count=2, filter_default=1e-40), r"filter_default must be 0 or a float32 number"),
    (dict(min_count=2, filter_default=-1e-50), r"filter_default must be 0 or a float32 number"),
    (dict(min_count=10 ** 30), r"min_count must be <= 2\^24"),
    # An integer beyond float64 is named by its range, not called "no integer".
    (dict(min_count=3, min_count_counters=10 ** 400), r"min_count_counters must be in \[0, 2\^30\]"),
    (dict(min_count=10 ** 400), r"min_count must be <= 2\^24"),
    # Hashes of a sketch that is not there were ignored without a word.
    (dict(min_count=3, min_count_hashes=4), "min_count_hashes=4 is the number of hashes of the "
                                            "count-min sketch: give min_count_counters"),
    (dict(min_count_hashes=2), "give min_count_counters"),
    (dict(min_count=2 ** 24 + 1), r"min_count must be <= 2\^24"),
])
def test_bad_filter_settings(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        sok.DynamicVariable(DIM, **kwargs)


def test_filter_default_at_float32s_bounds_is_read_back():
    """float32's largest number as printed (3.4028235e38, a little above it in
    float64) and its smallest normal one are rows keys not admitted read."""
    for default in (3.4028235e38, float(np.finfo(np.float32).tiny)):
        var = sok.DynamicVariable(DIM, min_count=2, initializer="ones", filter_default=default)
        np.testing.assert_array_equal(var.sparse_read(tf.constant([1], tf.int64)).numpy(),
                                      np.full((1, DIM), default, np.float32))


def test_min_count_up_to_the_limit_admits_on_time():
    """Counts are float32 rows, exact up to 2^24: with min_count = 2^24 + 2 a
    key's count stuck at 2^24 (2^24 + 1 rounds back) and it never entered,
    however often it came; such a min_count is refused (above), and at
    2^24 a key enters on its 2^24-th occurrence."""
    var = sok.DynamicVariable(DIM, min_count=2 ** 24, initializer="ones")
    key = tf.constant([7], tf.int64)
    var.admission.restore(key, tf.constant([2 ** 24 - 2], tf.int64))
    np.testing.assert_array_equal(var.sparse_read(key).numpy(), np.zeros((1, DIM)))
    np.testing.assert_array_equal(var.sparse_read(key).numpy(), np.ones((1, DIM)))


@pytest.mark.parametrize("counters", [0, 1 << 20])
def test_two_reads_of_one_table_in_one_run_lose_no_count(counters):
    """Two features sharing one table (lookup_sparse([v, v], ...)) read it
    twice in one Session run, in parallel: each key once in each, with
    min_count=2, enters in that run. The counts were read and written back by
    two ops, so the reads' writes could cross and a count of 2 end as 1 (0
    keys admitted in some runs)."""
    keys = np.arange(2000, dtype=np.int64)
    extra = {"min_count_counters": counters} if counters else {}
    graph = tf.Graph()
    with graph.as_default():
        var = sok.DynamicVariable(2, initializer="ones", min_count=2, **extra)
        a = tf.compat.v1.placeholder(tf.int64, [None])
        b = tf.compat.v1.placeholder(tf.int64, [None])
        rows = sok.lookup_sparse([var, var], [tf.RaggedTensor.from_row_lengths(a, [2000]),
                                              tf.RaggedTensor.from_row_lengths(b, [2000])],
                                 combiners=["sum", "sum"])
        reset = [var.clear(), var.admission.restore(tf.zeros([0], tf.int64),
                                                    tf.zeros([0], tf.int64))]
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sizes = []
            for _ in range(8):
                sess.run(reset)
                sess.run(rows, {a: keys, b: keys})
                sizes.append(int(sess.run(var.size)[0]))
    assert sizes == [2000] * 8


def test_counts_of_keys_an_int32_table_cannot_hold_are_refused(tmp_path):
    """A dump's waiting counts load by key: key 2^32 + 5 narrowed into an
    int32 table became key 5, which then entered on its first occurrence."""
    dumped = sok.DynamicVariable(DIM, name="t", min_count=3, initializer="ones")
    dumped.sparse_read(tf.constant([2 ** 32 + 5] * 2, tf.int64))
    dumped.sparse_read(tf.constant([7] * 3, tf.int64))
    path = os.path.join(str(tmp_path), "dump")
    sok.dump(path, [dumped])
    narrow = sok.DynamicVariable(DIM, name="t", min_count=3, initializer="ones",
                                 key_type=tf.int32)
    with pytest.raises(CheckpointError, match=r"admission filter's counts.*4294967301"):
        sok.load(path, [narrow])
    assert held_keys(narrow) == set()
    np.testing.assert_array_equal(narrow.sparse_read(tf.constant([5], tf.int32)).numpy(),
                                  np.zeros((1, DIM)))


@pytest.mark.parametrize("min_count", [1, 2])
def test_draws_go_on_after_a_load_where_the_dump_left_them(rng, tmp_path, min_count):
    """A table loaded from a dump made after 3 filtered calls admits in its
    next 3 calls the keys the table that never stopped admits: the dump
    keeps the filter's call counter, which salts the draws. Restarted at 0,
    the loaded table drew with the first calls' salts again, and turned the
    same keys away (0.66 of them held after 6 calls, where 1 - 0.7^6 = 0.88
    are due)."""
    keys = tf.constant(rng.choice(1 << 60, size=4000, replace=False), tf.int64)
    ids = tf.RaggedTensor.from_row_lengths(keys, [4000])
    settings = dict(filter_ratio=0.3, initializer="ones", name="drawn")
    if min_count > 1:
        settings["min_count"] = min_count

    def calls(var, n):
        for _ in range(n):
            sok.lookup_sparse(var, ids, combiners="sum", use_low_frequency_filter=True)

    ref = sok.DynamicVariable(DIM, **settings)
    calls(ref, 3)
    path = os.path.join(str(tmp_path), "dump")
    sok.dump(path, [ref])
    loaded = sok.DynamicVariable(DIM, **settings)
    sok.load(path, [loaded])
    assert held_keys(loaded) == held_keys(ref)
    calls(ref, 3)
    calls(loaded, 3)
    assert held_keys(loaded) == held_keys(ref)
    if min_count == 1:  # each call a fresh chance of 0.3 per waiting key
        assert abs(len(held_keys(ref)) / 4000 - (1 - 0.7 ** 6)) < 0.04
    # A dump of a table that drew nothing starts the counter afresh.
    plain = sok.DynamicVariable(DIM, name="drawn", initializer="ones")
    sok.dump(path, [plain])
    sok.load(path, [loaded])
    assert int(loaded.admission.calls().numpy()[0]) == 0


def _counts(var):
    entries, counts = var.admission.export()
    return dict(zip(entries.numpy().tolist(), counts.numpy().tolist()))


@pytest.mark.parametrize("settings", [dict(min_count=2), dict(min_count=2, min_count_counters=64),
                                      dict(filter_ratio=0.999)],
                         ids=["exact_counts", "sketch", "filter_ratio"])
def test_a_call_refused_for_want_of_room_changes_nothing(settings):
    """A bounded table (max_capacity 4) given a call that would admit 8
    keys refuses it before the filter changes: the counts (and the call
    count that salts filter_ratio's draws) stay as they were. The refusal
    came after the counts were added and the entering keys' counts dropped,
    so each had to be seen min_count times again: a third sighting of 4
    keys read the default row. Against the numpy counting model."""
    var = sok.DynamicVariable(2, var_type="hybrid", init_capacity=4, max_capacity=4,
                              initializer="ones", **settings)
    keys = tf.constant(np.arange(8), tf.int64)
    use_ratio = "filter_ratio" in settings
    model = CountingModel(settings.get("min_count", 1))
    if not use_ratio:
        var.sparse_read(keys)
        model.call(np.arange(8))
    before = _counts(var) if not use_ratio else None
    calls = int(var.admission.calls()[0]) if use_ratio else None
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"DynamicVariable 'DynamicVariable': the call admits more distinct "
                             r"keys than its max_capacity=4 holds.*unchanged"):
        var.sparse_read(keys, low_frequency_filter=use_ratio)
    assert int(var.size[0]) == 0
    if use_ratio:
        assert int(var.admission.calls()[0]) == calls
        return
    assert _counts(var) == before
    # Four of them seen a second time (the refused call does not count): in.
    rows = var.sparse_read(keys[:4]).numpy()
    assert model.call(np.arange(4)) == {0, 1, 2, 3}
    np.testing.assert_array_equal(rows, np.ones((4, 2)))
    assert held_keys(var) == {0, 1, 2, 3}


def _fused_call(mode, tables, ids):
    """lookup_sparse(tables, ids) eagerly, in a tf.function or in a Session
    (then the tables are made in its graph: `tables` is a function)."""
    def call(made):
        return sok.lookup_sparse(made, [tf.ragged.constant(i, tf.int64) for i in ids],
                                 combiners="sum")

    if mode == "session":
        with tf.Graph().as_default():
            made = tables()
            out = call(made)
            held = [sok.export(v)[0] for v in made]
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                try:
                    error = None
                    sess.run(out)
                except tf.errors.InvalidArgumentError as e:
                    error = e
                return error, [set(k.tolist()) for k in sess.run(held)]
    made = tables()
    run = tf.function(call) if mode == "function" else call
    try:
        error = None
        run(made)
    except tf.errors.InvalidArgumentError as e:
        error = e
    return error, [held_keys(v) for v in made]


@pytest.mark.parametrize("mode", ["eager", "function", "session"])
@pytest.mark.parametrize("bounded_filter", [{}, dict(min_count=2)], ids=["plain", "counted"])
def test_a_fused_call_refused_for_one_tables_room_changes_no_table(mode, bounded_filter):
    """lookup_sparse([a, b]) where bounded b cannot take its keys: the call
    is refused and a (counting, and a plain table too) is as before. b's
    read refused itself only after a's had inserted and counted its keys:
    a held key 2, and key 1, seen once in the refused call, entered at its
    next sighting with min_count=2. Reference: the keys given."""
    def tables():
        return [sok.DynamicVariable(2, initializer="ones", min_count=2, name="a_counted"),
                sok.DynamicVariable(2, initializer="ones", name="a_plain"),
                sok.DynamicVariable(2, var_type="hybrid", init_capacity=4, max_capacity=4,
                                    initializer="ones", name="b_bounded", **bounded_filter)]

    too_many = [[1, 2, 3, 4, 5], [1, 2, 3, 4, 5]] if bounded_filter else [[1, 2, 3, 4, 5]]
    error, held = _fused_call(mode, tables, [[[1, 2, 2]], [[7, 8]], too_many])
    assert error is not None and "b_bounded" in str(error) and "max_capacity" in str(error)
    assert held == [set(), set(), set()]
    if mode == "eager":
        return
    # What fits goes through (in a call of more keys than the bound: the
    # bounded table's check counts what it admits).
    fits = [[1, 2, 3, 4, 5, 5]] if bounded_filter else [[1, 1, 2, 2, 3, 3]]
    error, held = _fused_call(mode, tables, [[[1, 2, 2]], [[7, 8]], fits])
    assert error is None
    assert held == [{2}, {7, 8}, {5} if bounded_filter else {1, 2, 3}]


def test_a_fused_calls_room_check_leaves_ids_of_another_key_type_to_the_read():
    """The room checks run before the reads; ids a bounded table cannot take
    are still refused by the read's own words, naming sp_ids[t]."""
    bounded = sok.DynamicVariable(2, key_type=tf.int32, var_type="hybrid", max_capacity=4,
                                  name="keys32")
    other = sok.DynamicVariable(2, name="other")
    ids = tf.ragged.constant([[1, 2]], tf.int64)
    with pytest.raises(TypeError, match=r"sp_ids\[0\] must hold int32 keys .*'keys32'"):
        sok.lookup_sparse([bounded, other], [ids, ids], combiners="sum")
    assert held_keys(other) == set()


def test_clear_empties_the_slots_and_the_counts():
    """clear() of a table trained with Adam under a counting filter: the
    key that comes back is counted afresh and trains from fresh moments,
    as the same key of a new table does (it kept its old ones: m of 0.688
    after its fourth step where a first step gives 0.2)."""
    def trained(var, opt, steps):
        for _ in range(steps):
            ids = tf.RaggedTensor.from_row_lengths(tf.constant([1, 1], tf.int64), [2])
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(sok.lookup_sparse(var, ids, combiners="sum"))
            opt.apply_gradients(zip(tape.gradient(loss, [var]), [var]))

    var = sok.DynamicVariable(1, min_count=2, initializer="zeros")
    opt = sok.OptimizerWrapper(tf.keras.optimizers.Adam(0.1))
    trained(var, opt, 3)
    var.clear()
    assert int(var.size[0]) == 0 and not _counts(var)
    assert opt.get_slot(var, "m").export()[0].numpy().size == 0
    trained(var, opt, 1)
    assert not _counts(var) and int(var.size[0]) == 1  # 2 occurrences: entered
    fresh = sok.DynamicVariable(1, min_count=2, initializer="zeros")
    fresh_opt = sok.OptimizerWrapper(tf.keras.optimizers.Adam(0.1))
    trained(fresh, fresh_opt, 1)
    # The moments start afresh (the row differs: Adam's step counts on).
    for name in ("m", "v"):
        np.testing.assert_allclose(opt.get_slot(var, name).export()[1].numpy(),
                                   fresh_opt.get_slot(fresh, name).export()[1].numpy())


def test_two_reads_of_one_table_in_a_session_draw_as_eagerly():
    """lookup_sparse([v, v], ...) with use_low_frequency_filter: the two
    reads of the table take call numbers 1 and 2 in the order they were
    built, so a Session run admits the keys an eager run admits, every time
    (its threads took them in either order: 1,769 or 1,705 keys)."""
    first = np.arange(3000, dtype=np.int64)
    second = np.arange(10 ** 6, 10 ** 6 + 3000, dtype=np.int64)

    def lookup(var, a, b):
        return sok.lookup_sparse(
            [var, var], [tf.RaggedTensor.from_row_lengths(a, [3000]),
                         tf.RaggedTensor.from_row_lengths(b, [3000])],
            combiners=["sum", "sum"], use_low_frequency_filter=True)

    eager = sok.DynamicVariable(2, filter_ratio=0.3, initializer="ones")
    lookup(eager, tf.constant(first), tf.constant(second))
    want = held_keys(eager)
    # The threads reversed the reads in about one run of six: 12 runs.
    for _ in range(12):
        graph = tf.Graph()
        with graph.as_default():
            var = sok.DynamicVariable(2, filter_ratio=0.3, initializer="ones")
            a = tf.compat.v1.placeholder(tf.int64, [None])
            b = tf.compat.v1.placeholder(tf.int64, [None])
            rows = lookup(var, a, b)
            exported = var.export_chunk(0, 1 << 20)[0]
            with tf.compat.v1.Session(graph=graph) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                sess.run(rows, {a: first, b: second})
                assert set(sess.run(exported).tolist()) == want


def test_the_second_read_of_a_session_lookup_sees_the_keys_the_first_admitted():
    """lookup_sparse([v, v], ...) of a min_count table in a Session: the
    second read's keys that the first read has just admitted are held keys,
    which read their rows and count no more (numpy model, as eagerly). Its
    find ran before the first read inserted them: they read filter_default,
    got no gradient, and counted again (a stale count kept for a held key)."""
    first = np.arange(0, 400, dtype=np.int64)
    second = np.arange(200, 600, dtype=np.int64)
    warm = first[::3]  # seen twice before: the first read brings them to 3

    model = CountingModel(3)
    model.call(warm)
    model.call(warm)
    after_first = model.call(first)
    want_first = [1.0 if k in after_first else 0.5 for k in first.tolist()]
    after_second = model.call(second)
    want_second = [1.0 if k in after_second else 0.5 for k in second.tolist()]
    assert 0 < sum(w == 1.0 for w in want_second) < len(second)
    waiting = {k: c for k, c in model.count.items() if k not in model.entered}

    graph = tf.Graph()
    with graph.as_default():
        var = sok.DynamicVariable(1, min_count=3, initializer="ones", filter_default=0.5)
        pre = var.sparse_read(tf.constant(warm))
        rows = sok.lookup_sparse(
            [var, var], [tf.RaggedTensor.from_tensor(tf.constant(first)[:, None]),
                         tf.RaggedTensor.from_tensor(tf.constant(second)[:, None])],
            combiners=["sum", "sum"])
        exported = var.export_chunk(0, 1 << 20)[0]
        counts = var.admission.export()
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(pre)
            sess.run(pre)
            got_first, got_second = sess.run(rows)
            np.testing.assert_array_equal(got_first[:, 0], want_first)
            np.testing.assert_array_equal(got_second[:, 0], want_second)
            assert set(sess.run(exported).tolist()) == after_second
            entries, values = sess.run(counts)
            assert dict(zip(entries.tolist(), values.tolist())) == waiting


def test_a_saver_checkpoint_from_before_a_filter_ratio_restores(tmp_path):
    """The call count that salts filter_ratio's draws is the filter's state
    (sok.dump keeps it), not a variable a tf.compat.v1.train.Saver saves: a
    checkpoint written before the table had filter_ratio restored with
    "Key t/admission_calls not found in checkpoint"."""
    path = str(tmp_path / "ckpt")

    def graph_with(**settings):
        graph = tf.Graph()
        with graph.as_default():
            var = sok.DynamicVariable(2, name="t", initializer="zeros", **settings)
            write = sok.assign(var, tf.constant([5], tf.int64), tf.constant([[1.0, 2.0]]))
            return graph, var, write, tf.compat.v1.train.Saver()

    graph, _, write, saver = graph_with()
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(write)
        saver.save(sess, path)
    graph, var, _, saver = graph_with(filter_ratio=0.5)
    with graph.as_default():
        found = var.find(tf.constant([5], tf.int64))[0]
        calls = var.admission.calls()
    assert not [v for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
                if "admission" in v.name]
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        saver.restore(sess, path)
        np.testing.assert_array_equal(sess.run(found), [[1.0, 2.0]])
        assert sess.run(calls).tolist() == [0]


def test_a_tables_own_reads_take_a_bool_low_frequency_filter():
    """sparse_read, unique_read and read_counted took any truthy flag:
    "False" applied filter_ratio and turned about 70% of the keys away."""
    var = sok.DynamicVariable(2, filter_ratio=0.3, initializer="ones")
    keys = tf.constant(np.arange(100), tf.int64)
    reads = [lambda f: var.sparse_read(keys, low_frequency_filter=f),
             lambda f: var.unique_read(keys, low_frequency_filter=f),
             lambda f: var.read_counted(keys, tf.ones([100], tf.int64), low_frequency_filter=f)]
    for read in reads:
        for flag in ("False", "no", 2, None):
            with pytest.raises(TypeError, match="low_frequency_filter must be a bool; got"):
                read(flag)
        assert int(var.size[0]) == 0
        read(np.False_)
        assert int(var.size[0]) == 100
        var.clear()


def test_reads_built_apart_run_apart_and_a_restore_makes_the_filter(tmp_path):
    """A training read and an evaluation read of one filtered table in one
    graph: running one does not run the other (only the reads of one
    lookup_sparse call are ordered; chaining every read of the graph made
    the evaluation fetch ask for the training placeholder). A
    tf.compat.v1.train.Saver restore without the initializer makes the
    filter's state, and initializing only a slot table leaves the call
    count as it is (it restarted at 0: draws repeated)."""
    path = str(tmp_path / "ckpt")

    def build():
        var = sok.DynamicVariable(2, name="t", filter_ratio=0.5, min_count=2,
                                  initializer="ones")
        train = tf.compat.v1.placeholder(tf.int64, [None])
        evaluate = tf.compat.v1.placeholder(tf.int64, [None])
        reads = [var.sparse_read(k, low_frequency_filter=True) for k in (train, evaluate)]
        return var, train, evaluate, reads, var.admission.calls(), tf.compat.v1.train.Saver()

    with tf.Graph().as_default():
        var, train, evaluate, reads, calls, saver = build()
        slot = var.make_slot("m", 0.0)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(reads[1], {evaluate: [1, 2, 3]})
            sess.run(reads[0], {train: [1, 2, 3]})
            assert sess.run(calls).tolist() == [2]
            sess.run(tf.compat.v1.variables_initializer([slot]))
            assert sess.run(calls).tolist() == [2]
            saver.save(sess, path)
    with tf.Graph().as_default():
        var, train, evaluate, reads, calls, saver = build()
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, path)
            sess.run(reads[0], {train: [4, 5, 6]})
            assert sess.run(calls).tolist() == [1]  # the Saver keeps no call count


def _checkpoint_round_trip(graph_mode, build, steps_before, steps_after, path):
    """Held keys after `steps_before` steps, a tf.train.Checkpoint, and
    `steps_after` more, for the table that never stopped and for one
    restored from the checkpoint (eagerly, or in tf.compat.v1.Session
    graphs). build() -> (table, step functions)."""
    if not graph_mode:
        ref, steps = build()
        for step in steps_before:
            steps[step]()
        saved = tf.train.Checkpoint(t=ref).save(path)
        restored, restored_steps = build()
        tf.train.Checkpoint(t=restored).restore(saved).assert_existing_objects_matched()
        at_restore = held_keys(restored)
        for step in steps_after:
            steps[step]()
            restored_steps[step]()
        return held_keys(ref), at_restore, held_keys(restored)

    def graph_run(restore_from=None, before=(), save=False):
        with tf.Graph().as_default():
            table, steps = build()
            ops = {name: step() for name, step in steps.items()}
            keys = table._serialize_to_tensors()["-keys"]  # what a checkpoint saves
            checkpoint = tf.compat.v1.train.Checkpoint(t=table)
            with tf.compat.v1.Session() as sess:
                if restore_from is None:
                    sess.run(tf.compat.v1.global_variables_initializer())
                    for step in before:
                        sess.run(ops[step])
                    held = set(sess.run(keys).tolist())
                    return (checkpoint.save(path, session=sess) if save else None), held
                # No initializer: the restore makes the table and its filter.
                checkpoint.restore(restore_from).assert_existing_objects_matched() \
                    .run_restore_ops(sess)
                at_restore = set(sess.run(keys).tolist())
                for step in steps_after:
                    sess.run(ops[step])
                return at_restore, set(sess.run(keys).tolist())

    saved, _ = graph_run(before=steps_before, save=True)
    _, ref_held = graph_run(before=list(steps_before) + list(steps_after))
    at_restore, held = graph_run(restore_from=saved)
    return ref_held, at_restore, held


@pytest.mark.parametrize("graph_mode", [False, True], ids=["eager", "session"])
@pytest.mark.parametrize("settings", [dict(min_count=3), dict(min_count=3, min_count_counters=4096),
                                      dict(filter_ratio=0.3), dict(filter_ratio=0.3, min_count=2)],
                         ids=["exact_counts", "sketch", "filter_ratio", "both"])
def test_counts_and_draws_survive_a_tf_train_checkpoint(rng, tmp_path, graph_mode, settings):
    """A table restored from a tf.train.Checkpoint admits in its next calls
    the keys that the table that never stopped admits: the checkpoint keeps
    the filter's counts and the call count that salts filter_ratio's draws.
    Before, it kept neither: a restarted job counted every waiting key from
    zero and repeated its first calls' draws (held keys after 3 + 3 calls:
    fewer, and other ones)."""
    batches = [b.ravel() for b in zipf_batches(rng, 6, 64, 4, vocab=2000)]

    def build():
        var = sok.DynamicVariable(DIM, name="filtered", initializer="ones", **settings)

        def step(batch):
            ids = tf.RaggedTensor.from_row_lengths(tf.constant(batch), [len(batch)])
            return lambda: sok.lookup_sparse(var, ids, combiners="sum",
                                             use_low_frequency_filter=True)
        return var, {i: step(b) for i, b in enumerate(batches)}

    ref, at_restore, restored = _checkpoint_round_trip(
        graph_mode, build, [0, 1, 2], [3, 4, 5], str(tmp_path / "ckpt"))
    assert at_restore and at_restore < ref
    assert restored == ref


def test_a_checkpoint_without_filter_state_restores_and_counts_kept_otherwise_are_refused(
        tmp_path):
    """A checkpoint of the table before it had a filter (no "admission"
    object) restores its rows and leaves the counts as they are; counts of
    a count-min sketch do not restore into exact counts per key (nor the
    reverse), refused naming the table."""
    keys = tf.constant([5, 6], tf.int64)
    plain = sok.DynamicVariable(DIM, name="t", initializer="ones")
    plain.sparse_read(keys)
    path = tf.train.Checkpoint(t=plain).save(str(tmp_path / "plain"))
    filtered = sok.DynamicVariable(DIM, name="t", initializer="ones", min_count=2)
    filtered.sparse_read(tf.constant([9], tf.int64))
    tf.train.Checkpoint(t=filtered).restore(path)
    assert held_keys(filtered) == {5, 6}
    assert _counts(filtered) == {9: 1}

    sketch = sok.DynamicVariable(DIM, name="s", initializer="ones", min_count=3,
                                 min_count_counters=64)
    sketch.sparse_read(keys)
    path = tf.train.Checkpoint(t=sketch).save(str(tmp_path / "sketch"))
    exact = sok.DynamicVariable(DIM, name="s", initializer="ones", min_count=3)
    with pytest.raises(ValueError, match=r"admission counts of DynamicVariable 's' were kept "
                                         r"as .*sketch.*its filter keeps them as .*keys"):
        tf.train.Checkpoint(t=exact).restore(path)
