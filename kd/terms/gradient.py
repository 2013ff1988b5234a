"""Gradient alignment term of Gradient KD (Wang et al. 2022, GKD).

For every position the student's and the teacher's gradients are unit-normalised and compared:

    L_grad = Σ_{b,i} m_bi ‖ g_s/‖g_s‖ − g_t/‖g_t‖ ‖² / Σ_{b,i} m_bi

with ``g = ∂(Σ_b p_max)/∂e_bi`` the gradient w.r.t. the input embeddings (each model its own
``p_max``). The same function serves GKD-CLS: pass the layer-wise gradients w.r.t. the [CLS]
hidden states as ``[B, M, d]`` and ``attention_mask=None`` (every position counts).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["gradient_alignment_loss", "unit_normalize"]


def unit_normalize(x: Tensor, eps: float = 1e-12) -> Tensor:
    """Divide each vector along the last dimension by its L2 norm; vectors shorter than ``eps``
    become exactly zero, with a zero (never NaN or huge) gradient.

    Args:
        x: ``[..., d]``.
        eps: norms ``<= eps`` count as zero.

    Returns:
        ``[..., d]``, unit vectors or zeros.
    """
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    # clamp_min keeps the unselected branch finite, so its backward is 0, not 0·inf.
    inverse = torch.where(norm > eps, norm.clamp_min(eps).reciprocal(), 0.0)
    return x * inverse


def gradient_alignment_loss(
    student_grads: Tensor,
    teacher_grads: Tensor,
    attention_mask: Tensor | None = None,
    eps: float = 1e-12,
) -> Tensor:
    """GKD gradient alignment: mean squared distance between per-position unit gradients.

    Args:
        student_grads: ``[B, L, d]`` student gradients w.r.t. its input embeddings (built with
            ``create_graph=True`` so the loss trains the student), or ``[B, M, d]`` gradients
            w.r.t. the [CLS] states of ``M`` mapped layers.
        teacher_grads: ``[B, L, d]``, same shape; used detached.
        attention_mask: ``[B, L]`` real-token mask (1 real, 0 pad); ``None`` means every
            position is real.
        eps: gradients with a norm ``<= eps`` are treated as zero (their unit vector is 0, so
            such a position costs ``‖ĝ_other‖²``, 0 or 1).

    Returns:
        Scalar ``Σ m·‖ĝ_s − ĝ_t‖² / Σ m``; 0 when there is no real position.

    Raises:
        ValueError: on a shape mismatch, including different embedding widths (both gradients
            are taken w.r.t. input embeddings of the same width; GKD initialises the student's
            embeddings from the teacher's).
    """
    if student_grads.dim() != 3:
        raise ValueError(f"gradients must be [B, L, d], got {tuple(student_grads.shape)}")
    if student_grads.shape[-1] != teacher_grads.shape[-1]:
        raise ValueError(
            f"student and teacher gradient widths differ ({student_grads.shape[-1]} vs "
            f"{teacher_grads.shape[-1]}): gradient alignment compares gradients w.r.t. input "
            "embeddings of the same width"
        )
    if student_grads.shape != teacher_grads.shape:
        raise ValueError(
            f"shape mismatch: student {tuple(student_grads.shape)}, "
            f"teacher {tuple(teacher_grads.shape)}"
        )
    if attention_mask is None:
        mask = torch.ones(student_grads.shape[:2], dtype=torch.bool, device=student_grads.device)
    elif attention_mask.shape != student_grads.shape[:2]:
        raise ValueError(
            f"attention_mask must be {tuple(student_grads.shape[:2])}, "
            f"got {tuple(attention_mask.shape)}"
        )
    else:
        mask = attention_mask.bool()
    diff = unit_normalize(student_grads, eps) - unit_normalize(teacher_grads.detach(), eps)
    per_position = torch.where(mask, diff.pow(2).sum(-1), 0.0)
    return per_position.sum() / mask.sum().clamp_min(1)
