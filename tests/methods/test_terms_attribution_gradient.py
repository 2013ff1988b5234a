"""AD-KD attribution term and GKD gradient term against direct computations."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kd.methods.adkd import attribution_loss
from kd.methods.gkd import gradient_alignment_loss, unit_normalize

DT = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _mask(lengths: list[int], length: int) -> torch.Tensor:
    return torch.tensor([[1] * n + [0] * (length - n) for n in lengths], dtype=torch.long)


def _maps(mask: torch.Tensor, views: int, seed: int) -> torch.Tensor:
    """[B, C, L] non-negative maps, each view L2-normalised over real tokens, pads 0."""
    raw = torch.rand(mask.shape[0], views, mask.shape[1], dtype=DT, generator=_gen(seed))
    raw = raw * mask[:, None, :]
    return raw / raw.norm(dim=-1, keepdim=True).clamp_min(1e-30)


# ---------------------------------------------------------------- attribution


def _direct_attribution(student, teacher, mask, reduction):
    batch, views, length = student.shape
    per_example, squared, real = [], 0.0, 0
    for b in range(batch):
        total = 0.0
        for c in range(views):
            for i in range(length):
                if mask[b, i]:
                    total += (student[b, c, i] - teacher[b, c, i]).item() ** 2
        per_example.append(math.sqrt(total))
        squared += total
        real += int(mask[b].sum())
    if reduction == "paper":
        return sum(per_example) / batch
    if reduction == "squared":
        return sum(e**2 for e in per_example) / batch
    return squared / real


@pytest.mark.parametrize("reduction", ["paper", "squared", "official"])
def test_attribution_matches_direct(reduction):
    mask = _mask([7, 4, 1], 7)
    student, teacher = _maps(mask, 3, 1), _maps(mask, 3, 2)
    loss = attribution_loss(student, teacher, mask, reduction=reduction)
    direct = _direct_attribution(student, teacher, mask, reduction)
    assert direct > 0.1
    assert loss.item() == pytest.approx(direct, abs=1e-9)


def test_attribution_paper_needs_no_mask_when_pads_are_zero():
    mask = _mask([6, 3], 6)
    student, teacher = _maps(mask, 2, 3), _maps(mask, 2, 4)
    with_mask = attribution_loss(student, teacher, mask).item()
    assert attribution_loss(student, teacher).item() == pytest.approx(with_mask, abs=1e-12)
    zero_padded = attribution_loss(F.pad(student, (0, 4)), F.pad(teacher, (0, 4)))
    assert zero_padded.item() == pytest.approx(with_mask, abs=1e-12)


@pytest.mark.parametrize("reduction", ["paper", "squared", "official"])
def test_attribution_extra_padding_changes_nothing(reduction):
    mask = _mask([6, 3], 6)
    student, teacher = _maps(mask, 3, 5), _maps(mask, 3, 6)
    before = attribution_loss(student, teacher, mask, reduction=reduction)
    garbage = torch.randn(2, 3, 4, dtype=DT, generator=_gen(7))
    padded_mask = F.pad(mask, (0, 4))
    after = attribution_loss(
        torch.cat([student, garbage], -1),
        torch.cat([teacher, -garbage], -1),
        padded_mask,
        reduction=reduction,
    )
    assert after.item() == pytest.approx(before.item(), abs=1e-6)


@pytest.mark.parametrize("reduction", ["paper", "squared", "official"])
def test_attribution_degenerate_inputs_are_finite_and_teacher_detached(reduction):
    """Identical maps and an all-pad row: the paper's norm sits at exactly zero there."""
    mask = _mask([5, 0, 1], 5)
    teacher = _maps(mask, 2, 8).requires_grad_(True)
    for student_maps in (teacher.detach().clone(), _maps(mask, 2, 9)):
        student = student_maps.requires_grad_(True)
        loss = attribution_loss(student, teacher, mask, reduction=reduction)
        loss.backward()
        assert torch.isfinite(loss)
        assert torch.isfinite(student.grad).all()
        assert teacher.grad is None
    assert student.grad.abs().sum() > 0


def test_attribution_rejects_bad_shapes():
    mask = _mask([4, 2], 4)
    maps = _maps(mask, 2, 10)
    with pytest.raises(ValueError, match="shapes"):
        attribution_loss(maps, maps[:, :1])
    with pytest.raises(ValueError, match="shapes"):
        attribution_loss(maps[:, 0], maps[:, 0])
    with pytest.raises(ValueError, match="attention_mask"):
        attribution_loss(maps, maps, mask[:, :3])
    with pytest.raises(ValueError, match="attention_mask"):
        attribution_loss(maps, maps, reduction="official")
    with pytest.raises(ValueError, match="reduction"):
        attribution_loss(maps, maps, mask, reduction="mean")


