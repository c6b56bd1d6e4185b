"""The streaming Parquet reader against pyarrow's own full read."""

import importlib.util
import os
import re

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("pyarrow") is None,
                                reason="needs pyarrow (scripts/setup_env.sh installs it)")


@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    from sok_graph.data import synthetic

    path = str(tmp_path_factory.mktemp("data") / "criteo.parquet")
    synthetic.write_criteo_parquet(path, num_rows=10000, num_tables=3, num_dense=2,
                                   vocab_size=500, row_group_size=1500, seed=3)
    return path


def reference(path):
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    rows = []
    for i in range(table.num_rows):
        rows.append((tuple(tuple(table.column(f"C{t}")[i].as_py()) for t in (1, 2, 3)),
                     (table.column("I1")[i].as_py(), table.column("I2")[i].as_py()),
                     table.column("label")[i].as_py()))
    return rows


def rows_of(batches):
    rows = []
    for b in batches:
        n = len(b["label"])
        for i in range(n):
            ids = tuple(tuple(b[c][b[c + "_splits"][i]:b[c + "_splits"][i + 1]].tolist())
                        for c in ("C1", "C2", "C3"))
            rows.append((ids, tuple(float(x) for x in b["dense"][i]), float(b["label"][i])))
    return rows


def reader(path, **kw):
    from sok_graph.data.parquet import ParquetReader

    return ParquetReader(path, kw.pop("batch_size", 1024), ["C1", "C2", "C3"], ["I1", "I2"],
                         **kw)


def test_reads_every_row_in_order(criteo):
    batches = list(reader(criteo))
    assert [len(b["label"]) for b in batches] == [1024] * 9 + [784]
    for b in batches:
        for c in ("C1", "C2", "C3"):
            s = b[c + "_splits"]
            assert s[0] == 0 and s[-1] == len(b[c]) and (np.diff(s) >= 1).all()
    assert rows_of(batches) == reference(criteo)


@pytest.mark.parametrize("world_size", [2, 3])
def test_workers_read_disjoint_parts_that_cover_the_file(criteo, world_size):
    # even_batches=False: every row, in unequal numbers of batches.
    parts = [rows_of(reader(criteo, rank=r, world_size=world_size, shuffle=True, seed=5,
                            even_batches=False))
             for r in range(world_size)]
    merged = sorted(row for part in parts for row in part)
    assert merged == sorted(reference(criteo))
    assert all(len(p) > 0 for p in parts)


def test_shuffle_changes_order_per_epoch_not_content(criteo):
    r = reader(criteo, shuffle=True, seed=1, drop_remainder=False)
    first, second = rows_of(r), rows_of(r)
    assert first != second and sorted(first) == sorted(second) == sorted(reference(criteo))


def test_drop_remainder(criteo):
    assert [len(b["label"]) for b in reader(criteo, drop_remainder=True)] == [1024] * 9


def test_tf_data_dataset_matches_iterator(criteo):
    import tensorflow as tf

    ds = reader(criteo, batch_size=4096).dataset()
    batches = list(ds)
    assert isinstance(batches[0]["C1"], tf.RaggedTensor)
    got = np.concatenate([b["C2"].flat_values.numpy() for b in batches])
    want = np.concatenate([b["C2"] for b in reader(criteo, batch_size=4096)])
    np.testing.assert_array_equal(got, want)


def as_numpy(batch):
    """A dataset batch in the iterator's structure, as numpy arrays."""
    import tensorflow as tf

    out = {}
    for key, value in batch.items():
        if isinstance(value, tf.RaggedTensor):
            out[key] = value.flat_values.numpy()
            out[key + "_splits"] = value.row_splits.numpy()
        else:
            out[key] = value.numpy()
    return out


@pytest.mark.parametrize("ragged", [True, False])
def test_tf_data_yields_every_row_of_the_file(criteo, ragged):
    """Batch 1000 over row groups of 1500 rows: most batches straddle two
    row groups or start inside one. Every column, row by row, against
    pyarrow's own read; the structure and dtypes against the iterator's."""
    import tensorflow as tf

    batches = list(reader(criteo, batch_size=1000).dataset(ragged=ragged))
    assert isinstance(batches[0]["C1"], tf.RaggedTensor) == ragged
    got = [as_numpy(b) for b in batches]
    assert rows_of(got) == reference(criteo)
    want = list(reader(criteo, batch_size=1000))
    assert len(got) == len(want) == 10
    for g, w in zip(got, want):
        assert sorted(g) == sorted(w)
        for key in w:
            assert g[key].dtype == w[key].dtype and g[key].shape == w[key].shape, key


