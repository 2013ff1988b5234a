"""The attribution settings shared by the CLI (``kdw attribute``), the Python API, the app and the
teacher caches, and the one function that turns them into maps for a batch."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping

import torch
from torch import Tensor
from transformers import PreTrainedModel

from workbench.analysis.attribution.baselines import resolve_baseline
from workbench.analysis.attribution.explainers import explain_batch
from workbench.analysis.attribution.gradients import PathOptions, _grad_saliency, attribution_maps
from workbench.analysis.attribution.registry import AttributionSettings, ExplainerChoice
from workbench.analysis.attribution.targets import as_batch, resolve_views, view_names
from workbench.core.config import to_dict
from workbench.core.errors import WorkbenchError

__all__ = ["baseline_resolved", "check_layer", "compute_maps", "recorded_settings"]


def check_layer(config: AttributionSettings, explainer: ExplainerChoice) -> None:
    """Refuse ``config.layer`` for an explainer that attributes at the embeddings only."""
    if config.layer is not None and not explainer.explainer.layered:
        raise WorkbenchError(
            f"--layer sets the ig and grad maps, not the {explainer.name} explainer's: leave it "
            "out (or use --explainer ig)"
        )


def baseline_resolved(model: PreTrainedModel, explainer: ExplainerChoice) -> ExplainerChoice:
    """``explainer`` with, for IG, the baseline ``model`` gets in place of None
    (:func:`resolve_baseline`): what a record says."""
    if explainer.name != "ig":
        return explainer
    baseline = resolve_baseline(model, explainer.settings.baseline)
    return ExplainerChoice("ig", dataclasses.replace(explainer.settings, baseline=baseline))


def recorded_settings(
    config: AttributionSettings, explainer: ExplainerChoice, words: str | None
) -> dict:
    """What an output records: the config, the explainer and its settings, and the word
    aggregation (``"tokens"``: none)."""
    return {**to_dict(config), **explainer.record(), "words": words or "tokens"}


def compute_maps(
    model: PreTrainedModel,
    batch: Mapping[str, Tensor],
    config: AttributionSettings,
    labels: Tensor | None = None,
    special_ids: Collection[int] | None = None,
    explainer: ExplainerChoice | None = None,
) -> tuple[Tensor, list[str]]:
    """Maps ``[B, V, L]`` and view names for a batch (``input_ids``, ``attention_mask``, optional
    ``token_type_ids``) under ``config`` and ``explainer`` (default: ig with its defaults):
    normalised IG maps (every view in the engine's batched passes), signed Grad saliency, or
    the scores of another registered explainer (one call per view)."""
    explainer = explainer or ExplainerChoice()
    check_layer(config, explainer)
    views = config.views
    names = view_names(model, views)
    inputs = as_batch(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
    path = {"layer": config.layer, "memory_mib": config.memory_mib}
    if explainer.name == "ig":  # its settings: steps, baseline, top_k
        ig = dataclasses.asdict(explainer.settings)
        maps = attribution_maps(
            model,
            *inputs.values(),
            views=views,
            labels=labels,
            special_ids=special_ids,
            **ig,
            **path,
        )
        return maps, names
    targets = resolve_views(model, inputs, views, labels)
    if explainer.name == "grad":
        saliency = _grad_saliency(model, inputs, targets, PathOptions(**path))
        return saliency.transpose(0, 1), names
    maps = [
        explain_batch(model, inputs, explainer, target=targets[:, v], special_ids=special_ids)
        for v in range(targets.shape[1])
    ]
    return torch.stack(maps, 1), names
