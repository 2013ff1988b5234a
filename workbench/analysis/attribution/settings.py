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
from workbench.analysis.attribution.registry import (
    ENGINE_EXPLAINERS,
    AttributionSettings,
    ExplainerChoice,
    MapSettings,
)
from workbench.analysis.attribution.targets import as_batch, resolve_views, view_names
from workbench.core.config import option_name, to_dict
from workbench.core.errors import WorkbenchError

__all__ = ["baseline_resolved", "compute_maps", "recorded_settings", "resolve_explainer"]

MAP_DEFAULTS = {f.name: f.default for f in dataclasses.fields(MapSettings)}


def resolve_explainer(
    config: MapSettings, explainer: ExplainerChoice | None
) -> tuple[MapSettings, ExplainerChoice]:
    """``config`` and the explainer that computes its maps, reconciled: no explainer — the one
    ``config.method`` names (ig with its steps, baseline and K, or grad); ig or grad — ``config``
    takes its method and settings; any other — ``config``'s map settings must be at their
    defaults (or equal to the explainer's own, such as its baseline) and its layer None. A
    setting given twice with two values is a one-line error."""
    if explainer is None:
        values = {k: getattr(config, k) for k in ("steps", "baseline", "top_k")}
        return config, ExplainerChoice(config.method, values if config.method == "ig" else None)
    given = {k: getattr(config, k) for k in MAP_DEFAULTS if getattr(config, k) != MAP_DEFAULTS[k]}
    own = dataclasses.asdict(explainer.settings)
    if explainer.name not in ENGINE_EXPLAINERS:
        given = {k: v for k, v in given.items() if k not in own or own[k] != v}
        if getattr(config, "layer", None) is not None:
            given = {"layer": config.layer, **given}
        if given:
            name = next(iter(given))
            raise WorkbenchError(
                f"{option_name(name)} sets the ig and grad maps, not the {explainer.name} "
                f"explainer's: leave it out (or use --explainer ig)"
            )
        return config, explainer
    wanted = {"method": explainer.name, **own}
    for name, value in given.items():
        if name in wanted and wanted[name] != value:
            raise WorkbenchError(
                f"{option_name(name)} {value} and the explainer's {name} {wanted[name]} "
                "disagree: give it once"
            )
    return dataclasses.replace(config, **wanted), explainer


def baseline_resolved(
    model: PreTrainedModel, config: AttributionSettings, explainer: ExplainerChoice
) -> tuple[AttributionSettings, ExplainerChoice]:
    """``config`` and ``explainer`` (as :func:`resolve_explainer` gives them) with, for IG, the
    baseline ``model`` gets in place of None (:func:`resolve_baseline`): what a record says."""
    if explainer.name != "ig":
        return config, explainer
    baseline = resolve_baseline(model, config.baseline)
    settings = dataclasses.replace(explainer.settings, baseline=baseline)
    return dataclasses.replace(config, baseline=baseline), ExplainerChoice("ig", settings)


def recorded_settings(
    config: AttributionSettings, explainer: ExplainerChoice, words: str | None
) -> dict:
    """What an output records: the resolved config (without the ig/grad map settings for
    another explainer), the explainer and its settings, and the word aggregation (``"tokens"``:
    none)."""
    values = to_dict(config)
    if explainer.name not in ENGINE_EXPLAINERS:
        values = {k: v for k, v in values.items() if k not in MAP_DEFAULTS}
    return {**values, **explainer.record(), "words": words or "tokens"}


def compute_maps(
    model: PreTrainedModel,
    batch: Mapping[str, Tensor],
    config: AttributionSettings,
    labels: Tensor | None = None,
    special_ids: Collection[int] | None = None,
    explainer: ExplainerChoice | None = None,
) -> tuple[Tensor, list[str]]:
    """Maps ``[B, V, L]`` and view names for a batch (``input_ids``, ``attention_mask``, optional
    ``token_type_ids``) under ``config``: normalised IG maps or signed Grad saliency, or the
    scores of another registered ``explainer`` (one call per view)."""
    config, explainer = resolve_explainer(config, explainer)
    views = config.views
    names = view_names(model, views)
    inputs = as_batch(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
    if explainer.name not in ENGINE_EXPLAINERS:
        targets = resolve_views(model, inputs, views, labels)
        maps = [
            explain_batch(model, inputs, explainer, target=targets[:, v], special_ids=special_ids)
            for v in range(targets.shape[1])
        ]
        return torch.stack(maps, 1), names
    if config.method == "grad":
        targets = resolve_views(model, inputs, views, labels)
        path = PathOptions(layer=config.layer, memory_mib=config.memory_mib)
        saliency = _grad_saliency(model, inputs, targets, path)
        return saliency.transpose(0, 1), names
    options = {k: getattr(config, k) for k in ("steps", "baseline", "top_k", "layer", "memory_mib")}
    maps = attribution_maps(
        model, *inputs.values(), views=views, labels=labels, special_ids=special_ids, **options
    )
    return maps, names