def test_tf_data_epochs_follow_the_shuffle(criteo):
    """Each pass over the dataset is a new epoch in a new order."""
    ds = reader(criteo, shuffle=True, seed=4).dataset(ragged=False)
    first = rows_of([as_numpy(b) for b in ds])
    second = rows_of([as_numpy(b) for b in ds])
    assert first != second and sorted(first) == sorted(second) == sorted(reference(criteo))


def test_stopping_early_stops_the_reading_threads(criteo):
    import threading
    import time

    before = threading.active_count()
    it = iter(reader(criteo, batch_size=100, prefetch=1))
    next(it)
    assert threading.active_count() > before  # reading ahead
    it.close()
    deadline = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == before


def test_read_errors_reach_the_consumer(tmp_path):
    from sok_graph.data import synthetic

    path = str(tmp_path / "gone.parquet")
    synthetic.write_criteo_parquet(path, num_rows=3000, num_tables=3, num_dense=2,
                                   vocab_size=50, row_group_size=1000, seed=1)
    r = reader(path)
    with open(path, "r+b") as f:  # damage the data after the reader read the footer
        f.seek(4)
        f.write(b"\xff" * 4096)
    with pytest.raises(OSError):
        list(r)


def test_bad_arguments(criteo):
    from sok_graph.data.parquet import ParquetReader

    with pytest.raises(ValueError, match="column 'C9' is not in"):
        ParquetReader(criteo, 10, ["C9"])
    with pytest.raises(ValueError, match="rank must be in"):
        ParquetReader(criteo, 10, ["C1"], rank=2, world_size=2)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        ParquetReader(criteo, 0, ["C1"])
    with pytest.raises(TypeError, match="ragged must be True or False; got 'no'"):
        ParquetReader(criteo, 10, ["C1"]).dataset(ragged="no")


def _write(path, columns, row_group_size):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)


def test_other_column_types_nulls_and_batches_inside_row_groups(tmp_path):
    """int32 / uint64 id lists, float64 / int / nullable dense columns, and
    batches that start inside a row group (offsets that do not start at 0)."""
    import pyarrow as pa

    from sok_graph.data.parquet import ParquetReader

    rng = np.random.default_rng(5)
    n = 700
    ids32 = [list(rng.integers(0, 100, rng.integers(0, 4))) for _ in range(n)]
    ids64 = [list(rng.integers(0, 2 ** 40, rng.integers(1, 3))) for _ in range(n)]
    f64 = rng.standard_normal(n)
    nullable = [None if i % 7 == 0 else float(i) for i in range(n)]
    ints = rng.integers(-50, 50, n)
    path = str(tmp_path / "types.parquet")
    _write(path, {"a": pa.array(ids32, pa.list_(pa.int32())),
                  "b": pa.array(ids64, pa.list_(pa.uint64())),
                  "f64": pa.array(f64), "nullable": pa.array(nullable, pa.float32()),
                  "ints": pa.array(ints), "label": pa.array(np.arange(n, dtype=np.float32))},
           row_group_size=256)
    got = list(ParquetReader(path, 97, ["a", "b"], ["f64", "nullable", "ints"]))
    assert sum(len(b["label"]) for b in got) == n
    start = 0
    for b in got:
        m = len(b["label"])
        for col, ref in (("a", ids32), ("b", ids64)):
            assert b[col].dtype == np.int64 and b[col + "_splits"].dtype == np.int64
            s = b[col + "_splits"]
            assert [b[col][s[i]:s[i + 1]].tolist() for i in range(m)] == \
                [[int(x) for x in r] for r in ref[start:start + m]]
        expected = np.stack([f64[start:start + m],
                             [np.nan if x is None else x for x in nullable[start:start + m]],
                             ints[start:start + m]], axis=1).astype(np.float32)
        assert b["dense"].dtype == np.float32 and b["dense"].flags.c_contiguous
        np.testing.assert_array_equal(b["dense"], expected)
        np.testing.assert_array_equal(b["label"], np.arange(start, start + m))
        start += m


