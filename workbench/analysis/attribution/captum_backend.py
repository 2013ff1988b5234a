"""Captum paths for analysis: Integrated Gradients and Grad saliency as Captum computes them.

The app, training and the exports all use the engine of
:mod:`workbench.analysis.attribution.gradients` (batched over steps and views, differentiable); the
tests pin it to these functions, which users may also call for a Captum-computed reference (IG needs
``steps >= 2``: Captum asserts ``n_steps > 1``).

- Pad baselines: :class:`captum.attr.LayerIntegratedGradients` on the site module (embeddings or
  an encoder layer) with the baseline *token ids* as ``baselines``: Captum runs them through the
  model itself to get the site's baseline, so our baseline construction is checked too.
- Zero and mean-keep-first baselines: no input ids map to them, so
  :class:`captum.attr.IntegratedGradients` integrates over the site tensor fed through the
  output-replacing hook, from the engine's baseline.
"""

from __future__ import annotations

from collections.abc import Collection

from captum.attr import IntegratedGradients, LayerGradientXActivation, LayerIntegratedGradients
from torch import Tensor
from transformers import PreTrainedModel

from workbench.analysis.attribution.baselines import (
    baseline_ids,
    baseline_output,
    resolve_baseline,
    site_module,
    site_output,
)
from workbench.analysis.attribution.explainers import Probabilities
from workbench.analysis.attribution.targets import Target, as_batch, check_layer, resolve_target
from workbench.core.errors import WorkbenchError

__all__ = ["captum_grad_saliency", "captum_integrated_gradients"]


def captum_integrated_gradients(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor,
    token_type_ids: Tensor | None = None,
    *,
    target: Target,
    steps: int,
    baseline: str | None = None,
    layer: int | None = None,
    special_ids: Collection[int] | None = None,
    internal_batch_size: int | None = None,
) -> Tensor:
    """Captum's IG (``method="riemann_right"``) with the meaning of
    :func:`~workbench.analysis.attribution.integrated_gradients` → ``[B, L, d]``, zero at padding.

    ``steps`` must be at least 2 (Captum's limit); ``internal_batch_size`` chunks the
    step × example rows as Captum does. No ``create_graph``: Captum does not keep the graph.
    """
    if not isinstance(steps, int) or steps < 2:
        raise WorkbenchError(
            f"Captum's IG needs steps >= 2 (got {steps!r}); use integrated_gradients for 1 step"
        )
    baseline = resolve_baseline(model, baseline)
    check_layer(model, layer)
    batch = as_batch(input_ids, attention_mask, token_type_ids)
    targets = resolve_target(model, batch, target)
    extra = (attention_mask, token_type_ids)
    options = {
        "target": targets,
        "n_steps": steps,
        "method": "riemann_right",
        "internal_batch_size": internal_batch_size,
    }
    if baseline in ("zero", "mean-keep-first"):
        site = site_output(model, batch, layer).detach()
        start = baseline_output(model, batch, baseline, layer, special_ids, site).detach()
        ig = IntegratedGradients(Probabilities(model, site=site_module(model, layer))).attribute(
            site, baselines=start, additional_forward_args=(input_ids, *extra), **options
        )
    else:
        ig = LayerIntegratedGradients(Probabilities(model), site_module(model, layer)).attribute(
            input_ids,
            baselines=baseline_ids(model, batch, baseline, special_ids),
            additional_forward_args=extra,
            attribute_to_layer_input=False,
            **options,
        )
    return ig.detach() * attention_mask[:, :, None]


def captum_grad_saliency(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor,
    token_type_ids: Tensor | None = None,
    *,
    target: Target = "pred",
) -> Tensor:
    """Grad saliency by Captum's :class:`~captum.attr.LayerGradientXActivation` on the
    embeddings module, summed over ``d`` → ``[B, L]``, zero at padding."""
    batch = as_batch(input_ids, attention_mask, token_type_ids)
    targets = resolve_target(model, batch, target)
    layer = LayerGradientXActivation(Probabilities(model), site_module(model, None))
    extra = (attention_mask, token_type_ids)
    attributions = layer.attribute(input_ids, target=targets, additional_forward_args=extra)
    return attributions.detach().sum(-1) * attention_mask
