"""The registered explainers' functions (:mod:`workbench.analysis.attribution.registry` names them):
each ``(model, batch, targets [B], settings, special [B, L] bool) -> scores [B, L]``, zero at
padding; :func:`explain_batch` runs one on a batch.

``ig`` is the engine's map (non-negative, unit norm); the other gradient explainers sum their
``[B, L, d]`` attribution of the target probability over ``d`` (signed); the perturbation ones
replace a token by the model's [PAD] id (still attended; [CLS]/[SEP] never removed, scored 0)
and give signed drops. Scores, removal, seeding and DeepLift's limits on transformers:
docs/explainers.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np
import torch
from captum._utils.models.linear_model import SkLearnRidge
from captum.attr import (
    FeatureAblation,
    GradientShap,
    KernelShap,
    LayerDeepLift,
    LayerGradientXActivation,
    Lime,
    Occlusion,
)
from torch import Tensor, nn
from transformers import PreTrainedModel

from workbench.analysis.attribution.baselines import (
    baseline_ids,
    baseline_output,
    pad_id,
    site_module,
    special_positions,
)
from workbench.analysis.attribution.gradients import (
    PathOptions,
    _grad_saliency,
    _integrated_gradients,
    attribution_map,
)
from workbench.analysis.attribution.registry import (
    DeepLiftSettings,
    ExplainerChoice,
    GradientShapSettings,
    IGSettings,
    OcclusionSettings,
    SamplingSettings,
)
from workbench.analysis.attribution.targets import (
    Batch,
    Target,
    as_batch,
    check_top_k,
    is_regression,
    resolve_target,
)
from workbench.core.errors import WorkbenchError, first_line
from workbench.core.models import embed, forward, output_replaced

__all__ = ["Probabilities", "explain_batch", "lime_explainer", "seeded", "token_features"]

PERTURBATIONS_PER_EVAL = 32  # perturbed texts per forward pass (results do not depend on it)


def explain_batch(
    model: PreTrainedModel,
    batch: Batch,
    choice: ExplainerChoice | str = "ig",
    *,
    target: Target = "pred",
    special_ids: Collection[int] | None = None,
) -> Tensor:
    """Scores ``[B, L]`` of a batch (``input_ids``, ``attention_mask``, optional
    ``token_type_ids``, each ``[B, L]``) for the class ``target`` (an int, a ``[B]`` tensor or
    ``"pred"``) under an explainer (a name: its default settings); zero at padding.
    ``special_ids``: the ids never removed (default: each text's first and last token)."""
    choice = ExplainerChoice(choice) if isinstance(choice, str) else choice
    inputs = as_batch(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
    targets = resolve_target(model, inputs, target)
    special = special_positions(inputs["input_ids"], inputs["attention_mask"], special_ids)
    scores = choice.explainer.explain(model, inputs, targets, choice.settings, special)
    return scores.detach().float() * inputs["attention_mask"]


# --------------------------------------------------------------------------- helpers


class Probabilities(nn.Module):
    """``model`` as Captum calls it: ``(input_ids, attention_mask, token_type_ids) -> [B, C]``
    class probabilities (a regression model's output ``[B, 1]``), any family's inputs taken
    (:func:`workbench.core.models.forward`); with a ``site`` (an encoder layer, or with
    ``from_embeddings`` the embeddings module), the value ``[B, L, d]`` that replaces the site's
    output as the first argument."""

    def __init__(
        self, model: PreTrainedModel, from_embeddings: bool = False, site: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.model = model
        self.site = site_module(model, None) if from_embeddings else site

    def forward(self, *args: Tensor | None) -> Tensor:
        value, *inputs = args if self.site is not None else (None, *args)
        with nullcontext() if self.site is None else output_replaced(self.site, value):
            logits = forward(self.model, as_batch(*inputs)).logits
        return logits if is_regression(self.model) else logits.softmax(-1)


def _extra(batch: Batch) -> tuple[Tensor, Tensor | None]:
    return batch["attention_mask"], batch.get("token_type_ids")


def _row(batch: Batch, b: int, length: int | None = None) -> dict[str, Tensor]:
    """Example ``b`` of a batch as a batch of one, cut to ``length`` positions."""
    return {k: v[b : b + 1, :length] for k, v in batch.items()}


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Within the context, torch's and NumPy's global generators start from ``seed``; the
    caller's random state is restored after it."""
    state = np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        np.random.seed(seed)
        try:
            yield
        finally:
            np.random.set_state(state)


def _removal_ids(model: PreTrainedModel, batch: Batch, special: Tensor) -> Tensor:
    """What a removed token becomes ``[B, L]``: the [PAD] id, specials and padding kept."""
    keep = special | ~batch["attention_mask"].bool()
    return torch.where(keep, batch["input_ids"], pad_id(model))


# --------------------------------------------------------------------------- explainers


def ig(model, batch, targets, settings: IGSettings, special) -> Tensor:
    """The workbench's IG map ``[B, L]``: ‖TopK(|IG|)‖₂ per token, unit norm."""
    check_top_k(settings.top_k, model.config.hidden_size)
    special_ids = set(batch["input_ids"][special].tolist()) or None
    path = PathOptions(settings.steps)
    ig = _integrated_gradients(
        model, batch, targets[:, None], settings.baseline, path, special_ids
    )[0]
    return attribution_map(ig[0], batch["attention_mask"], settings.top_k)


def grad(model, batch, targets, _settings, _special) -> Tensor:
    """The workbench's Grad saliency ``[B, L]``: Σ_d E ⊙ ∂p/∂E at the embedding output."""
    return _grad_saliency(model, batch, targets[:, None])[0]


def gxi(model, batch, targets, _settings, _special) -> Tensor:
    """Σ_d of gradient × input at the word embeddings ``[B, L]`` (Captum)."""
    layer = LayerGradientXActivation(Probabilities(model), model.get_input_embeddings())
    with torch.enable_grad():
        out = layer.attribute(
            batch["input_ids"], target=targets, additional_forward_args=_extra(batch)
        )
    return out.sum(-1)


def deeplift(model, batch, targets, settings: DeepLiftSettings, special) -> Tensor:
    """Σ_d of Captum's LayerDeepLift at the embedding output against [PAD] ids ``[B, L]``."""
    ids = batch["input_ids"]
    reference = baseline_ids(model, batch, settings.baseline, set(ids[special].tolist()) or None)
    layer = LayerDeepLift(Probabilities(model), site_module(model, None))
    try:
        with torch.enable_grad():
            out = layer.attribute(
                ids, baselines=reference, target=targets, additional_forward_args=_extra(batch)
            )
    except (RuntimeError, AssertionError) as error:
        raise WorkbenchError(
            f"deeplift cannot explain this model ({type(model).__name__}): Captum's DeepLift "
            f"refused it: {first_line(error)}; use another explainer, such as ig or gxi"
        ) from None
    return out.sum(-1)


def gradshap(model, batch, targets, settings: GradientShapSettings, special) -> Tensor:
    """Σ_d of Captum's GradientShap at the embedding output ``[B, L]``, one text at a time."""
    explainer = GradientShap(Probabilities(model, from_embeddings=True))
    scores = torch.zeros(batch["input_ids"].shape)
    for b, length in enumerate(batch["attention_mask"].sum(1).tolist()):
        row = _row(batch, b, length)
        specials = set(row["input_ids"][special[b : b + 1, :length]].tolist()) or None
        with torch.no_grad():
            end = embed(model, row)
            start = baseline_output(model, row, settings.baseline, None, specials, end)
        with seeded(settings.seed), torch.enable_grad():
            out = explainer.attribute(
                end,
                baselines=start,
                n_samples=settings.n_samples,
                stdevs=settings.stdevs,
                target=targets[b : b + 1],
                additional_forward_args=(row["input_ids"], *_extra(row)),
            )
        scores[b, :length] = out[0].sum(-1)
    return scores


def occlusion(model, batch, targets, settings: OcclusionSettings, special) -> Tensor:
    """Captum's Occlusion over token windows ``[B, L]``, texts of equal length batched."""
    lengths = batch["attention_mask"].sum(1)
    shortest = int((batch["attention_mask"].bool() & ~special).sum(1).min())
    if settings.window > shortest:  # longer than a text's tokens ([CLS]/[SEP] aside)
        raise WorkbenchError(
            f"occlusion window of {settings.window} tokens is longer than a text of {shortest} "
            f"token(s) besides [CLS]/[SEP]: use --window {max(1, shortest)} or less"
        )
    explainer = Occlusion(Probabilities(model))
    removed = _removal_ids(model, batch, special)
    scores = torch.zeros(batch["input_ids"].shape)
    for length in lengths.unique().tolist():  # so that no window reaches into another's padding
        rows = torch.nonzero(lengths == length)[:, 0]
        group = {k: v[rows, :length] for k, v in batch.items()}
        with torch.no_grad():
            out = explainer.attribute(
                group["input_ids"],
                sliding_window_shapes=(settings.window,),
                strides=(settings.stride,),
                baselines=removed[rows, :length],
                target=targets[rows],
                additional_forward_args=_extra(group),
                perturbations_per_eval=PERTURBATIONS_PER_EVAL,
            )
        scores[rows, :length] = out.float()
    return scores.masked_fill(special, 0.0)


def ablation(model, batch, targets, _settings, special) -> Tensor:
    """Captum's FeatureAblation, one token at a time ``[B, L]``."""
    with torch.no_grad():
        out = FeatureAblation(Probabilities(model)).attribute(
            batch["input_ids"],
            baselines=_removal_ids(model, batch, special),
            target=targets,
            additional_forward_args=_extra(batch),
            perturbations_per_eval=PERTURBATIONS_PER_EVAL,
        )
    return out.float().masked_fill(special, 0.0)


def token_features(special: Tensor) -> Tensor:
    """LIME's and KernelSHAP's interpretable features of one text ``[1, n]``: one per token,
    numbered in order, and one more shared by [CLS]/[SEP], which are never removed."""
    words = (~special).long()
    numbers = words.cumsum(-1) - 1
    return torch.where(special, words.sum(), numbers)


def text_kernel(_original: Tensor, _perturbed: Tensor, interpretable: Tensor, **_: Any) -> float:
    """The LIME package's text kernel: ``sqrt(exp(−d²/25²))`` with ``d`` the cosine distance
    (×100) between the kept-token indicator of a sample and the whole text's."""
    kept = interpretable.double().flatten()
    cosine = float(kept.sum() / (kept.norm() * math.sqrt(kept.numel()))) if kept.any() else 0.0
    return math.sqrt(math.exp(-(((1 - cosine) * 100) ** 2) / 25**2))


def lime_explainer(model: PreTrainedModel) -> Lime:
    """Captum's LIME over token masks: ridge regression (alpha 1, as the LIME package) and
    :func:`text_kernel`."""
    return Lime(Probabilities(model), SkLearnRidge(alpha=1.0), similarity_func=text_kernel)


def _sampled(
    make: Callable[[PreTrainedModel], Any],
) -> Callable[[PreTrainedModel, Batch, Tensor, SamplingSettings, Tensor], Tensor]:
    def explain(model, batch, targets, settings: SamplingSettings, special) -> Tensor:
        """Scores ``[B, L]`` of Captum's LIME or KernelSHAP, one text at a time."""
        explainer = make(model)
        removed = _removal_ids(model, batch, special)
        scores = torch.zeros(batch["input_ids"].shape)
        for b, length in enumerate(batch["attention_mask"].sum(1).tolist()):
            row = _row(batch, b, length)
            with seeded(settings.seed), torch.no_grad():
                out = explainer.attribute(
                    row["input_ids"],
                    baselines=removed[b : b + 1, :length],
                    target=targets[b : b + 1],
                    additional_forward_args=_extra(row),
                    feature_mask=token_features(special[b : b + 1, :length]),
                    n_samples=settings.n_samples,
                    perturbations_per_eval=PERTURBATIONS_PER_EVAL,
                )
            scores[b, :length] = out[0].float()
        return scores.masked_fill(special, 0.0)

    return explain


lime = _sampled(lime_explainer)
kernelshap = _sampled(lambda model: KernelShap(Probabilities(model)))
