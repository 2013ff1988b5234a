"""The attribution settings shared by the CLI (``kdw attribute``), the Python API, the app and the
teacher caches, and the one function that turns them into maps for a batch."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from torch import Tensor
from transformers import PreTrainedModel

from workbench.attribution.gradients import _grad_saliency, attribution_maps
from workbench.attribution.targets import as_batch, resolve_views, view_names
from workbench.config import METHODS, AttributionConfig

__all__ = ["METHODS", "AttributionConfig", "compute_maps"]


def compute_maps(
    model: PreTrainedModel,
    batch: Mapping[str, Tensor],
    config: AttributionConfig,
    labels: Tensor | None = None,
    special_ids: Collection[int] | None = None,
) -> tuple[Tensor, list[str]]:
    """Maps ``[B, V, L]`` and view names for a batch (``input_ids``, ``attention_mask``, optional
    ``token_type_ids``) under ``config``: normalised IG maps or signed Grad saliency."""
    views = config.parsed_views()
    names = view_names(model, views)
    inputs = as_batch(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
    if config.method == "grad":
        targets = resolve_views(model, inputs, views, labels)
        saliency = _grad_saliency(
            model, inputs, targets, layer=config.layer, memory_mib=config.memory_mib
        )
        return saliency.transpose(0, 1), names
    maps = attribution_maps(
        model,
        batch["input_ids"],
        batch["attention_mask"],
        batch.get("token_type_ids"),
        views=views,
        labels=labels,
        steps=config.steps,
        baseline=config.baseline,
        top_k=config.top_k,
        layer=config.layer,
        special_ids=special_ids,
        memory_mib=config.memory_mib,
    )
    return maps, names
