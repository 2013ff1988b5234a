"""Relation geometry of hidden states: pairwise distances and windowed angles.

For a sequence ``r_1..r_S`` with a real-position mask (tokens of one layer, or one token's
representations across layers):

- pair relation ``ψ_P(r_i, r_j)`` for real ``i ≠ j``: cosine distance ``1 − cos(r_i, r_j)``
  (``"cosine"``), Euclidean distance (``"l2"``), or Euclidean distance over its mean on the
  sequence's valid pairs (``"l2_mean"``);
- triple relation ``ψ_T(r_i, r_j, r_k) = cos∠(r_j − r_i, r_k − r_i)`` for real ``i, j, k`` with
  ``j ≠ i``, ``k ≠ i`` and ``|i − j| ≤ δ``, ``|i − k| ≤ δ``, in a banded layout.

The app's geometry page shows these matrices; Contextual KD (:mod:`kd.methods.ckd`) compares
the teacher's with the student's. Cost: pairs are ``[N, S, S]``; triples are built inside a band
of ``W = 2δ + 1`` positions, ``O(N·S·W·d)`` memory, never ``[N, S, S, S]``.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

PairKind = Literal["cosine", "l2", "l2_mean"]

DEFAULT_WINDOW = 10
"""Half-width δ of the WR angle window: 21 tokens, the wide end of the paper's 10–21."""


def real_mask(mask: Tensor | None, batch: int, length: int, device: torch.device) -> Tensor:
    """``[batch, length]`` bool mask from an optional 0/1 or bool mask (``None``: all real)."""
    if mask is None:
        return torch.ones(batch, length, dtype=torch.bool, device=device)
    if mask.shape != (batch, length):
        raise ValueError(f"attention_mask must be {(batch, length)}, got {tuple(mask.shape)}")
    return mask.bool()


def pair_validity(mask: Tensor) -> Tensor:
    """Valid pairs: both positions real and distinct.

    Args:
        mask: ``[N, S]`` bool.

    Returns:
        ``[N, S, S]`` bool, ``valid[n, i, j] = m_ni ∧ m_nj ∧ i ≠ j``.
    """
    distinct = ~torch.eye(mask.shape[-1], dtype=torch.bool, device=mask.device)
    return mask.unsqueeze(-1) & mask.unsqueeze(-2) & distinct


def _cosine_matrix(x: Tensor, eps: float = 1e-12) -> Tensor:
    """Cosines between all pairs of vectors: ``[..., n, d]`` → ``[..., n, n]``.

    One batched matmul gives the Gram matrix; its diagonal gives the norms, so normalising
    happens on the ``n × n`` result instead of the ``n × d`` input (same values, one fewer pass
    over the large tensor). Vectors with norm ``<= eps`` (e.g. a zero difference) give cosine 0
    and a zero gradient.
    """
    gram = x @ x.transpose(-1, -2)
    sq_norm = gram.diagonal(dim1=-2, dim2=-1)
    # clamp_min keeps the unselected branch finite, so its backward is 0, not 0·inf.
    inverse = torch.where(sq_norm > eps**2, sq_norm.clamp_min(eps**2).rsqrt(), 0.0)
    return gram * inverse.unsqueeze(-1) * inverse.unsqueeze(-2)


def _euclidean_distances(h: Tensor, mask: Tensor) -> Tensor:
    """``[N, S, S]`` Euclidean distances from a Gram matrix (no ``[N, S, S, d]`` tensor).

    Vectors are first centred on the mean of the real positions (distances are translation
    invariant) to limit cancellation; the square root has a zero gradient at zero distance.
    """
    weights = mask.to(h.dtype).unsqueeze(-1)
    centre = (h * weights).sum(-2, keepdim=True) / weights.sum(-2, keepdim=True).clamp_min(1.0)
    x = h - centre
    sq_norm = x.pow(2).sum(-1)
    sq = (sq_norm.unsqueeze(-1) + sq_norm.unsqueeze(-2) - 2 * x @ x.transpose(-1, -2)).clamp_min(0)
    positive = sq > 0
    return torch.where(positive, torch.where(positive, sq, 1.0).sqrt(), 0.0)


