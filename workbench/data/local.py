"""Local files: CSV, TSV, JSONL or parquet, one file (split 80/10/10) or a folder of splits; read
strictly (encodings, quoting, labels checked before any training)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.data.splits import (
    METRICS_CLASSIFICATION,
    MISSING_LABELS,
    TaskData,
    TaskSpec,
    clean_text,
    from_frame,
    split_frame,
    split_indices,
)
from workbench.errors import WorkbenchError, first_line

LOCAL_SUFFIXES = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
}


def _read_table(path: Path) -> pd.DataFrame:
    kind = LOCAL_SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise WorkbenchError(
            f"{path}: unsupported file type; use one of {', '.join(sorted(LOCAL_SUFFIXES))}"
        )
    try:
        if kind == "parquet":
            return pd.read_parquet(path)
        encoding = _text_encoding(path)
        if kind == "jsonl":
            return pd.read_json(path, lines=True, encoding=encoding)
        if kind == "tsv":  # as the GLUE files are read: a quote character is text, never a
            # field delimiter, so a stray quote cannot merge rows
            return pd.read_csv(
                path, sep="\t", keep_default_na=False, encoding=encoding, quoting=csv.QUOTE_NONE
            )
        return pd.read_csv(path, keep_default_na=False, encoding=encoding)
    except (ValueError, OSError, pd.errors.ParserError) as error:
        raise WorkbenchError(f"{path}: cannot read it as {kind}: {first_line(error)}") from None


def _text_encoding(path: Path) -> str:
    """UTF-8 (a byte-order mark allowed) or UTF-16 with its byte-order mark; anything else is a
    one-line error with the remedy."""
    head = path.read_bytes()
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "utf-16"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as error:
        raise WorkbenchError(
            f"{path}: not UTF-8 (byte {error.start} is {head[error.start : error.start + 1]!r}); "
            "re-save it as UTF-8, e.g. iconv -f latin1 -t utf-8 FILE > FILE.utf8"
        ) from None
    return "utf-8-sig"


def _check_table(frame: pd.DataFrame, path: Path) -> pd.DataFrame:
    if frame.empty:
        raise WorkbenchError(f"{path}: no rows (a header only, or an empty file)")
    missing = [c for c in ("text", "label") if c not in frame.columns]
    if missing:
        raise WorkbenchError(
            f"{path}: missing column(s) {missing}; found {list(frame.columns)} "
            "(need text, label and optionally text_pair)"
        )
    columns = ["text", "label"] + (["text_pair"] if "text_pair" in frame.columns else [])
    frame = frame[columns].copy()
    for column in ("text", "text_pair"):
        if column not in frame:
            continue
        frame[column] = frame[column].fillna("").map(clean_text)
        empty = np.flatnonzero(frame[column].to_numpy() == "")
        if len(empty):
            rows = ", ".join(str(i + 2) for i in empty[:5])
            raise WorkbenchError(
                f"{path}: empty {column} in {len(empty)} row(s) (line {rows}); fill or remove them"
            )
    missing = frame["label"].isna() | frame["label"].map(
        lambda v: isinstance(v, str) and v.strip().lower() in MISSING_LABELS
    )
    if missing.any():
        rows = np.flatnonzero(missing.to_numpy())
        lines = ", ".join(str(i + 2) for i in rows[:5]) + (", ..." if len(rows) > 5 else "")
        raise WorkbenchError(
            f"{path}: missing label (empty or NaN) in {len(rows)} row(s) (line {lines}); fill "
            "or remove them"
        )
    return frame


def _is_regression(labels: pd.Series, path: Path) -> bool:
    """Fractional numbers make a regression target; a column mixing them with values that are
    not numbers is an error naming those values, never a classification with dozens of
    classes."""
    numeric = pd.to_numeric(labels, errors="coerce")
    fractional = bool((numeric.dropna() != numeric.dropna().round()).any())
    if fractional and numeric.isna().any():
        rows = np.flatnonzero(numeric.isna().to_numpy())
        shown = ", ".join(f"{labels.iloc[i]!r} (line {i + 2})" for i in rows[:5])
        raise WorkbenchError(
            f"{path}: the labels have fractions (a regression target) but {len(rows)} are not "
            f"numbers: {shown}"
        )
    return fractional


def load_local(path: str, seed: int) -> TaskData:
    """A local task: one file (split 80/10/10 here) or a directory with ``train.*`` and
    optionally ``dev.*``/``validation.*`` and ``test.*``; columns ``text``, ``label`` and
    optionally ``text_pair``. Labels with fractions make a regression task; string or integer
    labels a classification task whose classes are those of the training file."""
    root = Path(path)
    if root.is_dir():
        found = {}
        for ours, stems in (
            ("train", ("train",)),
            ("dev", ("dev", "validation")),
            ("test", ("test",)),
        ):
            files = [
                p
                for p in sorted(root.iterdir())
                if p.stem in stems and p.suffix.lower() in LOCAL_SUFFIXES
            ]
            if files:
                found[ours] = files[0]
        if "train" not in found:
            raise WorkbenchError(f"{root}: no train.csv/.tsv/.jsonl/.parquet file in it")
    else:
        found = {"train": root}
    frames = {ours: _check_table(_read_table(p), p) for ours, p in found.items()}
    train = frames["train"]
    pair = "text_pair" in train.columns
    if _is_regression(train["label"], found["train"]):
        label_names: tuple[str, ...] = ()
        for frame in frames.values():
            frame["label"] = pd.to_numeric(frame["label"], errors="raise").astype(float)
        metrics: tuple[str, ...] = ("spearman", "pearson")
    else:
        raw = {str(v) for v in train["label"]}
        if len(raw) < 2:
            raise WorkbenchError(
                f"{found['train']}: every label is {next(iter(raw), '')!r}: a classifier needs "
                "at least two classes"
            )
        numeric = all(v.lstrip("-").isdigit() for v in raw)
        label_names = tuple(sorted(raw, key=int if numeric else str))
        for ours, frame in frames.items():
            unknown = sorted({str(v) for v in frame["label"]} - set(label_names))
            if unknown:
                raise WorkbenchError(
                    f"{found[ours]}: unknown label(s) {unknown[:5]} not in the training labels "
                    f"{list(label_names)}"
                )
            frame["label"] = frame["label"].map(lambda v: label_names.index(str(v)))
        metrics = METRICS_CLASSIFICATION
    spec = TaskSpec(root.stem, label_names, metrics, pair=pair)
    pair_column = "text_pair" if pair else None
    if len(frames) == 1:
        splits = split_frame(train, spec, seed, pair_column)
    else:
        splits = {ours: from_frame(frame, spec, pair_column) for ours, frame in frames.items()}
        if "dev" not in splits or "test" not in splits:
            held = "dev" if "dev" not in splits else "test"
            whole = splits["train"]
            rest, part = split_indices(whole.labels, (0.9, 0.1), seed, not spec.regression)
            splits["train"], splits[held] = whole.subset(rest), whole.subset(part)
    return TaskData(spec, splits, str(root))