# ---------------------------------------------------------------- gradient alignment


def _direct_gradient(student, teacher, mask):
    total, real = 0.0, 0
    for b in range(student.shape[0]):
        for i in range(student.shape[1]):
            if mask[b, i]:
                gs, gt = student[b, i], teacher[b, i]
                us = gs / gs.norm() if gs.norm() > 0 else gs
                ut = gt / gt.norm() if gt.norm() > 0 else gt
                total += ((us - ut) ** 2).sum().item()
                real += 1
    return total / max(real, 1)


def test_gradient_alignment_matches_direct():
    g = _gen(11)
    mask = _mask([6, 3, 0], 6)
    student = torch.randn(3, 6, 5, dtype=DT, generator=g)
    teacher = 1e-4 * torch.randn(3, 6, 5, dtype=DT, generator=g)  # scale must not matter
    student[0, 2] = 0.0  # an exactly-zero gradient on a real token
    loss = gradient_alignment_loss(student, teacher, mask)
    direct = _direct_gradient(student, teacher, mask)
    assert direct > 0.5
    assert loss.item() == pytest.approx(direct, abs=1e-9)


def test_gradient_alignment_without_mask_serves_cls_gradients():
    """[B, M, d] gradients w.r.t. the [CLS] states of M layers: every position counts."""
    g = _gen(12)
    student = torch.randn(4, 3, 7, dtype=DT, generator=g)
    teacher = torch.randn(4, 3, 7, dtype=DT, generator=g)
    loss = gradient_alignment_loss(student, teacher)
    assert loss.item() == pytest.approx(
        _direct_gradient(student, teacher, torch.ones(4, 3)), abs=1e-9
    )
    assert gradient_alignment_loss(2.5 * teacher, teacher).item() < 1e-12


def test_gradient_alignment_extra_padding_changes_nothing():
    g = _gen(13)
    mask = _mask([5, 2], 5)
    student = torch.randn(2, 5, 4, dtype=DT, generator=g)
    teacher = torch.randn(2, 5, 4, dtype=DT, generator=g)
    before = gradient_alignment_loss(student, teacher, mask)
    garbage = 1e3 * torch.randn(2, 3, 4, dtype=DT, generator=g)
    after = gradient_alignment_loss(
        torch.cat([student, garbage], 1),
        torch.cat([teacher, garbage.flip(0)], 1),
        F.pad(mask, (0, 3)),
    )
    assert after.item() == pytest.approx(before.item(), abs=1e-6)


def test_gradient_alignment_zero_gradients_are_finite_and_teacher_detached():
    mask = _mask([4, 0], 4)  # includes an all-pad row
    for student_values, teacher_values in [
        (torch.zeros(2, 4, 3, dtype=DT), torch.zeros(2, 4, 3, dtype=DT)),
        (torch.zeros(2, 4, 3, dtype=DT), torch.randn(2, 4, 3, dtype=DT, generator=_gen(14))),
    ]:
        student = student_values.requires_grad_(True)
        teacher = teacher_values.requires_grad_(True)
        loss = gradient_alignment_loss(student, teacher, mask)
        loss.backward()
        assert torch.isfinite(loss)
        assert torch.isfinite(student.grad).all()
        assert teacher.grad is None
    assert gradient_alignment_loss(student_values, teacher_values, torch.zeros(2, 4)) == 0


def test_gradient_alignment_trains_the_student():
    g = _gen(15)
    student = torch.randn(2, 4, 3, generator=g, requires_grad=True)
    teacher = torch.randn(2, 4, 3, generator=g, requires_grad=True)
    gradient_alignment_loss(student, teacher, torch.ones(2, 4)).backward()
    assert student.grad.abs().sum() > 0
    assert teacher.grad is None


def test_gradient_alignment_rejects_bad_shapes():
    x = torch.randn(2, 4, 3)
    with pytest.raises(ValueError, match="widths differ"):
        gradient_alignment_loss(x, torch.randn(2, 4, 5))
    with pytest.raises(ValueError, match="shape mismatch"):
        gradient_alignment_loss(x, torch.randn(2, 5, 3))
    with pytest.raises(ValueError, match=r"\[B, L, d\]"):
        gradient_alignment_loss(x[0], x[0])
    with pytest.raises(ValueError, match="attention_mask"):
        gradient_alignment_loss(x, x, torch.ones(2, 3))


def test_unit_normalize_keeps_zero_at_zero_with_zero_gradient():
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0]], requires_grad=True)
    unit = unit_normalize(x)
    assert torch.equal(unit.detach(), torch.tensor([[0.6, 0.8], [0.0, 0.0]]))
    unit.sum().backward()
    assert torch.equal(x.grad[1], torch.zeros(2))
    assert torch.isfinite(x.grad).all()
