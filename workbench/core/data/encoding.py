"""Tokenisation (truncation counted) and dynamic padding per batch."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from workbench.core.data.alignment import Span, align, token_spans, word_spans
from workbench.core.data.splits import Split
from workbench.core.errors import WorkbenchError


@dataclass
class EncodedSplit(torch.utils.data.Dataset):
    """A tokenised split: per example its token ids and label; padding happens per batch."""

    input_ids: list[list[int]]
    token_type_ids: list[list[int]]
    labels: Tensor  # [N], long for classification, float for regression
    truncated: int  # how many examples were cut at max_length
    word_ids: list[list[int]] | None = None  # per token, words shared with another tokenizer

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, index: int) -> dict:
        words = {} if self.word_ids is None else {"word_ids": self.word_ids[index]}
        return {
            "input_ids": self.input_ids[index],
            "token_type_ids": self.token_type_ids[index],
            "label": self.labels[index],
            "index": index,
            **words,
        }


CHARS_PER_TOKEN = 16
"""Characters of a text read per token the model can take, at first: three to four times what
English, code or URLs need, so that a text of any size is tokenised only as far as the model
reads it (a whole 200 MB text would take tens of GB in the tokenizer)."""
MAX_CHARS_PER_TOKEN = 1024
"""The most characters read per token: where the first :data:`CHARS_PER_TOKEN` per token hold
fewer than ``max_length`` tokens (runs of whitespace, words of hundreds of characters, which
WordPiece reads as one ``[UNK]``) the prefix grows eightfold at a time up to this bound, and a
text that even then holds fewer is read that far and counted as truncated."""


def tokenizer_kind(tokenizer: PreTrainedTokenizerBase) -> str:
    """``"WordPiece"``, ``"byte-level BPE"``, ``"Unigram"``, …: the kind of a fast tokenizer's
    model (byte-level where its pre-tokenizer reads bytes), else the tokenizer's class name."""
    if (backend := getattr(tokenizer, "backend_tokenizer", None)) is None:
        return type(tokenizer).__name__
    kind = type(backend.model).__name__
    return f"byte-level {kind}" if "ByteLevel" in repr(backend.pre_tokenizer) else kind


def _cut(text: str, chars: int) -> str:
    """The first ``chars`` characters of ``text``, ended at its last whitespace among them
    (when there is one in their second half), so that no word is cut in two."""
    head = text[:chars]
    space = max(head.rfind(" "), head.rfind("\n"), head.rfind("\t"))
    return head[:space] if space >= chars // 2 else head


def _enough(tokenizer: PreTrainedTokenizerBase, text: str, max_length: int) -> bool:
    ids = tokenizer(
        text, add_special_tokens=False, truncation=True, max_length=max_length, verbose=False
    )["input_ids"]
    return len(ids) >= max_length


def prefix(tokenizer: PreTrainedTokenizerBase, text: str, max_length: int) -> tuple[str, bool]:
    """The part of ``text`` that a model reading ``max_length`` tokens can see, and whether
    anything was cut: the whole text when it is short, else a prefix (ended at a whitespace) of
    at least ``max_length`` tokens, read ``max_length`` × :data:`CHARS_PER_TOKEN` characters at
    first and at most ``max_length`` × :data:`MAX_CHARS_PER_TOKEN`. Tokenising the prefix with
    ``truncation=True`` gives the same ids as tokenising the whole text, at a cost bounded by
    ``max_length``, whatever the text's size."""
    chars = max(max_length, 1) * CHARS_PER_TOKEN
    while len(text) > chars:
        head = _cut(text, chars)
        if chars >= max_length * MAX_CHARS_PER_TOKEN or _enough(tokenizer, head, max_length):
            return head, True
        chars *= 8
    return text, False


def prefixes(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    pairs: Sequence[str] | None,
    max_length: int,
) -> tuple[tuple[list[str], ...], list[bool]]:
    """The tokenizer's arguments (texts, and pairs where given) cut by :func:`prefix`, and per
    example whether its text or pair was cut (it is then longer than ``max_length`` tokens)."""
    given = [part for part in (texts, pairs) if part is not None]
    parts = [[prefix(tokenizer, str(text), max_length) for text in part] for part in given]
    args = tuple([text for text, _ in part] for part in parts)
    return args, [any(was_cut for _, was_cut in example) for example in zip(*parts, strict=True)]


COUNTED_CHARS = 1 << 20  # characters of a text whose tokens count_tokens counts
COUNT_PIECE = 1 << 16  # characters tokenised at a time by count_tokens


def count_tokens(
    tokenizer: PreTrainedTokenizerBase, text: str, most: int = COUNTED_CHARS
) -> tuple[int, bool]:
    """The number of tokens of ``text`` (special tokens aside) in its first ``most`` characters,
    tokenised :data:`COUNT_PIECE` characters at a time (pieces ended at a whitespace), so that
    memory stays bounded; and whether the text goes on past them (then the count is a lower
    bound)."""
    count, start, end = 0, 0, min(len(text), most)
    while start < end:
        piece = text[start : min(start + COUNT_PIECE, end)]
        if start + len(piece) < end:
            piece = _cut(piece, COUNT_PIECE)
        count += len(tokenizer(piece, add_special_tokens=False, verbose=False)["input_ids"])
        start += len(piece)
    return count, end < len(text)


