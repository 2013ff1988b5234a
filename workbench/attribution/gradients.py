"""Gradients of class scores w.r.t. the sequence a model's encoder consumes, batched and bounded.

One private engine, :func:`_path_gradients`, computes ``(1/m) Σ_{k=1..m} ∂F_v(X_k)/∂X_k`` on the
straight path ``X_k = S + (k/m)(E − S)`` for ``V`` scores ``F_v`` at once. ``X`` is the output of
a *site*: the embeddings module (``layer=None``) or encoder layer ``k`` (``hidden_states[k+1]``);
a forward hook substitutes it (:func:`workbench.models.output_replaced`). Everything public is a
special case:

- Integrated Gradients (METHODS.md §4): ``IG = (E − E') ⊙ path_gradients(E', E, m)``;
- Grad saliency (§6): ``Σ_d E ⊙ ∇F(E)`` = IG with a zero baseline and one step, summed over ``d``;
- GKD input gradients (§5): ``∇_E Σ_b p_max,b`` = the one-step path gradient of ``p_max``.

Batching: the ``m`` interpolation points of all ``B`` examples are rows of one stacked batch, cut
into chunks of at most ``max_batch_tokens`` row×position cells (derived from a memory budget
unless given). Rows are ordered by sequence length and each chunk is trimmed to its longest real
sequence (dynamic padding), so an example's result does not depend on the batch it came in. The
``V`` views share one forward pass per chunk: ``V`` vector-Jacobian products in one
``autograd.grad(..., is_grads_batched=True)`` call.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PreTrainedModel

from workbench.config import BASELINES, VIEWS, Views, check_baseline, check_steps
from workbench.errors import WorkbenchError
from workbench.models import (
    MODEL_INPUTS,
    embed,
    embeddings_module,
    encoder_layers,
    forward,
    output_replaced,
)

DEFAULT_MEMORY_MIB = 1024

Batch = Mapping[str, Tensor]
Target = int | str | Tensor
# scores(logits [R, C], example index of each row [R]) -> [R, V]
Scorer = Callable[[Tensor, Tensor], Tensor]

__all__ = [
    "BASELINES",
    "VIEWS",
    "attribution_layers",
    "attribution_map",
    "attribution_maps",
    "baseline_output",
    "grad_saliency",
    "input_gradients",
    "integrated_gradients",
    "site_output",
    "special_positions",
    "view_names",
]


# ---------------------------------------------------------------------------------------------
# inputs, checks, targets and views


def _batch(input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None) -> Batch:
    batch = {"input_ids": input_ids, "attention_mask": attention_mask}
    if token_type_ids is not None:
        batch["token_type_ids"] = token_type_ids
    return batch


def is_regression(model: PreTrainedModel) -> bool:
    """One output: ``F`` is the output itself and targets are ignored."""
    return model.config.num_labels == 1


def _check_double_backward(model: PreTrainedModel, create_graph: bool) -> None:
    kernel = getattr(model.config, "_attn_implementation", "eager")
    if create_graph and kernel != "eager":
        raise WorkbenchError(
            f"create_graph=True needs a double backward, which {kernel!r} attention lacks on CPU: "
            'load the model with attn_implementation="eager"'
        )


def _check_top_k(top_k: int | None, hidden_size: int) -> None:
    if top_k is not None and not 1 <= top_k <= hidden_size:
        raise WorkbenchError(
            f"top_k={top_k} is outside 1..{hidden_size} (the hidden size); use None for all"
        )


def _check_layer(model: PreTrainedModel, layer: int | None) -> None:
    count = len(encoder_layers(model))
    if layer is not None and not 0 <= layer < count:
        raise WorkbenchError(
            f"layer={layer} is outside 0..{count - 1}; use None for the embedding output"
        )


def _predictions(model: PreTrainedModel, batch: Batch) -> Tensor:
    """Predicted class per example ``[B]``."""
    with torch.no_grad():
        return forward(model, batch).logits.argmax(-1)


def _class_ids(model: PreTrainedModel, values: Tensor, what: str, device: torch.device) -> Tensor:
    """``values`` as class indices on ``device``, checked against the model's classes."""
    classes = model.config.num_labels
    if values.is_floating_point() or ((values < 0) | (values >= classes)).any():
        raise WorkbenchError(
            f"{what} {values.unique().tolist()} outside the model's classes 0..{classes - 1}"
        )
    return values.long().to(device)


