"""The ce, kd and pkd terms against direct formulas; layer maps of the papers."""

from __future__ import annotations

import math

import pytest
import torch

from kd.methods.layer_map import patient_layers, uniform_layers
from kd.methods.pkd import patient_loss
from kd.methods.vanilla import logit_kd_loss, task_loss
from workbench.core.errors import WorkbenchError
from workbench.core.names import UNLABELLED


def _direct_kl(student: torch.Tensor, teacher: torch.Tensor, tau: float) -> float:
    total = 0.0
    for s_row, t_row in zip(student.tolist(), teacher.tolist(), strict=True):
        zs = [math.exp(v / tau) for v in s_row]
        zt = [math.exp(v / tau) for v in t_row]
        ps = [v / sum(zs) for v in zs]
        pt = [v / sum(zt) for v in zt]
        total += sum(t * math.log(t / s) for t, s in zip(pt, ps, strict=True))
    return total / len(student)


@pytest.mark.parametrize("tau", [1.0, 2.0, 5.0])
def test_kd_forms_against_direct_formulas(tau):
    torch.manual_seed(0)
    student = torch.randn(4, 3, dtype=torch.float64)
    teacher = torch.randn(4, 3, dtype=torch.float64)
    kl = _direct_kl(student, teacher, tau)
    assert float(logit_kd_loss(student, teacher, tau)) == pytest.approx(tau**2 * kl, rel=1e-9)
    assert float(logit_kd_loss(student, teacher, tau, form="kl-mean")) == pytest.approx(
        tau**2 * kl / 3, rel=1e-9
    )
    p_t = torch.softmax(teacher / tau, -1)
    entropy = float(-(p_t * p_t.log()).sum(-1).mean())
    assert float(logit_kd_loss(student, teacher, tau, form="soft-ce")) == pytest.approx(
        kl + entropy, rel=1e-9
    )


def test_kd_is_zero_for_equal_logits_and_regression_is_mse():
    logits = torch.randn(5, 4)
    assert float(logit_kd_loss(logits, logits.clone(), 3.0)) == pytest.approx(0, abs=1e-6)
    s, t = torch.tensor([[1.0], [3.0]]), torch.tensor([[2.0], [1.0]])
    assert float(logit_kd_loss(s, t, 2.0)) == pytest.approx(((0.5 - 1) ** 2 + (1.5 - 0.5) ** 2) / 2)
    assert float(task_loss(s, torch.tensor([1.0, 1.0]))) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="unknown KD form"):
        logit_kd_loss(logits, logits, 1.0, form="l2")


def test_kd_gradient_reaches_student_only():
    student = torch.randn(3, 4, requires_grad=True)
    teacher = torch.randn(3, 4, requires_grad=True)
    logit_kd_loss(student, teacher, 2.0).backward()
    assert student.grad is not None and teacher.grad is None


def test_patient_loss_against_direct_formula():
    torch.manual_seed(1)
    student, teacher = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    direct = 0.0
    for b in range(3):
        for j in range(2):
            s = student[b, j] / student[b, j].norm()
            t = teacher[b, j] / teacher[b, j].norm()
            direct += float(((s - t) ** 2).sum())
    assert float(patient_loss(student, teacher)) == pytest.approx(direct / 3, rel=1e-5)
    assert float(patient_loss(student, teacher, reduction="official")) == pytest.approx(
        direct / (3 * 2 * 8), rel=1e-5
    )
    assert float(patient_loss(2.5 * teacher, teacher)) == pytest.approx(0, abs=1e-10)
    with pytest.raises(ValueError, match="equal shapes"):
        patient_loss(student, teacher[:, :1])


def test_pure_terms_are_importable_from_the_top_of_kd():
    import kd

    assert kd.logit_kd_loss is logit_kd_loss and kd.patient_loss is patient_loss
    for name in (
        "attribution_loss",
        "gradient_alignment_loss",
        "word_relation_loss",
        "layer_relation_loss",
    ):
        assert callable(getattr(kd, name))


def test_layer_maps_of_the_papers():
    assert [t for _, t in patient_layers(12, 6, "skip")] == [2, 4, 6, 8, 10]
    assert [t for _, t in patient_layers(12, 6, "last")] == [7, 8, 9, 10, 11]
    assert patient_layers(6, 3, "skip") == [(1, 2), (2, 4)]
    assert uniform_layers(6, 3) == [(0, 0), (1, 2), (2, 4), (3, 6)]
    with pytest.raises(WorkbenchError, match="divisible"):
        patient_layers(6, 4, "skip")


def test_ce_leaves_out_the_transfer_texts_withheld_labels():
    """CE over a batch with transfer texts (label UNLABELLED; NaN for regression) is the direct
    mean over the labelled rows; a batch of none is 0 and still reaches the logits."""
    logits = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([2, UNLABELLED, 0, UNLABELLED, 1])
    direct = -sum(
        math.log(math.exp(row[y]) / sum(math.exp(v) for v in row))
        for row, y in zip(logits.tolist(), labels.tolist(), strict=True)
        if y != UNLABELLED
    )
    assert task_loss(logits, labels).detach().item() == pytest.approx(direct / 3, rel=1e-12)
    none = task_loss(logits, torch.full((5,), UNLABELLED))
    none.backward()
    assert none.detach().item() == 0 and logits.grad is not None and not logits.grad.any()
    scores, targets = torch.tensor([[1.0], [3.0], [0.0]]), torch.tensor([1.0, math.nan, 2.0])
    assert float(task_loss(scores, targets)) == pytest.approx((0 + 4) / 2)


def test_a_transfer_set_refuses_a_term_that_needs_every_label():
    from kd.methods.config import ObjectiveConfig
    from kd.methods.objective import Objective

    def resolve(preset: str, **settings) -> Objective:
        config = ObjectiveConfig(preset=preset).with_settings(**settings)
        return Objective.resolve(config, 4, 2, 3, 16)

    assert resolve("kd").label_terms() == ["ce"]
    assert resolve("kd").label_refusals() == {}
    gold = resolve("adkd", attr_views="gold").label_refusals()
    assert set(gold) == {"attr"} and "--attr-views pred or all" in gold["attr"]
    assert resolve("adkd", attr_views="pred").label_refusals() == {}
    assert resolve("finetune").teacher_terms() == []
    assert resolve("gkd").teacher_terms() == ["kd", "grad"]
