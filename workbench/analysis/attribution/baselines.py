"""Sites and baselines: the output of the embeddings or of an encoder layer (``X``), and the
straight path's start ``S`` — [PAD] tokens with the special tokens kept or not, or zeros."""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from workbench.analysis.attribution.targets import Batch
from workbench.core.config import check_baseline
from workbench.core.errors import WorkbenchError
from workbench.core.models import embed, embeddings_module, encoder_layers, forward, input_positions


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


def baseline_ids(
    model: PreTrainedModel, batch: Batch, baseline: str, special_ids: Collection[int] | None = None
) -> Tensor:
    """Token ids ``[B, L]`` of the pad baselines: all [PAD], or [PAD] except special tokens."""
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
    positions), or zeros for ``"zero"`` (shaped like ``site``, the input's site output, when
    given)."""
    check_baseline(baseline)
    if baseline == "zero":
        return torch.zeros_like(site if site is not None else site_output(model, batch, layer))
    ids = baseline_ids(model, batch, baseline, special_ids)
    positions = input_positions(model, batch)
    kept = {} if positions is None else {"position_ids": positions}
    return site_output(model, {**batch, **kept, "input_ids": ids}, layer)
