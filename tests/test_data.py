"""Data helpers: AUC against a brute-force count, MovieLens conversion."""

import importlib.util

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


@pytest.mark.skipif(importlib.util.find_spec("recbole") is None or
                    importlib.util.find_spec("pyarrow") is None,
                    reason="needs the recbole wheel and pyarrow (scripts/run_demo.sh installs them)")
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
