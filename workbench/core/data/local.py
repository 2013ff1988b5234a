"""Local files: CSV, TSV, JSONL or parquet, one file (split 80/10/10) or a folder of splits; read
strictly (encodings, quoting, labels checked before any training)."""

from __future__ import annotations

import codecs
import csv
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np
import pandas as pd

from workbench.core.data.splits import (
    METRICS_CLASSIFICATION,
    MISSING_LABELS,
    TaskData,
    TaskSpec,
    clean_text,
    from_frame,
    split_frame,
    split_indices,
)
from workbench.core.errors import WorkbenchError, first_line, listed
from workbench.core.files import regular_file

FIELD_LIMIT = 16 * 2**20  # characters in one field of a CSV or TSV file
COLUMN_LIMIT = 10_000  # columns in a row of a CSV or TSV file
LOCAL_SUFFIXES = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
}


def _read_table(path: Path) -> pd.DataFrame:
    if (kind := LOCAL_SUFFIXES.get(path.suffix.lower())) is None:
        raise WorkbenchError(
            f"{path}: unsupported file type; use one of {', '.join(sorted(LOCAL_SUFFIXES))}"
        )
    try:
        if kind == "parquet":
            return pd.read_parquet(path)
        encoding = _text_encoding(path)
        if kind == "jsonl":
            return pd.read_json(path, lines=True, encoding=encoding)
        # a TSV as the GLUE files are read: a quote character is text, never a field delimiter,
        # so a stray quote cannot merge rows
        sep, quoting = ("\t", csv.QUOTE_NONE) if kind == "tsv" else (",", csv.QUOTE_MINIMAL)
        # read once through bounded_rows, the header checked, before pandas holds the whole file
        for number, (_, row) in enumerate(bounded_rows(path, encoding, sep, quoting)):
            if number == 0:
                _check_header(path, row)
        return pd.read_csv(path, sep=sep, keep_default_na=False, encoding=encoding, quoting=quoting)
    except (ValueError, OSError, pd.errors.ParserError) as error:
        raise WorkbenchError(f"{path}: cannot read it as {kind}: {first_line(error)}") from None


def bounded_rows(
    path: Path, encoding: str, delimiter: str, quoting: int
) -> Iterator[tuple[int, list[str]]]:
    """``(line, row)`` per row of a CSV or TSV file, as pandas would split it, with never more
    than a line and a row in memory: a row of more than ``COLUMN_LIMIT`` columns, or a line or
    a field (a quoted one may span lines) of more than ``FIELD_LIMIT`` characters (an all-NUL
    file is one such line) is refused in one line naming the line."""
    most = f"{FIELD_LIMIT:,} characters, the most a line or a field of a data file may hold"
    before = csv.field_size_limit(FIELD_LIMIT)
    try:
        with path.open(encoding=encoding, newline="") as stream:
            rows = csv.reader(
                _bounded_lines(stream, path, most), delimiter=delimiter, quoting=quoting
            )
            try:
                for row in rows:
                    if len(row) > COLUMN_LIMIT:
                        raise WorkbenchError(
                            f"{path}: line {rows.line_num} has {len(row):,} columns, more than "
                            f"the {COLUMN_LIMIT:,} a data file may have"
                        )
                    yield rows.line_num, row
            except csv.Error as error:
                problem = f"a field over {most}" if "field limit" in str(error) else error
                raise WorkbenchError(f"{path}: line {rows.line_num}: {problem}") from None
    finally:
        csv.field_size_limit(before)


def _bounded_lines(stream: TextIO, path: Path, most: str) -> Iterator[str]:
    """The lines of ``stream``, each read no further than ``FIELD_LIMIT`` characters: a longer
    one is refused."""
    for number, line in enumerate(iter(lambda: stream.readline(FIELD_LIMIT + 1), ""), 1):
        if len(line) > FIELD_LIMIT:
            raise WorkbenchError(f"{path}: line {number}: over {most}")
        yield line


