"""Patient KD (Sun et al. 2019, METHODS.md §2): match normalised [CLS] states layer by layer."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def patient_loss(student_cls: Tensor, teacher_cls: Tensor, *, reduction: str = "paper") -> Tensor:
    """``Σ_j ‖ h_s[j]/‖h_s[j]‖ − h_t[j]/‖h_t[j]‖ ‖²`` over already-mapped layers.

    ``student_cls``, ``teacher_cls``: ``[B, M, d]`` ([CLS] vectors of the M mapped layers).
    ``paper``: summed over layers and dimensions, mean over the batch; ``official``: mean over
    ``B × M × d`` (the released code, hence its β of 100–1000). The teacher is detached.
    """
    if student_cls.shape != teacher_cls.shape:
        raise ValueError(
            f"Patient KD needs equal shapes; got student {tuple(student_cls.shape)} and teacher "
            f"{tuple(teacher_cls.shape)} (equal hidden sizes and mapped layer counts)"
        )
    difference = F.normalize(student_cls, dim=-1) - F.normalize(teacher_cls.detach(), dim=-1)
    squared = difference.pow(2)
    if reduction == "paper":
        return squared.sum((1, 2)).mean()
    if reduction == "official":
        return squared.mean()
    raise ValueError(f"unknown reduction {reduction!r}; use paper or official")
