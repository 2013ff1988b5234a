"""Paired comparisons of two models on the same test examples.

A difference between methods is a claim only with its interval: :func:`paired_bootstrap`
resamples the paired units (an example under a seed) with ``scipy.stats.bootstrap`` (BCa, 95 %),
so the seeds' and the examples' variation both enter the interval. :func:`pair_predictions`
builds the units from runs' ``predictions.json`` (:func:`pair_scores` from any per-example
score) and refuses sets that are not paired.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from workbench.errors import WorkbenchError

__all__ = ["Interval", "pair_predictions", "pair_scores", "paired_bootstrap"]


@dataclass(frozen=True)
class Interval:
    """The mean paired difference ``a − b`` and its confidence interval."""

    difference: float
    low: float
    high: float
    pairs: int
    confidence: float = 0.95

    @property
    def significant(self) -> bool:
        """Whether the interval excludes 0."""
        return self.low > 0 or self.high < 0

    def describe(self, scale: float = 100.0, unit: str = " points") -> str:
        """``"+1.2 points (95 % CI +0.4 to +2.0, n = 3,000)"``."""
        return (
            f"{self.difference * scale:+.1f}{unit} ({self.confidence:.0%} CI "
            f"{self.low * scale:+.1f} to {self.high * scale:+.1f}, n = {self.pairs:,})"
        )


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> Interval:
    """Mean of ``a − b`` over paired units ``[N]`` with a BCa bootstrap interval that resamples
    the pairs (``scipy.stats.bootstrap(..., paired=True)``). Per-unit scores are typically 0/1
    correctness. When every pair has the same difference (up to rounding) the interval is that
    one value: a bootstrap of a constant is degenerate."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise WorkbenchError(f"paired scores need two equal 1-D arrays, got {a.shape}, {b.shape}")
    if len(a) < 2:
        raise WorkbenchError(f"a paired bootstrap needs at least 2 pairs, got {len(a)}")
    differences = a - b
    mean = float(differences.mean())
    if np.ptp(differences) <= 1e-12 * max(1.0, abs(mean)):  # equal up to rounding
        return Interval(mean, mean, mean, len(a), confidence)
    result = stats.bootstrap(
        (differences,),
        np.mean,
        confidence_level=confidence,
        n_resamples=resamples,
        method="BCa",
        batch=256,  # resamples at a time: memory stays small for 10,000 pairs and more
        rng=np.random.default_rng(seed),
    )
    ci = result.confidence_interval
    return Interval(mean, float(ci.low), float(ci.high), len(a), confidence)


def _positions(left: Sequence[str], right: Sequence[str], seed: int) -> list[int]:
    """For each id of ``left`` its position in ``right``; sets of other ids are refused."""
    order = {uid: i for i, uid in enumerate(right)}
    if set(order) != set(left) or len(order) != len(left):
        raise WorkbenchError(
            f"not paired: seed {seed}'s sets cover different examples "
            f"({len(left)} and {len(right)} ids, {len(set(order) ^ set(left))} not in both)"
        )
    return [order[uid] for uid in left]


def _check_seeds(a: Sequence[dict], b: Sequence[dict]) -> None:
    if len(a) != len(b):
        raise WorkbenchError(f"not paired: {len(a)} seeds against {len(b)}")


def pair_predictions(a: Sequence[dict], b: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Per-unit correctness of two models, paired by seed and example id.

    ``a`` and ``b``: one split's ``predictions.json`` entry per seed, in the same seed order
    (``{"uids": [...], "labels": [...], "predictions": [...]}``). Returns two 0/1 arrays over
    every (seed, example). Sets that do not cover the same examples are refused."""
    _check_seeds(a, b)
    scores_a, scores_b = [], []
    for seed, (left, right) in enumerate(zip(a, b, strict=True)):
        for i, j in enumerate(_positions(left["uids"], right["uids"], seed)):
            if left["labels"][i] != right["labels"][j]:
                raise WorkbenchError(f"not paired: example {left['uids'][i]} has two gold labels")
            scores_a.append(left["predictions"][i] == left["labels"][i])
            scores_b.append(right["predictions"][j] == right["labels"][j])
    return np.asarray(scores_a, dtype=float), np.asarray(scores_b, dtype=float)


def pair_scores(a: Sequence[dict], b: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Per-example scores of two models (saliency loyalty, attribution gap, AOPC), paired by
    seed and example id: ``{"uids": [...], "scores": [...]}`` per seed, in the same seed order.
    Pairs where either score is undefined (None or NaN) are left out; sets that do not cover the
    same examples are refused."""
    _check_seeds(a, b)
    scores_a, scores_b = [], []
    for seed, (left, right) in enumerate(zip(a, b, strict=True)):
        for i, j in enumerate(_positions(left["uids"], right["uids"], seed)):
            x, y = left["scores"][i], right["scores"][j]
            if x is not None and y is not None and not (math.isnan(x) or math.isnan(y)):
                scores_a.append(x)
                scores_b.append(y)
    return np.asarray(scores_a, dtype=float), np.asarray(scores_b, dtype=float)
