"""Loyalty metrics against direct formulas."""

from __future__ import annotations

import math

import torch

from workbench.analysis.metrics import (
    loyalty_per_example,
    nan_mean,
    probability_loyalties,
    probability_loyalty,
)


def _direct_loyalty(p: list[float], q: list[float]) -> float:
    """``1 − √JSD`` with base-2 logs, written out term by term."""
    m = [(a + b) / 2 for a, b in zip(p, q, strict=True)]
    kl_pm = sum(a * math.log2(a / c) for a, c in zip(p, m, strict=True) if a > 0)
    kl_qm = sum(b * math.log2(b / c) for b, c in zip(q, m, strict=True) if b > 0)
    return 1 - math.sqrt((kl_pm + kl_qm) / 2)


def test_probability_loyalty_against_the_direct_formula():
    torch.manual_seed(0)
    teacher, student = torch.randn(6, 4), torch.randn(6, 4)
    teacher[0] = torch.tensor([200.0, 0, 0, 0])  # a one-hot teacher: 0·log 0 terms
    student[1] = teacher[1]  # identical distributions: loyalty 1
    values = probability_loyalties(teacher, student)
    expected = [
        _direct_loyalty(t.double().softmax(-1).tolist(), s.double().softmax(-1).tolist())
        for t, s in zip(teacher, student, strict=True)
    ]
    torch.testing.assert_close(values, torch.tensor(expected, dtype=torch.float64))
    assert values[1] == 1.0 and bool(((values >= 0) & (values <= 1)).all())
    assert probability_loyalty(teacher, student) == float(values.mean())
    opposite = probability_loyalties(torch.tensor([[100.0, 0]]), torch.tensor([[0.0, 100]]))
    assert abs(float(opposite[0])) < 1e-12  # disjoint supports: JSD = 1


def test_nan_mean_counts_undefined_values():
    assert nan_mean(torch.tensor([1.0, float("nan"), 3.0])) == (2.0, 1)
    mean, undefined = nan_mean(torch.tensor([float("nan")]))
    assert math.isnan(mean) and undefined == 1


def test_loyalty_per_example_is_what_the_loyalties_average():
    teacher = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0], [1.0, 0.0, 0.5]])
    student = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    values = loyalty_per_example(teacher, student)
    assert values["label_loyalty"] == [1, 0, 1, 0]  # argmax equal in rows 0 and 2
    assert values["probability_loyalty"] == probability_loyalties(teacher, student).tolist()
    assert math.isclose(
        sum(values["probability_loyalty"]) / 4, probability_loyalty(teacher, student)
    )
    assert loyalty_per_example(teacher[:, :1], student[:, :1]) == {}  # regression: none
