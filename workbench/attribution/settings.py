"""The attribution settings shared by the CLI (``kdw attribute``), the Python API, the app and the
teacher caches, and the one function that turns them into maps for a batch."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from torch import Tensor
from transformers import PreTrainedModel

from workbench.attribution.gradients import (
    BASELINES,
    VIEWS,
    Views,
    _batch,
    _check_baseline,
    _check_steps,
    _grad_saliency,
    attribution_maps,
    resolve_views,
    view_names,
)
from workbench.config import option
from workbench.errors import WorkbenchError

METHODS = ("ig", "grad")

__all__ = ["METHODS", "AttributionConfig", "compute_maps"]


@dataclass
class AttributionConfig:
    """How tokens are attributed: method, path, baseline, views and layer."""

    method: str = option(
        "ig",
        "ig: Integrated Gradients maps (per token ‖TopK(|IG|)‖₂, unit norm per view); "
        "grad: Grad saliency (gradient × input summed over dimensions, signed)",
        choices=METHODS,
    )
    steps: int = option(1, "IG interpolation steps m (right Riemann sum); 1 = (E − E')⊙∇F(E)")
    baseline: str = option(
        "pad",
        "IG baseline: pad (embedding output of an all-[PAD] sequence), pad-keep-special "
        "([CLS]/[SEP] kept), zero (the AD-KD authors' code)",
        choices=BASELINES,
    )
    top_k: int | None = option(
        None, "keep the K largest |IG| dimensions per token before the norm (None: all)"
    )
    views: str = option(
        "all",
        "classes attributed: all, pred, gold (needs labels), or class indices such as 0,2",
    )
    layer: int | None = option(
        None, "attribute w.r.t. this encoder layer's output (0-based; None: embedding output)"
    )
    max_length: int = option(128, "maximum tokens per text; longer texts are truncated (flagged)")
    batch_size: int = option(16, "texts per batch (padded per batch to its longest text)")
    memory_mib: float = option(
        1024.0, "memory budget for one chunk of the step × example batch, in MiB (estimated)"
    )

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise WorkbenchError(f"unknown method {self.method!r}: use {' or '.join(METHODS)}")
        _check_steps(self.steps)
        _check_baseline(self.baseline)
        if self.top_k is not None and self.top_k < 1:
            raise WorkbenchError(f"top_k must be >= 1 or None, got {self.top_k}")
        self.parsed_views()

    def parsed_views(self) -> Views:
        """``views`` as :func:`~workbench.attribution.attribution_maps` takes it."""
        if self.views in VIEWS:
            return self.views
        parts = [part.strip() for part in str(self.views).split(",")]
        if not all(part.isdigit() for part in parts):
            raise WorkbenchError(
                f"unknown views {self.views!r}: use {', '.join(VIEWS)} or class indices like 0,2"
            )
        return [int(part) for part in parts]

    def key(self) -> dict:
        """The settings that change the maps (the key of cached maps)."""
        keep = ("method", "steps", "baseline", "top_k", "views", "layer")
        if self.method == "grad":
            keep = ("method", "views", "layer")
        return {name: getattr(self, name) for name in keep}


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
    inputs = _batch(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
    if config.method == "grad":
        targets = resolve_views(model, inputs, views, labels)
        saliency = _grad_saliency(model, inputs, targets, layer=config.layer,
                                  memory_mib=config.memory_mib)
        return saliency.transpose(0, 1), names
    maps = attribution_maps(
        model, batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"),
        views=views, labels=labels, steps=config.steps,
        baseline=config.baseline, top_k=config.top_k, layer=config.layer,
        special_ids=special_ids, memory_mib=config.memory_mib,
    )
    return maps, names
