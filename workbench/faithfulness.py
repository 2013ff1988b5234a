"""Faithfulness of token attributions: AOPC comprehensiveness and sufficiency (ERASER, DeYoung et
al. 2020; as ferret computes them).

For each example, rank its real non-special tokens by attribution (highest first) and, for each
fraction ``q`` in ``fractions`` (default 10 %, 20 %, …, 50 %), take the top ``k = ⌈q·n⌉`` of its
``n`` tokens:

- comprehensiveness ``= mean_q [p(x) − p(x without the top k)]`` — higher: the top tokens matter;
- sufficiency ``= mean_q [p(x) − p(only the top k)]`` — lower: the top tokens suffice;

with ``p`` the probability of the target class (default: the class predicted on ``x``).
Removal (``removal``): ``"delete"`` (default, as ferret and ERASER) drops the tokens, shortening
the sequence; ``"pad"`` replaces them by [PAD] ids that stay attended (length kept). Special
tokens ([CLS], [SEP]) are never removed nor counted. Scores are ranked as given: pass
``scores.abs()`` to rank signed saliency by magnitude. Works for any sequence classifier.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedModel

from workbench.attribution.baselines import special_positions
from workbench.attribution.targets import resolve_target
from workbench.data import collate
from workbench.errors import WorkbenchError
from workbench.models import forward

FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5)
REMOVALS = ("delete", "pad")

__all__ = ["FRACTIONS", "REMOVALS", "Faithfulness", "aopc"]


@dataclass
class Faithfulness:
    """Per-example AOPC values ``[B]`` and the probability drops behind them ``[B, Q]``."""

    comprehensiveness: Tensor
    sufficiency: Tensor
    comprehensiveness_drops: Tensor
    sufficiency_drops: Tensor
    fractions: tuple[float, ...]
    removal: str

    def summary(self) -> dict[str, float]:
        """Means over examples."""
        return {
            "aopc_comprehensiveness": float(self.comprehensiveness.mean()),
            "aopc_sufficiency": float(self.sufficiency.mean()),
        }


def _perturbed(ids: list[int], types: list[int], drop: set[int], removal: str, pad_id: int) -> dict:
    """One example with positions ``drop`` removed (deleted or replaced by [PAD])."""
    if removal == "delete":
        # a sequence with nothing left (no special tokens to keep) becomes one [PAD]
        keep = [i for i in range(len(ids)) if i not in drop]
        if not keep:
            return {"input_ids": [pad_id], "token_type_ids": [0]}
        return {"input_ids": [ids[i] for i in keep], "token_type_ids": [types[i] for i in keep]}
    return {
        "input_ids": [pad_id if i in drop else t for i, t in enumerate(ids)],
        "token_type_ids": types,
    }


def _variants(
    input_ids: Tensor,
    attention_mask: Tensor,
    token_type_ids: Tensor,
    scores: Tensor,
    special: Tensor,
    fractions: Sequence[float],
    removal: str,
    pad_id: int,
) -> list[dict]:
    """For every example ``b``, fraction ``q`` and kind (0: top removed, 1: only top kept) the
    perturbed example, in that order (``B·Q·2`` of them)."""
    out = []
    for b in range(len(input_ids)):
        n = int(attention_mask[b].sum())
        ids, types = input_ids[b, :n].tolist(), token_type_ids[b, :n].tolist()
        candidates = [i for i in range(n) if not special[b, i]]
        ranked = sorted(candidates, key=lambda i: (-float(scores[b, i]), i))
        for q in fractions:
            top = set(ranked[: math.ceil(q * len(ranked) - 1e-9)])
            rest = set(candidates) - top
            out.extend(_perturbed(ids, types, drop, removal, pad_id) for drop in (top, rest))
    return out


def _probabilities(
    model: PreTrainedModel, examples: list[dict], targets: Tensor, batch_size: int, pad_id: int
) -> Tensor:
    """Target probability of each example ``[N]`` (batched by length)."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i]["input_ids"]))
    out = torch.empty(len(examples))
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            chosen = order[start : start + batch_size]
            batch = collate([{**examples[i], "label": 0, "index": i} for i in chosen], pad_id)
            probabilities = forward(model, batch).logits.softmax(-1)
            out[chosen] = probabilities.gather(1, targets[chosen, None])[:, 0]
    return out


def aopc(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor,
    token_type_ids: Tensor | None = None,
    *,
    scores: Tensor,
    target: int | str | Tensor = "pred",
    fractions: Sequence[float] = FRACTIONS,
    removal: str = "delete",
    special_ids: Collection[int] | None = None,
    batch_size: int = 64,
) -> Faithfulness:
    """AOPC comprehensiveness and sufficiency of ``scores`` ``[B, L]`` (or ``[B, 1, L]``, one
    view) for a classifier, on a batch of ``[B, L]`` inputs. ``special_ids``: never-removed ids
    (default: each sequence's first and last real token ids, i.e. [CLS] and [SEP])."""
    if model.config.num_labels == 1:
        raise WorkbenchError("AOPC needs class probabilities: the model is a regression model")
    if removal not in REMOVALS:
        raise WorkbenchError(f"unknown removal {removal!r}: use {' or '.join(REMOVALS)}")
    if not fractions or not all(0 < q <= 1 for q in fractions):
        raise WorkbenchError(f"fractions {list(fractions)} must lie in (0, 1]")
    scores = scores.squeeze(1) if scores.dim() == 3 else scores
    if scores.shape != input_ids.shape:
        raise WorkbenchError(
            f"scores {tuple(scores.shape)} do not match inputs {tuple(input_ids.shape)}"
        )
    types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": types}
    targets = resolve_target(model, batch, target)
    pad_id = int(model.config.pad_token_id or 0)
    with torch.no_grad():
        original = forward(model, batch).logits.softmax(-1).gather(1, targets[:, None])
    special = special_positions(input_ids, attention_mask, special_ids)
    variants = _variants(
        input_ids, attention_mask, types, scores.detach(), special, fractions, removal, pad_id
    )
    variant_targets = targets.repeat_interleave(2 * len(fractions))
    perturbed = _probabilities(model, variants, variant_targets, batch_size, pad_id)
    drops = original - perturbed.view(len(input_ids), len(fractions), 2).permute(2, 0, 1)
    return Faithfulness(
        comprehensiveness=drops[0].mean(-1),
        sufficiency=drops[1].mean(-1),
        comprehensiveness_drops=drops[0],
        sufficiency_drops=drops[1],
        fractions=tuple(fractions),
        removal=removal,
    )
