"""A transfer set: texts without labels that the teacher labels for its students (Hinton et al.'s
transfer set; DistilBERT's and TinyBERT's unlabelled and augmented corpora).

:func:`add_transfer` appends them to a task's train split with the label withheld
(:data:`UNLABELLED`): the terms that read gold labels average over the labelled examples only,
every teacher-driven term sees all of them. A source is a text file (one text a line), a CSV, TSV,
JSONL or parquet file, a folder of such files or one written by ``datasets``' ``save_to_disk``, a
hub data set, or :data:`TRANSFER_TASK`: the task's own training texts past
``--max-train-examples``, their labels withheld. Texts equal to a dev or test text or to a
labelled training text (compared as :data:`~workbench.core.data.splits.OVERLAP_RULE` says),
repeated or empty are dropped and counted.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from workbench.core.data.hub_sets import hub_dataset, is_hub_id, is_saved_dataset, read_saved
from workbench.core.data.local import (
    DATASET_ROWS,
    FIELD_LIMIT,
    FILE_LINES,
    LOCAL_SUFFIXES,
    _bounded_lines,
    _only_scalars,
    _read_table,
    _text_encoding,
)
from workbench.core.data.splits import (
    OVERLAP_RULE,
    Split,
    TaskData,
    clean_text,
    example_uid,
    sample_split,
)
from workbench.core.errors import WorkbenchError, first_line
from workbench.core.files import local_path, regular_file
from workbench.core.names import TRANSFER_TASK, UNLABELLED

TEXT_SUFFIX = ".txt"  # one text a line
TRANSFER_LIMIT = 5_000_000  # texts read from one source


def unlabelled(regression: bool) -> float | int:
    """The withheld label of a transfer example: NaN for regression, else :data:`UNLABELLED`."""
    return math.nan if regression else UNLABELLED


def _text_lines(path: Path) -> pd.DataFrame:
    """A text file's lines as a ``text`` column; a NUL character (a binary file) is refused."""
    most = f"{FIELD_LIMIT:,} characters, the most a line of a data file may hold"
    encoding, lines = _text_encoding(path), []
    try:
        with path.open(encoding=encoding, newline=None) as stream:
            for number, line in enumerate(_bounded_lines(stream, path, most), 1):
                if "\x00" in line:
                    raise WorkbenchError(
                        f"--transfer {path}: line {number} holds a NUL byte: a binary file, "
                        "not text"
                    )
                lines.append(line)
                if len(lines) > TRANSFER_LIMIT:
                    break
    except UnicodeDecodeError as error:  # UTF-16 whose bytes break off
        raise WorkbenchError(f"--transfer {path}: not {encoding}: {first_line(error)}") from None
    return pd.DataFrame({"text": lines})


def _frames(source: str, path: Path | None) -> list[tuple[pd.DataFrame, str, tuple[str, int]]]:
    """The tables ``source`` holds, each with where it came from and how its rows are numbered."""
    if path is None:
        return [(_hub_frame(source), f"hub data set {source}", DATASET_ROWS)]
    if path.is_dir():
        if is_saved_dataset(path):
            return _dataset_frames(path)
        files = [
            p
            for p in sorted(path.iterdir())
            if p.suffix.lower() in LOCAL_SUFFIXES or p.suffix.lower() == TEXT_SUFFIX
        ]
        if not files:
            raise WorkbenchError(
                f"--transfer {path}: no .txt, .csv, .tsv, .jsonl or .parquet file in it"
            )
        return [frame for file in files for frame in _frames(source, file)]
    regular_file(path, "--transfer")
    if path.suffix.lower() == TEXT_SUFFIX:
        return [(_text_lines(path), str(path), ("line", 1))]
    return [(_read_table(path), str(path), FILE_LINES)]


def _dataset_frames(path: Path) -> list[tuple[pd.DataFrame, str, tuple[str, int]]]:
    import datasets

    loaded = read_saved(path, f"--transfer {path}")
    parts = loaded.items() if isinstance(loaded, datasets.DatasetDict) else [("train", loaded)]
    return [(part.to_pandas(), f"{path} {name} split", DATASET_ROWS) for name, part in parts]


def _hub_frame(name: str) -> pd.DataFrame:
    """The train split (else the first) of the hub data set ``name``."""
    what = f"--transfer: hub data set {name!r} (no local file or folder of that name either)"
    loaded = hub_dataset(name, None, what)
    return loaded[next(s for s in ("train", *loaded) if s in loaded)].to_pandas()


def read_transfer(
    source: str, text_column: str, pair_column: str | None, pair: bool, label_column: str
) -> tuple[list[str], list[str] | None, list[str]]:
    """The texts (and, for a pair task, the second texts) of ``source``, cleaned, with the notes
    said of them (a label column ignored). A missing column, no rows, a binary file or more than
    :data:`TRANSFER_LIMIT` texts are one line."""
    path = local_path(source, hub_ids=True)
    if path is None and not is_hub_id(source):
        raise WorkbenchError(
            f"--transfer {source}: no such file or folder, and not a hub data set's name"
        )
    texts: list[str] = []
    pairs: list[str] | None = [] if pair else None
    notes = []
    for frame, where, numbering in _frames(source, path):
        plain = where.endswith(TEXT_SUFFIX)  # a text file's one column is the text
        wanted = {"text" if plain else text_column: "text"}
        if pair and plain:
            raise WorkbenchError(
                f"--transfer {where}: a text file holds one text a line, and this task's "
                "examples are pairs: give a CSV, JSONL or parquet file with both columns"
            )
        if pair:
            wanted[pair_column or "text_pair"] = "text_pair"
        if missing := [name for name in wanted if name not in frame.columns]:
            raise WorkbenchError(
                f"--transfer {where}: no column {' or '.join(map(repr, missing))}; found "
                f"{list(frame.columns)[:10]} (a local task's file names it with --text-column"
                + (" and --text-pair-column)" if pair else ")")
            )
        if label_column in frame.columns and label_column not in wanted:
            notes.append(f"--transfer {where}: its {label_column!r} column is ignored")
        frame = frame[list(wanted)].rename(columns=wanted)
        for column in frame.columns:
            _only_scalars(frame[column], column, "a text", "a string", where, numbering)
        texts += frame["text"].fillna("").map(clean_text).tolist()
        if pairs is not None:
            pairs += frame["text_pair"].fillna("").map(clean_text).tolist()
        if len(texts) > TRANSFER_LIMIT:
            raise WorkbenchError(
                f"--transfer {source}: more than {TRANSFER_LIMIT:,} texts, the most a transfer "
                "set may read: give a part of it"
            )
    if not texts:
        raise WorkbenchError(f"--transfer {source}: no texts (an empty file, or a header only)")
    return texts, pairs, notes


