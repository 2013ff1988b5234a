"""What every task yields: :class:`TaskData` — train/dev/test :class:`Split` lists of texts,
optional second texts, labels and stable example ids — and the deterministic (stratified) splits
and samples of them."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

SPLITS = ("train", "dev", "test")
MIN_EXAMPLES = {"train": 2, "dev": 1, "test": 1}  # after the split and any subsample
MISSING_LABELS = {"", "nan"}  # read as text (case aside), these mean no label
METRICS_CLASSIFICATION = ("accuracy", "macro_f1")


@dataclass(frozen=True)
class TaskSpec:
    """What a task predicts and how it is scored."""

    name: str
    label_names: tuple[str, ...]  # empty for regression
    metrics: tuple[str, ...]
    pair: bool = False

    @property
    def regression(self) -> bool:
        return not self.label_names

    @property
    def num_labels(self) -> int:
        return max(len(self.label_names), 1)


@dataclass
class Split:
    """One split: ``texts[i]`` (and ``pairs[i]``) with label ``labels[i]`` and id ``uids[i]``."""

    texts: list[str]
    labels: list[float] | list[int]
    uids: list[str]
    pairs: list[str] | None = None

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, indices: Sequence[int]) -> Split:
        pick = list(indices)
        return Split(
            texts=[self.texts[i] for i in pick],
            labels=[self.labels[i] for i in pick],
            uids=[self.uids[i] for i in pick],
            pairs=None if self.pairs is None else [self.pairs[i] for i in pick],
        )


@dataclass
class TaskData:
    """A task's splits, where they came from, what was done to them (``notes``) and, for a data
    set whose cleaning changed since runs were recorded, its ``version``; once loaded, how many
    examples repeat across its splits (``overlap``, :func:`split_overlap`) and, with
    ``--dedupe``, how many were dropped from each split (``deduped``); with a transfer set
    (:mod:`workbench.core.data.transfer`), its record (``transfer``: its texts are the train
    split's last ones, their labels withheld)."""

    spec: TaskSpec
    splits: dict[str, Split]
    source: str
    notes: list[str] = field(default_factory=list)
    version: str | None = None
    overlap: dict[str, int] = field(default_factory=dict)
    deduped: dict[str, int] | None = None
    transfer: dict | None = None

    def fingerprint(self) -> dict[str, str]:
        """A hash of the example ids and labels of each split, and of the data version where
        there is one: records the exact split in every run (an edited text or label, or a new
        version of the cleaning, changes it)."""
        head = [f"version\t{self.version}"] if self.version else []
        digests = {}
        for name, split in self.splits.items():
            rows = (f"{uid}\t{label}" for uid, label in zip(split.uids, split.labels, strict=True))
            digests[name] = hashlib.sha256("\n".join([*head, *rows]).encode()).hexdigest()[:16]
        return digests


def example_uid(text: str, pair: str | None = None) -> str:
    return hashlib.sha1(f"{text}\x1f{pair or ''}".encode()).hexdigest()[:16]


CLEAN_CHUNK = 1 << 20  # characters cleaned at a time


def clean_text(text: str) -> str:
    """Collapse every run of whitespace (``\\r`` and newlines included) to one space and strip
    the ends: ``" ".join(text.split())``, a megabyte at a time, so that a long text never holds
    a list of all its words (tens of bytes each: ten times the text)."""
    text = str(text)
    if len(text) <= CLEAN_CHUNK:
        return " ".join(text.split())
    out, space = io.StringIO(), False  # space: whitespace since the last word written
    for start in range(0, len(text), CLEAN_CHUNK):
        chunk = text[start : start + CLEAN_CHUNK]
        if words := chunk.split():
            if out.tell() and (space or chunk[0].isspace()):
                out.write(" ")
            out.write(" ".join(words))
        space = chunk[-1].isspace() or (space and not words)
    return out.getvalue()


# how examples are compared across splits, said in the notes
OVERLAP_RULE = "texts compared with whitespace collapsed, case kept"
SPLIT_PAIRS = (("train", "dev"), ("train", "test"), ("dev", "test"))


def _keys(split: Split) -> list[tuple[str, str | None]]:
    """Each example's text (and second text) as :data:`OVERLAP_RULE` compares them."""
    pairs = split.pairs or [None] * len(split)
    return [
        (clean_text(text), None if pair is None else clean_text(pair))
        for text, pair in zip(split.texts, pairs, strict=True)
    ]


def split_overlap(splits: dict[str, Split]) -> dict[str, int]:
    """How many examples of each later split repeat an example of an earlier one, per pair of
    splits: ``{"train/dev": 3, "train/test": 5, "dev/test": 0}`` (the examples of dev that
    also occur in train, ...), the texts (and second texts) compared as :data:`OVERLAP_RULE`
    says."""
    keys = {name: _keys(split) for name, split in splits.items()}
    counts = {}
    for first, second in SPLIT_PAIRS:
        if first in keys and second in keys:
            seen = set(keys[first])
            counts[f"{first}/{second}"] = sum(key in seen for key in keys[second])
    return counts


def drop_train_repeats(splits: dict[str, Split]) -> dict[str, int]:
    """Drop from every split but train (in place) the examples whose text (and second text)
    also occurs in train, compared as :data:`OVERLAP_RULE` says; train is left as it is.
    Returns how many each split lost."""
    seen = set(_keys(splits["train"]))
    dropped = {}
    for name, split in splits.items():
        if name == "train":
            continue
        keep = [i for i, key in enumerate(_keys(split)) if key not in seen]
        dropped[name] = len(split) - len(keep)
        splits[name] = split.subset(keep)
    return dropped


def split_indices(
    labels: Sequence, fractions: tuple[float, ...], seed: int, stratify: bool
) -> list[np.ndarray]:
    """Deterministic (stratified) partition of ``range(len(labels))`` by ``fractions``: each
    class's examples (classes in sorted order, each's in index order) shuffled and cut by the
    fractions. The classes are counted in one pass and grouped by one stable sort, so that
    100 000 classes cost what their examples cost, not examples × classes."""
    rng = np.random.default_rng(seed)
    if stratify:
        position = {value: code for code, value in enumerate(sorted(set(labels)))}
        codes = np.fromiter((position[v] for v in labels), dtype=np.int64, count=len(labels))
        counts = np.bincount(codes, minlength=len(position))
        groups = np.split(np.argsort(codes, kind="stable"), np.cumsum(counts)[:-1])
    else:
        groups = [np.arange(len(labels))]
    parts: list[list[int]] = [[] for _ in fractions]
    for group in groups:
        shuffled = rng.permutation(group)
        bounds = np.round(np.cumsum(fractions) * len(shuffled)).astype(int)
        for k, piece in enumerate(np.split(shuffled, bounds[:-1])):
            parts[k].extend(piece.tolist())
    return [np.sort(np.asarray(p, dtype=int)) for p in parts]


def from_frame(frame: pd.DataFrame, spec: TaskSpec, pair_column: str | None) -> Split:
    texts = frame["text"].tolist()
    pairs = frame[pair_column].tolist() if pair_column else None
    labels = frame["label"].tolist()
    uids = [example_uid(t, p) for t, p in zip(texts, pairs or [None] * len(texts), strict=True)]
    return Split(texts=texts, labels=labels, uids=uids, pairs=pairs)


def deduplicate(frame: pd.DataFrame, columns: list[str]) -> tuple[pd.DataFrame, int, int]:
    """Drop repeated texts; texts seen with conflicting labels are dropped altogether."""
    labels_per_text = frame.groupby(columns)["label"].nunique()
    conflicting = labels_per_text[labels_per_text > 1].index
    keep = ~frame.set_index(columns).index.isin(conflicting)
    kept = frame[keep]
    deduplicated = kept.drop_duplicates(subset=columns, keep="first")
    return deduplicated, len(kept) - len(deduplicated), int((~keep).sum())


def split_frame(
    frame: pd.DataFrame, spec: TaskSpec, seed: int, pair_column: str | None = None
) -> dict[str, Split]:
    """80/10/10 train/dev/test, stratified by label for classification."""
    whole = from_frame(frame, spec, pair_column)
    parts = split_indices(whole.labels, (0.8, 0.1, 0.1), seed, stratify=not spec.regression)
    return {name: whole.subset(part) for name, part in zip(SPLITS, parts, strict=True)}


def sample_split(
    split: Split, limit: int | None, seed: int, stratify: bool = True, exact: bool = False
) -> Split:
    """A fixed sample of about ``limit`` examples (stratified by label: each class keeps its
    share, rounded), in the split's order; the split itself when it has no more. With
    ``exact``, exactly ``limit``: the classes' rounding is made up by a seeded choice of the
    examples left out or kept. The bundled data sets come ordered by class, so a prefix of a
    split is not a sample of it."""
    if limit is None or limit >= len(split):
        return split
    keep, rest = split_indices(
        split.labels, (limit / len(split), 1 - limit / len(split)), seed, stratify
    )
    if exact and len(keep) != limit:
        rng = np.random.default_rng(seed)
        if len(keep) > limit:
            keep = np.sort(rng.choice(keep, limit, replace=False))
        else:
            keep = np.sort(np.concatenate([keep, rng.choice(rest, limit - len(keep), False)]))
    return split.subset(keep)