@pytest.mark.parametrize("values, words", [
    ([[1, None], [2]], "holds null ids"),
    ([[1.5], [2.0]], "must hold lists of integer ids"),
])
def test_bad_id_values_are_clear_errors(tmp_path, values, words):
    import pyarrow as pa

    from sok_graph.data.parquet import ParquetReader

    path = str(tmp_path / "bad.parquet")
    _write(path, {"a": pa.array(values), "label": pa.array([0.0, 1.0], pa.float32())}, 10)
    with pytest.raises(ValueError, match=f"column 'a' {words}"):
        list(ParquetReader(path, 2, ["a"]))


@pytest.mark.parametrize("label, kind", [
    ([0.0, None, 1.0, 1.0], "float32"), ([0.0, float("nan"), 1.0, 1.0], "float32"),
    ([0.0, float("inf"), 1.0, 1.0], "float32"), ([0.0, 1e300, 1.0, 1.0], "float64"),
    ([False, None, True, True], "bool_"), ([0, None, 1, 1], "int64")])
def test_a_missing_or_infinite_label_is_a_clear_error(tmp_path, label, kind):
    """It came out as NaN or inf (a bool column's null as numpy's TypeError),
    and the loss and every weight trained on it became NaN; a dense
    column's null stays NaN (a missing feature)."""
    import pyarrow as pa

    from sok_graph.data.parquet import ParquetReader

    path = str(tmp_path / "labels.parquet")
    _write(path, {"a": pa.array([[1], [2], [3], [4]]),
                  "label": pa.array(label, getattr(pa, kind)())}, 10)
    # 1e300 is finite: it is refused for float32's range, not as infinite.
    what = "beyond float32's range" if label[1] == 1e300 else "a null, NaN or infinite label"
    with pytest.raises(ValueError, match=r"label column 'label' holds .*, " + what +
                                         r" \(row 1 of a batch of 2"):
        list(ParquetReader(path, 2, ["a"]))
    good = str(tmp_path / "good.parquet")
    labels = [True, False] if kind == "bool_" else [1, 0]
    _write(good, {"a": pa.array([[1], [2]]), "label": pa.array(labels, getattr(pa, kind)())}, 10)
    np.testing.assert_array_equal(next(iter(ParquetReader(good, 2, ["a"])))["label"], [1, 0])


@pytest.mark.parametrize("case", ["dense_strings", "dense_lists", "label_strings",
                                  "ragged_not_lists"])
def test_columns_of_the_wrong_type_are_named_before_reading(tmp_path, case):
    """A dense or label column of strings or lists, or a ragged column of
    plain numbers, failed mid-epoch with numpy's "could not convert string
    to float" / "setting an array element with a sequence" or "'Int64Array'
    object has no attribute 'offsets'", naming no column. The reader now
    refuses it when made, naming the column, the file and its type."""
    import pyarrow as pa

    from sok_graph.data.parquet import ParquetReader

    path = str(tmp_path / "t.parquet")
    cols = {"ids": pa.array([[1, 2], [3]]), "plain": pa.array([4, 5]),
            "s": pa.array(["x", "y"]), "label": pa.array([0.0, 1.0])}
    args, words = {
        "dense_strings": ((["ids"], ["s"]), "column 's' must hold numbers (a dense column)"),
        "dense_lists": ((["ids"], ["ids"]), "column 'ids' must hold numbers (a dense column)"),
        "label_strings": ((["ids"], [], "s"), "column 's' must hold numbers (the label column)"),
        "ragged_not_lists": ((["plain"],), "column 'plain' must hold lists of integer ids"),
    }[case]
    _write(path, cols, 10)
    with pytest.raises(ValueError, match=re.escape(words) + r".* in .*t\.parquet it is"):
        ParquetReader(path, 2, *args)


def test_outputs_that_would_share_a_key_are_refused(tmp_path):
    """A ragged column named 'label' or 'dense', or ragged columns 'x' and
    'x_splits', had their values replaced in every batch by the label, the
    dense matrix or the other column's row_splits, without an error."""
    import pyarrow as pa

    from sok_graph.data.parquet import ParquetReader

    path = str(tmp_path / "t.parquet")
    _write(path, {"label": pa.array([[1, 2], [3]]), "dense": pa.array([[4], [5, 6]]),
                  "x": pa.array([[7], [8]]), "x_splits": pa.array([[9], [10]]),
                  "y": pa.array([1.0, 2.0]), "target": pa.array([0.0, 1.0])}, 10)
    with pytest.raises(ValueError, match="ragged column 'label' and label column 'label'"):
        ParquetReader(path, 2, ["label"])
    with pytest.raises(ValueError, match="ragged column 'dense' and the dense columns"):
        ParquetReader(path, 2, ["dense"], ["y"], label_column="target")
    with pytest.raises(ValueError, match="'x_splits'"):
        ParquetReader(path, 2, ["x", "x_splits"], label_column="target")
    # Each alone reads as written (plain lists, not the other outputs).
    got = list(ParquetReader(path, 2, ["dense", "x"], label_column="target"))[0]
    assert got["dense"].tolist() == [4, 5, 6] and got["dense_splits"].tolist() == [0, 1, 3]
    assert got["x"].tolist() == [7, 8]


