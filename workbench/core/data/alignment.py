"""Words shared by two tokenisations of the same texts, for methods that compare a teacher and
a student of different tokenizers position by position.

Each token of a fast tokenizer covers a span of characters of its text (its offsets, whitespace
trimmed; special tokens cover none), widened to the span of its word (the tokenizer's
``word_ids()``, the words the explainers' word maps draw). A **word** is a maximal span that
no such span of either side crosses: the spans of both tokenisations, merged where they overlap.
"awful," read as the words ``awful`` ``,`` by one tokenizer and as ``awful,`` by the other is one
word; read as ``awful`` ``,`` by both, it is two, whatever pieces each cuts them into. A word
without a token on one side (a character one tokenizer drops, text past one side's truncation, a
word cut in two by it) is left out of both sides, and counted. Word ids are numbered 0..W−1 per
text in reading order, −1 for tokens of no word (specials, the words left out).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

Span = tuple[int, int, int]  # (sequence: 0 the text, 1 its pair), start, end


def token_spans(
    offsets: Sequence[tuple[int, int]], sequences: Sequence[int | None], texts: Sequence[str]
) -> list[Span | None]:
    """Each token's span ``(sequence, start, end)`` with whitespace trimmed, or None for a
    token that covers no character but whitespace (special tokens). ``texts``: the example's
    text and, for a pair task, its pair."""
    spans: list[Span | None] = []
    for (start, end), sequence in zip(offsets, sequences, strict=True):
        if sequence is None or end <= start:
            spans.append(None)
            continue
        text = texts[sequence]
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        spans.append((sequence, start, end) if end > start else None)
    return spans


def word_spans(spans: Sequence[Span | None], words: Sequence[int | None]) -> list[Span | None]:
    """Token spans widened to their word's (``words``: the tokenizer's word of each token,
    ``word_ids()``): the pieces of one word then stand together in the alignment, as the
    explainers' word maps draw them."""
    whole: dict[tuple[int, int], list[int]] = {}
    for span, word in zip(spans, words, strict=True):
        if span is not None and word is not None:
            low, high = whole.setdefault((span[0], word), [span[1], span[2]])
            whole[span[0], word] = [min(low, span[1]), max(high, span[2])]
    return [
        None if span is None or word is None else (span[0], *whole[span[0], word])
        for span, word in zip(spans, words, strict=True)
    ]


@dataclass(frozen=True)
class Alignment:
    """Word ids of one example's tokens on each side (``sides[k][i]``: the word of token ``i``
    of side ``k``, ``-1`` for none), the shared words' spans, and how many words were left
    out."""

    sides: list[list[int]]
    spans: list[Span]
    dropped: int

    @property
    def teacher(self) -> list[int]:
        return self.sides[0]

    @property
    def student(self) -> list[int]:
        return self.sides[1]

    @property
    def words(self) -> int:
        return len(self.spans)


def align(*sides: Sequence[Span | None]) -> Alignment:
    """The words of several tokenisations of one example (see the module's docstring), kept
    where every side has a token in them and reaches past them."""
    merged: list[list[int]] = []  # [sequence, start, end] of each word, in reading order
    for sequence, start, end in sorted({s for side in sides for s in side if s is not None}):
        if merged and merged[-1][0] == sequence and start < merged[-1][2]:
            merged[-1][2] = max(merged[-1][2], end)
        else:
            merged.append([sequence, start, end])
    keys = [(sequence, start) for sequence, start, _ in merged]

    def word_of(span: Span | None) -> int:
        return -1 if span is None else bisect.bisect_right(keys, span[:2]) - 1

    words = [[word_of(span) for span in side] for side in sides]
    reach = [{} for _ in sides]  # per side and sequence: the end of its last token
    for side, ends in zip(sides, reach, strict=True):
        for span in side:
            if span is not None:
                ends[span[0]] = max(ends.get(span[0], 0), span[2])
    present = [set(side) for side in words]
    kept = [
        w
        for w, (sequence, _, end) in enumerate(merged)
        if all(w in side for side in present)
        and all(end <= ends.get(sequence, 0) for ends in reach)
    ]
    number = {w: i for i, w in enumerate(kept)}
    return Alignment(
        [[number.get(w, -1) for w in side] for side in words],
        [tuple(merged[w]) for w in kept],
        len(merged) - len(kept),
    )


def pool_words(
    values: Tensor, word_ids: Tensor, how: str = "sum", length: int | None = None
) -> Tensor:
    """Token values ``[B, L, ...]`` aggregated per word → ``[B, W, ...]``: ``sum`` or
    ``mean`` over each word's tokens (differentiable). ``word_ids`` ``[B, L]`` (−1: no word);
    ``W`` is ``length`` when given (zero rows past each example's words), else the batch's
    largest word count."""
    batch, tokens = word_ids.shape
    width = int(word_ids.max().clamp_min(-1)) + 1 if length is None else length
    index = torch.where(word_ids >= 0, word_ids, width)  # the no-word tokens go to a spare row
    flat = values.reshape(batch, tokens, -1)
    out = flat.new_zeros(batch, width + 1, flat.shape[-1])
    out = out.scatter_add(1, index[..., None].expand(-1, -1, flat.shape[-1]), flat)
    if how == "mean":
        counts = torch.zeros(batch, width + 1, device=values.device, dtype=flat.dtype)
        counts = counts.scatter_add(1, index, torch.ones_like(index, dtype=flat.dtype))
        out = out / counts.clamp_min(1)[..., None]
    elif how != "sum":
        raise ValueError(f"how must be 'sum' or 'mean', got {how!r}")
    return out[:, :width].reshape(batch, width, *values.shape[2:])


def word_mask(word_ids: Tensor, length: int | None = None) -> Tensor:
    """``[B, W]``: which of the first ``W`` word slots hold a word of each example."""
    width = int(word_ids.max().clamp_min(-1)) + 1 if length is None else length
    count = word_ids.max(1).values + 1
    return torch.arange(width, device=word_ids.device)[None] < count[:, None]


def word_maps(maps: Tensor, word_ids: Tensor, length: int | None = None) -> Tensor:
    """Attribution maps per token ``[B, L, K]`` (``K`` views or classes) as word maps
    ``[B, W, K]``: summed over each word's tokens and L2-normalised per view over the words
    (AD-KD's Eq. 8 on words)."""
    return F.normalize(pool_words(maps, word_ids, "sum", length), dim=1)


def pad_words(values: Tensor, length: int) -> Tensor:
    """Word rows ``[B, W, ...]`` zero-padded to ``length`` rows (a teacher's word-level field
    stored in its per-token cache, ``W ≤ L``)."""
    pad = [0, 0] * (values.dim() - 2) + [0, length - values.shape[1]]
    return F.pad(values, pad)