def pairwise_distance_relation(
    h: Tensor, mask: Tensor | None = None, kind: PairKind = "cosine"
) -> tuple[Tensor, Tensor]:
    """Pair relation ``ψ_P`` over a batch of sequences.

    Args:
        h: ``[N, S, d]`` vectors.
        mask: ``[N, S]`` real-position mask (``None``: all real).
        kind: ``"cosine"`` (``1 − cos``), ``"l2"`` (Euclidean distance) or ``"l2_mean"``
            (Euclidean distance over its mean on the sequence's valid pairs; a sequence whose
            mean is 0 is left unscaled).

    Returns:
        ``(relation, valid)``, both ``[N, S, S]``; ``relation`` is 0 wherever ``valid``
        (see :func:`pair_validity`) is False.
    """
    if kind not in ("cosine", "l2", "l2_mean"):
        raise ValueError(f"pair kind must be 'cosine', 'l2' or 'l2_mean', got {kind!r}")
    m = real_mask(mask, h.shape[0], h.shape[1], h.device)
    valid = pair_validity(m)
    relation = 1.0 - _cosine_matrix(h) if kind == "cosine" else _euclidean_distances(h, m)
    relation = torch.where(valid, relation, 0.0)
    if kind == "l2_mean":
        mean = relation.sum((-2, -1)) / valid.sum((-2, -1)).clamp_min(1)
        relation = relation / torch.where(mean > 0, mean, 1.0)[:, None, None]
    return relation, valid


def windowed_angle_relation(
    h: Tensor, mask: Tensor | None = None, window: int = DEFAULT_WINDOW
) -> tuple[Tensor, Tensor]:
    """Triple relation ``ψ_T`` inside a band, in a banded layout.

    Entry ``[n, i, a, b]`` is ``cos∠(r_j − r_i, r_k − r_i)`` with ``j = i + a − δ`` and
    ``k = i + b − δ``: the ``W`` difference vectors of each centre go through one batched matmul
    and are normalised by the norms on its diagonal (a zero difference gives angle 0).

    Args:
        h: ``[N, S, d]`` vectors.
        mask: ``[N, S]`` real-position mask (``None``: all real).
        window: half-width ``δ ≥ 1``; the band holds ``W = 2δ + 1`` positions.

    Returns:
        ``(angles, valid)``, both ``[N, S, W, W]``; ``valid`` requires ``i, j, k`` real and
        inside the sequence, ``j ≠ i`` and ``k ≠ i``; ``angles`` is 0 where not valid.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    m = real_mask(mask, h.shape[0], h.shape[1], h.device)
    width = 2 * window + 1
    if h.shape[1] == 0:  # no position (a batch without a shared word): no triple
        empty = h.new_zeros(h.shape[0], 0, width, width)
        return empty, empty.bool()
    # unfold gives [N, S, d, W] views of the zero-padded sequence; the difference is [N, S, W, d].
    neighbours = F.pad(h, (0, 0, window, window)).unfold(1, width, 1).transpose(-1, -2)
    angles = _cosine_matrix(neighbours - h.unsqueeze(-2))
    real_neighbour = F.pad(m.to(torch.uint8), (window, window)).unfold(1, width, 1).bool()
    off_centre = torch.arange(width, device=h.device) != window
    neighbour = real_neighbour & off_centre & m.unsqueeze(-1)
    valid = neighbour.unsqueeze(-1) & neighbour.unsqueeze(-2)
    return torch.where(valid, angles, 0.0), valid


def dense_angles(angles: Tensor, valid: Tensor, centre: int) -> Tensor:
    """The ``S × S`` angle matrix of one centre position from the banded layout.

    Args:
        angles, valid: ``[S, W, W]`` (one sequence of :func:`windowed_angle_relation`).
        centre: position ``i``.

    Returns:
        ``[S, S]`` with ``cos∠(r_j − r_i, r_k − r_i)`` at ``[j, k]``, NaN outside the window or
        where not valid (so plots leave those cells blank).
    """
    length, width = angles.shape[0], angles.shape[1]
    window = (width - 1) // 2
    out = torch.full((length, length), float("nan"), dtype=angles.dtype)
    positions = torch.arange(width) + centre - window
    inside = (positions >= 0) & (positions < length)
    rows = positions[inside]
    block = torch.where(valid[centre], angles[centre], torch.nan)[inside][:, inside]
    out[rows[:, None], rows[None, :]] = block
    return out
