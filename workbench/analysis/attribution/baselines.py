"""Sites and baselines: the output of the embeddings or of an encoder layer (``X``), and the
straight path's start ``S`` — [PAD] tokens with the special tokens kept or not, zeros, or the
mean word embedding with each text's first token kept (a decoder classifier's default)."""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from workbench.analysis.attribution.registry import DECODER_BASELINE, check_baseline
from workbench.analysis.attribution.targets import Batch
from workbench.core.errors import WorkbenchError
from workbench.core.models import (
    embed,
    embeddings_module,
    encoder_layers,
    forward,
    input_positions,
    output_replaced,
)
from workbench.core.parts import LAST, parts_of


def site_module(model: PreTrainedModel, layer: int | None) -> nn.Module:
    if layer is None:
        return embeddings_module(model)
    return encoder_layers(model, f"attributing at layer {layer}")[layer]


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


def pad_id(model: PreTrainedModel) -> int:
    pad = model.config.pad_token_id
    if pad is None:
        raise WorkbenchError("the model config has no pad_token_id: the pad baselines need one")
    return int(pad)


def resolve_baseline(model: PreTrainedModel, baseline: str | None) -> str:
    """``baseline``, or for None the model's default: :data:`DECODER_BASELINE` for a decoder
    classifier (its head reads the last token, its first is an attention sink), ``"pad"`` for
    any other, a prompted classifier too (its template holds the sink, fixed on the path)."""
    if baseline is None:
        parts = parts_of(model)
        return DECODER_BASELINE if parts.reads == LAST and not parts.framed else "pad"
    check_baseline(baseline)
    return baseline


def mean_word_embeddings(model: PreTrainedModel, batch: Batch) -> Tensor:
    """The word embeddings of ``mean-keep-first`` ``[B, L, d]``: each sequence's first real
    token's row, the mean row of the word-embedding table at every other position."""
    table = model.get_input_embeddings()
    rows, mask = table(batch["input_ids"]), batch["attention_mask"]
    first = mask.bool().int().argmax(1)  # each sequence's first real position (left padding too)
    is_first = torch.arange(mask.shape[1], device=first.device)[None] == first[:, None]
    return torch.where(is_first[..., None], rows, table.weight.mean(0).to(rows.dtype))


def baseline_ids(
    model: PreTrainedModel, batch: Batch, baseline: str, special_ids: Collection[int] | None = None
) -> Tensor:
    """Token ids ``[B, L]`` of the pad baselines: all [PAD], or [PAD] except special tokens.
    ``"zero"`` and ``"mean-keep-first"`` are not ids (:func:`baseline_output`)."""
    ids = batch["input_ids"]
    pads = torch.full_like(ids, pad_id(model))
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
    input's token types, attention mask and positions kept: a family that derives position ids
    from the ids, such as RoBERTa, gets the input's, so that its [PAD]s sit at the input's
    positions); for ``"mean-keep-first"`` the site's output when the word embeddings are
    :func:`mean_word_embeddings` (the rest of the embedding stage, positions included, as for
    the input); zeros for ``"zero"`` (shaped like ``site``, the input's site output, when
    given)."""
    check_baseline(baseline)
    if baseline == "zero":
        return torch.zeros_like(site if site is not None else site_output(model, batch, layer))
    if baseline == "mean-keep-first":
        words = mean_word_embeddings(model, batch)
        parts_of(model)  # found by a probe forward pass: before the hook below alters one
        with output_replaced(model.get_input_embeddings(), words):
            return site_output(model, batch, layer)
    ids = baseline_ids(model, batch, baseline, special_ids)
    positions = input_positions(model, batch)
    kept = {} if positions is None else {"position_ids": positions}
    return site_output(model, {**batch, **kept, "input_ids": ids}, layer)
