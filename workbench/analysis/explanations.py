"""Explanations of examples by trained runs: what the app's Case study page shows and what the
heatmaps of ``kdw export`` draw. :func:`explain` reads examples in one batch through a run's
model: probabilities, every class's attribution map and the predicted class's Grad saliency, one
:class:`Explanation` per example. torch and transformers are imported inside the functions that
compute, so that building ``kdw``'s parser (which reads :class:`HeatmapSettings`) stays fast.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from workbench.core.config import Checked, option
from workbench.core.errors import WorkbenchError

if TYPE_CHECKING:
    from torch import Tensor

    from workbench.analysis.attribution import ExplainerChoice
    from workbench.analysis.examples import Example
    from workbench.core.models import LoadedModel

FORWARD_ROWS = 16  # examples per forward pass of explain


@dataclass
class HeatmapSettings(Checked):
    """Which class the token attributions explain (how they are computed is the explainer's:
    :class:`~workbench.analysis.attribution.ExplainerChoice`)."""

    view: str = option(
        "pred",
        "class explained: pred (each model's prediction), gold (the example's label), all "
        "(one row per class), or a class name or index",
    )


@dataclass
class Explanation:
    """How one model reads one example.

    ``maps[c]`` is the attribution of class ``c`` over ``tokens`` (as a reader reads them:
    :func:`~workbench.analysis.attribution.words.shown_tokens`; IG: non-negative, unit L2;
    Grad: signed); ``saliency`` the Grad saliency of the predicted class (saliency loyalty);
    ``spans`` the characters each position covers (a fast tokenizer's offsets), by which two
    models of different tokenizers are compared on the words they share.
    Regression models have one class, ``"output"``, whose "probability" is the output value.
    """

    name: str
    run_id: str
    tokens: list[str]
    class_names: list[str]
    probabilities: list[float]
    predicted: int
    maps: list[list[float]]
    saliency: list[float]
    gold: int | None = None
    regression: bool = False
    full_length: int = 0  # tokens of the whole text; more than ``read`` when truncated
    longer: bool = False  # the text goes on past the full_length tokens counted (a huge text)
    read: int = 0  # the tokens the model read (before any word aggregation)
    tokenizer: str = ""  # the tokenizer's kind (tokenizer_kind): "WordPiece", "byte-level BPE"
    model: str = ""  # the distillation preset (a run's) and the number of layers: model_detail
    task: str = ""  # the task applied to: a bundled or GLUE task's name, a path, a hub id;
    # "" for a model given without a task (its own classes)
    spans: list | None = None  # (sequence, start, end) of each position's characters, or None
    # IG's completeness for the predicted class (ig maps only): (Σ attributions, F(x) − F(x'))
    completeness: tuple[float, float] | None = None
    baseline: str | None = None  # the IG baseline resolved for the model (ig maps only)
    decoder: bool = False  # a decoder classifier (its head reads the last token)
    gap_warning: str | None = None  # IG's completeness gap, said when over its limit

    @property
    def truncated(self) -> bool:
        """Whether the model read only the first ``read`` of the text's tokens."""
        return self.longer or self.full_length > self.read

    @property
    def truncation_note(self) -> str | None:
        """``"teacher (WordPiece tokenizer) read the first 128 of the text's 140 tokens"``,
        None for a text read whole."""
        if not self.truncated:
            return None
        return (
            f"{self.name} ({self.tokenizer} tokenizer) read the first {self.read} of the "
            f"text's {'more than ' if self.longer else ''}{self.full_length} tokens"
        )

    @property
    def completeness_gap(self) -> float | None:
        """``|Σ IG − (F(x) − F(x'))| / |F(x) − F(x')|`` (None without IG or without a change)."""
        if self.completeness is None or self.completeness[1] == 0:
            return None
        attributed, change = self.completeness
        return abs(attributed - change) / abs(change)

    def prediction_text(self) -> str:
        """``"positive 0.91"``: the predicted class and its probability (or the output)."""
        if self.regression:
            return f"output {self.probabilities[0]:.3f}"
        return f"{self.class_names[self.predicted]} {self.probabilities[self.predicted]:.2f}"


def gold_index(label: str | int | None, class_names: Sequence[str]) -> int | None:
    """The class index of a gold label given as a name or an index (None when absent)."""
    if label is None or (isinstance(label, float) and math.isnan(label)) or label == "":
        return None
    text = str(label).strip()
    if text in class_names:
        return list(class_names).index(text)
    if text.lstrip("-").isdigit() and 0 <= int(text) < len(class_names):
        return int(text)
    raise WorkbenchError(f"label {text!r} is not one of the classes {list(class_names)}")


def _class_names(loaded: LoadedModel) -> list[str]:
    return list(loaded.spec.label_names) or ["output"]


def _encode(
    loaded: LoadedModel, examples: Sequence[Example]
) -> tuple[dict, list[int], list[bool], tuple]:
    """The batch of ``examples`` (each ``[B, L]``; the tokenizer's encoding, which knows its
    words; padded on the right, whatever side the tokenizer pads), cut to the model's maximum
    length (:attr:`~workbench.core.models.LoadedModel.read_length`: a run's), the number of
    tokens of each example and whether it goes on past them, and the texts
    (and pairs) as tokenised: a text is read only as far as
    :func:`workbench.core.data.prefixes` takes it, and counted up to a megabyte
    (:func:`workbench.core.data.count_tokens`), so that no text exhausts memory."""
    if not examples:
        raise WorkbenchError("no examples to explain")
    if loaded.spec.pair and any(e.pair is None for e in examples):
        raise WorkbenchError(f"{loaded.name} is a pair task: give a second text too")
    texts = [e.text for e in examples]
    pairs = [e.pair or "" for e in examples] if loaded.spec.pair else None
    from workbench.core.data import count_tokens, prefixes

    tokenizer, limit = loaded.tokenizer, loaded.read_length
    args, _ = prefixes(tokenizer, texts, pairs, limit)
    batch = tokenizer(
        *args,
        truncation=True,
        max_length=limit,
        padding=True,
        padding_side="right",  # each row's tokens first, as the rows are read below
        return_tensors="pt",
        return_offsets_mapping=tokenizer.is_fast,
        verbose=False,
    )
    special = tokenizer.num_special_tokens_to_add(pair=pairs is not None)
    rows = zip(texts, *([pairs] if pairs else []), strict=True)
    counts = [[count_tokens(tokenizer, t) for t in row] for row in rows]
    lengths = [special + sum(n for n, _ in c) for c in counts]
    return batch, lengths, [any(more for _, more in c) for c in counts], args


def model_detail(loaded: LoadedModel) -> str:
    """``"kd, 2 layers"``: a run's distillation preset (none for a teacher or a model the
    workbench did not train) and the model's number of layers, which name no folder or run."""
    run = loaded.run
    preset = None if run is None else run.info().configs.get("objective", {}).get("preset")
    layers = f"{loaded.model.config.num_hidden_layers} layers"
    return layers if preset is None else f"{preset}, {layers}"


def _logits(model, batch) -> Tensor:
    """The float logits ``[N, C]`` of an encoded batch, a few rows at a time (attention scores
    grow with rows × L²), without a graph."""
    import torch

    from workbench.core.models import forward

    starts = range(0, len(batch["input_ids"]), FORWARD_ROWS)
    with torch.no_grad():
        parts = ({k: v[s : s + FORWARD_ROWS] for k, v in batch.items()} for s in starts)
        return torch.cat([forward(model, part).logits.float() for part in parts])


def _read_row(tokenizer, batch, offsets, row: int, texts: list[str], maps, saliency, words):
    """Example ``row`` of an encoded batch as a reader reads it: its tokens (or words, with
    ``words``), its maps ``[C, n]`` and saliency ``[n]`` over them (``maps [C, L]`` and
    ``saliency [L]`` over its ``L`` real tokens, summed into words where asked), and the spans
    of the text each covers (a fast tokenizer's offsets; None without)."""
    from workbench.analysis.attribution import to_words, word_groups
    from workbench.analysis.attribution.words import group_spans, shown_tokens
    from workbench.core.data.alignment import token_spans, word_spans

    length = saliency.shape[0]
    ids = batch["input_ids"][row, :length].tolist()
    spans, row_offsets, sequences = None, None, [None] * length
    if offsets is not None:
        sequences = batch.sequence_ids(row)[:length]
        row_offsets = offsets[row, :length].tolist()
        positions = token_spans(row_offsets, sequences, texts)
        spans = word_spans(positions, batch.word_ids(row)[:length])
    tokens = shown_tokens(
        tokenizer, tokenizer.convert_ids_to_tokens(ids), row_offsets, sequences, texts
    )
    if words is not None:
        tokens, groups = word_groups(batch, row, texts, length)
        maps, saliency = (to_words(x, groups, words) for x in (maps, saliency))
        spans = None if spans is None else group_spans(spans, groups)
    return tokens, maps, saliency, spans


def explain(
    loaded: LoadedModel,
    examples: Sequence[Example],
    name: str | None = None,
    explainer: ExplainerChoice | None = None,
    words: str | None = None,
) -> list[Explanation]:
    """Probabilities and per-class maps of ``examples`` under one model, in one batch, by
    :func:`workbench.analysis.attribution.compute_maps` under ``explainer`` (default: ig), and
    the Grad saliency of each predicted class; with ``words`` (sum, mean, max-abs) the maps and
    saliency of each word (:mod:`workbench.analysis.attribution.words`). IG maps come with their
    completeness for the predicted class (``ig_completeness``) and, where its gap is over the
    limit, the warning that says so (``completeness_warning``)."""

    from workbench.analysis.attribution import (
        AttributionSettings,
        ExplainerChoice,
        check_layer,
        compute_maps,
        grad_saliency,
    )
    from workbench.analysis.attribution.baselines import resolve_baseline
    from workbench.analysis.attribution.gradients import completeness_gaps
    from workbench.analysis.attribution.words import check_words
    from workbench.core.data import tokenizer_kind
    from workbench.core.parts import LAST, parts_of

    check_words(words)
    config, explainer = AttributionSettings(views="all"), explainer or ExplainerChoice()
    check_layer(config, explainer)
    batch, full_lengths, longer, args = _encode(loaded, examples)
    offsets = batch.pop("offset_mapping", None)
    model, tokenizer, class_names = loaded.model, loaded.tokenizer, _class_names(loaded)
    logits = _logits(model, batch)
    regression = loaded.spec.regression
    probabilities = logits if regression else logits.softmax(-1)
    predicted = logits.argmax(-1)
    inputs = (batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
    saliency = grad_saliency(model, *inputs, target=predicted)
    maps, _ = compute_maps(model, batch, config, explainer=explainer)
    pairs, gaps, baseline = [None] * len(examples), [None] * len(examples), None
    if explainer.name == "ig":
        baseline = resolve_baseline(model, explainer.settings.baseline)
        pairs, gaps = completeness_gaps(model, batch, predicted, explainer.settings, config)
    detail, kind, out = model_detail(loaded), tokenizer_kind(tokenizer), []
    name = name or loaded.name
    for row, example in enumerate(examples):
        length = int(batch["attention_mask"][row].sum())
        read = maps[row, :, :length], saliency[row, :length]
        texts = [a[row] for a in args]
        tokens, row_maps, row_saliency, spans = _read_row(
            tokenizer, batch, offsets, row, texts, *read, words
        )
        out.append(
            Explanation(
                name=name,
                run_id=loaded.source,
                tokens=tokens,
                class_names=class_names,
                probabilities=probabilities[row].tolist(),
                predicted=int(predicted[row]),
                maps=row_maps.tolist(),
                saliency=row_saliency.tolist(),
                gold=None if regression else gold_index(example.label, class_names),
                regression=regression,
                full_length=full_lengths[row],
                longer=longer[row],
                read=length,
                tokenizer=kind,
                model=detail,
                task="" if loaded.data is None else loaded.data.task,
                spans=spans,
                completeness=pairs[row],
                baseline=baseline,
                decoder=parts_of(model).reads == LAST,
                gap_warning=gaps[row] and f"{name}: {gaps[row]}",
            )
        )
    return out