def resolve_target(model: PreTrainedModel, batch: Batch, target: Target) -> Tensor:
    """Target class per example ``[B]``: an int, a ``[B]`` tensor, or ``"pred"``."""
    size, device = batch["input_ids"].shape[0], batch["input_ids"].device
    if is_regression(model):
        return torch.zeros(size, dtype=torch.long, device=device)
    if isinstance(target, str):
        if target != "pred":
            raise WorkbenchError(f"target {target!r}: give a class index, a [B] tensor or 'pred'")
        return _predictions(model, batch)
    values = torch.as_tensor(target).reshape(-1)
    if len(values) not in (1, size):
        raise WorkbenchError(f"target has {len(values)} values for a batch of {size} examples")
    return _class_ids(model, values.expand(size), "target", device)


def view_names(model: PreTrainedModel, views: Views) -> list[str]:
    """Names of the views :func:`resolve_views` gives: class names for ``"all"`` and class
    indices, ``"pred"``, ``"gold"``, or ``"output"`` for regression."""
    if is_regression(model):
        return ["output"]
    names = model.config.id2label
    if isinstance(views, str) and views == "all":
        return [str(names[c]) for c in range(model.config.num_labels)]
    if isinstance(views, str):
        return [views]
    indices = [int(c) for c in torch.as_tensor(views).reshape(-1)]
    outside = [c for c in indices if not 0 <= c < model.config.num_labels]
    if outside:
        raise WorkbenchError(
            f"views {', '.join(map(str, outside))}: not a class of this model "
            f"(its classes are 0..{model.config.num_labels - 1})"
        )
    return [str(names[c]) for c in indices]


def resolve_views(
    model: PreTrainedModel, batch: Batch, views: Views, labels: Tensor | None = None
) -> Tensor:
    """The classes attributed per example ``[B, V]``: ``"all"`` — every class; ``"pred"`` — the
    predicted class; ``"gold"`` — ``labels``; an int or a list of ints — those classes.
    Regression models have one view (their output)."""
    size, device = batch["input_ids"].shape[0], batch["input_ids"].device
    if is_regression(model):
        return torch.zeros(size, 1, dtype=torch.long, device=device)
    if not isinstance(views, str):
        chosen = _class_ids(model, torch.as_tensor(views).reshape(-1), "view", device)
        return chosen.expand(size, -1)
    if views == "all":
        return torch.arange(model.config.num_labels, device=device).expand(size, -1)
    if views == "pred":
        return _predictions(model, batch)[:, None]
    if views == "gold":
        if labels is None:
            raise WorkbenchError("views='gold' needs the labels of the examples")
        return _class_ids(model, torch.as_tensor(labels), "label", device)[:, None]
    raise WorkbenchError(f"unknown views {views!r}: use {', '.join(VIEWS)} or class indices")


def _class_probabilities(model: PreTrainedModel, targets: Tensor) -> Scorer:
    """``F_v`` = probability of class ``targets[b, v]`` (regression: the output itself)."""
    if is_regression(model):
        return lambda logits, _rows: logits[:, :1]
    return lambda logits, rows: logits.softmax(-1).gather(1, targets[rows])


def _max_probability(logits: Tensor, _rows: Tensor) -> Tensor:
    """``p_max`` per row ``[R, 1]`` (GKD's signal)."""
    return logits.softmax(-1).max(-1, keepdim=True).values


# ---------------------------------------------------------------------------------------------
# sites and baselines


def _site_module(model: PreTrainedModel, layer: int | None) -> nn.Module:
    return embeddings_module(model) if layer is None else encoder_layers(model)[layer]


def site_output(model: PreTrainedModel, batch: Batch, layer: int | None = None) -> Tensor:
    """What is attributed ``[B, L, d]``: the embedding output (``layer=None``) or the output of
    encoder layer ``layer`` (``hidden_states[layer + 1]``)."""
    if layer is None:
        return embed(model, batch)
    return forward(model, batch, hidden_states=True).hidden_states[layer + 1]


