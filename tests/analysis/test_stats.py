"""Paired statistics: a bootstrap against the normal approximation on a case with a known answer,
identical predictions give an interval containing 0, unpaired sets are refused."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.analysis.stats import (
    pair_predictions,
    pair_scores,
    paired_bootstrap,
    seeds_needed,
    two_level_bootstrap,
)
from workbench.core.errors import WorkbenchError


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


def test_two_level_bootstrap_of_seeds_that_differ_is_the_bootstrap_of_their_means():
    """Two seeds whose every example differs by 0 and by 1: a resample draws seeds {0,0},
    {0,1} or {1,1} (probabilities 1/4, 1/2, 1/4), so the 95 % interval is exactly 0 to 1;
    the examples-only interval, treating the seeds as fixed, is narrow around 0.5."""
    groups = [(np.zeros(100), np.zeros(100)), (np.ones(100), np.zeros(100))]
    interval = two_level_bootstrap(groups)
    assert (interval.difference, interval.low, interval.high, interval.pairs) == (0.5, 0, 1, 200)
    pooled = paired_bootstrap(np.r_[np.zeros(100), np.ones(100)], np.zeros(200))
    assert pooled.low > 0.4 and pooled.high < 0.6


def test_two_level_bootstrap_covers_a_zero_effect_when_seed_variance_dominates():
    """Simulated set-ups where the true difference is 0 and each seed's students differ by a
    seed effect (sd 1) far larger than the examples' noise (sd 0.1): the interval over seeds
    and examples covers 0 in most of them, the examples-only interval in few."""
    rng = np.random.default_rng(1)
    covered = {"two-level": 0, "examples": 0}
    for trial in range(40):
        groups = [(rng.normal(rng.normal(), 0.1, 50), np.zeros(50)) for _ in range(5)]
        two = two_level_bootstrap(groups, resamples=1000, seed=trial)
        pooled = paired_bootstrap(
            np.concatenate([a for a, _ in groups]), np.zeros(250), resamples=1000, seed=trial
        )
        covered["two-level"] += two.low <= 0 <= two.high
        covered["examples"] += pooled.low <= 0 <= pooled.high
    assert covered["two-level"] >= 28 and covered["examples"] <= 10, covered


def test_two_level_bootstrap_multinomial_path_matches_resampling_indices():
    """0/1 differences take the multinomial shortcut; adding 1e-9 noise to every value forces
    the index path. Both estimate the same distribution: their intervals agree closely."""
    rng = np.random.default_rng(2)
    groups = [(rng.integers(0, 2, 400).astype(float), rng.integers(0, 2, 400)) for _ in range(3)]
    noisy = [(a + rng.normal(0, 1e-9, len(a)), b) for a, b in groups]
    fast, slow = two_level_bootstrap(groups), two_level_bootstrap(noisy)
    assert abs(fast.low - slow.low) < 0.01 and abs(fast.high - slow.high) < 0.01


def test_seeds_needed_follows_the_spread_of_the_seed_means():
    groups = [(np.full(10, m), np.zeros(10)) for m in (0.01, 0.03, 0.02)]  # seed means
    spread = np.std([0.01, 0.03, 0.02], ddof=1)
    assert seeds_needed(groups, 0.005) == int(np.ceil((1.96 * spread / 0.005) ** 2))
    assert seeds_needed(groups[:1], 0.005) is None and seeds_needed(groups, 0.0) is None
