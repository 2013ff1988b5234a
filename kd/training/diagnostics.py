"""What dominates an objective: each term's weighted value and its part of the gradient.

For terms ``k`` with weights ``w_k`` and values ``L_k``, the gradient of the objective on the
student's trainable parameters ``θ`` is ``g = Σ_k g_k`` with ``g_k = ∇_θ (w_k L_k)``. Per term
this reports

- ``value/<k>``: ``w_k L_k``, the term's part of the loss;
- ``grad_norm/<k>``: ``‖g_k‖₂``, and ``grad_norm/total``: ``‖g‖₂`` (before any clipping);
- ``grad_share/<k>``: ``⟨g_k, g⟩ / ‖g‖²``, the term's share of the step's gradient. The shares
  sum to 1; a share above 1 with another below 0 means the terms pull in opposite directions.

The gradients are taken with ``retain_graph=True`` and thrown away: the training step's own
backward pass is unchanged, so logging diagnostics never changes the trained weights.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch
from torch import Tensor, nn

__all__ = ["gradient_summary", "summarise", "term_diagnostics", "term_gradients"]


def term_gradients(
    values: Mapping[str, Tensor], weights: Mapping[str, float], parameters: Iterable[nn.Parameter]
) -> dict[str, Tensor]:
    """Each weighted term's gradient ``g_k = ∇_θ (w_k L_k)``, flattened over the parameters
    ``θ`` that require gradients: ``{k: g_k}``, each ``[P]`` float64 (``P`` trainable values;
    the gradients of micro-batches or processes add up to the step's), for the scalar term
    values ``L_k`` in ``values`` (with their graphs) of the terms in ``weights`` (``w_k``)."""
    params = [p for p in parameters if p.requires_grad]
    flat: dict[str, Tensor] = {}
    for name, weight in weights.items():
        weighted = weight * values[name]
        grads = (  # zeros for the parameters the term does not reach
            torch.autograd.grad(weighted, params, retain_graph=True, materialize_grads=True)
            if weighted.requires_grad
            else [torch.zeros_like(p) for p in params]
        )
        flat[name] = torch.cat([g.detach().reshape(-1).double() for g in grads])
    return flat


def gradient_summary(
    flat: Mapping[str, Tensor], weighted: Mapping[str, float], total: Tensor | None = None
) -> dict[str, float]:
    """Diagnostics from the gradients ``flat`` (``{k: [P]}``) of some or all terms, the weighted
    values ``weighted`` (``{k: w_k L_k}``) of all, and the whole gradient ``total`` ``[P]``
    (default: the sum of ``flat``, which must then hold every term): ``{"value/k",
    "grad_norm/k", "grad_share/k", "grad_norm/total"}``; shares are 0 when the whole gradient is
    0, and left out when it is not finite (an fp16 step that overflowed)."""
    out = {f"value/{name}": float(value) for name, value in weighted.items()}
    total = torch.stack(list(flat.values())).sum(0) if total is None else total
    total_sq = float(total @ total)
    if not math.isfinite(total_sq):
        return out
    for name, g in flat.items():
        out[f"grad_norm/{name}"] = float(g.norm())
        out[f"grad_share/{name}"] = float(g @ total) / total_sq if total_sq > 0 else 0.0
    out["grad_norm/total"] = total_sq**0.5
    return out


def term_diagnostics(
    values: Mapping[str, Tensor], weights: Mapping[str, float], parameters: Iterable[nn.Parameter]
) -> dict[str, float]:
    """Weighted values, gradient norms and gradient shares of the terms of one step
    (:func:`term_gradients`' arguments; :func:`gradient_summary`'s result)."""
    weighted = {name: float(weight * values[name].detach()) for name, weight in weights.items()}
    return gradient_summary(term_gradients(values, weights, parameters), weighted)


def summarise(records: Iterable[Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """First and last diagnostic record of a run (``metrics.jsonl`` rows with ``value/`` keys):
    ``{"start": {...}, "end": {...}}`` with the step and every diagnostic of each."""
    logged = [r for r in records if any(k.startswith("grad_share/") for k in r)]
    if not logged:
        return {}

    def pick(record: Mapping[str, float]) -> dict[str, float]:
        keep = ("value/", "grad_norm/", "grad_share/")
        return {"step": record["step"], **{k: v for k, v in record.items() if k.startswith(keep)}}

    return {"start": pick(logged[0]), "end": pick(logged[-1])}
