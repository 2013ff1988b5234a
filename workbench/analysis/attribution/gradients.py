"""Gradients of class scores w.r.t. the sequence a model's encoder consumes, batched and bounded.

One private engine, :func:`_path_gradients`, computes ``(1/m) Σ_{k=1..m} ∂F_v(X_k)/∂X_k`` on the
straight path ``X_k = S + (k/m)(E − S)`` for ``V`` scores ``F_v`` at once. ``X`` is the output of
a *site*: the embeddings module (``layer=None``) or encoder layer ``k`` (``hidden_states[k+1]``);
a forward hook substitutes it (:func:`workbench.core.models.output_replaced`). Everything public is
a special case:

- Integrated Gradients (docs/methods.md §4): ``IG = (E − E') ⊙ path_gradients(E', E, m)``;
- Grad saliency (§6): ``Σ_d E ⊙ ∇F(E)`` = IG with a zero baseline and one step, summed over ``d``;
- GKD input gradients (§5): ``∇_E Σ_b p_max,b`` = the one-step path gradient of ``p_max``.

Batching: the ``m`` interpolation points of all ``B`` examples are rows of one stacked batch, cut
into chunks of at most ``max_batch_tokens`` row×position cells (derived from a memory budget unless
given). Rows are ordered by the position of their last real token and each chunk is trimmed after
the last one of its rows (dynamic padding; a left-padded row keeps all its columns, so its tokens
keep their positions), so an example's result does not depend on the batch it came in. The ``V``
views share one forward pass per chunk: ``V`` vector-Jacobian products in one
``autograd.grad(..., is_grads_batched=True)`` call.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import PreTrainedModel

from workbench.analysis.attribution.baselines import (
    baseline_output,
    resolve_baseline,
    site_module,
    site_output,
)
from workbench.analysis.attribution.chunking import batch_token_limit, length_chunks
from workbench.analysis.attribution.registry import DECODER_BASELINE, check_steps
from workbench.analysis.attribution.targets import (
    Batch,
    Scorer,
    Target,
    as_batch,
    check_double_backward,
    check_layer,
    check_top_k,
    class_probabilities,
    max_probability,
    resolve_target,
    resolve_views,
)
from workbench.core.config import Views
from workbench.core.models import MODEL_INPUTS, forward, output_replaced
from workbench.core.parts import LAST, parts_of

__all__ = [
    "attribution_map",
    "attribution_maps",
    "completeness_gaps",
    "grad_saliency",
    "ig_completeness",
    "input_gradients",
    "integrated_gradients",
]


# ---------------------------------------------------------------------------------------------
# the engine


@dataclass(frozen=True)
class PathOptions:
    """How the engine walks the path: ``steps`` points ``m``, at the output of encoder layer
    ``layer`` (None: the embedding output), keeping the graph with ``create_graph``, in chunks of
    ``max_batch_tokens`` row×position cells or of a ``memory_mib`` budget
    (:func:`batch_token_limit`)."""

    steps: int = 1
    layer: int | None = None
    create_graph: bool = False
    max_batch_tokens: int | None = None
    memory_mib: float | None = None


def _vector_jacobian_products(outputs: Tensor, inputs: Tensor, create_graph: bool) -> Tensor:
    """``∂ Σ_r outputs[r, v] / ∂ inputs`` for every view ``v``: ``[V, *inputs.shape]``."""
    views = outputs.shape[1]
    if views == 1:
        return torch.autograd.grad(outputs.sum(), inputs, create_graph=create_graph)[0][None]
    one_hot = torch.eye(views, dtype=outputs.dtype, device=outputs.device)
    one_hot = one_hot[:, None, :].expand(-1, outputs.shape[0], -1)
    return torch.autograd.grad(
        outputs, inputs, grad_outputs=one_hot, is_grads_batched=True, create_graph=create_graph
    )[0]


def _path_gradients(
    model: PreTrainedModel,
    batch: Batch,
    start: Tensor,
    end: Tensor,
    scores: Scorer,
    views: int,
    path: PathOptions,
) -> tuple[Tensor, Tensor]:
    """``(1/m) Σ_{k=1..m} ∂F_v(S + (k/m)(E − S))/∂X`` → ``[V, B, L, d]`` (zero at padding),
    and the logits ``[B, C]`` at the end of the path (``k = m``: the model's ordinary output,
    with its graph, which training terms reuse instead of a second forward pass).

    ``start`` ``S`` and ``end`` ``E`` are ``[B, L, d]`` site values; ``scores`` gives ``F``
    ``[R, V]`` from logits. With ``path.create_graph`` the result keeps the graph to ``S``,
    ``E`` and the parameters (chunks keep their graphs, so chunking then bounds only the
    backward's temporaries).
    """
    mask, steps, create_graph = batch["attention_mask"], path.steps, path.create_graph
    size, length, _ = end.shape
    if not create_graph:
        start, end = start.detach(), end.detach()
    # the columns each example needs: up to its last real token (left padding: all of them)
    ends = (mask * torch.arange(1, length + 1, device=mask.device)).amax(1).tolist()
    order = sorted(range(size), key=lambda b: (ends[b], b))
    row_lengths = [ends[b] for b in order for _ in range(steps)]
    rows = torch.tensor(order, device=end.device).repeat_interleave(steps)
    alphas = (torch.arange(1, steps + 1, dtype=end.dtype, device=end.device) / steps).repeat(size)
    limit = batch_token_limit(
        model, length, views, create_graph, path.max_batch_tokens, path.memory_mib
    )
    site = site_module(model, path.layer)
    total = end.new_zeros((views, size, length, end.shape[-1]))
    end_rows, end_logits = [], []
    for chunk in length_chunks(row_lengths, limit):
        example = rows[chunk]
        width = row_lengths[chunk.stop - 1]
        base = start[example, :width]
        x = base + alphas[chunk, None, None] * (end[example, :width] - base)
        if not x.requires_grad:
            x.requires_grad_()
        inputs = {k: batch[k][example, :width] for k in MODEL_INPUTS if k in batch}
        with output_replaced(site, x):
            logits = forward(model, inputs).logits
        grads = _vector_jacobian_products(scores(logits, example), x, create_graph)
        total = total.index_add(1, example, F.pad(grads, (0, 0, 0, length - width)))
        last = alphas[chunk] == 1
        end_rows.append(example[last])
        end_logits.append(logits[last])
    logits = torch.cat(end_logits)
    at_end = logits.new_zeros((size, logits.shape[-1])).index_copy(0, torch.cat(end_rows), logits)
    return total * mask[None, :, :, None] / steps, at_end


def _integrated_gradients(
    model: PreTrainedModel,
    batch: Batch,
    targets: Tensor,
    baseline: str | None,
    path: PathOptions,
    special_ids: Collection[int] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """IG for the classes ``targets`` ``[B, V]`` → ``[V, B, L, d]``, the logits at the end
    of the path ``[B, C]``, and its start (the baseline at the site) ``[B, L, d]``."""
    check_steps(path.steps)
    baseline = resolve_baseline(model, baseline)
    check_layer(model, path.layer)
    check_double_backward(model, path.create_graph)
    with torch.set_grad_enabled(path.create_graph):
        end = site_output(model, batch, path.layer)
        start = baseline_output(model, batch, baseline, path.layer, special_ids, end)
    with torch.enable_grad():
        scores = class_probabilities(model, targets)
        gradients, end_logits = _path_gradients(
            model, batch, start, end, scores, targets.shape[1], path
        )
    return (end - start)[None] * gradients, end_logits, start


def _grad_saliency(
    model: PreTrainedModel, batch: Batch, targets: Tensor, path: PathOptions = PathOptions()
) -> Tensor:
    """Grad saliency for the classes ``targets`` ``[B, V]`` → ``[V, B, L]`` (``path``: one step,
    no graph)."""
    return _integrated_gradients(model, batch, targets, "zero", path)[0].sum(-1)


# ---------------------------------------------------------------------------------------------
# public functions


def integrated_gradients(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor,
    token_type_ids: Tensor | None = None,
    *,
    target: Target,
    steps: int = 1,
    baseline: str | None = None,
    create_graph: bool = False,
    layer: int | None = None,
    special_ids: Collection[int] | None = None,
    max_batch_tokens: int | None = None,
    memory_mib: float | None = None,
) -> Tensor:
    """Integrated Gradients of the probability of class ``target`` w.r.t. the embedding output.

    ``IG = (E − E') ⊙ (1/m) Σ_{k=1..m} ∂F(E' + (k/m)(E − E'))/∂E`` (right Riemann sum,
    ``m = steps``), for a sequence classifier in eval mode (in train mode every interpolation
    point draws its own dropout mask).

    Args:
        input_ids, attention_mask, token_type_ids: ``[B, L]``; padding positions keep
            attention mask 0 in every interpolated forward pass.
        target: class per example: an int, a ``[B]`` tensor or ``"pred"``. Regression models
            (``num_labels == 1``): ``F`` is the output itself and ``target`` is ignored.
        steps: interpolation points ``m >= 1``; ``m = 1`` gives ``(E − E') ⊙ ∇F(E)``.
        baseline: ``"pad"`` — the embeddings module applied to an all-[PAD] sequence of the same
            length (position and token-type embeddings included); ``"pad-keep-special"`` —
            [CLS]/[SEP] kept (see ``special_ids``); ``"zero"`` — zeros (the authors' code).
        create_graph: keep the graph so the result is differentiable in the model's parameters
            (AD-KD's student term); needs eager attention.
        layer: ``None`` — attribute to the embedding output; ``k`` — to the output of encoder
            layer ``k`` (``hidden_states[k + 1]``), the baseline being that layer's output for
            the baseline ids (zeros for ``"zero"``). Layers below ``k`` still run in every
            interpolated forward pass; a hook replaces their result at layer ``k``.
        special_ids: ids kept by ``"pad-keep-special"``; default: the ids of each sequence's
            first and last real token.
        max_batch_tokens: rows × positions per chunk of the stacked (step × example) batch.
        memory_mib: the budget that sets the chunk size when ``max_batch_tokens`` is not given
            (default 1024 MiB on the CPU, half the free memory on a GPU; estimated by
            :func:`bytes_per_token`). With ``create_graph`` every
            chunk's graph is kept until the caller's backward, so the budget then bounds only
            the temporaries of each vector-Jacobian product.

    Returns:
        ``[B, L, d]`` float, zero at padding.
    """
    batch = as_batch(input_ids, attention_mask, token_type_ids)
    targets = resolve_target(model, batch, target)[:, None]
    path = PathOptions(steps, layer, create_graph, max_batch_tokens, memory_mib)
    return _integrated_gradients(model, batch, targets, baseline, path, special_ids)[0][0]


def ig_completeness(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor,
    token_type_ids: Tensor | None = None,
    *,
    target: Target,
    steps: int = 1,
    baseline: str | None = None,
    layer: int | None = None,
    special_ids: Collection[int] | None = None,
    memory_mib: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Integrated Gradients' completeness, as its axiom states it: the attributions summed over
    tokens and dimensions ``Σ_{i,d} IG_{i,d}`` ``[B]``, and the change of the explained score
    they account for, ``F(E) − F(E')`` ``[B]`` (class ``target``'s probability, or a regression
    output, at the input and at the baseline). The two differ by the Riemann sum's error,
    which shrinks as ``steps`` grows (the completeness gap is their difference relative to
    ``F(E) − F(E')``; Captum's ``return_convergence_delta`` is the difference itself). A
    decoder classifier's head reads the input's last real token at every point of the path
    and at the baseline (Captum's delta, which runs the baseline ids, reads another position
    when [PAD] is the end-of-text token). Steep paths need far more steps: from zeros, a
    pre-norm decoder's first norm turns over within ``α ≈ sqrt(eps)/rms(E)``; from all-[PAD]
    = end-of-text ids, every position starts as a first token (an attention sink). A decoder's
    default, ``"mean-keep-first"``, keeps the sink in place: its gap falls with the steps.
    Arguments as :func:`integrated_gradients`."""
    batch = as_batch(input_ids, attention_mask, token_type_ids)
    targets = resolve_target(model, batch, target)[:, None]
    path = PathOptions(steps, layer, memory_mib=memory_mib)
    ig, logits, start = _integrated_gradients(model, batch, targets, baseline, path, special_ids)
    with torch.no_grad(), output_replaced(site_module(model, layer), start):
        start_logits = forward(model, batch).logits  # batch: as_batch's inputs
    score, rows = class_probabilities(model, targets), torch.arange(len(targets))
    change = score(logits.detach(), rows) - score(start_logits, rows)
    return ig[0].sum((1, 2)).detach(), change[:, 0]


COMPLETENESS_LIMIT = 0.05
"""An IG completeness gap above it is said wherever the map is shown (app, files, records)."""


def completeness_warning(
    attributed: float, change: float, baseline: str, decoder: bool, steps: int
) -> str | None:
    """The line that says an IG map misses the change it explains (``attributed`` =
    Σ IG, ``change`` = F(x) − F(x′), as :func:`ig_completeness` gives them) by more than
    :data:`COMPLETENESS_LIMIT`, with what moves the gap: for a decoder on another baseline than
    its default, that baseline (on a steep path more steps can widen the gap); otherwise more
    steps, which close it only where the path is smooth. None when the gap is within the
    limit (or the score does not change)."""
    if change == 0 or abs(attributed - change) / abs(change) <= COMPLETENESS_LIMIT:
        return None
    gap = abs(attributed - change) / abs(change)
    if decoder and baseline != DECODER_BASELINE:
        advice = (
            f"use the baseline {DECODER_BASELINE} (a decoder's default): on the {baseline} "
            "path, steep for a decoder, more steps can widen the gap rather than close it"
        )
    else:
        advice = (
            "more steps close it where the path is smooth: try twice as many, and if the gap "
            "does not fall, read the map as a ranking of tokens, not an account of the change"
        )
    return (
        f"the IG attributions add up to {attributed:.3f}, but the predicted class's "
        f"score changes by {change:.3f} from the baseline ({baseline}) to the text (a gap of "
        f"{gap:.0%} at {steps} steps): {advice}."
    )


def completeness_gaps(
    model: PreTrainedModel,
    batch: Batch,
    target: Target,
    ig,
    config,
    special_ids: Collection[int] | None = None,
) -> tuple[list[tuple[float, float]], list[str | None]]:
    """Per example, IG's completeness ``(Σ IG, F(x) − F(x′))`` (:func:`ig_completeness` with
    the ig explainer's steps and baseline ``ig``, and ``config``'s layer and memory budget) and
    its :func:`completeness_warning`."""
    baseline = resolve_baseline(model, ig.baseline)
    inputs = (batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
    sums = ig_completeness(
        model,
        *inputs,
        target=target,
        baseline=baseline,
        special_ids=special_ids,
        steps=ig.steps,
        layer=config.layer,
        memory_mib=config.memory_mib,
    )
    pairs = list(zip(*(x.tolist() for x in sums), strict=True))
    parts = parts_of(model)  # a decoder whose first token is a sink (not a prompted one)
    decoder = parts.reads == LAST and not parts.framed
    return pairs, [completeness_warning(a, c, baseline, decoder, ig.steps) for a, c in pairs]


def attribution_map(ig: Tensor, attention_mask: Tensor, top_k: int | None = None) -> Tensor:
    """Per-token attribution ``[B, L]`` from IG ``[B, L, d]`` (or ``[..., B, L, d]``):
    ``‖TopK_d(|IG_i|)‖₂`` (all ``d`` when ``top_k`` is None), zero at padding, unit L2 norm
    over each sequence's real tokens; an all-zero row stays zero (never NaN, also in backward).
    """
    check_top_k(top_k, ig.shape[-1])
    if top_k is not None and top_k < ig.shape[-1]:
        ig = ig.abs().topk(top_k, dim=-1).values
    per_token = torch.linalg.vector_norm(ig, dim=-1) * attention_mask
    norm = torch.linalg.vector_norm(per_token, dim=-1, keepdim=True)
    nonzero = norm > 0
    return torch.where(nonzero, per_token / torch.where(nonzero, norm, 1.0), 0.0)


def attribution_maps(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor,
    token_type_ids: Tensor | None = None,
    *,
    views: Views = "all",
    labels: Tensor | None = None,
    steps: int = 1,
    baseline: str | None = None,
    top_k: int | None = None,
    create_graph: bool = False,
    layer: int | None = None,
    special_ids: Collection[int] | None = None,
    max_batch_tokens: int | None = None,
    memory_mib: float | None = None,
    return_logits: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Normalised IG maps for several views at once → ``[B, V, L]`` (with ``return_logits``
    also the model's logits ``[B, C]`` from the same forward pass, graph kept).

    ``views``: ``"all"`` (every class, AD-KD's multi-view), ``"pred"``, ``"gold"`` (needs
    ``labels`` ``[B]``), a class index or a list of them. With two classes, ``"all"`` computes
    one view and repeats it: ``p_1 = 1 − p_0`` gives ``IG_1 = −IG_0``, hence equal maps.
    Regression models have one view. Other arguments as :func:`integrated_gradients` and
    :func:`attribution_map` (teacher: ``top_k``; student: ``top_k=None, create_graph=True``).
    """
    batch = as_batch(input_ids, attention_mask, token_type_ids)
    check_top_k(top_k, model.config.hidden_size)
    targets = resolve_views(model, batch, views, labels)
    repeat = 2 if isinstance(views, str) and views == "all" and targets.shape[1] == 2 else 1
    path = PathOptions(steps, layer, create_graph, max_batch_tokens, memory_mib)
    targets = targets[:, : targets.shape[1] // repeat]
    ig, logits, _ = _integrated_gradients(model, batch, targets, baseline, path, special_ids)
    maps = attribution_map(ig, attention_mask, top_k).transpose(0, 1).repeat(1, repeat, 1)
    return (maps, logits) if return_logits else maps


def grad_saliency(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor,
    token_type_ids: Tensor | None = None,
    *,
    target: Target = "pred",
    layer: int | None = None,
    max_batch_tokens: int | None = None,
    memory_mib: float | None = None,
) -> Tensor:
    """Grad saliency (docs/methods.md §6, "gradient × input") ``[B, L]``: ``Σ_d E ⊙ ∂F/∂E``
    with ``F`` the probability of ``target`` (int, ``[B]`` tensor or ``"pred"``); zero at
    padding. Signed, not normalised. Equals IG with a zero baseline and one step, summed over
    ``d``."""
    batch = as_batch(input_ids, attention_mask, token_type_ids)
    targets = resolve_target(model, batch, target)[:, None]
    path = PathOptions(layer=layer, max_batch_tokens=max_batch_tokens, memory_mib=memory_mib)
    return _grad_saliency(model, batch, targets, path)[0]


def input_gradients(
    model: PreTrainedModel,
    batch: Batch,
    *,
    create_graph: bool = False,
    max_batch_tokens: int | None = None,
    memory_mib: float | None = None,
    return_logits: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """GKD's signal (docs/methods.md §5): ``∂(Σ_b p_max,b)/∂E`` ``[B, L, d]``, each model its own
    ``p_max``; zero at padding. With ``create_graph`` differentiable in the parameters (the
    student's term; needs eager attention). Frozen embeddings are fine: the gradient is taken
    w.r.t. the embedding output itself. With ``return_logits`` also the logits ``[B, C]`` of
    the same forward pass."""
    check_double_backward(model, create_graph)
    with torch.set_grad_enabled(create_graph):
        end = site_output(model, batch)
    with torch.enable_grad():
        path = PathOptions(
            create_graph=create_graph, max_batch_tokens=max_batch_tokens, memory_mib=memory_mib
        )
        gradients, logits = _path_gradients(
            model, batch, torch.zeros_like(end), end, max_probability, 1, path
        )
    return (gradients[0], logits) if return_logits else gradients[0]
