"""What the app and the reproduction report compute over a whole split and inside one model
(no Streamlit here): each model's predictions and saliency per example (Grad saliency, or any
registered explainer; per sub-token or per word), the loyalty of students to their teacher
(label, probability and saliency loyalty, docs/methods.md §6, and the attribution gap), and
hidden states.

Saliency loyalty compares two models' scores position by position. Two models of one tokenizer
read the same positions (sub-tokens, or its words); a student of another tokenizer is compared
with its teacher on the words both tokenisations share (:mod:`workbench.core.data.alignment`:
each side's scores summed per word; IG maps summed and normalised over the words again), from
the characters each position covers."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from workbench.analysis.agreement import attribution_gap, pearson_per_example
from workbench.analysis.attribution import (
    ExplainerChoice,
    attribution_maps,
    explain_batch,
    to_words,
    word_groups,
)
from workbench.analysis.attribution.words import group_spans
from workbench.analysis.examples import Example
from workbench.analysis.metrics import nan_mean, probability_loyalties, task_metrics
from workbench.core.data import Split, TaskSpec, batches, encode, pad_id, prefixes
from workbench.core.data.alignment import Span, align, pool_words, word_maps, word_mask
from workbench.core.data.encoding import token_spans_of
from workbench.core.models import LoadedModel, forward


@dataclass
class SplitOutputs:
    """One model over a split: logits ``[N, C]``, the saliency (Grad saliency, or another
    explainer's scores) of each example's predicted class ``[N, L]`` over its real tokens
    (``mask`` ``[N, L]``; per word, ``[N, W]`` over its words) and, on request, AD-KD's
    normalised IG maps of every class ``[N, V, L]`` (m = 1, [PAD] baseline); ``spans``: per
    example, the characters each position of ``saliency`` covers (None without a fast
    tokenizer)."""

    logits: Tensor
    saliency: Tensor
    mask: Tensor
    maps: Tensor | None = None
    spans: list[list[Span | None]] | None = None


def split_outputs(
    loaded: LoadedModel,
    split: Split,
    batch_size: int = 32,
    maps: bool = False,
    explainer: ExplainerChoice | str = "grad",
    words: str | None = None,
) -> SplitOutputs:
    """Logits and the saliency of ``explainer`` (default: Grad saliency; any registered
    explainer, :func:`~workbench.analysis.attribution.explain_batch`) of each example's predicted
    class (and with ``maps`` the IG maps) of every example, in batches of similar length; with
    ``words`` (sum, mean, max-abs) the saliency per word (:func:`word_saliency`)."""
    dataset = encode(split, loaded.tokenizer, loaded.max_length, loaded.spec.regression)
    order = sorted(range(len(dataset)), key=lambda i: len(dataset.input_ids[i]))
    length = max(len(ids) for ids in dataset.input_ids)
    saliency = torch.zeros(len(dataset), length)
    mask = torch.zeros(len(dataset), length, dtype=torch.long)
    logits: Tensor | None = None
    all_maps: Tensor | None = None
    for batch in batches(dataset, order, batch_size, pad_id(loaded.tokenizer)):
        with torch.no_grad():
            out = forward(loaded.model, batch).logits.float()
        width = batch["input_ids"].shape[1]
        inputs = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        saliency[batch["index"], :width] = explain_batch(
            loaded.model, batch, explainer, target=out.argmax(-1)
        )
        mask[batch["index"], :width] = batch["attention_mask"]
        if logits is None:
            logits = out.new_zeros((len(dataset), out.shape[-1]))
        logits[batch["index"]] = out
        if maps:
            views = attribution_maps(loaded.model, *inputs, views="all")
            if all_maps is None:
                all_maps = views.new_zeros((len(dataset), views.shape[1], length))
            all_maps[batch["index"], :, :width] = views
    assert logits is not None, "empty split"
    fast = loaded.tokenizer.is_fast
    spans = token_spans_of(split, loaded.tokenizer, loaded.max_length) if fast else None
    if words is not None:
        saliency, mask, spans = word_saliency(loaded, split, saliency, words)
    return SplitOutputs(logits, saliency, mask, all_maps, spans)


def word_saliency(
    loaded: LoadedModel, split: Split, saliency: Tensor, how: str
) -> tuple[Tensor, Tensor, list[list[Span | None]]]:
    """Sub-token scores ``[N, L]`` of a split, as :func:`~workbench.core.data.encode` read its
    texts, aggregated into words (``how``: sum, mean or max-abs; the fast tokenizer's
    ``word_ids()``, special tokens a word each) → scores ``[N, W]``, their mask ``[N, W]``
    (``W``: the most words of a text) and each word's characters."""
    tokenizer, length = loaded.tokenizer, loaded.max_length
    args, _ = prefixes(tokenizer, split.texts, split.pairs, length)
    encoding = tokenizer(*args, truncation=True, max_length=length, verbose=False)
    token_spans = token_spans_of(split, tokenizer, length)
    rows, spans = [], []
    for i, ids in enumerate(encoding["input_ids"]):
        _, groups = word_groups(encoding, i, [part[i] for part in args], len(ids))
        rows.append(to_words(saliency[i, : len(ids)], groups, how))
        spans.append(group_spans(token_spans[i], groups))
    mask = pad_sequence([torch.ones(len(row), dtype=torch.long) for row in rows], batch_first=True)
    return pad_sequence(rows, batch_first=True), mask, spans


def shared_words(teacher: SplitOutputs, student: SplitOutputs) -> tuple[Tensor, Tensor] | None:
    """Per example, each side's word id ``[N, L]`` of each position (−1: none) on the words
    both read, when the two read different positions (another tokenizer) and both know their
    characters; None when they read the same positions."""
    if teacher.spans is None or student.spans is None or teacher.spans == student.spans:
        return None
    ids = [torch.full(side.saliency.shape, -1, dtype=torch.long) for side in (teacher, student)]
    for row, pair in enumerate(zip(teacher.spans, student.spans, strict=True)):
        aligned = align(*pair)
        for side, word_ids in zip(ids, (aligned.teacher, aligned.student), strict=True):
            side[row, : len(word_ids)] = torch.tensor(word_ids, dtype=torch.long)
    return ids[0], ids[1]


def saliency_loyalties(teacher: SplitOutputs, student: SplitOutputs) -> Tensor:
    """Per example ``[N]``: the Pearson correlation of the two models' saliency over the
    positions (sub-tokens or words) both read — for a student of another tokenizer, over the
    words both tokenisations share, each side's scores summed per word; NaN where the two read
    positions that do not correspond or where it is undefined."""
    shared = shared_words(teacher, student)
    if shared is not None:
        width = max(int(shared[0].max()) + 1, 1)
        a, b = (
            pool_words(side.saliency[..., None], ids, "sum", width)[..., 0]
            for side, ids in zip((teacher, student), shared, strict=True)
        )
        return pearson_per_example(a, b, word_mask(shared[0], width).long())
    width = max(teacher.mask.shape[1], student.mask.shape[1])
    a, b, mask_a, mask_b = (
        F.pad(x, (0, width - x.shape[1]))
        for x in (teacher.saliency, student.saliency, teacher.mask, student.mask)
    )
    same = (mask_a == mask_b).all(-1)
    return torch.where(same, pearson_per_example(a, b, mask_a), torch.nan)


def agreement_per_example(teacher: SplitOutputs, student: SplitOutputs) -> dict[str, Tensor]:
    """A student's explanations against its teacher's, per example ``[N]``: saliency loyalty
    (Pearson of Grad saliency; NaN where undefined) and, where both carry IG maps, the
    attribution gap (AD-KD Eq. 11; lower is closer)."""
    scores = {"saliency_loyalty": saliency_loyalties(teacher, student)}
    if teacher.maps is not None and student.maps is not None:
        shared = shared_words(teacher, student)
        if shared is None:
            scores["attribution_gap"] = attribution_gap(teacher.maps, student.maps, teacher.mask)
        else:  # per word: each view summed over a word's tokens, normalised over the words
            width = max(int(shared[0].max()) + 1, 1)
            t, s = (
                word_maps(side.maps.transpose(1, 2), ids, width)
                for side, ids in zip((teacher, student), shared, strict=True)
            )
            mask = word_mask(shared[0], width).long()
            scores["attribution_gap"] = attribution_gap(t.transpose(1, 2), s.transpose(1, 2), mask)
    return scores


def loyalty_tables(
    spec: TaskSpec,
    examples: list[Example],
    teacher: SplitOutputs,
    students: dict[str, SplitOutputs],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A summary row per model (task metrics; LL, PL and SL ×100 against the teacher, the
    teacher's against itself, so that its row holds no gap; ``SL over``: what saliency loyalty
    compared: ``itself``, ``the same positions`` or, for a student of another tokenizer, ``the
    words both share``) and a row per example: text, gold label, the teacher's
    prediction and whether it is right, and per student ``<name>`` (prediction), ``<name> ✓``,
    ``<name> PL`` and ``<name> SL``."""
    names = spec.label_names

    def labelled(logits: Tensor) -> list:
        return [names[int(c)] for c in logits.argmax(-1)] if names else logits[:, 0].tolist()

    gold = torch.tensor([names.index(e.label) if names else float(e.label) for e in examples])
    frame = pd.DataFrame(
        {
            "text": [e.text for e in examples],
            "gold": [e.label for e in examples],
            "teacher": labelled(teacher.logits),
            "teacher ✓": (teacher.logits.argmax(-1) == gold).tolist() if names else None,
        }
    )
    summary = []
    for name, outputs in {"teacher": teacher, **students}.items():
        saliency = saliency_loyalties(teacher, outputs).numpy()
        row = {"model": name, **task_metrics(spec, outputs.logits, gold)}
        if names:
            probability = probability_loyalties(teacher.logits, outputs.logits)
            agree = outputs.logits.argmax(-1) == teacher.logits.argmax(-1)
            row |= {"LL": float(agree.float().mean()), "PL": float(probability.mean())}
        row["SL×100"] = 100 * nan_mean(torch.from_numpy(saliency))[0]
        row["SL over"] = (
            "itself"
            if name == "teacher"
            else "the words both share"  # a student of another tokenizer
            if shared_words(teacher, outputs) is not None
            else "the same positions"
        )
        summary.append(row)
        if name == "teacher":
            continue
        frame[name] = labelled(outputs.logits)
        if names:
            frame[f"{name} ✓"] = (outputs.logits.argmax(-1) == gold).tolist()
            frame[f"{name} PL"] = probability.tolist()
        frame[f"{name} SL"] = saliency
    return pd.DataFrame(summary).set_index("model"), frame


def hidden_states(loaded: LoadedModel, example: Example) -> tuple[list[str], Tensor]:
    """The tokens of one example and its hidden states ``[layers + 1, L, d]`` (embedding
    output first; a long text read only as far as the model sees it)."""
    limit = loaded.read_length
    pairs = [example.pair or ""] if loaded.spec.pair else None
    args, _ = prefixes(loaded.tokenizer, [example.text], pairs, limit)
    batch = dict(loaded.tokenizer(*args, truncation=True, return_tensors="pt", max_length=limit))
    with torch.no_grad():
        states = forward(loaded.model, batch, hidden_states=True).hidden_states
    tokens = loaded.tokenizer.convert_ids_to_tokens(batch["input_ids"][0].tolist())
    return tokens, torch.stack([h[0] for h in states])