def _key(text: str, pair: str | None) -> tuple[str, str | None]:
    return clean_text(text), None if pair is None else clean_text(pair)


def transfer_split(
    data: TaskData,
    texts: list[str],
    pairs: list[str] | None,
    limit: int | None,
    seed: int,
) -> tuple[Split, dict[str, int]]:
    """The transfer examples of ``texts`` for ``data``: labels withheld, the dropped counted by
    why (``{"dev or test": 3, "labelled": 0, "repeated": 5, "empty": 1, "past the limit": 0}``),
    a seeded random sample of ``limit`` where given."""
    held = {_key(t, p) for name in ("dev", "test") for t, p in _rows(data.splits[name])}
    labelled = {_key(t, p) for t, p in _rows(data.splits["train"])}
    dropped = dict.fromkeys(("dev or test", "labelled", "repeated", "empty"), 0)
    seen: set = set()
    kept_texts, kept_pairs = [], []
    for text, pair in zip(texts, pairs or [None] * len(texts), strict=True):
        key = (text, pair)
        why = (
            "empty"
            if not text or pair == ""
            else "dev or test"
            if key in held
            else "labelled"
            if key in labelled
            else "repeated"
            if key in seen
            else None
        )
        if why:
            dropped[why] += 1
            continue
        seen.add(key)
        kept_texts.append(text)
        kept_pairs.append(pair)
    label = [unlabelled(data.spec.regression)] * len(kept_texts)
    split = Split(
        texts=kept_texts,
        labels=label,
        uids=[example_uid(t, p) for t, p in zip(kept_texts, kept_pairs, strict=True)],
        pairs=kept_pairs if pairs is not None else None,
    )
    sampled = sample_split(split, limit, seed, stratify=False, exact=True)
    dropped["past the limit"] = len(split) - len(sampled)
    return sampled, dropped


def _rows(split: Split):
    return zip(split.texts, split.pairs or [None] * len(split), strict=True)


def add_transfer(
    data: TaskData,
    source: str,
    limit: int | None,
    seed: int,
    columns: tuple[str, str | None, str],
    full_train: Callable[[], Split],
    notify: Callable[[str], None],
) -> None:
    """Append the transfer set ``source`` to ``data``'s train split, labels withheld; record it in
    ``data.transfer`` (source, fingerprint, texts read, used and dropped by why) and say it in one
    line. ``full_train`` gives the task's whole train split (for :data:`TRANSFER_TASK`);
    ``columns``: the text, second-text and label columns."""
    train = data.splits["train"]
    if source == TRANSFER_TASK:
        labelled = set(train.uids)
        whole = full_train()
        rest = whole.subset([i for i, uid in enumerate(whole.uids) if uid not in labelled])
        if not len(rest):
            raise WorkbenchError(
                f"--transfer {TRANSFER_TASK}: every training text of {data.spec.name} is labelled "
                "already; lower --max-train-examples to leave texts for the transfer set"
            )
        texts, pairs, notes = [clean_text(t) for t in rest.texts], rest.pairs, []
        where = f"the training texts of {data.spec.name} past --max-train-examples"
    else:
        text, pair, label = columns
        texts, pairs, notes = read_transfer(source, text, pair, data.spec.pair, label)
        where = str(source)
    split, dropped = transfer_split(data, texts, pairs, limit, seed)
    if not len(split):
        shown = ", ".join(f"{n} {why}" for why, n in dropped.items() if n)
        raise WorkbenchError(
            f"--transfer {source}: all {len(texts):,} texts were dropped ({shown}; {OVERLAP_RULE})"
        )
    digest = hashlib.sha256("\n".join(split.uids).encode()).hexdigest()[:16]
    data.transfer = {
        "source": source,  # a local path made absolute by the setting (StudentConfig)
        "fingerprint": digest,
        "read": len(texts),
        "used": len(split),
        "dropped": dropped,
    }
    data.splits["train"] = Split(
        texts=train.texts + split.texts,
        labels=[*train.labels, *split.labels],
        uids=train.uids + split.uids,
        pairs=None if train.pairs is None else train.pairs + (split.pairs or []),
    )
    shown = ", ".join(f"{n:,} {why}" for why, n in dropped.items() if n) or "none"
    data.notes += notes
    data.notes.append(
        f"transfer set: {len(split):,} texts of {where} without labels beside the {len(train):,} "
        f"labelled training examples (of {len(texts):,} read; dropped: {shown})"
    )
    for note in [*notes, data.notes[-1]]:
        notify(note)