def special_positions(
    input_ids: Tensor, attention_mask: Tensor, special_ids: Collection[int] | None = None
) -> Tensor:
    """Positions ``[B, L]`` (bool) holding special tokens: ids in ``special_ids``, or by default
    the ids of each sequence's first and last real token ([CLS] and [SEP] for BERT tokenizers,
    so a pair's middle [SEP] counts too)."""
    real = attention_mask.bool()
    if special_ids is not None:
        ids = torch.tensor(sorted(special_ids), device=input_ids.device)
        return torch.isin(input_ids, ids) & real
    last = attention_mask.sum(1).clamp_min(1) - 1
    first_ids = input_ids[:, :1]
    last_ids = input_ids.gather(1, last[:, None])
    return ((input_ids == first_ids) | (input_ids == last_ids)) & real


def _pad_id(model: PreTrainedModel) -> int:
    pad = model.config.pad_token_id
    if pad is None:
        raise WorkbenchError("the model config has no pad_token_id: the pad baselines need one")
    return int(pad)


def baseline_ids(
    model: PreTrainedModel, batch: Batch, baseline: str, special_ids: Collection[int] | None = None
) -> Tensor:
    """Token ids ``[B, L]`` of the pad baselines: all [PAD], or [PAD] except special tokens."""
    ids = batch["input_ids"]
    pads = torch.full_like(ids, _pad_id(model))
    if baseline == "pad":
        return pads
    return torch.where(special_positions(ids, batch["attention_mask"], special_ids), ids, pads)


def baseline_output(
    model: PreTrainedModel,
    batch: Batch,
    baseline: str,
    layer: int | None = None,
    special_ids: Collection[int] | None = None,
    site: Tensor | None = None,
) -> Tensor:
    """The baseline ``E'`` ``[B, L, d]`` at the site: the site's output for the baseline ids (the
    input's token types and attention mask kept), or zeros for ``"zero"`` (shaped like ``site``,
    the input's site output, when given)."""
    check_baseline(baseline)
    if baseline == "zero":
        return torch.zeros_like(site if site is not None else site_output(model, batch, layer))
    ids = baseline_ids(model, batch, baseline, special_ids)
    return site_output(model, {**batch, "input_ids": ids}, layer)


# ---------------------------------------------------------------------------------------------
# chunking


def bytes_per_token(
    model: PreTrainedModel, length: int, views: int = 1, create_graph: bool = False
) -> int:
    """Estimated autograd memory of one row×position cell: per layer ``20·d`` saved activations
    plus ``3·heads·L`` attention values, ×``(1 + (V−1)/10)`` for ``V`` batched vector-Jacobian
    products, or ×``3(1 + 0.4(V−1))`` when the graph is kept for a double backward; ×1.3 for
    allocator slack. Calibrated with ``ru_maxrss`` on MiniLM-L6 at 40 positions (one chunk:
    215 KiB per cell for one view; over many chunks of varying width the peak was 1.3× the
    single-chunk figure)."""
    config = model.config
    per_layer = 20 * config.hidden_size + 3 * config.num_attention_heads * length
    size = next(model.parameters()).element_size()
    factor = 3 * (1 + 0.4 * (views - 1)) if create_graph else 1 + 0.1 * (views - 1)
    return int(1.3 * size * config.num_hidden_layers * per_layer * factor)


