"""Paired statistics: a bootstrap against the normal approximation on a case with a known answer,
identical predictions give an interval containing 0, unpaired sets are refused."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.errors import WorkbenchError
from workbench.stats import pair_predictions, pair_scores, paired_bootstrap


def test_paired_bootstrap_matches_the_known_answer():
    rng = np.random.default_rng(0)
    a = rng.random(4000) < 0.80  # model a right on 80 %, b on 75 %, paired examples
    b = np.where(rng.random(4000) < 0.9, a, rng.random(4000) < 0.3)
    interval = paired_bootstrap(a, b)
    d = a.astype(float) - b.astype(float)
    half = 1.959964 * d.std(ddof=1) / np.sqrt(len(d))  # the CLT's interval for a mean
    assert interval.difference == pytest.approx(d.mean())
    assert interval.low == pytest.approx(d.mean() - half, abs=0.15 * half)
    assert interval.high == pytest.approx(d.mean() + half, abs=0.15 * half)
    assert interval.significant and interval.pairs == 4000


def test_identical_predictions_give_an_interval_containing_zero():
    a = np.array([1, 0, 1, 1, 0, 1], dtype=float)
    interval = paired_bootstrap(a, a.copy())
    assert interval.low <= 0 <= interval.high and not interval.significant
    # pairs that differ both ways, evenly: 0 inside the interval
    interval = paired_bootstrap([1, 0] * 50, [0, 1] * 50)
    assert interval.low < 0 < interval.high and not interval.significant


def test_unpaired_sets_are_refused():
    left = {"uids": ["a", "b", "c"], "labels": [0, 1, 2], "predictions": [0, 1, 1]}
    right = {"uids": ["c", "a", "b"], "labels": [2, 0, 1], "predictions": [2, 0, 0]}
    a, b = pair_predictions([left], [right])
    assert a.tolist() == [1, 1, 0] and b.tolist() == [1, 0, 1]  # paired by id, not position
    other = {**right, "uids": ["c", "a", "d"]}
    with pytest.raises(WorkbenchError, match="cover different examples"):
        pair_predictions([left], [other])
    with pytest.raises(WorkbenchError, match="2 seeds against 1"):
        pair_predictions([left, left], [right])
    with pytest.raises(WorkbenchError, match="equal 1-D arrays"):
        paired_bootstrap([1, 0, 1], [1, 0])


def test_pair_scores_pairs_by_id_and_leaves_out_undefined_values():
    left = {"uids": ["a", "b", "c"], "scores": [0.5, None, 0.1]}
    right = {"uids": ["b", "c", "a"], "scores": [0.2, float("nan"), 0.3]}
    a, b = pair_scores([left, left], [right, right])  # two seeds, pooled
    assert a.tolist() == [0.5, 0.5] and b.tolist() == [0.3, 0.3]  # b and c undefined
    with pytest.raises(WorkbenchError, match="cover different examples"):
        pair_scores([left], [{**right, "uids": ["b", "c", "z"]}])


def test_pooled_interval_of_a_constant_shift_is_that_shift():
    """Every example gains exactly 0.25: the interval is the point 0.25, significant."""
    a = np.linspace(0, 1, 50)
    interval = paired_bootstrap(a + 0.25, a)
    assert (interval.low, interval.difference, interval.high) == pytest.approx((0.25,) * 3)
    assert interval.significant