def _check_header(path: Path, header: list[str]) -> None:
    """Refuse a header that names a column twice (``text,text,label``): pandas would read the
    first and rename the second ``text.1``, and the task would train on one of them silently."""
    seen: set[str] = set()
    if twice := [name for name in header if name in seen or seen.add(name)]:
        raise WorkbenchError(
            f"{path}: the header names the column(s) {sorted(set(twice))} more than once: give "
            "each column its own name"
        )


def _text_encoding(path: Path) -> str:
    """UTF-8 (a byte-order mark allowed) or UTF-16 with its byte-order mark; anything else is a
    one-line error with the remedy. Checked a megabyte at a time, never the whole file at once."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    with path.open("rb") as file:
        block = file.read(1 << 20)
        if block.startswith((b"\xff\xfe", b"\xfe\xff")):
            return "utf-16"
        start = 0
        while True:
            try:
                decoder.decode(block, final=not block)
            except UnicodeDecodeError as error:
                at = start + error.start - len(decoder.getstate()[0])
                file.seek(at)
                raise WorkbenchError(
                    f"{path}: not UTF-8 (byte {at} is {file.read(1)!r}); re-save it as UTF-8, "
                    "e.g. iconv -f latin1 -t utf-8 FILE > FILE.utf8"
                ) from None
            if not block:
                return "utf-8-sig"
            start += len(block)
            block = file.read(1 << 20)


@dataclass(frozen=True)
class Columns:
    """Which columns of a local file or hub data set hold the texts, the second texts of pairs
    (None: ``text_pair`` where there is one) and the labels."""

    text: str = "text"
    pair: str | None = None
    label: str = "label"

    def select(self, frame: pd.DataFrame, where: str) -> pd.DataFrame:
        """``frame``'s text, label (and second text) columns, named ``text``, ``label`` (and
        ``text_pair``); a missing one is a one-line error listing the columns found."""
        chosen = [c for c in (self.text, self.label, self.pair) if c is not None]
        if len(set(chosen)) < len(chosen):
            raise WorkbenchError(
                f"{where}: --text-column, --text-pair-column and --label-column must name "
                f"different columns, not {chosen}"
            )
        if missing := [c for c in chosen if c not in frame.columns]:
            raise WorkbenchError(
                f"{where}: missing column(s) {missing}; found {list(frame.columns)} (choose "
                "them with --text-column, --text-pair-column and --label-column)"
            )
        pair = self.pair or ("text_pair" if "text_pair" in frame.columns else None)
        names = {self.text: "text", self.label: "label"} | ({pair: "text_pair"} if pair else {})
        return frame[list(names)].rename(columns=names)


DEFAULT_COLUMNS = Columns()


# how errors number the rows of a table: lines of a file with a header, a data set's rows
FILE_LINES = ("line", 2)
DATASET_ROWS = ("row", 0)


def _lines(rows: Sequence[int], numbering: tuple[str, int]) -> str:
    """The first five of ``rows`` (positions) as ``numbering`` names them: ``line 3, 5``."""
    word, first = numbering
    shown = ", ".join(str(i + first) for i in rows[:5]) + (", ..." if len(rows) > 5 else "")
    return f"{word} {shown}"


# values that are no text and no label: containers (JSON objects and arrays, parquet lists) and
# bytes (a parquet binary column), which str() would turn into texts or class names
NOT_SCALAR = (dict, list, tuple, set, np.ndarray, bytes, bytearray)


def _only_scalars(
    values: pd.Series, column: str, what: str, kind: str, where: str, numbering: tuple[str, int]
) -> None:
    """Refuse a ``column`` holding values of :data:`NOT_SCALAR`, naming their rows and the first
    (``what``: what each value should be; ``kind``: how to give it)."""
    rows = np.flatnonzero(values.map(lambda v: isinstance(v, NOT_SCALAR)))
    if len(rows):
        first = values.iloc[rows[0]]
        shown = repr(first.tolist() if isinstance(first, np.ndarray) else first)
        raise WorkbenchError(
            f"{where}: {column} is not {what} but a {type(first).__name__} in {len(rows)} "
            f"row(s) ({_lines(rows, numbering)}: {shown[:40]}{'…' if len(shown) > 40 else ''}); "
            f"give each {column.split('_')[0]} as {kind}"
        )


def check_table(frame: pd.DataFrame, where: str, numbering: tuple[str, int]) -> pd.DataFrame:
    """``frame`` (columns as :meth:`Columns.select` names them) with its texts cleaned; empty
    texts and missing labels are one-line errors naming the rows (:data:`FILE_LINES` or
    :data:`DATASET_ROWS`)."""
    if frame.empty:
        raise WorkbenchError(f"{where}: no rows (a header only, or an empty file)")
    frame = frame.copy()
    where_rows = (where, numbering)
    _only_scalars(frame["label"], "label", "a single value", "a number or a string", *where_rows)
    for column in ("text", "text_pair"):
        if column not in frame:
            continue
        _only_scalars(frame[column], column, "a text", "a string", *where_rows)
        frame[column] = frame[column].fillna("").map(clean_text)
        empty = np.flatnonzero(frame[column].to_numpy() == "")
        if len(empty):
            raise WorkbenchError(
                f"{where}: empty {column} in {len(empty)} row(s) ({_lines(empty, numbering)}); "
                "fill or remove them"
            )
    missing = frame["label"].isna() | frame["label"].map(
        lambda v: isinstance(v, str) and v.strip().lower() in MISSING_LABELS
    )
    if missing.any():
        rows = np.flatnonzero(missing.to_numpy())
        raise WorkbenchError(
            f"{where}: missing label (empty or NaN) in {len(rows)} row(s) "
            f"({_lines(rows, numbering)}); fill or remove them"
        )
    return frame


def _is_regression(labels: pd.Series, where: str, numbering: tuple[str, int]) -> bool:
    """Fractional numbers make a regression target; a column mixing them with values that are
    not numbers is an error naming those values, never a classification with dozens of
    classes."""
    numeric = pd.to_numeric(labels, errors="coerce")
    fractional = bool((numeric.dropna() != numeric.dropna().round()).any())
    if fractional and numeric.isna().any():
        rows = np.flatnonzero(numeric.isna().to_numpy())
        shown = ", ".join(f"{labels.iloc[i]!r} ({_lines([i], numbering)})" for i in rows[:5])
        raise WorkbenchError(
            f"{where}: the labels have fractions (a regression target) but {len(rows)} are not "
            f"numbers: {shown}"
        )
    return fractional


def _label_names(
    frames: dict[str, pd.DataFrame], where: dict[str, str], classes: tuple[str, ...] | None
) -> tuple[str, ...]:
    """The class names of a classification task, in class order, each split's labels made
    strings with whitespace stripped: ``classes`` where the data declares them (a
    ``ClassLabel``), else the training labels (integers in numeric order, strings sorted).
    Labels that differ only by case, fewer than two classes, or a label of another split that
    training lacks are one-line errors."""
    for frame in frames.values():
        frame["label"] = frame["label"].map(lambda v: str(v).strip())
    train = frames["train"]["label"]
    origin = {  # each label's first split, train first
        label: where[ours]
        for ours in reversed(list(frames))
        for label in set(frames[ours]["label"])
    }
    by_case: dict[str, str] = {}
    for label in sorted(origin):
        other = by_case.setdefault(label.casefold(), label)
        if other != label:
            raise WorkbenchError(
                f"{origin[label]}: labels {other!r} and {label!r} differ only by case; make them "
                "one label"
            )
    if classes is None:
        raw = set(train)
        numeric = all(v.lstrip("-").isdigit() for v in raw)
        classes = tuple(sorted(raw, key=int if numeric else str))
    if len(set(train)) < 2:
        raise WorkbenchError(
            f"{where['train']}: every label is {next(iter(set(train)), '')!r}: a classifier "
            "needs at least two classes"
        )
    for ours, frame in frames.items():
        if unknown := sorted(set(frame["label"]) - set(classes)):
            raise WorkbenchError(
                f"{where[ours]}: unknown label(s) [{listed(map(repr, unknown), 5)}] not in the "
                f"training labels [{listed(map(repr, classes), 8)}]"
            )
    return classes


def task_from_frames(
    name: str,
    frames: dict[str, pd.DataFrame],
    where: dict[str, str],
    seed: int,
    source: str,
    classes: tuple[str, ...] | None = None,
    numbering: tuple[str, int] = FILE_LINES,
) -> TaskData:
    """A task from checked tables (:func:`check_table`) of its ``train`` and, where it has
    them, ``dev`` and ``test`` splits, read from ``source``; ``where`` names each split's origin
    in errors, ``classes`` are the declared class names (a ``ClassLabel``'s), if any. Labels
    with fractions make a regression task; other labels a classification task. Without dev and
    test, train is split 80/10/10; without one of them, it is 10% of train (stratified by label
    for classification, ``seed``). What was split is in the notes."""
    train = frames["train"]
    pair = "text_pair" in train.columns
    notes = []
    if classes is None and _is_regression(train["label"], where["train"], numbering):
        label_names: tuple[str, ...] = ()
        for frame in frames.values():
            frame["label"] = pd.to_numeric(frame["label"], errors="raise").astype(float)
        metrics: tuple[str, ...] = ("spearman", "pearson")
    else:
        label_names = _label_names(frames, where, classes)
        ids = {name: index for index, name in enumerate(label_names)}  # one lookup a row
        for frame in frames.values():
            frame["label"] = frame["label"].map(ids)
        metrics = METRICS_CLASSIFICATION
    spec = TaskSpec(name, label_names, metrics, pair=pair)
    pair_column = "text_pair" if pair else None
    split_by = "stratified" if label_names else "random"
    if len(frames) == 1:
        splits = split_frame(train, spec, seed, pair_column)
        notes.append(
            f"{name}: no dev or test split: train split 80/10/10 ({split_by}, seed {seed})"
        )
    else:
        splits = {ours: from_frame(frame, spec, pair_column) for ours, frame in frames.items()}
        if "dev" not in splits or "test" not in splits:
            held = "dev" if "dev" not in splits else "test"
            whole = splits["train"]
            rest, part = split_indices(whole.labels, (0.9, 0.1), seed, not spec.regression)
            splits["train"], splits[held] = whole.subset(rest), whole.subset(part)
            notes.append(
                f"{name}: no {held} split: {held} = 10% of train ({split_by}, seed {seed})"
            )
    return TaskData(spec, splits, source, notes)


def load_local(path: str, seed: int, columns: Columns = DEFAULT_COLUMNS) -> TaskData:
    """A local task: one file (split 80/10/10 here) or a directory with ``train.*`` and
    optionally ``dev.*``/``validation.*`` and ``test.*``; the texts, labels and optionally second
    texts in the ``columns`` named (:func:`task_from_frames` makes the task)."""
    root = Path(path)
    if root.is_dir():
        files = [p for p in sorted(root.iterdir()) if p.suffix.lower() in LOCAL_SUFFIXES]
        stems = {"train": ("train",), "dev": ("dev", "validation"), "test": ("test",)}
        found = {ours: [p for p in files if p.stem in names] for ours, names in stems.items()}
        found = {ours: paths[0] for ours, paths in found.items() if paths}
        if "train" not in found:
            raise WorkbenchError(f"{root}: no train.csv/.tsv/.jsonl/.parquet file in it")
    else:
        found = {"train": root}
    for ours, file in found.items():  # a pipe or a device would block the reader: refused unread
        regular_file(file, "--task" if file == root else f"--task {ours} file")
    frames = {
        ours: check_table(columns.select(_read_table(p), str(p)), str(p), FILE_LINES)
        for ours, p in found.items()
    }
    where = {ours: str(p) for ours, p in found.items()}
    return task_from_frames(root.stem, frames, where, seed, str(root))