def batch_token_limit(
    model: PreTrainedModel,
    length: int,
    views: int,
    create_graph: bool,
    max_batch_tokens: int | None,
    memory_mib: float | None,
) -> int:
    """Row×position cells per chunk: ``max_batch_tokens`` if given, else what fits in
    ``memory_mib`` (default :data:`DEFAULT_MEMORY_MIB`) by :func:`bytes_per_token`."""
    if max_batch_tokens is not None:
        if max_batch_tokens < 1:
            raise WorkbenchError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
        return max_batch_tokens
    budget = (memory_mib or DEFAULT_MEMORY_MIB) * 2**20
    return max(1, int(budget // bytes_per_token(model, length, views, create_graph)))


def _chunks(lengths: list[int], limit: int) -> list[slice]:
    """Consecutive slices of rows (``lengths`` ascending) whose ``rows × longest`` stays within
    ``limit`` cells (at least one row each)."""
    chunks, start = [], 0
    for end in range(1, len(lengths) + 1):
        if end < len(lengths) and (end + 1 - start) * lengths[end] <= limit:
            continue
        chunks.append(slice(start, end))
        start = end
    return chunks


# ---------------------------------------------------------------------------------------------
# the engine


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
    *,
    steps: int = 1,
    layer: int | None = None,
    create_graph: bool = False,
    max_batch_tokens: int | None = None,
    memory_mib: float | None = None,
) -> tuple[Tensor, Tensor]:
    """``(1/m) Σ_{k=1..m} ∂F_v(S + (k/m)(E − S))/∂X`` → ``[V, B, L, d]`` (zero at padding),
    and the logits ``[B, C]`` at the end of the path (``k = m``: the model's ordinary output,
    with its graph, which training terms reuse instead of a second forward pass).

    ``start`` ``S`` and ``end`` ``E`` are ``[B, L, d]`` site values; ``scores`` gives ``F``
    ``[R, V]`` from logits. With ``create_graph`` the result keeps the graph to ``S``, ``E`` and
    the parameters (chunks keep their graphs, so chunking then bounds only the backward's
    temporaries).
    """
    mask = batch["attention_mask"]
    size, length, _ = end.shape
    if not create_graph:
        start, end = start.detach(), end.detach()
    lengths = mask.sum(1).tolist()
    order = sorted(range(size), key=lambda b: (lengths[b], b))
    row_lengths = [lengths[b] for b in order for _ in range(steps)]
    rows = torch.tensor(order, device=end.device).repeat_interleave(steps)
    alphas = (torch.arange(1, steps + 1, dtype=end.dtype, device=end.device) / steps).repeat(size)
    limit = batch_token_limit(model, length, views, create_graph, max_batch_tokens, memory_mib)
    site = _site_module(model, layer)
    total = end.new_zeros((views, size, length, end.shape[-1]))
    end_rows, end_logits = [], []
    for chunk in _chunks(row_lengths, limit):
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
    *,
    steps: int,
    baseline: str,
    create_graph: bool,
    layer: int | None = None,
    special_ids: Collection[int] | None = None,
    max_batch_tokens: int | None = None,
    memory_mib: float | None = None,
) -> tuple[Tensor, Tensor]:
    """IG for the classes ``targets`` ``[B, V]`` → ``[V, B, L, d]``, and the logits at the end
    of the path ``[B, C]``."""
    check_steps(steps)
    check_baseline(baseline)
    _check_layer(model, layer)
    _check_double_backward(model, create_graph)
    with torch.set_grad_enabled(create_graph):
        end = site_output(model, batch, layer)
        start = baseline_output(model, batch, baseline, layer, special_ids, end)
    with torch.enable_grad():
        gradients, end_logits = _path_gradients(
            model,
            batch,
            start,
            end,
            _class_probabilities(model, targets),
            targets.shape[1],
            steps=steps,
            layer=layer,
            create_graph=create_graph,
            max_batch_tokens=max_batch_tokens,
            memory_mib=memory_mib,
        )
    return (end - start)[None] * gradients, end_logits


