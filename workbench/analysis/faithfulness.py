"""Faithfulness of token attributions: AOPC comprehensiveness and sufficiency (ERASER, DeYoung et
al. 2020), under one of two sets of rules.

For each example, rank its ``n`` real non-special tokens by attribution (highest first) and, for
each fraction ``q``, take a rationale: the top ``k`` tokens. Then

- comprehensiveness ``= mean_q [p(x) − p(x without the rationale)]`` — higher: the top tokens
  matter;
- sufficiency ``= mean_q [p(x) − p(only the rationale)]`` — lower: the top tokens suffice;

with ``p`` the probability of the target class (default: the class predicted on ``x``).

The rules (``rules``) say which rationales enter the mean:

- ``"project"`` (default): ``q`` = 10 %, 20 %, …, 50 %; ``k = ⌈q·n⌉`` (at least one token);
  every token counts, whatever the sign of its score; every fraction enters the mean, also
  when two fractions give the same ``k``. Ties rank the earlier token first.
- ``"ferret"`` (ferret-xai 0.4.2's evaluators with their defaults): ``q`` = 10 %, 20 %, …,
  100 %; ``k = ⌊q·n⌋``, and a fraction with ``k = 0`` is skipped; of the top ``k`` only the
  tokens with a positive score are kept, and a fraction left with none is skipped; a fraction
  whose rationale is the same set as the last one kept is skipped. Ties rank the later token
  first (NumPy's ``argsort()[-k:][::-1]``). An example with no rationale left scores
  comprehensiveness 0 and sufficiency 1, as ferret returns. Unlike ferret, the perturbed inputs
  are built from token ids (ferret decodes them to text and tokenises again). Checked against
  ferret's own evaluators on 40 bundled tweets (``bench/ferret_aopc.py``): equal to 1.2e-8 when
  ferret is fed the same token ids; its decode round trip alone moves its values by up to 0.013.

Skipped fractions are NaN in the per-fraction drops. ``fractions`` overrides the rules'
fractions. Removal (``removal``): ``"delete"`` (default, as ferret and ERASER) drops the tokens,
shortening the sequence; ``"pad"`` replaces them by [PAD] ids that stay attended (length kept).
Special tokens ([CLS], [SEP]) are never removed nor counted. Scores are ranked as given: pass
``scores.abs()`` to rank signed saliency by magnitude. Works for any sequence classifier.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch
from scipy import stats
from torch import Tensor
from transformers import PreTrainedModel

from workbench.analysis.agreement import correlation_per_row
from workbench.analysis.attribution.baselines import special_positions
from workbench.analysis.attribution.targets import resolve_target
from workbench.analysis.settings import AOPC_RULES
from workbench.core.data import collate
from workbench.core.errors import WorkbenchError
from workbench.core.models import forward

FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5)
FERRET_FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
RULES = dict(zip(AOPC_RULES, (FRACTIONS, FERRET_FRACTIONS), strict=True))  # rules → fractions
REMOVALS = ("delete", "pad")
_EPSILON = 1e-9  # q·n computed in floating point: 0.7 · 10 must give 7

__all__ = [
    "FERRET_FRACTIONS",
    "FRACTIONS",
    "REMOVALS",
    "RULES",
    "Faithfulness",
    "aopc",
    "kendall_per_example",
    "leave_one_out",
]


@dataclass
class Faithfulness:
    """Per-example AOPC values ``[B]`` and the probability drops behind them ``[B, Q]`` (NaN
    where the rules skip a fraction)."""

    comprehensiveness: Tensor
    sufficiency: Tensor
    comprehensiveness_drops: Tensor
    sufficiency_drops: Tensor
    fractions: tuple[float, ...]
    rules: str = "project"


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


def _rationales(
    scores: list[float], candidates: list[int], fractions: Sequence[float], rules: str
) -> list[set[int] | None]:
    """The rationale (positions of the top tokens) of every fraction, None where ``rules``
    skip it; ``scores[i]`` is the score of position ``i``."""
    n = len(candidates)
    if rules == "project":
        ranked = sorted(candidates, key=lambda i: (-scores[i], i))
        return [set(ranked[: math.ceil(q * n - _EPSILON)]) for q in fractions]
    ranked = sorted(candidates, key=lambda i: (-scores[i], -i))
    out: list[set[int] | None] = []
    last = None
    for q in fractions:
        top = {i for i in ranked[: math.floor(q * n + _EPSILON)] if scores[i] > 0}
        kept = top if top and top != last else None
        out.append(kept)
        last = kept or last
    return out


def _variants(
    batch: dict[str, Tensor],
    special: Tensor,
    removal: str,
    pad_id: int,
    drops: Callable[[int, int, list[int]], list[tuple[int, tuple[set[int], ...]]]],
) -> tuple[list[dict], list[tuple[int, int]]]:
    """The perturbed examples of a batch: ``drops(b, n, candidates)`` gives, for example ``b``
    of ``n`` real tokens whose real non-special positions are ``candidates``, pairs ``(j, sets)``
    of the position sets removed from it one after the other; returns the examples in that
    order and the ``(b, j)`` of each ``sets``."""
    out, where = [], []
    for b in range(len(batch["input_ids"])):
        n = int(batch["attention_mask"][b].sum())
        ids, types = batch["input_ids"][b, :n].tolist(), batch["token_type_ids"][b, :n].tolist()
        for j, sets in drops(b, n, [i for i in range(n) if not special[b, i]]):
            out.extend(_perturbed(ids, types, drop, removal, pad_id) for drop in sets)
            where.append((b, j))
    return out, where


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


def _originals(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor,
    token_type_ids: Tensor | None,
    target: int | str | Tensor,
    special_ids: Collection[int] | None,
    removal: str,
) -> tuple[dict, Tensor, Tensor, Tensor, int]:
    """The batch (token types filled in), the target classes ``[B]``, their probabilities on
    the whole inputs ``[B]``, the special positions ``[B, L]`` and the [PAD] id; an unknown
    ``removal`` is refused."""
    if removal not in REMOVALS:
        raise WorkbenchError(f"unknown removal {removal!r}: use {' or '.join(REMOVALS)}")
    types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": types}
    targets = resolve_target(model, batch, target)
    with torch.no_grad():
        original = forward(model, batch).logits.softmax(-1).gather(1, targets[:, None])[:, 0]
    special = special_positions(input_ids, attention_mask, special_ids)
    return batch, targets, original, special, int(model.config.pad_token_id or 0)


def leave_one_out(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor,
    token_type_ids: Tensor | None = None,
    *,
    target: int | str | Tensor = "pred",
    removal: str = "delete",
    special_ids: Collection[int] | None = None,
    batch_size: int = 64,
) -> Tensor:
    """The drop ``p(x) − p(x without token i)`` of the target class's probability when each real
    non-special token alone is removed (deleted or replaced by [PAD], as :func:`aopc`'s
    ``removal``) → ``[B, L]``, NaN at special tokens and padding."""
    if model.config.num_labels == 1:
        raise WorkbenchError("leave-one-out needs class probabilities: the model is a regression")
    batch, targets, original, special, pad_id = _originals(
        model, input_ids, attention_mask, token_type_ids, target, special_ids, removal
    )
    variants, where = _variants(
        batch, special, removal, pad_id, lambda b, n, candidates: [(i, ({i},)) for i in candidates]
    )
    drops = torch.full(input_ids.shape, torch.nan)
    if where:
        rows, columns = (torch.tensor(part, dtype=torch.long) for part in zip(*where, strict=True))
        perturbed = _probabilities(model, variants, targets[rows], batch_size, pad_id)
        drops[rows, columns] = original[rows] - perturbed
    return drops


def kendall_per_example(scores: Tensor, drops: Tensor) -> Tensor:
    """Kendall's τ-b (``scipy.stats.kendalltau``) between each example's scores ``[B, L]`` and
    its leave-one-out drops ``[B, L]`` over the positions where the drop is defined → ``[B]``;
    NaN where undefined (fewer than two tokens, or a constant side)."""
    return correlation_per_row(scores, drops, ~drops.isnan(), stats.kendalltau)


def aopc(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor,
    token_type_ids: Tensor | None = None,
    *,
    scores: Tensor,
    target: int | str | Tensor = "pred",
    rules: str = "project",
    fractions: Sequence[float] | None = None,
    removal: str = "delete",
    special_ids: Collection[int] | None = None,
    batch_size: int = 64,
) -> Faithfulness:
    """AOPC comprehensiveness and sufficiency of ``scores`` ``[B, L]`` (or ``[B, 1, L]``, one
    view) for a classifier, on a batch of ``[B, L]`` inputs, under ``rules`` (``"project"`` or
    ``"ferret"``, see the module's docstring; ``fractions`` default to the rules' own).
    ``special_ids``: never-removed ids (default: each sequence's first and last real token
    ids, i.e. [CLS] and [SEP])."""
    if model.config.num_labels == 1:
        raise WorkbenchError("AOPC needs class probabilities: the model is a regression model")
    if rules not in RULES:
        raise WorkbenchError(f"unknown AOPC rules {rules!r}: use {' or '.join(RULES)}")
    fractions = tuple(RULES[rules] if fractions is None else fractions)
    if not fractions or not all(0 < q <= 1 for q in fractions):
        raise WorkbenchError(f"fractions {list(fractions)} must lie in (0, 1]")
    scores = (scores.squeeze(1) if scores.dim() == 3 else scores).detach()
    if scores.shape != input_ids.shape:
        raise WorkbenchError(
            f"scores {tuple(scores.shape)} do not match inputs {tuple(input_ids.shape)}"
        )
    batch, targets, original, special, pad_id = _originals(
        model, input_ids, attention_mask, token_type_ids, target, special_ids, removal
    )

    def rationales(b: int, n: int, candidates: list[int]) -> list:
        """Per fraction ``q`` the rules keep: the top removed, then only the top kept."""
        tops = _rationales(scores[b, :n].tolist(), candidates, fractions, rules)
        return [(q, (top, set(candidates) - top)) for q, top in enumerate(tops) if top is not None]

    variants, where = _variants(batch, special, removal, pad_id, rationales)
    rows = torch.tensor([b for b, _ in where], dtype=torch.long)
    perturbed = _probabilities(
        model, variants, targets[rows].repeat_interleave(2), batch_size, pad_id
    )
    drops = torch.full((2, len(input_ids), len(fractions)), torch.nan)
    if where:
        columns = torch.tensor([q for _, q in where], dtype=torch.long)
        drops[:, rows, columns] = original[rows] - perturbed.view(-1, 2).T
    kept = ~drops[0].isnan()
    counts = kept.sum(-1)
    means = drops.nan_to_num().sum(-1) / counts.clamp_min(1)
    none = counts == 0  # only under ferret's rules: ferret's values for "no rationale"
    return Faithfulness(
        comprehensiveness=torch.where(none, 0.0, means[0]),
        sufficiency=torch.where(none, 1.0, means[1]),
        comprehensiveness_drops=drops[0],
        sufficiency_drops=drops[1],
        fractions=fractions,
        rules=rules,
    )
