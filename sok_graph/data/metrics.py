"""Evaluation metrics computed with numpy."""

import numpy as np


def _vector(name, values):
    """`values` as a 1-D numpy array; a column [n, 1] (a model's output) is
    taken as its n values (it was sorted along its last axis, which gave
    AUCs such as -0.63)."""
    values = np.asarray(values)
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if values.ndim != 1:
        raise ValueError(f"{name} must be 1-D (or a column [n, 1]); got shape {values.shape}")
    if values.dtype.kind not in "biuf":
        raise TypeError(f"{name} must hold numbers; got {values.dtype}")
    return values


def auc(labels, scores):
    """Area under the ROC curve by the rank-sum formula (tied scores share
    their mean rank). NaN when only one class is present. labels (each 0 or
    1, or False/True) and scores are 1-D (or columns [n, 1]) of one length;
    a NaN in either, or another label, is a ValueError (NaN scores, a
    diverged model's, gave AUC 1.0; NaN labels counted as negatives, and
    labels 1 and 2 were all negatives: NaN, "one class")."""
    labels = _vector("labels", labels)
    scores = _vector("scores", scores)
    if scores.dtype.kind == "b":
        scores = scores.astype(np.int8)
    elif scores.dtype.kind == "f" and scores.dtype.itemsize < 8:
        scores = scores.astype(np.float64)
    # Integer scores stay integers, and long doubles long doubles: as
    # float64, 2**60 and 2**60 + 1 were one score (a tie) and gave an AUC
    # of 0.5 for a perfect ranking.
    if len(labels) != len(scores):
        raise ValueError(f"labels and scores must be of one length; got {len(labels)} labels "
                         f"and {len(scores)} scores")
    for name, values in (("labels", labels), ("scores", scores)):
        if values.dtype.kind != "f":
            continue
        nan = np.isnan(values)
        if nan.any():
            raise ValueError(f"{name} hold {int(nan.sum())} NaN(s), the first at position "
                             f"{int(np.argmax(nan))}: the AUC of NaN is not defined")
    other = ~((labels == 0) | (labels == 1))
    if other.any():
        at = int(np.argmax(other))
        raise ValueError(f"labels must each be 0 or 1 (a click or not); got {labels[at]!r} at "
                         f"position {at}")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(len(scores))
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1
        i = j + 1
    pos = labels > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