def _grad_saliency(model: PreTrainedModel, batch: Batch, targets: Tensor, **options) -> Tensor:
    """Grad saliency for the classes ``targets`` ``[B, V]`` → ``[V, B, L]``."""
    ig, _ = _integrated_gradients(
        model, batch, targets, steps=1, baseline="zero", create_graph=False, **options
    )
    return ig.sum(-1)


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
    baseline: str = "pad",
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
            (default 1024 MiB; estimated by :func:`bytes_per_token`). With ``create_graph`` every
            chunk's graph is kept until the caller's backward, so the budget then bounds only
            the temporaries of each vector-Jacobian product.

    Returns:
        ``[B, L, d]`` float, zero at padding.
    """
    batch = _batch(input_ids, attention_mask, token_type_ids)
    targets = resolve_target(model, batch, target)[:, None]
    ig, _ = _integrated_gradients(
        model,
        batch,
        targets,
        steps=steps,
        baseline=baseline,
        layer=layer,
        create_graph=create_graph,
        special_ids=special_ids,
        max_batch_tokens=max_batch_tokens,
        memory_mib=memory_mib,
    )
    return ig[0]


def attribution_map(ig: Tensor, attention_mask: Tensor, top_k: int | None = None) -> Tensor:
    """Per-token attribution ``[B, L]`` from IG ``[B, L, d]`` (or ``[..., B, L, d]``):
    ``‖TopK_d(|IG_i|)‖₂`` (all ``d`` when ``top_k`` is None), zero at padding, unit L2 norm
    over each sequence's real tokens; an all-zero row stays zero (never NaN, also in backward).
    """
    _check_top_k(top_k, ig.shape[-1])
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
    baseline: str = "pad",
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
    batch = _batch(input_ids, attention_mask, token_type_ids)
    _check_top_k(top_k, model.config.hidden_size)
    targets = resolve_views(model, batch, views, labels)
    repeat = 2 if isinstance(views, str) and views == "all" and targets.shape[1] == 2 else 1
    ig, logits = _integrated_gradients(
        model,
        batch,
        targets[:, : targets.shape[1] // repeat],
        steps=steps,
        baseline=baseline,
        layer=layer,
        create_graph=create_graph,
        special_ids=special_ids,
        max_batch_tokens=max_batch_tokens,
        memory_mib=memory_mib,
    )
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
    """Grad saliency (METHODS.md §6, "gradient × input") ``[B, L]``: ``Σ_d E ⊙ ∂F/∂E`` with ``F``
    the probability of ``target`` (int, ``[B]`` tensor or ``"pred"``); zero at padding. Signed,
    not normalised. Equals IG with a zero baseline and one step, summed over ``d``."""
    batch = _batch(input_ids, attention_mask, token_type_ids)
    targets = resolve_target(model, batch, target)[:, None]
    return _grad_saliency(
        model, batch, targets, layer=layer, max_batch_tokens=max_batch_tokens, memory_mib=memory_mib
    )[0]


def input_gradients(
    model: PreTrainedModel,
    batch: Batch,
    *,
    create_graph: bool = False,
    max_batch_tokens: int | None = None,
    memory_mib: float | None = None,
    return_logits: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """GKD's signal (METHODS.md §5): ``∂(Σ_b p_max,b)/∂E`` ``[B, L, d]``, each model its own
    ``p_max``; zero at padding. With ``create_graph`` differentiable in the parameters (the
    student's term; needs eager attention). Frozen embeddings are fine: the gradient is taken
    w.r.t. the embedding output itself. With ``return_logits`` also the logits ``[B, C]`` of
    the same forward pass."""
    _check_double_backward(model, create_graph)
    with torch.set_grad_enabled(create_graph):
        end = site_output(model, batch)
    with torch.enable_grad():
        gradients, logits = _path_gradients(
            model,
            batch,
            torch.zeros_like(end),
            end,
            _max_probability,
            1,
            create_graph=create_graph,
            max_batch_tokens=max_batch_tokens,
            memory_mib=memory_mib,
        )
    return (gradients[0], logits) if return_logits else gradients[0]


def attribution_layers(num_layers: int, which: str) -> list[int | None]:
    """Sites of the AD-KD layer ablation (Table 3) for an ``N``-layer model: ``"input"`` →
    ``[None]`` (the embedding output); ``"first"`` → ``[0]``; ``"penultimate"`` → ``[N − 2]``
    (the second-to-last layer's output; the last layer's output reaches the classifier through
    [CLS] only); ``"uniform:M"`` → ``M`` sites evenly spaced from the input:
    ``hidden_states[j·N/M]`` for ``j = 0..M−1`` (rounded), i.e. ``None`` then layer
    ``j·N/M − 1`` (6 layers, M = 3: input, 1, 3)."""
    if which == "input":
        return [None]
    if which == "first":
        return [0]
    if which == "penultimate":
        if num_layers < 2:
            raise WorkbenchError("'penultimate' needs a model with at least 2 layers")
        return [num_layers - 2]
    if which.startswith("uniform:"):
        count = which.split(":", 1)[1]
        if not count.isdigit() or not 1 <= int(count) <= num_layers:
            raise WorkbenchError(f"{which!r}: use uniform:M with 1 <= M <= {num_layers}")
        m = int(count)
        indices = [round(j * num_layers / m) for j in range(m)]
        return [None if i == 0 else i - 1 for i in indices]
    raise WorkbenchError(
        f"unknown attribution layers {which!r}: use input, first, penultimate or uniform:M"
    )
