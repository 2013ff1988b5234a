"""Attribution term of Attribution-driven KD (Wu et al. 2023, AD-KD).

The maps come from the attribution code: per view ``c`` (a class) and token ``i`` the teacher's
``‖TopK(|IG_i|)‖₂`` and the student's ``‖IG_i‖₂``, each view L2-normalised over the real tokens
of its sequence, pads exactly 0. This module only compares them:

- ``reduction="paper"`` (Eq. 9): ``mean_b ‖Ã_t[b] − Ã_s[b]‖₂`` where ``Ã[b]`` concatenates the
  ``C`` views of example ``b`` (a flat vector of ``C·L`` values).
- ``reduction="squared"``: Eq. 9 squared, ``mean_b ‖Ã_t[b] − Ã_s[b]‖₂²`` — linear in the views'
  squared distances, so a uniformly sampled view weighted by ``C`` estimates it without bias
  (view sampling, beyond the paper).
- ``reduction="official"`` (released code): ``Σ_c MSE_sum(ã_s^c, ã_t^c) / #real tokens`` — squared
  errors summed over views, tokens and the batch, divided by the number of real tokens.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = ["attribution_loss"]


def attribution_loss(
    student_maps: Tensor,
    teacher_maps: Tensor,
    attention_mask: Tensor | None = None,
    *,
    reduction: Literal["paper", "squared", "official"] = "paper",
) -> Tensor:
    """Distance between normalised multi-view attribution maps.

    Args:
        student_maps: ``[B, C, L]`` student maps (differentiable), one row per view.
        teacher_maps: ``[B, C, L]`` teacher maps; used detached.
        attention_mask: ``[B, L]`` real-token mask. Optional for ``"paper"`` (when given,
            positions it marks as pads are ignored whatever they hold); required for
            ``"official"``, whose denominator is the number of real tokens.
        reduction: ``"paper"`` — per-example L2 norm of the difference of the concatenated
            views, mean over the batch (an all-pad example counts as 0); ``"squared"`` — its
            square, per example, mean over the batch; ``"official"`` — squared error summed
            over views and real tokens, divided by ``Σ mask``.

    Returns:
        Scalar loss (0 when ``"official"`` sees no real token).

    Raises:
        ValueError: on mismatched or non-``[B, C, L]`` shapes, a mask that is not ``[B, L]``,
            a missing mask for ``"official"``, or an unknown reduction.
    """
    if student_maps.dim() != 3 or student_maps.shape != teacher_maps.shape:
        raise ValueError(
            "maps must both be [B, C, L] with equal shapes, got student "
            f"{tuple(student_maps.shape)} and teacher {tuple(teacher_maps.shape)}"
        )
    if reduction not in ("paper", "squared", "official"):
        raise ValueError(f"reduction must be 'paper', 'squared' or 'official', got {reduction!r}")
    batch, _, length = student_maps.shape
    if attention_mask is None:
        if reduction == "official":
            raise ValueError("reduction='official' needs attention_mask to count real tokens")
        mask = torch.ones(batch, length, dtype=torch.bool, device=student_maps.device)
    elif attention_mask.shape != (batch, length):
        raise ValueError(
            f"attention_mask must be {(batch, length)}, got {tuple(attention_mask.shape)}"
        )
    else:
        mask = attention_mask.bool()
    diff = torch.where(mask[:, None, :], student_maps - teacher_maps.detach(), 0.0)
    if reduction == "paper":
        # vector_norm's backward is 0 (not NaN) where the difference is exactly zero.
        return torch.linalg.vector_norm(diff.flatten(1), dim=1).mean()
    if reduction == "squared":
        return diff.pow(2).flatten(1).sum(1).mean()
    return diff.pow(2).sum() / mask.sum().clamp_min(1)