def test_bad_reader_arguments_name_themselves(tmp_path, criteo):
    """Float ranks or world sizes failed at the first batch ("slice indices
    must be integers"), a str seed in numpy, a str prefetch in int(); a
    zero-byte file or a directory got pyarrow's message without the path;
    one ragged column given as a string was split into letters."""
    from sok_graph.data.parquet import ParquetReader

    cases = [(dict(rank=0.5, world_size=2), r"rank must be in \[0, world_size=2\), an integer"),
             (dict(world_size=1.5), "world_size must be a positive integer"),
             (dict(seed="x", shuffle=True), "seed must be a non-negative integer"),
             (dict(prefetch="x"), "prefetch must be an integer"),
             (dict(prefetch=0), r"prefetch must be an integer in \[1, 1024\]"),
             (dict(prefetch=-5), r"prefetch must be an integer in \[1, 1024\]"),
             (dict(prefetch=10 ** 12), r"prefetch must be an integer in \[1, 1024\]"),
             (dict(shuffle="no"), "shuffle must be True or False")]
    for kwargs, words in cases:
        with pytest.raises((TypeError, ValueError), match=words):
            ParquetReader(criteo, 10, ["C1"], **kwargs)
    empty = tmp_path / "empty.parquet"
    empty.write_bytes(b"")
    with pytest.raises(Exception, match=r"empty\.parquet: not a readable Parquet file"):
        ParquetReader(str(empty), 10, ["C1"])
    with pytest.raises(OSError, match=f"{tmp_path}: not a readable Parquet file"):
        ParquetReader(str(tmp_path), 10, ["C1"])
    one = next(iter(ParquetReader(criteo, 10, "C1")))
    assert set(one) == {"C1", "C1_splits", "label"}
    # A file named twice, or by another spelling of its path: each of its
    # rows was read twice an epoch.
    other = os.path.join(os.path.dirname(criteo), "..",
                         os.path.basename(os.path.dirname(criteo)), os.path.basename(criteo))
    # And through a hard link, which no spelling of the path tells.
    linked = str(tmp_path / "linked.parquet")
    os.link(criteo, linked)
    for files in ([criteo, criteo], [criteo, other], [criteo, linked]):
        with pytest.raises(ValueError, match=r"files\[1\] .* is the file files\[0\] .* "
                                             r"names too"):
            ParquetReader(files, 10, ["C1"])


def test_files_whose_column_types_differ_read_as_one(tmp_path):
    """Two files of one data set, int32 ids and double labels in one, int64
    ids and float labels in the other: a batch spanning both failed with
    pyarrow's "Schema at index 1 was different"."""
    import pyarrow as pa

    from sok_graph.data.parquet import ParquetReader

    a, b = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    _write(a, {"ids": pa.array([[1, 2], [3]], pa.list_(pa.int32())),
               "x": pa.array([1, 2], pa.int64()), "label": pa.array([0.5, 1.5])}, 10)
    _write(b, {"ids": pa.array([[2 ** 40], []], pa.list_(pa.int64())),
               "x": pa.array([3.5, 4.5], pa.float32()),
               "label": pa.array([2.5, 3.5], pa.float32())}, 10)
    got = list(ParquetReader([a, b], 3, ["ids"], ["x"]))
    assert got[0]["ids"].tolist() == [1, 2, 3, 2 ** 40]
    assert got[0]["ids_splits"].tolist() == [0, 2, 3, 4]
    assert got[0]["dense"].tolist() == [[1.0], [2.0], [3.5]]
    assert got[0]["label"].tolist() == [0.5, 1.5, 2.5]
    assert got[1]["ids"].tolist() == [] and got[1]["ids_splits"].tolist() == [0, 0]
    assert got[1]["dense"].tolist() == [[4.5]] and got[1]["label"].tolist() == [3.5]