def token_spans_of(
    split: Split, tokenizer: PreTrainedTokenizerBase, max_length: int
) -> list[list[Span | None]]:
    """Each example's token spans, widened to their words
    (:func:`~workbench.core.data.alignment.word_spans`), as :func:`encode` tokenises it; a slow
    tokenizer (no offsets) is a one-line error."""
    if not tokenizer.is_fast:
        raise WorkbenchError(
            f"{type(tokenizer).__name__} is a slow tokenizer: comparing two tokenisations on "
            "words needs the character offsets of a fast one"
        )
    args, _ = prefixes(tokenizer, split.texts, split.pairs, max_length)
    encoded = tokenizer(
        *args, truncation=True, max_length=max_length, return_offsets_mapping=True, verbose=False
    )
    return [
        word_spans(
            token_spans(offsets, encoded.sequence_ids(i), [part[i] for part in args]),
            encoded.word_ids(i),
        )
        for i, offsets in enumerate(encoded["offset_mapping"])
    ]


def share_words(
    split: Split,
    teacher: tuple[EncodedSplit, PreTrainedTokenizerBase],
    student: tuple[EncodedSplit, PreTrainedTokenizerBase],
    max_length: int,
) -> tuple[int, int, int]:
    """Give the teacher's and the student's encodings of ``split`` the words they share
    (:func:`~workbench.core.data.alignment.align`, in their ``word_ids``); the number of
    shared words, of words left out, and of examples that share no word (the per-token terms
    leave them out: they have no word to compare on)."""
    pairs = zip(
        token_spans_of(split, teacher[1], max_length),
        token_spans_of(split, student[1], max_length),
        strict=True,
    )
    alignments = [align(a, b) for a, b in pairs]
    teacher[0].word_ids = [a.teacher for a in alignments]
    student[0].word_ids = [a.student for a in alignments]
    return (
        sum(a.words for a in alignments),
        sum(a.dropped for a in alignments),
        sum(not a.words for a in alignments),
    )


def encode(
    split: Split, tokenizer: PreTrainedTokenizerBase, max_length: int, regression: bool = False
) -> EncodedSplit:
    """Tokenise a split, truncating to ``max_length`` and counting what was cut. Each text is
    read only as far as the model can see it (:func:`prefix`): its memory and time are bounded
    by ``max_length``, not by the text's size."""
    if max_length < 4:
        raise WorkbenchError(f"max_length {max_length} is too small (at least 4 tokens)")
    args, cut = prefixes(tokenizer, split.texts, split.pairs, max_length)
    encoded = tokenizer(*args, truncation=True, max_length=max_length, verbose=False)
    ids = encoded["input_ids"]
    # A text is cut when its prefix was, or when it fills max_length and one more token of
    # room shows more (truncation keeps min(length, room) tokens, pairs included)
    if full := [i for i, row in enumerate(ids) if len(row) == max_length and not cut[i]]:
        more = tokenizer(
            *([part[i] for i in full] for part in args),
            truncation=True,
            max_length=max_length + 1,
            verbose=False,
        )["input_ids"]
        for i, row in zip(full, more, strict=True):
            cut[i] = len(row) > max_length
    types = encoded.get("token_type_ids")
    dtype = torch.float32 if regression else torch.long
    return EncodedSplit(
        input_ids=ids,
        token_type_ids=types if types else [[0] * len(i) for i in ids],
        labels=torch.tensor(split.labels, dtype=dtype),
        truncated=sum(cut),
    )


def pad_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id batches are padded with: the tokenizer's pad token, or 0 when it has none (padded
    positions are masked out, so any id serves)."""
    return 0 if tokenizer.pad_token_id is None else int(tokenizer.pad_token_id)


def collate(examples: Sequence[dict], pad_token_id: int) -> dict[str, Tensor]:
    """Pad a list of examples to the longest one: ``input_ids``, ``token_type_ids``,
    ``attention_mask`` ``[B, L]``, ``labels`` ``[B]`` and ``index`` ``[B]`` (position in the
    split, the key of teacher caches); ``word_ids`` ``[B, L]`` (padded with −1) when the
    examples carry the words they share with another tokenisation."""
    lengths = torch.tensor([len(e["input_ids"]) for e in examples])
    length = int(lengths.max())

    def padded(key: str, fill: int) -> Tensor:
        out = torch.full((len(examples), length), fill, dtype=torch.long)
        for row, example in enumerate(examples):
            out[row, : len(example[key])] = torch.tensor(example[key])
        return out

    words = {"word_ids": padded("word_ids", -1)} if "word_ids" in examples[0] else {}
    return {
        "input_ids": padded("input_ids", pad_token_id),
        "token_type_ids": padded("token_type_ids", 0),
        "attention_mask": (torch.arange(length) < lengths[:, None]).long(),
        "labels": torch.stack([torch.as_tensor(e["label"]) for e in examples]),
        "index": torch.tensor([e["index"] for e in examples]),
        **words,
    }


def to_device(batch: dict[str, Tensor], device: torch.device | str) -> dict[str, Tensor]:
    """The batch's tensors on ``device``."""
    return {name: value.to(device) for name, value in batch.items()}


def batches(
    dataset: EncodedSplit, indices: Sequence[int], batch_size: int, pad_token_id: int
) -> Iterator[dict[str, Tensor]]:
    """Padded batches of ``dataset`` in the order of ``indices``."""
    for start in range(0, len(indices), batch_size):
        chunk = indices[start : start + batch_size]
        yield collate([dataset[int(i)] for i in chunk], pad_token_id)
