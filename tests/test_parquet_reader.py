"""The streaming Parquet reader against pyarrow's own full read."""

import importlib.util

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
    parts = [rows_of(reader(criteo, rank=r, world_size=world_size, shuffle=True, seed=5))
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
