"""GLUE: the hub's parquet layout through ``datasets``, or the original distribution's TSV files
(``glue_data/``, as the papers' scripts read them)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from workbench.core.data.local import bounded_rows
from workbench.core.data.splits import TaskData, TaskSpec, clean_text, from_frame, split_indices
from workbench.core.errors import WorkbenchError, first_line
from workbench.core.files import existing_path, regular_file
from workbench.core.hub import hub_offline, hub_reachable, hub_unreachable
from workbench.core.names import GLUE_TASKS, GlueTask

GLUE_REPO = "nyu-mll/glue"
GLUE_OFFLINE_FIX = (
    "pass --glue-dir with a local copy (the hub's parquet files or GLUE's TSV "
    "files), or set HF_HUB_OFFLINE=1 to read the hub's local cache"
)


@dataclass(frozen=True)
class GlueTsv:
    """How the original GLUE distribution (``glue_data/``, read by the papers' scripts) stores a
    task: ``<glue_dir>/<folder>/train.tsv`` and ``dev.tsv`` (MNLI: ``dev_matched.tsv`` and
    ``dev_mismatched.tsv``), tab-separated, with no quoting."""

    folder: str
    columns: tuple[str, str | None, str]  # first text, second text, label
    label_values: tuple[str, ...] = ("0", "1")  # each class's value in the file, in class order
    header: tuple[str, ...] = ()  # column names of files without a header row (CoLA)


GLUE_TSV: dict[str, GlueTsv] = {
    "cola": GlueTsv(
        "CoLA",
        ("sentence", None, "label"),
        header=("source", "label", "original_label", "sentence"),
    ),
    "sst2": GlueTsv("SST-2", ("sentence", None, "label")),
    "mrpc": GlueTsv("MRPC", ("#1 String", "#2 String", "Quality")),
    "qqp": GlueTsv("QQP", ("question1", "question2", "is_duplicate")),
    "stsb": GlueTsv("STS-B", ("sentence1", "sentence2", "score"), label_values=()),
    "mnli": GlueTsv(
        "MNLI", ("sentence1", "sentence2", "gold_label"), ("entailment", "neutral", "contradiction")
    ),
    "qnli": GlueTsv("QNLI", ("question", "sentence", "label"), ("entailment", "not_entailment")),
    "rte": GlueTsv("RTE", ("sentence1", "sentence2", "label"), ("entailment", "not_entailment")),
}
TSV_FILES = {
    "train": "train.tsv",
    "validation": "dev.tsv",
    "validation_matched": "dev_matched.tsv",
    "validation_mismatched": "dev_mismatched.tsv",
}


def _glue_split(dataset, task: GlueTask) -> pd.DataFrame:
    first, second = task.text_columns
    frame = dataset.to_pandas()
    if missing := [c for c in (first, second, "label") if c and c not in frame.columns]:
        raise WorkbenchError(f"GLUE data lacks columns {missing}; found {list(frame.columns)}")
    out = pd.DataFrame({"text": frame[first].map(clean_text), "label": frame["label"]})
    if second:
        out["text_pair"] = frame[second].map(clean_text)
    return out


def _read_glue_tsv(path: Path, name: str) -> tuple[pd.DataFrame, int]:
    """One file of the GLUE distribution as ``text``, ``label`` (and ``text_pair``) columns, and
    how many rows lacked a field (QQP's train file has some; skipped, as the GLUE baselines do).

    Read with no quoting, as the papers' scripts do: quote characters inside texts are text."""
    tsv = GLUE_TSV[name]
    regular_file(path, "--glue-dir")  # a pipe or a device would block the reader
    try:
        rows = list(bounded_rows(path, "utf-8-sig", "\t", csv.QUOTE_NONE))
    except UnicodeDecodeError as error:
        raise WorkbenchError(f"{path} is not UTF-8 text ({error.reason})") from None
    names = list(tsv.header) if tsv.header else (rows.pop(0)[1] if rows else [])
    if missing := [c for c in tsv.columns if c and c not in names]:
        raise WorkbenchError(f"{path}: no column(s) {missing} in its header {names}")
    text_at, pair_at, label_at = (None if c is None else names.index(c) for c in tsv.columns)
    width = max(i for i in (text_at, pair_at, label_at) if i is not None) + 1
    kept = [(line, row) for line, row in rows if len(row) >= width]
    labels: list[int] | list[float] = []
    for line, row in kept:
        value = row[label_at]
        try:
            labels.append(tsv.label_values.index(value) if tsv.label_values else float(value))
        except ValueError:
            expected = f"one of {list(tsv.label_values)}" if tsv.label_values else "a number"
            raise WorkbenchError(
                f"{path}, line {line}: label {value!r} is not {expected}"
            ) from None
    frame = pd.DataFrame({"text": [clean_text(row[text_at]) for _, row in kept], "label": labels})
    if pair_at is not None:
        frame["text_pair"] = [clean_text(row[pair_at]) for _, row in kept]
    return frame, len(rows) - len(kept)


def _tsv_layout(root: Path, name: str) -> bool:
    """Whether ``root`` holds the task in the GLUE distribution's layout (``SST-2/train.tsv``)
    rather than the hub's parquet files (``sst2/train-*.parquet``)."""
    folder = root / GLUE_TSV[name].folder
    return any(folder.glob("*.tsv")) or (folder.is_dir() and not (root / name).is_dir())


def _glue_tsv_frames(
    root: Path, name: str, wanted: dict[str, str]
) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """The ``wanted`` splits (ours → the hub's split name) read from the TSV layout, and notes on
    skipped rows."""
    folder = root / GLUE_TSV[name].folder
    paths = {ours: folder / TSV_FILES[theirs] for ours, theirs in wanted.items()}
    for path in paths.values():
        if not path.is_file():
            needed = ", ".join(p.name for p in paths.values())
            raise WorkbenchError(f"{path} is missing: GLUE's {folder.name} folder needs {needed}")
    frames, notes = {}, []
    for ours, path in paths.items():
        frames[ours], skipped = _read_glue_tsv(path, name)
        if skipped:
            notes.append(f"{name}: skipped {skipped} rows of {path.name} with missing fields")
    return frames, notes


def _glue_parquet_frames(
    name: str, wanted: dict[str, str], glue_dir: str | None
) -> tuple[dict[str, pd.DataFrame], str]:
    """The ``wanted`` splits (ours → the hub's split name) through ``datasets``: from the hub, or
    from a local copy of its parquet files; and where they came from."""
    import datasets

    if glue_dir is None:
        if not hub_reachable() and not hub_offline():  # in offline mode it reads its cache
            raise hub_unreachable(f"GLUE {name}", GLUE_OFFLINE_FIX)
        try:
            loaded = datasets.load_dataset(GLUE_REPO, name)
        except OSError as error:  # ConnectionError of offline mode among them
            raise WorkbenchError(
                f"cannot load GLUE {name} from the hub: {first_line(error)}; {GLUE_OFFLINE_FIX}"
            ) from None
        source = f"hub:{GLUE_REPO}/{name}"
    else:
        folder = Path(glue_dir) / name
        if not folder.is_dir():
            raise WorkbenchError(
                f"{glue_dir} has no {name} data: expected {folder}/<split>-*.parquet or "
                f"{Path(glue_dir) / GLUE_TSV[name].folder / 'train.tsv'}"
            )
        files = {
            theirs: sorted(str(p) for p in folder.glob(f"{theirs}-*.parquet"))
            for theirs in wanted.values()
        }
        if absent := [theirs for theirs, found in files.items() if not found]:
            raise WorkbenchError(f"{folder} has no parquet files for splits {absent}")
        loaded = datasets.load_dataset("parquet", data_files=files)
        source = str(folder)
    task = GLUE_TASKS[name]
    return {ours: _glue_split(loaded[theirs], task) for ours, theirs in wanted.items()}, source


def load_glue(name: str, seed: int, glue_dir: str | None = None) -> TaskData:
    """A GLUE task through ``datasets.load_dataset`` (the hub's ``nyu-mll/glue``, or a local copy
    of its parquet files laid out as ``<glue_dir>/<task>/<split>-*.parquet``), or from the
    original GLUE distribution's TSV files (``<glue_dir>/SST-2/train.tsv``, see :data:`GLUE_TSV`).

    GLUE's test labels are hidden, so *test* here is GLUE's validation split (MNLI: matched, with
    the mismatched one as ``test-mismatched``) and *dev* a stratified 10% of GLUE's train split
    (at most the size of validation), used to pick checkpoints.
    """
    task = GLUE_TASKS[name]
    validation = "validation_matched" if name == "mnli" else "validation"
    wanted = {"train": "train", "test": validation} | dict(task.extra_eval)
    notes = []
    if glue_dir is not None:
        glue_dir = str(existing_path(glue_dir))
    if glue_dir and _tsv_layout(Path(glue_dir), name):
        frames, notes = _glue_tsv_frames(Path(glue_dir), name, wanted)
        source = str(Path(glue_dir) / GLUE_TSV[name].folder)
    else:
        frames, source = _glue_parquet_frames(name, wanted, glue_dir)
    spec = TaskSpec(name, task.label_names, task.metrics, pair=task.text_columns[1] is not None)
    pair_column = "text_pair" if spec.pair else None
    train = from_frame(frames.pop("train"), spec, pair_column)
    dev_share = min(0.1, len(frames["test"]) / max(len(train), 1))
    rest, dev = split_indices(
        train.labels, (1 - dev_share, dev_share), seed, stratify=not spec.regression
    )
    splits = {"train": train.subset(rest), "dev": train.subset(dev)}
    splits |= {ours: from_frame(frame, spec, pair_column) for ours, frame in frames.items()}
    notes.append(
        f"{name}: test = GLUE {validation} (GLUE test labels are hidden); "
        "dev = stratified part of GLUE train"
    )
    return TaskData(spec, splits, source, notes)