def test_more_workers_than_row_groups_is_refused(tmp_path):
    """Workers read whole row groups: with 3 row groups and 4 workers worker
    3 got no batch at all (a synchronous job then waits for it forever).
    Refused when the reader is made, naming both counts; an empty file for
    one worker still reads as no batch."""
    import pyarrow as pa

    from sok_graph.data.parquet import ParquetReader

    path = str(tmp_path / "three.parquet")
    _write(path, {"ids": pa.array([[i] for i in range(6)]),
                  "label": pa.array([float(i) for i in range(6)])}, 2)
    got = [list(ParquetReader(path, 2, ["ids"], rank=r, world_size=3)) for r in range(3)]
    assert [[b["ids"].tolist() for b in part] for part in got] == [[[0, 1]], [[2, 3]], [[4, 5]]]
    with pytest.raises(ValueError, match=r"3 row group\(s\) with rows, fewer than world_size=4: workers "
                                         r"3\.\.3 would read nothing"):
        ParquetReader(path, 2, ["ids"], rank=0, world_size=4)
    empty = str(tmp_path / "empty.parquet")
    _write(empty, {"ids": pa.array([], pa.list_(pa.int64())), "label": pa.array([], pa.float64())},
           2)
    assert list(ParquetReader(empty, 2, ["ids"])) == []


def _unequal_shares(tmp_path):
    """Files whose 4 row groups give 3 workers 4, 2 and 2 rows: ids 0..7,
    labels 0.0..7.0, row groups [0, 1], [2, 3], [4, 5] (a.parquet) and
    [6, 7] (b.parquet); worker 0 reads [0, 1] and [6, 7]."""
    import pyarrow as pa

    a, b = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    _write(a, {"ids": pa.array([[i] for i in range(6)]),
               "label": pa.array([float(i) for i in range(6)])}, 2)
    _write(b, {"ids": pa.array([[6], [7]]), "label": pa.array([6.0, 7.0])}, 2)
    return [a, b]


