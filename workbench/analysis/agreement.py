"""Agreement between two models' explanations of the same inputs (docs/methods.md §6).

- Saliency loyalty (GKD): Pearson correlation of the two models' Grad saliency over each
  example's real tokens, averaged over examples (tables show it ×100). Each model attributes its
  own predicted class unless ``target`` says otherwise.
- Attribution gap (AD-KD Eq. 11): per example the L2 distance of the concatenated normalised
  maps ``‖Ã_a − Ã_b‖₂``, averaged over examples.
- Rank correlation: Spearman correlation of the maps over real tokens, per example and view.

Per-example correlations are NaN where undefined (fewer than two real tokens, or a constant
map); means skip them and report how many were left out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from scipy import stats
from torch import Tensor
from transformers import PreTrainedModel

from workbench.analysis.attribution.gradients import grad_saliency
from workbench.analysis.attribution.settings import AttributionSettings, compute_maps
from workbench.analysis.attribution.targets import Target
from workbench.analysis.metrics import nan_mean
from workbench.core.errors import WorkbenchError

__all__ = [
    "attribution_gap",
    "compare_models",
    "correlation_per_row",
    "pearson_per_example",
    "rank_correlation",
    "saliency_loyalty",
]


def _check_shapes(a: Tensor, b: Tensor, mask: Tensor) -> None:
    if a.shape != b.shape or a.shape[0] != mask.shape[0] or a.shape[-1] != mask.shape[-1]:
        raise WorkbenchError(
            f"cannot compare maps {tuple(a.shape)} and {tuple(b.shape)} under a mask "
            f"{tuple(mask.shape)}: both need the same [B, (V,) L] shape on the same inputs"
        )


def correlation_per_row(
    a: Tensor, b: Tensor, attention_mask: Tensor, correlation: Callable[..., Any]
) -> Tensor:
    """``correlation`` (a ``scipy.stats`` test) of ``a`` and ``b`` ``[B, L]`` (or ``[B, V, L]``)
    over the real tokens of each row → ``[B]`` (or ``[B, V]``); NaN where undefined (fewer than
    two real tokens, or a constant side), on ``a``'s device."""
    _check_shapes(a, b, attention_mask)
    mask = attention_mask if a.dim() == 2 else attention_mask[:, None, :].expand_as(a)
    rows_a, rows_b = (x.detach().double().cpu().flatten(0, -2).numpy() for x in (a, b))
    kept = mask.bool().cpu().flatten(0, -2).numpy()
    out = np.full(len(rows_a), np.nan)
    for row, (x, y, real) in enumerate(zip(rows_a, rows_b, kept, strict=True)):
        x, y = x[real], y[real]
        if len(x) > 1 and np.ptp(x) > 0 and np.ptp(y) > 0:
            out[row] = correlation(x, y).statistic
    return torch.from_numpy(out).float().reshape(a.shape[:-1]).to(a.device)


def pearson_per_example(a: Tensor, b: Tensor, attention_mask: Tensor) -> Tensor:
    """Pearson correlation (``scipy.stats.pearsonr``) of ``a`` and ``b`` ``[B, L]`` (or
    ``[B, V, L]``) over the real tokens of each row → ``[B]`` (or ``[B, V]``); NaN where
    undefined."""
    return correlation_per_row(a, b, attention_mask, stats.pearsonr)


def rank_correlation(a: Tensor, b: Tensor, attention_mask: Tensor) -> Tensor:
    """Spearman correlation (``scipy.stats.spearmanr``, ties at their average rank) of maps
    ``[B, (V,) L]`` over real tokens → ``[B(, V)]``; NaN where undefined."""
    return correlation_per_row(a, b, attention_mask, stats.spearmanr)


def attribution_gap(maps_a: Tensor, maps_b: Tensor, attention_mask: Tensor) -> Tensor:
    """AD-KD Eq. 11 per example: ``‖Ã_a − Ã_b‖₂`` over the concatenated views of normalised
    maps ``[B, V, L]`` (real tokens only) → ``[B]``."""
    _check_shapes(maps_a, maps_b, attention_mask)
    difference = (maps_a - maps_b).detach() * attention_mask[:, None, :]
    return torch.linalg.vector_norm(difference.flatten(1), dim=1)


def saliency_loyalty(
    model_a: PreTrainedModel,
    model_b: PreTrainedModel,
    batch: Mapping[str, Tensor],
    *,
    target: Target = "pred",
) -> Tensor:
    """Per-example Pearson correlation ``[B]`` of the Grad saliency of two models (each its own
    prediction with ``target="pred"``) over real tokens; average with NaNs skipped."""
    inputs = (batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
    a, b = (grad_saliency(model, *inputs, target=target) for model in (model_a, model_b))
    return pearson_per_example(a, b, batch["attention_mask"])


def compare_models(
    model_a: PreTrainedModel,
    model_b: PreTrainedModel,
    batch: Mapping[str, Tensor],
    config: AttributionSettings | None = None,
    labels: Tensor | None = None,
) -> dict[str, float]:
    """Saliency loyalty (×100), attribution gap and mean Spearman of the maps of two models on
    one batch; the maps are IG's with its defaults, under ``config`` (default: all views)."""
    config = config or AttributionSettings()
    mask = batch["attention_mask"]
    loyalty, loyalty_undefined = nan_mean(saliency_loyalty(model_a, model_b, batch))
    maps_a, _ = compute_maps(model_a, batch, config, labels)
    maps_b, _ = compute_maps(model_b, batch, config, labels)
    spearman, spearman_undefined = nan_mean(rank_correlation(maps_a, maps_b, mask))
    return {
        "saliency_loyalty": 100 * loyalty,
        "saliency_loyalty_undefined": loyalty_undefined,
        "attribution_gap": float(attribution_gap(maps_a, maps_b, mask).mean()),
        "spearman": spearman,
        "spearman_undefined": spearman_undefined,
    }
