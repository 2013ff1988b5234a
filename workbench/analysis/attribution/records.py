"""Attribute a list of texts and keep the result: one :class:`AttributionRecord` per text, saved
as JSON Lines (one record per line, settings included) and loaded back unchanged."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import BatchEncoding, PreTrainedModel, PreTrainedTokenizerBase

from workbench.analysis.attribution.gradients import completeness_gaps
from workbench.analysis.attribution.registry import AttributionSettings, ExplainerChoice
from workbench.analysis.attribution.settings import (
    baseline_resolved,
    check_layer,
    compute_maps,
    recorded_settings,
)
from workbench.analysis.attribution.words import check_words, shown_tokens, to_words, word_groups
from workbench.core.data import collate, pad_id, prefixes, tokenizer_kind
from workbench.core.errors import WorkbenchError
from workbench.core.files import parse_json_lines, regular_file, write_json_lines
from workbench.core.models import check_max_length, forward

logger = logging.getLogger(__name__)

__all__ = ["AttributionRecord", "attribute_texts", "load_attributions", "save_attributions"]


@dataclass
class AttributionRecord:
    """One text's attribution: ``maps[v][i]`` is view ``views[v]``'s value for ``tokens[i]``
    (sub-tokens, or words when ``settings["words"]`` names an aggregation: then ``tokens`` holds
    the words). ``prediction`` is the predicted class and ``probabilities`` the class
    probabilities (for a regression model: its output, as a float and a one-element list);
    ``settings`` records the explainer and its settings."""

    text: str
    tokens: list[str]
    views: list[str]
    maps: list[list[float]]
    prediction: int | float
    probabilities: list[float]
    settings: dict
    pair: str | None = None
    label: int | None = None
    truncated: bool = False
    warnings: list[str] = field(default_factory=list)


def special_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """The ids of [CLS] and [SEP] (those the tokenizer has): never removed nor ranked."""
    return {i for i in (tokenizer.cls_token_id, tokenizer.sep_token_id) if i is not None}


def _encode(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    pairs: Sequence[str] | None,
    max_length: int,
) -> tuple[BatchEncoding, list[bool], tuple]:
    for i, text in enumerate([*texts, *(pairs or [])]):
        if not str(text).strip():
            which = f"text {i}" if i < len(texts) else f"pair {i - len(texts)}"
            raise WorkbenchError(f"{which} is empty: give at least one word to attribute")
    # each text read only as far as the model sees it: bounded whatever the text's size
    args, cut = prefixes(tokenizer, texts, pairs, max_length)
    full = tokenizer(*args, truncation=False, verbose=False)["input_ids"]
    encoded = tokenizer(
        *args,
        truncation=True,
        max_length=max_length,
        return_offsets_mapping=tokenizer.is_fast,
        verbose=False,
    )
    truncated = [was_cut or len(ids) > max_length for was_cut, ids in zip(cut, full, strict=True)]
    return encoded, truncated, args


def _check_inputs(model, settings, explainer, words, count: int, pairs, labels) -> None:
    """What :func:`attribute_texts` is given, checked before any text is read: the layer for the
    explainer, the word aggregation, one pair and one label per text, the length the model
    reads."""
    check_layer(settings, explainer)
    check_words(words)
    if pairs is not None and len(pairs) != count:
        raise WorkbenchError(f"{count} texts but {len(pairs)} pairs: give one pair per text")
    if labels is not None and len(labels) != count:
        raise WorkbenchError(f"{count} texts but {len(labels)} labels")
    check_max_length(model, settings.max_length, "the model")


def _shown(tokenizer, encoded: BatchEncoding, i: int, texts: list[str], scores, words):
    """Text ``i``'s tokens as a reader reads them and its scores ``[V, L]`` over them, or its
    words and their scores ``[V, W]`` with ``words`` (an aggregation)."""
    ids = encoded["input_ids"][i]
    tokens = tokenizer.convert_ids_to_tokens(ids)
    if tokenizer.is_fast:
        offsets, sequences = encoded["offset_mapping"][i], encoded.sequence_ids(i)
        tokens = shown_tokens(tokenizer, tokens, offsets, sequences, texts)
    if words is not None:
        tokens, groups = word_groups(encoded, i, texts, len(ids))
        scores = to_words(scores, groups, words)
    return tokens, scores


def attribute_texts(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    pairs: Sequence[str] | None = None,
    *,
    settings: AttributionSettings | None = None,
    labels: Sequence[int] | None = None,
    explainer: ExplainerChoice | str | None = None,
    words: str | None = None,
) -> list[AttributionRecord]:
    """Attribute ``texts`` (with ``pairs`` as second segments) in batches of similar length,
    under ``explainer`` (a registered name or an :class:`ExplainerChoice`; default: ig with its
    defaults), per sub-token or, with ``words`` (sum, mean or max-abs), per
    word (:mod:`workbench.analysis.attribution.words`). What the app calls: e.g.
    ``attribute_texts(model, tokenizer, ["a text"], explainer="lime",
    settings=AttributionSettings(views="pred"), words="sum")[0]`` has ``tokens`` (the words) and
    ``maps[0]`` (their scores).

    Texts longer than ``settings.max_length`` tokens are truncated: the record says so in
    ``truncated`` and ``warnings`` (and a warning is logged). An IG map whose completeness gap
    is over its limit says so in ``warnings`` too (:func:`completeness_warning`). Empty texts,
    ``labels`` of another length and ``views="gold"`` without labels are errors.
    """
    settings = settings or AttributionSettings()
    explainer = ExplainerChoice(explainer) if isinstance(explainer, str) else explainer
    explainer = explainer or ExplainerChoice()
    _check_inputs(model, settings, explainer, words, len(texts), pairs, labels)
    encoded, truncated, args = _encode(tokenizer, texts, pairs, settings.max_length)
    token_types = encoded.get("token_type_ids") or [[0] * len(i) for i in encoded["input_ids"]]
    examples = [
        {"input_ids": ids, "token_type_ids": types, "label": 0, "index": i}
        for i, (ids, types) in enumerate(zip(encoded["input_ids"], token_types, strict=True))
    ]
    order = sorted(range(len(texts)), key=lambda i: len(examples[i]["input_ids"]))
    records: dict[int, AttributionRecord] = {}
    explainer = baseline_resolved(model, explainer)
    recorded = recorded_settings(settings, explainer, words)
    kind, special = tokenizer_kind(tokenizer), special_ids(tokenizer)
    regression = model.config.num_labels == 1
    for start in range(0, len(order), settings.batch_size):
        chosen = order[start : start + settings.batch_size]
        batch = collate([examples[i] for i in chosen], pad_id(tokenizer))
        gold = None if labels is None else torch.tensor([labels[i] for i in chosen])
        maps, names = compute_maps(model, batch, settings, gold, special, explainer)
        with torch.no_grad():
            logits = forward(model, batch).logits
        probabilities = logits if regression else logits.softmax(-1)
        gaps = [None] * len(chosen)
        if explainer.name == "ig":
            predicted, ig = logits.argmax(-1), explainer.settings
            gaps = completeness_gaps(model, batch, predicted, ig, settings, special)[1]
        for row, i in enumerate(chosen):
            ids = examples[i]["input_ids"]
            warnings = []
            if truncated[i]:
                warnings.append(f"truncated to {settings.max_length} tokens ({kind} tokenizer)")
                logger.warning("text %d truncated to %d tokens", i, settings.max_length)
            if gaps[row] is not None:
                warnings.append(gaps[row])
            texts_i = [a[i] for a in args]
            tokens, scores = _shown(tokenizer, encoded, i, texts_i, maps[row, :, : len(ids)], words)
            records[i] = AttributionRecord(
                text=texts[i],
                pair=None if pairs is None else pairs[i],
                tokens=tokens,
                views=names,
                maps=scores.tolist(),
                prediction=float(logits[row, 0]) if regression else int(logits[row].argmax()),
                probabilities=probabilities[row].tolist(),
                settings=recorded,
                label=None if labels is None else int(labels[i]),
                truncated=truncated[i],
                warnings=warnings,
            )
    return [records[i] for i in range(len(texts))]


def save_attributions(records: Sequence[AttributionRecord], path: str | Path) -> Path:
    """Write records as JSON Lines (atomically: a temporary file, then a rename)."""
    path = Path(path)
    write_json_lines(path, (dataclasses.asdict(record) for record in records))
    return path


def load_attributions(path: str | Path) -> list[AttributionRecord]:
    """Read records written by :func:`save_attributions`."""
    path = Path(path)
    if not path.exists():
        raise WorkbenchError(f"{path} does not exist")
    names = {f.name for f in dataclasses.fields(AttributionRecord)}
    regular_file(path, "attributions")  # a pipe or a device would block the reader
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise WorkbenchError(f"{path} is not UTF-8 text ({error.reason})") from None
    records = []
    for number, values in parse_json_lines(text, str(path)):
        try:
            if set(values) - names:
                raise ValueError(f"unknown fields {sorted(set(values) - names)}")
            records.append(AttributionRecord(**values))
        except (ValueError, TypeError) as error:
            raise WorkbenchError(
                f"{path}, line {number}: not an attribution record ({error})"
            ) from None
    return records
