"""Contextual KD (Park et al. 2021; docs/methods.md §3): Word Relation (WR) and Layer Transforming
Relation (LTR), besides vanilla KD's two terms: ``L = CE + KD + λ_WR L_WR + λ_LTR L_LTR``, the
student's layers mapped uniformly onto the teacher's, embeddings included.

Both terms compare the pair and triple *relations* of :mod:`workbench.analysis.relation_geometry`
among a sequence of vectors, so the student's width may differ from the teacher's (``"l2_mean"`` is
RKD-style, the released code's ``distnorm``). WR runs over the tokens of one layer; LTR over the
mapped layers (embeddings included) of one token. Losses (``variant="paper"``): squared error
between teacher and student relations, averaged over valid pairs, and over valid triples.
``variant="official"`` swaps the pair term for the released code's: per row, softmax of the
teacher's cosine similarities against the log-softmax of the student's, diagonal and pads excluded,
``KL(sum)`` divided by the released denominator ``Σ_seq (#real)²`` (real pairs *including*
``i = j``), computed without ``−inf`` so it is NaN-free.

Invariances (what the tests check): ``"cosine"`` and the angles are invariant to rotations and
scalings of either model's space, also into another width; ``"l2"`` only to rotations and
translations; ``"l2_mean"`` to rotations, translations and scalings.

Differences from the released code, by design: the triple term masks pads, positions outside the
sequence and the degenerate ``j = i`` / ``k = i`` entries, and divides by the number of valid
triples; the released code clamps window indices at the padded length, keeps pads inside windows
and divides by ``W²`` per real centre, so its value depends on how much padding a batch has.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from kd.methods.layer_map import uniform_layers
from kd.methods.objective import (
    TOKENS,
    Ablation,
    Claim,
    Method,
    Objective,
    Preset,
    StepInputs,
    TeacherField,
    Term,
    register_method,
    weight_parameter,
)
from workbench.core.config import Checked, option, positive
from workbench.core.lazy import lazy_module

if TYPE_CHECKING:
    from torch import Tensor
    from transformers import PreTrainedModel

    from workbench.analysis.relation_geometry import PairKind

torch = lazy_module("torch")
geometry = lazy_module("workbench.analysis.relation_geometry")
alignment = lazy_module("workbench.core.data.alignment")
models = lazy_module("workbench.core.models")

Variant = Literal["paper", "official"]


@dataclass
class CKDSettings(Checked):
    """Contextual KD: the angle window of the word relations."""

    ckd_window: int = option(
        10, "CKD angle window half-width δ (tokens each side)", domain=positive
    )


_EXCLUDED_LOGIT = -1e4
"""Finite logit for excluded entries: ``exp`` underflows to exactly 0, no ``−inf`` anywhere."""


def _masked_mse(student: Tensor, teacher: Tensor, valid: Tensor) -> Tensor:
    """Mean of ``(student − teacher)²`` over ``valid`` entries (0 if there are none)."""
    squared = torch.where(valid, (student - teacher).pow(2), 0.0)
    return squared.sum() / valid.sum().clamp_min(1)


def _official_pair_kl(student: Tensor, teacher: Tensor, mask: Tensor) -> Tensor:
    """Released pair term: row-wise ``KL(softmax(cos_t) ‖ softmax(cos_s))`` over valid pairs.

    Shapes: ``student [N, S, d_s]``, ``teacher [N, S, d_t]``, ``mask [N, S]`` bool. Excluded
    entries get a large finite negative logit before the softmax and are dropped from the sum,
    so rows without a valid entry contribute 0 and nothing is NaN. Logits are ``−(1 − cos)``,
    which has the same softmax as ``cos``.
    """
    student_dist, valid = geometry.pairwise_distance_relation(student, mask, "cosine")
    teacher_dist, _ = geometry.pairwise_distance_relation(teacher, mask, "cosine")
    log_q = torch.log_softmax((-student_dist).masked_fill(~valid, _EXCLUDED_LOGIT), dim=-1)
    log_p = torch.log_softmax((-teacher_dist).masked_fill(~valid, _EXCLUDED_LOGIT), dim=-1)
    kl = torch.where(valid, log_p.exp() * (log_p - log_q), 0.0)
    return kl.sum() / mask.sum(-1).pow(2).sum().clamp_min(1)  # real pairs, i = j included


def _relation_loss(
    student: Tensor,
    teacher: Tensor,
    mask: Tensor,
    window: int,
    pair_kind: PairKind,
    pair_weight: float,
    triple_weight: float,
    variant: Variant,
) -> Tensor:
    """``pair_weight·L_pair + triple_weight·L_triple`` over sequences of vectors.

    Shapes: ``student [N, S, d_s]``, ``teacher [N, S, d_t]`` (used detached), ``mask [N, S]``
    bool. A term whose weight is 0 is not computed.
    """
    teacher = teacher.detach()
    loss = student.new_zeros(())
    if pair_weight:
        if variant == "official":
            pair = _official_pair_kl(student, teacher, mask)
        else:
            student_rel, valid = geometry.pairwise_distance_relation(student, mask, pair_kind)
            teacher_rel, _ = geometry.pairwise_distance_relation(teacher, mask, pair_kind)
            pair = _masked_mse(student_rel, teacher_rel, valid)
        loss = loss + pair_weight * pair
    if triple_weight:
        student_angles, valid = geometry.windowed_angle_relation(student, mask, window)
        teacher_angles, _ = geometry.windowed_angle_relation(teacher, mask, window)
        loss = loss + triple_weight * _masked_mse(student_angles, teacher_angles, valid)
    return loss


def _stack_layers(
    student: Tensor | Sequence[Tensor],
    teacher: Tensor | Sequence[Tensor],
    attention_mask: Tensor | None,
    pair_kind: str,
    variant: str,
) -> tuple[Tensor, Tensor, Tensor]:
    """The options checked, then both sides as ``[B, K, L, d]`` (a sequence of ``[B, L, d]`` is
    stacked on dim 1 and a single ``[B, L, d]`` tensor becomes ``K = 1``) and the real-token
    mask ``[B, L]``. Raises ValueError on an unknown option or unless ``B, K, L`` agree."""
    if variant not in ("paper", "official"):
        raise ValueError(f"variant must be 'paper' or 'official', got {variant!r}")
    if pair_kind not in ("cosine", "l2", "l2_mean"):
        raise ValueError(f"pair_kind must be 'cosine', 'l2' or 'l2_mean', got {pair_kind!r}")
    if variant == "official" and pair_kind != "cosine":
        raise ValueError("variant='official' is the cosine/KL pair term: use pair_kind='cosine'")
    stacked = []
    for x in (student, teacher):
        x = x if isinstance(x, torch.Tensor) else torch.stack(tuple(x), dim=1)
        if x.dim() == 3:
            x = x.unsqueeze(1)
        if x.dim() != 4:
            raise ValueError(f"hidden states must be [B, L, d] or [B, K, L, d], got {x.dim()}-D")
        stacked.append(x)
    if stacked[0].shape[:3] != stacked[1].shape[:3]:
        raise ValueError(
            f"student {tuple(stacked[0].shape)} and teacher {tuple(stacked[1].shape)} must agree "
            "on [B, K, L] (widths may differ)"
        )
    batch, _, length, _ = stacked[0].shape
    return *stacked, geometry.real_mask(attention_mask, batch, length, stacked[0].device)


def word_relation_loss(
    student_hidden: Tensor | Sequence[Tensor],
    teacher_hidden: Tensor | Sequence[Tensor],
    attention_mask: Tensor | None,
    *,
    window: int = CKDSettings.ckd_window,
    pair_kind: PairKind = "cosine",
    pair_weight: float = 1.0,
    triple_weight: float = 1.0,
    variant: Variant = "paper",
) -> Tensor:
    """Word Relation loss ``L_WR``: token–token relations within each mapped layer.

    Args:
        student_hidden: ``[B, L, d_s]`` (one layer) or ``[B, K, L, d_s]`` / a sequence of ``K``
            ``[B, L, d_s]`` tensors (``K`` mapped layers, paired one-to-one with the teacher's).
        teacher_hidden: ``[B, L, d_t]`` or ``[B, K, L, d_t]`` likewise; used detached.
        attention_mask: ``[B, L]`` real-token mask (``None``: all real).
        window: half-width ``δ`` of the angle window (default 10: 21 tokens).
        pair_kind, variant: see the module docstring (``"official"``: cosine only).
        pair_weight, triple_weight: the pair and triple (angle) terms' weights (0 skips one).

    Returns:
        Scalar ``pair_weight·L_pair + triple_weight·L_triple``, each averaged over the valid
        pairs / triples of all layers (the mean over layers: each has the same valid set).
    """
    student, teacher, mask = _stack_layers(
        student_hidden, teacher_hidden, attention_mask, pair_kind, variant
    )
    mask = mask.repeat_interleave(student.shape[1], dim=0)
    student, teacher = student.flatten(0, 1), teacher.flatten(0, 1)
    return _relation_loss(
        student, teacher, mask, window, pair_kind, pair_weight, triple_weight, variant
    )


def layer_relation_loss(
    student_layers: Tensor | Sequence[Tensor],
    teacher_layers: Tensor | Sequence[Tensor],
    attention_mask: Tensor | None,
    *,
    window: int | None = None,
    pair_kind: PairKind = "cosine",
    pair_weight: float = 1.0,
    triple_weight: float = 1.0,
    variant: Variant = "paper",
) -> Tensor:
    """Layer Transforming Relation loss ``L_LTR``: for each real token, the relations among its
    ``K`` mapped-layer representations (embeddings included).

    Args:
        student_layers: ``[B, K, L, d_s]`` or a sequence of ``K`` ``[B, L, d_s]`` tensors.
        teacher_layers: ``[B, K, L, d_t]`` likewise, the teacher layers mapped to the student's;
            used detached.
        attention_mask: ``[B, L]`` real-token mask (``None``: all real).
        window: half-width of the angle window over layers; ``None`` covers all ``K`` layers.
        pair_kind, pair_weight, triple_weight, variant: as in :func:`word_relation_loss`.

    Returns:
        Scalar loss; every real token has the same number of valid layer pairs / triples, so
        each term is the mean over real tokens of the per-token mean.
    """
    student, teacher, mask = _stack_layers(
        student_layers, teacher_layers, attention_mask, pair_kind, variant
    )
    layers = student.shape[1]
    window = max(layers - 1, 1) if window is None else window
    mask = mask.reshape(-1, 1).expand(-1, layers)
    student, teacher = (x.transpose(1, 2).flatten(0, 1) for x in (student, teacher))
    return _relation_loss(
        student, teacher, mask, window, pair_kind, pair_weight, triple_weight, variant
    )


def _resolve(objective: Objective) -> None:
    """The mapping checked against the two models' depths; the settings need nothing decided."""
    relation_pairs(objective)


def relation_pairs(objective: Objective) -> list[tuple[int, int]]:
    """The ``(student, teacher)`` hidden-state pairs of the relation terms: the uniform
    mapping."""
    return uniform_layers(objective.teacher_layers, objective.student_layers)


# what WR and LTR read, and how they compare across tokenizers
STATES = {
    "teacher_fields": ("relation_states",),
    "hidden_states": True,
    "on_words": "each mapped layer's token states averaged over the word's tokens",
}


def _teacher_relation_states(objective: Objective, teacher: PreTrainedModel, batch) -> Tensor:
    hidden = models.forward(teacher, batch, hidden_states=True).hidden_states
    states = torch.stack([hidden[t] for _, t in relation_pairs(objective)], dim=2)  # [B, L, K, d]
    if "word_ids" in batch:  # another tokenizer's student: word states, the mean of its
        ids = batch["word_ids"]  # tokens, in the first W of the teacher's token rows
        return alignment.pad_words(alignment.pool_words(states, ids, "mean"), ids.shape[1])
    return states


def _relation_states(objective: Objective, inputs: StepInputs) -> tuple[Tensor, Tensor, Tensor]:
    """Student and teacher states ``[B, K, L, d]`` of the mapped layers and their mask
    ``[B, L]``; across tokenizers, of the shared words (``L`` = ``W``)."""
    hidden = inputs.student.hidden_states
    student = torch.stack([hidden[s] for s, _ in relation_pairs(objective)], dim=1)
    mask = inputs.batch["attention_mask"]
    teacher = inputs.teacher["relation_states"]  # [B, L_t, K, d]
    if "word_ids" in inputs.batch:
        ids = inputs.batch["word_ids"]
        student = alignment.pool_words(student.transpose(1, 2), ids, "mean").transpose(1, 2)
        mask = alignment.word_mask(ids)
        teacher = teacher[:, : mask.shape[1]]  # the shared words, in the first W rows
    return student, teacher.transpose(1, 2), mask


def _wr(objective: Objective, inputs: StepInputs) -> Tensor:
    student, teacher, mask = _relation_states(objective, inputs)
    window, parity = objective.of(CKDSettings).ckd_window, objective.config.parity
    return word_relation_loss(student, teacher, mask, window=window, variant=parity)


def _ltr(objective: Objective, inputs: StepInputs) -> Tensor:
    student, teacher, mask = _relation_states(objective, inputs)
    return layer_relation_loss(student, teacher, mask, variant=objective.config.parity)


register_method(
    "ckd",
    settings=CKDSettings,
    # the teacher's layers are the mapping's, which the student's depth sets: part of a cache's
    # key
    teacher_fields={
        "relation_states": TeacherField(
            _teacher_relation_states,
            per_token=True,
            cacheable=False,
            key=lambda o: {"relation_pairs": relation_pairs(o)},
        )
    },
    # Pairs and windowed triples: two counts at once, so a batch split into parts (processes,
    # accumulation) is weighted by examples and gives nearly, not exactly, the whole batch's
    # value.
    terms={"wr": Term(_wr, exact_split=False, **STATES), "ltr": Term(_ltr, unit=TOKENS, **STATES)},
    method=Method(
        frozenset({"wr", "ltr"}),
        _resolve,
        record=lambda o: {
            "relation_pairs": relation_pairs(o),
            "ckd_window": o.of(CKDSettings).ckd_window,
        },
        layer_pairs="relation_pairs",
        mapping="uniform mapping of the relation terms (CKD)",
    ),
    parameters={
        "wr": weight_parameter("CKD: λ of word relation", "wr"),
        "ltr": weight_parameter("CKD: λ of layer-transforming relation", "ltr"),
    },
    presets={
        "ckd": Preset(
            {"ce": 0.5, "kd": 0.5, "wr": 1.0, "ltr": 1.0},
            {"ce": 0.5, "kd": 0.5, "wr": 1.0, "ltr": 1.0},
            official_kd_form="soft-ce",
            own=("wr", "ltr"),
            name="CKD",
            reference="Park et al. 2021",
            space={"wr": "0.1,1,10", "ltr": "0.1,1,10"},
            tuned=("wr", "ltr"),
            ablations=(
                Ablation("w/o wr", "ckd-terms", weights={"wr": 0.0}),
                Ablation("w/o ltr", "ckd-terms", weights={"ltr": 0.0}),
            ),
            claims=(Claim("accuracy", "≥"),),
        )
    },
)
