"""Tokenisation (truncation counted) and dynamic padding per batch."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from workbench.data.splits import Split
from workbench.errors import WorkbenchError


@dataclass
class EncodedSplit(torch.utils.data.Dataset):
    """A tokenised split: per example its token ids and label; padding happens per batch."""

    input_ids: list[list[int]]
    token_type_ids: list[list[int]]
    labels: Tensor  # [N], long for classification, float for regression
    truncated: int  # how many examples were cut at max_length

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, index: int) -> dict:
        return {
            "input_ids": self.input_ids[index],
            "token_type_ids": self.token_type_ids[index],
            "label": self.labels[index],
            "index": index,
        }


def encode(
    split: Split, tokenizer: PreTrainedTokenizerBase, max_length: int, regression: bool = False
) -> EncodedSplit:
    """Tokenise a split, truncating to ``max_length`` and counting what was cut."""
    if max_length < 4:
        raise WorkbenchError(f"max_length {max_length} is too small (at least 4 tokens)")
    args = (split.texts,) if split.pairs is None else (split.texts, split.pairs)
    # One pass: a text longer than max_length comes back as several rows (its overflow); the
    # first row of each text is its truncated encoding.
    encoded = tokenizer(
        *args, truncation=True, max_length=max_length, return_overflowing_tokens=True
    )
    mapping = encoded["overflow_to_sample_mapping"]  # row → text
    first: dict[int, int] = {}  # text → its first row
    for row, text in enumerate(mapping):
        first.setdefault(text, row)
    rows = [first[text] for text in range(len(split.texts))]
    ids = [encoded["input_ids"][row] for row in rows]
    types = encoded.get("token_type_ids")
    dtype = torch.float32 if regression else torch.long
    return EncodedSplit(
        input_ids=ids,
        token_type_ids=[types[row] for row in rows] if types else [[0] * len(i) for i in ids],
        labels=torch.tensor(split.labels, dtype=dtype),
        truncated=sum(n > 1 for n in Counter(mapping).values()),
    )


def pad_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id batches are padded with: the tokenizer's pad token, or 0 when it has none (padded
    positions are masked out, so any id serves)."""
    return 0 if tokenizer.pad_token_id is None else int(tokenizer.pad_token_id)


def collate(examples: Sequence[dict], pad_token_id: int) -> dict[str, Tensor]:
    """Pad a list of examples to the longest one: ``input_ids``, ``token_type_ids``,
    ``attention_mask`` ``[B, L]``, ``labels`` ``[B]`` and ``index`` ``[B]`` (position in the
    split, the key of teacher caches)."""
    length = max(len(e["input_ids"]) for e in examples)
    ids = torch.full((len(examples), length), pad_token_id, dtype=torch.long)
    types = torch.zeros((len(examples), length), dtype=torch.long)
    mask = torch.zeros((len(examples), length), dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example["input_ids"])
        ids[row, :n] = torch.tensor(example["input_ids"])
        types[row, :n] = torch.tensor(example["token_type_ids"])
        mask[row, :n] = 1
    return {
        "input_ids": ids,
        "token_type_ids": types,
        "attention_mask": mask,
        "labels": torch.stack([torch.as_tensor(e["label"]) for e in examples]),
        "index": torch.tensor([e["index"] for e in examples]),
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
