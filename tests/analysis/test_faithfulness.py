"""AOPC under the project's rules and ferret-xai's, against hand-derived rationales on a tiny
case: five real tokens whose scores give known top-k sets under each rule."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import kendalltau

from tests.conftest import tiny_model
from workbench.analysis.faithfulness import aopc, kendall_per_example, leave_one_out
from workbench.core.errors import WorkbenchError
from workbench.core.models import forward

NAN = float("nan")

IDS = [2, 10, 11, 12, 13, 14, 3]  # [CLS] five words [SEP]
SCORES = [9.0, 0.5, -0.2, 0.3, 0.0, 0.1, 9.0]  # [CLS]/[SEP] scores are never used


def _batch(ids: list[int]) -> dict:
    return {
        "input_ids": torch.tensor([ids]),
        "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
    }


def _probability(model, ids: list[int], target: int) -> float:
    with torch.no_grad():
        return float(forward(model, _batch(ids)).logits.softmax(-1)[0, target])


def _drops(model, top: set[int]) -> tuple[float, float]:
    """p(x) − p(x without the positions ``top``), p(x) − p(only ``top`` and the specials)."""
    target = int(forward(model, _batch(IDS)).logits.argmax(-1))
    full = _probability(model, IDS, target)
    without = [t for i, t in enumerate(IDS) if i not in top]
    only = [t for i, t in enumerate(IDS) if i in top or i in (0, len(IDS) - 1)]
    return full - _probability(model, without, target), full - _probability(model, only, target)


def _run(model, scores: list[float], rules: str):
    return aopc(model, *_batch(IDS).values(), scores=torch.tensor([scores]), rules=rules)


def test_aopc_project_and_ferret_rules_against_hand_derived_rationales():
    model = tiny_model(num_labels=2)
    # ranked: position 1 (0.5), 3 (0.3), 5 (0.1), 4 (0.0), 2 (−0.2); n = 5
    one, two, three = _drops(model, {1}), _drops(model, {1, 3}), _drops(model, {1, 3, 5})
    # project: q = .1….5, k = ⌈5q⌉ = 1, 1, 2, 2, 3; every fraction counts
    project = _run(model, SCORES, "project")
    for kind, value in enumerate((project.comprehensiveness, project.sufficiency)):
        expected = (2 * one[kind] + 2 * two[kind] + three[kind]) / 5
        assert float(value[0]) == pytest.approx(expected, abs=1e-6)
    # ferret: q = .1…1, k = ⌊5q⌋ = 0 (skipped), 1, 1 (same: skipped), 2, 2, 3, 3, then 4 and
    # 5 whose positive tokens are {1, 3, 5} again (skipped): three rationales
    ferret = _run(model, SCORES, "ferret")
    for kind, value in enumerate((ferret.comprehensiveness, ferret.sufficiency)):
        assert float(value[0]) == pytest.approx((one[kind] + two[kind] + three[kind]) / 3, abs=1e-6)
    kept = ~ferret.comprehensiveness_drops[0].isnan()
    assert kept.tolist() == [False, True, False, True, False, True] + [False] * 4
    assert ferret.rules == "ferret" and len(ferret.fractions) == 10


def test_ferret_rules_without_a_positive_score_give_ferrets_defaults():
    model = tiny_model(num_labels=2)
    negative = _run(model, [0.0, -0.5, -0.2, -0.3, -0.1, -0.4, 0.0], "ferret")
    assert negative.comprehensiveness.tolist() == [0.0]
    assert negative.sufficiency.tolist() == [1.0]
    assert negative.comprehensiveness_drops.isnan().all()
    # the project's rules rank negative scores too: the first fraction drops position 4
    project = _run(model, [0.0, -0.5, -0.2, -0.3, -0.1, -0.4, 0.0], "project")
    assert float(project.comprehensiveness_drops[0, 0]) == pytest.approx(
        _drops(model, {4})[0], abs=1e-6
    )


def test_ferret_rules_break_ties_as_numpy_argsort_does():
    model = tiny_model(num_labels=2)
    tied = [0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    # k = ⌊5·0.2⌋ = 1: ferret keeps the last of the tied tokens; the project the first
    ferret, project = _run(model, tied, "ferret"), _run(model, tied, "project")
    assert float(ferret.comprehensiveness_drops[0, 1]) == pytest.approx(
        _drops(model, {5})[0], abs=1e-6
    )
    assert float(project.comprehensiveness_drops[0, 0]) == pytest.approx(
        _drops(model, {1})[0], abs=1e-6
    )


def test_unknown_rules_are_refused():
    with pytest.raises(WorkbenchError, match="unknown AOPC rules 'eraser'"):
        _run(tiny_model(num_labels=2), SCORES, "eraser")


def test_leave_one_out_drops_each_token_alone_as_computed_by_hand():
    model = tiny_model(num_labels=2)
    drops = leave_one_out(model, *_batch(IDS).values())
    target = int(forward(model, _batch(IDS)).logits.argmax(-1))
    full = _probability(model, IDS, target)
    for i in range(1, len(IDS) - 1):
        without = [t for j, t in enumerate(IDS) if j != i]
        expected = full - _probability(model, without, target)
        assert float(drops[0, i]) == pytest.approx(expected, abs=1e-6)
    assert drops[0, [0, len(IDS) - 1]].isnan().all()  # [CLS] and [SEP] are never removed


def test_kendall_per_example_is_scipys_and_nan_where_undefined():
    scores = torch.tensor([[0.0, 3.0, 1.0, 2.0, 5.0, 0.0], [0.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    drops = torch.tensor([[NAN, 0.3, 0.2, 0.1, 0.9, NAN], [NAN, 0.1, 0.2, 0.3, 0.4, NAN]])
    tau = kendall_per_example(scores, drops)
    expected = kendalltau([3.0, 1.0, 2.0, 5.0], [0.3, 0.2, 0.1, 0.9]).statistic
    assert float(tau[0]) == pytest.approx(expected) and tau[1].isnan()
