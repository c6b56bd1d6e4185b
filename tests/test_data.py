"""Data helpers: AUC against a brute-force count, MovieLens conversion."""

import importlib.util
import os
import re

import numpy as np
import pytest

from sok_graph.data import metrics


def brute_force_auc(labels, scores):
    pos = [s for s, y in zip(scores, labels) if y > 0.5]
    neg = [s for s, y in zip(scores, labels) if y <= 0.5]
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def test_auc_matches_pairwise_count(rng):
    for _ in range(5):
        labels = rng.integers(0, 2, size=200)
        scores = np.round(rng.standard_normal(200), 1)  # many ties
        assert metrics.auc(labels, scores) == pytest.approx(brute_force_auc(labels, scores))
    assert np.isnan(metrics.auc([1, 1], [0.2, 0.3]))
    assert metrics.auc([0, 1], [0.1, 0.9]) == 1.0


def test_auc_of_a_column_of_scores_and_of_nans(rng):
    """A model's scores as a column [n, 1] were sorted along their last
    axis: AUCs such as -0.63. NaN scores (a diverged model's) gave 1.0 and
    NaN labels counted as negatives; labels and scores of two lengths failed
    with numpy's "boolean index did not match". Columns are taken as their
    values; the others are ValueErrors naming the argument."""
    labels = rng.integers(0, 2, size=100)
    scores = np.round(rng.standard_normal(100), 1)
    want = brute_force_auc(labels, scores)
    assert metrics.auc(labels, scores[:, None]) == pytest.approx(want)
    assert metrics.auc(labels[:, None], scores[:, None]) == pytest.approx(want)
    with pytest.raises(ValueError, match=r"scores hold 2 NaN\(s\), the first at position 0"):
        metrics.auc([0, 1], [np.nan, np.nan])
    with pytest.raises(ValueError, match=r"labels hold 1 NaN\(s\), the first at position 1"):
        metrics.auc([0, np.nan, 1], [0.1, 0.5, 0.9])
    with pytest.raises(ValueError, match="got 3 labels and 2 scores"):
        metrics.auc([0, 1, 1], [0.1, 0.5])
    with pytest.raises(ValueError, match=r"scores must be 1-D .*got shape \(2, 2\)"):
        metrics.auc([0, 1], [[0.1, 0.2], [0.3, 0.4]])
    # Infinite scores order as numbers.
    assert metrics.auc([0, 1, 0], [-np.inf, np.inf, 0.0]) == 1.0


@pytest.mark.skipif((importlib.util.find_spec("recbole") is None or
                     importlib.util.find_spec("pyarrow") is None)
                    and not os.environ.get("SOK_GRAPH_REQUIRE_MOVIELENS"),
                    reason="needs the recbole wheel and pyarrow (scripts/setup_env.sh installs "
                           "them; CI requires them)")
def test_movielens_parquet_round_trip(tmp_path):
    from sok_graph.data import movielens

    samples, sizes = movielens.load_samples()
    assert len(samples["label"]) == 100000
    assert sizes["user"] == 943 and sizes["item"] == 1682
    assert samples["genres_splits"][-1] == len(samples["genres_values"])
    movielens.write_parquet(samples, str(tmp_path / "ml.parquet"))
    back = movielens.read_parquet(str(tmp_path / "ml.parquet"))
    for key, value in samples.items():
        np.testing.assert_array_equal(back[key], value)
    train, test = movielens.split(samples)
    assert len(train["label"]) == 80000 and len(test["label"]) == 20000


def _tiny_samples():
    """Three MovieLens-shaped samples, written by hand."""
    from sok_graph.data import movielens

    out = {name: np.array([0, 1, 2], np.int64) for name in movielens.CATEGORICAL}
    out["label"] = np.array([1.0, 0.0, 1.0], np.float32)
    out["timestamp"] = np.array([10, 20, 30], np.int64)
    out["genres_values"] = np.array([4, 5, 6, 7], np.int64)
    out["genres_splits"] = np.array([0, 1, 3, 4], np.int64)
    return out


