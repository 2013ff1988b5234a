"""Word-level maps: sub-token scores aggregated into the words a fast tokenizer saw
(``word_ids()``), by their sum, their mean, or the largest magnitude (``max-abs``:
``max_i |s_i|``, non-negative).

A word is a run of positions with the same (sequence, word index); its text is the span of the
input it covers (``word_to_chars``, whitespace trimmed; a word of whitespace alone, such as a
byte-level tokenizer's line break, drawn visible: ``↵``), so a word split into pieces reads as
written, without a byte-level or SentencePiece space marker. Special tokens ([CLS], [SEP],
which have no word) are kept, each as a word of its own named by its token, so that a pair's
segments stay apart and a map keeps its frame. :func:`shown_tokens` gives the tokens of a
per-token map as the text's characters too.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby
from operator import itemgetter

import torch
from torch import Tensor
from transformers import BatchEncoding, PreTrainedTokenizerBase

from workbench.analysis.attribution.registry import WORD_AGGREGATIONS
from workbench.core.data.alignment import Span
from workbench.core.errors import WorkbenchError

__all__ = [
    "WORD_AGGREGATIONS",
    "check_words",
    "group_spans",
    "shown_tokens",
    "to_words",
    "word_groups",
]

VISIBLE_WHITESPACE = str.maketrans({" ": "␣", "\n": "↵", "\t": "⇥", "\r": "↵"})
"""How a token of whitespace alone is drawn (a SentencePiece ``▁``, a byte-level ``Ċ``)."""


def shown_tokens(
    tokenizer: PreTrainedTokenizerBase,
    tokens: Sequence[str],
    offsets: Sequence[tuple[int, int]] | None,
    sequences: Sequence[int | None],
    texts: Sequence[str],
) -> list[str]:
    """``tokens`` as a reader reads them: WordPiece's as they are (``##`` marks a word's
    continuation, which the exports can merge); any other fast tokenizer's (byte-level BPE,
    SentencePiece) as the characters of the text each covers (its ``offsets`` in
    ``texts[sequence]``; one that covers none, as it decodes), so that ``Ġcrew`` reads
    ``crew`` and ``▁G`` reads ``G``; a token of whitespace alone drawn visible (``␣``, ``↵``),
    special tokens (no sequence) as they are.
    Without offsets (a slow tokenizer) the tokens are kept."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if offsets is None or backend is None or type(backend.model).__name__ == "WordPiece":
        return list(tokens)
    shown = []
    for token, (start, end), sequence in zip(tokens, offsets, sequences, strict=True):
        if sequence is None:
            shown.append(token)
            continue
        # a token of no character is one the tokenizer added (a prefix space): as it decodes
        text = (
            texts[sequence][start:end]
            if end > start
            else tokenizer.convert_tokens_to_string([token])
        )
        shown.append(text.strip() or text.translate(VISIBLE_WHITESPACE) or token)
    return shown


def check_words(how: str | None) -> None:
    if how is not None and how not in WORD_AGGREGATIONS:
        raise WorkbenchError(
            f"unknown word aggregation {how!r}: use {', '.join(WORD_AGGREGATIONS)} (or none)"
        )


def word_groups(
    encoding: BatchEncoding, row: int, texts: Sequence[str], length: int
) -> tuple[list[str], list[list[int]]]:
    """The words of row ``row`` of a fast tokenizer's ``encoding`` over its first ``length``
    positions, and the positions of each: ``texts`` are the row's input texts (the text, and
    its pair), whose spans name the words; a special token is a word of its own."""
    if not encoding.is_fast:
        raise WorkbenchError(
            "word-level maps need a fast tokenizer (its word_ids()): this one is a slow one"
        )
    word_ids = encoding.word_ids(row)[:length]
    sequences = encoding.sequence_ids(row)[:length]
    # a word: a run of positions of one (sequence, word index); a special token: its position
    keys = [i if w is None else (sequences[i], w) for i, w in enumerate(word_ids)]
    groups = [[i for i, _ in run] for _, run in groupby(enumerate(keys), itemgetter(1))]
    words = []
    for first, *_ in groups:
        word, sequence = word_ids[first], sequences[first]
        if word is None:
            words.append(encoding.tokens(row)[first])
        else:
            span = encoding.word_to_chars(row, word, sequence_index=sequence)
            text = texts[sequence][span.start : span.end]
            words.append(text.strip() or text.translate(VISIBLE_WHITESPACE))
    return words, groups


def to_words(scores: Tensor, groups: Sequence[Sequence[int]], how: str) -> Tensor:
    """Scores ``[..., L]`` aggregated over each word's positions → ``[..., W]``: ``sum``,
    ``mean`` or ``max-abs`` (the largest magnitude)."""
    check_words(how)
    reduce = {"sum": Tensor.sum, "mean": Tensor.mean, "max-abs": lambda x, d: x.abs().amax(d)}
    return torch.stack([reduce[how](scores[..., list(p)], -1) for p in groups], -1)


def group_spans(spans: Sequence[Span | None], groups: Sequence[Sequence[int]]) -> list[Span | None]:
    """The character span of each group of positions (a word): from its first token's start to
    its last one's end, None for a group of special tokens."""
    covered = ([spans[i] for i in positions if spans[i] is not None] for positions in groups)
    return [(c[0][0], min(s[1] for s in c), max(s[2] for s in c)) if c else None for c in covered]
