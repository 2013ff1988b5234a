"""Paired comparisons of two models on the same test examples.

A difference between methods is a claim only with its interval. :func:`two_level_bootstrap`
resamples the seeds, then the test examples within each seed drawn (percentile, 95 %): the
interval speaks of the method, whose students vary from seed to seed, not only of the students
trained. :func:`paired_bootstrap` resamples pooled units (an example under a seed) with
``scipy.stats.bootstrap`` (BCa, 95 %), which treats the seeds as fixed. :func:`pair_predictions`
builds the units from runs' ``predictions.json`` (:func:`pair_scores` from any per-example
score), per seed or pooled, and refuses sets that are not paired.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from workbench.core.errors import WorkbenchError

__all__ = [
    "Interval",
    "pair_predictions",
    "pair_scores",
    "paired_bootstrap",
    "seeds_needed",
    "two_level_bootstrap",
]


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


def two_level_bootstrap(
    groups: Sequence[tuple[Sequence[float], Sequence[float]]],
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> Interval:
    """Mean of ``a − b`` over every (seed, example) unit, with an interval from a two-level
    bootstrap: each resample draws as many seeds as there are, with replacement, then for each
    seed drawn its examples with replacement, and takes the mean difference over the units so
    drawn; the interval is the resamples' percentiles. ``groups``: per seed, the paired scores
    ``(a, b)`` of its examples (``[N_s]`` each). With one seed it is the examples-only bootstrap
    (percentile); with seeds that differ much more than their examples' noise it approaches the
    bootstrap of the seeds' means."""
    differences = [np.asarray(a, dtype=float) - np.asarray(b, dtype=float) for a, b in groups]
    if not differences or any(d.ndim != 1 or len(d) < 1 for d in differences):
        raise WorkbenchError("a two-level bootstrap needs at least one seed with paired scores")
    sizes = np.array([len(d) for d in differences])
    if sizes.sum() < 2:
        raise WorkbenchError(f"a paired bootstrap needs at least 2 pairs, got {sizes.sum()}")
    mean = float(np.concatenate(differences).mean())
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    batch = 256  # resamples at a time: memory stays small for 10,000 pairs a seed
    for start in range(0, resamples, batch):
        count = min(batch, resamples - start)
        chosen = rng.integers(len(differences), size=(count, len(differences)))  # seeds drawn
        totals = np.zeros(count)
        for s, values in enumerate(differences):  # each draw of seed s resamples its examples
            rows = np.nonzero(chosen == s)[0]
            if len(rows):
                np.add.at(totals, rows, _resampled_sums(values, len(rows), rng))
        means[start : start + count] = totals / sizes[chosen].sum(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return Interval(mean, float(low), float(high), int(sizes.sum()), confidence)


def _resampled_sums(values: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """The sums of ``count`` bootstrap resamples of ``values`` ``[N]`` → ``[count]``. Values of
    few distinct levels (0/1 correctness and its differences) are resampled as multinomial
    counts of their levels, which is the same distribution at a cost independent of ``N``."""
    levels, inverse = np.unique(values, return_inverse=True)
    if len(levels) <= 16:
        shares = np.bincount(inverse, minlength=len(levels)) / len(values)
        return rng.multinomial(len(values), shares, size=count) @ levels
    return values[rng.integers(len(values), size=(count, len(values)))].sum(axis=1)


def seeds_needed(
    groups: Sequence[tuple[Sequence[float], Sequence[float]]], difference: float
) -> int | None:
    """About how many seeds an interval over seeds would need to exclude 0 for a mean
    difference of this size: ``⌈(1.96 σ / |Δ|)²⌉`` with ``σ`` the standard deviation of the
    seeds' mean differences (None with fewer than 2 seeds or a zero difference)."""
    seed_means = [float(np.mean(np.asarray(a, float) - np.asarray(b, float))) for a, b in groups]
    if len(seed_means) < 2 or difference == 0:
        return None
    spread = float(np.std(seed_means, ddof=1))
    return max(2, math.ceil((1.96 * spread / abs(difference)) ** 2))


def _positions(left: Sequence[str], right: Sequence[str], seed: int) -> list[int]:
    """For each id of ``left`` its position in ``right``; sets of other ids are refused."""
    order = {uid: i for i, uid in enumerate(right)}
    if set(order) != set(left) or len(order) != len(left):
        raise WorkbenchError(
            f"not paired: seed {seed}'s sets cover different examples "
            f"({len(left)} and {len(right)} ids, {len(set(order) ^ set(left))} not in both)"
        )
    return [order[uid] for uid in left]


Pairs = tuple[np.ndarray, np.ndarray]


def _paired(
    a: Sequence[dict], b: Sequence[dict], by_seed: bool, unit: Callable[..., tuple | None]
) -> Pairs | list[Pairs]:
    """Two models' values ``unit(left, right, i, j)`` of each example, paired by seed and example
    id (None: left out), pooled over the seeds or with ``by_seed`` one pair of arrays per seed."""
    if len(a) != len(b):
        raise WorkbenchError(f"not paired: {len(a)} seeds against {len(b)}")
    groups = []
    for seed, (left, right) in enumerate(zip(a, b, strict=True)):
        positions = enumerate(_positions(left["uids"], right["uids"], seed))
        kept = [p for p in (unit(left, right, i, j) for i, j in positions) if p is not None]
        groups.append(tuple(np.asarray([p[k] for p in kept], dtype=float) for k in (0, 1)))
    if by_seed:
        return groups
    return tuple(np.concatenate([g[k] for g in groups]) for k in (0, 1))  # type: ignore[return-value]


def pair_predictions(
    a: Sequence[dict], b: Sequence[dict], by_seed: bool = False
) -> Pairs | list[Pairs]:
    """Per-unit correctness of two models, paired by seed and example id.

    ``a`` and ``b``: one split's ``predictions.json`` entry per seed, in the same seed order
    (``{"uids": [...], "labels": [...], "predictions": [...]}``). Returns two 0/1 arrays over
    every (seed, example), or with ``by_seed`` one such pair of arrays per seed (what
    :func:`two_level_bootstrap` takes). Sets that do not cover the same examples are refused."""

    def correct(left: dict, right: dict, i: int, j: int) -> tuple[bool, bool]:
        gold = left["labels"][i]
        if gold != right["labels"][j]:
            raise WorkbenchError(f"not paired: example {left['uids'][i]} has two gold labels")
        return left["predictions"][i] == gold, right["predictions"][j] == gold

    return _paired(a, b, by_seed, correct)


def pair_scores(a: Sequence[dict], b: Sequence[dict], by_seed: bool = False) -> Pairs | list[Pairs]:
    """Per-example scores of two models (saliency loyalty, attribution gap, AOPC), paired by
    seed and example id: ``{"uids": [...], "scores": [...]}`` per seed, in the same seed order;
    pooled, or with ``by_seed`` per seed. Pairs where either score is undefined (None or NaN)
    are left out; sets that do not cover the same examples are refused."""

    def defined(left: dict, right: dict, i: int, j: int) -> tuple[float, float] | None:
        x, y = left["scores"][i], right["scores"][j]
        return None if x is None or y is None or math.isnan(x) or math.isnan(y) else (x, y)

    return _paired(a, b, by_seed, defined)