@pytest.mark.skipif(importlib.util.find_spec("pyarrow") is None, reason="needs pyarrow")
@pytest.mark.parametrize("writer", ["movielens", "criteo"])
def test_an_interrupted_parquet_write_leaves_no_half_file(tmp_path, monkeypatch, writer):
    """movielens.write_parquet and synthetic.write_criteo_parquet wrote
    straight to `path`: interrupted, they left a half-written file there,
    which the MovieLens demo (it converts only when the file is missing)
    then read and failed on at every later run. Now the file is written
    under a temporary name and renamed: an interrupted write leaves the
    directory as it was, and a whole write reads back."""
    import pyarrow.parquet as pq

    from sok_graph.data import movielens, synthetic

    path = tmp_path / "data.parquet"

    def write(p):
        if writer == "movielens":
            movielens.write_parquet(_tiny_samples(), p)
        else:
            synthetic.write_criteo_parquet(p, num_rows=30, num_tables=1, num_dense=1,
                                           vocab_size=10, row_group_size=10)

    real = pq.ParquetWriter.write_table
    calls = []

    def interrupted(self, table, *args, **kwargs):
        calls.append(1)
        real(self, table, *args, **kwargs)
        raise KeyboardInterrupt  # Ctrl-C after the first row group

    monkeypatch.setattr(pq.ParquetWriter, "write_table", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write(str(path))
    assert calls and sorted(p.name for p in tmp_path.iterdir()) == []
    # A previous file stays whole when its rewrite is interrupted.
    path.write_bytes(b"previous")
    with pytest.raises(KeyboardInterrupt):
        write(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.parquet"]
    assert path.read_bytes() == b"previous"

    monkeypatch.setattr(pq.ParquetWriter, "write_table", real)
    # A writer killed mid-write (SIGKILL: its cleanup never ran) left its
    # temporary file for good; the next write removes it, and leaves that
    # of a writer still running.
    import subprocess
    import sys

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f".data.parquet.tmp-{gone.pid}-0123abcd"
    live = tmp_path / f".data.parquet.tmp-{os.getpid()}-4567cdef"
    dead.write_bytes(b"half")
    live.write_bytes(b"writing")
    write(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name, "data.parquet"]
    live.unlink()
    table = pq.read_table(str(path))
    if writer == "movielens":
        assert table.column("timestamp").to_pylist() == [10, 20, 30]
        assert table.column("genres").to_pylist() == [[4], [5, 6], [7]]
    else:
        assert table.num_rows == 30 and pq.ParquetFile(str(path)).metadata.num_row_groups == 3


@pytest.mark.skipif(importlib.util.find_spec("pyarrow") is None, reason="needs pyarrow")
def test_parquet_writers_name_bad_arguments(tmp_path):
    """num_rows=0 wrote no file at all and returned as if it had;
    row_group_size=0 failed in range() ("arg 3 must not be zero"); a path
    that is a directory or in a missing one failed inside pyarrow."""
    from sok_graph.data import movielens, synthetic

    path = str(tmp_path / "c.parquet")
    for kwargs, words in ((dict(num_rows=0), "num_rows must be an integer >= 1; got 0"),
                          (dict(num_rows=2.5), "num_rows must be an integer >= 1; got 2.5"),
                          (dict(num_rows=5, row_group_size=0),
                           "row_group_size must be an integer >= 1; got 0"),
                          (dict(num_rows=5, vocab_size=True),
                           "vocab_size must be an integer >= 1; got True")):
        with pytest.raises(ValueError, match=re.escape(words)):
            synthetic.write_criteo_parquet(path, **kwargs)
    with pytest.raises(IsADirectoryError, match=re.escape(
            f"path={str(tmp_path)!r} is a directory; give the path of a file")):
        synthetic.write_criteo_parquet(str(tmp_path), num_rows=5)
    missing = str(tmp_path / "no" / "ml.parquet")
    with pytest.raises(FileNotFoundError, match=re.escape(
            f"path={missing!r}: its directory {str(tmp_path / 'no')!r} does not exist")):
        movielens.write_parquet(_tiny_samples(), missing)
    with pytest.raises(ValueError, match="path must name a file; got an empty string"):
        movielens.write_parquet(_tiny_samples(), "")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_hashed_keys_are_one_to_one_and_refuse_what_is_no_id():
    """splitmix64 masked to 63 bits sent two ids to one key (this pair gave
    18 twice), and floats were truncated (1.0, 1.5 and 1.9 gave one key)."""
    from sok_graph.data.hashed_keys import hashed

    pair = hashed(np.array([1456680767690989848, 2893656578351523145]))
    assert pair[0] != pair[1], pair
    rng = np.random.default_rng(0)
    ids = np.unique(np.concatenate([np.arange(100000),
                                    rng.integers(0, 2 ** 63, size=200000, dtype=np.int64)]))
    keys = hashed(ids)
    assert keys.dtype == np.int64 and keys.min() >= 0
    assert len(np.unique(keys)) == len(ids)
    # Evenly spread: each of 16 ranges of the key space holds about 1/16.
    counts = np.bincount((keys >> 59).astype(np.int64), minlength=16)
    assert counts.min() > 0.9 * len(ids) / 16, counts
    assert hashed([3.0]).tolist() == hashed([3]).tolist()
    for bad, what in (([1.5], "ids must be whole numbers; got 1.5"),
                      ([float("nan")], "ids must be whole numbers; got nan"),
                      ([-1], r"ids must be in \[0, 2\*\*63\); got -1"),
                      (np.array([2 ** 63], np.uint64), r"ids must be in \[0, 2\*\*63\)")):
        with pytest.raises(ValueError, match=what):
            hashed(bad)


def test_draw_ids_refuses_what_gives_no_ids_in_range():
    """alpha 1.2 with vocab 0 gave [0 0 0], a negative vocab negative ids, a
    float vocab float ids; alpha in (0, 1] failed inside numpy."""
    from sok_graph.data.hashed_keys import draw_ids

    rng = np.random.default_rng(0)
    ids = draw_ids(rng, 1.2, 10, 1000)
    assert ids.min() >= 0 and ids.max() < 10
    for vocab in (0, -10, 10.5, True):
        with pytest.raises(ValueError, match="vocab must be a positive integer; got "
                                             + re.escape(repr(vocab))):
            draw_ids(rng, 1.2, vocab, 3)
    with pytest.raises(ValueError, match=r"alpha must be > 1 \(Zipf\) or <= 0 \(uniform\); "
                                         r"got 0.5"):
        draw_ids(rng, 0.5, 10, 3)


def test_the_top_ids_hash_and_a_uint64_vocab_or_position_keeps_its_integers():
    """Numbers near 2**63 and 2**64, as every numpy hashes, draws and indexes
    them: numpy before 1.25 (TensorFlow 1.15's) compared an int64 with 2**63
    as float64, so hashed() refused the top 512 ids; numpy 2 took int64 ids
    modulo a np.uint64 vocab to float64 (ids past 2**53 inexact); take()
    read uint64 position 2**64 - 1 as -1, the last sample."""
    from sok_graph.data import movielens
    from sok_graph.data.hashed_keys import draw_ids, hashed

    top = np.array([2 ** 63 - 1, 2 ** 63 - 512], np.int64)
    keys = hashed(top)
    assert keys.dtype == np.int64 and len(set(keys.tolist())) == 2 and keys.min() >= 0
    assert hashed(top.astype(np.uint64)).tolist() == keys.tolist()
    vocab = np.uint64(2 ** 62 + 1)
    ids = draw_ids(np.random.default_rng(1), 1.05, vocab, 1000)
    assert ids.dtype.kind in "iu" and ids.min() >= 0 and int(ids.max()) < int(vocab)
    samples = {"label": np.arange(3, dtype=np.float32), "genres_values": np.arange(3),
               "genres_splits": np.array([0, 1, 2, 3])}
    with pytest.raises(IndexError, match="index holds 18446744073709551615, outside the 3 "
                                         "samples"):
        movielens.take(samples, np.array([2 ** 64 - 1], np.uint64))
    assert movielens.take(samples, np.array([2], np.uint64))["label"].tolist() == [2.0]


def test_auc_of_large_integer_scores():
    """Integer scores were cast to float64, where 2**60 and 2**60 + 1 are one
    number: a perfect ranking gave 0.5."""
    assert metrics.auc([0, 1], np.array([2 ** 60, 2 ** 60 + 1])) == 1.0
    assert metrics.auc([0, 1], np.array([2 ** 64 - 1, 2 ** 64 - 2], np.uint64)) == 0.0
    assert metrics.auc([0, 1, 1], np.array([True, False, True])) == \
        pytest.approx(brute_force_auc(np.array([0, 1, 1]), np.array([1, 0, 1])))


def test_planted_dataset_helpers_refuse_impossible_arguments():
    from sok_graph.data import movielens, synthetic

    with pytest.raises(ValueError, match="vocab_sizes and max_hotness must give one value per "
                                         "table; got 2 and 1"):
        synthetic.make_planted_dataset(5, [10, 20], [3])
    with pytest.raises(ValueError, match=r"max_hotness\[0\] must be a positive integer; got 0"):
        synthetic.make_planted_dataset(5, [10], [0])
    data = synthetic.make_planted_dataset(6, [10], [2])
    values, splits, labels = synthetic.batch(data, 2, 5)
    assert len(splits[0]) == 4 and len(labels) == 3 and splits[0][-1] == len(values[0])
    for start, stop in ((-2, 5), (4, 2), (0, 7), (1.0, 3)):
        with pytest.raises(ValueError, match="start and stop must be integers with 0 <= start "
                                             "< stop <= 6"):
            synthetic.batch(data, start, stop)
    samples = {"label": np.arange(5, dtype=np.float32), "user": np.arange(5),
               "genres_values": np.arange(7), "genres_splits": np.array([0, 1, 3, 4, 6, 7])}
    for bad in (1.5, -0.5, float("nan"), "0.2"):
        with pytest.raises(ValueError, match="test_fraction must be a number in \\[0, 1\\]; got "
                                             + re.escape(repr(bad))):
            movielens.split(samples, test_fraction=bad)
    train, test = movielens.split(samples, test_fraction=0.4)
    assert len(train["label"]) == 3 and len(test["label"]) == 2
    picked = movielens.take(samples, [0, 2])  # a list (it failed: list + int)
    assert picked["genres_values"].tolist() == [0, 3] and picked["genres_splits"].tolist() == [0, 1, 2]
    # A negative position counts from the end, its genres included (-1 gave
    # splits [0, -5] and no genres); a mask and positions outside are refused.
    last = movielens.take(samples, [-1, 1])
    assert last["user"].tolist() == [4, 1]
    assert last["genres_values"].tolist() == [6, 1, 2] and last["genres_splits"].tolist() == [0, 1, 3]
    with pytest.raises(TypeError, match="index must hold integer positions; got bool"):
        movielens.take(samples, np.array([True, False, True, False, False]))
    with pytest.raises(IndexError, match="index holds -6, outside the 5 samples"):
        movielens.take(samples, [-6])
    with pytest.raises(IndexError, match="index holds 5, outside the 5 samples"):
        movielens.take(samples, [0, 5])
    with pytest.raises(ValueError, match=r"index must be 1-D; got shape \(1, 2\)"):
        movielens.take(samples, [[0, 1]])


def test_auc_refuses_labels_other_than_0_and_1_and_keeps_long_double_scores():
    """Labels were cut at 0.5: {1, 2} were all one class (NaN) and {0, 0.5}
    too. Long double scores were cast to float64, where these are one number:
    a perfect ranking gave 0.5."""
    for labels in ([1, 2], [0, 0.5], [0, -1]):
        with pytest.raises(ValueError, match=r"labels must each be 0 or 1 \(a click or not\); got "):
            metrics.auc(labels, [0.1, 0.9])
    assert metrics.auc([False, True], [0.1, 0.9]) == 1.0
    assert metrics.auc(np.array([0.0, 1.0], np.float32), [0.9, 0.1]) == 0.0
    if np.finfo(np.longdouble).eps < np.finfo(np.float64).eps:  # x86's 80-bit long double
        one = np.longdouble(1)
        scores = np.array([one, one + np.finfo(np.longdouble).eps], np.longdouble)
        assert metrics.auc([0, 1], scores) == 1.0


def test_hashed_keys_of_bools_and_float16():
    """A bool array failed in numpy's compare with 2**63 (OverflowError naming
    nothing); float16 ids warned of an overflow."""
    import warnings

    from sok_graph.data.hashed_keys import hashed

    assert hashed(np.array([True, False])).tolist() == hashed([1, 0]).tolist()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hashed(np.array([3, 7], np.float16)).tolist() == hashed([3, 7]).tolist()


@pytest.mark.parametrize("signal", [float("nan"), float("inf"), 1e308])
def test_planted_dataset_refuses_a_signal_that_gives_no_labels(signal):
    """make_planted_dataset(signal=nan) (or inf, or one whose scores
    overflow) made every logit NaN and every label 0 without an error (NaN
    without even a warning): a data set of one class, whose AUC is NaN."""
    from sok_graph.data import synthetic

    with pytest.raises(ValueError, match="signal"):
        data = synthetic.make_planted_dataset(500, [50, 60], [3, 2], signal=signal)
        # What the helper promises (its module docstring): labels of both classes.
        assert 0 < data.labels.mean() < 1


@pytest.mark.parametrize("given", ["new_dir/", "missing/../c.parquet"])
def test_a_path_the_rename_cannot_take_is_refused_before_writing(tmp_path, monkeypatch, given):
    """written_whole (the Parquet writers' whole-file writes) checked the
    directory of os.path.abspath(path), which drops a trailing "/" and
    folds "missing/.." away: the whole file was written, then the rename
    failed ("Not a directory: '.../.new_dir.tmp-...' -> 'new_dir/'"),
    naming the temporary file and no argument, and the work was lost.
    Such a path is an error naming `path` before anything is written."""
    from sok_graph.data import synthetic

    monkeypatch.chdir(tmp_path)
    wrote = []
    real = synthetic._write_criteo

    def spy(*args):
        wrote.append(True)
        return real(*args)

    monkeypatch.setattr(synthetic, "_write_criteo", spy)
    with pytest.raises(OSError, match=r"path='" + given.replace(".", r"\.") + "'"):
        synthetic.write_criteo_parquet(given, 5, num_tables=1, num_dense=1)
    assert wrote == []  # refused before the file was written
    assert sorted(p.name for p in tmp_path.iterdir()) == []