def test_workers_yield_equal_batch_counts(tmp_path):
    """Workers whose row groups hold unequal numbers of rows got unequal
    numbers of batches: in a training loop the one that ran out stopped
    calling the collectives, and the others waited in one forever. Every
    worker now yields the fewest any worker makes; batch_counts says how
    many each makes."""
    import threading

    from sok_graph.data.parquet import ParquetReader

    files = _unequal_shares(tmp_path)

    def ids(rank, batch_size, **kw):
        return [b["ids"].tolist() for b in ParquetReader(files, batch_size, ["ids"], rank=rank,
                                                         world_size=3, **kw)]

    assert [ids(r, 1) for r in range(3)] == [[[0], [1]], [[2], [3]], [[4], [5]]]
    assert [ids(r, 3) for r in range(3)] == [[[0, 1, 6]], [[2, 3]], [[4, 5]]]
    # Workers 1 and 2 make no whole batch of 3: nobody yields one.
    assert [ids(r, 3, drop_remainder=True) for r in range(3)] == [[], [], []]
    assert ParquetReader(files, 1, ["ids"], rank=1, world_size=3).batch_counts() == [4, 2, 2]
    assert ParquetReader(files, 3, ["ids"], rank=1, world_size=3).batch_counts(0) == [2, 1, 1]
    assert ParquetReader(files, 3, ["ids"], rank=1, world_size=3,
                         drop_remainder=True).batch_counts() == [1, 0, 0]
    # even_batches=False: every row, in unequal numbers of batches.
    assert [ids(r, 1, even_batches=False) for r in range(3)] == [
        [[0], [1], [6], [7]], [[2], [3]], [[4], [5]]]
    # One label array per batch, as the iterator's: the cut is the same.
    labels = ParquetReader(files, 1, ["ids"], rank=0, world_size=3)
    assert [b["label"].tolist() for b in labels] == [[0.0], [1.0]]

    # Three workers, a barrier per batch standing for a collective: each
    # reaches it as often as the others, and none is left waiting.
    barrier = threading.Barrier(3, timeout=20)
    errors = []

    def train(rank):
        try:
            for _ in ParquetReader(files, 1, ["ids"], rank=rank, world_size=3, shuffle=True,
                                   seed=rank):
                barrier.wait()
        except threading.BrokenBarrierError as e:
            errors.append((rank, e))
            barrier.abort()

    threads = [threading.Thread(target=train, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)


def test_equal_batch_counts_with_shuffle_and_each_workers_own_seed(tmp_path):
    """With shuffle=True each worker shuffles its own row groups per epoch;
    the count is the smallest share, the same on every worker, whatever
    seed each was given; the worker with more rows leaves other rows
    unread from one epoch to the next."""
    from sok_graph.data.parquet import ParquetReader

    files = _unequal_shares(tmp_path)
    readers = [ParquetReader(files, 1, ["ids"], rank=r, world_size=3, shuffle=True, seed=r)
               for r in range(3)]
    first_worker = set()
    for epoch in range(6):
        got = [sorted(i for b in reader for i in b["ids"].tolist()) for reader in readers]
        assert [len(g) for g in got] == [2, 2, 2], (epoch, got)
        assert len(set(i for g in got for i in g)) == 6
        first_worker.update(got[0])
    assert first_worker == {0, 1, 6, 7}


def _write_row_groups(path, groups):
    """One file whose row groups hold the ids of `groups` (lists of ids; an
    empty list is a row group without rows), each row [id], label id."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("ids", pa.list_(pa.int64())), ("label", pa.float64())])
    with pq.ParquetWriter(path, schema) as writer:
        for ids in groups:
            writer.write_table(pa.table({"ids": pa.array([[i] for i in ids], pa.list_(pa.int64())),
                                         "label": pa.array([float(i) for i in ids], pa.float64())},
                                        schema=schema))


def test_workers_given_their_own_seeds_read_every_row_once(tmp_path):
    """Each worker passing its own seed (tf.data's habit: shard, then shuffle
    with the worker's seed) made the workers deal differently shuffled lists:
    two of them read row groups 0 and 3, none read 2 and 4, and their
    batch counts for even_batches could differ. The dealing no longer
    depends on the seed."""
    from sok_graph.data.parquet import ParquetReader

    path = str(tmp_path / "seven.parquet")
    _write_row_groups(path, [[i] for i in range(7)])
    for world in (2, 3):
        readers = [ParquetReader(path, 1, ["ids"], rank=r, world_size=world, shuffle=True,
                                 seed=r, even_batches=False) for r in range(world)]
        for epoch in range(3):
            got = [i for reader in readers for b in reader for i in b["ids"].tolist()]
            assert sorted(got) == list(range(7)), (world, epoch, got)
        counts = {tuple(ParquetReader(path, 1, ["ids"], rank=r, world_size=world, shuffle=True,
                                      seed=10 * r).batch_counts(e))
                  for r in range(world) for e in range(3)}
        assert len(counts) == 1, counts


def test_row_groups_without_rows_are_no_workers_share(tmp_path):
    """A row group (or a file) without rows was dealt as a share: with row
    groups of [0, 3, 0, 5, 0] rows over two workers each worker's share was
    counted as 0 or 8 rows, and with even_batches both workers read
    nothing, without an error."""
    from sok_graph.data.parquet import ParquetReader

    path = str(tmp_path / "gaps.parquet")
    _write_row_groups(path, [[], [0, 1, 2], [], [3, 4, 5, 6, 7], []])
    readers = [ParquetReader(path, 1, ["ids"], rank=r, world_size=2) for r in range(2)]
    assert readers[0].batch_counts() == [3, 5]
    got = [[i for b in reader for i in b["ids"].tolist()] for reader in readers]
    assert got == [[0, 1, 2], [3, 4, 5]]
    # An empty file beside one with a single row group: one share for two
    # workers, refused as any such data set is.
    empty = str(tmp_path / "empty.parquet")
    _write_row_groups(empty, [[]])
    one = str(tmp_path / "one.parquet")
    _write_row_groups(one, [[0, 1, 2, 3]])
    with pytest.raises(ValueError, match=r"1 row group\(s\) with rows, fewer than world_size=2"):
        ParquetReader([empty, one], 2, ["ids"], rank=0, world_size=2)


def test_a_file_changed_after_the_reader_was_made_is_refused(tmp_path):
    """The batch counts come from the files' metadata when the reader is
    made: a file rewritten with other row groups gave workers unequal
    numbers of batches (a collective then waits forever)."""
    from sok_graph.data.parquet import ParquetReader

    path = str(tmp_path / "moving.parquet")
    _write_row_groups(path, [[0, 1], [2, 3], [4, 5], [6, 7]])
    reader = ParquetReader(path, 1, ["ids"], rank=0, world_size=2)
    _write_row_groups(path, [[0, 1], [2], [3, 4], [5]])
    with pytest.raises(RuntimeError, match=re.escape(f"{path} changed after the reader was "
                                                     f"made: its row groups hold [2, 1, 2, 1] "
                                                     f"rows, where the reader counted "
                                                     f"[2, 2, 2, 2]")):
        list(reader)


def test_many_files_read_with_few_file_descriptors(tmp_path):
    """Every file of an epoch stayed open to the epoch's end: 300 files
    under a limit of 200 open files failed mid-epoch with "Too many open
    files". A file is closed after its last row group of the epoch."""
    import os
    import subprocess
    import sys

    script = f"""
import os, resource, sys
import pyarrow as pa, pyarrow.parquet as pq
sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
from sok_graph.data.parquet import ParquetReader
files = []
for i in range(300):
    path = os.path.join({str(tmp_path)!r}, f"part{{i:03d}}.parquet")
    pq.write_table(pa.table({{"ids": pa.array([[i]]), "label": pa.array([1.0])}}), path)
    files.append(path)
resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))
ids = [i for b in ParquetReader(files, 7, ["ids"], shuffle=True) for i in b["ids"].tolist()]
assert sorted(ids) == list(range(300)), ids
print("read", len(ids))
"""
    out = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=300)
    assert out.returncode == 0 and "read 300" in out.stdout, out.stdout[-3000:]


def test_values_the_batch_cannot_hold_are_refused(tmp_path):
    """A uint64 id of 2**63 or more became a negative int64 id, and a dense
    value beyond float32's range became infinite, both without an error;
    duplicate column names gave pyarrow's "Column a does not exist"."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sok_graph.data.parquet import ParquetReader

    path = str(tmp_path / "u64.parquet")
    pq.write_table(pa.table({"ids": pa.array([[1], [2 ** 64 - 1]], pa.list_(pa.uint64())),
                             "label": pa.array([0.0, 1.0])}), path)
    with pytest.raises(ValueError, match=re.escape(f"column 'ids' holds the id {2 ** 64 - 1}, "
                                                   f"beyond int64")):
        list(ParquetReader(path, 2, ["ids"]))
    fine = str(tmp_path / "u63.parquet")
    pq.write_table(pa.table({"ids": pa.array([[1], [2 ** 63 - 1]], pa.list_(pa.uint64())),
                             "label": pa.array([0.0, 1.0])}), fine)
    assert [b["ids"].tolist() for b in ParquetReader(fine, 2, ["ids"])] == [[1, 2 ** 63 - 1]]
    # The same id in a batch spanning a file of int32 ids: the columns cast
    # to one type wrapped it around to a negative id.
    small = str(tmp_path / "i32.parquet")
    pq.write_table(pa.table({"ids": pa.array([[1, 2], [3]], pa.list_(pa.int32())),
                             "label": pa.array([0.0, 1.0])}), small)
    with pytest.raises(ValueError, match=re.escape(f"column 'ids' holds the id {2 ** 64 - 1}, "
                                                   f"beyond int64")):
        list(ParquetReader([small, path], 3, ["ids"]))
    assert [b["ids"].tolist() for b in ParquetReader([small, fine], 4, ["ids"])] == \
        [[1, 2, 3, 1, 2 ** 63 - 1]]

    path = str(tmp_path / "big.parquet")
    pq.write_table(pa.table({"ids": pa.array([[1], [2]]), "x": pa.array([1.5, 1e300]),
                             "label": pa.array([0.0, 1.0])}), path)
    with pytest.raises(ValueError, match=r"dense column 'x' holds 1e\+300 \(row 1 of a batch "
                                         r"of 2\), beyond float32's range"):
        list(ParquetReader(path, 2, ["ids"], dense_columns=["x"]))
    # An infinite value in the file stays what it is.
    inf = str(tmp_path / "inf.parquet")
    pq.write_table(pa.table({"ids": pa.array([[1], [2]]), "x": pa.array([1.5, float("inf")]),
                             "label": pa.array([0.0, 1.0])}), inf)
    dense = next(iter(ParquetReader(inf, 2, ["ids"], dense_columns=["x"])))["dense"]
    assert dense[:, 0].tolist() == [1.5, float("inf")]

    path = str(tmp_path / "twice.parquet")
    pq.write_table(pa.Table.from_arrays([pa.array([[1]]), pa.array([[2]]), pa.array([0.0])],
                                        names=["ids", "ids", "label"]), path)
    with pytest.raises(ValueError, match=re.escape(f"{path} has 2 columns named 'ids'")):
        ParquetReader(path, 1, ["ids"])


def test_arguments_of_the_wrong_kind_are_named(tmp_path):
    from sok_graph.data.parquet import ParquetReader

    path = str(tmp_path / "one.parquet")
    _write_row_groups(path, [[0, 1]])
    with pytest.raises(ValueError, match="files must name at least one Parquet file"):
        ParquetReader((f for f in []), 1, ["ids"])
    with pytest.raises(TypeError, match="files must be a path or a list of paths of Parquet "
                                        "files; got 5"):
        ParquetReader(5, 1, ["ids"])
    for bad in (None, 5, b"ids"):
        with pytest.raises(TypeError, match="ragged_columns must be a column name or a list of "
                                            "column names; got " + re.escape(repr(bad))):
            ParquetReader(path, 1, bad)
    with pytest.raises(TypeError, match="dense_columns must be a column name or a list of "
                                        "column names; got b'label'"):
        ParquetReader(path, 1, ["ids"], dense_columns=b"label")


def test_batch_counts_refuses_a_bad_epoch(tmp_path):
    from sok_graph.data.parquet import ParquetReader

    r = ParquetReader(_unequal_shares(tmp_path), 1, ["ids"])
    assert r.batch_counts() == [8]
    for bad in (-1, 1.5, "1", True):
        with pytest.raises(ValueError, match="epoch must be a non-negative integer; got "
                                             + re.escape(repr(bad))):
            r.batch_counts(bad)
    with pytest.raises(TypeError, match="even_batches must be True or False; got 'yes'"):
        ParquetReader(_unequal_shares(tmp_path), 1, ["ids"], even_batches="yes")


def test_a_reader_of_no_column_is_refused(tmp_path):
    """No ragged, dense or label column: iterating gave no batch of a file
    of rows, and dataset() failed inside TensorFlow naming no argument."""
    import pyarrow as pa

    from sok_graph.data.parquet import ParquetReader

    path = str(tmp_path / "rows.parquet")
    _write(path, {"a": pa.array([[1], [2], [3]]), "label": pa.array([0.0, 1.0, 0.0])}, 10)
    with pytest.raises(ValueError, match="ragged_columns, dense_columns and label_column name "
                                         "no column: a batch needs at least one"):
        ParquetReader(path, 2, [], label_column=None)
    assert len(list(ParquetReader(path, 2, [], label_column="label"))) == 2


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_multi_worker_strategy_does_not_shard_a_workers_part_again(criteo, world_size):
    """Each worker's reader.dataset() through the sharding a
    MultiWorkerMirroredStrategy's experimental_distribute_dataset applies
    to a dataset (tf.data's auto-sharding, default policy): the reader's
    part was sharded again, so the workers read 1/world_size of the file
    between them and their batch counts differed, without an error. Now
    every row is read once an epoch, in equal batch counts, as pyarrow
    reads the file (less what even_batches leaves out)."""
    import tensorflow as tf

    try:
        from tensorflow.python.distribute import input_ops
    except ImportError:
        pytest.skip("TensorFlow without tf.distribute's input sharding")
    if not hasattr(tf.data.experimental, "AutoShardPolicy"):
        pytest.skip("TensorFlow 1.x's tf.data has no auto-sharding of datasets")
    rows, counts = [], []
    for rank in range(world_size):
        part = reader(criteo, batch_size=700, rank=rank, world_size=world_size,
                      even_batches=True)
        try:
            sharded = input_ops.auto_shard_dataset(part.dataset(ragged=False), world_size, rank,
                                                   world_size)
        except TypeError:  # TensorFlow before 2.7: no num_replicas_in_sync
            sharded = input_ops.auto_shard_dataset(part.dataset(ragged=False), world_size, rank)
        batches = [as_numpy(b) for b in sharded]
        counts.append(len(batches))
        assert rows_of(batches) == rows_of(part), rank  # its own part, whole
        rows += rows_of(batches)
    assert len(set(counts)) == 1, counts
    # even_batches leaves out the rows past the workers' equal batch counts
    # (the reader's documented behaviour): no row twice, none made up.
    assert len(set(rows)) == len(rows) and set(rows) <= set(reference(criteo))
    assert len(rows) > len(reference(criteo)) - world_size * 700
